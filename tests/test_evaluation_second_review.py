"""Evaluation second review: forecast-table column clashes, forecasts beyond float64, the
backtest's new-series cut on the freq grid, typed unseen categories, scaled-loss shapes."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import PreparedDataset, prepare_dataset
from tft_jax.data.scaling import TargetScaler
from tft_jax.evaluation import best_of, forecast_frame, forecast_metrics, to_original_units

from . import test_evaluation as evaluation_tests
from .test_evaluation import HORIZON, QUANTILES, make_table

LEVELS = np.asarray(QUANTILES)


def prepare(table: pd.DataFrame, id_col: str = "shop", time_col: str = "day", **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the filled gap of series 'b'
        return evaluation_tests.prepare(table, id_col, time_col, **options)


@pytest.fixture(scope="module")
def log1p_dataset() -> PreparedDataset:
    return prepare(make_table(), target_transform="log1p")


# ----------------------------------------------------------------- forecast table columns


@pytest.mark.parametrize(
    "role, name", [("id", "horizon"), ("id", "p50"), ("time", "actual"), ("time", "forecast_start")]
)
def test_forecast_frame_refuses_an_id_or_time_column_named_as_a_column_it_adds(role, name):
    # The ids (or times) were replaced by 1..H, the actuals, the medians or the window
    # starts without a word: a Python user's table had a 'horizon' id column of zeros.
    columns = {"id_col": "shop", "time_col": "day"}
    table = make_table().rename(columns={columns[f"{role}_col"]: name})
    dataset = prepare(table, **{**columns, f"{role}_col": name})
    windows = dataset.test
    forecast = np.zeros((len(windows), HORIZON, len(QUANTILES)))
    with pytest.raises(ValueError, match=rf"the {role} column '{name}' has the name of a column"):
        forecast_frame(dataset, windows, forecast, QUANTILES)


def test_forecast_frame_refuses_two_levels_of_one_column_name(log1p_dataset):
    # 0.5 and 0.5000001 are both 'p50': the table kept the second level's values only.
    windows = log1p_dataset.test
    forecast = np.zeros((len(windows), HORIZON, 2))
    with pytest.raises(ValueError, match=r"share the forecast column name\(s\) \['p50'\]"):
        forecast_frame(log1p_dataset, windows, forecast, (0.5, 0.5000001))


# ----------------------------------------------------------------- forecasts beyond float64


def test_a_log1p_forecast_beyond_float64_is_refused_naming_series_and_time(log1p_dataset):
    # expm1 of a value above ~709.78 log1p units overflowed to inf with only NumPy's
    # RuntimeWarning; the q-risk became inf, which metrics.json writes as null.
    dataset, windows = log1p_dataset, log1p_dataset.test
    scaler = dataset.target_scaler
    window, step = len(windows) - 1, 2
    code = int(windows.series_code[window])
    quantiles = np.zeros((len(windows), HORIZON, len(QUANTILES)))
    log_value = 700.0  # finite in float64: returned, exactly expm1
    quantiles[window, step, 2] = (log_value - scaler.loc[code]) / scaler.scale[code]
    back = to_original_units(dataset, windows, quantiles)
    assert back[window, step, 2] == pytest.approx(np.expm1(log_value), rel=1e-12)
    assert np.all(np.isfinite(back))
    quantiles[window, step, 2] = (720.0 - scaler.loc[code]) / scaler.scale[code]
    series = dataset.series_ids[code]
    time = windows.forecast_times(window)[step]
    with pytest.raises(
        ValueError,
        match=rf"forecast of series '{series}' at {time}, quantile index 2 is .* 720 in log1p "
        r"units, whose expm1 is beyond float64",
    ):
        to_original_units(dataset, windows, quantiles)


def test_an_affine_inverse_beyond_float64_is_refused_and_nan_passes():
    scaler = TargetScaler(loc=np.zeros(2), scale=np.array([1.0, 1e300]), method="standard")
    codes = np.array([0, 1])
    with pytest.raises(ValueError, match=r"series code 1 at \(1, 0\) is 1e\+10 .* beyond float64"):
        scaler.inverse_transform(np.array([[1e10], [1e10]]), codes)
    back = scaler.inverse_transform(np.array([[np.nan], [1e5]]), codes)
    assert np.isnan(back[0, 0]) and back[1, 0] == pytest.approx(1e305, rel=1e-12)


# ----------------------------------------------------------------- backtest cut for new series


def hours(name: str, first: int, last: int, seed: int) -> pd.DataFrame:
    times = pd.date_range("2021-03-01", periods=200, freq="h")[first : last + 1]
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"id": name, "time": times, "y": 10.0 + rng.normal(size=len(times))})


def test_a_backtests_new_series_cut_counts_freq_steps_over_a_stretch_no_series_covers():
    # Forecaster.backtest places its cutoffs on the freq grid, but the cut for a new
    # series counted back over the times some series has: hours 59..71 held no series,
    # so 25 scored steps reached back to hour 44 instead of the first cutoff, hour 56,
    # and series 'c' (target at hours 44..55) was refused.
    spec = dict(id_col="id", time_col="time", target="y", freq="h", history=6, horizon=3)
    train = pd.concat([hours(s, 0, 59, seed) for seed, s in enumerate("abd")], ignore_index=True)
    preprocessor = prepare_dataset(train, **spec).preprocessor
    new = hours("c", 44, 55, seed=7)
    table = pd.concat([hours("b", 50, 58, 1), hours("d", 72, 80, 2), new], ignore_index=True)
    scored = 3 + 22  # backtest(n_windows=2, step=22, horizon 3): cutoffs at hours 56 and 78
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # 'c' is new
        dataset = prepare_dataset(
            table, **spec, preprocessor=preprocessor, validation_fraction=0.0,
            test_fraction=0.0, scored=scored,
        )  # fmt: skip
    code = dataset.series_ids.index("c")
    values = new["y"].to_numpy(np.float64)  # all of 'c' lies before the first cutoff
    np.testing.assert_allclose(
        (dataset.target_scaler.loc[code], dataset.target_scaler.scale[code]),
        (values.mean(), values.std()),
        rtol=1e-12,
    )


# ----------------------------------------------------------------- unseen categories


def test_an_unseen_category_that_differs_only_in_type_is_named_with_its_type():
    rng = np.random.default_rng(0)
    times = pd.date_range("2021-03-01", periods=60, freq="h")
    frames = [pd.DataFrame({"id": s, "time": times, "y": 10.0 + rng.normal(size=60)}) for s in "ab"]
    table = pd.concat(frames, ignore_index=True)
    table["kind"] = rng.integers(1, 3, len(table))
    preprocessor = prepare_dataset(
        table, id_col="id", time_col="time", target="y", freq="h", history=6, horizon=3,
        known_cols=["kind"], categorical_cols=["kind"],
    ).preprocessor  # fmt: skip
    assert preprocessor.vocabularies["kind"] == (1, 2)
    # The message listed ['1', '2', '3'] for the texts '1', '2' and the number 3 alike.
    with pytest.warns(UserWarning) as caught:
        codes = preprocessor.encode("kind", pd.Series(["1", 2, 3], dtype=object))
    np.testing.assert_array_equal(codes, [2, 1, 2])
    (message,) = [str(w.message) for w in caught]
    assert "coded as unknown: ['1', 3]; '1' (str) is 1 (int) in training" in message
    assert "df['kind'].astype(int)" in message
    with pytest.warns(UserWarning) as caught:
        preprocessor.encode("kind", pd.Series([3, 4]))
    (message,) = [str(w.message) for w in caught]
    assert message.endswith("coded as unknown: [3, 4]")  # no type hint without a twin


# ----------------------------------------------------------------- metrics


def test_the_scaled_loss_of_a_one_dimensional_actual_divides_row_by_row():
    # A (N,) actual against the (N, 1) divisor broadcast to an (N, N) table: 0.27
    # instead of 0.22 here, without a word.
    rng = np.random.default_rng(0)
    actual = rng.uniform(1.0, 2.0, size=4)
    forecast = actual[:, None] + rng.normal(size=(4, len(QUANTILES)))
    scale = np.array([1.0, 2.0, 3.0, 4.0])
    error = (actual[:, None] - forecast) / scale[:, None]
    expected = np.mean(np.maximum(LEVELS * error, (LEVELS - 1.0) * error))
    got = forecast_metrics(forecast, actual, QUANTILES, scale)["mean_quantile_loss_scaled"]
    assert got == pytest.approx(expected, rel=1e-12)
    two_d = forecast_metrics(forecast[:, None], actual[:, None], QUANTILES, scale)
    assert two_d["mean_quantile_loss_scaled"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "scale, message",
    [
        (np.ones(3), r"scale must have shape \(N,\), one per row of actual \(4, 2\), got \(3,\)"),
        (np.ones((4, 2)), r"scale must have shape \(N,\).* got \(4, 2\)"),
        (np.array([1.0, 0.0, 1.0, 1.0]), r"scale must be positive and finite, got 0.0 at row 1"),
        (np.array([1.0, 1.0, np.nan, 1.0]), r"scale must be positive and finite, got nan at row 2"),
    ],
)
def test_a_scale_of_the_wrong_shape_or_not_positive_is_refused(scale, message):
    # A shorter scale failed deep in NumPy's broadcasting, a zero one gave a NaN loss.
    actual = np.ones((4, 2))
    with pytest.raises(ValueError, match=message):
        forecast_metrics(actual, actual, QUANTILES, scale)


def test_best_of_ranks_only_models_with_a_p50_q_risk():
    # A None (levels without 0.5) raised a TypeError in min; a NaN won when listed first.
    assert best_of({"a": {"p50_q_risk": None}, "b": {"p50_q_risk": 0.3}}) == "b"
    assert best_of({"a": {"p50_q_risk": float("nan")}, "b": {"p50_q_risk": 0.3}}) == "b"
    assert best_of({"a": {"p50_q_risk": 0.2}, "b": {"p50_q_risk": 0.3}}) == "a"
    with pytest.raises(ValueError, match=r"none of \['a'\] has a P50 q-risk"):
        best_of({"a": {"p50_q_risk": None}})


@pytest.mark.parametrize("name", ["actual", "forecast"])
def test_metrics_refuse_a_value_that_is_not_finite_naming_where(name):
    # A NaN made every q-risk NaN (null in metrics.json) without a word.
    values = {"actual": np.ones((2, 3)), "forecast": np.ones((2, 3, len(QUANTILES)))}
    index = (1, 2) if name == "actual" else (1, 2, 0)
    values[name][index] = np.nan
    with pytest.raises(ValueError, match=rf"{name} holds 1 values .* nan at index \({index[0]}, "):
        forecast_metrics(values["forecast"], values["actual"], QUANTILES)


def test_metrics_refuse_levels_that_share_a_q_risk_key():
    # 0.5 and 0.5000001 are both '0.5': the dict kept the second level's q-risk only.
    actual = np.ones((2, 3))
    with pytest.raises(ValueError, match=r"share the q-risk keys \['0.5', '0.5'\]"):
        forecast_metrics(actual, actual, (0.5, 0.5000001))
