"""Plots: each writes a readable PNG at the path it returns; what is drawn matches the
artists' data and labels; inconsistent inputs are rejected by name before drawing, and
degenerate ones are still drawn."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
import warnings

import matplotlib.dates as mdates
import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from tft_jax import cli_experiments, plots
from tft_jax.data.tables import time_grid

from .figure_capture import _capture_figures

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
    # A (H, 1) array is read as one weight per entry: the message says so.
    with pytest.raises(
        ValueError, match=r"1 names for 3 weights, one per entry of the \(3, 1\) array"
    ):
        plots.plot_variable_importance(
            tmp_path / "importance.png", [("history", ["a"], np.full((3, 1), 1 / 3))]
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


def test_gaps_are_steps_over_1_5_times_the_most_common_step_not_the_smallest():
    # Steps of 1, then mostly 2, then one of 6: the usual step is 2 (the mode), so only
    # the 6 is a gap; measured from the smallest step (1), every 2 would be one.
    steps = np.array([1.0, 2.0, 2.0, 2.0, 6.0, 0.0])
    positive = [s for s in steps.tolist() if s > 0]
    mode = max(set(positive), key=positive.count)
    expected = [i for i, s in enumerate(steps.tolist()) if s > 1.5 * mode]
    assert expected == [4]
    np.testing.assert_array_equal(plots._wide_steps(steps), expected)


def test_plots_create_missing_directories(tmp_path):
    path = tmp_path / "a" / "b" / "attention.png"
    plots.plot_attention(path, np.full((2, 5), 0.2), history=3)
    assert_png(path)


def _capture_fans(monkeypatch) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """Records the `(forecasts, context)` tables each fan chart is drawn from."""
    drawn: list[tuple[pd.DataFrame, pd.DataFrame]] = []

    def record(path, forecasts, context, **kwargs):
        drawn.append((forecasts, context))
        return path

    monkeypatch.setattr(plots, "plot_forecast_fans", record)
    return drawn


def test_run_fan_charts_draw_the_quantiles_sorted_as_the_library_returns_them(
    tmp_path, monkeypatch
):
    from tft_jax.data import prepare_dataset
    from tft_jax.evaluation import Predictions

    times = pd.date_range("2024-01-01", periods=120, freq="D")
    table = pd.DataFrame({"shop": "a", "day": times, "sales": 10.0 + np.arange(120) % 7})
    dataset = prepare_dataset(
        table, id_col="shop", time_col="day", target="sales", freq="D", history=14, horizon=7
    )
    windows = dataset.split("test")
    crossed = np.broadcast_to(np.array([1.0, 0.0, -1.0]), (len(windows), 7, 3))  # p10 > p90
    predictions = Predictions(
        quantiles=np.array(crossed),
        attention=np.full((7, 21), 1 / 21),
        static_weights=_uniform(dataset.static_weight_names),
        history_weights=_uniform(dataset.history_weight_names),
        future_weights=_uniform(dataset.future_weight_names),
    )
    drawn = _capture_fans(monkeypatch)
    plots.draw_run_plots(dataset, "test", {"fp32": predictions}, (0.1, 0.5, 0.9), None, tmp_path)
    ((forecasts, _),) = drawn
    assert (forecasts["p10"] < forecasts["p50"]).all()
    assert (forecasts["p50"] < forecasts["p90"]).all()


def _future_forecast(times: pd.DatetimeIndex) -> pd.DataFrame:
    return pd.DataFrame({"id": "a", "time": times, "q0.1": 1.0, "q0.5": 2.0, "q0.9": 3.0})


def test_future_chart_reads_day_first_history_times_as_the_model_did(tmp_path, monkeypatch):
    days = pd.date_range("2024-01-01", periods=40, freq="D")
    history = pd.DataFrame({"id": "a", "time": days.strftime("%d/%m/%Y"), "y": np.arange(40.0)})
    forecast = _future_forecast(pd.date_range("2024-02-10", periods=5, freq="D"))
    drawn = _capture_fans(monkeypatch)
    plots.plot_future(
        tmp_path / "f.png", forecast, history, id_col="id", time_col="time", target="y",
        quantiles=(0.1, 0.5, 0.9), tail=10, dayfirst=True,
    )  # fmt: skip
    ((_, context),) = drawn
    assert list(context["time"]) == list(days[-10:])


def test_future_chart_reads_history_with_daylight_saving_offsets_in_the_forecasts_zone(
    tmp_path, monkeypatch
):
    local = pd.date_range("2024-03-30", periods=72, freq="h", tz="Europe/Paris")
    history = pd.DataFrame({"id": "a", "time": [t.isoformat() for t in local], "y": 1.0})
    forecast = _future_forecast(pd.date_range(local[-1] + pd.Timedelta("1h"), periods=3, freq="h"))
    drawn = _capture_fans(monkeypatch)
    plots.plot_future(
        tmp_path / "f.png", forecast, history, id_col="id", time_col="time", target="y",
        quantiles=(0.1, 0.5, 0.9), tail=10, timezone="Europe/Paris",
    )  # fmt: skip
    ((_, context),) = drawn
    assert list(context["time"]) == list(local[-10:])
    assert str(context["time"].dt.tz) == "Europe/Paris"


def _pixels_of(path, color: str) -> int:
    """Pixels of a PNG within a small distance of the colour `#rrggbb`."""
    import matplotlib.image

    image = np.round(matplotlib.image.imread(path)[..., :3] * 255).astype(int)
    rgb = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(image - rgb).sum(axis=-1) <= 6).sum())


def test_fan_chart_draws_one_step_forecasts_visibly(tmp_path):
    # Horizon 1: every window is one point, which a filled band and a line do not show.
    times = pd.date_range("2024-01-01", periods=12, freq="h")
    starts = times[[9, 11]]
    context = pd.DataFrame({"sensor": "north", "time": times[:9], "actual": 10.0})

    def draw(name, median, lower, upper):
        forecasts = pd.DataFrame(
            {"sensor": "north", "forecast_start": starts, "time": starts, "p10": lower,
             "p50": median, "p90": upper, "actual": 10.0}
        )  # fmt: skip
        return plots.plot_forecast_fans(
            tmp_path / name, forecasts, context, id_col="sensor", time_col="time",
            lower="p10", median="p50", upper="p90",
        )  # fmt: skip

    drawn = draw("drawn.png", 20.0, 5.0, 30.0)
    # The same chart without forecast values: only the legend shows their colours.
    legend_only = draw("legend.png", math.nan, math.nan, math.nan)
    for color in (plots._MEDIAN, plots._BAND):
        assert _pixels_of(drawn, color) > _pixels_of(legend_only, color) + 20, color


def test_loss_curves_draw_a_single_evaluation_visibly(tmp_path):
    # A time budget spent by the first step leaves one point of training loss.
    def draw(name, loss):
        phases = {"fp32": {"step": [1], "train_loss": [loss], "val_loss": [None]}}
        return plots.plot_loss_curves(tmp_path / name, phases)

    train_color = "#1f77b4"
    assert _pixels_of(draw("one.png", 0.5), train_color) > (
        _pixels_of(draw("none.png", None), train_color) + 20
    )


def test_future_chart_draws_the_first_few_series_by_default_and_named_ones_in_order(
    tmp_path, monkeypatch
):
    # All series by default made a chart of one panel per series: hundreds of panels,
    # a PNG tens of thousands of pixels tall. Named series were drawn in table order.
    times = pd.date_range("2024-01-01", periods=8, freq="D")
    names = [f"s{index:02d}" for index in range(plots.MAX_FAN_SERIES + 3)]
    history = pd.DataFrame([(n, t, 1.0) for n in names for t in times], columns=["id", "time", "y"])
    future = pd.date_range(times[-1] + pd.Timedelta("1D"), periods=2, freq="D")
    forecast = pd.concat([_future_forecast(future).assign(id=name) for name in names])
    drawn = _capture_fans(monkeypatch)
    options = dict(id_col="id", time_col="time", target="y", quantiles=(0.1, 0.5, 0.9), tail=4)
    plots.plot_future(tmp_path / "all.png", forecast, history, **options)
    plots.plot_future(tmp_path / "two.png", forecast, history, series=["s07", "s01"], **options)
    (default, _), (named, _) = drawn
    assert list(pd.unique(default["id"])) == names[: plots.MAX_FAN_SERIES]
    assert list(pd.unique(named["id"])) == ["s07", "s01"]


def _unsaved_figures(monkeypatch) -> list:
    """Records each figure `plots` would save, without writing it (no PNG is drawn)."""
    figures: list = []
    monkeypatch.setattr(plots, "_save", lambda figure, path: figures.append(figure) or path)
    return figures


def test_future_chart_says_in_its_title_that_it_draws_only_the_first_series(monkeypatch):
    # The first 6 of 42 series were drawn without a word to a Python caller, while the
    # run's fan charts say so in their titles.
    times = pd.date_range("2024-01-01", periods=2, freq="D")
    names = [f"s{index:02d}" for index in range(plots.MAX_FAN_SERIES + 2)]
    history = pd.DataFrame([(n, t, 1.0) for n in names for t in times], columns=["id", "time", "y"])
    forecast = pd.concat([_future_forecast(times + pd.Timedelta("2D")).assign(id=name)
                          for name in names])  # fmt: skip
    figures = _unsaved_figures(monkeypatch)
    options = dict(id_col="id", time_col="time", target="y", quantiles=(0.1, 0.5, 0.9), tail=2)
    cut = f"the first {plots.MAX_FAN_SERIES} of {plots.MAX_FAN_SERIES + 2} series"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # told in the title only: the CLI prints its own line
        plots.plot_future("titled.png", forecast, history, title="TFT: after the data", **options)
        plots.plot_future("untitled.png", forecast, history, **options)
        plots.plot_future("named.png", forecast, history, series=names[:2], title="T", **options)
        few = forecast[forecast["id"].isin(names[: plots.MAX_FAN_SERIES])]
        plots.plot_future("few.png", few, history, title="T", **options)
    titles = [figure.get_suptitle() for figure in figures]
    assert titles == [f"TFT: after the data ({cut})", cut, "T", "T"]
    assert len(figures[0].axes) == plots.MAX_FAN_SERIES


# ----------------------------------------------------------------- refused and degenerate inputs


def test_variable_importance_scale_comes_from_the_finite_weights(tmp_path, monkeypatch):
    # A NaN weight (a diverged model) set the scale to ~1e-9: the finite bars ran off it.
    figures = _capture_figures(monkeypatch)
    plots.plot_variable_importance(
        tmp_path / "vi.png", [("history", ["a", "b", "c"], [math.nan, 0.5, 0.2])]
    )
    (axis,) = figures[0].axes
    assert axis.get_xlim() == pytest.approx((0.0, 0.55))
    labels = [label.get_text() for label in axis.get_yticklabels()]
    assert labels == ["a (nan)", "c", "b"]  # ascending, the non-finite one named at the bottom
    widths = [patch.get_width() for patch in axis.patches]
    np.testing.assert_allclose(widths, [0.0, 0.2, 0.5])


def test_variable_importance_with_an_infinite_weight_still_draws(tmp_path):
    path = plots.plot_variable_importance(tmp_path / "vi.png", [("h", ["a", "b"], [math.inf, 0.5])])
    assert path.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("history", [0, -1, 2.5, True])
def test_attention_plot_refuses_a_history_that_is_not_a_positive_int(tmp_path, history):
    with pytest.raises(ValueError, match="history must be an int >= 1"):
        plots.plot_attention(tmp_path / "a.png", np.full((2, 5), 0.2), history=history)


def test_attention_plot_refuses_fractional_horizons_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"horizons must lie in 1\.\.2 \(whole steps\), got 1\.5"):
        plots.plot_attention(tmp_path / "a.png", np.full((2, 5), 0.2), history=3, horizons=[1.5])


def _future_inputs() -> tuple[pd.DataFrame, pd.DataFrame]:
    forecast = pd.DataFrame(
        {"id": "a", "time": pd.date_range("2024-02-10", periods=5, freq="D"),
         "q0.1": 1.0, "q0.5": 2.0, "q0.9": 3.0}
    )  # fmt: skip
    days = pd.date_range("2024-01-01", periods=40, freq="D")
    history = pd.DataFrame({"id": "a", "time": days, "y": np.arange(40.0)})
    return forecast, history


def test_future_chart_names_the_quantile_columns_the_forecast_lacks(tmp_path):
    forecast, history = _future_inputs()
    with pytest.raises(ValueError, match=r"no columns \['q0.05', 'q0.95'\] for quantiles"):
        plots.plot_future(
            tmp_path / "f.png", forecast, history, id_col="id", time_col="time", target="y",
            quantiles=(0.05, 0.5, 0.95), tail=10,
        )  # fmt: skip


def test_future_chart_refuses_a_negative_tail(tmp_path):
    # pandas' tail(-3) keeps all rows but the first 3: nearly the whole history.
    forecast, history = _future_inputs()
    with pytest.raises(ValueError, match="tail must be an int >= 0"):
        plots.plot_future(
            tmp_path / "f.png", forecast, history, id_col="id", time_col="time", target="y",
            quantiles=(0.1, 0.5, 0.9), tail=-3,
        )  # fmt: skip


def test_fan_chart_names_the_columns_its_inputs_lack(tmp_path):
    times = pd.date_range("2024-01-01", periods=4, freq="h")
    forecasts = pd.DataFrame(
        {"id": "a", "time": times, "p10": 1.0, "p50": 2.0, "p90": 3.0, "actual": 2.0}
    )
    context = pd.DataFrame({"id": "a", "time": times, "actual": 2.0})
    with pytest.raises(ValueError, match=r"forecasts lacks the columns \['forecast_start'\]"):
        plots.plot_forecast_fans(
            tmp_path / "f.png", forecasts, context, id_col="id", time_col="time",
            lower="p10", median="p50", upper="p90",
        )  # fmt: skip


def _run_inputs(table: pd.DataFrame | None = None):
    """A prepared daily shop table (one shop by default), uniform predictions of its test split."""
    from tft_jax.data import prepare_dataset
    from tft_jax.evaluation import Predictions

    if table is None:
        times = pd.date_range("2024-01-01", periods=120, freq="D")
        table = pd.DataFrame({"shop": "a", "day": times, "sales": 10.0 + np.arange(120) % 7})
    dataset = prepare_dataset(
        table, id_col="shop", time_col="day", target="sales", freq="D", history=14, horizon=7
    )
    count = len(dataset.split("test"))
    prediction = Predictions(
        quantiles=np.broadcast_to(np.array([-1.0, 0.0, 1.0]), (count, 7, 3)).copy(),
        attention=np.full((7, 21), 1 / 21),
        static_weights=_uniform(dataset.static_weight_names),
        history_weights=_uniform(dataset.history_weight_names),
        future_weights=_uniform(dataset.future_weight_names),
    )
    return dataset, prediction


def test_run_plots_title_the_model_whose_attention_they_draw(tmp_path, monkeypatch):
    # Asked for fp32 (the default) among int8 predictions only, it drew int8's as "TFT fp32".
    dataset, prediction = _run_inputs()
    titles = []

    def record(path, attention, history, **kwargs):
        titles.append(kwargs["title"])
        return path

    monkeypatch.setattr(plots, "plot_attention", record)
    plots.draw_run_plots(dataset, "test", {"int8": prediction}, (0.1, 0.5, 0.9), None, tmp_path)
    assert titles == [f"{plots.MODEL_LABELS['int8']}: attention over the history (test mean)"]
    # The integer model of a 4-bit QAT run is named 'int8' (int8 arrays): titled by its width.
    plots.draw_run_plots(
        dataset, "test", {"int8": prediction}, (0.1, 0.5, 0.9), None, tmp_path, bits=4
    )
    assert titles[1] == "TFT int4 (codes in int8): attention over the history (test mean)"
    assert plots.model_label("fp32", 4) == "TFT fp32" and plots.model_label("int8") == "TFT int8"


def test_run_plots_of_no_predictions_is_an_error(tmp_path):
    dataset, _ = _run_inputs()
    with pytest.raises(ValueError, match="predictions is empty"):
        plots.draw_run_plots(dataset, "test", {}, (0.1, 0.5, 0.9), None, tmp_path)


def test_plots_draw_headless_without_pyplot_or_open_figures(tmp_path):
    # An interactive backend and no display: the Agg canvas alone writes the PNG.
    script = (
        "import sys, numpy as np; from tft_jax import plots; "
        f"plots.plot_attention({str(tmp_path / 'a.png')!r}, np.full((2, 5), 0.2), history=3); "
        "assert 'matplotlib.pyplot' not in sys.modules; print('drawn')"
    )
    environment = {**os.environ, "MPLBACKEND": "TkAgg", "DISPLAY": ""}
    result = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"


# ----------------------------------------------------------------- what the artists hold


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


def test_fan_chart_marks_actuals_between_gaps_which_the_line_cannot_draw(tmp_path, monkeypatch):
    # [..., 106.5, nan, 108.5, nan]: a line joins finite neighbours only, so 108.5
    # and a lone first value were in the figure's data yet invisible.
    times = pd.date_range("2024-01-01", periods=10, freq="h")
    values = [1.0, np.nan, 3.0, 4.0, np.nan, 6.0, np.nan, np.nan, 9.0, np.nan]
    context = pd.DataFrame({"id": "a", "time": times[:6], "actual": values[:6]})
    forecasts = pd.DataFrame(
        {"id": "a", "forecast_start": times[6], "time": times[6:], "p10": 0.0, "p50": 1.0,
         "p90": 2.0, "actual": values[6:]}
    )  # fmt: skip
    figures = _capture_figures(monkeypatch)
    _draw_fans(tmp_path, forecasts, context)
    (axis,) = figures[0].axes
    (marks,) = [line for line in axis.get_lines() if line.get_label() == "_actual between gaps"]
    assert marks.get_linestyle() == "None" and marks.get_marker() == "."
    np.testing.assert_array_equal(marks.get_ydata(orig=False), [1.0, 6.0, 9.0])
    np.testing.assert_array_equal(plots.isolated(np.array([np.nan, 2.0])), [False, True])
    np.testing.assert_array_equal(plots.isolated(np.array([2.0])), [True])
    np.testing.assert_array_equal(plots.isolated(np.array([], dtype=float)), [])


def test_fan_chart_marks_forecast_values_that_the_band_and_median_cannot_draw(
    tmp_path, monkeypatch
):
    # A median between NaNs has no neighbour to join, a band step between gaps no width
    # to fill, and a bound whose pair is NaN no band at all: they were invisible, while
    # the note said only the NaNs were not drawn.
    forecasts, context = _one_window(
        p10=[1.0, 1.5, math.nan, 1.0], p50=[2.0, math.nan, 2.5, math.nan],
        p90=[3.0, math.nan, 3.5, 3.0],
    )  # fmt: skip
    figures = _unsaved_figures(monkeypatch)
    _draw_fans(tmp_path, forecasts, context)
    _draw_fans(tmp_path, *_one_window())
    (axis,), (finite,) = (figure.axes for figure in figures)
    lines = {line.get_label(): line for line in axis.get_lines()}
    medians = lines["_median between gaps"]
    assert medians.get_linestyle() == "None" and medians.get_marker() == "o"
    np.testing.assert_array_equal(medians.get_ydata(orig=False), [2.0, 2.5])
    ticks = lines["_band bound without its pair"]
    assert ticks.get_linestyle() == "None"
    np.testing.assert_array_equal(ticks.get_ydata(orig=False), [1.5, 3.5])
    (bars,) = [item for item in axis.collections if item.get_label() == "_band between gaps"]
    x = mdates.date2num(forecasts["time"])
    segments = [segment.tolist() for segment in bars.get_segments()]
    assert segments == [[[x[0], 1.0], [x[0], 3.0]], [[x[3], 1.0], [x[3], 3.0]]]
    assert _notes(figures[0]) == [
        "non-finite forecast values, not drawn: p10 1, p50 2, p90 1 (of 4 steps)"
    ]
    # Finite forecasts are drawn by the band and the median alone.
    assert {line.get_label() for line in finite.get_lines()} == {"actual", "p50"}
    assert len(finite.collections) == 1


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


@pytest.mark.parametrize("path", [123, None, b"attention.png"])
def test_plot_refuses_a_path_that_is_not_a_str_or_path_naming_its_type(path):
    # Before: pathlib's own "argument should be a str or an os.PathLike object ..., not 'int'".
    with pytest.raises(
        TypeError, match=r"path must be a str or os.PathLike .*, got (int|NoneType|bytes)"
    ):
        plots.plot_attention(path, np.full((2, 5), 0.2), history=3)


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


# ----------------------------------------------------------------- non-finite values, bad arguments


def _one_window(**columns) -> tuple[pd.DataFrame, pd.DataFrame]:
    times = pd.date_range("2024-01-01", periods=9, freq="D")
    forecasts = pd.DataFrame(
        {"id": "a", "forecast_start": times[5], "time": times[5:], "p10": 1.0, "p50": 2.0,
         "p90": 3.0, "actual": math.nan, **columns}
    )  # fmt: skip
    context = pd.DataFrame({"id": "a", "time": times[:5], "actual": 2.0})
    return forecasts, context


def _uniform(names) -> np.ndarray:
    """Equal selection weights over `names`, summing to 1 as the model's do."""
    return np.full(len(names), 1 / max(1, len(names)))


def _notes(figure) -> list[str]:
    """The texts of every panel: the notes of what was not drawn."""
    return [text.get_text() for axis in figure.axes for text in axis.texts]


def _draw_fans(tmp_path, forecasts, context):
    return plots.plot_forecast_fans(
        tmp_path / "f.png", forecasts, context, id_col="id", time_col="time",
        lower="p10", median="p50", upper="p90",
    )  # fmt: skip


def test_fan_chart_refuses_a_text_quantile_column_naming_it_and_its_first_non_number(tmp_path):
    # Texts were drawn on a category axis, one tick per distinct text.
    forecasts, context = _one_window(p50=["12.5", "13", "high", "14"])
    with pytest.raises(TypeError, match=r"forecasts column 'p50' must hold numbers") as caught:
        _draw_fans(tmp_path, forecasts, context)
    assert "got 'high' (str) at position 2 (1 such cells)" in str(caught.value)
    assert not any(tmp_path.iterdir())


def test_fan_chart_reads_number_texts_and_missing_value_texts_as_the_data_layer_does(
    tmp_path, monkeypatch
):
    # A forecast CSV read back with a placeholder: 'n/a' is a missing value, as in a table.
    forecasts, context = _one_window(p50=["12.5", "13", " N/A ", "14"])
    figures = _capture_figures(monkeypatch)
    _draw_fans(tmp_path, forecasts, context)
    (axis,) = figures[0].axes
    (median,) = [line for line in axis.get_lines() if line.get_label() == "p50"]
    np.testing.assert_array_equal(median.get_ydata(orig=False), [12.5, 13.0, math.nan, 14.0])


@pytest.mark.parametrize(
    ("table", "column", "values", "match"),
    [
        ("forecasts", "p90", [True, False, True, True], "got booleans"),
        ("forecasts", "actual", ["x", 1.0, 2.0, 3.0], r"got 'x' \(str\) at position 0"),
        ("context", "actual", [1.0, "-", "low", 2.0, 3.0], r"got 'low' \(str\) at position 2"),
    ],
)
def test_fan_chart_refuses_columns_that_are_not_numbers_by_name(
    tmp_path, table, column, values, match
):
    forecasts, context = _one_window()
    tables = {"forecasts": forecasts, "context": context}
    tables[table] = tables[table].assign(**{column: values})
    with pytest.raises(TypeError, match=rf"{table} column '{column}' must hold numbers.*{match}"):
        _draw_fans(tmp_path, tables["forecasts"], tables["context"])


def test_fan_chart_draws_an_object_column_of_numbers_as_those_numbers(tmp_path, monkeypatch):
    forecasts, context = _one_window(p50=pd.Series([2.0, 2.5, None, 3], dtype=object))
    figures = _capture_figures(monkeypatch)
    _draw_fans(tmp_path, forecasts, context)
    (axis,) = figures[0].axes
    (median,) = [line for line in axis.get_lines() if line.get_label() == "p50"]
    np.testing.assert_array_equal(median.get_ydata(orig=False), [2.0, 2.5, math.nan, 3.0])
    assert _notes(figures[0]) == ["non-finite forecast values, not drawn: p50 1 (of 4 steps)"]


def test_fan_chart_counts_non_finite_forecast_values_in_a_note(tmp_path, monkeypatch):
    # A NaN band edge or an inf median left a gap and no word about it.
    forecasts, context = _one_window(
        p10=[1.0, 1.0, math.nan, math.nan], p50=[2.0, math.inf, 2.0, 2.0]
    )
    figures = _capture_figures(monkeypatch)
    _draw_fans(tmp_path, forecasts, context)
    assert _notes(figures[0]) == [
        "non-finite forecast values, not drawn: p10 2, p50 1 (of 4 steps)"
    ]


def test_fan_chart_without_any_finite_forecast_says_nothing_was_drawn(tmp_path, monkeypatch):
    forecasts, context = _one_window(p10=math.nan, p50=math.nan, p90=-math.inf)
    figures = _capture_figures(monkeypatch)
    _draw_fans(tmp_path, forecasts, context)
    (axis,) = figures[0].axes
    assert _notes(figures[0]) == ["no finite forecast value (4 steps): nothing drawn"]
    (actual,) = [line for line in axis.get_lines() if line.get_label() == "actual"]
    assert np.isfinite(actual.get_ydata(orig=False)).sum() == 5  # the history is still drawn


def test_fan_chart_of_finite_forecasts_has_no_note(tmp_path, monkeypatch):
    forecasts, context = _one_window()
    figures = _capture_figures(monkeypatch)
    _draw_fans(tmp_path, forecasts, context)
    assert _notes(figures[0]) == []


def test_attention_plot_counts_non_finite_history_weights_in_a_note(tmp_path, monkeypatch):
    attention = np.full((2, 5), 0.2)  # T=3, H=2
    attention[1, 0] = math.inf
    attention[0, 4] = math.nan  # a horizon column, not drawn: not counted
    figures = _capture_figures(monkeypatch)
    plots.plot_attention(tmp_path / "a.png", attention, history=3)
    plots.plot_attention(tmp_path / "b.png", np.full((2, 5), 0.2), history=3)
    assert _notes(figures[0]) == ["1 of 6 weights over the history non-finite, not drawn"]
    assert _notes(figures[1]) == []


def test_attention_plot_of_all_nan_weights_says_nothing_was_drawn(tmp_path, monkeypatch):
    # A diverged model's attention was written as an empty figure without a word.
    figures = _capture_figures(monkeypatch)
    path = plots.plot_attention(tmp_path / "a.png", np.full((3, 13), math.nan), history=10)
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert _notes(figures[0]) == ["all 30 weights over the history non-finite: nothing to draw"]


def test_attention_plot_refuses_repeated_horizons(tmp_path):
    # [1, 1] drew two identical curves, both labelled "horizon 1".
    with pytest.raises(ValueError, match=r"horizons must not repeat a step .* got \[1\] twice"):
        plots.plot_attention(tmp_path / "a.png", np.full((2, 5), 0.2), history=3, horizons=[1, 1])


def test_attention_plot_refuses_weights_that_are_not_numbers(tmp_path):
    with pytest.raises(TypeError, match=r"attention must be an \(H, T\+H\) array of numbers"):
        plots.plot_attention(tmp_path / "a.png", [["a", "b"]], history=1)


def test_loss_curves_count_non_finite_losses_in_their_labels_but_not_missing_ones(
    tmp_path, monkeypatch
):
    phases = {
        "fp32": {"step": [1, 2, 3], "train_loss": [0.5, math.nan, math.inf],
                 "val_loss": [None, 0.4, None]},
    }  # fmt: skip
    figures = _capture_figures(monkeypatch)
    plots.plot_loss_curves(tmp_path / "loss.png", phases)
    labels = [line.get_label() for line in figures[0].axes[0].get_lines()]
    assert labels[:2] == ["fp32 train (2 of 3 non-finite)", "fp32 validation"]
    assert _notes(figures[0]) == []


def test_loss_curves_of_only_nan_losses_say_nothing_was_drawn(tmp_path, monkeypatch):
    # A diverged run's history was written as an empty figure without a word.
    phases = {"fp32": {"step": [1, 2], "train_loss": [math.nan] * 2, "val_loss": [math.nan] * 2}}
    figures = _capture_figures(monkeypatch)
    plots.plot_loss_curves(tmp_path / "loss.png", phases)
    labels = [line.get_label() for line in figures[0].axes[0].get_lines()]
    assert labels[:2] == ["fp32 train (2 of 2 non-finite)", "fp32 validation (2 of 2 non-finite)"]
    assert _notes(figures[0]) == ["no finite loss value: nothing to draw"]


def test_loss_curves_name_a_list_that_holds_text(tmp_path):
    phases = {"qat": {"step": [1, 2], "train_loss": [0.5, "0.4"], "val_loss": [None, None]}}
    with pytest.raises(TypeError, match=r"phase 'qat' train_loss must hold numbers or None, got "
                                        r"'0.4' \(str\) at position 1"):  # fmt: skip
        plots.plot_loss_curves(tmp_path / "loss.png", phases)


_DROP = object()


def _clipping_run(**changes):
    """A run of `clipping_experiment`'s result; a key changed to `_DROP` is left out."""
    run = {"clip": True, "step_loss": [0.5, 0.4], "step_grad_norm": [2.0, 1.0],
           "final_val_loss": 0.4, "diverged": False, **changes}  # fmt: skip
    return {key: value for key, value in run.items() if value is not _DROP}


@pytest.mark.parametrize(
    ("result", "match"),
    [
        ({}, r"result must be the dict of tft_jax\.experiments\.clipping_experiment.*keys \[\]"),
        ([_clipping_run()], r"result must be the dict .* got list"),
        (
            {"runs": [_clipping_run(), _clipping_run(diverged=_DROP)]},
            r"run 1 of result\['runs'\] lacks the keys \['diverged'\]",
        ),
    ],
)  # fmt: skip
def test_clipping_plot_names_what_its_result_lacks(tmp_path, result, match):
    with pytest.raises(ValueError, match=match):
        plots.plot_clipping_experiment(tmp_path / "c.png", result)


def test_clipping_plot_reads_back_the_non_finite_strings_of_clipping_json(tmp_path, monkeypatch):
    # The CLI writes NaN, inf and -inf as "nan", "inf" and "-inf" (null would not tell
    # them apart), and the plot refused its own file: "values must hold numbers or None,
    # got 'nan' (str)".
    result = {
        "settings": {"learning_rate": 1.0, "clip_norm": 0.5},
        "runs": [
            _clipping_run(step_loss=[0.5, 0.4, 0.3], step_grad_norm=[2.0, 1.0, 0.5]),
            _clipping_run(clip=False, step_loss=[0.5, math.inf, math.nan],
                          step_grad_norm=[2.0, -math.inf, math.nan], final_val_loss=math.nan,
                          diverged=True),
        ],
    }  # fmt: skip
    saved = json.loads(json.dumps(cli_experiments._non_finite_as_strings(result)))
    assert saved["runs"][1]["step_loss"] == [0.5, "inf", "nan"]  # the case under test
    assert saved["runs"][1]["final_val_loss"] == "nan"
    figures = _capture_figures(monkeypatch)
    plots.plot_clipping_experiment(tmp_path / "floats.png", result)
    assert_png(plots.plot_clipping_experiment(tmp_path / "read_back.png", saved))
    floats, read_back = figures
    for expected, got in zip(floats.axes, read_back.axes, strict=True):
        for line, drawn in zip(expected.get_lines(), got.get_lines(), strict=True):
            np.testing.assert_array_equal(drawn.get_ydata(), line.get_ydata())
        assert got.get_yscale() == expected.get_yscale()
    finals = read_back.axes[2]
    offsets = [collection.get_offsets()[:, 1] for collection in finals.collections]
    np.testing.assert_array_equal(offsets[0], [math.nan])  # the unclipped arm's "nan"
    assert [text.get_text() for text in finals.texts] == ["1 non-finite"]


@pytest.mark.parametrize("text", ["NaN", "1.5", "", "infinity"])
def test_clipping_plot_refuses_other_strings_naming_the_run(tmp_path, text):
    result = {"runs": [_clipping_run(), _clipping_run(step_grad_norm=[2.0, text])]}
    with pytest.raises(
        TypeError, match=rf"run 1 step_grad_norm must hold numbers or None or one of "
        rf"\['nan', 'inf', '-inf'\], got {re.escape(repr(text))} \(str\) at position 1",
    ):  # fmt: skip
        plots.plot_clipping_experiment(tmp_path / "c.png", result)


def test_loss_curves_still_refuse_the_strings_of_clipping_json(tmp_path):
    # Only the clipping experiment's JSON writes them; a training history never does.
    phases = {"fp32": {"step": [1, 2], "train_loss": [0.5, "nan"], "val_loss": [None, None]}}
    with pytest.raises(TypeError, match=r"train_loss must hold numbers or None, got 'nan'"):
        plots.plot_loss_curves(tmp_path / "loss.png", phases)


def test_variable_importance_refuses_names_given_as_one_string(tmp_path):
    # "ab" was read as the two names 'a' and 'b'.
    with pytest.raises(TypeError, match=r"group 'g': names must be a sequence .* string 'ab'"):
        plots.plot_variable_importance(tmp_path / "vi.png", [("g", "ab", [0.3, 0.7])])


def test_variable_importance_refuses_a_negative_weight_naming_the_variable(tmp_path):
    # It was drawn left of an x-axis that starts at 0: off the figure, without a word.
    with pytest.raises(
        ValueError, match=r"group 'g': selection weights must be >= 0 .* 'b' \(-0\.5\)"
    ):
        plots.plot_variable_importance(tmp_path / "vi.png", [("g", ["a", "b"], [0.3, -0.5])])


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"quantiles": ()}, ValueError, "quantiles is empty"),
        ({"quantiles": "0.1"}, TypeError, "quantiles must be a sequence of levels"),
        ({"quantiles": (0.1, "0.9")}, TypeError, r"must be numbers in \(0, 1\), got '0.9'"),
        ({"quantiles": (0.1, 1.5)}, ValueError, r"quantiles must lie in \(0, 1\), got 1\.5"),
        ({"target": "revenue"}, ValueError, r"target='revenue' is not a column of the history"),
        ({"id_col": "shop"}, ValueError, r"id_col='shop' is not a column of the forecast"),
        ({"time_col": "day"}, ValueError, r"time_col='day' is not a column of the forecast"),
        ({"series": "a"}, TypeError, r"series ids, got 'a' \(for one series pass \['a'\]\)"),
        ({"series": []}, ValueError, "series is empty"),
        ({"series": ["a", "a"]}, ValueError, r"series must not repeat an id .* got \['a'\]"),
    ],
)  # fmt: skip
def test_future_chart_names_the_argument_it_refuses(tmp_path, changes, error, match):
    forecast, history = _future_inputs()
    options = dict(id_col="id", time_col="time", target="y", quantiles=(0.1, 0.5, 0.9), tail=10)
    with pytest.raises(error, match=match):
        plots.plot_future(tmp_path / "f.png", forecast, history, **{**options, **changes})


def test_future_chart_names_a_history_target_that_holds_text(tmp_path):
    forecast, history = _future_inputs()
    history["y"] = history["y"].astype(str).where(history.index != 3, "lots")
    with pytest.raises(
        TypeError, match=r"history column 'y' must hold numbers, got 'lots' \(str\) at position 3"
    ):
        plots.plot_future(
            tmp_path / "f.png", forecast, history, id_col="id", time_col="time", target="y",
            quantiles=(0.1, 0.5, 0.9), tail=10,
        )  # fmt: skip
    # 'n/a' is a missing target, as `tft-jax plot --csv` reads the table (it crashed here).
    history["y"] = history["y"].where(history.index != 3, "n/a")
    assert plots.plot_future(
        tmp_path / "f.png", forecast, history, id_col="id", time_col="time", target="y",
        quantiles=(0.1, 0.5, 0.9), tail=10,
    ).is_file()  # fmt: skip


# ----------------------------------------------------------------- usage audit: gaps, zones, series


def _actual_line(axis):
    (line,) = [line for line in axis.get_lines() if line.get_label() in ("actual", "_actual")]
    return line


def _line_series(line) -> pd.Series:
    """The drawn `(x, y)` of a line as a Series indexed by the times (UTC where aware)."""
    return pd.Series(
        np.asarray(line.get_ydata(orig=False), dtype=float),
        index=pd.DatetimeIndex(mdates.num2date(line.get_xdata(orig=False))).tz_localize(None),
    )


def _gappy_dataset():
    """One daily series whose test period misses two targets: the windows over them left out."""
    import warnings

    from tft_jax.data import prepare_dataset

    times = pd.date_range("2024-01-01", periods=400, freq="D")
    table = pd.DataFrame({"shop": "a", "day": times, "sales": 10.0 + np.arange(400.0)})
    options = dict(id_col="shop", time_col="day", target="sales", freq="D", history=14, horizon=7)
    first = prepare_dataset(table, **options).split("test").forecast_start[0]
    missing = [first + pd.Timedelta(days=9), first + pd.Timedelta(days=10)]
    table.loc[table["day"].isin(missing), "sales"] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the filled targets are announced
        dataset = prepare_dataset(table, **options)
    return dataset, table, missing


def test_run_fan_charts_draw_the_tables_actuals_between_windows_left_out(tmp_path, monkeypatch):
    # The windows whose horizon held a missing target are left out: the actual line ran
    # straight from one drawn window to the next, hiding the observations between and
    # drawing the missing steps as if they had values.
    dataset, table, missing = _gappy_dataset()
    count = len(dataset.split("test"))
    prediction = _run_inputs()[1]
    prediction = type(prediction)(
        quantiles=np.broadcast_to(np.array([-1.0, 0.0, 1.0]), (count, 7, 3)).copy(),
        attention=prediction.attention,
        static_weights=prediction.static_weights,
        history_weights=prediction.history_weights,
        future_weights=prediction.future_weights,
    )
    figures = _capture_figures(monkeypatch)
    plots.draw_run_plots(dataset, "test", {"fp32": prediction}, (0.1, 0.5, 0.9), None, tmp_path)
    (axis,) = figures[0].axes
    drawn = _line_series(_actual_line(axis))
    medians = [line for line in axis.get_lines() if line.get_color() == plots._MEDIAN]
    starts = sorted(_line_series(line).index[0] for line in medians)
    assert max(np.diff(starts)) > pd.Timedelta(days=7)  # a window was left out between
    finite = drawn.dropna()
    days = pd.date_range(finite.index[0], finite.index[-1], freq="D")
    # Every day of the span drawn, each with the table's value: NaN where it is missing.
    assert set(days) <= set(drawn.index)
    expected = table.set_index("day")["sales"].reindex(days)
    np.testing.assert_array_equal(drawn[~drawn.index.duplicated()].reindex(days), expected)
    assert drawn.reindex(missing).isna().all()
    assert np.isfinite(expected).sum() > len(medians) * 7  # observations between windows too


def test_fan_chart_breaks_the_actual_line_across_steps_the_tables_lack(tmp_path, monkeypatch):
    # Hours 8 and 9 are in neither table: the line joined 7 to 10 as if they held values.
    times = pd.date_range("2024-01-01", periods=14, freq="h", tz="Europe/Paris")
    context = pd.DataFrame({"id": "a", "time": times[:4], "actual": np.arange(4.0)})
    forecasts = pd.concat(
        [pd.DataFrame({"id": "a", "forecast_start": times[start], "time": times[start:start + 4],
                       "p10": 0.0, "p50": 1.0, "p90": 2.0,
                       "actual": np.arange(start, start + 4.0)})
         for start in (4, 10)]
    )  # fmt: skip
    figures = _capture_figures(monkeypatch)
    _draw_fans(tmp_path, forecasts, context)
    values = _actual_line(figures[0].axes[0]).get_ydata(orig=False)
    np.testing.assert_array_equal(values, [*np.arange(8.0), np.nan, *np.arange(10.0, 14.0)])


@pytest.mark.parametrize("freq", [None, "MS"])
def test_fan_chart_breaks_a_monthly_line_only_where_a_month_is_missing(tmp_path, monkeypatch, freq):
    # Months of 28 to 31 days are one step each; March 2024 is absent.
    months = pd.date_range("2023-10-01", periods=9, freq="MS")
    kept = months.delete(5)
    context = pd.DataFrame({"id": "a", "time": kept[:6], "actual": np.arange(6.0)})
    forecasts = pd.DataFrame(
        {"id": "a", "forecast_start": kept[6], "time": kept[6:], "p10": 0.0, "p50": 1.0,
         "p90": 2.0, "actual": [6.0, 7.0]}
    )  # fmt: skip
    figures = _capture_figures(monkeypatch)
    plots.plot_forecast_fans(
        tmp_path / "f.png", forecasts, context, id_col="id", time_col="time",
        lower="p10", median="p50", upper="p90", **({} if freq is None else {"freq": freq}),
    )  # fmt: skip
    values = _actual_line(figures[0].axes[0]).get_ydata(orig=False)
    np.testing.assert_array_equal(values, [0.0, 1, 2, 3, 4, np.nan, 5, 6, 7])


def test_fan_chart_refuses_an_unknown_frequency(tmp_path):
    forecasts, context = _one_window()
    with pytest.raises(ValueError, match="unknown frequency"):
        plots.plot_forecast_fans(
            tmp_path / "f.png", forecasts, context, id_col="id", time_col="time",
            lower="p10", median="p50", upper="p90", freq="fortnightly",
        )  # fmt: skip


@pytest.mark.parametrize("history_rows", ["absent", "empty"])
def test_future_chart_of_text_times_draws_a_series_without_history(
    tmp_path, monkeypatch, history_rows
):
    # Texts parsed from no rows are naive: converting them to the forecast's zone failed
    # with pandas' "Cannot convert tz-naive timestamps".
    local = pd.date_range("2024-03-30", periods=12, freq="h", tz="Europe/Paris")
    history = pd.DataFrame({"id": "b", "time": [t.isoformat() for t in local], "y": 1.0})
    if history_rows == "empty":
        history = history.iloc[:0]
    forecast = _future_forecast(pd.date_range(local[-1] + pd.Timedelta("1h"), periods=3, freq="h"))
    figures = _capture_figures(monkeypatch)
    plots.plot_future(
        tmp_path / "f.png", forecast, history, id_col="id", time_col="time", target="y",
        quantiles=(0.1, 0.5, 0.9), tail=5, timezone="Europe/Paris",
    )  # fmt: skip
    (axis,) = figures[0].axes
    assert _notes(figures[0]) == ["no finite actual value: none drawn"]
    assert "actual" not in axis.get_legend_handles_labels()[1]


def test_fan_chart_of_only_missing_actuals_says_so_and_leaves_actual_out_of_the_legend(
    tmp_path, monkeypatch
):
    # The legend listed 'actual' over a panel with no actual line and no word why.
    forecasts, context = _one_window()
    context["actual"] = math.nan
    other = _one_window()
    both = pd.concat([forecasts, other[0].assign(id="b")])
    figures = _capture_figures(monkeypatch)
    _draw_fans(tmp_path, forecasts, context)
    _draw_fans(tmp_path, both, pd.concat([context, other[1].assign(id="b")]))
    alone, first_of_two = figures
    assert _notes(alone) == ["no finite actual value: none drawn"]
    assert [t.get_text() for t in alone.axes[0].get_legend().get_texts()] == ["p10-p90", "p50"]
    # The legend is the first panel's, with the actual drawn in the second.
    legend = first_of_two.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["p10-p90", "p50", "actual"]


def test_future_chart_labels_its_band_and_median_as_the_run_fan_charts_do(tmp_path, monkeypatch):
    forecast, history = _future_inputs()
    figures = _capture_figures(monkeypatch)
    plots.plot_future(
        tmp_path / "f.png", forecast, history, id_col="id", time_col="time", target="y",
        quantiles=(0.1, 0.5, 0.9), tail=5,
    )  # fmt: skip
    labels = [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]
    assert labels == ["actual", "p10-p90", "p50"]


def test_future_chart_legend_does_not_cover_the_forecast(monkeypatch):
    # Fixed at the upper right, the legend sat on the forecast, which ends every panel.
    days = pd.date_range("2024-01-01", periods=6, freq="D")
    history = pd.DataFrame({"id": "a", "time": days, "y": 1.0})
    forecast = _future_forecast(days[-1] + pd.to_timedelta([1, 2], unit="D"))
    figures = _unsaved_figures(monkeypatch)
    plots.plot_future(
        "f.png", forecast, history, id_col="id", time_col="time", target="y",
        quantiles=(0.1, 0.5, 0.9), tail=6,
    )  # fmt: skip
    (axis,) = figures[0].axes
    FigureCanvasAgg(figures[0]).draw()
    legend = axis.get_legend().get_window_extent()
    (band,) = axis.collections
    assert not legend.overlaps(band.get_window_extent())


def test_time_axes_name_the_time_columns_zone(tmp_path, monkeypatch):
    figures = _capture_figures(monkeypatch)
    forecasts, context = fan_inputs()
    _draw_fans(tmp_path, forecasts.rename(columns={"sensor": "id"}),
               context.rename(columns={"sensor": "id"}))  # fmt: skip
    local = pd.date_range("2024-03-30", periods=24, freq="h", tz="Europe/Paris")
    history = pd.DataFrame({"id": "a", "time": local, "y": 1.0})
    forecast = _future_forecast(pd.date_range(local[-1] + pd.Timedelta("1h"), periods=3, freq="h"))
    plots.plot_future(
        tmp_path / "g.png", forecast, history, id_col="id", time_col="time", target="y",
        quantiles=(0.1, 0.5, 0.9), tail=5,
    )  # fmt: skip
    naive, aware = figures
    assert {axis.get_xlabel() for axis in naive.axes} == {"time"}
    assert aware.axes[0].get_xlabel() == "time (Europe/Paris)"
    aware.canvas.draw()
    assert str(aware.axes[0].xaxis.get_major_formatter()._tz) == "Europe/Paris"


def _many_series_dataset(count: int):
    """`_run_inputs`' run for `count` shops with the integer ids 100, 101, ..."""
    times = pd.date_range("2024-01-01", periods=120, freq="D")
    table = pd.DataFrame(
        [(100 + s, t, 10.0 + s + i % 7) for s in range(count) for i, t in enumerate(times)],
        columns=["shop", "day", "sales"],
    )
    return _run_inputs(table)


def test_run_fan_charts_announce_the_series_they_leave_out_and_draw_those_named(
    tmp_path, monkeypatch
):
    # The fan charts showed the first 6 series without a word; --series chose the future
    # chart's only.
    dataset, prediction = _many_series_dataset(plots.MAX_FAN_SERIES + 2)
    drawn = []

    def record(path, forecasts, context, **kwargs):
        drawn.append((forecasts, kwargs["title"]))
        return path

    monkeypatch.setattr(plots, "plot_forecast_fans", record)
    told: list[str] = []
    args = (dataset, "test", {"fp32": prediction}, (0.1, 0.5, 0.9), None, tmp_path)
    plots.draw_run_plots(*args, announce=told.append)
    plots.draw_run_plots(*args, series=[107, 101], announce=told.append)
    (default, title), (named, named_title) = drawn
    cut = f"the first {plots.MAX_FAN_SERIES} of {plots.MAX_FAN_SERIES + 2} series"
    assert told == [f"test fan charts: {cut}"]
    assert cut in title and "first" not in named_title
    assert list(pd.unique(default["shop"])) == list(range(100, 100 + plots.MAX_FAN_SERIES))
    assert list(pd.unique(named["shop"])) == [107, 101]
    assert (
        named.groupby("shop")["forecast_start"].nunique().tolist()
        == [default.groupby("shop")["forecast_start"].nunique()[101]] * 2
    )


@pytest.mark.parametrize(
    ("series", "error", "match"),
    [
        (["104"], ValueError, r"series \['104'\] are not in the dataset; it has 100, 101, 102"
                              r".* \(its ids are not texts: pass 104, not '104'\)"),
        ([999], ValueError, r"series \[999\] are not in the dataset; it has 100, 101, 102, "
                            r"103, 104, 105, 106, 107$"),
        (104, TypeError, "series must be a list of series ids"),
        ([101, 101], ValueError, r"must not repeat an id .* got \[101\]"),
    ],
)  # fmt: skip
def test_run_fan_charts_refuse_series_the_dataset_lacks_naming_its_ids(
    tmp_path, series, error, match
):
    dataset, prediction = _many_series_dataset(8)
    with pytest.raises(error, match=match):
        plots.draw_run_plots(
            dataset, "test", {"fp32": prediction}, (0.1, 0.5, 0.9), None, tmp_path, series=series
        )


def test_future_chart_names_unknown_series_by_their_plain_ids_with_a_hint_for_texts(tmp_path):
    # The ids were listed as np.int64(101), and '104' for id 104 got no hint.
    forecast, history = _future_inputs()
    forecast["id"], history["id"] = np.int64(104), np.int64(104)
    options = dict(id_col="id", time_col="time", target="y", quantiles=(0.1, 0.5, 0.9), tail=5)
    with pytest.raises(ValueError) as caught:
        plots.plot_future(tmp_path / "f.png", forecast, history, series=["104"], **options)
    assert str(caught.value) == (
        "series ['104'] are not in the forecast; it has 104 "
        "(its ids are not texts: pass 104, not '104')"
    )


def test_plot_refuses_a_directory_path_or_a_parent_that_is_a_file_by_name(tmp_path):
    # An existing folder failed with IsADirectoryError naming a temporary file; a parent
    # that is a file with a bare FileExistsError.
    (tmp_path / "folder").mkdir()
    (tmp_path / "table.csv").write_text("a\n1\n")
    with pytest.raises(ValueError, match=r"path '.*folder' is a directory"):
        plots.plot_attention(tmp_path / "folder", np.full((2, 5), 0.2), history=3)
    for path in (tmp_path / "table.csv" / "a.png", tmp_path / "table.csv" / "x" / "a.png"):
        with pytest.raises(ValueError, match=r"its parent '.*table\.csv' is not a folder"):
            plots.plot_attention(path, np.full((2, 5), 0.2), history=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "table.csv"]


def test_run_fan_charts_name_series_without_windows_and_still_draw_the_rest(tmp_path, monkeypatch):
    import warnings

    from tft_jax.data import prepare_dataset

    times = pd.date_range("2024-01-01", periods=120, freq="D")
    table = pd.concat(
        [pd.DataFrame({"shop": "a", "day": times, "sales": 10.0 + np.arange(120) % 7}),
         pd.DataFrame({"shop": "b", "day": times[:60], "sales": 5.0})]
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dataset = prepare_dataset(
            table, id_col="shop", time_col="day", target="sales", freq="D", history=14, horizon=7
        )
    prediction = _run_inputs()[1]
    figures = _capture_figures(monkeypatch)
    told: list[str] = []
    args = (dataset, "test", {"fp32": prediction}, (0.1, 0.5, 0.9), None, tmp_path)
    written = plots.draw_run_plots(*args, series=["b"], announce=told.append)
    assert told == ["test fan charts: series ['b'] have no test windows, not drawn"]
    assert [path.name for path in written] == ["attention.png", "variable_importance.png"]
    with pytest.warns(UserWarning, match=r"series \['b'\] have no test windows"):
        plots.draw_run_plots(*args, series=["b", "a"])
    assert [axis.get_title(loc="left") for axis in figures[-3].axes] == ["a"]


def test_attention_plot_says_what_share_falls_on_the_decoder_positions(tmp_path, monkeypatch):
    # The history curves of (2, 5) rows of 0.2 sum to 0.6: the other 0.4 was not mentioned.
    figures = _capture_figures(monkeypatch)
    attention = np.array([[0.3, 0.3, 0.3, 0.1, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])  # T=3, H=2
    plots.plot_attention(tmp_path / "a.png", attention, history=3)
    plots.plot_attention(tmp_path / "b.png", np.full((3, 13), math.nan), history=10)
    title = figures[0].axes[0].get_legend().get_title().get_text()
    assert title == "25.0% of the weight on forecast steps 0..1 (not drawn)"  # (0.1 + 0.4) / 2
    nan_title = figures[1].axes[0].get_legend().get_title().get_text()
    assert nan_title == "weight on forecast steps 0..2: non-finite (not drawn)"


@pytest.mark.parametrize("weights", [np.full((2, 1, 2), 0.5), [[0.5, 0.5], [0.5, 0.5]]])
def test_variable_importance_refuses_weights_that_are_not_one_per_variable(tmp_path, weights):
    # A raw (B, T, V) array was flattened into one bar per entry.
    shape = np.shape(weights)
    with pytest.raises(
        ValueError, match=rf"group 'g': weights must be one per .*got shape {re.escape(str(shape))}"
    ):
        names = ["a", "b"]
        plots.plot_variable_importance(tmp_path / "vi.png", [("g", names, weights)])


@pytest.mark.parametrize("weights", [[0.3, 0.3], [60.0, 40.0], [[0.6], [0.4]], [[0.2, 0.8]]])
def test_variable_importance_draws_a_top_k_percentages_and_a_column(tmp_path, weights):
    # A top-k of interpretation()'s table, percentages, or df[["weight"]].to_numpy().
    path = plots.plot_variable_importance(tmp_path / "vi.png", [("g", ["a", "b"], weights)])
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_a_daily_line_starting_on_a_midnight_a_clock_change_moved_has_no_false_breaks():
    # America/Santiago skipped 2024-09-08 00:00: that day starts at 01:00. A grid anchored
    # there put every later day at 01:00, so each midnight-to-midnight step read as a gap.
    days = time_grid(pd.Timestamp("2024-09-01", tz="America/Santiago"), periods=20, freq="D")
    for start in (0, 7):
        times = pd.Series(days[start:])
        line = pd.DataFrame({"time": times, "actual": np.arange(len(times), dtype=float)})
        assert not plots._with_breaks(line, "time", "D")["actual"].isna().any(), times.iloc[0]
    gapped = pd.Series(days[7:].delete(3))
    line = pd.DataFrame({"time": gapped, "actual": np.arange(len(gapped), dtype=float)})
    assert int(plots._with_breaks(line, "time", "D")["actual"].isna().sum()) == 1


def test_a_line_without_freq_is_broken_at_its_gap_without_a_pandas_warning():
    # pd.infer_freq's string result is deprecated in pandas 3: a warning at every chart.
    days = pd.Series(pd.date_range("2024-01-01", periods=12, freq="D").delete(5))
    line = pd.DataFrame({"time": days, "actual": np.arange(len(days), dtype=float)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        broken = plots._with_breaks(line, "time", None)
    assert int(broken["actual"].isna().sum()) == 1


def test_fan_chart_date_labels_do_not_overlap_across_a_month_end(tmp_path, monkeypatch):
    # Matplotlib's default full dates ran into each other ('2024-05-312024-06-01').
    times = pd.date_range("2024-05-18", periods=19, freq="D")
    context = pd.DataFrame({"id": "a", "time": times[:14], "actual": np.arange(14.0)})
    forecasts = pd.DataFrame(
        {"id": "a", "forecast_start": times[14], "time": times[14:], "p10": 13.0, "p50": 14.0,
         "p90": 15.0, "actual": np.nan}
    )  # fmt: skip
    figures = _capture_figures(monkeypatch)
    _draw_fans(tmp_path, forecasts, context)
    figure = figures[0]
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    (axis,) = figure.axes
    labels = [label for label in axis.get_xticklabels() if label.get_text()]
    assert len(labels) >= 3
    boxes = sorted((label.get_window_extent(renderer) for label in labels), key=lambda b: b.x0)
    for left, right in itertools.pairwise(boxes):
        assert left.x1 <= right.x0, [label.get_text() for label in labels]
