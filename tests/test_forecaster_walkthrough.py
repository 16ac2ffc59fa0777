"""`Forecaster` as a user drives it from the README: one table in the forms users have.

One tiny FP32 model is fitted on the synthetic stores table with the settings
of `tests/test_forecaster.py` (so that its compiled steps are shared through
the cache). The tests feed it the same history as users hold it (rows in any
order, ids as a pandas categorical, times as text, a CSV path) and check the
forecast frame against what the README promises, computed independently here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tft_jax.forecaster import Forecaster, ModelConfig

from .cli_tables import HORIZON, TINY_TRAINING, write_table
from .forecaster_stores import DATA, QUANTILES, cut


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory):
    """`(forecaster, history, future, forecast of them, folder)`."""
    folder = tmp_path_factory.mktemp("walkthrough")
    csv = write_table(folder / "stores.csv")
    table = pd.read_csv(csv)
    forecaster = Forecaster(DATA, ModelConfig(hidden_dim=8, num_heads=2), TINY_TRAINING)
    forecaster.fit(csv, quiet=True)
    history, future = cut(table, "2024-03-30")
    # Series of different lengths ending at different times: 'beta' stops 3 days early.
    beta_end = "2024-03-27"
    history = history[~((history["store"] == "beta") & (history["day"] >= beta_end))]
    beta_days = pd.date_range(beta_end, periods=HORIZON, freq="D").strftime("%Y-%m-%d")
    future = pd.concat(
        [
            future[future["store"] != "beta"],
            table[(table["store"] == "beta") & table["day"].isin(beta_days)][
                ["store", "day", "promo"]
            ],
        ],
        ignore_index=True,
    )
    return forecaster, history, future, forecaster.predict(history, future=future), folder


def test_forecast_frame_is_the_next_h_steps_of_each_series_in_order(walkthrough):
    _, history, _, forecast, _ = walkthrough
    assert forecast.columns.tolist() == ["store", "day", *QUANTILES]
    last = pd.to_datetime(history.groupby("store")["day"].max())
    expected = pd.concat(
        [
            pd.DataFrame({"store": store, "day": pd.date_range(end, periods=HORIZON + 1)[1:]})
            for store, end in sorted(last.items())
        ],
        ignore_index=True,
    )
    assert forecast["store"].tolist() == expected["store"].tolist()
    assert (pd.DatetimeIndex(forecast["day"]) == pd.DatetimeIndex(expected["day"])).all()
    values = forecast[QUANTILES].to_numpy()
    assert values.dtype == np.float64 and np.isfinite(values).all()
    assert (np.diff(values, axis=1) >= 0).all()
    # Original units: the stores' sales lie around 10-20, far from the scaled ~0.
    assert 5 < np.median(values[:, 1]) < 30


def test_forecast_does_not_depend_on_how_the_user_holds_the_table(walkthrough, tmp_path):
    forecaster, history, future, forecast, folder = walkthrough
    shuffled = history.sample(frac=1.0, random_state=0).reset_index(drop=True)
    as_category = history.assign(store=history["store"].astype("category"))
    as_times = history.assign(day=pd.to_datetime(history["day"]))
    path = tmp_path / "history.csv"
    history.to_csv(path, index=False)
    loaded = Forecaster.load(forecaster.save(folder / "run"))
    for label, given, model in (
        ("rows shuffled", shuffled, forecaster),
        ("categorical ids", as_category, forecaster),
        ("datetime times", as_times, forecaster),
        ("a CSV path", path, forecaster),
        ("saved and loaded", history, loaded),
    ):
        again = model.predict(given, future=future.sample(frac=1.0, random_state=1))
        np.testing.assert_array_equal(
            again[QUANTILES].to_numpy(), forecast[QUANTILES].to_numpy(), err_msg=label
        )
        assert again["store"].tolist() == forecast["store"].tolist(), label


def test_user_mistakes_are_named(walkthrough):
    forecaster, history, future, _, _ = walkthrough
    with pytest.raises(RuntimeError, match="not fitted"):
        Forecaster(DATA).predict(history, future=future)
    dropped = future[~((future["store"] == "beta") & (future["day"] == "2024-03-29"))]
    with pytest.raises(ValueError, match=r"no row for series 'beta' at 2024-03-29"):
        forecaster.predict(history, future=dropped)
    longer = pd.concat(
        [future, pd.DataFrame({"store": ["alpha"], "day": ["2024-04-06"], "promo": [0.0]})]
    )
    with pytest.raises(ValueError, match=r"outside the forecast steps, e.g. series 'alpha'"):
        forecaster.predict(history, future=longer)
    with pytest.raises(ValueError, match=r"future lacks the columns \['promo'\]"):
        forecaster.predict(history, future=future.drop(columns="promo"))
    with pytest.raises(ValueError, match=r"model='int8' was not trained"):
        forecaster.predict(history, future=future, model="int8")
