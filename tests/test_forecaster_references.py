"""`Forecaster`'s forecasts and backtests against independent references (a loop of
`predict` calls, each series alone, a refit and a reload, the float64 inverse of the model's
outputs), and the errors that name the dataset, model or series at fault.

Tiny FP32 models are fitted once on the synthetic stores table with the
settings of `tests/test_forecaster.py` (so that their compiled steps are
shared); every test reads them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.future import future_windows
from tft_jax.data.windows import WINDOW_SCALE_FLOOR
from tft_jax.evaluation import to_batch
from tft_jax.forecaster import Forecaster, ModelConfig
from tft_jax.forecaster import forecaster as forecaster_module

from .cli_tables import HISTORY, HORIZON, TINY_TRAINING, write_table
from .forecaster_stores import DATA, QUANTILES, cut, fitted_stores

LEVELS = np.array([0.1, 0.5, 0.9])


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """`(forecaster, table, saved folder)`."""
    return fitted_stores(tmp_path_factory.mktemp("forecaster_references"))


def pinball64(actual: np.ndarray, forecast: np.ndarray, level: float) -> np.ndarray:
    """Float64 pinball losses of `forecast` against `actual`."""
    error = np.asarray(actual, np.float64) - np.asarray(forecast, np.float64)
    return np.maximum(level * error, (level - 1.0) * error)


def test_evaluate_refuses_a_prepared_dataset_the_model_does_not_read(fitted):
    # A PreparedDataset was used as it came: one prepared with its own preprocessor
    # (other scalers) or without window normalization was scored on wrong forecasts
    # without a word, and one of another history length failed in the model's shape check.
    forecaster, table, saved = fitted
    options = DATA.prepare_options()
    own = prepare_dataset(table.assign(promo=3 * table["promo"]), **options)
    plain = prepare_dataset(
        table, **{**options, "window_normalization": False}, preprocessor=forecaster.preprocessor
    )
    shorter = prepare_dataset(table, **{**options, "history": HISTORY - 4})
    cases = [
        (own, r"another preprocessor than the fitted one"),
        (plain, r"window_normalization False \(the model's: True\)"),
        (shorter, rf"history {HISTORY - 4} \(the model's: {HISTORY}\)"),
    ]
    for dataset, message in cases:
        with pytest.raises(ValueError, match=rf"PreparedDataset was prepared otherwise.*{message}"):
            forecaster.evaluate(dataset)
    # The same preparation, even by the run before it was saved, is scored as the table is.
    loaded = Forecaster.load(saved)
    prepared = forecaster.prepare(table, "test")
    scores = [loaded.evaluate(given)["models"]["fp32"] for given in (prepared, table)]
    for score in scores:
        score.pop("seconds")
    assert scores[0] == scores[1]


def test_a_dataset_prepared_for_another_split_cannot_score_its_new_series(fitted):
    # A new series is scaled by its target before the scored period. A dataset
    # prepared for the test split scaled one starting inside the validation period by
    # its validation targets, and evaluate(split="validation") scored it without a word.
    forecaster, table, _ = fitted
    start = forecaster.prepare(table, "validation").validation_start
    first = table["store"].iloc[0]
    new = table[(table["store"] == first) & (pd.to_datetime(table["day"]) >= start)]
    with_new = pd.concat([table, new.assign(store="new store")], ignore_index=True)

    def unseen():
        return pytest.warns(UserWarning, match=r"series \['new store'\] were not in the training")

    with unseen():
        for_test = forecaster.prepare(with_new, "test")
    assert for_test.new_series == ("new store",) and for_test.scored == "test"
    leaked = r"prepared with scored='test', but the validation split .* \('new store'\)"
    with pytest.raises(ValueError, match=leaked):
        forecaster.evaluate(for_test, split="validation")
    with unseen():
        everything = forecaster.prepare(with_new)
    with pytest.raises(ValueError, match=r"prepared with scored=None, but the test split"):
        forecaster.evaluate(everything, split="test")
    # Prepared for the split it scores, or without new series, a dataset is accepted.
    assert forecaster.evaluate(for_test, split="test")["windows"]
    assert forecaster.prepare(forecaster.prepare(table, "test"), "validation").new_series == ()


def test_models_of_a_type_that_is_no_list_of_names_are_named(fitted):
    forecaster, table, _ = fitted
    with pytest.raises(TypeError, match=r"models must be a list of model names .* got int 3"):
        forecaster.evaluate(table, models=3)
    with pytest.raises(TypeError, match=r"models must be a list of model names .* got int 3"):
        forecaster.backtest(table, models=3)


def test_backtest_scores_equal_a_hand_rolled_loop_of_predict_calls(fitted):
    # Each cutoff's row is the forecast from the history before it, scored in float64
    # (to float32 rounding: the backtest runs the model on batches of another size).
    forecaster, table, _ = fitted
    # The first cutoff comes before the model's test start (2024-03-26): announced.
    with pytest.warns(UserWarning, match=r"backtest: 1 of the 3 cutoffs \(2024-03-24 00:00:00\)"):
        result = forecaster.backtest(table, n_windows=3, step=5)
    rows = result[result["model"] == "fp32"].sort_values("cutoff")
    days = pd.date_range("2024-01-01", periods=100, freq="D")
    cutoffs = [days[100 - HORIZON - 10], days[100 - HORIZON - 5], days[100 - HORIZON]]
    assert list(rows["cutoff"]) == cutoffs
    for cutoff, (_, row) in zip(cutoffs, rows.iterrows(), strict=True):
        history, future = cut(table, f"{cutoff:%Y-%m-%d}")
        forecast = forecaster.predict(history, future=future)
        actual = table.assign(day=pd.to_datetime(table["day"]))[["store", "day", "sales"]]
        scored = forecast.merge(actual, on=["store", "day"], validate="one_to_one")
        assert row["windows"] == 3 and len(scored) == 3 * HORIZON
        y = scored["sales"].to_numpy()
        for level, column in ((0.5, "p50_q_risk"), (0.9, "p90_q_risk")):
            expected = 2 * pinball64(y, scored[f"q{level}"], level).sum() / np.abs(y).sum()
            np.testing.assert_allclose(row[column], expected, rtol=1e-6)
        pairs = zip(LEVELS, QUANTILES, strict=True)
        losses = [pinball64(y, scored[name], level).mean() for level, name in pairs]
        np.testing.assert_allclose(row["mean_quantile_loss"], np.mean(losses), rtol=1e-6)


def test_a_series_ending_earlier_is_forecast_after_its_own_end_with_its_own_values(fitted):
    # Beta's history ends three days before the others': its forecast covers the seven
    # days after its own end, and the others' forecasts are those of the aligned table.
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-20")
    aligned = forecaster.predict(history, future=future)
    beta_days = pd.date_range("2024-03-17", periods=HORIZON, freq="D").strftime("%Y-%m-%d")
    short = history[~((history["store"] == "beta") & (history["day"] >= "2024-03-17"))]
    beta_future = table[(table["store"] == "beta") & table["day"].isin(beta_days)]
    ragged_future = pd.concat(
        [future[future["store"] != "beta"], beta_future[["store", "day", "promo"]]]
    )
    ragged = forecaster.predict(short, future=ragged_future)
    assert ragged.columns.tolist() == ["store", "day", *QUANTILES]
    expected_days = {
        store: pd.date_range(f"2024-{start}", periods=HORIZON, freq="D")
        for store, start in (("alpha", "03-20"), ("beta", "03-17"), ("gamma", "03-20"))
    }
    for store, days in expected_days.items():
        got = ragged[ragged["store"] == store]
        assert pd.DatetimeIndex(got["day"]).equals(days)
    others = ragged["store"] != "beta"
    np.testing.assert_array_equal(
        ragged.loc[others, QUANTILES].to_numpy(),
        aligned.loc[aligned["store"] != "beta", QUANTILES].to_numpy(),
    )
    alone = forecaster.predict(
        short[short["store"] == "beta"], future=beta_future[["store", "day", "promo"]]
    )
    np.testing.assert_allclose(
        ragged.loc[~others, QUANTILES].to_numpy(), alone[QUANTILES].to_numpy(), rtol=1e-6
    )


def test_refitting_with_the_same_seed_and_reloading_forecast_bit_for_bit(fitted, tmp_path):
    forecaster, table, saved = fitted
    history, future = cut(table, "2024-03-20")
    expected = forecaster.predict(history, future=future)
    again = Forecaster(DATA, ModelConfig(hidden_dim=8, num_heads=2), TINY_TRAINING)
    again.fit(table, quiet=True)
    for other in (again, Forecaster.load(saved)):
        pd.testing.assert_frame_equal(other.predict(history, future=future), expected)


def test_log1p_forecasts_are_the_float64_inverse_of_the_model_outputs(tmp_path):
    # expm1(((raw * window scale + window mean) * series scale + series mean)), sorted.
    table = pd.read_csv(write_table(tmp_path / "stores.csv"))
    data = dataclasses.replace(DATA, target_transform="log1p")
    forecaster = Forecaster(data, ModelConfig(hidden_dim=8, num_heads=2), TINY_TRAINING)
    forecaster.fit(table, quiet=True)
    history, future = cut(table, "2024-03-20")
    forecast = forecaster.predict(history, future=future)

    ahead = future_windows(
        forecaster.preprocessor, history, future, HISTORY, HORIZON, normalized=True
    )
    raw = np.asarray(
        forecaster.predictor("fp32")(to_batch(ahead.windows.arrays())).quantiles, np.float64
    )
    scaler = forecaster.preprocessor.target_scaler
    for index, store in enumerate(ahead.transformed.series_ids):
        code = forecaster.preprocessor.series_ids.index(store)
        sales = history[history["store"] == store]["sales"].to_numpy(np.float64)[-HISTORY:]
        scaled = (np.log1p(sales) - scaler.loc[code]) / scaler.scale[code]
        spread = np.sqrt(scaled.var() + WINDOW_SCALE_FLOOR**2)
        transformed = (raw[index] * spread + scaled.mean()) * scaler.scale[code] + scaler.loc[code]
        expected = np.sort(np.expm1(transformed), axis=-1)
        got = forecast[forecast["store"] == store][QUANTILES].to_numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_a_model_with_non_finite_forecasts_is_named_when_metrics_refuse_them(fitted):
    # Metrics refuse a NaN forecast; which model made it was not said.
    forecaster, table, _ = fitted
    postprocess = forecaster.postprocess

    def one_nan(values):
        values = np.array(postprocess(values), dtype=np.float64)
        values[0, 0, 0] = np.nan
        return values

    forecaster.postprocess = one_nan
    try:
        with pytest.raises(ValueError, match=r"the fp32 model's forecasts: forecast holds 1 "):
            forecaster.evaluate(table)
    finally:
        del forecaster.postprocess


def test_a_future_forecast_beyond_float64_is_refused_naming_series_time_and_level(
    fitted, monkeypatch
):
    # The error named "series code 0 at (0, 0, 0)", the panel's numbering.
    forecaster, table, _ = fitted
    real = forecaster_module.predict_windows

    def huge(*args, **kwargs):
        predictions = real(*args, **kwargs)
        quantiles = np.zeros_like(predictions.quantiles)
        quantiles[1, 2, 0] = 1e308  # times the series' scale: beyond float64
        return dataclasses.replace(predictions, quantiles=quantiles)

    monkeypatch.setattr(forecaster_module, "predict_windows", huge)
    history, future = cut(table, "2024-03-20")
    second = sorted(pd.unique(history["store"]))[1]  # the second window's series
    level = forecaster.tft_config.quantiles[0]
    with pytest.raises(ValueError, match=rf"the forecast of series '{second}' at 2024-03-22.* "
                       rf"\(quantile {level}\) is .* beyond float64"):  # fmt: skip
        forecaster.predict(history, future=future)
