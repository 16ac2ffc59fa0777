"""Plots: each writes a readable PNG; inconsistent inputs are rejected before drawing."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tft_jax import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 2000


def fan_inputs():
    times = pd.date_range("2024-01-01", periods=12, freq="h")
    rows = []
    for series in ("north", "south"):
        for window in range(2):
            start = times[4 + 4 * window]
            for step in range(4):
                value = 10.0 + step
                rows.append(
                    {
                        "sensor": series,
                        "forecast_start": start,
                        "time": start + pd.Timedelta(hours=step),
                        "p10": value - 2,
                        "p50": value,
                        "p90": value + 2,
                        "actual": value + 0.5,
                    }
                )
    context = pd.DataFrame(
        {"sensor": ["north"] * 4 + ["south"] * 4, "time": list(times[:4]) * 2, "actual": 9.0}
    )
    return pd.DataFrame(rows), context


def test_fan_chart_writes_a_png_with_one_panel_per_series(tmp_path):
    forecasts, context = fan_inputs()
    path = plots.plot_forecast_fans(
        tmp_path / "fans.png",
        forecasts,
        context,
        id_col="sensor",
        time_col="time",
        lower="p10",
        median="p50",
        upper="p90",
        title="test",
        units="count",
    )
    assert_png(path)


def test_fan_chart_of_no_forecasts_is_an_error(tmp_path):
    forecasts, context = fan_inputs()
    with pytest.raises(ValueError, match="forecasts is empty"):
        plots.plot_forecast_fans(
            tmp_path / "fans.png",
            forecasts.iloc[:0],
            context,
            id_col="sensor",
            time_col="time",
            lower="p10",
            median="p50",
            upper="p90",
        )


def test_attention_plot_writes_a_png(tmp_path):
    attention = np.random.default_rng(0).dirichlet(np.ones(10), size=4)  # H=4, T+H=10
    assert_png(plots.plot_attention(tmp_path / "attention.png", attention, history=6))


@pytest.mark.parametrize(
    ("attention", "horizons", "match"),
    [
        (np.ones((4, 6)), None, r"shape \(H, T\+H\) with T=6"),
        (np.ones(10), None, r"shape \(H, T\+H\)"),
        (np.ones((4, 10)), (5,), r"horizons must lie in 1\.\.4"),
    ],
)
def test_attention_plot_rejects_inconsistent_inputs(tmp_path, attention, horizons, match):
    with pytest.raises(ValueError, match=match):
        plots.plot_attention(tmp_path / "a.png", attention, history=6, horizons=horizons)


def test_variable_importance_writes_a_png_and_skips_empty_groups(tmp_path):
    path = plots.plot_variable_importance(
        tmp_path / "importance.png",
        [
            ("static", [], np.zeros(0)),
            ("history", ["count", "hour_sin", "hour_cos"], [0.5, 0.3, 0.2]),
            ("future", ["hour_sin", "hour_cos"], [0.6, 0.4]),
        ],
    )
    assert_png(path)


def test_variable_importance_rejects_names_that_do_not_match_weights(tmp_path):
    with pytest.raises(ValueError, match="group 'history': 2 names for 3 weights"):
        plots.plot_variable_importance(
            tmp_path / "importance.png", [("history", ["a", "b"], [0.2, 0.3, 0.5])]
        )


def test_loss_curves_accept_missing_validation_losses(tmp_path):
    phases = {
        "fp32": {"step": [10, 20, 30], "train_loss": [0.5, 0.4, 0.35], "val_loss": [None] * 3},
        "qat": {"step": [5, 10], "train_loss": [0.36, 0.34], "val_loss": [0.38, 0.37]},
    }
    assert_png(plots.plot_loss_curves(tmp_path / "loss.png", phases))


def test_clipping_plot_handles_non_finite_runs(tmp_path):
    def run(clip, seed):
        broken = not clip and seed == 0
        loss = np.linspace(0.5, 0.2, 30)
        if broken:
            loss[20:] = math.nan
        return {
            "clip": clip,
            "seed": seed,
            "step_loss": list(loss),
            "step_grad_norm": list(np.linspace(3.0, 0.5, 30)),
            "final_val_loss": math.nan if broken else 0.3 + 0.01 * seed,
            "diverged": broken,
        }

    runs = [run(clip, seed) for clip in (True, False) for seed in range(3)]
    result = {"runs": runs, "settings": {"learning_rate": 0.05, "clip_norm": 1.0}}
    assert_png(plots.plot_clipping_experiment(tmp_path / "clipping.png", result))


def test_smoothing_is_a_trailing_mean_that_skips_non_finite_values():
    values = np.array([1.0, 3.0, math.nan, 5.0, 7.0])
    expected = [1.0, 2.0, 3.0, 5.0, 6.0]  # width 2: (1), (1,3), (3,-), (-,5), (5,7)
    np.testing.assert_allclose(plots._smooth(values, 2), expected)


def test_plots_create_missing_directories(tmp_path):
    path = tmp_path / "a" / "b" / "attention.png"
    plots.plot_attention(path, np.full((2, 5), 0.2), history=3)
    assert_png(path)
