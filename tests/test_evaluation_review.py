"""Evaluation review: float64 metrics, exact baseline histories, fable's drift, clipping summary."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.baselines import seasonal_naive_with_drift
from tft_jax.data import PreparedDataset, prepare_dataset
from tft_jax.evaluation import (
    actuals,
    baseline_metrics,
    filled_history,
    forecast_metrics,
    seasonal_naive_forecast,
)
from tft_jax.experiments import _summary
from tft_jax.losses import ZeroTargetError

QUANTILES = (0.1, 0.5, 0.9)


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


def fable_drift(history: np.ndarray, horizon: int, period: int) -> np.ndarray:
    """fable's `SNAIVE(y ~ drift())` point forecast, written as loops (one series)."""
    steps = len(history)
    differences = [history[t] - history[t - period] for t in range(period, steps)]
    drift = sum(differences) / len(differences)
    out = []
    for h in range(1, horizon + 1):  # 1-based as in fpp3
        seasons = (h - 1) // period + 1
        out.append(history[steps + h - period * seasons - 1] + seasons * drift)
    return np.array(out)


@pytest.mark.parametrize("steps, period", [(30, 7), (31, 7), (28, 7), (10, 7), (9, 1)])
def test_seasonal_naive_with_drift_is_fables_mean_seasonal_difference(steps, period):
    # The drift was estimated from the T // m whole seasons at the end only: for
    # T = 30, m = 7 the first 2 values were dropped (forecast 150.6 vs 148.9).
    rng = np.random.default_rng(steps)
    history = np.abs(np.cumsum(rng.normal(1.0, 3.0, size=(3, steps)), axis=1)) ** 1.2
    got = seasonal_naive_with_drift(history, 16, period)
    expected = np.stack([fable_drift(row, 16, period) for row in history])
    np.testing.assert_allclose(got, expected, rtol=1e-12)


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


def test_clipping_summary_matches_a_hand_computation():
    runs = [
        {"final_val_loss": 0.5, "diverged": False, "skipped_total": 0, "clipped_fraction": 0.2},
        {"final_val_loss": float("nan"), "diverged": True, "skipped_total": 3,
         "clipped_fraction": 0.6},
        {"final_val_loss": 0.3, "diverged": False, "skipped_total": 1, "clipped_fraction": 0.1},
        {"final_val_loss": 0.4, "diverged": True, "skipped_total": 0, "clipped_fraction": 0.3},
    ]  # fmt: skip
    summary = _summary(runs)
    assert summary["runs"] == 4
    assert summary["diverged"] == 2
    assert summary["skipped_steps"] == 4
    assert summary["clipped_fraction_mean"] == pytest.approx(0.3)
    assert summary["final_val_loss_median"] == pytest.approx(0.4)
    assert summary["final_val_loss_mean"] == pytest.approx(0.4)
    assert summary["final_val_loss_min"] == 0.3
    assert summary["final_val_loss_max"] == 0.5
    assert summary["non_finite_final_val_loss"] == 1
