"""`fit`'s in-state learning-rate schedule across resumes and skipped steps.

A schedule the time budget refitted ends where that budget stops the run (its
end following the measured pace): a resume under the same budget keeps it, as
the uninterrupted run does; one that
goes on past that stop gets the caller's schedule back, refitted at once to the
time left at the checkpoint's pace (and anew once measured), announced; any
other change of the schedule on resume is announced with the rate it goes on
from; and the refit ends the cosine at the stop in
applied updates (what the schedule reads), whatever steps were skipped. The
rates are checked against the closed form of the warmup + cosine schedule.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import pytest

from tests.linear_quantile_model import MODEL, _host, linear_batch
from tft_jax.train import (
    Batch,
    create_train_state,
    fit,
    in_state_schedule,
    make_optimizer,
    step_key,
    train_step,
    warmup_cosine_schedule,
    with_schedule_steps,
)
from tft_jax.train_state import schedule_update_count

PEAK, PLANNED, WARMUP = 0.05, 100, 3
BATCHES = [linear_batch(i) for i in range(4)]


def closed_form_rate(count: int, peak: float, total: int, warmup: int, end: float = 0.0) -> float:
    """The warmup + cosine learning rate after `count` updates, in float64."""
    if count < warmup:
        return peak * count / warmup
    progress = min(count - warmup, total - warmup) / (total - warmup)
    return end + (peak - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


def schedule_state(peak: float = PEAK, total: int = PLANNED, warmup: int = WARMUP, end=0.0):
    """A train state of the linear model whose optimizer keeps its schedule in its state."""
    tx = make_optimizer(warmup_cosine_schedule(peak, total, warmup, end), clip_norm=1.0)
    return create_train_state(MODEL, tx, jax.random.key(0), BATCHES[0])


class Clock:
    """A fake monotonic clock that each training batch advances by one second."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def source(self, batches: list[Batch], kill_at_epoch: int | None = None) -> Callable:
        """`epoch -> batches`, each taking a second; raising `Killed` at `kill_at_epoch`."""

        def batches_of(epoch: int) -> Iterator[Batch]:
            if epoch == kill_at_epoch:
                raise Killed
            for batch in batches:
                self.now += 1.0
                yield batch

        return batches_of


class Killed(Exception):
    pass


def budget_fit(clock: Clock, checkpoint_dir: Any, budget: float, **options: Any) -> Any:
    """`fit` of a fresh 100-step schedule state on 1 s batches under `budget` seconds."""
    source = options.pop("source", clock.source(BATCHES))
    return fit(
        schedule_state(), source, epochs=50, max_steps=PLANNED, time_budget=budget,
        clock=clock, checkpoint_dir=checkpoint_dir, quiet=True, **options,
    )  # fmt: skip


def test_a_run_stopped_on_its_budget_trains_on_under_a_larger_one(tmp_path) -> None:
    clock = Clock()
    first = budget_fit(clock, tmp_path, 20.0)
    # The refit ended the cosine at the stop: the next update would have rate 0.
    assert first.stop_reason == "time_budget" and int(first.state.step) == 20
    assert first.schedule_steps == 20
    before = _host(first.state)
    # The caller's 100-step cosine takes over at update 20, refitted at once to the
    # 40 steps the 20 s left allow at the checkpoint's 1 s a step (closed form), then
    # the 40 s budget refits it to its stop at step 36 (5 steps past the compiling one).
    goes_on_from = closed_form_rate(20, PEAK, 40, WARMUP)
    message = (
        r"resuming at step 20: the time budget had refitted the learning-rate schedule to end "
        r"at step 20, and the run stopped on its time budget there and now trains on under one "
        r"of 40\.0s, where it would train at its end rate 0: the rest follows this run's "
        r"schedule \(warmup 3, peak 0\.05, end 0 at step 100\), refitted to end at step 40 "
        r"\(what the time left allows at the checkpoint's pace\), from the rate "
        rf"{goes_on_from:.3g} \(the refitted one gives 0 there\); the time budget of 40\.0s "
        r"refits it anew"
    )
    with pytest.warns(UserWarning, match=message):
        second = budget_fit(clock, tmp_path, 40.0, resume=True)
    assert second.stop_reason == "time_budget" and int(second.state.step) == 36
    assert second.schedule_steps == 36
    after = _host(second.state)
    # Trained at rate 0 before: not one parameter moved.
    assert max(float(np.max(np.abs(after[name] - before[name]))) for name in before) > 1e-3
    schedule = in_state_schedule(second.state)
    assert (schedule.warmup_steps, schedule.end_lr) == (WARMUP, 0.0)
    assert schedule.peak_lr == pytest.approx(PEAK)
    # The last update (count 35) trained at the cosine's low end again.
    last_rate = float(schedule(35))
    assert last_rate == pytest.approx(closed_form_rate(35, PEAK, 36, WARMUP), rel=1e-5)
    assert last_rate < 1e-2 * PEAK

    # Resumed once more under the same budget: nothing to train, nothing to say.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = budget_fit(clock, tmp_path, 40.0, resume=True)
    assert int(again.state.step) == 36 and again.schedule_steps == 36


def test_a_killed_run_resumed_under_another_budget_refits_anew(tmp_path) -> None:
    clock = Clock()
    with pytest.raises(Killed):  # refitted to 21 at step 6, checkpointed at step 12
        budget_fit(clock, tmp_path, 20.5, source=clock.source(BATCHES, 3), checkpoint_every=4)
    # The epochs the resume skips take no time; the refit of 21 steps was for 20.5 s.
    assert clock.now == 12.0

    def resumed(epoch: int) -> Iterator[Batch]:
        yield from BATCHES if epoch < 3 else clock.source(BATCHES)(epoch)

    message = (
        r"end at step 21, and that fitted a time budget of 20\.5s, not 30\.5s, .* from the "
        rf"rate {closed_form_rate(12, PEAK, 30, WARMUP):.3g} \(the refitted one gives "
        rf"{closed_form_rate(12, PEAK, 21, WARMUP):.3g} there\)"
    )
    with pytest.warns(UserWarning, match=message):
        result = budget_fit(clock, tmp_path, 30.5, resume=True, source=resumed)
    # Kept, the 21-step cosine left steps 21-30 at rate 0; refitted anew it ends at 31.
    assert result.stop_reason == "time_budget" and int(result.state.step) == 31
    assert result.schedule_steps == 31


def test_a_resume_past_the_end_of_a_schedule_ending_at_zero_is_warned_of(tmp_path) -> None:
    common = dict(epochs=10, checkpoint_dir=tmp_path, quiet=True)
    fit(schedule_state(total=8), BATCHES, max_steps=8, **common)
    message = (
        r"resuming at step 8 past the end of the learning-rate schedule \(warmup 3, peak 0\.05, "
        r"end 0 at step 8\): the steps left train at its end rate 0 and change nothing"
    )
    with pytest.warns(UserWarning, match=message):
        fit(schedule_state(total=8), BATCHES, max_steps=12, resume=True, **common)


@pytest.mark.parametrize(
    ("peak", "end", "said"),
    [(5.0, 0.0, r"there\); peak rate 5 \(the checkpoint's 0\.05\)$"),
     (PEAK, 0.01, r"there\); end rate 0\.01 \(the checkpoint's 0\)$")],
)  # fmt: skip
def test_a_resume_on_another_peak_or_end_rate_is_announced_with_the_rate_it_goes_on_from(
    tmp_path, peak: float, end: float, said: str
) -> None:
    common = dict(epochs=3, checkpoint_dir=tmp_path, quiet=True)
    fit(schedule_state(PEAK, 12, WARMUP), BATCHES, max_steps=5, **common)
    message = (
        # Only what changed is named: not the total and warmup, which did not.
        rf"resuming at step 5 on another learning-rate schedule: the rate goes on from "
        rf"{closed_form_rate(5, peak, 12, WARMUP, end):.3g} \(the checkpoint's schedule gives "
        rf"{closed_form_rate(5, PEAK, 12, WARMUP):.3g} {said}"
    )
    with pytest.warns(UserWarning, match=message):
        result = fit(schedule_state(peak, 12, WARMUP, end), BATCHES, max_steps=10, resume=True,
                     **common)  # fmt: skip
    schedule = in_state_schedule(result.state)
    assert (schedule.peak_lr, schedule.end_lr) == pytest.approx((peak, end))


def with_a_nan_second_batch() -> list[Batch]:
    """`BATCHES` with NaN targets in the second: its step applies no update."""
    bad = BATCHES[1].replace(target=np.full(np.shape(BATCHES[1].target), np.nan, np.float32))
    return [BATCHES[0], bad, *BATCHES[2:]]


def skipping_source(clock: Clock) -> Callable:
    """1 s batches, the second of each epoch with NaN targets: its step applies no update."""
    return clock.source(with_a_nan_second_batch())


def test_the_budget_refit_ends_the_cosine_at_the_stop_in_applied_updates(tmp_path) -> None:
    clock = Clock()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape("fit: step"))  # the skips, said
        result = budget_fit(clock, None, 20.0, source=skipping_source(clock))
    state = result.state
    assert result.stop_reason == "time_budget" and int(state.step) == 20
    count = schedule_update_count(state)
    assert int(state.skipped_steps) == 5 and count == 15
    # The schedule reads the update count: its cosine ends at the 15th update, the
    # stop. Counted in steps it ended at 20, the last update at 28% of the peak.
    schedule = in_state_schedule(state)
    assert schedule.total_steps == 15 and result.schedule_steps == 15
    last_rate = float(schedule(count - 1))
    assert last_rate == pytest.approx(closed_form_rate(count - 1, PEAK, 15, WARMUP), rel=1e-5)
    assert last_rate < 2e-2 * PEAK


def test_with_schedule_steps_is_bounded_by_the_update_count_not_the_step() -> None:
    state = schedule_state(total=40, warmup=1)
    nan = linear_batch(9, nan_target=True)
    for step, batch in enumerate([BATCHES[0], nan, BATCHES[1], BATCHES[2], BATCHES[3]]):
        state, _ = train_step(state, batch, step_key(jax.random.key(0), step))
    assert int(state.step) == 5 and schedule_update_count(state) == 4
    assert in_state_schedule(with_schedule_steps(state, 4)).total_steps == 4
    with pytest.raises(ValueError, match=r"below the state's update count \(4, .*\), got 3"):
        with_schedule_steps(state, 3)


def slowing_source(
    clock: Clock,
    kill_at_epoch: int | None = None,
    skip_epochs: int = 0,
    batches: list[Batch] = BATCHES,
):
    """2 s `batches` until 12 s, 1 s after (the refit's end followed on); epochs below
    `skip_epochs` free."""

    def batches_of(epoch: int) -> Iterator[Batch]:
        if epoch == kill_at_epoch:
            raise Killed
        for batch in batches:
            if epoch >= skip_epochs:
                clock.now += 2.0 if clock.now < 12 else 1.0
            yield batch

    return batches_of


def test_a_run_killed_after_its_cosine_followed_the_pace_resumes_to_the_same_result(
    tmp_path,
) -> None:
    clock = Clock()
    whole = budget_fit(clock, None, 40.0, source=slowing_source(clock))
    # The refit at 2 s a step ended the cosine at update 20; measured anew at 1 s a
    # step it was moved on to the stop at step 34 (it used to end at 20, and the
    # run trained its last 14 steps at rate 0).
    assert int(whole.state.step) == 34 and whole.schedule_steps == 34
    clock = Clock()
    with pytest.raises(Killed):  # checkpointed at step 28, the moved cosine kept
        budget_fit(clock, tmp_path, 40.0, source=slowing_source(clock, 7), checkpoint_every=4)
    resumed = budget_fit(clock, tmp_path, 40.0, resume=True, source=slowing_source(clock, None, 7))
    assert int(resumed.state.step) == 34 and resumed.schedule_steps == 34
    want, got = _host(whole.state), _host(resumed.state)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_followed_cosine_ends_at_the_stop_in_applied_updates_after_skipped_steps() -> None:
    clock = Clock()
    source = slowing_source(clock, batches=with_a_nan_second_batch())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape("fit: step"))  # the skips, said
        result = budget_fit(clock, None, 40.0, source=source, eval_every=4)
    state = result.state
    # 6 steps of 2 s to 12 s, 28 of 1 s to 40 s; steps 1, 5, ..., 33 skipped.
    assert result.stop_reason == "time_budget" and int(state.step) == 34
    count = schedule_update_count(state)
    assert int(state.skipped_steps) == 9 and count == 34 - 9
    # Moved on from the refit's end at 2 s a step, the cosine ends at the stop counted
    # in updates (25), not at the update whose step the stop is (21: the last 4 at 0).
    schedule = in_state_schedule(state)
    assert result.schedule_steps == count and schedule.total_steps == count
    # A cosine from the rate at its last move (its "warmup" ends there, its peak is that
    # rate) to 0 at the stop.
    assert WARMUP < schedule.warmup_steps < count and schedule.peak_lr < PEAK
    last_rate = float(schedule(count - 1))
    assert last_rate == pytest.approx(
        closed_form_rate(count - 1, schedule.peak_lr, count, schedule.warmup_steps), rel=1e-5
    )
    assert 0 < last_rate < 1e-2 * PEAK


def test_a_slightly_larger_budget_resumes_on_a_decaying_rate(tmp_path) -> None:
    clock = Clock()
    budget_fit(clock, tmp_path, 20.0)
    with pytest.warns(UserWarning, match=r"refitted to end at step 23 "):
        second = budget_fit(clock, tmp_path, 23.0, resume=True)
    # The 3 s left at 1 s a step: the cosine ends at 23, not the peak-ish 100 steps.
    schedule = in_state_schedule(second.state)
    assert second.schedule_steps == 23 and schedule.total_steps == 23
    count = schedule_update_count(second.state)
    assert float(schedule(count - 1)) == pytest.approx(
        closed_form_rate(count - 1, PEAK, 23, WARMUP), rel=1e-5
    )
    assert float(schedule(count - 1)) < 0.1 * PEAK
