"""Evaluation: metrics in the target's units, batching of windows, forecast tables."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import PreparedDataset, prepare_dataset
from tft_jax.evaluation import (
    actuals,
    baseline_metrics,
    best_of,
    evenly_spaced,
    fan_window_indices,
    filled_history,
    forecast_frame,
    forecast_metrics,
    padded_batches,
    predict_windows,
    quantile_column,
    seasonal_naive_forecast,
    to_original_units,
    window_scales,
)
from tft_jax.losses import ZeroTargetError
from tft_jax.model import TFTOutput

from .evaluation_tables import HISTORY, HORIZON, QUANTILES, make_table, prepare


@pytest.fixture(scope="module")
def dataset():
    # Series b's gap of two days is filled, and that repair is announced.
    with pytest.warns(
        UserWarning, match=r"^filled 2 missing target steps .* in 1 of 3 series: 'b' 2; "
    ):
        return prepare()


def pinball(pred: np.ndarray, target: np.ndarray, q: float) -> np.ndarray:
    error = target - pred
    return np.maximum(q * error, (q - 1) * error)


def offset_predictor(offsets: np.ndarray, heads: int = 2):
    """A stand-in model: the scaled target plus a fixed offset per quantile."""

    def predict(batch):
        target = np.asarray(batch.target, dtype=np.float64)
        size = target.shape[0]
        steps = HISTORY + HORIZON
        attention = np.tile(np.arange(steps, dtype=np.float64), (size, heads, HORIZON, 1))
        return TFTOutput(
            quantiles=target[..., None] + offsets,
            attention=attention * np.asarray(batch.static_categorical)[:, :1, None, None],
            static_weights=np.ones((size, 1)),
            history_weights=np.broadcast_to(
                np.asarray(batch.static_categorical, dtype=np.float64)[:, :, None],
                (size, HISTORY, 3),
            ),
            future_weights=np.full((size, HORIZON, 2), 0.5),
        )

    return predict


def test_q_risk_is_computed_in_the_targets_units(dataset):
    windows = dataset.test
    offsets = np.array([-0.5, 0.2, 0.7])
    predictions = predict_windows(offset_predictor(offsets), windows, batch_size=8)
    forecast = to_original_units(dataset, windows, predictions.quantiles)
    actual = actuals(dataset, windows)
    metrics = forecast_metrics(forecast, actual, QUANTILES, window_scales(dataset, windows))

    # Independent reference: the error of each quantile is offset * the series' scale.
    scale = dataset.target_scaler.scale[windows.series_code][:, None]
    for index, q in enumerate(QUANTILES):
        expected = (
            2 * pinball(actual + offsets[index] * scale, actual, q).sum() / np.abs(actual).sum()
        )
        assert metrics["q_risk"][f"{q:g}"] == pytest.approx(expected, rel=1e-4)
    assert metrics["p50_q_risk"] == metrics["q_risk"]["0.5"]
    assert metrics["p90_q_risk"] == metrics["q_risk"]["0.9"]
    stacked = np.stack([actual + o * scale for o in offsets], axis=-1)
    expected_loss = np.mean([pinball(stacked[..., i], actual, q) for i, q in enumerate(QUANTILES)])
    assert metrics["mean_quantile_loss"] == pytest.approx(expected_loss, rel=1e-4)
    expected_scaled = np.mean([pinball(o, 0.0, q) for o, q in zip(offsets, QUANTILES, strict=True)])
    assert metrics["mean_quantile_loss_scaled"] == pytest.approx(expected_scaled, rel=1e-4)


def test_scaled_and_original_q_risk_differ_when_series_levels_differ(dataset):
    """The check above would pass by accident if scales were equal; they are not."""
    scales = dataset.target_scaler.scale
    assert scales.max() / scales.min() > 10


def test_actuals_are_the_tables_own_values(dataset):
    table = make_table()
    windows = dataset.test
    actual = actuals(dataset, windows)
    for index in (0, len(windows) // 2, len(windows) - 1):
        times = windows.forecast_times(index)
        shop = dataset.series_ids[windows.series_code[index]]
        rows = table[(table.shop == shop) & table.day.isin(times)].sort_values("day")
        np.testing.assert_array_equal(actual[index], rows.sales.to_numpy())


def test_point_forecast_scores_every_level_with_the_same_value():
    actual = np.array([[1.0, 2.0], [3.0, 5.0]])
    point = np.array([[2.0, 2.0], [2.0, 2.0]])
    metrics = forecast_metrics(point, actual, QUANTILES)
    for q in QUANTILES:
        expected = 2 * pinball(point, actual, q).sum() / np.abs(actual).sum()
        assert metrics["q_risk"][f"{q:g}"] == pytest.approx(expected, rel=1e-6)


def test_perfect_forecast_has_zero_risk():
    actual = np.array([[1.0, -2.0, 4.0]])
    metrics = forecast_metrics(np.repeat(actual[..., None], 3, -1), actual, QUANTILES)
    assert metrics["p50_q_risk"] == 0.0
    assert metrics["mean_quantile_loss"] == 0.0


def test_q_risk_of_mixed_sign_actuals_divides_by_the_sum_of_their_magnitudes():
    # Reference: the paper's 2·Σ pinball / Σ|y| in float64 NumPy. Σ|y| = 21 here while
    # |Σy| = 3: a denominator of |Σy| makes every level 7x too large.
    actual = np.array([[3.0, -5.0, 2.0], [-1.0, 4.0, -6.0]])
    errors = np.array([[0.5, -1.0, 0.0], [2.0, 0.0, -0.5]])
    forecast = (actual + errors)[..., None] + np.array([-1.5, 0.25, 2.0])  # (2, 3, Q)
    metrics = forecast_metrics(forecast, actual, QUANTILES)
    for i, q in enumerate(QUANTILES):
        expected = 2.0 * pinball(forecast[..., i], actual, q).sum() / np.abs(actual).sum()
        assert metrics["q_risk"][f"{q:g}"] == pytest.approx(expected, rel=1e-12)
    assert metrics["p50_q_risk"] == metrics["q_risk"]["0.5"]


def test_forecast_metrics_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"forecast must have shape \(2, 3\) or \(2, 3, 3\)"):
        forecast_metrics(np.zeros((2, 3, 2)), np.zeros((2, 3)), QUANTILES)


def test_seasonal_naive_of_windows_repeats_last_week_in_original_units(dataset):
    windows = dataset.test
    naive = seasonal_naive_forecast(dataset, windows, period=7)
    table = make_table()
    index = 3
    shop = dataset.series_ids[windows.series_code[index]]
    start = windows.forecast_start[index]
    series = table[table.shop == shop].set_index("day").sales
    expected = series.loc[start - pd.Timedelta(days=7) : start - pd.Timedelta(days=1)].to_numpy()
    np.testing.assert_allclose(naive[index], expected, rtol=1e-5)


def test_padded_batches_cover_every_window_once_with_one_shape(dataset):
    windows = dataset.test
    seen, shapes = [], set()
    for batch, valid in padded_batches(windows, batch_size=8):
        shapes.add(batch.target.shape)
        seen.append(np.asarray(batch.target)[:valid])
    assert shapes == {(8, HORIZON)}
    np.testing.assert_array_equal(np.concatenate(seen), windows.arrays()["target"])


def test_predict_windows_averages_weights_over_windows_heads_and_steps(dataset):
    windows = dataset.test
    predictions = predict_windows(offset_predictor(np.zeros(3)), windows, batch_size=5)
    codes = windows.series_code.astype(np.float64)
    assert predictions.quantiles.shape == (len(windows), HORIZON, 3)
    np.testing.assert_allclose(
        predictions.attention, np.tile(np.arange(HISTORY + HORIZON), (HORIZON, 1)) * codes.mean()
    )
    np.testing.assert_allclose(predictions.history_weights, np.full(3, codes.mean()))
    np.testing.assert_allclose(predictions.future_weights, [0.5, 0.5])
    np.testing.assert_allclose(predictions.static_weights, [1.0])


def test_forecast_frame_has_one_row_per_window_step_with_the_right_times(dataset):
    windows = dataset.test
    forecast = np.arange(len(windows) * HORIZON * 3, dtype=np.float64).reshape(-1, HORIZON, 3)
    table = forecast_frame(dataset, windows, forecast, QUANTILES)
    assert list(table.columns) == [
        "shop",
        "forecast_start",
        "day",
        "horizon",
        "p10",
        "p50",
        "p90",
        "actual",
    ]
    assert len(table) == len(windows) * HORIZON
    row = table.iloc[HORIZON + 2]  # window 1, horizon step 3
    assert row["day"] == windows.forecast_times(1)[2]
    assert row["forecast_start"] == windows.forecast_start[1]
    assert row["horizon"] == 3
    assert row["p50"] == forecast[1, 2, 1]
    assert row["actual"] == actuals(dataset, windows)[1, 2]


def test_quantile_columns_are_percent_names():
    assert [quantile_column(q) for q in (0.1, 0.5, 0.9, 0.025)] == ["p10", "p50", "p90", "p2.5"]


def test_fan_windows_tile_time_without_overlap(dataset):
    windows = dataset.test
    chosen = fan_window_indices(windows, per_series=3, codes=np.unique(windows.series_code)[:2])
    codes = windows.series_code[chosen]
    assert set(codes) == {0, 1}
    for code in (0, 1):
        starts = windows.starts[chosen[codes == code]]
        assert 1 <= len(starts) <= 3
        assert np.all(np.diff(starts) >= HORIZON)


def test_evenly_spaced_keeps_the_requested_count_in_order(dataset):
    windows = dataset.train
    kept = evenly_spaced(windows, 10)
    assert len(kept) == 10
    assert np.all(np.diff(kept.starts) > 0)
    assert kept.starts[0] == windows.starts[0] and kept.starts[-1] == windows.starts[-1]
    assert evenly_spaced(windows, 10**6) is windows


@pytest.fixture(scope="module")
def log1p_dataset():
    with pytest.warns(UserWarning, match="filled 2 missing target steps"):
        return prepare(target_transform="log1p")


def test_scaled_loss_with_log1p_is_the_loss_on_the_models_scale(log1p_dataset):
    # It divided original-unit errors by a scale of log1p units: 130 for a model
    # whose loss on the scale it is trained on is 0.073.
    dataset, windows = log1p_dataset, log1p_dataset.test
    scale = window_scales(dataset, windows)
    actual = actuals(dataset, windows)
    # Seasonal naive, as evaluate scores it, against a float64 reference in log1p units.
    naive = seasonal_naive_forecast(dataset, windows, period=7)
    metrics = baseline_metrics(dataset, windows, QUANTILES, (7,))["seasonal_naive_7"]
    errors = (np.log1p(naive) - np.log1p(actual)) / scale[:, None]
    expected = np.mean([pinball(errors, 0.0, q) for q in QUANTILES])
    assert metrics["mean_quantile_loss_scaled"] == pytest.approx(expected, rel=1e-4)
    # A model: the scaled target plus a fixed offset per level scores that offset's loss.
    offsets = np.array([-0.5, 0.2, 0.7])
    predictions = predict_windows(offset_predictor(offsets), windows, batch_size=8)
    forecast = to_original_units(dataset, windows, predictions.quantiles)
    metrics = forecast_metrics(forecast, actual, QUANTILES, scale, "log1p")
    expected = np.mean([pinball(o, 0.0, q) for o, q in zip(offsets, QUANTILES, strict=True)])
    assert metrics["mean_quantile_loss_scaled"] == pytest.approx(expected, rel=1e-4)


def test_scaled_loss_with_log1p_is_none_for_a_forecast_outside_the_domain():
    actual = np.array([[1.0, 2.0]])
    metrics = forecast_metrics(np.array([[0.5, -1.0]]), actual, QUANTILES, np.ones(1), "log1p")
    assert metrics["mean_quantile_loss_scaled"] is None
    assert metrics["p50_q_risk"] > 0  # the other metrics stay defined
    with pytest.raises(ValueError, match=r"target_transform must be one of .* got 'log'"):
        forecast_metrics(actual, actual, QUANTILES, np.ones(1), "log")


def test_scaled_loss_with_log1p_refuses_an_actual_outside_the_domain_naming_it():
    # log1p(-2) is NaN: the scaled loss was NaN without a word (only forecasts were checked).
    actual = np.array([[1.0, -2.0, 3.0], [0.5, -1.0, 2.0]])
    with pytest.raises(
        ValueError, match=r"actual holds 2 values <= -1 \(the first -2.0 at index \(0, 1\)\).*log1p"
    ):
        forecast_metrics(np.zeros_like(actual), actual, QUANTILES, np.ones(2), "log1p")
    # Without log1p (or without a scale, so no scaled loss) the same actuals are scored.
    metrics = forecast_metrics(np.zeros_like(actual), actual, QUANTILES, np.ones(2))
    assert np.isfinite(metrics["mean_quantile_loss_scaled"])
    assert "mean_quantile_loss_scaled" not in forecast_metrics(
        np.zeros_like(actual), actual, QUANTILES, None, "log1p"
    )


@pytest.mark.parametrize(
    "quantiles",
    [["a"], None, "0.5", [0.5, object()], ["0.1", "0.5"], 0.5, [[0.1, 0.5]], [True, False]],
)
def test_quantiles_that_are_not_numbers_raise_naming_quantiles(quantiles):
    # ['a'] raised a bare "could not convert string to float: 'a'"; texts that convert,
    # a bare level and a nested list were taken as levels.
    with pytest.raises(TypeError, match=r"quantiles must be a sequence of numbers"):
        forecast_metrics(np.zeros((1, 3)), np.ones((1, 3)), quantiles)


# ----------------------------------------------------------------- float64 metrics


def pinball64(forecast: np.ndarray, actual: np.ndarray, q: float) -> np.ndarray:
    error = actual - forecast
    return np.maximum(q * error, (q - 1.0) * error)


def test_metrics_keep_float64_precision_at_a_large_level():
    # A float32 copy of 1e8 + k rounds to a multiple of 8: the q-risk came out 47%
    # too high and the mean quantile loss 1.20 instead of 0.82.
    rng = np.random.default_rng(0)
    actual = 1e8 + rng.integers(0, 100, size=(20, 5)).astype(np.float64)
    forecast = actual[..., None] + rng.normal(0.0, 2.0, size=(20, 5, 3))
    metrics = forecast_metrics(forecast, actual, QUANTILES, np.full(20, 50.0))
    for index, q in enumerate(QUANTILES):
        losses = pinball64(forecast[..., index], actual, q)
        expected = 2.0 * losses.sum() / np.abs(actual).sum()
        assert metrics["q_risk"][f"{q:g}"] == pytest.approx(expected, rel=1e-9)
    expected_mean = np.mean(
        [pinball64(forecast[..., i], actual, q) for i, q in enumerate(QUANTILES)]
    )
    assert metrics["mean_quantile_loss"] == pytest.approx(expected_mean, rel=1e-9)
    assert metrics["mean_quantile_loss_scaled"] == pytest.approx(expected_mean / 50.0, rel=1e-9)
    assert metrics["p50_q_risk"] == metrics["q_risk"]["0.5"]


def test_metrics_still_refuse_zero_targets_and_bad_levels():
    with pytest.raises(ZeroTargetError, match="sum"):
        forecast_metrics(np.ones((2, 3)), np.zeros((2, 3)), QUANTILES)
    with pytest.raises(ValueError, match=r"quantiles must be .* in \(0, 1\)"):
        forecast_metrics(np.ones((2, 3)), np.ones((2, 3)), (0.5, 1.0))
    with pytest.raises(ValueError, match=r"quantiles must be .* in \(0, 1\)"):
        forecast_metrics(np.ones((2, 3)), np.ones((2, 3)), (float("nan"),))


LEVELS = np.asarray(QUANTILES)


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


def test_best_of_breaks_p50_ties_by_p90_then_by_name_not_by_listing_order():
    tied = {"b": {"p50_q_risk": 0.2, "p90_q_risk": 0.1}, "a": {"p50_q_risk": 0.2}}
    assert best_of(tied) == "b"  # a has no P90 q-risk
    tied["a"]["p90_q_risk"] = float("nan")
    assert best_of(tied) == "b"
    tied["a"]["p90_q_risk"] = 0.1
    assert best_of(tied) == best_of(dict(reversed(tied.items()))) == "a"
    tied["a"]["p90_q_risk"] = 0.3
    assert best_of(dict(reversed(tied.items()))) == "b"


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


# ----------------------------------------------------------------- histories of the baselines


def periodic_dataset() -> PreparedDataset:
    """A daily series repeating each week exactly at a level of 1e8, a training day missing."""
    times = pd.date_range("2024-01-01", periods=126, freq="D")
    values = 1e8 + np.tile([0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0], 18)
    table = pd.DataFrame({"shop": "a", "day": times, "sales": values}).drop(index=[40])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the filled step is announced
        return prepare_dataset(
            table, id_col="shop", time_col="day", target="sales", freq="D",
            history=14, horizon=7, validation_fraction=0.2, test_fraction=0.2, scaler="none",
        )  # fmt: skip


def test_seasonal_naive_of_an_exactly_periodic_series_is_exact():
    # The history came back from the float32 scaled target: off by up to 4 at 1e8.
    dataset = periodic_dataset()
    windows = dataset.test
    naive = seasonal_naive_forecast(dataset, windows, period=7)
    actual = actuals(dataset, windows)
    np.testing.assert_array_equal(naive, actual)
    assert (
        baseline_metrics(dataset, windows, QUANTILES, (7,))["seasonal_naive_7"]["p50_q_risk"] == 0.0
    )
    # Off by exactly one unit: 2 · 0.5 · n / Σ|y|, which float32 copies of 1e8 + k lose.
    metrics = forecast_metrics(actual + 1.0, actual, QUANTILES)
    assert metrics["p50_q_risk"] == pytest.approx(actual.size / np.abs(actual).sum(), rel=1e-12)


def test_filled_history_is_the_tables_values_and_forward_fills_gaps():
    dataset = periodic_dataset()
    windows = dataset.train
    history = filled_history(dataset, windows)
    rows = windows.starts[:, None] + np.arange(-windows.history, 0)
    frame = dataset.frame["sales"].to_numpy(dtype=np.float64)
    observed = ~np.isnan(frame[rows])
    assert (~observed).any(), "the test needs a window whose history holds the gap"
    np.testing.assert_array_equal(history[observed], frame[rows][observed])
    # The gap is forward filled (as the model sees it), up to the float32 round trip.
    gap = np.argwhere(~observed)
    for window, step in gap:
        assert history[window, step] == pytest.approx(history[window, step - 1], abs=8.0)


def test_nonnegative_baselines_are_clipped_at_zero_as_the_models_are():
    # A drift extrapolates a falling series below 0; the models' forecasts were clipped
    # and the baselines' not, which tilted the comparison.
    table = make_table()
    falling = table["shop"] == "a"
    table.loc[falling, "sales"] = np.maximum(80.0 - np.arange(falling.sum()), 0.5)  # then flat
    with pytest.warns(UserWarning, match="filled 2 missing target steps"):  # b's gap
        dataset = prepare(table)
    windows = dataset.test
    drift = baseline_metrics(dataset, windows, QUANTILES, (7,))["drift_7"]
    clipped = baseline_metrics(dataset, windows, QUANTILES, (7,), nonnegative=True)["drift_7"]
    # The reference: y[T - m + (h mod m)] + (h // m + 1) * d, d the mean seasonal difference.
    history = filled_history(dataset, windows).astype(np.float64)
    slope = np.mean(history[:, 7:] - history[:, :-7], axis=1)
    ahead = np.arange(HORIZON)
    forecast = history[:, -7 + ahead % 7] + slope[:, None] * (ahead // 7 + 1)
    assert (forecast < 0).any()
    actual = actuals(dataset, windows).astype(np.float64)
    expected = np.abs(np.maximum(forecast, 0.0) - actual).sum() / np.abs(actual).sum()
    assert clipped["p50_q_risk"] == pytest.approx(expected, rel=1e-5)
    unclipped = np.abs(forecast - actual).sum() / np.abs(actual).sum()
    assert drift["p50_q_risk"] == pytest.approx(unclipped, rel=1e-5)
    assert clipped["p50_q_risk"] < drift["p50_q_risk"]
