"""The batch and the train state: `Batch`, `TrainState`, `create_train_state`.

Also the learning-rate schedule a `flat_adamw` state keeps
(`in_state_schedule`, `with_schedule_steps`) and `copy_state`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cache, partial
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.core import unfreeze
from flax.errors import FlaxError

from tft_jax.config import TFTConfig
from tft_jax.flat_optimizer import (
    FlatAdamWState,
)
from tft_jax.model import check_float32_range, validate_inputs
from tft_jax.optimizer import _require_positive_float
from tft_jax.schedules import WarmupCosine
from tft_jax.static_arguments import is_hashable

if TYPE_CHECKING:
    from typing import Self

Array = Any
PyTree = Any

# ---------------------------------------------------------------------------
# Batch and train state


# The `Batch` fields holding categorical inputs over time (model keyword arguments).
CATEGORICAL_INPUTS = ("known_categorical_history", "future_categorical", "observed_categorical")
# The `Batch` fields holding the model's real-valued inputs.
REAL_INPUTS = ("static", "historical", "future", "known_history")


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

    if TYPE_CHECKING:

        def replace(self, **changes: Any) -> Self: ...

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

    if TYPE_CHECKING:

        def replace(self, **changes: Any) -> Self: ...

    def __repr__(self) -> str:
        """One line: the counts, the parameters' size and the static settings, not the
        arrays (a notebook showed 100,000 characters), and a state whose arrays a step has
        consumed shows so instead of failing."""
        arrays = jax.tree.leaves(self.trainables())
        size = sum(int(np.prod(leaf.shape)) for leaf in arrays)
        extra = f", extra {sorted(self.extra_params)}" if self.extra_params else ""
        state = f", model state {sorted(self.model_state)}" if self.model_state else ""
        return (
            f"TrainState(step {_shown_count(self.step)}, skipped "
            f"{_shown_count(self.skipped_steps)}; {size:,} trained values in {len(arrays)} "
            f"arrays{extra}{state}; quantiles {self.quantiles}, clip_norm {self.clip_norm}; "
            f"model {type(getattr(self.apply_fn, 'model', self.apply_fn)).__name__})"
        )

    def trainables(self) -> dict[str, PyTree]:
        """The trained collections, `{'params': params, **extra_params}` (what `tx` sees)."""
        return {"params": self.params, **self.extra_params}

    @property
    def variables(self) -> dict[str, PyTree]:
        """Every variable collection, as `model.apply` takes them."""
        return {**self.trainables(), **self.model_state}


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
        return (
            is_hashable(self.model) and is_hashable(other.model) and bool(self.model == other.model)
        )

    def __hash__(self) -> int:
        return hash(self.model) if is_hashable(self.model) else id(self.model)

    def __repr__(self) -> str:
        return f"ModelApply({self.model!r})"


def _shown_count(value: Any) -> str:
    """A state's step count as `TrainState`'s repr shows it: its value, or why it has none
    (donated to a step, or a tracer inside a jitted function)."""
    if isinstance(value, jax.core.Tracer):
        return "(traced)"
    if isinstance(value, jax.Array) and value.is_deleted():
        return "(donated to a step)"
    return str(int(value))


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


def _check_model_levels(model: Any, quantiles: Any, levels: tuple[float, ...]) -> None:
    """Raises `ValueError` when given `quantiles` differ from the model's own levels.

    The model's output column `i` is its `config.quantiles[i]`: the loss of
    other (or reordered) levels would train each column as another level,
    silently. A model without `.config.quantiles` takes the given levels.
    """
    if quantiles is None:
        return
    try:
        own = _model_quantiles(model)
    except TypeError:
        return
    # float32 levels (np.float32(0.1)) are the same levels: compared to a float32 spacing.
    same = len(own) == len(levels) and all(
        abs(a - b) <= 1e-6 for a, b in zip(own, levels, strict=True)
    )
    if not same:
        raise ValueError(
            f"create_train_state: quantiles {levels} differ from model.config.quantiles {own}; "
            "the loss would train each output column as another level (leave quantiles out "
            "to use the model's)"
        )


def _tft_config(state: Any) -> TFTConfig | None:
    """The `TFTConfig` of `state`'s model (the FP32 or the QAT TFT), None for another model."""
    config = getattr(getattr(getattr(state, "apply_fn", None), "model", None), "config", None)
    return config if isinstance(config, TFTConfig) else None


def computes_in_float32(state: Any = None) -> bool:
    """Whether the steps compute a batch's real values in float32 (or narrower) for `state`.

    Without `jax_enable_x64`, `jax.jit` makes every float64 array float32 as
    it enters. With it, float64 arrays enter as they are, and the TFT casts
    its inputs to its compute dtype and forecasts in it: float32 or narrower
    unless its config says float64. Another model's dtype is not known: False.
    """
    if not jax.config.jax_enable_x64:  # type: ignore[attr-defined]  # a flag jax adds at runtime
        return True
    config = _tft_config(state)
    return config is not None and config.dtype != "float64"


def prepare_batch(
    name: str, batch: Batch, state: Any = None, *, reads_target: bool = True
) -> Batch:
    """`batch` as the jitted steps take it: NumPy integers in its real-valued fields as float32.

    Without `jax_enable_x64`, `jax.jit` makes an int64 NumPy array int32 as
    it enters, wrapping values beyond int32's range (byte counts, cents,
    nanosecond times) around silently, and a float64 one float32, turning
    finite values beyond float32's range into ±inf. So, on the host: where
    the step computes in float32 (`computes_in_float32`), a finite float64
    value beyond float32's range in an input or an observed target raises
    `ValueError` naming the field (the target only when `reads_target`:
    `predict` does not read it); and, without `jax_enable_x64`, the NumPy
    integer, boolean and float64 arrays (and scalars) in `static`,
    `historical`, `future`, `known_history`, `target` and `target_mask`
    become float32, as the model and the loss cast them inside the step
    (the same values, without the wrap, and the compiled step of a float32
    batch). Categorical codes stay integers (`_check_batch` checked their
    range).

    JAX arrays pass unchanged: a traced one (the step inside the caller's
    `jax.jit`) cannot be read, and reading a device array back would cost a
    host sync per step. An int64 JAX array exists only under
    `jax_enable_x64`, where it enters the step unchanged (without it, JAX
    made it int32 when it was created). Under `jax_enable_x64` NumPy
    integers enter unchanged too: nothing wraps, and the model casts them
    to its compute dtype.
    """
    convert = not jax.config.jax_enable_x64  # type: ignore[attr-defined]  # a flag jax adds at runtime
    bounded = computes_in_float32(state)
    checked = (*REAL_INPUTS, "target") if reads_target else REAL_INPUTS  # a mask is read as != 0
    mask = batch.target_mask if isinstance(batch.target_mask, np.ndarray) else None
    if batch.target_mask is not None and mask is None:
        # A JAX mask stays on the device (reading it would cost a sync): the target
        # it masks is not checked on the host, rather than refused where unobserved.
        checked = REAL_INPUTS
    converted = {}
    for field in (*REAL_INPUTS, "target", "target_mask"):
        value = getattr(batch, field)
        if not isinstance(value, np.ndarray | np.generic):
            continue
        if bounded and field in checked:
            observed = mask if field == "target" else None
            check_float32_range(name, f"batch.{field}", value, observed)
        kind, size = value.dtype.kind, value.dtype.itemsize
        if convert and (kind in "iub" or (kind == "f" and size > 4)):
            # What remains beyond float32's range is unread: a masked target, a mask.
            with np.errstate(over="ignore"):
                converted[field] = np.asarray(value, np.float32)
    return batch.replace(**converted) if converted else batch


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
    if batch.target is None:
        unread = " (predict does not read it: any, e.g. np.zeros((B, H)))"
        raise TypeError(
            f"{name}: batch.target must be a (B, H) array, got None"
            + (unread if name.startswith("predict") else "")
        )
    target_shape = np.shape(batch.target)
    if len(target_shape) != 2:
        raise ValueError(f"{name}: batch.target must have shape (B, H), got {target_shape}")
    for field in dataclasses.fields(batch):  # one B: else a deep error of the model's
        value = getattr(batch, field.name)
        shape = None if value is None else np.shape(value)
        if shape is not None and (not shape or shape[0] != target_shape[0]):
            raise ValueError(
                f"{name}: batch.{field.name} must have the batch's B = {target_shape[0]} rows "
                f"first (batch.target is {target_shape}), got shape {shape}"
            )
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
    config = _tft_config(state)
    if config is not None and target_shape[1] != config.prediction_horizon:
        raise ValueError(
            f"{name}: batch.target must have shape (B, {config.prediction_horizon}) (the "
            f"model's prediction_horizon), got {target_shape}"
        )
    codes = [getattr(batch, field) for field in ("static_categorical", *CATEGORICAL_INPUTS)]
    if config is not None and any(isinstance(c, np.ndarray) for c in codes):
        args, kwargs = model_inputs(batch)
        try:
            validate_inputs(config, *args, **kwargs)
        except ValueError as error:  # its own type: IntegerCodesError is a TypeError too
            error.args = (f"{name}: {error}",)
            raise error from None


def _leaf_signature(leaf: Any) -> tuple[tuple[int, ...], Any]:
    dtype = getattr(leaf, "dtype", None)  # an array's own (a NumPy float64 stays float64)
    return tuple(np.shape(leaf)), jnp.dtype(jnp.result_type(leaf) if dtype is None else dtype)


def _path_signatures(tree: PyTree) -> dict[str, tuple[tuple[int, ...], Any]]:
    """`'params/a/kernel' -> (shape, dtype)` for every leaf of `tree`."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path): _leaf_signature(leaf)
        for path, leaf in leaves
    }


def _first_difference(got: PyTree, expected: PyTree) -> str | None:
    """The first leaf (`'params/a/kernel'`) that `got` lacks, shapes or types otherwise than
    `expected`, or holds beyond it; None when their leaves agree."""
    have, want = _path_signatures(got), _path_signatures(expected)
    for path, (shape, dtype) in want.items():
        if path not in have:
            return f"{path} is missing (the model needs shape {shape})"
        if have[path][0] != shape:
            return f"{path} has shape {have[path][0]}, the model needs {shape}"
        if have[path][1] != dtype:
            return f"{path} has dtype {have[path][1]}, the model needs {dtype}"
    extra = next((path for path in have if path not in want), None)
    return None if extra is None else f"{extra} is not one of the model's"


def _check_variables(variables: Any, expected: Mapping[str, PyTree]) -> dict[str, PyTree]:
    """`variables` without empty collections the model does not make; raises `ValueError`
    unless it then has `expected`'s collections and leaf shapes.

    An empty collection holds nothing to train or keep: `qat.from_fp32` of a QAT
    model with quantization off (`QATConfig(bits=None)`) gives an empty
    `'quant_stats'`, which that model's own `init` does not make.
    """
    if not isinstance(variables, Mapping):
        raise TypeError(
            f"create_train_state: variables must be a mapping of collections, got "
            f"{type(variables).__name__}"
        )
    variables = {
        name: tree
        for name, tree in variables.items()
        if name in expected or jax.tree_util.tree_leaves(tree)
    }
    if set(variables) != set(expected):
        raise ValueError(
            f"create_train_state: variables must hold the collections {sorted(expected)}, "
            f"got {sorted(variables)}"
        )

    for name, tree in expected.items():
        problem = _first_difference(unfreeze(variables[name]), unfreeze(tree))
        if problem is not None:
            raise ValueError(
                f"create_train_state: variables[{name!r}] does not match the model: {problem}"
            )
    return variables


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
# parameter (its random initializers). With LLVM at -O0 and its cheap pass
# pipeline, and XLA:CPU's classic loop emitters (other backends ignore that
# option), it compiles faster than at XLA's defaults; running the slower code
# once costs less than the time saved. The values are those of -O0 alone, bit
# for bit (-O0 itself may round a few last bits otherwise than XLA's defaults).
INIT_COMPILE_OPTIONS: dict[str, Any] = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
    "xla_cpu_use_fusion_emitters": False,
}


def _known_option(name: str, value: Any) -> bool:
    """Whether this jaxlib compiles with the option (an unknown one is an error at compile)."""
    try:
        jax.jit(lambda x: x, compiler_options={name: value}).lower(np.float32(0)).compile()
    except jax.errors.JaxRuntimeError as error:
        if "No such compile option" not in str(error):
            raise
        return False
    return True


@cache
def init_compile_options() -> dict[str, Any]:
    """The `INIT_COMPILE_OPTIONS` this jaxlib knows (XLA:CPU's loop emitters are being retired)."""
    return {
        name: value for name, value in INIT_COMPILE_OPTIONS.items() if _known_option(name, value)
    }


def _init(model: Any, rngs: dict[str, Array], args: tuple, kwargs: dict) -> PyTree:
    """`model.init` as the train step calls the model, `deterministic=True` included.

    (A model taking `deterministic` as Flax's `nn.merge_param` does needs it at init too.)
    """
    return model.init(rngs, *args, deterministic=True, **kwargs)


@cache
def _jitted_init() -> Any:
    """`_init` jitted with `init_compile_options()`: compiled once per (equal) model and
    input shapes in a process."""
    return jax.jit(_init, static_argnums=0, compiler_options=init_compile_options())


def _is_traced(*values: Any) -> bool:
    """Whether any leaf of `values` is a tracer: the call is traced (`jax.jit`, `lax.scan`, ...).

    Traced, a function runs inside an enclosing trace: a nested `jax.jit`
    may not take `compiler_options` (only the outermost one compiles), and
    arrays have no buffers to inspect.
    """
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(values))


def _init_variables(model: Any, rngs: dict[str, Array], args: tuple, kwargs: dict) -> PyTree:
    """The model's initial variables; equal models share one compiled `init`.

    Flax modules compare and hash by their fields, so another seed, another
    run of an experiment or a refit of the same model neither traces nor
    compiles `init` again. A module with an unhashable field is traced per call.
    Traced (`create_train_state` under `jax.eval_shape` or `jax.jit`, where
    the keys are tracers), `init` runs inside the enclosing trace: a nested
    `jax.jit` may not take `INIT_COMPILE_OPTIONS`, and the outer one compiles.
    """
    if _is_traced(rngs):
        return model.init(rngs, *args, deterministic=True, **kwargs)
    if not is_hashable(model):
        init = partial(model.init, deterministic=True)
        return jax.jit(init, compiler_options=init_compile_options())(rngs, *args, **kwargs)
    return _jitted_init()(model, rngs, args, kwargs)


def _init_shapes(model: Any, rngs: dict[str, Array], args: tuple, kwargs: dict) -> PyTree:
    """The shapes and dtypes of the model's initial variables, traced once per equal model."""
    if not is_hashable(model):
        return jax.eval_shape(partial(model.init, deterministic=True), rngs, *args, **kwargs)
    return _jitted_init().eval_shape(model, rngs, args, kwargs)


# How `create_train_state`, the train step and `predict` call the model (its docstring's words).
_MODEL_CALL = (
    "model(static, historical, future, known_history=None, static_categorical=None, "
    "deterministic=True)"
)
_DETERMINISTIC_NEEDED = (
    "create_train_state: the model must take a `deterministic` keyword (the train "
    "step calls it with deterministic=False, predictions with True)"
)


def _takes_keyword(signature: inspect.Signature, name: str) -> bool:
    """Whether a call signature takes `name` by keyword (or any keyword, through `**kwargs`)."""
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return True
        if parameter.name == name and parameter.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        ):
            return True
    return False


def _plain(signature: inspect.Signature) -> inspect.Signature:
    """`signature` without its annotations: the names and defaults a message shows."""
    empty = inspect.Parameter.empty
    parameters = [p.replace(annotation=empty) for p in signature.parameters.values()]
    return signature.replace(parameters=parameters, return_annotation=empty)


def _binds(signature: inspect.Signature, args: tuple, kwargs: dict) -> bool:
    """Whether `signature` takes `(*args, **kwargs)`."""
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


def _check_model_call(model: Any, args: tuple, kwargs: dict) -> None:
    """Raises `TypeError` unless the model's `__call__` takes what the train step passes.

    Bound before init, on the signature alone: a model of another signature
    failed inside `init` with Python's raw message (or, given `deterministic`
    by position as well, was told it lacked the keyword). A signature with
    `*args`/`**kwargs` takes what it collects; one that cannot be read is left
    to `init`.
    """
    wrapped_mismatch = getattr(model, "call_mismatch", None)  # a QATModel: its wrapped model's
    if callable(wrapped_mismatch):
        mismatch = wrapped_mismatch(args, {**kwargs, "deterministic": True})
        if mismatch is not None:
            if wrapped_mismatch(args, kwargs) is None:
                raise TypeError(f"{_DETERMINISTIC_NEEDED}: {mismatch}")
            raise TypeError(
                f"create_train_state: the model must be callable as {_MODEL_CALL} (the train "
                f"step passes deterministic=False), but {type(model).__name__}'s {mismatch}"
            )
    try:
        signature = inspect.signature(model.__call__)
    except (AttributeError, TypeError, ValueError):
        return
    try:
        # Positions first: three inputs where the model takes fewer is said as such,
        # not as the keywords that then collide with them.
        signature.bind_partial(*args)
        signature.bind(*args, **kwargs, deterministic=True)
    except TypeError as error:
        shown = f"{type(model).__name__}.__call__{_plain(signature)}"
        if not _takes_keyword(signature, "deterministic") and _binds(signature, args, kwargs):
            # The inputs fit: only the keyword is missing.
            raise TypeError(f"{_DETERMINISTIC_NEEDED}: {shown} does not: {error}") from None
        extra = [name for name in kwargs if name in CATEGORICAL_INPUTS]
        also = f", plus the batch's {', '.join(extra)} by keyword" if extra else ""
        raise TypeError(
            f"create_train_state: the model must be callable as {_MODEL_CALL}{also} (the "
            f"train step passes deterministic=False), but {shown} is not: {error}"
        ) from None


def _check_state(name: str, state: Any) -> None:
    """Raises unless `state` is a `TrainState` whose buffers were not donated away.

    A traced state (the step under `jax.jit`, `lax.scan` or `jax.eval_shape`)
    has no buffers: only its type is checked.
    """
    if not isinstance(state, TrainState):
        raise TypeError(f"{name}: state must be a TrainState, got {type(state).__name__}")
    # Donation deletes every buffer of the state at once: one leaf tells.
    step = state.step
    if isinstance(step, jax.Array) and not _is_traced(step) and step.is_deleted():
        raise ValueError(
            f"{name}: state was donated to an earlier train_step or fit, which deleted its "
            "buffers: pass the state that call returned"
        )


def _params_mismatch(state: TrainState, batch: Batch) -> str | None:
    """The first difference between `state`'s trainables and those `model.init` gives
    for `batch`'s input shapes (a missing, reshaped or extra leaf), or None."""
    if not isinstance(state.apply_fn, ModelApply):
        return None  # an `apply_fn` of its own: its model is not known here
    args, kwargs = model_inputs(batch)

    def abstract(value: Any) -> Any:
        if value is None:
            return None
        dtype = jax.dtypes.canonicalize_dtype(jnp.result_type(value))
        return jax.ShapeDtypeStruct(tuple(np.shape(value)), dtype)

    key = jax.random.key(0)
    try:
        shapes = _init_shapes(
            state.apply_fn.model,
            {"params": key, "dropout": key},
            tuple(abstract(a) for a in args),
            {n: abstract(v) for n, v in kwargs.items()},
        )
    except Exception:  # the model's own error is the one to show
        return None
    expected = {
        "params": unfreeze(shapes.get("params", {})),
        "extra_params": {name: unfreeze(shapes.get(name, {})) for name in state.extra_params},
    }
    return _first_difference({"params": state.params, "extra_params": state.extra_params}, expected)


@contextlib.contextmanager
def params_named(name: str, state: TrainState, batch: Batch) -> Iterator[None]:
    """Re-raises Flax's error for parameters that do not fit the model (those of another
    model: `state.replace(params=...)`) as a `ValueError` naming the first parameter
    that differs.

    Flax raises `ScopeParamShapeError` or `ScopeParamNotFoundError` from
    inside the traced step; the parameters are compared with the model's
    `init` only then, so a step that runs pays nothing.
    """
    try:
        yield
    except FlaxError as error:
        problem = _params_mismatch(state, batch)
        if problem is None:
            raise
        raise ValueError(
            f"{name}: state.params do not match the model: {problem} (pass the params of "
            "create_train_state for this model)"
        ) from error


def _raw_key_shape() -> tuple[int, ...]:
    """The shape of one raw key of the default PRNG implementation (`(2,)` for threefry)."""
    return tuple(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape)


def _check_rng(name: str, rng: Any) -> None:
    """Raises `TypeError` unless `rng` is one PRNG key: a typed key, or raw `uint32` key data.

    Metadata only (no device read). Without it an int or None reaches Flax,
    which complains about an `rngs` argument the caller never passed.
    """
    dtype, shape = getattr(rng, "dtype", None), getattr(rng, "shape", None)
    if dtype is not None and shape is not None:
        if jnp.issubdtype(dtype, jax.dtypes.prng_key) and tuple(shape) == ():
            return
        if jnp.issubdtype(dtype, jnp.uint32) and tuple(shape) == _raw_key_shape():
            return  # jax.random.PRNGKey(...): the default implementation's key data
    got = f"{type(rng).__name__}" + ("" if dtype is None else f" of dtype {dtype}, shape {shape}")
    raise TypeError(
        f"{name}: rng must be one PRNG key (jax.random.key(seed), or jax.random.PRNGKey(seed) "
        f"of shape {_raw_key_shape()}), got {got}"
    )


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
        The state holds copies of their JAX arrays (placed alike), so `fit`,
        which donates the state, leaves the caller's arrays alive.
      trainable: the collections that are trained (those present); every
        other collection goes to `model_state`.
      clip_norm: the clipping threshold for the reported clipped gradient norm
        (a float > 0, or None); by default `tx.clip_norm` (set by
        `make_optimizer`), else None.
      quantiles: the quantile levels; by default `model.config.quantiles`. For
        a model with `.config.quantiles`, they must be those levels, in order
        (`ValueError` otherwise: the loss would train each output column as
        another level).

    Returns:
      A `TrainState` at step 0: `params` holds the `'params'` collection,
      `extra_params` the other `trainable` ones, `model_state` the rest.

    Raises:
      TypeError: the model's `__call__` does not take the arguments above
        (checked on its signature before init; `*args`/`**kwargs` take them).
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
    _check_model_levels(model, quantiles, levels)
    if clip_norm is _FROM_TX:
        clip_norm = getattr(tx, "clip_norm", None)
    elif clip_norm is not None:
        # A negative or zero threshold made every reported clipped norm that number.
        clip_norm = _require_positive_float("create_train_state: clip_norm", clip_norm)
    params_rng, dropout_rng = jax.random.split(rng)
    args, kwargs = model_inputs(sample_batch)
    _check_model_call(model, args, kwargs)
    init_rngs = {"params": params_rng, "dropout": dropout_rng}
    given = variables is not None
    try:
        if not given:
            variables = _init_variables(model, init_rngs, args, kwargs)
        else:
            variables = _check_variables(variables, _init_shapes(model, init_rngs, args, kwargs))
    except TypeError as error:
        if "deterministic" not in str(error):
            raise
        raise TypeError(f"{_DETERMINISTIC_NEEDED}: {error}") from error
    if given:
        # The state owns its buffers: `fit` donates them, which would delete the
        # caller's arrays (an FP32 model's, shared by `qat.from_fp32`'s variables).
        variables = copy_state(variables)
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


def schedule_update_count(state: TrainState) -> int | None:
    """The update count that `state`'s in-state schedule reads, or None without one.

    The schedule gives the rate of an update from the optimizer's count of
    applied updates (`FlatAdamWState.count`), not from `state.step`: a
    skipped step (non-finite loss or gradient) or a batch without an observed
    target advances the step but not the count. Reads the count from the device.
    """
    _check_state("schedule_update_count", state)
    nodes = jax.tree.leaves(state.opt_state, is_leaf=_is_flat_state)
    counts = [node.count for node in nodes if _is_flat_state(node) and node.schedule is not None]
    return int(counts[0]) if len(counts) == 1 else None


def with_schedule_steps(state: TrainState, total_steps: int) -> TrainState:
    """`state` with its in-state schedule ending at `total_steps`, without compiling again.

    The warmup, peak and end learning rates stay; the cosine now spans
    updates `warmup_steps .. total_steps`. The schedule is indexed by the
    optimizer's update count (`schedule_update_count`), which skipped steps
    leave behind `state.step`, so `total_steps` counts applied updates.
    Because the schedule's numbers are data of the optimizer state, the next
    `train_step` runs the step already compiled for `state`. The other arrays
    are shared with `state` (nothing is copied).

    Args:
      state: a train state whose optimizer was built with a `WarmupCosine`
        (`make_optimizer(warmup_cosine_schedule(...))`).
      total_steps: the new end of the cosine, in updates: above the warmup
        steps, and not below the state's update count.

    Returns:
      The new `TrainState`.

    Raises:
      ValueError: when `state`'s optimizer keeps no schedule in its state, or
        `total_steps` is not above the warmup or is below the update count.
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
    count = schedule_update_count(state)
    if count is not None and total_steps < count:
        raise ValueError(
            f"with_schedule_steps: total_steps must not be below the state's update count "
            f"({count}, what the schedule reads: step {int(state.step)} less the steps that "
            f"applied no update), got {total_steps}"
        )
    return _with_schedule(state, dataclasses.replace(schedule, total_steps=int(total_steps)))


@jax.jit
def copy_state(state: TrainState) -> TrainState:
    """A copy of a train state (or any pytree of arrays) with fresh buffers.

    `train_step` donates its state's buffers, so a state that must survive
    the step (the best state so far, the start of two runs compared) is
    copied first. One compiled copy of the whole tree: eagerly, every
    distinct leaf shape would compile a copy of its own.
    """
    return jax.tree.map(jnp.copy, state)
