"""The clipping experiment: QAT training at an aggressive learning rate, with and without clipping.

Two arms share everything but the optimizer: `make_optimizer(lr,
clip_norm=c)` (clip by global norm, then AdamW) against `make_optimizer(lr,
clip_norm=None)` (AdamW alone). Each arm trains the same model from scratch
over the same seeds; a seed fixes the initialization, the dropout keys and
the order of the training batches, so the arms are paired run by run. The
learning rate is constant (no warmup, no decay) to keep the stress on.

The model is passed in (the CLI passes the QAT TFT; `qat` is not imported
here) and must take `calibrate`: steps below `calibrate_steps` run with the
activation observers updating, later ones with them frozen.

The runs use `tft_jax.train.train_step` in a plain loop rather than `fit`,
because the experiment records every step's loss and gradient norm (before
clipping), which `fit` does not report.

A run *diverged* when a step was skipped for a non-finite loss or gradient,
a validation loss is not finite, or a loss exceeds `explode_factor` times
its value before training moved: an evaluation interval's mean training loss
against the loss of the first applied step (computed with the initial
parameters, before any update), a validation loss against the validation
loss of the freshly initialised model (`initial_val_loss`). The baselines
precede every update, so an explosion within the first interval is caught
too (a baseline taken from the first interval would contain it). An
interval without an applied step (every batch without an observed target)
has no training loss (NaN: no data) and is left out of the rule.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from tft_jax.data import WindowSet
from tft_jax.evaluation import epoch_batches, evenly_spaced, fixed_batches
from tft_jax.train import (
    Batch,
    TrainState,
    create_train_state,
    evaluate,
    make_optimizer,
    step_key,
    train_step,
)


@dataclasses.dataclass(frozen=True)
class ClippingSettings:
    """What the clipping experiment runs.

    The defaults come from pilot runs of the default model on the pedestrian
    data: at learning rate 0.2 (about 70 times the demo's peak of 3e-3)
    training is visibly unstable (loss spikes above its initial value) but
    stays finite, and unclipped gradient norms have a median of
    0.04-0.09 and a 95th percentile of 0.2-0.36 (the first steps reach
    30-50). A threshold of 1.0 clipped only the first steps (1% of them), so
    the default 0.05 sits at the median: the larger half of the steps is
    clipped.

    Attributes:
      learning_rate: the constant (aggressive) AdamW learning rate of both arms.
      clip_norm: the global-norm threshold of the clipped arm.
      seeds: one run per seed and arm (distinct ints in 0..2**32 - 1; a list
        or a 1-D array is kept as a tuple).
      steps: training steps per run.
      batch_size: windows per step.
      eval_every: steps between recorded points (mean training loss since the
        last point, validation loss).
      calibrate_steps: steps with the observers updating (an int >= 0); None =
        every step.
      explode_factor: divergence threshold (finite, > 1): an interval's mean
        training loss above this times the first applied step's loss, or a
        validation loss above this times the initial model's, is divergence
        (both baselines come before any update).
      validation_windows: at most this many validation windows per evaluation
        (evenly spaced, rounded down to a multiple of `batch_size`; at least
        `batch_size`).
      weight_decay: AdamW weight decay of both arms.

    NumPy numbers are taken and kept as Python ints and floats (the settings
    are hashed and written to JSON); bools are refused. A bad value is a
    `ValueError` naming the field.
    """

    learning_rate: float = 0.2
    clip_norm: float = 0.05
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    steps: int = 150
    batch_size: int = 64
    eval_every: int = 10
    calibrate_steps: int | None = None
    explode_factor: float = 3.0
    validation_windows: int = 256
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        # NumPy numbers (np.int64 steps, np.float32 norms) are taken as the Python numbers
        # they hold: the settings are written to JSON and hashed.
        for name in ("steps", "batch_size", "eval_every", "validation_windows"):
            value = getattr(self, name)
            if not _is_integer(value) or value < 1:
                raise ValueError(f"ClippingSettings.{name} must be an int >= 1, got {value!r}")
            object.__setattr__(self, name, int(value))
        # Validation runs in whole batches: fewer windows than one batch would mean more.
        if self.validation_windows < self.batch_size:
            raise ValueError(
                f"ClippingSettings.validation_windows must be >= ClippingSettings.batch_size "
                f"({self.batch_size}): validation runs in whole batches, got "
                f"{self.validation_windows}"
            )
        calibrate = self.calibrate_steps
        if calibrate is not None:
            if not _is_integer(calibrate) or calibrate < 0:
                raise ValueError(
                    "ClippingSettings.calibrate_steps must be None or an int >= 0, got "
                    f"{calibrate!r}"
                )
            object.__setattr__(self, "calibrate_steps", int(calibrate))
        # Seeds key the initialization and the batch order (NumPy wants them >= 0; a JAX
        # key keeps a seed's low 32 bits, so seeds 2**32 apart would be one run twice).
        # A list or an array is kept as a tuple: the settings are hashable.
        seeds = self.seeds
        listed = isinstance(seeds, tuple | list) or (
            isinstance(seeds, np.ndarray) and seeds.ndim == 1
        )
        if not listed or not all(_is_integer(seed) and 0 <= seed < 2**32 for seed in seeds):
            raise ValueError(
                f"ClippingSettings.seeds must be a tuple of ints in 0..2**32 - 1, got {seeds!r}"
            )
        object.__setattr__(self, "seeds", tuple(int(seed) for seed in seeds))
        if len(self.seeds) < 1 or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(
                f"ClippingSettings.seeds must be at least one distinct seed, got {seeds!r}"
            )
        for name, allow_zero in (
            ("learning_rate", False),
            ("clip_norm", False),
            ("weight_decay", True),
        ):
            value = getattr(self, name)
            if not _is_real(value) or not (value >= 0 if allow_zero else value > 0):
                bound = ">= 0" if allow_zero else "> 0"
                raise ValueError(
                    f"ClippingSettings.{name} must be a finite number {bound}, got {value!r}"
                )
            object.__setattr__(self, name, float(value))
        # An infinite factor would switch the loss rule off: only non-finite losses and
        # skipped steps would count as divergence.
        factor = self.explode_factor
        if not _is_real(factor) or not factor > 1.0:
            raise ValueError(
                f"ClippingSettings.explode_factor must be a finite number > 1, got {factor!r}"
            )
        object.__setattr__(self, "explode_factor", float(factor))


def _is_integer(value: Any) -> bool:
    """An int or a NumPy integer, not a bool (True is no count of 1)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def _is_real(value: Any) -> bool:
    """A finite real number (NumPy's included), not a bool."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool | np.bool_)
        and math.isfinite(value)
    )


def _check_threshold(function: str, name: str, value: Any, bound: float) -> None:
    """Raises `ValueError` unless `value` is a finite number above `bound`."""
    if not _is_real(value) or not value > bound:
        raise ValueError(f"{function}: {name} must be a finite number > {bound:g}, got {value!r}")


# How `tft-jax experiment clipping` writes a non-finite float in strict JSON
# (`clipping.json`): null would not tell NaN (no data, a NaN loss) from an overflow.
NON_FINITE_STRINGS: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _floats(values: Iterable[Any], name: str = "values") -> np.ndarray:
    """`values` as float64, with None and the strings of `NON_FINITE_STRINGS` as floats.

    None is strict JSON's null (NaN); "nan", "inf" and "-inf" are how
    `clipping.json` writes non-finite values. Any other string is a
    `TypeError` naming `name`.
    """
    floats = []
    for position, value in enumerate(values):
        if isinstance(value, str):
            if value not in NON_FINITE_STRINGS:
                raise TypeError(
                    f"{name} must hold numbers, None or one of {list(NON_FINITE_STRINGS)}, got "
                    f"{value!r} at position {position}"
                )
            value = NON_FINITE_STRINGS[value]
        floats.append(math.nan if value is None else value)
    return np.array(floats, dtype=np.float64)


def applied_steps(history: Mapping[str, Sequence[Any]]) -> np.ndarray:
    """Per step, whether it was applied: neither skipped nor without an observed target.

    The other steps changed nothing: a skipped one had a non-finite loss or
    gradient, one without an observed target a zero loss and gradient.
    """
    observed = np.asarray(history["step_observed"], dtype=np.float64)
    skipped = np.asarray(history["step_skipped"], dtype=np.int64)
    return (observed > 0) & (skipped == 0)


def diverged(history: Mapping[str, Sequence[Any]], explode_factor: float) -> bool:
    """Whether a run of `train_run` diverged (the rule is in the module docstring).

    Args:
      history: a record of `train_run`: per point `step`, `train_loss`,
        `val_loss` and `skipped_steps`; per step `step_loss`,
        `step_observed` and `step_skipped`; and `initial_val_loss`. A loss
        may be a float, None (NaN) or one of the strings "nan", "inf" and
        "-inf" (`NON_FINITE_STRINGS`), as a run read back from
        `clipping.json` holds them.
      explode_factor: the threshold, a multiple of each baseline: a finite
        number > 1 (`ValueError` otherwise; at 1 or below a healthy run would
        diverge, at infinity no loss could).
    """
    _check_threshold("diverged", "explode_factor", explode_factor, 1.0)
    if any(history["step_skipped"]) or (
        history["skipped_steps"] and history["skipped_steps"][-1] > 0
    ):
        return True
    val = _floats([history["initial_val_loss"], *history["val_loss"]], "initial_val_loss, val_loss")
    if not np.all(np.isfinite(val)) or np.any(val[1:] > explode_factor * val[0]):
        return True
    applied = applied_steps(history)
    if not applied.any():
        return False  # no training loss at all: nothing to compare
    # Interval k covers the steps from the previous point up to `step[k]`.
    ends = np.asarray(history["step"], dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    with_data = np.array(
        [applied[start:end].any() for start, end in zip(starts, ends, strict=True)], dtype=bool
    )
    train = _floats(history["train_loss"], "train_loss")[with_data]
    first = np.argmax(applied)  # the first applied step
    baseline = _floats(history["step_loss"], "step_loss")[first]
    if not (np.all(np.isfinite(train)) and math.isfinite(baseline)):
        return True
    return bool(np.any(train > explode_factor * baseline))


def clipped_fraction(history: Mapping[str, Sequence[Any]], clip_norm: float) -> float:
    """The share of the applied steps whose gradient norm (before clipping) exceeded `clip_norm`.

    Those steps were clipped, or in the unclipped arm would have been. Only
    applied steps count (`applied_steps`): a skipped step's norm may be
    NaN or inf and it changed nothing, a step without an observed target has
    a zero gradient. NaN when the run applied no step. A norm may be a float,
    None (NaN) or one of `NON_FINITE_STRINGS`, as in `clipping.json`.
    `clip_norm` must be a finite number > 0 (`ValueError` otherwise: every
    norm exceeds 0 or less, none exceeds NaN).
    """
    _check_threshold("clipped_fraction", "clip_norm", clip_norm, 0.0)
    applied = applied_steps(history)
    if not applied.any():
        return math.nan
    norms = _floats(history["step_grad_norm"], "step_grad_norm")[applied]
    return float(np.mean(norms > clip_norm))


def train_run(
    state: TrainState,
    batches: Callable[[int], Iterable[Batch]],
    val_batches: Sequence[Batch],
    *,
    steps: int,
    eval_every: int,
    seed: int,
    calibrate_steps: int,
) -> dict[str, Any]:
    """Trains `state` for `steps` steps, recording every step and every `eval_every` steps.

    Args:
      state: the initial state (donated).
      batches: `epoch -> training batches`, cycled through epochs as needed
        (an epoch without a batch raises `ValueError`).
      val_batches: the validation batches.
      steps: number of training steps.
      eval_every: steps between recorded points (and after the last step).
      seed: the dropout keys are `step_key(key(seed), step)`, as in `fit`.
      calibrate_steps: steps `< calibrate_steps` run with `calibrate=True`.

    Returns:
      `initial_val_loss`, the validation loss of `state` before the first
      step (the divergence baseline), and lists: per step `step_loss`,
      `step_grad_norm` (before clipping), `step_observed` (observed targets;
      0: nothing applied) and `step_skipped` (1: skipped for a non-finite
      loss or gradient); per point `step`, `train_loss` (mean loss per
      observed target of the applied steps since the last point, as
      `fit`'s; NaN if none: no data), `val_loss` and `skipped_steps`
      (running count).
    """
    for name, value in (("steps", steps), ("eval_every", eval_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"train_run: {name} must be an int >= 1, got {value!r}")
    seed_key = jax.random.key(seed)
    step_metrics: list[dict[str, Any]] = []
    record: dict[str, list] = {"step": [], "train_loss": [], "val_loss": [], "skipped_steps": []}
    initial_val_loss = math.nan
    epoch, step, since = 0, 0, 0
    while step < steps:
        epoch_started = step
        for batch in batches(epoch):
            if step == 0:  # here, not before the loop: an empty first epoch raises below
                initial_val_loss = evaluate(state, val_batches, calibrate=False)
            state, metrics = train_step(
                state, batch, step_key(seed_key, step), calibrate=step < calibrate_steps
            )
            step_metrics.append(metrics)
            step, since = step + 1, since + 1
            if step % eval_every == 0 or step == steps:
                recent = jax.device_get(step_metrics[-since:])
                losses = np.array([m["loss"] for m in recent], dtype=np.float64)
                observed = np.array([m["observed"] for m in recent], dtype=np.float64)
                # The applied steps: neither skipped nor without an observed target, each
                # weighted by its observed targets (the mean per target, as `fit`'s).
                kept = np.array([m["skipped"] == 0 and m["observed"] > 0 for m in recent])
                record["step"].append(step)
                record["train_loss"].append(
                    float(np.average(losses[kept], weights=observed[kept]))
                    if kept.any()
                    else math.nan
                )
                record["val_loss"].append(evaluate(state, val_batches, calibrate=False))
                record["skipped_steps"].append(int(state.skipped_steps))
                since = 0
            if step == steps:
                break
        if step == epoch_started:  # the loop would never end
            raise ValueError(f"train_run: batches({epoch}) gave no batch")
        epoch += 1
    host = jax.device_get(step_metrics)
    return {
        **record,
        "initial_val_loss": initial_val_loss,
        "step_loss": [float(m["loss"]) for m in host],
        "step_grad_norm": [float(m["grad_norm"]) for m in host],
        "step_observed": [int(m["observed"]) for m in host],
        "step_skipped": [int(m["skipped"]) for m in host],
    }


def _summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    finals = np.array([run["final_val_loss"] for run in runs], dtype=np.float64)
    finite = finals[np.isfinite(finals)]
    fractions = _floats(run["clipped_fraction"] for run in runs)
    fractions = fractions[np.isfinite(fractions)]  # NaN: a run that applied no step
    return {
        "runs": len(runs),
        "diverged": int(sum(run["diverged"] for run in runs)),
        "skipped_steps": int(sum(run["skipped_total"] for run in runs)),
        "clipped_fraction_mean": float(np.mean(fractions)) if fractions.size else None,
        "final_val_loss_median": float(np.median(finite)) if finite.size else None,
        "final_val_loss_mean": float(np.mean(finite)) if finite.size else None,
        "final_val_loss_min": float(np.min(finite)) if finite.size else None,
        "final_val_loss_max": float(np.max(finite)) if finite.size else None,
        "non_finite_final_val_loss": int(finals.size - finite.size),
    }


def check_splits(
    train_windows: WindowSet, validation_windows: WindowSet, settings: ClippingSettings
) -> None:
    """Raises unless each split holds at least one batch of `settings.batch_size` windows.

    `clipping_experiment` checks this first; a caller can check it before
    building the model. An empty validation split is a matter of how the
    table was split (`prepare_dataset`'s `validation_fraction` or
    `validation_start`), which no batch size mends.

    Raises:
      TypeError: for `settings` that are not a `ClippingSettings`.
      ValueError: naming the split, its windows and what to change.
    """
    if not isinstance(settings, ClippingSettings):
        raise TypeError(f"settings must be a ClippingSettings, got {type(settings).__name__}")
    batch_size = settings.batch_size
    if len(validation_windows) == 0:
        raise ValueError(
            "the validation split has no windows, so the runs cannot be evaluated; give it "
            "some with validation_fraction > 0 or validation_start"
        )
    if len(validation_windows) < batch_size:
        raise ValueError(
            f"the validation split has {len(validation_windows)} windows, fewer than one batch "
            f"of {batch_size}; lower ClippingSettings.batch_size"
        )
    if len(train_windows) == 0:
        raise ValueError("the training split has no windows: nothing to train on")
    if len(train_windows) < batch_size:
        raise ValueError(
            f"the training split has {len(train_windows)} windows, fewer than one batch of "
            f"{batch_size}; lower ClippingSettings.batch_size"
        )


def clipping_experiment(
    model: Any,
    train_windows: WindowSet,
    validation_windows: WindowSet,
    settings: ClippingSettings = ClippingSettings(),
    *,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Trains `model` from scratch for every (arm, seed) and collects the curves.

    Args:
      model: a Flax module as `tft_jax.train.create_train_state` takes that
        accepts `calibrate` (the QAT TFT).
      train_windows: the training windows.
      validation_windows: the validation windows (subsampled, see settings).
      settings: the experiment's settings.
      on_run: called with each finished run's record (for progress output).

    Raises:
      ValueError: for a split with fewer windows than one batch (see
        `check_splits`), before any model is built.

    Returns:
      A JSON-ready dict: `settings`; `runs`, one record per run with `clip`,
      `seed`, the record of `train_run` (`initial_val_loss`; per step
      `step_loss`, `step_grad_norm`, `step_observed`, `step_skipped`; per
      point `step`, `train_loss`, `val_loss`, `skipped_steps`),
      `skipped_total`, `final_val_loss`, `best_val_loss`, `diverged`,
      `clipped_fraction` (see `clipped_fraction`: the share of the applied
      steps whose gradient norm exceeded `clip_norm`, i.e. that were or would
      have been clipped) and `seconds` (wall time; each arm's first run includes
      compiling that arm's steps); `summary` per arm (`with_clipping`,
      `without_clipping`): runs, diverged, skipped steps, the clipped
      fraction's mean over runs that applied a step and the final validation
      loss median/mean/min/max over finite runs; `seconds` in total.
    """
    check_splits(train_windows, validation_windows, settings)
    # Whole batches, chosen evenly over the split before batching: rounding the split's
    # own size down afterwards would drop its last windows and misreport the count.
    count = min(settings.validation_windows, len(validation_windows))
    count = count // settings.batch_size * settings.batch_size
    validation = evenly_spaced(validation_windows, count)
    val_batches = fixed_batches(validation, settings.batch_size)
    calibrate_steps = (
        settings.steps if settings.calibrate_steps is None else settings.calibrate_steps
    )
    sample = val_batches[0]
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    for clip in (True, False):
        # One optimizer object per arm: the jitted step is compiled once per arm.
        tx = make_optimizer(
            settings.learning_rate,
            clip_norm=settings.clip_norm if clip else None,
            weight_decay=settings.weight_decay,
        )
        for seed in settings.seeds:
            run_started = time.perf_counter()
            state = create_train_state(model, tx, jax.random.key(seed), sample)
            curves = train_run(
                state,
                epoch_batches(train_windows, settings.batch_size, seed),
                val_batches,
                steps=settings.steps,
                eval_every=settings.eval_every,
                seed=seed,
                calibrate_steps=calibrate_steps,
            )
            val = curves["val_loss"]
            finite_val = [v for v in val if math.isfinite(v)]
            run = {
                "clip": clip,
                "seed": seed,
                **curves,
                "skipped_total": curves["skipped_steps"][-1],
                "final_val_loss": val[-1] if val else math.nan,
                "best_val_loss": min(finite_val) if finite_val else math.nan,
                "diverged": diverged(curves, settings.explode_factor),
                "clipped_fraction": clipped_fraction(curves, settings.clip_norm),
                "seconds": time.perf_counter() - run_started,
            }
            runs.append(run)
            if on_run is not None:
                on_run(run)
    return {
        "settings": {
            **dataclasses.asdict(settings),
            "seeds": list(settings.seeds),
            "calibrate_steps": calibrate_steps,
            "train_windows": len(train_windows),
            "validation_windows": len(validation),
        },
        "runs": runs,
        "summary": {
            "with_clipping": _summary([run for run in runs if run["clip"]]),
            "without_clipping": _summary([run for run in runs if not run["clip"]]),
        },
        "seconds": time.perf_counter() - started,
    }
