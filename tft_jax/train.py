"""Training: the optimizer, the train state, a jitted train step, evaluation and `fit`.

One optimizer factory (`make_optimizer`: clip by global norm, then AdamW), one
train step (`train_step`) for the FP32 TFT and for models with extra
non-trainable collections (the QAT model's `quant_stats`), and one loop
(`fit`) with validation, early stopping, checkpoints and `resume`.

Every random number is a function of the seed and a counter: the dropout key of
step `s` is `fold_in(key(seed), s)` and the training batches of epoch `e` come
from `train_batches(e)`. A run resumed from a checkpoint therefore repeats the
uninterrupted run exactly.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import pathlib
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.core import unfreeze
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from tqdm.auto import tqdm

from tft_jax.checkpoint import BEST, TrainingCheckpointer
from tft_jax.config import TFTConfig
from tft_jax.distributed import data_mesh, is_primary, place_state, shard_batch
from tft_jax.flat_optimizer import (
    FlatAdamWState,
    flat_adamw,
    flat_updates,
    flatten,
    global_norm,
    is_flat_adamw,
    scheduled_learning_rate,
    unflatten,
)
from tft_jax.inline_threefry import inline_threefry_key
from tft_jax.losses import pinball, quantile_loss
from tft_jax.model import validate_inputs
from tft_jax.schedules import WarmupCosine

Array = Any
PyTree = Any
History = dict[str, list]
BatchSource = Iterable["Batch"] | Callable[[int], Iterable["Batch"]]

HISTORY_KEYS = ("epoch", "step", "train_loss", "val_loss", "skipped_steps")
_MAX_PENDING = 1024  # step metrics held on the device before `fit` sums them on the host
_SHARED_CLOCK_STEPS = 10  # steps between clock readings in a multi-process `fit`


# ---------------------------------------------------------------------------
# Optimizer


class Optimizer(optax.GradientTransformationExtraArgs):
    """An optax transformation that also records its gradient clipping threshold.

    It is the transformation built by `make_optimizer` (a plain
    `GradientTransformationExtraArgs`, usable anywhere optax expects one) with
    the attribute `clip_norm` (float or None), which `create_train_state` reads
    so that `train_step` can report the clipped gradient norm.

    Two optimizers compare equal when their `update` functions and
    thresholds do, whatever their `init`: a train state's `tx` is static in
    the jitted `train_step`, which only runs `update`. So train states whose
    optimizers differ only in the numbers of a `WarmupCosine` schedule (kept
    in the optimizer state, set there by `init`) share one compiled step.
    """

    clip_norm: float | None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Optimizer):
            return NotImplemented
        return (self.update, self.clip_norm) == (other.update, other.clip_norm)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash((self.update, self.clip_norm))


def _require_positive_float(name: str, value: Any, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0.0 or (value == 0.0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
    return value


def decay_model_params_only(trainables: PyTree) -> PyTree:
    """Weight-decay mask: the model's `'params'` decay, other trainable collections do not.

    The train state optimizes `{'params': ..., 'quant_params': ...}`; shrinking
    a quantizer's learned step size toward 0 is not regularization, it is a
    bias. A tree without a top-level `'params'` key decays everywhere.
    """
    if isinstance(trainables, Mapping) and "params" in trainables:
        return {
            name: jax.tree.map(lambda _, decay=name == "params": decay, tree)
            for name, tree in trainables.items()
        }
    return jax.tree.map(lambda _: True, trainables)


def _check_schedule_start(schedule: Callable[[Array], Array]) -> None:
    """Raises `ValueError` unless `schedule(0)` is a finite scalar >= 0.

    Inside the step a NaN learning rate turns every parameter into NaN and a
    negative one climbs the loss, both silently; the first step's rate is
    checked here, on the host, once.
    """
    if isinstance(schedule, WarmupCosine):
        # Its rate lies between 0 and its numbers: checked without running it
        # (eagerly, each of its operations would compile on its own).
        numbers = np.asarray(jax.tree.leaves(schedule), np.float64)
        if np.all(np.isfinite(numbers)) and np.all(numbers >= 0):
            return
        raise ValueError(
            f"make_optimizer: learning_rate {schedule!r} must hold finite numbers >= 0"
        )
    start = np.asarray(schedule(jnp.zeros((), jnp.int32)))
    if start.shape != () or not np.isfinite(start) or start < 0:
        raise ValueError(
            "make_optimizer: learning_rate schedule must give a finite scalar >= 0, "
            f"got {start.tolist()!r} at step 0"
        )


def make_optimizer(
    learning_rate: float | optax.Schedule = 1e-3,
    clip_norm: float | None = 1.0,
    weight_decay: float = 0.0,
    *,
    weight_decay_mask: Any = None,
) -> Optimizer:
    """Gradient clipping by global norm followed by AdamW, on one flat vector.

    The math of `optax.chain(optax.clip_by_global_norm(clip_norm),
    optax.adamw(learning_rate, weight_decay=weight_decay, mask=...))`:
    clipping sees the raw gradients only, and the decoupled weight decay that
    AdamW adds after the Adam scaling is never clipped. It is computed by
    `tft_jax.flat_optimizer.flat_adamw` on all trained scalars concatenated
    into one float32 vector `(N,)` (Adam's moments are kept as two such
    vectors, a `FlatAdamWState`), so the compiled train step has a few
    optimizer kernels instead of several per parameter leaf.

    Args:
      learning_rate: a positive float or an optax schedule `count -> lr`,
        called with the number of updates applied before this one (a step
        that `train_step` skips applies none, so it does not advance the
        schedule, as under `optax.apply_if_finite`; its rate at count 0 must
        be a finite scalar >= 0); a `WarmupCosine`
        (from `warmup_cosine_schedule`) is kept in the optimizer state, so the
        train step does not depend on its numbers.
      clip_norm: the global-norm threshold (> 0); None disables clipping.
      weight_decay: the decoupled weight decay coefficient (>= 0).
      weight_decay_mask: optional pytree of booleans or callable, as
        `optax.adamw(mask=...)` takes it, selecting which parameters are
        decayed; by default `decay_model_params_only` (quantizer step sizes
        are never decayed). It is over what the optimizer sees,
        `TrainState.trainables()` = `{'params': params, **extra_params}`: a
        mask over the model's params alone is `{'params': mask}`. A mask of
        another structure is refused by `create_train_state`.

    Returns:
      An `Optimizer` (an optax `GradientTransformationExtraArgs` with a
      `clip_norm` attribute).

    References:
      Pascanu et al., On the difficulty of training recurrent neural networks, 2013.
      Loshchilov & Hutter, Decoupled weight decay regularization, ICLR 2019.
    """
    if not callable(learning_rate):
        learning_rate = _require_positive_float("make_optimizer: learning_rate", learning_rate)
    else:
        _check_schedule_start(learning_rate)
    if clip_norm is not None:
        clip_norm = _require_positive_float("make_optimizer: clip_norm", clip_norm)
    weight_decay = _require_positive_float(
        "make_optimizer: weight_decay", weight_decay, allow_zero=True
    )
    if weight_decay_mask is None:
        weight_decay_mask = decay_model_params_only
    chain = flat_adamw(
        learning_rate, clip_norm=clip_norm, weight_decay=weight_decay, mask=weight_decay_mask
    )
    optimizer = Optimizer(chain.init, chain.update)
    optimizer.clip_norm = clip_norm
    return optimizer


def warmup_cosine_schedule(
    peak_lr: float, total_steps: int, warmup_steps: int, end_lr: float = 0.0
) -> WarmupCosine:
    """Linear warmup from 0 to `peak_lr` over `warmup_steps`, then cosine decay to `end_lr`.

    The cosine part spans steps `warmup_steps .. total_steps`. The result is a
    `tft_jax.schedules.WarmupCosine`, an optax schedule `count -> lr` with the
    values of `optax.warmup_cosine_decay_schedule(0, peak_lr, warmup_steps,
    total_steps, end_lr)`; given to `make_optimizer`, its numbers live in the
    optimizer state rather than in the compiled train step (one compiled step
    for every such schedule; `with_schedule_steps` changes the total).
    """
    peak_lr = _require_positive_float("warmup_cosine_schedule: peak_lr", peak_lr)
    end_lr = _require_positive_float("warmup_cosine_schedule: end_lr", end_lr, allow_zero=True)
    for name, value in (("total_steps", total_steps), ("warmup_steps", warmup_steps)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"warmup_cosine_schedule: {name} must be an int, got {value!r}")
    if total_steps < 1:
        raise ValueError(f"warmup_cosine_schedule: total_steps must be >= 1, got {total_steps}")
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(
            f"warmup_cosine_schedule: warmup_steps must be in [0, total_steps={total_steps}), "
            f"got {warmup_steps}"
        )
    return WarmupCosine(
        peak_lr=peak_lr, total_steps=int(total_steps), warmup_steps=int(warmup_steps), end_lr=end_lr
    )


# ---------------------------------------------------------------------------
# Batch and train state


# The `Batch` fields holding categorical inputs over time (model keyword arguments).
CATEGORICAL_INPUTS = ("known_categorical_history", "future_categorical", "observed_categorical")


@struct.dataclass
class Batch:
    """One minibatch of model inputs and targets (a pytree).

    Attributes:
      static: `(B, S)` real-valued static inputs.
      historical: `(B, T, U)` observed inputs over the history.
      future: `(B, H, K)` known inputs over the horizon.
      known_history: `(B, T, K)` known inputs over the history, or None.
      static_categorical: `(B, C)` integer codes, or None.
      target: `(B, H)` targets on the model's (scaled) output scale.
      target_mask: optional `(B, H)`, nonzero where the target was observed;
        the loss ignores the other steps (filled gaps). None = all observed.
      known_categorical_history: `(B, T, Kc)` integer codes of the categorical
        known inputs over the history, or None.
      future_categorical: `(B, H, Kc)` their codes over the horizon, or None.
      observed_categorical: `(B, T, Uc)` integer codes of the categorical
        observed inputs, or None.
    """

    static: Array
    historical: Array
    future: Array
    known_history: Array | None
    static_categorical: Array | None
    target: Array
    target_mask: Array | None = None
    known_categorical_history: Array | None = None
    future_categorical: Array | None = None
    observed_categorical: Array | None = None

    @property
    def batch_size(self) -> int:
        """The leading dimension `B` of `target`."""
        return int(np.shape(self.target)[0])


@struct.dataclass
class TrainState:
    """Everything that changes during training (a pytree) plus how to apply the model.

    Attributes:
      step: int32 scalar, the number of `train_step` calls so far (skipped ones included).
      params: the `'params'` collection (trained).
      extra_params: other trained collections by name, e.g. the QAT model's
        `'quant_params'` (learnable step sizes); `{}` for the FP32 TFT.
      opt_state: the optimizer state of `trainables()`, i.e. of
        `{'params': params, **extra_params}`.
      model_state: every other variable collection of the model (e.g. the QAT
        model's `'quant_stats'`): never differentiated, never decayed.
      skipped_steps: int32 scalar, steps skipped for a non-finite loss or gradient,
        or an unusable scheduled learning rate (see `train_step`).
      apply_fn: the model's `apply` (static), as a `ModelApply`: equal models share
        one compiled `train_step`, `evaluate` and `predict`.
      tx: the optimizer (static).
      quantiles: the model's quantile levels (static), used by the loss.
      clip_norm: the optimizer's clipping threshold or None (static), used to
        report the clipped gradient norm.
    """

    step: Array
    params: PyTree
    extra_params: dict[str, PyTree]
    opt_state: PyTree
    model_state: dict[str, PyTree]
    skipped_steps: Array
    apply_fn: Callable[..., Any] = struct.field(pytree_node=False)
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    quantiles: tuple[float, ...] = struct.field(pytree_node=False)
    clip_norm: float | None = struct.field(pytree_node=False, default=None)

    def trainables(self) -> dict[str, PyTree]:
        """The trained collections, `{'params': params, **extra_params}` (what `tx` sees)."""
        return {"params": self.params, **self.extra_params}

    @property
    def variables(self) -> dict[str, PyTree]:
        """Every variable collection, as `model.apply` takes them."""
        return {**self.trainables(), **self.model_state}


def _hashable(model: Any) -> bool:
    """Whether `model` can be hashed: a static jit argument, shared by equal models."""
    try:
        hash(model)
    except TypeError:
        return False
    return True


class ModelApply:
    """`model.apply` that compares and hashes by the model's value.

    A bound method compares by the identity of its object, so two equal
    models' `apply` differ, and a train state's static `apply_fn` would make
    `train_step`, `evaluate` and `predict` trace and compile again for every
    new model object: each refit of a `Forecaster`, each seed of an
    experiment. Flax modules compare and hash by their fields, so equal
    models share the compiled steps. A module that cannot be hashed (a field
    such as a list) compares by identity, as its bound method did.

    Attributes:
      model: the Flax module whose `apply` this calls.
    """

    __slots__ = ("model",)

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.apply(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ModelApply):
            return NotImplemented
        if self.model is other.model:
            return True
        return _hashable(self.model) and _hashable(other.model) and bool(self.model == other.model)

    def __hash__(self) -> int:
        return hash(self.model) if _hashable(self.model) else id(self.model)

    def __repr__(self) -> str:
        return f"ModelApply({self.model!r})"


_FROM_TX = object()
TRAINABLE_COLLECTIONS = ("params", "quant_params")


def _model_quantiles(model: Any) -> tuple[float, ...]:
    for name in ("config", "tft_config"):
        levels = getattr(getattr(model, name, None), "quantiles", None)
        if levels is not None:
            return tuple(float(q) for q in levels)
    raise TypeError(
        f"create_train_state: cannot find the quantile levels of {type(model).__name__} "
        "(no .config.quantiles); pass quantiles=..."
    )


def _check_batch(name: str, batch: Any, state: Any = None) -> None:
    """Raises for a batch the jitted steps would fail on or misread.

    With `state` of a TFT (FP32 or QAT), host (NumPy) batches also go through
    the model's own input checks: inside the jitted step the categorical codes
    are traced and the embeddings clip them, so a code beyond its cardinality
    would train and forecast as the last category, silently. Device arrays
    are not read back (a host sync per step): checked only by their shapes.
    """
    if not isinstance(batch, Batch):
        raise TypeError(f"{name}: batch must be a tft_jax.train.Batch, got {type(batch).__name__}")
    for field in dataclasses.fields(batch):
        value = getattr(batch, field.name)
        # A list is a pytree of scalars to jax.jit: it would fail inside the trace.
        if value is not None and not hasattr(value, "shape"):
            raise TypeError(
                f"{name}: batch.{field.name} must be an array (NumPy or JAX) or None, got "
                f"{type(value).__name__}; convert it with np.asarray"
            )
        dtype = getattr(value, "dtype", None)
        if dtype is not None and not (
            jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_)
        ):
            raise TypeError(f"{name}: batch.{field.name} must hold numbers, got dtype {dtype}")
    target_shape = np.shape(batch.target)
    if len(target_shape) != 2:
        raise ValueError(f"{name}: batch.target must have shape (B, H), got {target_shape}")
    # Metadata only (no device read): a bool or complex target would be cast to
    # float32 by the loss, silently (a complex one losing its imaginary part).
    target_dtype = batch.target.dtype
    real = jnp.issubdtype(target_dtype, jnp.floating) or jnp.issubdtype(target_dtype, jnp.integer)
    if not real:
        raise TypeError(
            f"{name}: batch.target must hold real numbers (a float or int dtype), "
            f"got dtype {target_dtype}"
        )
    if batch.target_mask is not None and np.shape(batch.target_mask) != target_shape:
        raise ValueError(
            f"{name}: batch.target_mask must have the shape of batch.target {target_shape}, "
            f"got {np.shape(batch.target_mask)}"
        )
    # A NaN is nonzero: the loss would read the step as observed.
    if isinstance(batch.target_mask, np.ndarray) and not np.isfinite(batch.target_mask).all():
        row, step = (int(i[0]) for i in np.nonzero(~np.isfinite(batch.target_mask)))
        raise ValueError(
            f"{name}: batch.target_mask must be finite (nonzero where observed), got NaN or inf "
            f"at window {row}, horizon step {step}"
        )
    config = getattr(getattr(getattr(state, "apply_fn", None), "model", None), "config", None)
    if isinstance(config, TFTConfig) and target_shape[1] != config.prediction_horizon:
        raise ValueError(
            f"{name}: batch.target must have shape (B, {config.prediction_horizon}) (the "
            f"model's prediction_horizon), got {target_shape}"
        )
    codes = [getattr(batch, field) for field in ("static_categorical", *CATEGORICAL_INPUTS)]
    if isinstance(config, TFTConfig) and any(isinstance(c, np.ndarray) for c in codes):
        args, kwargs = model_inputs(batch)
        try:
            validate_inputs(config, *args, **kwargs)
        except ValueError as error:  # its own type: IntegerCodesError is a TypeError too
            error.args = (f"{name}: {error}",)
            raise error from None


def _check_variables(variables: Any, expected: Mapping[str, PyTree]) -> None:
    """Raises `ValueError` unless `variables` has `expected`'s collections and leaf shapes."""
    if not isinstance(variables, Mapping):
        raise TypeError(
            f"create_train_state: variables must be a mapping of collections, got "
            f"{type(variables).__name__}"
        )
    if set(variables) != set(expected):
        raise ValueError(
            f"create_train_state: variables must hold the collections {sorted(expected)}, "
            f"got {sorted(variables)}"
        )

    def signature(tree: PyTree) -> PyTree:
        return jax.tree.map(lambda leaf: (tuple(np.shape(leaf)), jnp.dtype(leaf.dtype).name), tree)

    for name, tree in expected.items():
        got, want = signature(unfreeze(variables[name])), signature(unfreeze(tree))
        if got != want:
            raise ValueError(
                f"create_train_state: variables[{name!r}] does not match the model: "
                f"got {got}, expected {want}"
            )


def model_inputs(batch: Batch) -> tuple[tuple[Array, ...], dict[str, Array | None]]:
    """The model's inputs in `batch`: `(static, historical, future)` and the keywords.

    The keywords are `known_history`, `static_categorical` and the
    categorical inputs over time that `batch` holds.
    """
    args = (batch.static, batch.historical, batch.future)
    kwargs = {"known_history": batch.known_history, "static_categorical": batch.static_categorical}
    # Only when present: models without categorical inputs over time need not take them.
    for name in CATEGORICAL_INPUTS:
        if getattr(batch, name) is not None:
            kwargs[name] = getattr(batch, name)
    return args, kwargs


# `model.init` runs once per train state but compiles to several kernels per
# parameter (its random initializers): LLVM at -O0 compiles it about twice as
# fast, and running the slower code once costs less than the time saved.
INIT_COMPILE_OPTIONS: dict[str, Any] = {"xla_backend_optimization_level": 0}


@partial(jax.jit, static_argnums=0, compiler_options=INIT_COMPILE_OPTIONS)
def _jitted_init(model: Any, rngs: dict[str, Array], args: tuple, kwargs: dict) -> PyTree:
    """`model.init`, compiled once per (equal) model and input shapes in a process."""
    return model.init(rngs, *args, **kwargs)


def _init_variables(model: Any, rngs: dict[str, Array], args: tuple, kwargs: dict) -> PyTree:
    """The model's initial variables; equal models share one compiled `init`.

    Flax modules compare and hash by their fields, so another seed, another
    run of an experiment or a refit of the same model neither traces nor
    compiles `init` again. A module with an unhashable field is traced per call.
    """
    if not _hashable(model):
        return jax.jit(model.init, compiler_options=INIT_COMPILE_OPTIONS)(rngs, *args, **kwargs)
    return _jitted_init(model, rngs, args, kwargs)


def _init_shapes(model: Any, rngs: dict[str, Array], args: tuple, kwargs: dict) -> PyTree:
    """The shapes and dtypes of the model's initial variables, traced once per equal model."""
    if not _hashable(model):
        return jax.eval_shape(model.init, rngs, *args, **kwargs)
    return _jitted_init.eval_shape(model, rngs, args, kwargs)


def create_train_state(
    model: Any,
    tx: optax.GradientTransformation,
    rng: Array,
    sample_batch: Batch,
    *,
    variables: Mapping[str, PyTree] | None = None,
    trainable: Sequence[str] = TRAINABLE_COLLECTIONS,
    clip_norm: Any = _FROM_TX,
    quantiles: Sequence[float] | None = None,
) -> TrainState:
    """Initializes the model (jitted), or takes given variables, and the optimizer.

    Args:
      model: a Flax module called as `model(static, historical, future,
        known_history=None, static_categorical=None, deterministic=True)` and
        returning an object with `.quantiles (B, H, Q)`.
      tx: the optimizer, normally from `make_optimizer`.
      rng: a PRNG key; split into the `'params'` and `'dropout'` init streams.
      sample_batch: a `Batch` with the shapes used for training.
      variables: start from these variables (e.g. a trained FP32 model's, or
        `qat.from_fp32(...)`) instead of a fresh init; they must have the
        collections, structure, shapes and dtypes that `model.init` gives.
      trainable: the collections that are trained (those present); every
        other collection goes to `model_state`.
      clip_norm: the clipping threshold for the reported clipped gradient norm;
        by default `tx.clip_norm` (set by `make_optimizer`), else None.
      quantiles: the quantile levels; by default `model.config.quantiles`.

    Returns:
      A `TrainState` at step 0: `params` holds the `'params'` collection,
      `extra_params` the other `trainable` ones, `model_state` the rest.
    """
    if not callable(getattr(model, "init", None)) or not callable(getattr(model, "apply", None)):
        raise TypeError(
            f"create_train_state: model must be a Flax module, got {type(model).__name__}"
        )
    if not callable(getattr(tx, "init", None)) or not callable(getattr(tx, "update", None)):
        raise TypeError(
            f"create_train_state: tx must be an optax GradientTransformation, got "
            f"{type(tx).__name__}"
        )
    _check_batch("create_train_state", sample_batch)
    _check_rng("create_train_state", rng)
    # A bare string would be read character by character: its collection never trained.
    if isinstance(trainable, Iterable) and not isinstance(trainable, str | bytes):
        trainable = tuple(trainable)
    if not isinstance(trainable, tuple) or not all(isinstance(name, str) for name in trainable):
        raise TypeError(
            "create_train_state: trainable must be a sequence of collection names, e.g. "
            f"('params', 'quant_params'), got {trainable!r}"
        )
    levels = _model_quantiles(model) if quantiles is None else tuple(float(q) for q in quantiles)
    # Checked here, not first by the loss inside the trace of the first step.
    if not levels or not all(0.0 < level < 1.0 for level in levels):
        raise ValueError(
            f"create_train_state: quantiles must be one or more levels in (0, 1), got {levels}"
        )
    if clip_norm is _FROM_TX:
        clip_norm = getattr(tx, "clip_norm", None)
    params_rng, dropout_rng = jax.random.split(rng)
    args, kwargs = model_inputs(sample_batch)
    init_rngs = {"params": params_rng, "dropout": dropout_rng}
    if variables is None:
        variables = _init_variables(model, init_rngs, args, kwargs)
    else:
        _check_variables(variables, _init_shapes(model, init_rngs, args, kwargs))
    variables = {name: unfreeze(value) for name, value in variables.items()}
    if "params" not in variables:
        raise ValueError("create_train_state: the model has no 'params' collection")
    extra_params = {
        name: variables[name] for name in trainable if name != "params" and name in variables
    }
    model_state = {
        name: value
        for name, value in variables.items()
        if name != "params" and name not in extra_params
    }
    params = variables["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        extra_params=extra_params,
        opt_state=jax.jit(tx.init)({"params": params, **extra_params}),
        model_state=model_state,
        skipped_steps=jnp.zeros((), jnp.int32),
        apply_fn=ModelApply(model),
        tx=tx,
        quantiles=levels,
        clip_norm=clip_norm,
    )


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


def _output_quantiles(output: Any) -> Array:
    """`output.quantiles`, or a TypeError saying what the model returned instead.

    Checked while tracing (no cost in the compiled step): a model without the
    field would otherwise fail deep in the loss's trace ("LinearizeTracer has
    no attribute quantiles").
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
            "batch_loss: the model must return an object with an array field .quantiles "
            f"(B, H, Q) (e.g. tft_jax.model.TFTOutput), got {got}"
        )
    return pred


def batch_loss(output: Any, batch: Batch, quantiles: Sequence[float]) -> tuple[Array, Array]:
    """The mean quantile loss of a batch over its observed targets, and their number.

    Without `batch.target_mask` this is `quantile_loss(output.quantiles,
    batch.target, quantiles)` over all `B·H` targets; with it, the mean runs
    over the targets where the mask is nonzero only (0 when there are none).

    Returns:
      `(loss, count)`: float32 scalars.
    """
    pred, target = _output_quantiles(output), jnp.asarray(batch.target)
    if batch.target_mask is None:
        return quantile_loss(pred, target, quantiles), jnp.asarray(target.size, jnp.float32)
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
    observed = jnp.asarray(batch.target_mask) != 0
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
        "loss": loss.astype(jnp.float32),  # float64 inputs under jax_enable_x64 promote it
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


def _check_state(name: str, state: Any) -> None:
    if not isinstance(state, TrainState):
        raise TypeError(f"{name}: state must be a TrainState, got {type(state).__name__}")
    # Donation deletes every buffer of the state at once: one leaf tells.
    if isinstance(state.step, jax.Array) and state.step.is_deleted():
        raise ValueError(
            f"{name}: state was donated to an earlier train_step or fit, which deleted its "
            "buffers: pass the state that call returned"
        )


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
        model = type(state.apply_fn.model).__name__
        raise ValueError(
            f"{name}: calibrate must be None for a model without calibration ({model} takes "
            f"no calibrate argument), got {calibrate!r}"
        )


def _check_rng(name: str, rng: Any) -> None:
    """Raises `TypeError` unless `rng` is one PRNG key: a typed key, or raw `uint32` key data.

    Metadata only (no device read). Without it an int or None reaches Flax,
    which complains about an `rngs` argument the caller never passed.
    """
    dtype, shape = getattr(rng, "dtype", None), getattr(rng, "shape", None)
    if dtype is not None and shape is not None:
        if jnp.issubdtype(dtype, jax.dtypes.prng_key) and tuple(shape) == ():
            return
        if jnp.issubdtype(dtype, jnp.uint32) and len(shape) == 1:  # jax.random.PRNGKey(...)
            return
    got = f"{type(rng).__name__}" + ("" if dtype is None else f" of dtype {dtype}, shape {shape}")
    raise TypeError(
        f"{name}: rng must be one PRNG key (jax.random.key(seed), or jax.random.PRNGKey(seed)), "
        f"got {got}"
    )


def _checked_train_step(
    name: str, state: Any, batch: Any, rng: Any, calibrate: Any, compiler_options: Any
) -> Any:
    """The jitted step for these compiler options, once the arguments of `name` pass the checks."""
    _check_state(name, state)
    _check_batch(name, batch, state)
    _check_rng(name, rng)
    _check_calibrate(name, calibrate, state)
    return _jitted_train_step(_check_compiler_options(name, compiler_options))


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
        `XLA_FLAGS`). Each distinct value is its own compiled step.

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
    step = _checked_train_step("train_step", state, batch, rng, calibrate, compiler_options)
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
    step = _checked_train_step("lower_train_step", state, batch, rng, calibrate, compiler_options)
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
    """
    _check_state("eval_step", state)
    _check_batch("eval_step", batch, state)
    _check_frozen("eval_step", calibrate, state)
    return _eval_loss(state, batch, calibrate)[0]


def _check_finite_targets(index: int, batch: Batch, caller: str = "evaluate") -> None:
    """Raises `ValueError` when batch `index` holds a NaN or inf target where it is observed.

    `evaluate` reads it only once a batch's loss is not finite, to tell bad
    data (an error) from a diverged model (a NaN or inf loss, returned as it is).
    """
    target = np.asarray(batch.target, np.float64)
    bad = ~np.isfinite(target)
    if batch.target_mask is not None:
        bad &= np.asarray(batch.target_mask) != 0  # observed, as `batch_loss` reads the mask
    if bad.any():
        row, step = (int(i[0]) for i in np.nonzero(bad))
        raise ValueError(
            f"{caller}: batch {index} holds {int(bad.sum())} NaN or inf targets (the first at "
            f"window {row}, horizon step {step}): mark missing targets with batch.target_mask"
        )


_REAL_INPUTS = ("static", "historical", "future", "known_history")


def _check_finite_inputs(caller: str, batch: Batch) -> None:
    """Raises `ValueError` naming the first NaN or inf among `batch`'s real-valued inputs.

    A non-finite input makes the model's output NaN without an error; reads
    the inputs on the host.
    """
    for name in _REAL_INPUTS:
        value = getattr(batch, name)
        if value is None:
            continue
        values = np.asarray(value)
        bad = ~np.isfinite(values) if jnp.issubdtype(values.dtype, jnp.inexact) else None
        if bad is not None and bad.any():
            where = ", ".join(str(int(i[0])) for i in np.nonzero(bad))
            raise ValueError(
                f"{caller}: batch.{name} holds {int(bad.sum())} NaN or inf values (the first at "
                f"index ({where})); the model's output would be NaN"
            )


def _check_mesh_divides(name: str, batches: Sequence[Batch], mesh: Mesh) -> None:
    """Raises `ValueError` naming the first of `fit`'s `batches` that `mesh` cannot split evenly.

    Checked before training: `shard_batch` raises only when it reaches such a
    batch (a validation batch at the first evaluation, after an epoch of
    training), without saying which batch. A batch's global size is its rows
    times the number of processes (each passes its own rows).
    """
    processes = jax.process_count()
    for index in range(len(batches)):  # by index: a look at the shapes only
        batch = batches[index]
        _check_batch("fit", batch)
        rows = batch.batch_size * processes
        if rows % mesh.size:
            raise ValueError(
                f"fit: {name}[{index}] is a global batch of {rows} windows, which the "
                f"{mesh.size} devices of the mesh cannot split evenly; use batch sizes that "
                f"are multiples of {mesh.size}"
            )


def _check_validation_targets(batches: Sequence[Batch]) -> None:
    """Raises `ValueError` unless `fit`'s validation batches hold observed, finite targets.

    Checked before training: `evaluate` finds either problem only at the first
    evaluation, after an epoch of training. One process's rows only, so it
    is left to `evaluate` (which sees the global batches) in a multi-process run.
    """
    if jax.process_count() > 1:
        return
    observed = 0
    for index in range(len(batches)):  # by index: a look at the arrays, not an evaluation pass
        batch = batches[index]
        _check_batch("fit", batch)
        _check_finite_targets(index, batch, "fit: val_batches")
        mask = batch.target_mask
        observed += (
            int(np.size(batch.target)) if mask is None else int(np.count_nonzero(np.asarray(mask)))
        )
    if observed == 0:
        raise ValueError(
            "fit: val_batches hold no observed target (every target_mask is zero); "
            "pass None to train without validation"
        )


def evaluate(state: TrainState, batches: Iterable[Batch], calibrate: bool | None = None) -> float:
    """The mean quantile loss over every observed target of `batches`.

    Each batch's mean is weighted by its number of observed targets, so the
    result does not depend on how the data is split into batches. Raises
    `ValueError` when `batches` holds no observed target, or an observed
    target or an input that is NaN or infinite (naming the batch; read only
    when a batch's loss is not finite); a model whose output is not finite
    (a diverged run) gives a NaN or infinite result.
    """
    _check_state("evaluate", state)
    _check_frozen("evaluate", calibrate, state)
    total, count = 0.0, 0.0
    for index, batch in enumerate(batches):
        _check_batch("evaluate", batch, state)
        loss, observed = _eval_loss(state, batch, calibrate)
        loss, observed = float(loss), float(observed)
        if observed and not math.isfinite(loss):
            _check_finite_targets(index, batch)
            _check_finite_inputs(f"evaluate: batch {index}", batch)
        total += loss * observed
        count += observed
    if count == 0:
        raise ValueError("evaluate: batches hold no observed target")
    return total / count


def predict(state: TrainState, batch: Batch, calibrate: bool | None = None) -> Any:
    """The model output (a `TFTOutput`) for `batch` in deterministic mode (jitted).

    `batch.target` is not used but must be present (any `(B, H)` array).
    Raises `ValueError` for a NaN or inf among the inputs held in NumPy
    arrays (device arrays are not read back: their NaN gives a NaN output).
    """
    _check_state("predict", state)
    _check_batch("predict", batch, state)
    _check_frozen("predict", calibrate, state)
    if all(isinstance(getattr(batch, name), np.ndarray | None) for name in _REAL_INPUTS):
        _check_finite_inputs("predict", batch)
    return deterministic_output(state.apply_fn, calibrate, state.variables, batch)


# ---------------------------------------------------------------------------
# The schedule in the optimizer state


def _is_flat_state(node: Any) -> bool:
    return isinstance(node, FlatAdamWState)


def in_state_schedule(state: TrainState) -> WarmupCosine | None:
    """The learning-rate schedule kept in `state`'s optimizer state, with Python numbers.

    A `WarmupCosine` given to `make_optimizer` lives in its `FlatAdamWState`
    (as float32 scalars); None when the learning rate is compiled into the
    step instead (a float, another schedule) or the optimizer keeps no
    `FlatAdamWState`. Reads the numbers from the device.
    """
    _check_state("in_state_schedule", state)
    nodes = jax.tree.leaves(state.opt_state, is_leaf=_is_flat_state)
    schedules = [node.schedule for node in nodes if _is_flat_state(node)]
    schedules = [schedule for schedule in schedules if schedule is not None]
    return schedules[0].as_numbers() if len(schedules) == 1 else None


def _with_schedule(state: TrainState, schedule: WarmupCosine) -> TrainState:
    """`state` whose in-state schedule holds `schedule`'s numbers, each where the old one was.

    Each new float32 scalar is placed as the one it replaces (its sharding,
    committed or not), so the jitted step sees the same arguments' placement
    and does not compile again.
    """

    def place(new: Any, old: Array) -> Array:
        value = jnp.asarray(new, jnp.float32)
        if not getattr(old, "committed", False):
            return value
        return jax.device_put(value, old.sharding)

    def replace(node: Any) -> Any:
        if _is_flat_state(node) and node.schedule is not None:
            return node._replace(schedule=jax.tree.map(place, schedule, node.schedule))
        return node

    opt_state = jax.tree.map(replace, state.opt_state, is_leaf=_is_flat_state)
    return state.replace(opt_state=opt_state)


def with_schedule_steps(state: TrainState, total_steps: int) -> TrainState:
    """`state` with its in-state schedule ending at `total_steps`, without compiling again.

    The warmup, peak and end learning rates stay; the cosine now spans steps
    `warmup_steps .. total_steps`. Because the schedule's numbers are data of
    the optimizer state, the next `train_step` runs the step already compiled
    for `state`. The other arrays are shared with `state` (nothing is copied).

    Args:
      state: a train state whose optimizer was built with a `WarmupCosine`
        (`make_optimizer(warmup_cosine_schedule(...))`).
      total_steps: the new end of the cosine: above the warmup steps, and not
        before the state's step.

    Returns:
      The new `TrainState`.

    Raises:
      ValueError: when `state`'s optimizer keeps no schedule in its state, or
        `total_steps` is not above the warmup or is below `state.step`.
    """
    _check_state("with_schedule_steps", state)
    schedule = in_state_schedule(state)
    if schedule is None:
        raise ValueError(
            "with_schedule_steps: state's optimizer keeps no schedule in its state (its "
            "learning rate is compiled into the step); build it with "
            "make_optimizer(warmup_cosine_schedule(...))"
        )
    if isinstance(total_steps, bool) or not isinstance(total_steps, numbers.Integral):
        raise TypeError(f"with_schedule_steps: total_steps must be an int, got {total_steps!r}")
    if total_steps <= schedule.warmup_steps:
        raise ValueError(
            f"with_schedule_steps: total_steps must be above the schedule's warmup steps "
            f"({schedule.warmup_steps}), got {total_steps}"
        )
    step = int(state.step)
    if total_steps < step:
        raise ValueError(
            f"with_schedule_steps: total_steps must not be below the state's step ({step}), "
            f"got {total_steps}"
        )
    return _with_schedule(state, dataclasses.replace(schedule, total_steps=int(total_steps)))


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
      announced_skips: the `TrainState.skipped_steps` count already announced
        (at the latest evaluation, or the state's count when the run started),
        so that a resumed run announces the skips the checkpoint holds but
        no evaluation has reported yet; None until `fit` sets it (and in
        checkpoints written before it was kept).
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
    announced_skips: int | None = None

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
    """

    state: TrainState
    best_state: TrainState
    history: History
    stop_reason: str = "completed"
    schedule_steps: int | None = None


def _batches_for_epoch(source: BatchSource, epoch: int) -> Iterable[Batch]:
    return source(epoch) if callable(source) else source


def _epoch_length(source: BatchSource) -> int | None:
    try:
        return len(_batches_for_epoch(source, 0))  # type: ignore[arg-type]
    except TypeError:
        return None


@jax.jit
def copy_state(state: TrainState) -> TrainState:
    """A copy of a train state (or any pytree of arrays) with fresh buffers.

    `train_step` donates its state's buffers, so a state that must survive
    the step (the best state so far, the start of two runs compared) is
    copied first. One compiled copy of the whole tree: eagerly, every
    distinct leaf shape would compile a copy of its own.
    """
    return jax.tree.map(jnp.copy, state)


def _skip(iterator: Iterator[Batch], count: int) -> int:
    """Skips up to `count` batches of `iterator`; returns how many there were."""
    skipped = 0
    for _ in range(count):
        if next(iterator, None) is None:
            break
        skipped += 1
    return skipped


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
) -> FitResult:
    """Trains `state` for `epochs` epochs with validation, early stopping and checkpoints.

    Args:
      state: the initial state (from `create_train_state`); donated.
      train_batches: an iterable of `Batch` re-iterated every epoch (a
        one-shot iterator, such as a generator, only with `epochs=1`), or a
        callable `epoch -> iterable of Batch` (shuffle inside it with a
        generator seeded by `(seed, epoch)` so that `resume` is exact).
      val_batches: a re-iterable of validation batches (at least one), or None.
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
        warmup_cosine_schedule(...))`), the budget also refits it once: after
        a few steps past the compilation, the measured step time (and that of
        the evaluations so far) tells how many steps the rest of the budget
        allows; when that is fewer than planned, the cosine is made to end
        there (`with_schedule_steps`, announced unless `quiet`), so that the
        last steps train at the low learning rate. `max_steps` stays the cap;
        the refitted total is in the checkpoints (a resumed run keeps it)
        and in `FitResult.schedule_steps`.
      checkpoint_dir: where the latest and best checkpoints go (see
        `tft_jax.checkpoint`); None keeps no checkpoints. A fresh start
        (`resume=False`) refuses a folder holding another run's checkpoints.
      checkpoint_every: also save the latest checkpoint every this many steps
        (it is always saved after each evaluation, at each epoch's end and
        at the end).
      checkpoint_every_seconds: also save the latest checkpoint once this many
        seconds have passed since the previous save (None: never by time), so
        that a killed run loses at most about this much training.
      resume: continue from the newest intact checkpoint in `checkpoint_dir` if
        there is one (a fresh start otherwise; either is announced unless
        `quiet`); `state` then only gives the structure, and its
        schedule (when in the optimizer state) unless the time budget
        refitted the checkpoint's. With the same
        arguments the result equals that of the uninterrupted run; a finished
        run returns at once, unless `epochs`, `max_steps` or `time_budget`
        were raised, when it trains on.
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

    Returns:
      A `FitResult(state, best_state, history, stop_reason, schedule_steps)`.
    """
    _check_fit_timing(checkpoint_every_seconds, time_budget, log_seconds, label, clock)
    started = clock()

    def warn(message: str) -> None:
        """A repair or surprise of this run, said even when quiet, at the caller of `fit`."""
        warnings.warn(f"fit{f' ({label})' if label else ''}: {message}", UserWarning, stacklevel=3)

    _check_state("fit", state)
    _check_fit_args(
        epochs, patience, eval_every, checkpoint_every, max_steps, calibrate_steps, log_every
    )
    # Checked here: `jax.random.key` would fail on a traced float or a None, naming neither.
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"fit: seed must be an int, got {type(seed).__name__} {seed!r}")
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
        _check_validation_targets(val_batches)
    mesh = data_mesh() if mesh is None else mesh
    if val_batches is not None:
        _check_mesh_divides("val_batches", val_batches, mesh)
    if isinstance(train_batches, list | tuple):
        _check_mesh_divides("train_batches", train_batches, mesh)
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

    progress = _Progress(
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
            state, loop = restored.state, LoopState.from_json(restored.loop)
            earlier_seconds = loop.seconds
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
                state = _with_schedule(state, planned_schedule)
            checkpointer.discard_best_after(loop.step)
            best = checkpointer.restore_best(state)
            best_state = None if best is None else best.state
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
    if best_state is None:
        best_state = copy_state(state)
    if val_batches is not None:
        val_batches = _ShardedBatches(val_batches, mesh)

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

    def flush() -> None:
        for loss, skipped, observed in jax.device_get(pending):
            # A batch without an observed target has a loss of 0 that says nothing.
            if not skipped and observed:
                # Weighted by its observed targets, as `evaluate` weighs batches: the
                # mean per target, whatever the batches' sizes and masks.
                loop.loss_sum += float(loss) * float(observed)
                loop.loss_count += int(observed)
        pending.clear()

    def record() -> bool:
        """Evaluates, appends to the history and saves the best state; True = stop early."""
        nonlocal best_state
        flush()
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
            # Skipping is a repair the user did not ask for: announced.
            progress.note(
                f"step {loop.step}: {skipped - announced_skips} step(s) since the previous "
                "evaluation skipped (non-finite loss or gradient, or an unusable learning "
                "rate); their updates were not applied"
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
    if time_budget is not None and planned_schedule is not None and loop.schedule_steps is None:
        refit = _ScheduleRefit(
            time_budget=time_budget,
            planned=min(planned_schedule.total_steps, math.inf if total is None else total),
            warmup_steps=planned_schedule.warmup_steps,
            eval_interval=per_epoch if eval_every is None else eval_every,
            settled_after=calibrate_steps or 0,
        )

    def refit_schedule() -> None:
        """Ends the schedule where the budget will, once the step time is known (see `fit`)."""
        nonlocal state, refit
        assert refit is not None
        if not single_process and loop.step % _SHARED_CLOCK_STEPS:
            return
        fitted = refit.estimate(loop.step, clock(), elapsed())
        if not single_process:
            fitted = _int_from_process_0(fitted)
        if fitted is None:
            return
        if fitted < refit.planned:
            state = with_schedule_steps(state, fitted)
            loop.schedule_steps = fitted
            progress.note(
                f"the time budget fits about {fitted} steps: the learning rate now decays "
                f"to step {fitted}"
            )
        refit = None

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
        return (
            loop.stopped_early
            or loop.stopped_on_budget
            or loop.epoch >= epochs
            or (max_steps is not None and loop.step >= max_steps)
        )

    compiled: set[bool | None] = set()  # the `calibrate` values whose step has run
    previous_loss: Array | None = None
    try:
        while not done():
            iterator = iter(_batches_for_epoch(train_batches, loop.epoch))
            seen = _skip(iterator, loop.batches_done)
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
                    state, metrics = train_step(
                        state, shard_batch(batch, mesh), step_key(seed_key, loop.step), calibrate
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
                    progress.note(f"compiled in {_duration(clock() - compile_started)}")
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
        progress.note(
            f"stopped on the time budget of {_duration(time_budget)} at step "
            f"{_of(loop.step, total)} after {_duration(elapsed())}"
        )
    elif loop.stopped_early:
        reason = "early_stopping"
        progress.note(
            f"stopped early at step {_of(loop.step, total)}: no lower validation loss in "
            f"{patience} evaluations"
        )
    else:
        reason = "completed"
        progress.note(f"finished at step {_of(loop.step, total)} after {_duration(elapsed())}")
    schedule = None if planned_schedule is None else in_state_schedule(state)
    return FitResult(
        state=state,
        best_state=best_state,
        history=loop.history,
        stop_reason=reason,
        schedule_steps=None if schedule is None else schedule.total_steps,
    )


# Before the time budget refits the schedule: steps and seconds measured since
# the latest compilation, so that the step time is the running step's.
_REFIT_MIN_STEPS = 5
_REFIT_MIN_SECONDS = 2.0


class _ScheduleRefit:
    """Where the time budget will end training, from the measured step time (`fit`).

    The step time is measured from the end of the latest compiling step,
    leaving the evaluations in between out; the evaluations' cost is added
    per step as their mean over `eval_interval` steps. The estimate is the
    step at whose end the budget is spent, where `fit` stops.
    """

    def __init__(
        self,
        *,
        time_budget: float,
        planned: float,
        warmup_steps: int,
        eval_interval: int | None,
        settled_after: int,
    ) -> None:
        self.time_budget, self.planned, self.warmup_steps = time_budget, planned, warmup_steps
        self.eval_interval, self.settled_after = eval_interval, settled_after
        self.start: tuple[int, float] | None = None  # (step, time) after the latest compile
        self.window_evaluations = 0.0  # evaluation seconds since then
        self.evaluations, self.evaluation_seconds = 0, 0.0

    def compiled(self, step: int, now: float) -> None:
        """A newly compiled step has run up to `step` at `now`: measure from here."""
        self.start, self.window_evaluations = (step, now), 0.0

    def evaluated(self, seconds: float) -> None:
        """An evaluation took `seconds`."""
        self.evaluations += 1
        self.evaluation_seconds += seconds
        self.window_evaluations += seconds

    def estimate(self, step: int, now: float, elapsed: float) -> int | None:
        """The step at which the budget runs out (not before `step`, above the warmup).

        None while too little is measured, or while a compilation is still
        ahead (the QAT step with frozen observers, after `settled_after` steps).
        """
        if self.start is None or self.start[0] <= self.settled_after:
            return None
        start_step, start_time = self.start
        steps, seconds = step - start_step, now - start_time
        if steps < _REFIT_MIN_STEPS or seconds < _REFIT_MIN_SECONDS:
            return None
        per_step = max(0.0, seconds - self.window_evaluations) / steps
        if self.evaluations and self.eval_interval:
            per_step += self.evaluation_seconds / self.evaluations / self.eval_interval
        if per_step <= 0.0:
            return None
        remaining = max(0.0, self.time_budget - elapsed)
        # Rounded first: a budget that is a whole number of steps ends at that step.
        steps_left = math.ceil(round(remaining / per_step, 9))
        return max(step + steps_left, self.warmup_steps + 1, step)


class _Progress:
    """What `fit` shows on process 0; nothing at all when not `enabled`.

    On a terminal (or in a notebook) a tqdm bar named by the label, opened
    once the train step has compiled, so that its rate and ETA leave the
    compilation out. Elsewhere (a log file, a pipe) plain lines instead, so a
    log holds no carriage returns: one at least every `log_seconds`, and one
    per evaluation. Notes (resume, compilation, the end) are lines in both.
    Everything goes to `sys.stderr`, as tqdm's bar does.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        label: str | None,
        total: int | None,
        clock: Callable[[], float],
        elapsed: Callable[[], float],
        time_budget: float | None,
        log_every: int,
        log_seconds: float,
    ) -> None:
        self.enabled, self.label, self.total = enabled, label, total
        self.clock, self.elapsed, self.time_budget = clock, elapsed, time_budget
        self.log_every, self.log_seconds = log_every, log_seconds
        self.stream = sys.stderr
        self.interactive = enabled and _interactive(self.stream)
        self.bar: Any = None
        self.postfix: dict[str, str] = {}
        self.first_step: int | None = None  # where the rate is measured from (the last compile)
        self.first_time = 0.0
        self.last_line = -math.inf

    def note(self, text: str) -> None:
        """One line, prefixed with the label."""
        if not self.enabled:
            return
        line = f"{self.label}: {text}" if self.label else text
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def start(self, step: int) -> None:
        """A newly compiled step has run (up to `step`): the rate is measured from here."""
        if not self.enabled:
            return
        self.first_step, self.first_time = step, self.clock()
        self.last_line = self.first_time
        if self.interactive and self.bar is None:
            self.bar = tqdm(
                total=self.total,
                initial=step,
                desc=self.label,
                unit="step",
                dynamic_ncols=True,
                file=self.stream,
            )

    def stepped(self, step: int, loss: Array) -> None:
        """Step `step` has been dispatched; `loss` is read only when shown."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            if step % self.log_every == 0:
                self.postfix["loss"] = f"{float(loss):.4f}"
                self.bar.set_postfix(self.postfix)
        elif self.clock() - self.last_line >= self.log_seconds:
            self._line(step, f"loss {float(loss):.4f}")

    def evaluated(
        self, step: int, train_loss: float, val_loss: float | None, seconds: float
    ) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.postfix.update(train_loss=f"{train_loss:.4f}", val_loss=_format(val_loss))
            self.bar.set_postfix(self.postfix)
            return
        text = f"train_loss {train_loss:.4f}"
        if val_loss is not None:
            text += f"  val_loss {val_loss:.4f} (evaluated in {_duration(seconds)})"
        self._line(step, text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _line(self, step: int, text: str) -> None:
        now = self.clock()
        self.last_line = now
        parts = [f"step {_of(step, self.total)}", text, f"elapsed {_duration(self.elapsed())}"]
        eta = self._eta(step, now)
        if eta is not None:
            parts.append(f"ETA {_duration(eta)}")
        self.note("  ".join(parts))

    def _eta(self, step: int, now: float) -> float | None:
        """Seconds left: at the rate since the compiled step first ran, within the budget."""
        left = []
        if self.time_budget is not None:
            left.append(max(0.0, self.time_budget - self.elapsed()))
        if (
            self.total is not None
            and self.first_step is not None
            and step > self.first_step
            and now > self.first_time
        ):
            rate = (step - self.first_step) / (now - self.first_time)
            left.append(max(0, self.total - step) / rate)
        return min(left) if left else None


def _int_from_process_0(value: int | None) -> int | None:
    """Process 0's `value` in every process (a collective: every process must call it)."""
    encoded = np.asarray(-1 if value is None else value, np.int32)
    shared = int(np.asarray(multihost_utils.broadcast_one_to_all(encoded)))
    return None if shared < 0 else shared


def _from_process_0(*flags: bool) -> tuple[bool, ...]:
    """Process 0's `flags` in every process (a collective: every process must call it)."""
    shared = multihost_utils.broadcast_one_to_all(np.asarray(flags, np.bool_))
    return tuple(bool(flag) for flag in np.asarray(shared))


def _interactive(stream: Any) -> bool:
    """Whether `stream` shows a live bar: a terminal, or tqdm's notebook widget."""
    if any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__):
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


def _of(step: int, total: int | None) -> str:
    return f"{step}" if total is None else f"{step}/{total}"


def _duration(seconds: float) -> str:
    """`4.2s`, `3m05s` or `1h02m`."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    seconds = round(seconds)
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class _ShardedBatches:
    """Re-iterable view of validation batches, each placed on the mesh when reached."""

    def __init__(self, batches: Sequence[Batch], mesh: Mesh) -> None:
        self.batches, self.mesh = batches, mesh

    def __iter__(self) -> Iterator[Batch]:
        return (shard_batch(batch, self.mesh) for batch in self.batches)


def _evaluated_at(loop: LoopState) -> bool:
    steps = loop.history["step"]
    return bool(steps) and steps[-1] == loop.step


def _loop_snapshot(loop: LoopState) -> LoopState:
    return dataclasses.replace(
        loop, history={key: list(values) for key, values in loop.history.items()}
    )


def _format(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


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
