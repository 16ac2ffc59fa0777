"""A model fitted on Berlin days with cut times, scoring tables in UTC and tables
shorter than its split.

References: the same table in the training zone (backtest), and the windows the
whole table gives for the period scored (evaluation of a part of it).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.forecaster import Forecaster, ModelConfig

from .cli_tables import HORIZON, TINY_TRAINING, write_table
from .forecaster_stores import DATA

CUTS = {"validation_start": "2024-03-01", "test_start": "2024-03-20"}


@pytest.fixture(scope="module")
def berlin(tmp_path_factory):
    """`(forecaster, table)`: the stores at Berlin midnights (across the March DST change)."""
    table = pd.read_csv(write_table(tmp_path_factory.mktemp("berlin") / "stores.csv"))
    table["day"] = pd.to_datetime(table["day"]).dt.tz_localize("Europe/Berlin")
    data = dataclasses.replace(DATA, **CUTS)
    forecaster = Forecaster(data, ModelConfig(hidden_dim=8, num_heads=2), TINY_TRAINING)
    return forecaster.fit(table, quiet=True), table


def test_a_utc_table_is_backtested_on_the_training_zones_days(berlin):
    # The grid was built in 24-hour UTC days: every series after the change was
    # refused as "recorded at another offset".
    forecaster, table = berlin
    # The first cutoff, the same instant in either zone, precedes the test start: announced.
    in_sample = r"backtest: 1 of the 4 cutoffs \({}\) .* test start 2024-03-20 00:00:00\+01:00"
    with pytest.warns(UserWarning, match=in_sample.format(r"2024-03-13 00:00:00\+01:00")):
        local = forecaster.backtest(table, n_windows=4, step=7)
    with pytest.warns(UserWarning, match=in_sample.format(r"2024-03-12 23:00:00\+00:00")):
        utc = forecaster.backtest(table.assign(day=table["day"].dt.tz_convert("UTC")), 4, 7)
    assert str(utc["cutoff"].dt.tz) == "UTC"
    pd.testing.assert_series_equal(
        utc["cutoff"].dt.tz_convert("Europe/Berlin"), local["cutoff"], check_names=False
    )
    assert local["cutoff"].dt.hour.eq(0).all()  # Berlin midnights on both sides of 03-31
    for column in ("windows", "p50_q_risk", "p90_q_risk", "mean_quantile_loss"):
        np.testing.assert_array_equal(utc[column], local[column], err_msg=column)


def _windows(table: pd.DataFrame, forecaster: Forecaster, split: str):
    options = forecaster.config.data.prepare_options()
    dataset = prepare_dataset(table, **options, preprocessor=forecaster.preprocessor, scored=split)
    return getattr(dataset, split)


@pytest.mark.parametrize(
    ("split", "part"),
    [("test", lambda days: days >= "2024-03-05"), ("validation", lambda days: days < "2024-03-15")],
)
def test_a_table_starting_after_or_ending_before_a_cut_is_scored_on_its_period(berlin, split, part):
    # It was refused: "cuts must satisfy first time < validation_start <= test_start <= the
    # end of the data", cuts the user cannot change (they are the run's).
    forecaster, table = berlin
    short = table[part(table["day"].dt.strftime("%Y-%m-%d"))]
    whole, windows = _windows(table, forecaster, split), _windows(short, forecaster, split)
    times = whole.panel.times[whole.starts]
    # The whole table's windows that the short one holds: history and horizon inside it.
    first, last = short["day"].min(), short["day"].max()
    step = pd.Timedelta(days=1)
    inside = (times - 14 * step >= first) & (times + (HORIZON - 1) * step <= last)
    assert len(windows) == int(inside.sum()) > 0
    np.testing.assert_array_equal(windows.panel.times[windows.starts], times[inside])
    for name, array in windows.arrays().items():
        if name != "index":  # the rows of another panel
            np.testing.assert_array_equal(array, whole.arrays()[name][inside], err_msg=name)
    assert forecaster.evaluate(short, split=split)["windows"] == len(windows)


def test_cuts_out_of_order_are_still_refused_for_a_fitted_model(berlin):
    forecaster, table = berlin
    options = {**forecaster.config.data.prepare_options(), "validation_start": "2024-03-21"}
    with pytest.raises(ValueError, match=r"cuts must satisfy validation_start .* <= test_start"):
        prepare_dataset(table, **options, preprocessor=forecaster.preprocessor)
