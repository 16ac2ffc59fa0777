"""`backtest` and `evaluate` announce the windows they score in the model's own training or
validation period: targets it was fitted or selected on, which give in-sample scores.

The tiny stores model (`tests/forecaster_stores.py`) is fitted once on 100 days
from 2024-01-01; its test period is the last 15% of them, from 2024-03-26.
Backtest cutoffs are counted back from the table's last day by hand, and a
window is in-sample when its series was trained on and its first forecast
step (its earliest) comes before that day.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest

from benchmarks.quality import cutoffs_in_test_split
from tft_jax.forecaster import Forecaster

from .cli_tables import HORIZON
from .forecaster_stores import fitted_stores

TEST_START = pd.Timestamp("2024-03-26")  # 100 days from 2024-01-01, the last 15 of them
LAST_DAY = pd.Timestamp("2024-04-09")
IN_SAMPLE = "are in-sample (optimistic)"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """`(forecaster, table, saved folder)` of the stores model."""
    return fitted_stores(tmp_path_factory.mktemp("in_sample"))


def in_sample_messages(
    call: Callable[..., Any], *args: Any, **kwargs: Any
) -> tuple[Any, list[str]]:
    """`call(*args, **kwargs)`'s result and the texts of the in-sample warnings it gave.

    Each names this file, the caller's, as where it was raised.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call(*args, **kwargs)
    ours = [w for w in caught if IN_SAMPLE in str(w.message)]
    assert [w.filename for w in ours] == [__file__] * len(ours)
    return result, [str(w.message) for w in ours]


def cutoffs(n_windows: int, step: int) -> list[pd.Timestamp]:
    """The cutoffs `backtest` takes on the stores table: the last forecasts its final H days."""
    last = LAST_DAY - pd.Timedelta(days=HORIZON - 1)
    return [last - pd.Timedelta(days=k * step) for k in range(n_windows)][::-1]


def test_the_models_test_start_is_recorded_as_its_split_puts_it(fitted):
    forecaster, _, _ = fitted
    assert pd.Timestamp(forecaster.summary["dataset"]["test_start"]) == TEST_START


def test_backtest_names_the_cutoffs_before_the_test_start_once_and_keeps_their_scores(fitted):
    forecaster, table, _ = fitted
    early = [cutoff for cutoff in cutoffs(4, 7) if cutoff < TEST_START]
    assert len(early) == 2  # 03-13 and 03-20 (which straddles 03-26); 03-27, 04-03 after it
    result, messages = in_sample_messages(forecaster.backtest, table, n_windows=4, step=7)
    assert messages == [
        f"backtest: 2 of the 4 cutoffs ({early[0]}, {early[1]}) forecast steps before the "
        f"model's test start {TEST_START} for series it was trained on: 6 of the 6 windows "
        "scored there forecast targets of its training or validation period, which it was "
        "fitted or selected on, so their scores are in-sample (optimistic); for out-of-sample "
        "scores backtest a table that extends past the training data, or use fewer or later "
        "cutoffs (with step=7, n_windows=2 keeps every cutoff at or after it)"
    ]
    assert sorted(result["cutoff"].unique()) == cutoffs(4, 7)
    # Announced, not changed: the later cutoffs score as a backtest of only them does.
    later, quiet = in_sample_messages(forecaster.backtest, table, n_windows=2, step=7)
    assert quiet == []
    pd.testing.assert_frame_equal(
        result[result["cutoff"] >= TEST_START].reset_index(drop=True), later
    )


@pytest.mark.parametrize("requested", [1, 2, 3, 4, 8])
def test_the_quality_benchmark_takes_the_backtest_cutoffs_in_the_test_split(fitted, requested):
    # Its docstring called the backtest "the test numbers", but it scored a validation
    # quarter of tourism (3 cutoffs of 4 quarters, a test split of 11).
    forecaster, _, _ = fitted
    used = cutoffs_in_test_split(forecaster.dataset, "D", requested)
    assert used == sum(1 for cutoff in cutoffs(requested, HORIZON) if cutoff >= TEST_START)
    assert used == min(requested, 2)


def test_many_in_sample_cutoffs_are_named_first_few_and_counted(fitted):
    forecaster, table, _ = fitted
    early = [str(cutoff) for cutoff in cutoffs(8, 7) if cutoff < TEST_START]
    _, messages = in_sample_messages(forecaster.backtest, table, n_windows=8, step=7)
    assert len(messages) == 1  # one warning per call, not one per cutoff
    assert messages[0].startswith(
        f"backtest: 6 of the 8 cutoffs ({', '.join(early[:3])} and 3 more) forecast steps "
    )
    assert "18 of the 18 windows" in messages[0]


@pytest.mark.parametrize(("n_windows", "flagged"), [(9, 0), (10, 1)])
def test_a_cutoff_at_the_test_start_is_out_of_sample_and_one_step_before_is_not(
    fitted, n_windows, flagged
):
    forecaster, table, _ = fitted
    assert cutoffs(9, 1)[0] == TEST_START
    _, messages = in_sample_messages(forecaster.backtest, table, n_windows, step=1)
    assert len(messages) == flagged
    if flagged:
        day_before = TEST_START - pd.Timedelta(days=1)
        assert messages[0].startswith(f"backtest: 1 of the 10 cutoffs ({day_before}) ")
        assert "(with step=1, n_windows=9 keeps every cutoff at or after it)" in messages[0]


def test_new_series_are_out_of_sample_at_any_cutoff(fitted):
    forecaster, table, _ = fitted
    new = table.assign(store="new " + table["store"])
    _, messages = in_sample_messages(forecaster.backtest, new, n_windows=4, step=7)
    assert messages == []
    # Beside the trained series, only theirs are counted: 3 of the 6 windows per cutoff.
    both = pd.concat([table, new], ignore_index=True)
    _, messages = in_sample_messages(forecaster.backtest, both, n_windows=4, step=7)
    assert len(messages) == 1
    assert "6 of the 12 windows scored there" in messages[0]


def test_a_table_that_ends_past_the_training_data_by_a_split_is_evaluated_silently(fitted):
    forecaster, table, _ = fitted
    _, messages = in_sample_messages(forecaster.evaluate, table)
    assert messages == []


def test_the_test_split_of_a_table_ending_earlier_is_announced_once(fitted):
    forecaster, table, _ = fitted
    short = table[table["day"] < "2024-04-02"]
    windows = forecaster.prepare(short, "test").test
    first_steps = windows.panel.times[windows.starts]
    early = int((first_steps < TEST_START).sum())
    assert 0 < early < len(windows)  # the short table's test split straddles the model's
    metrics, messages = in_sample_messages(forecaster.evaluate, short)
    assert metrics["windows"] == len(windows)
    assert len(messages) == 1
    assert messages[0].startswith(
        f"evaluate: the test split of this table (from {first_steps.min()}, cut from this "
        "table) has windows that forecast steps before the model's test start "
        f"{TEST_START} for series it was trained on: {early} of the {len(windows)} windows "
        "scored there forecast targets of its training or validation period"
    )
    _, messages = in_sample_messages(forecaster.evaluation, short, "test")
    assert len(messages) == 1
    # The validation split is the model's own by name: nothing to announce.
    _, messages = in_sample_messages(forecaster.evaluate, short, split="validation")
    assert messages == []


def test_a_run_without_a_recorded_test_start_is_not_checked(fitted, tmp_path):
    _, table, saved = fitted
    loaded = Forecaster.load(saved)
    _, messages = in_sample_messages(loaded.backtest, table, n_windows=3, step=7)
    assert len(messages) == 1  # the test start survives save and load
    for test_start in (None, "2024-03-26 00:00:00+00:00"):  # an older run; an aware time
        run = shutil.copytree(saved, tmp_path / f"run {test_start is None}")
        config = json.loads((run / "config.json").read_text())
        config["summary"]["dataset"].pop("test_start")
        if test_start is not None:
            config["summary"]["dataset"]["test_start"] = test_start
        (run / "config.json").write_text(json.dumps(config))
        edited = Forecaster.load(run)
        _, messages = in_sample_messages(edited.backtest, table, n_windows=3, step=7)
        assert messages == [], test_start
