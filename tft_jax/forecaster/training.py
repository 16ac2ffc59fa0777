"""The two training phases of a forecasting run: FP32 training, then QAT fine-tuning.

Both read their settings from the config dataclasses and train data-parallel
over every device (`tft_jax.distributed`); in a multi-process run each
process passes its own `rows` of every global batch.
"""

from __future__ import annotations

import math
import pathlib
import sys
import time
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np

import qat
from tft_jax.caller_frame import user_stacklevel
from tft_jax.data import PreparedDataset
from tft_jax.distributed import (
    data_mesh,
    is_primary,
    local_rows,
    place_state,
    shard_batch,
    to_host,
)
from tft_jax.evaluation import (
    epoch_batches,
    evenly_spaced,
    fixed_batches,
    padded_batches,
)
from tft_jax.forecaster.config import QATTrainingConfig, TrainingConfig
from tft_jax.model import TemporalFusionTransformer
from tft_jax.schedules import WarmupCosine
from tft_jax.train import (
    Batch,
    create_train_state,
    fit,
    make_optimizer,
    model_inputs,
    warmup_cosine_schedule,
)


class PhaseResult(NamedTuple):
    """What a training phase returns: the best variables (host copies), losses and step counts."""

    variables: dict[str, Any]
    history: dict[str, list]
    settings: dict[str, Any]


def announce(quiet: bool, text: str) -> None:
    """Prints one line of a run's progress to stderr, on process 0 only, unless `quiet`."""
    if not quiet and is_primary():
        print(text, file=sys.stderr, flush=True)


def sample_batch(dataset: PreparedDataset, batch_size: int, rows: slice = slice(None)) -> Batch:
    """A fixed batch of training windows, to shape the model's variables."""
    return fixed_batches(evenly_spaced(dataset.train, batch_size), batch_size, rows)[0]


def validation_batches(dataset: PreparedDataset, training: TrainingConfig) -> list[Batch]:
    """The batches `fit` validates on, over `training.validation_windows` evenly spaced windows.

    The count (the split's size when it holds fewer) is rounded down to
    whole training batches, at least one, and the windows are spread over
    the whole split: windows come series by series, so the split's first
    windows would leave its last series unvalidated. In one process the
    windows come in batches of `eval_batch_size` when that splits evenly
    over the devices, the last filled up by repeating its final window with
    those targets masked out (`evaluate` counts observed targets only, so the
    loss is the windows' own): the forecasts use batches of that size too,
    so one compiled forward serves both. Otherwise, and with several
    processes (each holding its rows of every global batch), they come in
    batches of `batch_size`.
    """
    batch_size = training.batch_size
    if len(dataset.validation) == 0:  # no batch size helps
        raise ValueError(
            "the validation split has no windows (fit validates every run: for its early "
            "stopping and its best state); raise the validation fraction"
        )
    if len(dataset.validation) < batch_size:
        raise ValueError(
            f"the validation split has {len(dataset.validation)} windows, fewer than one "
            f"batch of {batch_size}; lower the batch size or raise the validation fraction"
        )
    available = min(training.validation_windows, len(dataset.validation))
    count = max(batch_size, available // batch_size * batch_size)
    windows = evenly_spaced(dataset.validation, count)
    eval_size = training.eval_batch_size
    if jax.process_count() > 1 or eval_size % jax.device_count():
        return fixed_batches(windows, batch_size, local_rows(batch_size))
    return [_padding_masked(batch, valid) for batch, valid in padded_batches(windows, eval_size)]


def _padding_masked(batch: Batch, valid: int) -> Batch:
    """`batch` with the targets of its rows from `valid` on masked out (filled-up rows)."""
    mask = np.array(batch.target_mask, dtype=np.float32)
    mask[valid:] = 0.0
    return batch.replace(target_mask=mask)


def steps_of(dataset: PreparedDataset, training: TrainingConfig) -> tuple[int, int]:
    """`(steps per epoch, total steps)` of FP32 training on `dataset`."""
    per_epoch = len(dataset.train) // training.batch_size
    if per_epoch == 0:
        raise ValueError(
            f"the training split has {len(dataset.train)} windows, fewer than one batch of "
            f"{training.batch_size}; lower the batch size"
        )
    total = per_epoch * training.epochs
    return per_epoch, total if training.max_steps is None else min(total, training.max_steps)


def schedule_of(peak: float, total: int, warmup: int | None) -> tuple[WarmupCosine, int]:
    """The warmup + cosine schedule and its warmup steps (default 5% of `total`, at most 200)."""
    warmup = min(200, total // 20) if warmup is None else warmup
    if warmup >= total:
        raise ValueError(f"warmup_steps ({warmup}) must be below the total steps ({total})")
    return warmup_cosine_schedule(peak, total, warmup), warmup


def _resumed_record(resumed: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The settings' `resumed` entry: the resumes that changed the schedule, if any.

    Each names the step it resumed at and the schedule the steps before it
    trained on (`tft_jax.fit.LoopState.resumed`): such a model differs from an
    uninterrupted run's with the same settings. Left out for a run without one,
    whose summary stays as it was.
    """
    return {"resumed": [dict(part) for part in resumed]} if resumed else {}


def train_fp32(
    model: TemporalFusionTransformer,
    dataset: PreparedDataset,
    training: TrainingConfig,
    val_batches: list[Batch],
    checkpoint_dir: pathlib.Path | None,
    resume: bool,
    quiet: bool,
    rows: slice = slice(None),
) -> PhaseResult:
    """FP32 training with the warmup + cosine schedule; the best state by validation loss.

    The schedule's numbers live in the optimizer state (one compiled step
    for any learning rate, warmup and total), and with a time budget `fit`
    shortens the cosine to the steps the budget allows: the settings hold
    the planned `total_steps` and the `schedule_steps` it ended at, and
    `resumed` the resumes that went on along another schedule (if any).
    """
    per_epoch, total = steps_of(dataset, training)
    schedule, warmup = schedule_of(training.learning_rate, total, training.warmup_steps)
    tx = make_optimizer(schedule, clip_norm=training.clip_norm, weight_decay=training.weight_decay)
    state = create_train_state(
        model,
        tx,
        jax.random.key(training.seed),
        sample_batch(dataset, training.batch_size, rows),
    )
    result = fit(
        state,
        epoch_batches(dataset.train, training.batch_size, training.seed, rows),
        val_batches,
        epochs=training.epochs,
        seed=training.seed,
        patience=training.patience,
        eval_every=training.eval_every,
        max_steps=total,
        time_budget=training.time_budget,
        checkpoint_dir=None if checkpoint_dir is None else checkpoint_dir / "fp32",
        resume=resume,
        quiet=quiet,
        label="FP32",
    )
    settings = {
        "steps_per_epoch": per_epoch,
        "total_steps": total,
        # The step training ended at: past `total` for a resume over a later checkpoint.
        "steps_trained": int(to_host(result.state.step)),
        # Where the learning rate's cosine ends: `total` unless the time budget refitted it.
        "schedule_steps": result.schedule_steps,
        "warmup_steps": warmup,
        "stop_reason": result.stop_reason,
        **_resumed_record(result.resumed),
    }
    return PhaseResult(to_host(result.best_state.variables), result.history, settings)


def train_qat(
    qat_model: qat.QATTemporalFusionTransformer,
    fp32_variables: dict[str, Any],
    dataset: PreparedDataset,
    training: TrainingConfig,
    settings: QATTrainingConfig,
    val_batches: list[Batch],
    checkpoint_dir: pathlib.Path | None,
    resume: bool,
    quiet: bool,
    rows: slice = slice(None),
) -> PhaseResult:
    """QAT fine-tuning from the FP32 variables; the best QAT variables by validation loss.

    Calibration first: the activation observers see `calibration_batches`
    training batches (deterministic forward, `qat.calibrate`), each the global
    batch assembled from every process's `rows`; at most one epoch's, with a
    warning when that is fewer (the settings record how many). Then the
    fake-quantized model trains with the observers frozen, except during the first
    `observer_steps` steps, where they keep updating.
    """
    total = int(settings.steps)  # an int already (`_plain_numbers`); the field admits np.integer
    schedule, warmup = schedule_of(settings.learning_rate, total, min(50, total // 10))
    tx = make_optimizer(schedule, clip_norm=training.clip_norm, weight_decay=training.weight_decay)
    sample = sample_batch(dataset, training.batch_size, rows)
    inputs, kwargs = model_inputs(sample)
    mesh = data_mesh()
    # Fresh device buffers: the train step donates its state, the FP32 arrays must survive it.
    variables = place_state(qat.from_fp32(fp32_variables, qat_model, *inputs, **kwargs), mesh)
    calibration = (
        shard_batch(batch, mesh)
        for batch in epoch_batches(dataset.train, training.batch_size, training.seed + 2, rows)(0)
    )
    started = time.perf_counter()
    variables = jax.block_until_ready(
        qat.calibrate(qat_model, variables, calibration, num_batches=settings.calibration_batches)
    )
    seen = min(settings.calibration_batches, len(dataset.train) // training.batch_size)
    if seen < settings.calibration_batches:
        # Fewer than asked for, a repair: warned even when `quiet`, and in the settings.
        warnings.warn(
            f"QATTrainingConfig.calibration_batches is {settings.calibration_batches}, but one "
            f"epoch of training windows holds {seen} batches of {training.batch_size}: the "
            f"activation observers were calibrated on {seen}",
            stacklevel=user_stacklevel(),
        )
    announce(
        quiet,
        f"QAT: calibrated the activation observers on {seen} batches in "
        f"{time.perf_counter() - started:.1f}s",
    )
    state = create_train_state(
        qat_model, tx, jax.random.key(training.seed + 1), sample, variables=variables
    )
    del variables  # the state holds its own copy: one set of QAT variables while training
    per_epoch = len(dataset.train) // training.batch_size
    result = fit(
        state,
        epoch_batches(dataset.train, training.batch_size, training.seed + 1, rows),
        val_batches,
        epochs=max(1, math.ceil(total / per_epoch)),
        seed=training.seed + 1,
        eval_every=min(training.eval_every or total, total),
        max_steps=total,
        time_budget=settings.time_budget,
        checkpoint_dir=None if checkpoint_dir is None else checkpoint_dir / "qat",
        resume=resume,
        calibrate_steps=settings.observer_steps,
        quiet=quiet,
        label="QAT",
    )
    return PhaseResult(
        to_host(result.best_state.variables),
        result.history,
        {
            # The batches the observers saw (at most one epoch's).
            "calibration_batches": seen,
            "total_steps": total,
            "steps_trained": int(to_host(result.state.step)),
            "schedule_steps": result.schedule_steps,
            "warmup_steps": warmup,
            "stop_reason": result.stop_reason,
            **_resumed_record(result.resumed),
        },
    )
