"""Second review of the plots: what is drawn is checked on the artists' data against
independent computations, files land where announced, and degenerate inputs are drawn
or refused by name instead of failing inside matplotlib."""

from __future__ import annotations

import math

import matplotlib.dates as mdates
import numpy as np
import pandas as pd
import pytest

from tft_jax import plots

from .test_plots_parser_review import _capture_figures


def _band_edges(collection) -> dict[float, tuple[float, float]]:
    """`{x: (lowest y, highest y)}` over the vertices of a filled band."""
    edges: dict[float, tuple[float, float]] = {}
    for path in collection.get_paths():
        for x, y in path.vertices:
            low, high = edges.get(float(x), (math.inf, -math.inf))
            edges[float(x)] = (min(low, float(y)), max(high, float(y)))
    return edges


def test_fan_chart_bands_and_medians_are_the_given_columns_per_window_in_time_order(
    tmp_path, monkeypatch
):
    # Five quantile columns, rows shuffled, two windows in a zone with daylight saving time.
    rng = np.random.default_rng(0)
    times = pd.date_range("2024-03-30", periods=16, freq="h", tz="Europe/Paris")
    rows = []
    for start in (8, 12):
        for step in range(4):
            levels = np.sort(rng.normal(size=5)) + start
            rows.append(
                {"id": "a", "forecast_start": times[start], "time": times[start + step],
                 **dict(zip(("p5", "p25", "p50", "p75", "p95"), levels, strict=True)),
                 "actual": float(start + step)}
            )  # fmt: skip
    forecasts = pd.DataFrame(rows)
    context = pd.DataFrame({"id": "a", "time": times[:8], "actual": np.arange(8.0)})
    figures = _capture_figures(monkeypatch)
    plots.plot_forecast_fans(
        tmp_path / "fans.png", forecasts.sample(frac=1.0, random_state=1), context,
        id_col="id", time_col="time", lower="p5", median="p50", upper="p95",
    )  # fmt: skip
    (axis,) = figures[0].axes
    bands = axis.collections
    assert len(bands) == 2  # one per window, never joined
    medians = [line for line in axis.get_lines() if line.get_label() != "actual"]
    for band, median, start in zip(bands, medians, (8, 12), strict=True):
        window = forecasts[forecasts["forecast_start"] == times[start]]
        x = mdates.date2num(window["time"].dt.tz_convert("UTC").dt.tz_localize(None))
        edges = _band_edges(band)
        for position, low, high in zip(x, window["p5"], window["p95"], strict=True):
            assert edges[float(position)] == pytest.approx((low, high))
        np.testing.assert_allclose(median.get_ydata(orig=False), window["p50"])
        np.testing.assert_allclose(median.get_xdata(orig=False), x)
    (actual,) = [line for line in axis.get_lines() if line.get_label() == "actual"]
    np.testing.assert_allclose(actual.get_ydata(orig=False), np.arange(16.0))
    figures[0].canvas.draw()
    # The ticks are read in the table's zone: Paris local hours, not UTC.
    assert str(axis.xaxis.get_major_formatter()._tz) == "Europe/Paris"


def test_plot_is_written_at_exactly_the_path_it_returns_without_a_suffix(tmp_path):
    # Matplotlib appended '.png' to a path without a suffix: the path returned did not exist.
    path = plots.plot_attention(tmp_path / "attention", np.full((2, 5), 0.2), history=3)
    assert path == tmp_path / "attention"
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention"]


@pytest.mark.parametrize("name", ["attention.pdf", "attention.SVG", "attention.jpg"])
def test_plot_refuses_a_path_naming_another_image_format(tmp_path, name):
    # A '.pdf' path was written as a PDF by a function documented to write a PNG.
    with pytest.raises(ValueError, match=r"written as PNG; path .* names a \."):
        plots.plot_attention(tmp_path / name, np.full((2, 5), 0.2), history=3)
    assert not any(tmp_path.iterdir())


def test_clipping_plot_of_runs_that_all_diverged_is_drawn(tmp_path, monkeypatch):
    # Every final validation loss non-finite: saving the log axis failed in matplotlib's
    # ticker ("Data cannot be log-scaled"), after the whole experiment had run.
    def run(clip):
        return {
            "clip": clip,
            "step_loss": [0.5, math.nan, math.nan],
            "step_grad_norm": [math.nan] * 3,
            "final_val_loss": math.nan,
            "diverged": True,
        }

    figures = _capture_figures(monkeypatch)
    result = {"runs": [run(True), run(False)], "settings": {"learning_rate": 1.0}}
    path = plots.plot_clipping_experiment(tmp_path / "clipping.png", result)
    assert path.read_bytes()[:4] == b"\x89PNG"
    losses, norms, finals = figures[0].axes
    assert losses.get_yscale() == "log"  # a positive loss was drawn
    assert norms.get_yscale() == "linear"
    assert finals.get_yscale() == "linear"
    assert [text.get_text() for text in finals.texts] == ["1 non-finite"] * 2


@pytest.mark.parametrize("shape", [(4, 10), (2, 6), (0, 5)])
def test_attention_plot_refuses_a_width_other_than_history_plus_horizon(tmp_path, shape):
    # (4, 10) with T=3 was drawn: columns 0..2 of a T=6 window labelled as lags -3..-1.
    # (0, 5) was blamed on horizons the caller had not given.
    with pytest.raises(ValueError, match=r"shape \(H, T\+H\) with T=3 and H >= 1"):
        plots.plot_attention(tmp_path / "a.png", np.full(shape, 0.1), history=3)


def test_attention_curves_are_the_history_columns_against_their_lags(tmp_path, monkeypatch):
    attention = np.random.default_rng(0).dirichlet(np.ones(9), size=3)  # H=3, T=6
    figures = _capture_figures(monkeypatch)
    plots.plot_attention(tmp_path / "a.png", attention, history=6, horizons=[2])
    step, mean = figures[0].axes[0].get_lines()
    np.testing.assert_array_equal(step.get_xdata(), np.arange(-6, 0))
    np.testing.assert_allclose(step.get_ydata(), attention[1, :6])
    np.testing.assert_allclose(mean.get_ydata(), attention[:, :6].sum(axis=0) / 3)


def test_loss_curves_name_a_phase_whose_lists_differ_in_length(tmp_path):
    phases = {
        "fp32": {"step": [1, 2], "train_loss": [0.5, 0.4], "val_loss": [None, 0.4]},
        "qat": {"step": [1, 2, 3], "train_loss": [0.4, 0.3], "val_loss": [None] * 3},
    }
    with pytest.raises(ValueError, match=r"phase 'qat' must have lists .* of one length"):
        plots.plot_loss_curves(tmp_path / "loss.png", phases)


def test_loss_curves_continue_each_phase_after_the_previous_one(tmp_path, monkeypatch):
    phases = {
        "fp32": {"step": [10, 20], "train_loss": [0.5, 0.4], "val_loss": [0.6, None]},
        "qat": {"step": [5, 10], "train_loss": [0.3, 0.2], "val_loss": [0.35, 0.25]},
    }
    figures = _capture_figures(monkeypatch)
    plots.plot_loss_curves(tmp_path / "loss.png", phases)
    lines = {line.get_label(): line for line in figures[0].axes[0].get_lines()}
    np.testing.assert_array_equal(lines["qat train"].get_xdata(), [25.0, 30.0])
    np.testing.assert_array_equal(lines["fp32 validation"].get_ydata(), [0.6, math.nan])


def test_future_chart_reads_a_forecast_csv_across_a_daylight_saving_change(tmp_path, monkeypatch):
    # The forecast written as CSV and read back holds texts with two UTC offsets, which
    # pd.to_datetime refused ("Mixed timezones detected").
    local = pd.date_range("2024-03-29", periods=48, freq="h", tz="Europe/Paris")
    future = pd.date_range(local[-1] + pd.Timedelta("1h"), periods=24, freq="h")
    forecast = pd.DataFrame({"id": "a", "time": future, "q0.1": 1.0, "q0.5": 2.0, "q0.9": 3.0})
    forecast.to_csv(tmp_path / "f.csv", index=False, date_format="%Y-%m-%dT%H:%M:%S%z")
    read_back = pd.read_csv(tmp_path / "f.csv")
    history = pd.DataFrame({"id": "a", "time": local, "y": 1.0})
    figures = _capture_figures(monkeypatch)
    plots.plot_future(
        tmp_path / "f.png", read_back, history, id_col="id", time_col="time", target="y",
        quantiles=(0.1, 0.5, 0.9), tail=4, timezone="Europe/Paris",
    )  # fmt: skip
    (axis,) = figures[0].axes
    (band,) = axis.collections
    expected = mdates.date2num(future.tz_convert("UTC").tz_localize(None))
    assert sorted(_band_edges(band)) == pytest.approx(list(expected))


def test_many_plots_leave_no_figure_open(tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    for index in range(5):
        plots.plot_attention(tmp_path / f"a{index}.png", np.full((2, 5), 0.2), history=3)
    assert plt.get_fignums() == before
