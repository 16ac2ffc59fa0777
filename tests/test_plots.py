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
        static_weights=np.full(len(dataset.static_weight_names), 1.0),
        history_weights=np.full(len(dataset.history_weight_names), 1.0),
        future_weights=np.full(len(dataset.future_weight_names), 1.0),
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
