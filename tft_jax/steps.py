"""The jitted steps: one train step, evaluation and prediction.

`train_step` applies the model, takes the quantile loss over the observed
targets, its gradient, and the clipped AdamW update (skipping a step whose
loss or gradient is not finite), for the FP32 TFT and for models with extra
non-trainable collections (the QAT model's `quant_stats`). `evaluate` and
`predict` run the deterministic forward.

Every step takes its batch through `prepare_batch` first: NumPy integers in
the real-valued fields become float32 on the host (`jax.jit` would wrap
int64 values beyond int32's range), and finite float64 values beyond
float32's range raise `ValueError` naming the field (they would become inf).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from tft_jax.batch_padding import ShortBatchFiller, fill_setting, widest
from tft_jax.flat_optimizer import (
    FlatAdamWState,
    flat_updates,
    flatten,
    global_norm,
    is_flat_adamw,
    scheduled_learning_rate,
    unflatten,
)
from tft_jax.inline_threefry import inline_threefry_key
from tft_jax.losses import _as_float, pinball, quantile_loss
from tft_jax.model import check_float32_range
from tft_jax.train_state import (
    REAL_INPUTS,
    Batch,
    TrainState,
    _check_batch,
    _check_rng,
    _check_state,
    _is_traced,
    computes_in_float32,
    model_inputs,
    params_named,
    prepare_batch,
)

Array = Any
PyTree = Any

# ---------------------------------------------------------------------------
# Steps


def _forward(
    state: TrainState,
    trainables: dict[str, PyTree],
    batch: Batch,
    *,
    deterministic: bool,
    rng: Array | None,
    calibrate: bool | None,
) -> tuple[Any, dict[str, PyTree]]:
    """Applies the model; returns its output and the (possibly updated) model state.

    With `calibrate=True` every collection of `model_state` is mutable (the
    QAT observers update); with None the model gets no `calibrate` argument.
    """
    args, kwargs = model_inputs(batch)
    kwargs["deterministic"] = deterministic
    if rng is not None:
        # Same dropout masks; on CPU they are drawn without a loop.
        kwargs["rngs"] = {"dropout": inline_threefry_key(rng)}
    if calibrate is not None:
        kwargs["calibrate"] = calibrate
    variables = {**trainables, **state.model_state}
    if calibrate:
        output, updates = state.apply_fn(
            variables, *args, mutable=list(state.model_state), **kwargs
        )
        return output, {**state.model_state, **updates}
    return state.apply_fn(variables, *args, **kwargs), state.model_state


def _output_quantiles(output: Any, owner: str = "batch_loss") -> Array:
    """`output.quantiles`, or a TypeError saying what the model returned instead.

    Checked while tracing (no cost in the compiled step): a model without the
    field would otherwise fail deep in the loss's trace ("LinearizeTracer has
    no attribute quantiles"). The field must be floating point: integers
    would train with zero gradients, silently, and a complex array would
    lose its imaginary part.
    """
    pred = getattr(output, "quantiles", None)
    if pred is None or not hasattr(pred, "shape"):
        if pred is not None:
            got = f".quantiles of type {type(pred).__name__}"
        elif hasattr(output, "shape"):  # a bare array (a tracer while tracing)
            got = f"an array of shape {tuple(output.shape)}"
        else:
            got = type(output).__name__
        raise TypeError(
            f"{owner}: the model must return an object with an array field .quantiles "
            f"(B, H, Q) (e.g. tft_jax.model.TFTOutput), got {got}"
        )
    if not jnp.issubdtype(pred.dtype, jnp.floating):
        raise TypeError(
            f"{owner}: the model's .quantiles must be floating point (float32, bfloat16, ...), "
            f"got dtype {pred.dtype}"
        )
    return pred


def _check_output_shape(owner: str, output: Any, batch: Batch, quantiles: Sequence[float]) -> None:
    """Raises unless `output.quantiles` is floating point of shape `(B, H, Q)` for `batch`."""
    pred = _output_quantiles(output, owner)
    expected = (*np.shape(batch.target), len(quantiles))
    if tuple(pred.shape) != expected:
        raise ValueError(
            f"{owner}: the model's .quantiles must have shape (B, H, Q) = {expected} for this "
            f"batch and {len(quantiles)} quantile levels, got {tuple(pred.shape)}"
        )


def batch_loss(output: Any, batch: Batch, quantiles: Sequence[float]) -> tuple[Array, Array]:
    """The mean quantile loss of a batch over its observed targets, and their number.

    Without `batch.target_mask` this is `quantile_loss(output.quantiles,
    batch.target, quantiles)` over all `B·H` targets; with it, the mean runs
    over the targets where the mask is nonzero only (0 when there are none).
    NumPy integer targets and masks are made float32 on the host, as
    `quantile_loss` does (`jnp.asarray` would wrap int64 values beyond int32).

    Returns:
      `(loss, count)`: float32 scalars, float32 also for float64 inputs under
      `jax_enable_x64` (the loss is computed in float64 there, then cast).
    """
    pred = _output_quantiles(output)
    if batch.target_mask is None:
        loss = quantile_loss(pred, batch.target, quantiles).astype(jnp.float32)
        return loss, jnp.asarray(np.size(batch.target), jnp.float32)
    target = _as_float("batch_loss", "batch.target", batch.target)
    if pred.shape[:-1] != target.shape:
        raise ValueError(
            f"batch_loss: target must have shape {tuple(pred.shape[:-1])}, got {target.shape}"
        )
    # The checks `quantile_loss` makes on the unmasked path: without them a wrong
    # number of levels broadcasts against the quantile axis, silently.
    level_values = np.asarray(quantiles, np.float64).reshape(-1)
    if level_values.size == 0 or pred.shape[-1] != level_values.size:
        raise ValueError(
            f"batch_loss: output.quantiles must have shape (..., {level_values.size}) for "
            f"{level_values.size} quantiles, got {tuple(pred.shape)}"
        )
    if not np.all((level_values > 0.0) & (level_values < 1.0)):
        raise ValueError(f"batch_loss: quantiles must lie in (0, 1), got {level_values.tolist()}")
    observed = _as_float("batch_loss", "batch.target_mask", batch.target_mask) != 0
    levels = jnp.asarray(level_values, jnp.float32)
    losses = pinball(pred.astype(jnp.float32), target[..., None].astype(jnp.float32), levels)
    # `where`, not a product: a filled gap may hold NaN, and NaN * 0 is NaN.
    total = jnp.sum(jnp.where(observed[..., None], losses, 0.0))
    count = jnp.sum(observed).astype(jnp.float32)
    return total / jnp.maximum(count * levels.size, 1.0), count


def _clipped_norm(grad_norm: Array, clip_norm: float | None) -> Array:
    """The global norm after `optax.clip_by_global_norm(clip_norm)`, from the norm before.

    Clipping leaves gradients of norm `g < c` unchanged and rescales the
    others by `c / g`, so the clipped norm is `min(g, c)`: no second pass
    over the gradients. A non-finite `g` gives NaN, as clipping such
    gradients does (`t / g * c` is NaN for an infinite or NaN leaf).
    """
    if clip_norm is None:
        return grad_norm
    return jnp.where(jnp.isfinite(grad_norm), jnp.minimum(grad_norm, clip_norm), jnp.nan)


def _keep_if(condition: Array, update: Callable[[], PyTree], old: PyTree) -> PyTree:
    """`update()` when `condition` (a scalar) holds, else `old`: one `lax.cond` for the tree.

    A single conditional rather than a select per leaf: the skipped branch
    never runs the update, and the step has one operation instead of one
    `select` (and a copy of the donated buffer) per parameter and optimizer
    leaf.
    """
    return jax.lax.cond(condition, update, lambda: old)


def _flat_update_if(
    condition: Array,
    state: TrainState,
    grads: dict[str, PyTree],
    trainables: dict[str, PyTree],
    model_state: dict[str, PyTree],
    flat_grads: Array,
    grad_norm: Array,
) -> tuple[dict[str, PyTree], PyTree, dict[str, PyTree]]:
    """A `flat_adamw` step when `condition` holds, else the state kept (params plus a zero update).

    `flat_grads` is `flatten(grads)` and `grad_norm` its norm, computed once
    for the step's metrics and reused here.

    The conditional computes only the optimizer's flat vectors (the update,
    the moments) and the model state; the update is split into the leaves
    and added after it. Carrying three vectors instead of every parameter
    leaf through the conditional makes a small model's step faster. The
    formula is that of `_keep_if` around `tx.update` + `apply_updates`; XLA
    fuses it differently, so float32 results may differ in the last bit.
    """
    size = state.opt_state.mu.shape[0]

    def update() -> tuple[Array, FlatAdamWState, dict[str, PyTree]]:
        vector, opt_state = flat_updates(
            state.tx,
            grads,
            state.opt_state,
            trainables,
            flat_grads=flat_grads,
            grad_norm=grad_norm,
        )
        return vector, opt_state, model_state

    def keep() -> tuple[Array, FlatAdamWState, dict[str, PyTree]]:
        return jnp.zeros((size,), jnp.float32), state.opt_state, state.model_state

    vector, opt_state, model_state = jax.lax.cond(condition, update, keep)
    return optax.apply_updates(trainables, unflatten(vector, trainables)), opt_state, model_state


# XLA options for `train_step(..., compiler_options=...)` that may trade step
# speed for compile speed: LLVM at -O1 instead of -O2. Whether it pays depends
# on the CPU: BENCHMARKS.md has hosts where the step compiled much faster at
# the same speed, and one where it compiled no faster and ran slower. (For
# `fit`, the same through `XLA_FLAGS=--xla_backend_optimization_level=1`.)
FAST_COMPILE_OPTIONS: dict[str, Any] = {"xla_backend_optimization_level": 1}
_STEP_JITS: dict[tuple[tuple[str, Any], ...], Any] = {}


def _train_step(
    state: TrainState, batch: Batch, rng: Array, calibrate: bool | None
) -> tuple[TrainState, dict[str, Array]]:
    """The body of `train_step` (jitted by `_jitted_train_step`)."""

    def loss_fn(trainables: dict[str, PyTree]) -> tuple[Array, tuple[dict[str, PyTree], Array]]:
        output, model_state = _forward(
            state, trainables, batch, deterministic=False, rng=rng, calibrate=calibrate
        )
        loss, count = batch_loss(output, batch, state.quantiles)
        return loss, (model_state, count)

    trainables = state.trainables()
    (loss, (model_state, observed)), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainables)
    # One reduction over the concatenated gradients, not one per parameter leaf.
    # The flat optimizer reuses the vector and its norm inside its conditional.
    flat_grads = flatten(grads) if is_flat_adamw(state.tx) else None
    grad_norm = global_norm(grads if flat_grads is None else flat_grads)

    # A NaN or inf in any gradient makes the global norm non-finite, so one
    # scalar test covers every leaf (and a norm overflowing float32 as well).
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    # A schedule is checked at step 0 only; a rate that turns NaN, inf or
    # negative later would turn every parameter into NaN (and skip every
    # later step) or climb the loss. One scalar: with finite gradients, a
    # `flat_adamw` update is finite exactly when its rate is.
    rate = scheduled_learning_rate(state.tx, state.opt_state)
    if rate is not None:
        finite &= jnp.isfinite(rate) & (rate >= 0)
    # A batch without an observed target (every `target_mask` zero) holds no
    # information: its zero gradient would still move the parameters through
    # Adam's momentum and the weight decay, and advance the update count (and
    # the schedule). It changes nothing, and is not a skip (nothing went wrong).
    informative = observed > 0
    skipped = (informative & jnp.logical_not(finite)).astype(jnp.int32)
    apply = informative & finite
    if is_flat_adamw(state.tx):
        trained, opt_state, model_state = _flat_update_if(
            apply, state, grads, trainables, model_state, flat_grads, grad_norm
        )
    else:

        def update() -> tuple[dict[str, PyTree], PyTree, dict[str, PyTree]]:
            updates, opt_state = state.tx.update(grads, state.opt_state, trainables)
            return optax.apply_updates(trainables, updates), opt_state, model_state

        trained, opt_state, model_state = _keep_if(
            apply, update, (trainables, state.opt_state, state.model_state)
        )
    new_state = state.replace(
        step=state.step + 1,
        params=trained["params"],
        extra_params={name: trained[name] for name in state.extra_params},
        opt_state=opt_state,
        model_state=model_state,
        skipped_steps=state.skipped_steps + skipped,
    )
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "clipped_grad_norm": _clipped_norm(grad_norm, state.clip_norm),
        "skipped": skipped,
        "observed": observed,
    }
    return new_state, metrics


def _jitted_train_step(options: tuple[tuple[str, Any], ...]) -> Any:
    """`_train_step` under `jax.jit` with these XLA options (one jitted function per options)."""
    if options not in _STEP_JITS:
        _STEP_JITS[options] = jax.jit(
            _train_step,
            static_argnames=("calibrate",),
            donate_argnums=(0,),
            compiler_options=dict(options) or None,
        )
    return _STEP_JITS[options]


def _check_compiler_options(name: str, compiler_options: Any) -> tuple[tuple[str, Any], ...]:
    """The XLA options to compile the step with, as sorted `(name, value)` pairs.

    None: none (XLA's defaults and `XLA_FLAGS`); a mapping: those options.
    """
    if compiler_options is None:
        compiler_options = {}
    if not isinstance(compiler_options, Mapping) or not all(
        isinstance(key, str) and isinstance(value, str | int | float | bool)
        for key, value in compiler_options.items()
    ):
        raise TypeError(
            f"{name}: compiler_options must be None or a mapping of XLA option names "
            f"to str/int/float/bool values, got {compiler_options!r}"
        )
    return tuple(sorted(compiler_options.items()))


def _takes_calibrate(apply_fn: Any) -> bool:
    """Whether the model behind `apply_fn` takes a `calibrate` argument (True if unknown)."""
    model = getattr(apply_fn, "model", None)
    if model is None:
        return True
    try:
        parameters = inspect.signature(type(model).__call__).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "calibrate" or p.kind is p.VAR_KEYWORD for p in parameters)


def _check_calibrate(name: str, calibrate: Any, state: TrainState) -> None:
    if calibrate not in (None, True, False) or isinstance(calibrate, np.bool_):
        raise TypeError(f"{name}: calibrate must be None, True or False, got {calibrate!r}")
    if calibrate and not state.model_state:
        raise ValueError(
            f"{name}: calibrate=True needs a model with non-trainable collections "
            "(e.g. 'quant_stats'), but state.model_state is empty"
        )
    if calibrate is not None and not _takes_calibrate(state.apply_fn):
        # Only an `apply_fn` with a `model` can say it takes no calibrate argument.
        model = type(getattr(state.apply_fn, "model", None)).__name__
        raise ValueError(
            f"{name}: calibrate must be None for a model without calibration ({model} takes "
            f"no calibrate argument), got {calibrate!r}"
        )


def _checked_train_step(
    name: str, state: Any, batch: Any, rng: Any, calibrate: Any, compiler_options: Any
) -> tuple[Any, Batch]:
    """The jitted step for these compiler options and the batch it takes (`prepare_batch`),
    once the arguments of `name` pass the checks.

    Traced (the step inside a `jax.jit`, `lax.scan` or `jax.eval_shape` of
    the caller's), the enclosing jit compiles the step, and a nested
    `jax.jit` may not take compiler options: they are checked, then left out.
    """
    _check_state(name, state)
    _check_batch(name, batch, state)
    _check_rng(name, rng)
    _check_calibrate(name, calibrate, state)
    options = _check_compiler_options(name, compiler_options)
    if options and _is_traced(state.step, batch, rng):
        options = ()
    return _jitted_train_step(options), prepare_batch(name, batch, state)


def train_step(
    state: TrainState,
    batch: Batch,
    rng: Array,
    calibrate: bool | None = None,
    *,
    compiler_options: Mapping[str, Any] | None = None,
) -> tuple[TrainState, dict[str, Array]]:
    """One jitted optimization step on the quantile loss; `state` is donated.

    The model runs with `deterministic=False` and `rng` as its `'dropout'`
    key (a Threefry key re-typed by `inline_threefry_key`: the same masks,
    drawn without loops on CPU); gradients are taken w.r.t.
    `state.trainables()` only (`'params'` and e.g. `'quant_params'`, never
    `model_state`). A step whose loss or gradient norm is not finite (a NaN
    or inf in any gradient, or a norm that overflows), or whose scheduled
    learning rate (`make_optimizer` given a schedule) is NaN, inf or
    negative, leaves `params`, `opt_state` and `model_state` unchanged and
    increments `skipped_steps`; `step` always advances. (With an optimizer
    other than `make_optimizer`'s, its updates are applied as it computes
    them.) A batch without an observed target (`target_mask` all zero) has
    a zero loss and gradient but no information: it too leaves `params`,
    `opt_state` (the update count, so the schedule, included) and
    `model_state` unchanged, without counting as skipped; applied, AdamW's
    momentum and weight decay would still move the parameters.

    Args:
      state: the current state; its buffers are donated, do not reuse it.
      batch: a `Batch`; `target (B, H)` on the model's output scale.
      rng: the dropout key of this step.
      calibrate: None for models without calibration (the FP32 TFT); True to
        run the QAT model with `calibrate=True` and every `model_state`
        collection mutable (observers update); False to pass `calibrate=False`.
      compiler_options: XLA options for compiling the step, e.g.
        `FAST_COMPILE_OPTIONS`; None (default): XLA's defaults (and
        `XLA_FLAGS`). Each distinct value is its own compiled step. Unused
        when the step is traced (called inside the caller's `jax.jit` or
        `lax.scan`): the enclosing jit compiles it, with its own options.

    Returns:
      `(new_state, metrics)` with float32 scalars `loss`, `grad_norm` (before
      clipping), `clipped_grad_norm` (after `clip_by_global_norm`: computed
      as `min(grad_norm, state.clip_norm)`, the threshold `make_optimizer`
      recorded; for another optimizer, one that clips included, pass its
      threshold as `create_train_state(clip_norm=...)`, else this equals
      `grad_norm`) and
      `observed` (the number of observed targets; 0: nothing was applied),
      and the int32 `skipped` (1 when the step was skipped).
    """
    step, batch = _checked_train_step("train_step", state, batch, rng, calibrate, compiler_options)
    with params_named("train_step", state, batch):
        return step(state, batch, rng, calibrate)


def lower_train_step(
    state: TrainState,
    batch: Batch,
    rng: Array,
    calibrate: bool | None = None,
    *,
    compiler_options: Mapping[str, Any] | None = None,
) -> jax.stages.Lowered:
    """The jitted step of `train_step` lowered for these arguments, without running it.

    Ahead-of-time access to the step: `.compile()` on the result gives the
    executable that `train_step` runs for arguments of the same shapes,
    dtypes and shardings (JAX keeps it, so the next `train_step` call does
    not compile again), with its `cost_analysis()`, `memory_analysis()` and
    `as_text()`; timing `.compile()` measures the step's compile time.
    Nothing is donated or changed: `state` stays usable.

    Args:
      state, batch, rng, calibrate, compiler_options: as for `train_step`
        (checked the same way).

    Returns:
      A `jax.stages.Lowered`.

    Example:
      >>> compiled = lower_train_step(state, batch, rng).compile()  # doctest: +SKIP
      >>> flops = compiled.cost_analysis()["flops"]  # doctest: +SKIP
    """
    step, batch = _checked_train_step(
        "lower_train_step", state, batch, rng, calibrate, compiler_options
    )
    with params_named("lower_train_step", state, batch):
        return step.lower(state, batch, rng, calibrate)


@partial(jax.jit, static_argnums=(0, 1))
def deterministic_output(
    apply_fn: Callable[..., Any], calibrate: bool | None, variables: PyTree, batch: Batch
) -> Any:
    """`apply_fn(variables, ...)` on `batch`'s inputs in deterministic mode (jitted).

    The one forward program of a trained model: `evaluate`, `predict` and the
    `Forecaster`'s predictors all run it, so a run compiles each model's
    forward once per batch shape, not once for the validation loss and again
    for the forecasts. `apply_fn` (static: a `ModelApply`, so that equal
    models share it) gets `calibrate` unless it is None.
    """
    args, kwargs = model_inputs(batch)
    if calibrate is not None:
        kwargs["calibrate"] = calibrate
    return apply_fn(variables, *args, **kwargs, deterministic=True)


@partial(jax.jit, static_argnums=2)
def _output_loss(output: Any, batch: Batch, quantiles: tuple[float, ...]) -> tuple[Array, Array]:
    return batch_loss(output, batch, quantiles)


def _eval_loss(state: TrainState, batch: Batch, calibrate: bool | None) -> tuple[Array, Array]:
    """`batch_loss` of the model's deterministic output (two programs: the forward is shared)."""
    output = deterministic_output(state.apply_fn, calibrate, state.variables, batch)
    return _output_loss(output, batch, state.quantiles)


def _check_frozen(name: str, calibrate: Any, state: TrainState) -> None:
    if calibrate is True:
        allowed = "None or False" if _takes_calibrate(state.apply_fn) else "None"
        raise ValueError(f"{name}: calibrate must be {allowed}, the model is frozen here")
    _check_calibrate(name, calibrate, state)


def eval_step(state: TrainState, batch: Batch, calibrate: bool | None = None) -> Array:
    """The mean quantile loss of one batch in deterministic mode (jitted; a float32 scalar).

    The mean runs over the batch's observed targets (`batch_loss`): 0 for a
    batch without any, so a mean of these over batches is not the loss per
    target; `evaluate` weighs each batch by its observed targets.
    `calibrate` may be None or False (evaluation never updates observers).
    A NaN or inf observed target in a NumPy `batch.target` raises `ValueError`
    (as in `evaluate`); a device target is not read back. Parameters that do
    not match the model (`state.replace(params=...)` of another model) raise
    `ValueError`, in `train_step`, `evaluate` and `predict` too.
    """
    _check_state("eval_step", state)
    _check_batch("eval_step", batch, state)
    _check_frozen("eval_step", calibrate, state)
    batch = prepare_batch("eval_step", batch, state)
    # A NumPy target is on the host already: its NaN is refused, as `evaluate` does,
    # rather than returned as a NaN loss. A device one (or mask) is not read back.
    if isinstance(batch.target, np.ndarray) and isinstance(batch.target_mask, np.ndarray | None):
        _check_finite_targets(None, batch, "eval_step", state)
    with params_named("eval_step", state, batch):
        return _eval_loss(state, batch, calibrate)[0]


def _check_finite_targets(
    index: int | None, batch: Batch, caller: str = "evaluate", state: Any = None
) -> None:
    """Raises `ValueError` when batch `index` holds a NaN or inf target where it is observed.

    `evaluate` reads it only once a batch's loss is not finite, to tell bad
    data (an error) from a diverged model (a NaN or inf loss, returned as it is).
    A finite NumPy float64 target beyond float32's range, which the step
    (`computes_in_float32(state)`) would make inf, is refused as well.
    """
    which = "batch" if index is None else f"batch {index}"  # None: the one batch of a step
    observed = None if batch.target_mask is None else np.asarray(batch.target_mask) != 0
    if computes_in_float32(state):
        check_float32_range(f"{caller}: {which}", "batch.target", batch.target, observed)
    target = np.asarray(batch.target, np.float64)
    bad = ~np.isfinite(target)
    if observed is not None:
        bad &= observed  # as `batch_loss` reads the mask
    if bad.any():
        row, step = (int(i[0]) for i in np.nonzero(bad))
        raise ValueError(
            f"{caller}: {which} holds {int(bad.sum())} NaN or inf targets (the first at "
            f"window {row}, horizon step {step}): mark missing targets with batch.target_mask"
        )


def _check_finite_inputs(caller: str, batch: Batch, host_only: bool = False) -> None:
    """Raises `ValueError` naming the first NaN or inf among `batch`'s real-valued inputs.

    A non-finite input makes the model's output NaN without an error; reads
    the inputs on the host (with `host_only`, only those held in NumPy
    arrays: a device array is not read back). (Finite inputs beyond
    float32's range were refused before, by `prepare_batch`, as the batch
    entered the step.)
    """
    for name in REAL_INPUTS:
        value = getattr(batch, name)
        if value is None or (host_only and not isinstance(value, np.ndarray | np.generic)):
            continue
        values = np.asarray(value)
        bad = ~np.isfinite(values) if jnp.issubdtype(values.dtype, jnp.inexact) else None
        if bad is not None and bad.any():
            where = ", ".join(str(int(i[0])) for i in np.nonzero(bad))
            raise ValueError(
                f"{caller}: batch.{name} holds {int(bad.sum())} NaN or inf values (the first at "
                f"index ({where})); the model's output would be NaN"
            )


def _check_mesh_divides(
    name: str, batches: Sequence[Batch], mesh: Mesh, fills: bool = False
) -> None:
    """Raises `ValueError` naming the first of `fit`'s `batches` that `mesh` cannot split evenly.

    Checked before training: `shard_batch` raises only when it reaches such a
    batch (a validation batch at the first evaluation, after an epoch of
    training), without saying which batch. A batch's global size is its rows
    times the number of processes (each passes its own rows). With `fills`
    (`fit` fills short batches), a `fillable` batch narrower than the widest
    is split at the widest's size.
    """
    processes = jax.process_count()
    for index in range(len(batches)):  # by index: a look at the shapes only
        _check_batch("fit", batches[index])
    filler = ShortBatchFiller(widest(batches), fills)
    for index in range(len(batches)):
        batch = batches[index]
        # Filled up to the widest (`tft_jax.batch_padding`), else split as it is.
        rows = (filler.widest if filler.fills(batch) else batch.batch_size) * processes
        if rows % mesh.size:
            raise ValueError(
                f"fit: {name}[{index}] is a global batch of {rows} windows, which the "
                f"{mesh.size} devices of the mesh cannot split evenly; use batch sizes that "
                f"are multiples of {mesh.size}"
            )


def _check_validation_targets(batches: Sequence[Batch], state: Any = None) -> None:
    """Raises `ValueError` unless `fit`'s validation batches hold observed, finite targets
    (and, with a TFT's `state`, categorical codes its embeddings hold).

    Checked before training: `evaluate` finds either problem only at the first
    evaluation, after an epoch of training (and, the batches placed on the
    mesh first, would not read the codes at all). The targets are one
    process's rows only, so in a multi-process run they are left to
    `evaluate` (which sees the global batches); each process checks the
    codes of its own rows.
    """
    single = jax.process_count() == 1
    observed = 0
    for index in range(len(batches)):  # by index: a look at the arrays, not an evaluation pass
        batch = batches[index]
        _check_batch(f"fit: val_batches[{index}]", batch, state)
        if not single:
            continue
        _check_finite_targets(index, batch, "fit: val_batches")
        mask = batch.target_mask
        observed += (
            int(np.size(batch.target)) if mask is None else int(np.count_nonzero(np.asarray(mask)))
        )
    if single and observed == 0:
        raise ValueError(
            "fit: val_batches hold no observed target (every target_mask is zero); "
            "pass None to train without validation"
        )


def evaluate(
    state: TrainState,
    batches: Iterable[Batch],
    calibrate: bool | None = None,
    *,
    fill_short_batches: bool = True,
) -> float:
    """The mean quantile loss over every observed target of `batches`.

    Each batch's mean is weighted by its number of observed targets, so the
    result does not depend on how the data is split into batches. A NumPy
    batch with a `target_mask` that is shorter than one before it is filled
    up to the widest before it with unobserved rows (`tft_jax.batch_padding`):
    it runs the wider batches' compiled forward, with the same result (up
    to rounding) for a model that computes each row from that row alone, as
    the TFT does
    (`fill_short_batches=False` for one that looks across the batch). Raises
    `ValueError` when `batches` holds no observed target, or an observed
    target or an input that is NaN or infinite (naming the batch; read only
    when a batch's loss is not finite) or a finite float64 one beyond
    float32's range (`prepare_batch`); a model whose output is not finite
    (a diverged run) gives a NaN or infinite result.
    """
    _check_state("evaluate", state)
    _check_frozen("evaluate", calibrate, state)
    fill_up = ShortBatchFiller(enabled=fill_setting("evaluate", fill_short_batches))
    total, count = 0.0, 0.0
    for index, batch in enumerate(batches):
        _check_batch("evaluate", batch, state)
        batch = prepare_batch(f"evaluate: batch {index}", batch, state)
        batch = fill_up(batch)  # a short one: the wider batches' program (`batch_padding`)
        with params_named(f"evaluate: batch {index}", state, batch):
            loss, observed = _eval_loss(state, batch, calibrate)
        loss, observed = float(loss), float(observed)
        if observed and not math.isfinite(loss):
            _check_finite_targets(index, batch, state=state)
            _check_finite_inputs(f"evaluate: batch {index}", batch)
        total += loss * observed
        count += observed
    if count == 0:
        raise ValueError("evaluate: batches hold no observed target")
    return total / count


def predict(state: TrainState, batch: Batch, calibrate: bool | None = None) -> Any:
    """The model output (a `TFTOutput`) for `batch` in deterministic mode (jitted).

    `batch.target` is not used but must be present (any `(B, H)` array); the
    output's `.quantiles` must be floating point of shape `(B, H, Q)`, as the
    loss needs (a `TypeError` or `ValueError` otherwise).
    Raises `ValueError` for a NaN or inf among the inputs held in NumPy
    arrays, or a finite float64 one beyond float32's range (device arrays
    are not read back: their NaN gives a NaN output).
    """
    _check_state("predict", state)
    _check_batch("predict", batch, state)
    _check_frozen("predict", calibrate, state)
    batch = prepare_batch("predict", batch, state, reads_target=False)
    # The NumPy-held inputs, also in a batch that mixes them with device arrays.
    _check_finite_inputs("predict", batch, host_only=True)
    with params_named("predict", state, batch):
        output = deterministic_output(state.apply_fn, calibrate, state.variables, batch)
    _check_output_shape("predict", output, batch, state.quantiles)  # the loss's contract
    return output
