"""`fit`: the training loop, with validation, early stopping, checkpoints and `resume`.

Every random number is a function of the seed and a counter: the dropout key of
step `s` is `fold_in(key(seed), s)` and the training batches of epoch `e` come
from `train_batches(e)`. A run resumed from a checkpoint therefore repeats the
uninterrupted run exactly.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import pathlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from tft_jax.batch_padding import ShortBatchFiller, fill_setting, widest
from tft_jax.caller_frame import user_stacklevel
from tft_jax.checkpoint import BEST, TrainingCheckpointer
from tft_jax.distributed import check_mesh, data_mesh, is_primary, place_state, shard_batch
from tft_jax.fit_progress import Progress, duration_text, step_text
from tft_jax.optimizer import _require_positive_float
from tft_jax.schedules import WarmupCosine, continued_to
from tft_jax.steps import (
    _check_finite_inputs,
    _check_finite_targets,
    _check_mesh_divides,
    _check_validation_targets,
    evaluate,
    train_step,
)
from tft_jax.train_state import (
    Batch,
    TrainState,
    _check_batch,
    _check_state,
    _with_schedule,
    copy_state,
    in_state_schedule,
    prepare_batch,
    schedule_update_count,
    with_schedule_steps,
)

Array = Any
History = dict[str, list]
BatchSource = Iterable["Batch"] | Callable[[int], Iterable["Batch"]]

HISTORY_KEYS = ("epoch", "step", "train_loss", "val_loss", "skipped_steps")
_MAX_PENDING = 1024  # step metrics held on the device before `fit` sums them on the host
_SHARED_CLOCK_STEPS = 10  # steps between clock readings in a multi-process `fit`


# ---------------------------------------------------------------------------
# The loop


@jax.jit
def step_key(seed_key: Array, step: int | Array) -> Array:
    """The dropout key of training step `step`: `fold_in(seed_key, step)` (jitted)."""
    return jax.random.fold_in(seed_key, step)


@dataclasses.dataclass
class LoopState:
    """Where the training loop is: everything `fit` needs to resume, JSON-serialisable.

    Attributes:
      epoch: the current epoch.
      batches_done: batches of `epoch` already trained on (the data position).
      step: global step count (equals `TrainState.step`).
      history: per evaluation, lists under `HISTORY_KEYS`.
      best_val_loss: the lowest validation loss so far, or None.
      evals_since_best: evaluations since the best one (for patience).
      loss_sum: sum, over the steps since the last evaluation that were
        applied (finite, with an observed target), of each step's loss (the
        mean over its batch's observed targets) times that number of targets.
      loss_count: the number of observed targets of those steps, so that
        `loss_sum / loss_count` is the mean loss per observed target.
      stopped_early: whether patience ran out.
      stopped_on_budget: whether the time budget ran out.
      seconds: training time of the run up to this point, over every `fit`
        call that continued it (what the time budget counts).
      schedule_steps: the total steps that the time budget refitted the
        in-state learning-rate schedule to, or None when it was not refitted
        (the refitted schedule itself is in the checkpointed optimizer state).
      schedule_budget: the time budget, in seconds, that refitted it; None
        when it was not refitted (and in checkpoints written before it was
        kept), so that a resume under another budget refits anew.
      announced_skips: the `TrainState.skipped_steps` count already announced
        (at the latest evaluation, or the state's count when the run started),
        so that a resumed run announces the skips the checkpoint holds but
        no evaluation has reported yet; None until `fit` sets it (and in
        checkpoints written before it was kept).
      resumed: one record per resume that went on along another learning-rate
        schedule than its checkpoint's (a raised `max_steps` or epoch count,
        another time budget): the steps before it trained on another
        schedule, so the model differs from an uninterrupted run's (see
        `_resume_record`). Empty for a run never so resumed (and in
        checkpoints written before it was kept).
      widest_batch: the most rows of a training batch so far, the width a
        short one is filled up to (`fill_short_batches`); 0 in checkpoints
        written before it was kept.
    """

    epoch: int = 0
    batches_done: int = 0
    step: int = 0
    history: History = dataclasses.field(default_factory=lambda: {key: [] for key in HISTORY_KEYS})
    best_val_loss: float | None = None
    evals_since_best: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0
    stopped_early: bool = False
    stopped_on_budget: bool = False
    seconds: float = 0.0
    schedule_steps: int | None = None
    schedule_budget: float | None = None
    announced_skips: int | None = None
    resumed: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    widest_batch: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoopState:
        """The inverse of `to_json`."""
        return cls(**data)


class FitResult(NamedTuple):
    """What `fit` returns.

    Attributes:
      state: the final train state.
      best_state: the state with the lowest validation loss (the final state
        when there is no validation data: then the very same object as
        `state`, whose buffers a later `train_step(result.state, ...)`
        donates; copy it with `copy_state` first to keep it. The initial
        state, with a `UserWarning`, when no validation loss was finite).
      history: per evaluation, lists under `HISTORY_KEYS`: epoch (0-based, the
        epoch of the last batch trained before the evaluation), step, mean
        training loss since the previous evaluation (per observed target, as
        `evaluate` weighs the validation loss: each applied step's batch loss
        weighted by its number of observed targets, so a batch with few
        observed targets counts little; skipped steps and batches without an
        observed target are left out; NaN when there were none), validation
        loss (None without validation data) and the running count of skipped
        steps. The training loss of a step is measured with dropout, on the
        parameters before its update.
      stop_reason: why training ended: `'completed'` (every epoch, or
        `max_steps`), `'early_stopping'` (patience ran out) or
        `'time_budget'`.
      schedule_steps: where the in-state learning-rate schedule ends at the
        end of training: the total the time budget refitted it to, else the
        planned one; None when the learning rate is compiled into the step.
        Counted in applied updates, which the schedule reads: steps skipped
        before the refit leave it that many below the step it ends at.
      resumed: `LoopState.resumed` at the end of training: the resumes that
        went on along another schedule, each with the step it resumed at and
        the schedule the steps before it trained on; empty when none did.
    """

    state: TrainState
    best_state: TrainState
    history: History
    stop_reason: str = "completed"
    schedule_steps: int | None = None
    resumed: tuple[dict[str, Any], ...] = ()


def _batches_for_epoch(source: BatchSource, epoch: int) -> Iterable[Batch]:
    return source(epoch) if callable(source) else source


def _epoch_length(source: BatchSource) -> int | None:
    try:
        return len(_batches_for_epoch(source, 0))  # type: ignore[arg-type]
    except TypeError:
        return None


def _skip(iterator: Iterator[Batch], count: int, fill_up: ShortBatchFiller) -> int:
    """Skips up to `count` batches of `iterator`; returns how many there were.

    Their widths are told to `fill_up`: a resumed run fills the short batch
    that follows as the uninterrupted run did.
    """
    skipped = 0
    for _ in range(count):
        batch = next(iterator, None)
        if batch is None:
            break
        fill_up.saw(batch)
        skipped += 1
    return skipped


class _BadTrainingData:
    """Why `fit`'s steps were skipped, when the training batches say so.

    Read once, on the host, the first time a skip is announced, and only for
    batches given as a sequence (a stream cannot be read again): the first
    batch holding an observed NaN or inf target or a non-finite input.
    """

    found: str | None  # None: not read yet

    def __init__(self, source: Any) -> None:
        self.source, self.found = source, None

    def text(self) -> str:
        """`'; <the first bad batch>'`, or `''` when none is found or they cannot be read."""
        if self.found is None:
            self.found = ""
            if isinstance(self.source, Sequence) and jax.process_count() == 1:
                for index in range(len(self.source)):
                    batch = self.source[index]
                    try:
                        _check_finite_targets(index, batch, "train_batches")
                        _check_finite_inputs(f"train_batches: batch {index}", batch)
                    except ValueError as error:
                        self.found = f"; {error}"
                        break
        return self.found


def _check_fit_args(
    epochs: int,
    patience: int | None,
    eval_every: int | None,
    checkpoint_every: int | None,
    max_steps: int | None,
    calibrate_steps: int | None,
    log_every: int,
) -> None:
    named = {
        "epochs": (epochs, 1),
        "patience": (patience, 1),
        "eval_every": (eval_every, 1),
        "checkpoint_every": (checkpoint_every, 1),
        "max_steps": (max_steps, 1),
        "calibrate_steps": (calibrate_steps, 0),
        "log_every": (log_every, 1),
    }
    for name, (value, minimum) in named.items():
        if value is None and name not in ("epochs", "log_every"):
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"fit: {name} must be an int, got {value!r}")
        if value < minimum:
            raise ValueError(f"fit: {name} must be >= {minimum}, got {value}")


def _check_train_batches(source: Any, per_epoch: int | None, epochs: int) -> None:
    """Raises `ValueError` for a batch source that cannot give `epochs` epochs.

    A one-shot iterator (a generator, say) is used up by the first epoch: the
    later ones would be empty and `fit` would report `'completed'` after a
    single epoch. A source without batches would train nothing.
    """
    if per_epoch == 0:
        raise ValueError("fit: train_batches holds no batch")
    if not callable(source) and isinstance(source, Iterator) and epochs > 1:
        raise ValueError(
            f"fit: train_batches is a one-shot iterator ({type(source).__name__}), used up "
            f"by the first epoch, but epochs={epochs}; pass a list, a re-iterable, or a "
            "callable epoch -> iterable of Batch (or epochs=1)"
        )


def _check_fit_timing(
    checkpoint_every_seconds: float | None,
    time_budget: float | None,
    log_seconds: float,
    label: str | None,
    clock: Any,
) -> None:
    for name, value in (
        ("checkpoint_every_seconds", checkpoint_every_seconds),
        ("time_budget", time_budget),
    ):
        if value is not None:
            _require_positive_float(f"fit: {name}", value)
    _require_positive_float("fit: log_seconds", log_seconds, allow_zero=True)
    if label is not None and not isinstance(label, str):
        raise TypeError(f"fit: label must be a string or None, got {label!r}")
    if not callable(clock):
        raise TypeError(f"fit: clock must be a callable returning seconds, got {clock!r}")


def fit(
    state: TrainState,
    train_batches: BatchSource,
    val_batches: Iterable[Batch] | None = None,
    *,
    epochs: int,
    seed: int = 0,
    patience: int | None = None,
    eval_every: int | None = None,
    max_steps: int | None = None,
    time_budget: float | None = None,
    checkpoint_dir: str | pathlib.Path | None = None,
    checkpoint_every: int | None = None,
    checkpoint_every_seconds: float | None = 120.0,
    resume: bool = False,
    calibrate_steps: int | None = None,
    quiet: bool = False,
    label: str | None = None,
    log_every: int = 10,
    log_seconds: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    mesh: Mesh | None = None,
    fsdp: bool = False,
    fill_short_batches: bool = True,
) -> FitResult:
    """Trains `state` for `epochs` epochs with validation, early stopping and checkpoints.

    Args:
      state: the initial state (from `create_train_state`); donated.
      train_batches: an iterable of `Batch` re-iterated every epoch (a
        one-shot iterator, such as a generator, only with `epochs=1`), or a
        callable `epoch -> iterable of Batch` (shuffle inside it with a
        generator seeded by `(seed, epoch)` so that `resume` is exact).
        A NumPy batch with a `target_mask` (as `WindowSet` makes) that is
        shorter than the widest (of a list or tuple; else the widest yet,
        which a checkpoint keeps) is filled up with unobserved rows
        (`tft_jax.batch_padding`), outside calibration steps: it runs the
        wider batches' compiled step, with the same loss and gradient up to
        rounding (the wider sums add in another order; dropout draws for
        the filled shape).
      val_batches: a re-iterable of validation batches (at least one), or None;
        short ones filled up as the training batches are.
      epochs: number of passes over `train_batches`.
      seed: the seed of the dropout keys (`fold_in(key(seed), step)`).
      patience: stop after this many evaluations without a lower validation
        loss (needs `val_batches`); None never stops early.
      eval_every: evaluate every this many steps; None evaluates once per epoch.
        A final evaluation follows the last step when it had none.
      max_steps: stop after this many steps in total; None runs every epoch.
      time_budget: stop once this many seconds of training have passed (None:
        no limit). The time counts from the start of `fit`, so the compilation
        of the train step is included, and, for a resumed run, adds the time
        of the earlier runs up to the checkpoint resumed from. It is checked
        after every step, so training ends within one step (and that step's
        evaluation or checkpoint) of the budget; the final evaluation, the
        best state and the checkpoints then follow as at a normal end, and
        `stop_reason` is `'time_budget'`. In a multi-process run process 0's
        clock decides, read every 10 steps, so that every process stops (and
        saves timed checkpoints) at the same step. When the learning-rate
        schedule lives in the optimizer state (`make_optimizer(
        warmup_cosine_schedule(...))`), the budget also refits it: after
        a few steps past the compilation (and a few seconds, or 5% of a
        short budget), the measured step time and that of the evaluations
        (their mean past the first, which compiles) tell how many steps the
        rest of the budget allows; when that is fewer than planned, the
        cosine is made to end there (`with_schedule_steps`, announced unless
        `quiet`), so that the last steps train at the low learning rate.
        The step time is then measured anew over each tenth of the budget,
        or sooner over a tenth of the cosine's steps left (the load may
        change): when the stop it foretells moves by more
        than a tenth of the steps left, the cosine's end follows it, the
        rate going on from where it is (`schedules.continued_to`: no jump;
        announced), within the planned schedule; an ended cosine stays
        ended. The schedule counts applied updates: steps that apply none (skipped for
        a non-finite loss, or without an observed target) move its end
        earlier, at the refit and at each later evaluation, so that it still
        ends at the stop. A budget spent before the step time is measured
        says so at the stop. `max_steps` stays the cap; the refitted total is
        in the checkpoints and in `FitResult.schedule_steps`. A resumed run
        keeps it while it trains under the budget it was fitted to (see
        `resume`).
      checkpoint_dir: where the latest and best checkpoints go (see
        `tft_jax.checkpoint`); None keeps no checkpoints. A fresh start
        (`resume=False`) refuses a folder holding another run's checkpoints.
        The folder is locked for the whole training (`tft_jax.folder_lock`):
        a `fit` into a folder that another process is training into raises
        `FolderLockedError` naming that process, before touching its files.
      checkpoint_every: also save the latest checkpoint every this many steps
        (it is always saved after each evaluation, at each epoch's end and
        at the end).
      checkpoint_every_seconds: also save the latest checkpoint once this many
        seconds have passed since the previous save (None: never by time), so
        that a killed run loses at most about this much training.
      resume: continue from the newest intact checkpoint in `checkpoint_dir` if
        there is one (a fresh start otherwise; either is announced unless
        `quiet`); `state` then only gives the structure, and its
        schedule (when in the optimizer state: another one than the
        checkpoint's, in any of its four numbers, is announced with a
        `UserWarning` naming the rate it goes on from). A schedule the time
        budget refitted is kept instead while the run goes on under the same
        budget: it ends where that budget stops the run. When the run goes on
        past that stop (a run stopped on its budget resumed with a larger one
        or none, or another `time_budget`), its steps would train at the end
        rate, 0 for the usual schedule, and change nothing: `state`'s
        schedule takes over, announced with a `UserWarning` naming the rate
        it goes on from at the update count; a `time_budget` refits it at
        once to the steps the time left allows at the checkpoint's pace
        (its seconds per step so far), then anew once the step time is
        measured. A run under the same budget keeps the refitted schedule
        even past its end, as the uninterrupted run does. A run going on
        past the end of a (not refitted) schedule whose end rate is 0 is
        warned of. With
        the same arguments the result equals that of the uninterrupted run;
        a finished run returns at once, unless `epochs`, `max_steps` or
        `time_budget` were raised, or `patience` (a run stopped early trains
        on while its evaluations since the best are fewer than the new
        `patience`).
      calibrate_steps: None for models without calibration; N for the QAT
        model: steps `< N` run with `calibrate=True`, later ones `calibrate=False`.
      quiet: print nothing (no progress bar, no lines).
      label: the name of the run in its progress bar and lines (e.g. `'FP32'`).
      log_every: on a terminal, refresh the training loss in the progress bar
        every this many steps.
      log_seconds: without a terminal (a log file, a pipe), print a plain
        progress line (step/total, loss, elapsed, ETA) at least this many
        seconds apart, besides one per evaluation, instead of a progress bar.
      clock: the monotonic clock, in seconds, that the time budget, the timed
        checkpoints and the progress read (replaceable in tests).
      mesh: the `data` mesh to train on (`tft_jax.distributed.data_mesh`); None
        uses every device. Batches are split over it (their size must divide
        evenly: checked before training for the validation batches and for
        `train_batches` given as a list or tuple), the state is replicated, or
        with `fsdp=True` split too.
      fsdp: shard parameters and optimizer state over the mesh (large models).
      fill_short_batches: fill short training and validation batches up with
        unobserved rows (see `train_batches`). The same loss and gradient
        hold for a model that computes each row from that row alone, as the
        TFT does; pass False for one that looks across the batch (batch
        statistics): its short batches then compile programs of their own.

    Returns:
      A `FitResult(state, best_state, history, stop_reason, schedule_steps, resumed)`.
    """
    _check_fit_timing(checkpoint_every_seconds, time_budget, log_seconds, label, clock)
    started = clock()

    def warn(message: str) -> None:
        """A repair or surprise of this run, said even when quiet, at the caller of `fit`."""
        warnings.warn(
            f"fit{f' ({label})' if label else ''}: {message}",
            UserWarning,
            stacklevel=user_stacklevel(),
        )

    _check_state("fit", state)
    _check_fit_args(
        epochs, patience, eval_every, checkpoint_every, max_steps, calibrate_steps, log_every
    )
    # Checked here: `jax.random.key` would fail on a traced float or a None, naming neither.
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"fit: seed must be an int, got {type(seed).__name__} {seed!r}")
    # Any truthy value (fsdp="no") used to turn FSDP on without a word.
    if not isinstance(fsdp, bool | np.bool_):
        raise TypeError(f"fit: fsdp must be a bool, got {type(fsdp).__name__} {fsdp!r}")
    fsdp = bool(fsdp)
    fills = fill_setting("fit", fill_short_batches)
    if calibrate_steps is not None and not state.model_state:
        # Else the first step fails: calibrate=True named as `train_step`'s, or the
        # model refusing a `calibrate` argument inside the trace (calibrate_steps=0).
        raise ValueError(
            f"fit: calibrate_steps={calibrate_steps} needs a model with non-trainable "
            "collections to calibrate (e.g. the QAT model's 'quant_stats'), but "
            "state.model_state is empty; pass calibrate_steps=None"
        )
    if resume and checkpoint_dir is None:
        raise ValueError("fit: resume=True needs a checkpoint_dir")
    if patience is not None and val_batches is None:
        # Without validation losses nothing counts toward it: it was ignored, silently.
        raise ValueError(
            f"fit: patience={patience} needs val_batches (early stopping compares "
            "validation losses); pass val_batches, or patience=None"
        )
    if val_batches is not None and not isinstance(val_batches, Sequence):
        val_batches = list(val_batches)
    if val_batches is not None and not val_batches:
        # Checked now: `evaluate` would raise only after the first epoch's training.
        raise ValueError("fit: val_batches is empty; pass None to train without validation")
    if val_batches is not None:
        _check_validation_targets(val_batches, state)
    mesh = data_mesh() if mesh is None else mesh
    check_mesh("fit", mesh)
    if val_batches is not None:
        _check_mesh_divides("val_batches", val_batches, mesh, fills)
    if isinstance(train_batches, list | tuple):
        # Calibration steps are not filled: their short batches must split as they are.
        _check_mesh_divides("train_batches", train_batches, mesh, fills and not calibrate_steps)
    eval_calibrate = None if calibrate_steps is None else False

    per_epoch = _epoch_length(train_batches)
    _check_train_batches(train_batches, per_epoch, epochs)
    total = None if per_epoch is None else per_epoch * epochs
    if max_steps is not None:
        total = max_steps if total is None else min(total, max_steps)
    seed_key = jax.random.key(seed)
    loop = LoopState()
    earlier_seconds = 0.0  # training time of the runs this one continues

    def elapsed() -> float:
        return earlier_seconds + clock() - started

    progress = Progress(
        enabled=not quiet and is_primary(),  # one progress display per run
        label=label,
        total=total,
        clock=clock,
        elapsed=elapsed,
        time_budget=time_budget,
        log_every=log_every,
        log_seconds=log_seconds,
    )
    checkpointer = None if checkpoint_dir is None else TrainingCheckpointer(checkpoint_dir)
    if checkpointer is not None and not resume:
        _check_no_earlier_run(checkpointer, checkpoint_dir)
    best_state: TrainState | None = None
    # Placed first: a checkpoint then restores straight into the mesh's shardings
    # (whatever device count wrote it), in every process of a multi-host run.
    state = place_state(state, mesh, fsdp)
    planned_schedule = in_state_schedule(state)
    refit_gives_way: str | None = None  # why a checkpoint's refitted schedule is not kept
    resumed = False
    checkpoint_schedule: WarmupCosine | None = None
    checkpoint_budget: float | None = None
    if checkpointer is not None and resume:
        restored = checkpointer.restore_latest(state)
        if restored is None and checkpointer.steps(BEST):
            restored = checkpointer.restore_best(state)
            if restored is not None:  # every latest step was moved aside as corrupt
                warn(
                    f"no intact latest checkpoint in {checkpoint_dir}; going on from the best "
                    f"checkpoint, step {int(restored.state.step)}"
                )
        if restored is None:
            progress.note(f"no checkpoint in {checkpoint_dir}: starting from step 0")
        else:
            _check_resume_seed(restored.rng, seed_key, seed)
            # Placed again: on the default device alone, restored arrays come back
            # committed, and would key programs of their own (`place_state`).
            state = place_state(restored.state, mesh, fsdp)
            loop = LoopState.from_json(restored.loop)
            resumed = True
            earlier_seconds = loop.seconds
            # What the steps so far trained on, before this run's schedule replaces it.
            checkpoint_schedule = in_state_schedule(state)
            checkpoint_budget = loop.schedule_budget
            if max_steps is not None and loop.step > max_steps:
                # Nothing is undone: the result is the checkpoint's, past the cap asked for.
                warn(
                    f"the checkpoint in {checkpoint_dir} is at step {loop.step}, past "
                    f"max_steps={max_steps}; its state is returned as it is (a run cannot go "
                    "back to an earlier step: train into another checkpoint_dir for a shorter "
                    "run)"
                )
            if planned_schedule is not None and loop.schedule_steps is None:
                # Not refitted: the caller's schedule applies (a raised
                # max_steps, say), as when schedules were compiled into the step.
                if total is None or loop.step < total:  # steps left to train
                    _announce_another_schedule(
                        in_state_schedule(state),
                        planned_schedule,
                        loop.step,
                        schedule_update_count(state) or 0,
                        warn,
                    )
                state = _with_schedule(state, planned_schedule)
            elif planned_schedule is not None:
                # Refitted: decided once the stops below are cleared (see `fit`).
                refit_gives_way = _refit_gives_way(
                    loop, time_budget, in_state_schedule(state), schedule_update_count(state)
                )
            checkpointer.discard_best_after(loop.step)
            best = checkpointer.restore_best(state)
            best_state = None if best is None else place_state(best.state, mesh, fsdp)
            if best is None and loop.best_val_loss is not None and val_batches is not None:
                # The best state is gone (deleted, or moved aside as corrupt):
                # the resumed state stands in for it, a repair said even when quiet.
                warn(
                    f"the best checkpoint (validation loss {loop.best_val_loss:.6g}) is "
                    f"missing from {checkpoint_dir}; best_state is the resumed state of step "
                    f"{loop.step} until a validation loss beats that one"
                )
            progress.note(
                f"resuming from step {loop.step} (epoch {loop.epoch}) of the checkpoint "
                f"in {checkpoint_dir}"
            )
    if loop.stopped_on_budget and (time_budget is None or loop.seconds < time_budget):
        loop.stopped_on_budget = False  # a larger budget, or none: train on
    if loop.stopped_early and (patience is None or loop.evals_since_best < patience):
        loop.stopped_early = False  # a larger patience, or none: train on
    trains_on = not _finished(loop, epochs, max_steps)
    if refit_gives_way is not None and trains_on:
        assert planned_schedule is not None
        # The refitted cosine ended, or ends, where the budget it was fitted to
        # stopped the run: the steps past it would train at its end rate (0 for
        # the usual schedule). The caller's schedule takes over, refitted at once
        # to the steps the time left allows at the checkpoint's pace (so that
        # the first steps already decay), then anew (below) once measured.
        refitted, count = in_state_schedule(state), schedule_update_count(state) or 0
        assert refitted is not None
        state = _with_schedule(state, planned_schedule)
        fitted = _steps_left_at_the_checkpoints_pace(loop, time_budget)
        if fitted is not None:
            updates = _updates_until(fitted, loop.step, count, planned_schedule.warmup_steps)
            if updates < planned_schedule.total_steps:
                state = with_schedule_steps(state, updates)
            else:
                fitted = None
        warn(
            _refit_gives_way_message(
                loop.step,
                refit_gives_way,
                refitted,
                planned_schedule,
                in_state_schedule(state) or planned_schedule,
                fitted,
                count,
                time_budget,
            )
        )
        loop.schedule_steps = loop.schedule_budget = None
    elif loop.schedule_steps is not None and planned_schedule is not None and trains_on:
        # Kept as the budget refitted it (see `fit`): say what the rest trains at.
        if loop.schedule_budget == time_budget:
            rest = "; its end follows the measured step time"
        elif total is None or total > loop.schedule_steps:
            rest = "; steps past it train at its end rate"
        else:
            rest = ""
        progress.note(
            f"the learning rate follows the schedule the time budget refitted to end at "
            f"step {loop.schedule_steps}{rest}"
        )
    if resumed and trains_on and checkpoint_schedule is not None:
        now_schedule = in_state_schedule(state)
        if now_schedule is not None and not _same_schedule(checkpoint_schedule, now_schedule):
            # Recorded (the run folder's summary shows it): the model is not the
            # uninterrupted run's, whose steps all followed one schedule.
            loop.resumed.append(_resume_record(loop.step, checkpoint_schedule, checkpoint_budget))
    if resumed and trains_on and planned_schedule is not None and loop.schedule_steps is None:
        # (A kept refitted schedule's end is said above.)
        _warn_if_the_schedule_has_ended(
            in_state_schedule(state), schedule_update_count(state) or 0, loop.step, warn
        )
    if best_state is None:
        best_state = copy_state(state)
    if val_batches is not None:
        val_batches = _ShardedBatches(val_batches, mesh, state, fills)

    # Step metrics wait on the device until an evaluation or a checkpoint needs
    # them (no host sync per step); they are then added in step order, so a
    # resumed run sums exactly as the uninterrupted one.
    pending: list[tuple[Array, Array, Array]] = []
    last_save = clock()
    # Skipped steps counted by an earlier fit of this state are not this run's
    # to announce; a resumed run goes on from what its checkpoint had announced
    # (skips after the latest evaluation before the checkpoint still to come).
    if loop.announced_skips is None:
        loop.announced_skips = int(state.skipped_steps)
    bad_data = _BadTrainingData(train_batches)

    def flush() -> None:
        for loss, skipped, observed in jax.device_get(pending):
            # A batch without an observed target has a loss of 0 that says nothing.
            if not skipped and observed:
                # Weighted by its observed targets, as `evaluate` weighs batches: the
                # mean per target, whatever the batches' sizes and masks.
                loop.loss_sum += float(loss) * float(observed)
                loop.loss_count += int(observed)
        pending.clear()

    def align_schedule() -> None:
        """Keeps a refitted cosine ending at the update of the step it was fitted to.

        Steps that applied no update since the refit (skipped, or without an
        observed target) put the update count, which the schedule reads,
        further behind the step. Read at evaluations, which wait on the device.
        """
        nonlocal state
        if loop.schedule_steps is None or planned_schedule is None:
            return
        schedule, count = in_state_schedule(state), schedule_update_count(state)
        if schedule is None or count is None or count >= schedule.total_steps:
            return  # an ended cosine stays where it ended
        updates = _updates_until(loop.schedule_steps, loop.step, count, schedule.warmup_steps)
        if updates != schedule.total_steps:
            state = with_schedule_steps(state, updates)

    def record() -> bool:
        """Evaluates, appends to the history and saves the best state; True = stop early."""
        nonlocal best_state
        flush()
        align_schedule()
        count = loop.loss_count
        train_loss = loop.loss_sum / count if count else math.nan
        loop.loss_sum, loop.loss_count = 0.0, 0
        evaluation_started = clock()
        val_loss = None if val_batches is None else evaluate(state, val_batches, eval_calibrate)
        evaluation_seconds = clock() - evaluation_started
        if refit is not None:
            refit.evaluated(evaluation_seconds)
        skipped = int(state.skipped_steps)
        # The epoch of the last batch trained: the final evaluation comes after the
        # loop moved on to the next epoch (it said 3 of a 3-epoch run, 0 to 2).
        epoch = loop.epoch - 1 if loop.batches_done == 0 and loop.epoch > 0 else loop.epoch
        for key, value in zip(
            HISTORY_KEYS, (epoch, loop.step, train_loss, val_loss, skipped), strict=True
        ):
            loop.history[key].append(value)
        announced_skips = loop.announced_skips or 0
        if skipped > announced_skips:
            # Skipping is a repair the user did not ask for: announced, even when quiet.
            warn(
                f"step {loop.step}: {skipped - announced_skips} step(s) since the previous "
                "evaluation skipped (non-finite loss or gradient, or an unusable learning "
                f"rate); their updates were not applied{bad_data.text()}"
            )
            loop.announced_skips = skipped
        if val_loss is not None:
            # A NaN loss (a diverged model) is never best: it would never be beaten.
            improved = math.isfinite(val_loss) and (
                loop.best_val_loss is None or val_loss < loop.best_val_loss
            )
            if improved:
                loop.best_val_loss, loop.evals_since_best = val_loss, 0
                best_state = copy_state(state)
                if checkpointer is not None:
                    loop.seconds = elapsed()
                    checkpointer.save_best(state, seed_key, _loop_snapshot(loop))
            else:
                loop.evals_since_best += 1
        progress.evaluated(loop.step, train_loss, val_loss, evaluation_seconds)
        return patience is not None and loop.evals_since_best >= patience

    def save_latest() -> None:
        nonlocal last_save
        if checkpointer is not None:
            flush()
            loop.seconds = elapsed()
            checkpointer.save_latest(state, seed_key, _loop_snapshot(loop))
            last_save = clock()

    single_process = jax.process_count() == 1
    refit: _ScheduleRefit | None = None
    # A schedule refitted to this budget (a resume keeping the checkpoint's) follows
    # the pace from its first estimate on; any other is refitted first.
    follows = loop.schedule_steps is not None and loop.schedule_budget == time_budget
    if (
        time_budget is not None
        and planned_schedule is not None
        and (loop.schedule_steps is None or follows)
    ):
        planned = min(planned_schedule.total_steps, math.inf if total is None else total)
        refit = _ScheduleRefit(
            time_budget=time_budget,
            planned=planned,
            warmup_steps=planned_schedule.warmup_steps,
            eval_interval=per_epoch if eval_every is None else eval_every,
            # Observers updated over the whole run: no step with frozen ones to compile.
            settled_after=calibrate_steps if calibrate_steps and calibrate_steps < planned else 0,
            follows=follows,
        )

    def refit_schedule() -> None:
        """Ends the schedule where the budget will, once the step time is known (see `fit`)."""
        nonlocal state
        assert refit is not None
        if not single_process and loop.step % _SHARED_CLOCK_STEPS:
            return
        fitted = refit.estimate(loop.step, clock(), elapsed())
        if not single_process:
            fitted = _int_from_process_0(fitted)
        if fitted is None:
            return
        if refit.follows:
            cosine_end = follow_the_pace(fitted)
            refit.again(loop.step, clock(), cosine_end)
            return
        # The schedule reads the count of applied updates, which the steps
        # skipped so far left behind the step: the cosine ends at the update
        # of step `fitted` (kept so by `align_schedule` as more are skipped).
        count = schedule_update_count(state) or 0
        updates = _updates_until(fitted, loop.step, count, refit.warmup_steps)
        assert planned_schedule is not None
        if fitted < refit.planned and updates < planned_schedule.total_steps:
            state = with_schedule_steps(state, updates)
            loop.schedule_steps, loop.schedule_budget = fitted, time_budget
            progress.note(_refit_note(refit.fits, fitted, refit.warmup_steps))
        elif np.float32(in_state_schedule(state).total_steps) != np.float32(
            planned_schedule.total_steps
        ):
            # A resume's first guess (see above) was short: the whole schedule fits.
            state = with_schedule_steps(state, planned_schedule.total_steps)
        refit.follows = True
        cosine_end = _cosine_end_step(in_state_schedule(state), count, loop.step)
        refit.again(loop.step, clock(), cosine_end)

    def follow_the_pace(fitted: int) -> int | None:
        """Moves the cosine's end to `fitted`, the rate going on from where it is; returns
        the step the cosine ends at (`_cosine_end_step`), moved or not.

        The step time measured at the refit may change (another load, a
        shorter evaluation): a cosine ended too early would train the last
        steps at its end rate (0: uselessly), one ended too late would stop
        undecayed. Re-estimated over each later tenth of the budget, or
        sooner, over a tenth of the cosine's steps left (steps that got
        faster close it sooner); moved when the end moves by more than a
        tenth of the steps left, along a cosine from the current rate
        (`continued_to`), so that the rate does not jump. An ended cosine
        stays ended.
        """
        nonlocal state
        assert refit is not None and planned_schedule is not None
        schedule, count = in_state_schedule(state), schedule_update_count(state) or 0
        assert schedule is not None
        if count >= schedule.total_steps:
            return None
        if fitted >= refit.planned:  # the whole schedule fits, as at the refit
            updates = planned_schedule.total_steps
        else:
            updates = _updates_until(fitted, loop.step, count, schedule.warmup_steps)
            updates = min(updates, planned_schedule.total_steps)
        updates = max(updates, count + 1)
        noise = max(_FOLLOW_MIN_STEPS, _FOLLOW_MIN_FRACTION * (schedule.total_steps - count))
        if abs(updates - schedule.total_steps) <= noise:
            return _cosine_end_step(schedule, count, loop.step)
        moved = continued_to(schedule, count, updates)
        state = _with_schedule(state, moved)
        ends = _cosine_end_step(moved, count, loop.step)
        assert ends is not None  # `updates` is above `count`
        old_end = loop.schedule_steps
        loop.schedule_steps, loop.schedule_budget = ends, time_budget
        progress.note(
            f"the step time changed: the time budget now fits about {ends} steps; the learning "
            f"rate goes on from {float(schedule(count)):.3g} and decays to step {ends}"
            + ("" if old_end is None else f" (was {old_end})")
        )

    def clock_says() -> tuple[bool, bool]:
        """`(a timed checkpoint is due, the time budget is spent)` by process 0's clock.

        Read after every step in one process. In a multi-process run every
        process must save and stop at the same step, so the clock is read every
        `_SHARED_CLOCK_STEPS` steps and process 0's answer is shared (a collective).
        """
        timed_save = checkpointer is not None and checkpoint_every_seconds is not None
        if not timed_save and time_budget is None:
            return False, False
        if not single_process and loop.step % _SHARED_CLOCK_STEPS:
            return False, False
        save = timed_save and clock() - last_save >= checkpoint_every_seconds
        spent = time_budget is not None and elapsed() >= time_budget
        return (save, spent) if single_process else _from_process_0(save, spent)

    def done() -> bool:
        return _finished(loop, epochs, max_steps)

    compiled: set[bool | None] = set()  # the `calibrate` values whose step has run
    previous_loss: Array | None = None
    # The widest known before the first batch: a list's, and a resumed run's so far.
    listed = widest(train_batches) if isinstance(train_batches, list | tuple) else 0
    fill_up = ShortBatchFiller(max(listed, loop.widest_batch), fills)
    try:
        while not done():
            iterator = iter(_batches_for_epoch(train_batches, loop.epoch))
            seen = _skip(iterator, loop.batches_done, fill_up)
            if seen < loop.batches_done:  # resumed over data with fewer batches an epoch
                warn(
                    f"epoch {loop.epoch} now has {seen} batches, but the checkpoint had "
                    f"trained on {loop.batches_done} of it: the training data changed since; "
                    "going on with the next epoch"
                )
            for batch in iterator:
                seen += 1
                calibrate = None if calibrate_steps is None else loop.step < calibrate_steps
                compiling = calibrate not in compiled
                if compiling:
                    what = "the train step" + (" with frozen observers" if compiled else "")
                    progress.note(f"compiling {what}...")
                    compile_started = clock()
                try:
                    # Converted on the host first: placed on the mesh, an int64 array
                    # would wrap to int32 before `train_step` could (`prepare_batch`).
                    prepared = prepare_batch("train_step", batch, state)
                    # Checked on the host: placed first, its categorical codes would not be
                    # read back, and the embeddings would clip one out of range silently.
                    _check_batch("train_step", prepared, state)
                    # Not filled in calibration: an observer would see the copies.
                    prepared = fill_up(prepared, fill=calibrate is not True)
                    loop.widest_batch = fill_up.widest  # checkpointed: a resume fills alike
                    placed = shard_batch(prepared, mesh)
                    state, metrics = train_step(
                        state, placed, step_key(seed_key, loop.step), calibrate
                    )
                except (TypeError, ValueError) as error:  # a bad batch, found as it came
                    error.args = (f"fit: train batch {seen - 1} of epoch {loop.epoch}: {error}",)
                    raise
                loop.step += 1
                loop.batches_done += 1
                pending.append((metrics["loss"], metrics["skipped"], metrics["observed"]))
                if compiling:
                    jax.block_until_ready(metrics["loss"])
                    compiled.add(calibrate)
                    progress.note(f"compiled in {duration_text(clock() - compile_started)}")
                    progress.start(loop.step)
                    if refit is not None:
                        refit.compiled(loop.step, clock())
                elif time_budget is not None and previous_loss is not None:
                    # The device stays at most one step behind: the clock measures its work.
                    jax.block_until_ready(previous_loss)
                previous_loss = metrics["loss"]
                if len(pending) >= _MAX_PENDING:
                    flush()
                progress.stepped(loop.step, metrics["loss"])
                if refit is not None:
                    refit_schedule()
                timed_save, spent = clock_says()
                evaluating = eval_every is not None and loop.step % eval_every == 0
                if evaluating:
                    loop.stopped_early = record()
                if spent and not done():
                    loop.stopped_on_budget = True
                if done():
                    # Saved after the loop, once the final evaluation and the stop
                    # are in `loop`: a checkpoint is never written twice at a step.
                    break
                every = checkpoint_every is not None and loop.step % checkpoint_every == 0
                if evaluating or timed_save or (checkpointer is not None and every):
                    save_latest()
            else:  # the epoch ran to its end
                if not seen and not loop.step:
                    # Nothing trained yet (a source whose size is unknown up front).
                    raise ValueError(f"fit: train_batches yielded no batch in epoch {loop.epoch}")
                if eval_every is None and not _evaluated_at(loop):
                    loop.stopped_early = record()
                loop.epoch, loop.batches_done = loop.epoch + 1, 0
            if done() and not _evaluated_at(loop):
                record()
            save_latest()
    finally:
        progress.close()
        if checkpointer is not None:
            checkpointer.close()
    if loop.step > 0 and int(state.skipped_steps) == int(state.step):
        # Said once more at the end (the run 'completed' otherwise reads as a success).
        warn(
            f"every one of the {int(state.step)} steps was skipped (non-finite loss or "
            f"gradient, or an unusable learning rate): the model never trained{bad_data.text()}"
        )
    if val_batches is None:
        best_state = state
    elif loop.best_val_loss is None and loop.step > 0:
        # No finite validation loss ever: the best state is the initial one, a
        # repair the caller did not ask for (said even when quiet).
        warn(
            f"no validation loss was finite in {loop.step} steps; best_state is the initial "
            "state (the run diverged, or every step was skipped)"
        )
    if loop.stopped_on_budget:
        reason = "time_budget"
        unfitted = ""
        ended = in_state_schedule(state)
        if planned_schedule is not None and ended is not None:
            # In updates, as the schedule (refitted or not) counts them.
            unfitted = _undecayed_note(
                schedule_update_count(state) or 0,
                round(ended.total_steps),
                # The caller's: a cosine moved with the pace starts its own at the move.
                round(planned_schedule.warmup_steps),
                # A resumed run that follows the pace: its checkpoint's run measured it.
                measured=refit is None or refit.follows or refit.fits is not None,
                fits=None if refit is None else refit.fits,
            )
        progress.note(
            f"stopped on the time budget of {duration_text(time_budget)} at step "
            f"{step_text(loop.step, total)} after {duration_text(elapsed())}{unfitted}"
        )
    elif loop.stopped_early:
        reason = "early_stopping"
        progress.note(
            f"stopped early at step {step_text(loop.step, total)}: no lower validation loss in "
            f"{loop.evals_since_best} evaluations"
        )
    else:
        reason = "completed"
        progress.note(
            f"finished at step {step_text(loop.step, total)} after {duration_text(elapsed())}"
        )
    schedule = None if planned_schedule is None else in_state_schedule(state)
    return FitResult(
        state=state,
        best_state=best_state,
        history=loop.history,
        stop_reason=reason,
        schedule_steps=None if schedule is None else schedule.total_steps,
        resumed=tuple(loop.resumed),
    )


def _cosine_end_step(schedule: WarmupCosine | None, count: int, step: int) -> int | None:
    """The step of the last update of `schedule`'s cosine, at update `count` at `step`, were
    no more steps skipped (None when it has ended)."""
    if schedule is None or count >= schedule.total_steps:
        return None
    return step + round(schedule.total_steps) - count


def _refit_note(fits: int | None, fitted: int, warmup_steps: int) -> str:
    """The line of a time budget's refit: the budget ends at step `fits`, the cosine at `fitted`.

    `fitted` is `fits` raised above the warmup (a schedule must end past
    it): when the budget ends within the warmup, the rate never decays, and
    the line says so rather than promise a decay to `fitted`.
    """
    if fits is not None and fits <= warmup_steps:
        return (
            f"the time budget fits about {fits} steps, within the warmup of {warmup_steps} "
            f"steps: the learning rate will not decay (the schedule now ends at step {fitted})"
        )
    return (
        f"the time budget fits about {fitted} steps: the learning rate now decays to step {fitted}"
    )


def _undecayed_note(
    updates: int, end: int, warmup_steps: int, *, measured: bool, fits: int | None = None
) -> str:
    """What the stop note of a run stopped by its time budget after `updates` adds, or "".

    Counted in applied updates, as the schedule reads them (a skipped step
    applies none). Said when the budget stopped the run before its
    schedule's end `end` (where the refit ended the cosine, or the
    schedule's own): the model then did not train along a full warmup +
    cosine, at worst never left the warmup. `measured` says whether the
    step time was measured (the schedule refitted, or found to fit) before
    the budget ran out; `fits` is the step the measured time put the
    budget's end at, when it did.
    """
    if updates >= end:
        return ""
    if not measured:
        why = "the budget ran out before the step time was measured"
    elif fits is not None and fits <= warmup_steps:
        why = "the budget ends within it"
    else:
        why = "sooner than the measured step time foretold"
    if updates <= warmup_steps:
        why = f"still in the warmup: {why}"
    return (
        f"; the learning rate did not decay to its end: stopped after {updates} of the "
        f"schedule's {end} updates (warmup {warmup_steps}), {why}; give a larger time budget, "
        "or fewer steps"
    )


# Before the time budget refits the schedule: steps and seconds measured since
# the latest compilation, so that the step time is the running step's. The
# seconds are at most this fraction of the budget, so that a short budget, most
# of it spent compiling, is still measured in time to end the cosine.
_REFIT_MIN_STEPS = 5
_REFIT_MIN_SECONDS = 2.0
_REFIT_MAX_BUDGET_FRACTION = 0.05
# After it, the step time is measured anew over each tenth of the budget; the
# cosine's end follows when it moves by more than a tenth of the steps left
# (and more than 1 step): noise in the step time leaves it alone.
_FOLLOW_BUDGET_FRACTION = 0.1
_FOLLOW_MIN_FRACTION = 0.1
_FOLLOW_MIN_STEPS = 1


class _ScheduleRefit:
    """Where the time budget will end training, from the measured step time (`fit`).

    The step time is measured from the end of the latest compiling step,
    leaving the evaluations in between out; the evaluations' cost is added
    per step as their mean over `eval_interval` steps. The run's first
    evaluation compiles the evaluation program: the mean is that of the
    later ones (the compilation is paid once, not every `eval_interval`
    steps), and the estimate waits for one unless `_REFIT_MIN_SECONDS` of
    steps pass first. The estimate is the step at whose end the budget is
    spent, where `fit` stops.
    """

    def __init__(
        self,
        *,
        time_budget: float,
        planned: float,
        warmup_steps: int,
        eval_interval: int | None,
        settled_after: int,
        follows: bool = False,
    ) -> None:
        self.time_budget, self.planned, self.warmup_steps = time_budget, planned, warmup_steps
        # Whether the next estimate follows the pace (`fit`'s `follow_the_pace`)
        # rather than refits: true after the first estimate.
        self.follows = follows
        self.eval_interval, self.settled_after = eval_interval, settled_after
        self.start: tuple[int, float] | None = None  # (step, time) after the latest compile
        self.window_evaluations = 0.0  # evaluation seconds since then
        self.first_evaluation: float | None = None  # seconds, its compilation included
        self.evaluations, self.evaluation_seconds = 0, 0.0  # the later ones
        self.min_seconds = min(_REFIT_MIN_SECONDS, _REFIT_MAX_BUDGET_FRACTION * time_budget)
        # Once following: the steps that also end a window (`again`); None: seconds only.
        self.window_steps: int | None = None
        # The step the budget ends at, before `estimate` raises it above the warmup.
        self.fits: int | None = None

    def again(self, step: int, now: float, cosine_end: int | None) -> None:
        """Estimated at `step`: the next estimate measures from here, over a tenth of the
        budget or a tenth of the steps to `cosine_end` (the step the cosine ends at, None
        when it has ended), whichever comes first."""
        self.start, self.window_evaluations = (step, now), 0.0
        if cosine_end is None:  # an ended cosine stays ended: nothing to hurry for
            self.window_steps = None
        else:
            left = max(0, cosine_end - step)
            self.window_steps = max(_REFIT_MIN_STEPS, math.ceil(_FOLLOW_BUDGET_FRACTION * left))

    def compiled(self, step: int, now: float) -> None:
        """A newly compiled step has run up to `step` at `now`: measure from here."""
        self.start, self.window_evaluations = (step, now), 0.0

    def evaluated(self, seconds: float) -> None:
        """An evaluation took `seconds`."""
        if self.first_evaluation is None:
            self.first_evaluation = seconds
        else:
            self.evaluations += 1
            self.evaluation_seconds += seconds
        self.window_evaluations += seconds

    def evaluation_seconds_each(self) -> float:
        """The seconds an evaluation takes: the later ones' mean, else the first's, else 0."""
        if self.evaluations:
            return self.evaluation_seconds / self.evaluations
        return self.first_evaluation or 0.0

    def estimate(self, step: int, now: float, elapsed: float) -> int | None:
        """The step at which the budget runs out (not before `step`, above the warmup).

        None while too little is measured, or while a compilation is still
        ahead (the QAT step with frozen observers, after `settled_after` steps).
        """
        if self.start is None or self.start[0] <= self.settled_after:
            return None
        start_step, start_time = self.start
        steps, seconds = step - start_step, now - start_time
        stepping = max(0.0, seconds - self.window_evaluations)  # the steps' own seconds
        if steps < _REFIT_MIN_STEPS or stepping < self.min_seconds:
            return None
        short = self.window_steps is None or steps < self.window_steps
        if self.follows and short and stepping < _FOLLOW_BUDGET_FRACTION * self.time_budget:
            return None  # following: over a tenth of the budget, or of the cosine's steps
        first_only = self.first_evaluation is not None and not self.evaluations
        if first_only and stepping < _REFIT_MIN_SECONDS:
            return None  # the first evaluation compiled: a later one says what one costs
        per_step = stepping / steps
        if self.eval_interval:
            per_step += self.evaluation_seconds_each() / self.eval_interval
        if per_step <= 0.0:
            return None
        remaining = max(0.0, self.time_budget - elapsed)
        # Rounded first: a budget that is a whole number of steps ends at that step.
        steps_left = math.ceil(round(remaining / per_step, 9))
        self.fits = step + steps_left
        return max(self.fits, self.warmup_steps + 1, step)


def _int_from_process_0(value: int | None) -> int | None:
    """Process 0's `value` in every process (a collective: every process must call it)."""
    encoded = np.asarray(-1 if value is None else value, np.int32)
    shared = int(np.asarray(multihost_utils.broadcast_one_to_all(encoded)))
    return None if shared < 0 else shared


def _from_process_0(*flags: bool) -> tuple[bool, ...]:
    """Process 0's `flags` in every process (a collective: every process must call it)."""
    shared = multihost_utils.broadcast_one_to_all(np.asarray(flags, np.bool_))
    return tuple(bool(flag) for flag in np.asarray(shared))


class _ShardedBatches:
    """Re-iterable view of validation batches, each filled up (`ShortBatchFiller`) and placed
    on the mesh when reached."""

    def __init__(
        self, batches: Sequence[Batch], mesh: Mesh, state: TrainState, fills: bool
    ) -> None:
        # The model (`apply_fn`) tells `prepare_batch` its compute dtype, for the range
        # check; the state's arrays are not kept (the train step donates them).
        self.batches, self.mesh = batches, mesh
        self.model = SimpleNamespace(apply_fn=state.apply_fn)
        # Every batch is read before training anyway (`_check_validation_targets`).
        self.fill_up = ShortBatchFiller(widest(batches), fills)

    def __iter__(self) -> Iterator[Batch]:
        for index, batch in enumerate(self.batches):
            # (Checked on the host before training: `_check_validation_targets`.)
            prepared = prepare_batch(f"evaluate: batch {index}", batch, self.model)
            yield shard_batch(self.fill_up(prepared), self.mesh)


def _evaluated_at(loop: LoopState) -> bool:
    steps = loop.history["step"]
    return bool(steps) and steps[-1] == loop.step


def _loop_snapshot(loop: LoopState) -> LoopState:
    return dataclasses.replace(
        loop, history={key: list(values) for key, values in loop.history.items()}
    )


def _check_no_earlier_run(checkpointer: TrainingCheckpointer, directory: Any) -> None:
    """Raises `ValueError` when a fresh start would write into an earlier run's checkpoints.

    Its saves would interleave with that run's steps (and a save older than
    its newest step is refused), so a later resume would mix the two runs.
    """
    steps = checkpointer.steps() + checkpointer.steps("best")
    if steps:
        checkpointer.close()
        raise ValueError(
            f"fit: checkpoint_dir {directory} holds checkpoints of an earlier run (latest "
            f"step {max(steps)}); pass resume=True to continue it, or use an empty folder"
        )


def _check_resume_seed(saved_key: Array, seed_key: Array, seed: int) -> None:
    if not np.array_equal(jax.random.key_data(saved_key), jax.random.key_data(seed_key)):
        raise ValueError(
            f"fit: the checkpoint was written by a run with another seed than seed={seed}; "
            "resume with the original seed"
        )


def _finished(loop: LoopState, epochs: int, max_steps: int | None) -> bool:
    """Whether `loop` has nothing left to train: stopped, or every epoch or step done."""
    return (
        loop.stopped_early
        or loop.stopped_on_budget
        or loop.epoch >= epochs
        or (max_steps is not None and loop.step >= max_steps)
    )


def _updates_until(stop: int, step: int, count: int, warmup_steps: int) -> int:
    """The update count at step `stop`, were every step from `step` on to apply its update.

    The steps so far that applied none (`step - count` of them) are not
    counted. Above `warmup_steps` and not below `count`, as
    `with_schedule_steps` needs.
    """
    return max(stop - (step - count), warmup_steps + 1, count)


def _refit_gives_way(
    loop: LoopState,
    time_budget: float | None,
    refitted: WarmupCosine | None,
    count: int | None,
) -> str | None:
    """Why a resumed checkpoint's budget-refitted schedule no longer fits the run, or None.

    Read before `fit` clears a budget stop. The refit ended the cosine where
    the budget it was fitted to would stop the run: a run that goes on past
    that stop (a larger budget, none, or another one) would train its extra
    steps at the end rate, 0 for the usual schedule, and so not at all.
    Checkpoints written before `schedule_budget` was kept name no budget:
    for them only the stop and the cosine's end tell.
    """
    if refitted is None or count is None:
        return None
    if loop.stopped_on_budget and (time_budget is None or loop.seconds < time_budget):
        return "the run stopped on its time budget there and now trains on under " + (
            "no time budget" if time_budget is None else f"one of {duration_text(time_budget)}"
        )
    if loop.schedule_budget is not None and time_budget != loop.schedule_budget:
        return f"that fitted a time budget of {duration_text(loop.schedule_budget)}, not " + (
            "no time budget" if time_budget is None else duration_text(time_budget)
        )
    return None


def _agreeing_fields(first: WarmupCosine, second: WarmupCosine) -> dict[str, bool]:
    """Which of the four numbers two schedules share, as the optimizer state keeps them
    (float32)."""
    return {
        field.name: np.float32(getattr(first, field.name))
        == np.float32(getattr(second, field.name))
        for field in dataclasses.fields(WarmupCosine)
    }


def _same_schedule(first: WarmupCosine, second: WarmupCosine) -> bool:
    """Whether two schedules agree in all four numbers (`_agreeing_fields`)."""
    return all(_agreeing_fields(first, second).values())


def _resume_record(step: int, before: WarmupCosine, time_budget: float | None) -> dict[str, Any]:
    """What `LoopState.resumed` keeps of a resume at `step` that changed the schedule.

    `before` is the schedule the steps up to `step` trained on (the
    checkpoint's, refitted by `time_budget` when that is not None): enough
    to tell the run from an uninterrupted one and to repeat its parts. No
    times: two runs of the same parts record the same.
    """
    return {
        "at_step": int(step),
        # In applied updates, as the schedule counts them (skipped steps apply none).
        "schedule_steps": round(float(before.total_steps)),
        "warmup_steps": round(float(before.warmup_steps)),
        "peak_lr": float(before.peak_lr),
        "end_lr": float(before.end_lr),
        "refitted_by_time_budget": time_budget,
    }


def _schedule_text(schedule: WarmupCosine) -> str:
    """`schedule`'s four numbers, as the resume warnings name them."""
    return (
        f"warmup {round(schedule.warmup_steps)}, peak {schedule.peak_lr:.3g}, end "
        f"{schedule.end_lr:.3g} at step {round(schedule.total_steps)}"
    )


def _steps_left_at_the_checkpoints_pace(loop: LoopState, time_budget: float | None) -> int | None:
    """The step where `time_budget` stops a resumed run at its checkpoint's pace, or None.

    The pace, `loop.seconds / loop.step`, includes the compilation and the
    evaluations: it errs on the short side, which the live refit corrects.
    """
    if time_budget is None or loop.step == 0 or loop.seconds <= 0:
        return None
    return loop.step + max(0, math.floor((time_budget - loop.seconds) * loop.step / loop.seconds))


def _refit_gives_way_message(
    step: int,
    reason: str,
    refitted: WarmupCosine,
    planned: WarmupCosine,
    resumed: WarmupCosine,
    fitted: int | None,
    count: int,
    time_budget: float | None,
) -> str:
    """The warning of a resume that leaves the checkpoint's refitted schedule for the caller's.

    `resumed` is the caller's schedule as the rest starts on it: refitted to
    end at step `fitted` when the time left at the checkpoint's pace is short of it.
    """
    refit_now = (
        ""
        if fitted is None
        else f", refitted to end at step {fitted} (what the time left allows at the "
        "checkpoint's pace),"
    )
    refit_again = (
        ""
        if time_budget is None
        else f"; the time budget of {duration_text(time_budget)} refits it anew to the time "
        "left once the step time is measured"
    )
    return (
        f"resuming at step {step}: the time budget had refitted the learning-rate schedule to "
        f"end at step {round(refitted.total_steps)}, and {reason}, where it would train at its "
        f"end rate {refitted.end_lr:.3g}: the rest follows this run's schedule "
        f"({_schedule_text(planned)}){refit_now} from the rate {float(resumed(count)):.3g} "
        f"(the refitted one gives {float(refitted(count)):.3g} there){refit_again}"
    )


def _warn_if_the_schedule_has_ended(
    schedule: WarmupCosine | None, count: int, step: int, warn: Callable[[str], None]
) -> None:
    """Warns when a resumed run goes on past the end of a schedule that ends at rate 0.

    Its steps then apply updates of size 0 (the weight decay scales with the
    rate too): the parameters do not change, the time is wasted.
    """
    if schedule is None or schedule.end_lr != 0.0 or count < schedule.total_steps:
        return
    warn(
        f"resuming at step {step} past the end of the learning-rate schedule "
        f"({_schedule_text(schedule)}): the steps left train at its end rate 0 and change "
        "nothing; plan a schedule with more total_steps (or end_lr > 0)"
    )


def _announce_another_schedule(
    written: WarmupCosine | None,
    planned: WarmupCosine,
    step: int,
    count: int,
    warn: Callable[[str], None],
) -> None:
    """Says when a resume goes on along another schedule than its checkpoint's.

    A raised `max_steps` (or another warmup, peak or end rate) re-plans the
    schedule: the steps done followed the checkpoint's, the rest follow the
    new one from the rate it gives at the update count `count` (what the
    schedule reads), a jump in the learning rate the caller should know of.
    All four numbers are compared as the optimizer state keeps them (float32).
    """
    if written is None:
        return
    same = _agreeing_fields(written, planned)
    if all(same.values()):
        return
    changes = []
    if not (same["total_steps"] and same["warmup_steps"]):
        changes.append(
            f"the checkpoint's ends at step {round(written.total_steps)} (warmup "
            f"{round(written.warmup_steps)}), this run's at step {round(planned.total_steps)} "
            f"(warmup {round(planned.warmup_steps)})"
        )
    changes.append(
        f"the rate goes on from {float(planned(count)):.3g} (the checkpoint's schedule gives "
        f"{float(written(count)):.3g} there)"
    )
    if not same["peak_lr"]:
        changes.append(f"peak rate {planned.peak_lr:.3g} (the checkpoint's {written.peak_lr:.3g})")
    if not same["end_lr"]:
        changes.append(f"end rate {planned.end_lr:.3g} (the checkpoint's {written.end_lr:.3g})")
    warn(f"resuming at step {step} on another learning-rate schedule: " + "; ".join(changes))
