"""Forecasts below 0 of a target that the table never holds below 0 are announced.

A user audit on a count table found forecasts of sales below 0 by default,
without a word, where `DataConfig.nonnegative=True` (or
`target_transform='log1p'`) was the remedy. `negative_forecasts` counts them
by quantile level and says so, naming the remedies; nothing is said with
`nonnegative=True`, for a table whose target holds a negative value, or when
no forecast is below 0. One tiny model, fitted once on the stores table
(the settings of `tests/test_forecaster.py`, whose compiled steps it
shares), is made to forecast below 0 by moving its scaler's level.
"""

from __future__ import annotations

import argparse
import json
import shutil
import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax import cli
from tft_jax.cli_parser import build_parser
from tft_jax.forecaster import Forecaster
from tft_jax.forecaster.negative_forecasts import (
    NegativeForecasts,
    count_negative,
    level_name,
    negative_forecast_message,
)

from .cli_tables import HORIZON
from .forecaster_stores import cut, fitted_stores

LEVELS = (0.1, 0.5, 0.9)
COUNTS = np.array([0.0, 3.0, 7.0, np.nan])  # a missing target is not a negative one


def _forecast() -> np.ndarray:
    """(2 windows, 3 steps, 3 levels): P10 below 0 three times, P50 once, P90 never."""
    forecast = np.full((2, 3, 3), 5.0)
    forecast[0, 0, 0], forecast[0, 2, 0], forecast[1, 1, 0] = -1.0, -2.5, -0.5
    forecast[1, 1, 1] = -0.25
    return forecast


def _message(found, targets=COUNTS, **options) -> str | None:
    options = {"nonnegative": False, "scope": "predict", **options}
    return negative_forecast_message("sales", targets, found, LEVELS, **options)


def test_negative_values_are_counted_by_level_with_the_lowest_and_where_it_is():
    asked = []

    def where(window: int, step: int) -> str:
        asked.append((window, step))
        return f"window {window} step {step}"

    found = count_negative(_forecast(), where)
    assert found == NegativeForecasts((3, 1, 0), 6, -2.5, "window 0 step 2")
    assert asked == [(0, 2)]  # named once, the lowest
    assert found.any
    clean = count_negative(np.abs(_forecast()), where)
    assert not clean.any and clean.lowest == 0.25 and clean.lowest_at is None
    assert asked == [(0, 2)]  # nothing below 0: nothing named
    with pytest.raises(ValueError, match=r"\(windows, steps, levels\), got shape \(6, 3\)"):
        count_negative(_forecast().reshape(6, 3))


def test_counts_of_several_cutoffs_add_up_and_keep_the_lowest():
    first = NegativeForecasts((3, 1, 0), 6, -2.5, "at the first")
    second = NegativeForecasts((1, 0, 2), 4, -7.0, "at the second")
    assert first + second == NegativeForecasts((4, 1, 2), 10, -7.0, "at the second")
    assert second + first == NegativeForecasts((4, 1, 2), 10, -7.0, "at the second")
    empty = count_negative(np.empty((0, 3, 3)))
    assert np.isnan(empty.lowest)
    assert empty + first == NegativeForecasts((3, 1, 0), 6, -2.5, "at the first")
    assert first + empty == NegativeForecasts((3, 1, 0), 6, -2.5, "at the first")


def test_the_message_names_the_target_the_counts_by_level_the_lowest_and_the_remedies():
    found = {"fp32": count_negative(_forecast(), lambda w, s: f"series 'a' at step {s}")}
    message = _message(found)
    assert message == (
        "predict: forecasts of 'sales' below 0, though no target of the table is below 0: "
        "fp32 P10: 3 of 6, P50: 1 of 6 (lowest -2.5, series 'a' at step 2); if 'sales' cannot "
        "be negative, set DataConfig.nonnegative=True to clip the forecasts at 0 (a fitted "
        "Forecaster takes it without training again), or train with target_transform='log1p' "
        "(--target-transform log1p)"
    )
    assert "P90" not in message  # a level with none below 0 is not listed


def test_several_models_are_said_in_one_message_thousands_grouped():
    found = {
        "fp32": NegativeForecasts((1234, 0, 0), 8000, -3.0),
        "qat": NegativeForecasts((0, 0, 0), 8000, 1.0),  # none below 0: not named
        "int8": NegativeForecasts((1300, 12, 0), 8000, -4.0),
    }
    message = _message(found, scope="evaluate: the test split")
    assert message is not None
    assert message.startswith("evaluate: the test split: forecasts of 'sales' below 0")
    assert "fp32 P10: 1,234 of 8,000 (lowest -3); int8 P10: 1,300 of 8,000, P50: 12 of 8,000" in (
        message
    )
    assert "qat" not in message


def test_nothing_is_said_with_nonnegative_a_negative_target_or_no_negative_forecast():
    found = {"fp32": count_negative(_forecast())}
    assert _message(found) is not None
    assert _message(found, nonnegative=True) is None
    assert _message(found, targets=np.array([3.0, -0.5, 7.0])) is None  # can be negative
    assert _message({"fp32": count_negative(np.abs(_forecast()))}) is None
    assert _message({}) is None


def test_a_log1p_target_is_told_only_to_clip():
    message = _message({"fp32": count_negative(_forecast())}, target_transform="log1p")
    assert message is not None
    assert message.endswith("(a fitted Forecaster takes it without training again)")
    assert "log1p" not in message


def test_levels_are_named_as_percentiles():
    assert [level_name(level) for level in (0.1, 0.5, 0.9, 0.025, 0.99)] == [
        "P10", "P50", "P90", "P2.5", "P99",
    ]  # fmt: skip


def _cli_args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_the_command_line_says_the_remedies_as_its_flags():
    message = _message({"fp32": count_negative(_forecast())})
    assert message is not None
    trained = cli.warning_text(message, _cli_args(["train", "--out", "run"]))
    assert trained.endswith(
        "if 'sales' cannot be negative, pass --nonnegative to clip the forecasts at 0, or "
        "--target-transform log1p"
    )
    for argv in (
        ["evaluate", "--run", "run"],
        ["forecast", "--run", "run"],
        ["predict", "--run", "run", "--csv", "h.csv", "--out", "p.csv"],
    ):
        shown = cli.warning_text(message, _cli_args(argv))
        assert shown.endswith(
            "if 'sales' cannot be negative, train again with --nonnegative to clip the "
            "forecasts at 0, or with --target-transform log1p"
        ), argv
        assert "DataConfig" not in shown and "Forecaster" not in shown


# ---------------------------------------------------------------- a fitted Forecaster


@pytest.fixture(scope="module")
def sunk(tmp_path_factory):
    """`(table, runs)`: the stores model saved with every forecast moved below 0, as run
    folders with `nonnegative` off ('raw') and on ('clipped')."""
    folder = tmp_path_factory.mktemp("negative_forecasts")
    _, table, saved = fitted_stores(folder)
    runs = {}
    for name, nonnegative in (("raw", False), ("clipped", True)):
        runs[name] = shutil.copytree(saved, folder / name)
        config = json.loads((runs[name] / "config.json").read_text())
        config["data"]["nonnegative"] = nonnegative
        # Sink the forecasts by the series scaler's level (window normalization would take
        # the same shift out of each window), as `test_nonnegative_clips_forecasts_at_zero`.
        config["data"]["window_normalization"] = False
        config["summary"]["dataset"]["window_normalization"] = False
        scaler = config["preprocessor"]["target_scaler"]
        scaler["loc"] = [value - 1000.0 for value in scaler["loc"]]
        (runs[name] / "config.json").write_text(json.dumps(config))
    return table, runs


def _said(call) -> list[str]:
    """The messages of the forecasts-below-0 warnings `call()` raises."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if "below 0, though" in str(w.message)]


def test_predict_says_its_forecasts_go_below_0_naming_the_callers_line(sunk):
    table, runs = sunk
    history, future = cut(table, "2024-03-30")
    forecaster = Forecaster.load(runs["raw"])
    with pytest.warns(UserWarning, match=r"^predict: forecasts of 'sales' below 0") as caught:
        forecast = forecaster.predict(history, future)
    said = [w for w in caught if "below 0, though" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__  # the user's line
    values = 3 * HORIZON  # three stores
    assert f"fp32 P10: {values} of {values}, P50: {values} of {values}, P90: {values} of" in (
        str(said[0].message)
    )
    lowest = forecast[["q0.1", "q0.5", "q0.9"]].to_numpy().min()
    row = forecast.loc[forecast["q0.1"].idxmin()]
    assert f"(lowest {lowest:.4g}, series {row['store']!r} at {pd.Timestamp(row['day'])})" in (
        str(said[0].message)
    )
    assert "if 'sales' cannot be negative, set DataConfig.nonnegative=True" in str(said[0].message)
    # Clipped at 0: nothing to say. A history with a negative target: a quantity that can be.
    assert _said(lambda: Forecaster.load(runs["clipped"]).predict(history, future)) == []
    negative = history.assign(sales=np.where(history["store"] == "beta", -3.0, history["sales"]))
    assert _said(lambda: forecaster.predict(negative, future)) == []


def test_evaluate_and_backtest_say_it_once_for_what_they_score(sunk):
    table, runs = sunk
    forecaster = Forecaster.load(runs["raw"])
    said = _said(lambda: forecaster.evaluate(table, "test"))
    assert len(said) == 1 and said[0].startswith("evaluate: the test split: forecasts of 'sales'")
    said = _said(lambda: forecaster.backtest(table, n_windows=2, step=HORIZON))
    assert len(said) == 1 and said[0].startswith("backtest (2 cutoffs): forecasts of 'sales'")
    values = 2 * 3 * HORIZON  # two cutoffs of three stores, summed
    assert f"fp32 P10: {values} of {values}," in said[0]
    clipped = Forecaster.load(runs["clipped"])
    assert _said(lambda: clipped.evaluate(table, "test")) == []
    assert _said(lambda: clipped.backtest(table, n_windows=2, step=HORIZON)) == []


def test_the_forecast_command_says_it_of_the_forecasts_it_writes(sunk, tmp_path):
    # `tft-jax forecast` writes a split's forecasts without `evaluate`; `train` writes them
    # after `evaluate` has said it of every model, so it says nothing more there.
    table, runs = sunk
    forecaster = Forecaster.load(runs["raw"])
    dataset = forecaster.prepare(table, "test")
    prediction = forecaster.predictions(dataset, dataset.split("test"), ["fp32"])["fp32"]

    def written(announce: bool) -> list[str]:
        path = tmp_path / f"forecasts_{announce}.csv"
        return _said(
            lambda: cli.write_split_forecasts(
                forecaster, dataset, "test", prediction, "fp32", path, announce_negative=announce
            )
        )

    said = written(True)
    assert len(said) == 1 and said[0].startswith("forecast: the test split: forecasts of 'sales'")
    assert written(False) == []
