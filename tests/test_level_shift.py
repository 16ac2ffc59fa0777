"""Series whose level moves: per-window normalization, target transforms, stronger baselines."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tft_jax.baselines import candidate_periods, seasonal_naive_with_drift
from tft_jax.data import prepare_dataset
from tft_jax.data.scaling import TargetScaler
from tft_jax.forecaster import DataConfig, Forecaster, ModelConfig, TrainingConfig

SPEC = dict(id_col="id", time_col="day", target="y", freq="D", history=14, horizon=7)


def trending(series: int = 6, days: int = 220, seed: int = 0) -> pd.DataFrame:
    """Daily series on straight lines of different slopes, a weekly cycle and a little noise:
    by the test period every series lies far above its training range."""
    rng = np.random.default_rng(seed)
    t = np.arange(days)
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "id": f"s{k}",
                    "day": pd.date_range("2022-01-01", periods=days, freq="D"),
                    "y": 50.0 + (0.5 + 0.3 * k) * t + 5.0 * np.sin(2 * np.pi * t / 7)
                    + rng.normal(0.0, 1.0, days),
                }
            )
            for k in range(series)
        ],
        ignore_index=True,
    )  # fmt: skip


def test_window_normalization_is_inverted_exactly():
    table = trending()
    plain = prepare_dataset(table, **SPEC)
    scaled = prepare_dataset(table, **SPEC, window_normalization=True)
    indices = np.arange(0, len(plain.test), 3)
    raw, normalized = plain.test.take(indices), scaled.test.take(indices)
    np.testing.assert_allclose(
        scaled.test.denormalize(normalized["target"], indices), raw["target"], atol=2e-5
    )
    history = scaled.test.denormalize(normalized["historical"][:, :, 0], indices)
    np.testing.assert_allclose(history, raw["historical"][:, :, 0], atol=2e-5)
    # Each window's history now has mean 0 and (nearly) unit spread.
    np.testing.assert_allclose(normalized["historical"][:, :, 0].mean(axis=1), 0.0, atol=1e-5)
    np.testing.assert_array_equal(normalized["known_history"], raw["known_history"])


def test_denormalize_refuses_values_of_other_windows_than_it_is_told():
    # One window's forecast without its index was broadcast over every window
    # of the set, each row scaled by another window's statistics.
    scaled = prepare_dataset(trending(series=2, days=80), **SPEC, window_normalization=True)
    windows = scaled.test
    one = windows.take(np.array([3]))["target"]
    with pytest.raises(ValueError, match=r"shape \(1, 7\) must have one row per window of all"):
        windows.denormalize(one)
    with pytest.raises(ValueError, match=r"one row per window of indices \(2\)"):
        windows.denormalize(one, np.array([3, 4]))
    loc, scale = windows.window_stats(np.array([3]))
    np.testing.assert_allclose(windows.denormalize(one, np.array([3])), one * scale + loc)


def fit_and_score(window_normalization: bool) -> float:
    data = DataConfig(**SPEC, validation_fraction=0.15, test_fraction=0.15,
                      window_normalization=window_normalization)  # fmt: skip
    forecaster = Forecaster(
        data,
        ModelConfig(hidden_dim=8, num_heads=2, dropout_rate=0.0),
        TrainingConfig(batch_size=32, max_steps=150, learning_rate=1e-2, eval_every=150,
                       validation_windows=64, eval_batch_size=64),
    ).fit(trending(), quiet=True)  # fmt: skip
    return forecaster.evaluate(forecaster.dataset)["models"]["fp32"]["p50_q_risk"]


@pytest.mark.slow
def test_window_normalization_beats_the_global_scaler_on_trending_series():
    normalized, global_scaler = fit_and_score(True), fit_and_score(False)
    assert normalized < 0.5 * global_scaler, (normalized, global_scaler)


def test_log1p_transform_round_trips_and_keeps_forecasts_at_or_above_minus_one():
    values = np.array([0.0, 3.0, 120.0, 7.5, 0.0, 40.0])
    codes = np.array([0, 0, 0, 1, 1, 1])
    scaler = TargetScaler.fit(values, codes, 2, "standard", transform="log1p")
    np.testing.assert_allclose(
        scaler.inverse_transform(scaler.transform(values, codes), codes), values, atol=1e-9
    )
    expected = (np.log1p(values[:3]) - scaler.loc[0]) / scaler.scale[0]
    np.testing.assert_allclose(scaler.transform(values[:3], codes[:3]), expected)
    extreme = scaler.inverse_transform(np.array([[-1e3, -50.0, 0.0]]), np.array([1]))
    assert (extreme >= -1.0).all() and extreme[0, 2] > 0
    with pytest.raises(ValueError, match=r"log1p' needs targets > -1, but series 'b' has -2.0"):
        TargetScaler.fit(np.array([1.0, -2.0]), np.array([0, 1]), 2, series_names=["a", "b"],
                         transform="log1p")  # fmt: skip


def test_a_log1p_dataset_reads_back_the_tables_own_values():
    table = trending().assign(y=lambda t: t["y"].round())
    dataset = prepare_dataset(table, **SPEC, target_transform="log1p")
    arrays = dataset.test.take(np.arange(5))
    back = dataset.inverse_transform(arrays["target"], arrays["series_code"])
    rows = dataset.test.starts[:5, None] + np.arange(7)
    np.testing.assert_allclose(back, dataset.frame["y"].to_numpy()[rows], rtol=1e-5)


def test_seasonal_naive_with_drift_continues_a_line_exactly():
    history = np.arange(1.0, 9.0)[None, :]  # 1..8, period 2: seasons (1,2) .. (7,8)
    np.testing.assert_allclose(seasonal_naive_with_drift(history, 3, 2), [[9.0, 10.0, 11.0]])
    flat = np.tile([5.0, 1.0, 3.0], 4)[None, :]  # no drift: plain seasonal naive
    np.testing.assert_allclose(seasonal_naive_with_drift(flat, 4, 3), [[5.0, 1.0, 3.0, 5.0]])
    one_season = np.array([[2.0, 4.0]])  # fewer than two seasons: no drift term
    np.testing.assert_allclose(seasonal_naive_with_drift(one_season, 2, 2), [[2.0, 4.0]])


def test_candidate_periods_follow_the_frequency_and_fit_the_history():
    assert candidate_periods("h", 168) == (1, 24, 168)
    assert candidate_periods("h", 72) == (1, 24)
    assert candidate_periods("D", 28) == (1, 7)
    assert candidate_periods("D", 400) == (1, 7, 365)
    assert candidate_periods("MS", 24) == (1, 12)


def test_a_target_outside_log1p_is_named_by_series_and_time_at_fit_and_after():
    # It named the series only, and for a fitted model advised target_transform='none',
    # which that model's fixed transform cannot follow.
    table = trending(series=2, days=120)
    late = table.index[table["id"] == "s1"][-3]
    when = table.loc[late, "day"]
    bad = table.copy()
    bad.loc[late, "y"] = -3.0
    with pytest.raises(ValueError, match=rf"has -3.0 at {when}.*use target_transform='none'"):
        prepare_dataset(bad, **SPEC, target_transform="log1p")
    fitted = prepare_dataset(table, **SPEC, target_transform="log1p").preprocessor
    with pytest.raises(ValueError, match=rf"has -3.0 at {when}.*fitted with .*fix or drop"):
        prepare_dataset(bad, **SPEC, target_transform="log1p", preprocessor=fitted)
