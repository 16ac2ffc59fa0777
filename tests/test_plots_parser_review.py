"""Review pass of the plots and the CLI parser: what a chart shows matches its labels,
inconsistent inputs are refused by name, and the parser's choices come from the library."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tft_jax import plots
from tft_jax.cli_parser import build_parser
from tft_jax.data.dataset import SPLITS
from tft_jax.forecaster.predictors import MODEL_NAMES


def _capture_figures(monkeypatch) -> list:
    """Records each figure `plots` saves (and still writes it)."""
    figures = []
    save = plots._save

    def record(figure, path):
        figures.append(figure)
        return save(figure, path)

    monkeypatch.setattr(plots, "_save", record)
    return figures


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


def _run_inputs():
    from tft_jax.data import prepare_dataset
    from tft_jax.evaluation import Predictions

    times = pd.date_range("2024-01-01", periods=120, freq="D")
    table = pd.DataFrame({"shop": "a", "day": times, "sales": 10.0 + np.arange(120) % 7})
    dataset = prepare_dataset(
        table, id_col="shop", time_col="day", target="sales", freq="D", history=14, horizon=7
    )
    count = len(dataset.split("test"))
    prediction = Predictions(
        quantiles=np.broadcast_to(np.array([-1.0, 0.0, 1.0]), (count, 7, 3)).copy(),
        attention=np.full((7, 21), 1 / 21),
        static_weights=np.full(len(dataset.static_weight_names), 1.0),
        history_weights=np.full(len(dataset.history_weight_names), 1.0),
        future_weights=np.full(len(dataset.future_weight_names), 1.0),
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


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "--run", "r", "--csv", "c.csv", "--out", "o.csv", "--encoding", "bogus"],
        ["train", "--csv", "c.csv", "--encoding", "bogus"],
        ["plot", "--run", "r", "--encoding", "utf-9"],
    ],
)
def test_an_unknown_encoding_is_refused_by_the_parser_naming_the_flag(capsys, argv):
    # Unchecked, it failed only when the CSV was read, with an error naming --csv.
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(argv)
    assert raised.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "argument --encoding: unknown text encoding" in line


def test_a_known_encoding_parses_unchanged():
    args = build_parser().parse_args(["train", "--csv", "c.csv", "--encoding", "latin-1"])
    assert args.encoding == "latin-1"


def _subparser(name: str) -> argparse.ArgumentParser:
    (commands,) = [
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return commands.choices[name]


@pytest.mark.parametrize("command", ["predict", "forecast", "plot"])
def test_model_choices_are_the_librarys_model_names_not_a_copy(command):
    (action,) = [a for a in _subparser(command)._actions if "--model" in a.option_strings]
    assert action.choices is MODEL_NAMES


@pytest.mark.parametrize("command", ["evaluate", "forecast", "plot"])
def test_split_choices_are_the_data_layers_splits_not_a_copy(command):
    (action,) = [a for a in _subparser(command)._actions if "--split" in a.option_strings]
    assert action.choices is SPLITS
