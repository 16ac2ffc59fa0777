"""Quantization-aware models, their conversion to int8 and integer inference.

A model is quantized through its dense layers' `dot_general_cls` hook (the
one of `tft_jax.linear.Linear`/`VariableLinear` and of `flax.linen.Dense`);
no model code is copied. `QATModel(model, qat_config)` does this for any Linen
model with a `dot_general_cls` field, `QATTemporalFusionTransformer(config,
qat_config)` for the TFT. The wrapper shares its scope with the wrapped
model, so its `'params'` tree is the FP32 model's, and `from_fp32` only adds
a fresh `'quant_stats'` collection (plus `'quant_params'` with
`learnable_scale`). Layers built without the hook (a float head) stay float
through QAT, `convert` and `int8_apply`.

Typical flow::

    qat_model = QATModel(my_model, QATConfig(bits=8))   # or QATTemporalFusionTransformer
    qat_vars = from_fp32(fp32_vars, qat_model, x)       # sample inputs fix the shapes
    qat_vars = calibrate(qat_model, qat_vars, batches)  # observers see data
    ... train qat_vars['params'] with calibrate=False ...  # fake-quant forward, STE gradient
    int8_vars = convert(qat_vars)
    out = int8_apply(qat_model, int8_vars, x)

Fake quantization has a straight-through gradient: train with reverse mode
(`jax.grad`, `jax.vjp`); forward mode (`jax.jvp`, `jax.linearize`) raises.

In the TFT the activation-activation products inside attention (`QKᵀ`, `PV`)
and the variable-selection weighting are not weight matmuls and stay in float.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import itertools
import numbers
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, overload

import jax
import jax.numpy as jnp
import numpy as np
from flax import errors as flax_errors
from flax import linen as nn
from flax import traverse_util
from flax.core import unfreeze

from qat.config import QATConfig, check_fixed_layout_config
from qat.dot_general import (
    BITS,
    CONTRACTED_AXES,
    INT8,
    QUANT_PARAMS,
    QUANT_STATS,
    EmptyCalibrationInput,
    calibration_pass,
    check_calibrate_flag,
    int8_scale_shape,
    integer_factory,
    non_finite_range_message,
    observed_range_finite,
    quantize_weight,
    quantizing_factory,
)
from qat.fake_quant import is_concrete
from tft_jax.caller_frame import user_stacklevel
from tft_jax.config import TFTConfig
from tft_jax.data.listing import first_few
from tft_jax.linear import InputWidthError
from tft_jax.model import TemporalFusionTransformer, TFTOutput
from tft_jax.static_arguments import from_static_argument, static_argument

Array = Any
Variables = Mapping[str, Any]
_INPUT_NAMES = (
    "static",
    "historical",
    "future",
    "known_history",
    "static_categorical",
    "known_categorical_history",
    "future_categorical",
    "observed_categorical",
)


def _check_qat_config(qat_config: Any, owner: str) -> None:
    """Raises `TypeError` unless `qat_config` is a `QATConfig`; warns if it sets a layout field.

    A layout field set away from its default would otherwise be ignored without a word.
    """
    # The warning points at the line that builds the model, past Flax's dataclass __init__.
    check_fixed_layout_config(qat_config, owner, "qat_config")


def _accepts_deterministic(module: nn.Module, num_args: int = 0) -> bool:
    """Whether `module` takes `deterministic` by keyword, not already given among `num_args`."""
    try:
        parameters = list(inspect.signature(type(module).__call__).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    positional = [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    names = {p.name for p in parameters}
    return "deterministic" in names and "deterministic" not in positional[:num_args]


class _QuantizedModel(nn.Module):
    """What `from_fp32`, `calibrate` and `int8_apply` need of a QAT wrapper."""

    def with_dot_general(
        self, dot_general_cls: Callable[..., nn.Module] | None, parent: Any = None
    ) -> nn.Module:
        """The wrapped model with `dot_general_cls` in every hooked layer."""
        raise NotImplementedError

    def batch_inputs(self, batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """`(args, kwargs)` of the model for one calibration batch.

        A `tft_jax.train.Batch` gives the inputs its train step passes
        (`tft_jax.train_state.model_inputs`), unless only a model taking the
        `Batch` itself as its one argument fits it.
        """
        train_inputs = _train_batch_inputs(batch)
        if train_inputs is not None:
            if self.call_mismatch(*train_inputs) is None or self.call_mismatch((batch,), {}):
                return train_inputs
            return (batch,), {}
        if isinstance(batch, Mapping):
            return (), dict(batch)
        if isinstance(batch, tuple | list):
            return tuple(batch), {}
        return (batch,), {}

    def call_mismatch(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
        """Why the wrapped model cannot be called with `(args, kwargs)`; None when it can."""
        return None

    def inference_kwargs(self, kwargs: Mapping[str, Any], num_args: int = 0) -> dict[str, Any]:
        """`kwargs` plus `deterministic=True` when the model takes it and it was not given.

        `num_args` counts the positional arguments of the call: `deterministic`
        given by position among them is given.
        """
        kwargs = dict(kwargs)
        if "deterministic" not in kwargs and _accepts_deterministic(
            self.with_dot_general(None), num_args
        ):
            kwargs["deterministic"] = True
        return kwargs

    def _quantized_call(self, calibrate: bool, args: tuple[Any, ...], kwargs: dict[str, Any]):
        check_calibrate_flag(type(self).__name__, calibrate)
        if calibrate and not self.is_mutable_collection(QUANT_STATS):
            raise ValueError(
                "calibrate=True updates the observers: apply with mutable=['quant_stats']"
            )
        if INT8 in self.variables:
            # Its kernels are integer codes: a float layer would read them as weights.
            raise ValueError(
                "the variables hold the 'int8' collection of qat.convert: run them with "
                "qat.int8_apply, or apply the QAT model to the QAT variables"
            )
        # Quantization off: the FP32 model itself, so the output is exactly the FP32 one.
        dot_general_cls = (
            quantizing_factory(self.qat_config, calibrate) if self.qat_config.enabled else None
        )
        model = self.with_dot_general(dot_general_cls, parent=self)
        nn.share_scope(self, model)
        with (
            calibration_pass() if calibrate else contextlib.nullcontext(),
            _inputs_fitting("the QAT model's inputs"),
        ):
            output = model(*args, **kwargs)
        # Every init (from_fp32's, create_train_state's, the user's) creates the
        # `bits` markers of the layers that got the hook: none, and the QAT model
        # would be the FP32 one, silently (only convert noticed).
        if (
            self.is_initializing()
            and self.qat_config.enabled
            and not _holds_markers(self.variables.get(QUANT_STATS, {}))
        ):
            raise ValueError(_no_quantized_layer(self))
        return output


def _train_batch_inputs(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The model inputs of a `tft_jax.train.Batch` as its train step passes them, else None.

    Looked up only when `tft_jax.train_state` is loaded (a `Batch` exists only then):
    `qat` does not import the training code.
    """
    train_state = sys.modules.get("tft_jax.train_state")
    if train_state is None or not isinstance(batch, train_state.Batch):
        return None
    args, kwargs = train_state.model_inputs(batch)
    return tuple(args), dict(kwargs)


def _holds_markers(stats: Any) -> bool:
    """Whether `'quant_stats'` holds a `bits` marker: some layer ran through `QATDotGeneral`."""
    return any(path[-1] == BITS for path in traverse_util.flatten_dict(unfreeze(stats)))


def _wrapped_name(qat_model: _QuantizedModel) -> str:
    """The class name of the FP32 model a QAT wrapper quantizes."""
    model = getattr(qat_model, "model", None)
    return type(model).__name__ if model is not None else TemporalFusionTransformer.__name__


# How a model hands its hook to a layer, in the messages.
_HOOK_EXAMPLE = (
    "nn.Dense(..., dot_general_cls=self.dot_general_cls) or "
    "tft_jax.Linear(..., dot_general_cls=self.dot_general_cls)"
)


def _no_quantized_layer(qat_model: _QuantizedModel) -> str:
    """The message for a QAT model with quantization on in which no layer got the hook."""
    name = _wrapped_name(qat_model)
    return (
        f"{type(qat_model).__name__}: no layer of {name} received its dot_general_cls: {name} "
        "has the field but passes it to no layer (or has no dense layer), so "
        f"QATConfig(bits={qat_model.qat_config.bits}) would quantize nothing (the QAT forward "
        "would be the FP32 one, and qat.convert would have nothing to convert). Pass the hook "
        f"to the layers to quantize, e.g. {_HOOK_EXAMPLE}"
    )


class QATModel(_QuantizedModel):
    """Any Linen model with a `dot_general_cls` field, fake-quantized where it uses the hook.

    The wrapped model's layers that receive its `dot_general_cls` (e.g.
    `nn.Dense(..., dot_general_cls=self.dot_general_cls)` or
    `tft_jax.Linear(..., dot_general_cls=...)`) get a `QATDotGeneral`;
    every other layer stays float, in QAT and after `convert`. Hooked layers
    under `nn.scan`/`nn.vmap` (a stack of layers) work when the lift maps
    `'quant_stats'`, `'quant_params'` and `'int8'` along with `'params'`
    (`variable_axes`): each copy keeps its own observer and scales.

    Attributes:
      model: the FP32 model (its own `dot_general_cls` is replaced).
      qat_config: bits, moving-average constant and `learnable_scale`; the
        layout is `QATTemporalFusionTransformer`'s (weights per-channel
        symmetric, activations per-tensor affine with a moving-average observer).

    Call: the model's own arguments plus `calibrate`, a bool (True updates the
    observers; apply with `mutable=['quant_stats']`). A hooked layer called
    more than once per call is observed once, with the range of all its
    calls, except across JAX traces (under `nn.remat` or `nn.jit` each call
    is observed on its own; `qat.dot_general.calibration_pass`).
    `convert`'s variables are refused (`ValueError`): run them with `int8_apply`,
    and so is, with quantization on, a model none of whose layers receives the
    hook (`init`, `from_fp32` and `calibrate` raise `ValueError`: it would run
    as the FP32 model).
    """

    model: nn.Module
    qat_config: QATConfig = QATConfig()

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise TypeError(f"model must be a flax.linen Module, got {type(self.model).__name__}")
        fields = {field.name for field in dataclasses.fields(self.model)}
        if "dot_general_cls" not in fields:
            raise TypeError(
                f"model must have a dot_general_cls field (the hook its dense layers take), "
                f"{type(self.model).__name__} has none"
            )
        _check_qat_config(self.qat_config, "QATModel")
        super().__post_init__()

    def with_dot_general(
        self, dot_general_cls: Callable[..., nn.Module] | None, parent: Any = None
    ) -> nn.Module:
        # A fresh name: the field's own ("model") is taken by the adopted submodule.
        name = None if parent is None else "quantized"
        return self.model.clone(parent=parent, name=name, dot_general_cls=dot_general_cls)

    def call_mismatch(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
        try:
            signature = inspect.signature(type(self.model).__call__)
        except (TypeError, ValueError):  # no signature to read: the call itself will tell
            return None
        try:
            signature.bind(None, *args, **kwargs)  # None for `self`
        except TypeError as error:
            # Without `self` and the annotations: the names and defaults.
            empty = inspect.Parameter.empty
            parameters = list(signature.parameters.values())[1:]
            shown = signature.replace(
                parameters=[p.replace(annotation=empty) for p in parameters],
                return_annotation=empty,
            )
            return f"{type(self.model).__name__}.__call__{shown} does not take it: {error}"
        return None

    @nn.compact
    def __call__(self, *args: Any, calibrate: bool = False, **kwargs: Any) -> Any:
        return self._quantized_call(calibrate, args, kwargs)


class QATTemporalFusionTransformer(_QuantizedModel):
    """The TFT with fake quantization in every dense layer (the FP32 model with QATDotGeneral).

    Attributes:
      config: the model's `TFTConfig`.
      qat_config: bits, moving-average constant and `learnable_scale`. The
        layout is fixed: weights per-channel symmetric (scale `max|w|/qmax`,
        no state), activations per-tensor affine observed with a moving
        average in `'quant_stats'` (the LSTM hidden state uses its known range
        `[-1, 1]` instead, into which each row of the initial state, the
        static encoder's, is scaled by a power of two). `bits=None` switches
        quantization off: the output
        is then exactly the FP32 model's.

    With `learnable_scale=True` each observed activation also has a trainable
    step-size offset in the `'quant_params'` collection (see `QATDotGeneral`);
    a training step then differentiates `'params'` and `'quant_params'`.

    Call arguments are the FP32 model's (categorical inputs over time
    included) plus `calibrate`, a bool: True updates the
    activation observers (apply with `mutable=['quant_stats']`), False freezes
    them; frozen, the variable selection networks run over chunks of rows with
    each layer quantized exactly as layer by layer
    (`tft_jax.quantized_selection`), while calibration runs every layer once
    on the whole activation. An observer that has not seen a batch leaves its
    activation unquantized, so before the first calibration only the weights are
    fake-quantized. As in the FP32 model, `deterministic` is required when
    `dropout_rate > 0`. `convert`'s variables are refused (`ValueError`):
    run them with `int8_apply`.
    """

    config: TFTConfig
    qat_config: QATConfig = QATConfig()

    def __post_init__(self) -> None:
        if not isinstance(self.config, TFTConfig):
            raise TypeError(f"config must be a TFTConfig, got {type(self.config).__name__}")
        _check_qat_config(self.qat_config, "QATTemporalFusionTransformer")
        super().__post_init__()

    def with_dot_general(
        self, dot_general_cls: Callable[..., nn.Module] | None, parent: Any = None
    ) -> nn.Module:
        return TemporalFusionTransformer(
            self.config, dot_general_cls=dot_general_cls, parent=parent
        )

    def batch_inputs(self, batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The TFT inputs of a mapping or an object (e.g. `tft_jax.train.Batch`) by name."""
        if isinstance(batch, Mapping):
            return (), {name: batch.get(name) for name in _INPUT_NAMES}
        if isinstance(batch, tuple | list) and not hasattr(batch, "_fields"):
            # Its items have no names: every input would read as missing.
            raise TypeError(
                f"a TFT calibration batch must be a mapping or an object (e.g. "
                f"tft_jax.train.Batch) with the inputs by name ({', '.join(_INPUT_NAMES[:3])}, "
                f"...), got a {type(batch).__name__} of {len(batch)} items"
            )
        return (), {name: getattr(batch, name, None) for name in _INPUT_NAMES}

    @nn.compact
    def __call__(
        self,
        static: Array | None,
        historical: Array,
        future: Array,
        known_history: Array | None = None,
        static_categorical: Array | None = None,
        deterministic: bool | None = None,
        calibrate: bool = False,
        known_categorical_history: Array | None = None,
        future_categorical: Array | None = None,
        observed_categorical: Array | None = None,
    ) -> TFTOutput:
        args = (static, historical, future, known_history, static_categorical, deterministic)
        # Categorical codes only index embedding tables, which stay float (no matmul).
        categorical = {
            "known_categorical_history": known_categorical_history,
            "future_categorical": future_categorical,
            "observed_categorical": observed_categorical,
        }
        return self._quantized_call(calibrate, args, categorical)


def _check_variables(name: str, variables: Any) -> None:
    """Raises `TypeError` unless `variables` is a mapping of collections (Flax's variables)."""
    if not isinstance(variables, Mapping):
        raise TypeError(
            f"{name} must be a mapping of variable collections (e.g. {{'params': ...}}), got "
            f"{type(variables).__name__}"
        )


def _check_model(qat_model: Any) -> None:
    if not isinstance(qat_model, _QuantizedModel):
        raise TypeError(
            "qat_model must be a qat.QATModel or a qat.QATTemporalFusionTransformer, got "
            f"{type(qat_model).__name__}"
        )


def _tree_shapes(tree: Any) -> Any:
    return jax.tree.map(lambda leaf: (tuple(jnp.shape(leaf)), jnp.result_type(leaf).name), tree)


def _shape_differences(got: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """Each parameter path where two `_tree_shapes` trees differ, `got` against `expected`."""
    got_flat = traverse_util.flatten_dict(dict(got), sep="/")
    expected_flat = traverse_util.flatten_dict(dict(expected), sep="/")
    differences = []
    for path in sorted(set(got_flat) | set(expected_flat)):
        if path not in got_flat:
            differences.append(f"{path} is missing")
        elif path not in expected_flat:
            differences.append(f"{path} is not a parameter of the QAT model")
        elif got_flat[path] != expected_flat[path]:
            (shape, dtype), (want, want_dtype) = got_flat[path], expected_flat[path]
            differences.append(
                f"{path} is {shape} {dtype}, the sample inputs make it {want} {want_dtype}"
            )
    return differences


# Whether an `_inputs_fitting` is already naming the inputs (`calibrate`'s, around the
# QAT model's own): the outermost names them, with the batch.
_NAMING_INPUTS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "_NAMING_INPUTS", default=False
)


@contextlib.contextmanager
def _inputs_fitting(name: str) -> Iterator[None]:
    """The error for inputs that do not fit the parameters (Flax's, or a layer's own
    `InputWidthError`), as a `ValueError` naming `name`."""
    if _NAMING_INPUTS.get():
        yield
        return
    token = _NAMING_INPUTS.set(True)
    try:
        yield
    except (flax_errors.ScopeParamShapeError, InputWidthError) as error:
        raise ValueError(
            f"{name} do not fit the variables (inputs of another shape than the model's, or "
            f"variables of another model): {error}"
        ) from error
    finally:
        _NAMING_INPUTS.reset(token)


@contextlib.contextmanager
def _naming_batch(index: int) -> Iterator[None]:
    """An empty activation met while calibrating, named with its batch."""
    try:
        yield
    except EmptyCalibrationInput as error:
        raise ValueError(f"calibrate: batch {index} (counting from 0): {error}") from None


_Static = tuple[tuple[tuple[int, Any], ...], tuple[tuple[str, Any], ...]]


def _is_flag(value: Any) -> bool:
    """Python scalars (bools, strings, ints, floats: `num_steps=2`) are static, not traced."""
    return isinstance(value, bool | str | int | float)


def _split_flags(
    args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], _Static]:
    """`(array args, array kwargs, hashable flags)`: Python scalars must stay static under jit.

    A flag given by position (`model(x, False)`) keeps its place: it is None
    among the array args and `(position, value)` among the flags.
    """
    positional = tuple((i, v) for i, v in enumerate(args) if _is_flag(v))
    arrays = tuple(None if _is_flag(v) else v for v in args)
    keywords = tuple(sorted((k, v) for k, v in kwargs.items() if _is_flag(v)))
    return arrays, {k: v for k, v in kwargs.items() if not _is_flag(v)}, (positional, keywords)


def _join_flags(
    args: tuple[Any, ...], kwargs: dict[str, Any], flags: _Static
) -> tuple[list[Any], dict[str, Any]]:
    """The call's `(args, kwargs)` with the flags `_split_flags` took out put back."""
    positional, keywords = flags
    joined = list(args)
    for index, value in positional:
        joined[index] = value
    return joined, {**kwargs, **dict(keywords)}


@functools.partial(jax.jit, static_argnums=(0, 4))
def _initial_variables(
    qat_model: _QuantizedModel,
    rngs: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    flags: _Static,
) -> dict[str, Any]:
    """The QAT model's `init`; `from_fp32` takes its shapes, traced once per equal model."""
    joined, kwargs = _join_flags(args, kwargs, flags)
    return from_static_argument(qat_model).init(rngs, *joined, **kwargs)


@functools.partial(jax.jit, static_argnums=(0, 1, 5))
def _fresh_state(
    qat_model: _QuantizedModel,
    collections: tuple[str, ...],
    rngs: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    flags: _Static,
) -> dict[str, Any]:
    """The initial non-parameter collections; XLA prunes the unused params init and forward.

    The init inside is `_initial_variables`, whose trace `from_fp32` already made.
    """
    variables = _initial_variables(qat_model, rngs, args, kwargs, flags)
    return {name: variables[name] for name in collections}


def from_fp32(
    fp32_variables: Variables, qat_model: _QuantizedModel, *inputs: Any, **kwargs: Any
) -> dict[str, Any]:
    """The QAT model's variables from a trained FP32 model's: same params, fresh observers.

    `inputs` and `kwargs` are sample inputs of the model (only their shapes
    matter), e.g. `static, historical, future[, known_history,
    static_categorical]` (the categorical inputs over time by keyword) for
    the TFT or `x` for an MLP. Returns `{'params': fp32 params,
    'quant_stats': fresh}` (and `'quant_params'` of zeros with
    `learnable_scale`); the model's other collections (e.g. BatchNorm's
    `'batch_stats'`) are carried over from `fp32_variables`. Raises
    `ValueError` if the FP32 params (or a carried collection) do not match
    the QAT model's tree, or if, with quantization on, no layer of the
    wrapped model received its `dot_general_cls` (a model that has the field
    but hands it to no layer would run as the FP32 model; so does any `init`
    of such a QAT model).
    """
    _check_model(qat_model)
    _check_variables("fp32_variables", fp32_variables)
    if "params" not in fp32_variables:
        raise ValueError(f"fp32_variables must hold 'params', got keys {sorted(fp32_variables)}")
    kwargs = qat_model.inference_kwargs(kwargs, len(inputs))
    rngs = {"params": jax.random.key(0), "dropout": jax.random.key(0)}
    args, array_kwargs, flags = _split_flags(tuple(inputs), kwargs)

    expected = _initial_variables.eval_shape(
        static_argument(qat_model), rngs, args, array_kwargs, flags
    )
    params = unfreeze(fp32_variables["params"])
    expected_shapes = _tree_shapes(unfreeze(expected["params"]))
    differences = _shape_differences(_tree_shapes(params), expected_shapes)
    if differences:
        shown = first_few(differences, separator="; ")
        raise ValueError(
            "fp32_variables['params'] does not match the QAT model's parameter tree built on "
            f"the sample inputs: {shown}. The sample inputs must have the shapes the FP32 "
            "model was built on, and the variables must be that model's"
        )
    # The model's own state (BatchNorm's 'batch_stats', say) is the trained FP32 one.
    carried = {}
    for name in expected:
        if name in ("params", QUANT_STATS, QUANT_PARAMS) or name not in fp32_variables:
            continue
        carried[name] = unfreeze(fp32_variables[name])
        want = _tree_shapes(unfreeze(expected[name]))
        if _tree_shapes(carried[name]) != want:
            raise ValueError(
                f"fp32_variables[{name!r}] does not match the QAT model's {name!r} collection: "
                f"got {_tree_shapes(carried[name])}, expected {want}"
            )
    state_collections = tuple(name for name in expected if name != "params" and name not in carried)
    state = unfreeze(
        _fresh_state(static_argument(qat_model), state_collections, rngs, args, array_kwargs, flags)
    )
    state.setdefault(QUANT_STATS, {})
    return {"params": params, **carried, **state}


def _observers(stats: Any) -> dict[tuple[str, ...], dict[str, Any]]:
    """`{layer path: {'min', 'max', 'num_batches'}}` of the activation observers in `stats`."""
    flat = traverse_util.flatten_dict(unfreeze(stats))
    return {
        path[:-1]: {key: flat[(*path[:-1], key)] for key in ("min", "max", "num_batches")}
        for path in flat
        if path[-1] == "num_batches" and (*path[:-1], "min") in flat and (*path[:-1], "max") in flat
    }


def _observer_finite(observer: Mapping[str, Array]) -> Array:
    """Whether an observer's range is finite wherever it has seen a batch (a bool scalar).

    An observer of a layer under `nn.scan`/`nn.vmap` holds one range per
    layer: `(L,)` leaves, each copy checked.
    """
    return jnp.all(
        (observer["num_batches"] == 0)
        | (jnp.isfinite(observer["min"]) & jnp.isfinite(observer["max"]))
    )


def _check_ranges_finite(variables: Variables, name: str) -> None:
    """Raises `ValueError` naming the layers whose concrete observed range holds NaN or inf.

    Traced observers (inside `jax.jit`) are not checked.
    """
    layers = [
        "/".join(path)
        for path, observer in _observers(variables.get(QUANT_STATS, {})).items()
        if all(is_concrete(value) for value in observer.values())
        and not observed_range_finite(observer["min"], observer["max"], observer["num_batches"])
    ]
    if layers:
        shown = _first_few(layers)
        where = f"{name}: the activation observers of {len(layers)} layer(s) ({shown}) hold"
        raise ValueError(non_finite_range_message(where))


def _observed_ranges_finite(stats: Any) -> Array:
    """Whether every observer that has seen a batch holds a finite range (a bool scalar)."""
    finite = [_observer_finite(observer) for observer in _observers(stats).values()]
    return jnp.all(jnp.stack(finite)) if finite else jnp.asarray(True)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _calibration_step(
    qat_model: _QuantizedModel,
    variables: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    flags: _Static,
) -> tuple[dict[str, Any], Array]:
    """The variables after one deterministic forward with the observers updating.

    Also returns whether every observed range is still finite (NaN or inf in
    the batch, or an overflowing activation, would poison the scales).
    """
    joined, kwargs = _join_flags(args, kwargs, flags)
    _, updates = from_static_argument(qat_model).apply(
        variables, *joined, **kwargs, calibrate=True, mutable=[QUANT_STATS]
    )
    stats = updates.get(QUANT_STATS, {})  # none when no layer is quantized
    return {**variables, QUANT_STATS: stats}, _observed_ranges_finite(stats)


def _check_marked_bits(qat_model: _QuantizedModel, qat_variables: Variables) -> None:
    """Raises `ValueError` when the variables' layers were made for another bit width.

    The forward would quantize at the model's width while the markers keep
    the variables' one, which `convert` then uses for the weights.
    """
    bits = qat_model.qat_config.bits
    other = {
        "/".join(path): width
        for path, width in quantized_layers(qat_variables).items()
        if width is not None and width != bits
    }
    if other:
        shown = _first_few([f"{path} ({width} bits)" for path, width in other.items()])
        raise ValueError(
            f"qat_variables were made for another bit width than the model's QATConfig.bits="
            f"{bits}: {shown}; calibrate them with the QAT model they were made with"
        )


def _check_batches(batches: Any) -> None:
    """Raises `TypeError` unless `batches` is an iterable of batches (not one mapping batch)."""
    if isinstance(batches, Mapping | str | bytes) or not isinstance(batches, Iterable):
        raise TypeError(
            f"batches must be an iterable of batches (e.g. a list or a generator), got "
            f"{type(batches).__name__}; wrap a single batch in a list: [batch]"
        )


# The forms of a `QATModel` calibration batch, in the messages.
_BATCH_FORMS = (
    "an array (one argument), a tuple or list (positional arguments), a mapping (keyword "
    "arguments) or a tft_jax.train.Batch (the inputs its train step passes)"
)


def _batch_mismatch(index: int, mismatch: str, batch: Any, batches: Any) -> str:
    """The message for a calibration batch the wrapped model cannot be called with."""
    message = (
        f"calibrate: batch {index} (counting from 0) does not fit the model: {mismatch}. "
        f"A QATModel calibration batch is the model's input: {_BATCH_FORMS}"
    )
    if isinstance(batches, tuple | list) and hasattr(batch, "shape"):
        # `(static, historical, future)` given as `batches`: each array read as a batch.
        message += (
            f"; batches is a {type(batches).__name__} of {len(batches)} items whose items are "
            "arrays, each read as one batch of one argument: for one batch of several "
            "arguments wrap it in a list, [(a, b, ...)]"
        )
    return message


def _first_few(paths: list[str]) -> str:
    """The first three layer paths of a message, `...` for the rest."""
    return ", ".join(paths[:3]) + (", ..." if len(paths) > 3 else "")


def _raise_non_finite(variables: Mapping[str, Any], finite: list[Array]) -> None:
    """Raises `ValueError` naming the first batch and the layers with a NaN or inf range."""
    per_batch = np.asarray(jnp.stack(finite))
    if per_batch.all():
        return
    layers = [
        "/".join(path)
        for path, observer in _observers(variables.get(QUANT_STATS, {})).items()
        if not bool(_observer_finite(observer))
    ]
    shown = _first_few(layers)
    raise ValueError(
        f"calibration batch {int(np.argmin(per_batch))} (counting from 0) made the observed "
        f"activation range NaN or inf in {len(layers)} layer(s) ({shown}): the batch holds "
        "NaN or inf, or an activation overflows, and every scale computed from that range "
        "would be NaN or inf. Clean the batches and calibrate the variables you passed in again"
    )


def calibrate(
    qat_model: _QuantizedModel,
    qat_variables: Variables,
    batches: Iterable[Any],
    num_batches: int | np.integer | None = None,
) -> dict[str, Any]:
    """Runs the observers over at most `num_batches` batches (default `calibration_batches`).

    For the TFT each batch is a mapping or an object (e.g.
    `tft_jax.train.Batch`) with `static, historical, future` and optionally
    `known_history, static_categorical`. For a `QATModel` a batch is the
    model's input: an array (one argument), a tuple or list (positional
    arguments; a bool or string among them stays a static Python value, as
    by keyword), a mapping (keyword arguments) or a `tft_jax.train.Batch`
    (the inputs the train step passes: `static, historical, future`,
    `known_history=`, `static_categorical=` and the categorical inputs over
    time it holds). `batches` is iterated: one
    array given as `batches` is a stack of batches along its first axis,
    not a batch, and a tuple of arrays is a batch each. The forward is deterministic
    (`deterministic=True` when the model takes it); only `'quant_stats'` changes.
    At most `num_batches` batches are drawn from `batches`: an iterator is
    not advanced past them.

    Raises:
      TypeError: `batches` is not an iterable of batches (e.g. one mapping
        batch: wrap it in a list), a TFT batch is a plain tuple or list
        (its inputs have no names), or a `QATModel` batch does not fit the
        wrapped model's call signature (checked before it runs).
      ValueError: `batches` is empty (the observers would stay uncalibrated,
        the activations unquantized), no layer of the wrapped model received
        its `dot_general_cls` (nothing to calibrate or quantize), or a batch
        made an observed range NaN or inf (NaN or inf in the batch, or an
        overflowing activation).

    Warns:
      UserWarning: `QATConfig.bits` is None: there is nothing to calibrate.
    """
    _check_model(qat_model)
    _check_variables("qat_variables", qat_variables)
    limit = qat_model.qat_config.calibration_batches if num_batches is None else num_batches
    if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1:
        raise ValueError(f"num_batches must be a positive int, got {num_batches!r}")
    limit = int(limit)
    _check_batches(batches)
    _check_marked_bits(qat_model, qat_variables)
    # A poisoned moving average stays NaN or inf: blaming the first batch would mislead.
    _check_ranges_finite(qat_variables, "qat_variables")
    enabled = qat_model.qat_config.enabled
    if not enabled:
        warnings.warn(
            "calibrate: qat_model's QATConfig.bits is None (quantization off): there are no "
            "activation observers to calibrate, and the variables come back unchanged",
            UserWarning,
            stacklevel=user_stacklevel(),
        )

    variables = dict(qat_variables)
    finite = []
    for index, batch in enumerate(itertools.islice(batches, limit)):
        args, kwargs = qat_model.batch_inputs(batch)
        kwargs = qat_model.inference_kwargs(kwargs, len(args))
        mismatch = qat_model.call_mismatch(tuple(args), kwargs)
        if mismatch is not None:
            raise TypeError(_batch_mismatch(index, mismatch, batch, batches))
        with _inputs_fitting(f"calibrate: the inputs of batch {index}"), _naming_batch(index):
            variables, batch_finite = _calibration_step(
                static_argument(qat_model), variables, *_split_flags(tuple(args), kwargs)
            )
        if index == 0 and enabled and not _holds_markers(variables.get(QUANT_STATS, {})):
            # The forward ran with 'quant_stats' mutable: every hooked layer marked itself.
            raise ValueError(f"calibrate: {_no_quantized_layer(qat_model)}")
        finite.append(batch_finite)
    if not finite:
        raise ValueError(
            "batches is empty: calibrate needs at least one batch (the observers would stay "
            "uncalibrated and the activations unquantized)"
        )
    _raise_non_finite(variables, finite)
    _warn_zero_ranges(variables)
    return variables


def _warn_zero_ranges(variables: Mapping[str, Any]) -> None:
    """Warns when an observer saw only zeros: its range is `[0, 0]`.

    Its scale is then the `EPS` floor, so every nonzero activation of that
    layer later quantizes to about zero or clips: the batches did not
    exercise the layer's input (an all-zero feature, a padded or masked input).
    """
    zero = [
        "/".join(path)
        for path, observer in _observers(variables.get(QUANT_STATS, {})).items()
        if np.any(
            (np.asarray(observer["num_batches"]) > 0)
            & (np.asarray(observer["min"]) >= 0.0)
            & (np.asarray(observer["max"]) <= 0.0)
        )
    ]
    if zero:
        shown = _first_few(zero)
        warnings.warn(
            f"calibrate: {len(zero)} activation observer(s) saw only zeros ({shown}): their "
            "range is [0, 0], so every nonzero input of those layers will quantize to about 0. "
            "Calibrate on batches that exercise those inputs",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def quantized_layers(qat_variables: Variables) -> dict[tuple[str, ...], int | None]:
    """`{dot_general path: bits}` of every layer that ran through `QATDotGeneral`.

    Read from the `bits` markers in `'quant_stats'`; a path is the layer's
    path plus the contraction module's name (e.g. `('Dense_0', 'dot_general')`).
    `bits` is None when the marker is traced (inside `jax.jit`). A layer under
    `nn.scan` or `nn.vmap` holds one marker per copy (an `(L,)` array), all
    of one width.

    Raises:
      ValueError: the copies of a lifted layer record different widths.
    """
    _check_variables("qat_variables", qat_variables)
    stats = traverse_util.flatten_dict(unfreeze(qat_variables.get(QUANT_STATS, {})))
    return {
        path[:-1]: _marker_bits(path[:-1], value) if is_concrete(value) else None
        for path, value in stats.items()
        if path[-1] == BITS
    }


def _marker_bits(path: tuple[str, ...], marker: Array) -> int:
    """The bit width a layer's `bits` marker records: a scalar, or `(L,)` equal values."""
    widths = np.unique(np.asarray(marker))
    if widths.size != 1:
        raise ValueError(
            f"the quantized layer {'/'.join(path)} records several bit widths "
            f"{widths.tolist()} (one per copy of a lifted layer): convert needs one"
        )
    return int(widths[0])


def _contracted_axes(
    path: tuple[str, ...], stats: Mapping[tuple[str, ...], Any], kernel_ndim: int
) -> tuple[int, ...]:
    """The kernel axes a layer contracts: its `contracted_axes` marker, else the second-to-last.

    The marker is a 0/1 mask over the axes of the kernel as the contraction
    saw it; a layer under `nn.scan`/`nn.vmap` holds one row per copy and a
    kernel with the copies' axes in front, which shift the axes.
    """
    marker = stats.get((*path, CONTRACTED_AXES))
    if marker is None:
        return (kernel_ndim - 2,)
    rows = np.unique(np.asarray(marker).reshape(-1, np.shape(marker)[-1]), axis=0)
    if rows.shape[0] != 1:
        raise ValueError(
            f"the quantized layer {'/'.join(path)} records several contractions "
            f"{rows.tolist()} (one per copy of a lifted layer): convert needs one"
        )
    lifted = kernel_ndim - rows.shape[1]
    if lifted < 0:
        raise ValueError(
            f"the quantized layer {'/'.join(path)} records a contraction over "
            f"{rows.shape[1]} kernel axes, but its kernel has {kernel_ndim}"
        )
    return tuple(lifted + int(axis) for axis in np.flatnonzero(rows[0]))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _quantize_kernels(
    kernels: tuple[Array, ...],
    bits: tuple[int, ...],
    contracted: tuple[tuple[int, ...], ...],
    dtype: Any = None,
) -> tuple[Any, ...]:
    """`(codes, scale)` per kernel, the scale shaped by `dot_general.int8_scale_shape`.

    With `dtype` each kernel is first rounded to it, as the dense layer casts
    it before its contraction. One compiled program for all layers (host
    arrays go in as they are): run eagerly, each distinct shape would compile
    its own transfer and squeeze.
    """
    quantized = []
    for kernel, width, axes in zip(kernels, bits, contracted, strict=True):
        if dtype is not None:
            kernel = kernel.astype(dtype)
        codes, scale = quantize_weight(kernel, axes, width)
        quantized.append((codes, scale.reshape(int8_scale_shape(kernel.shape, axes))))
    return tuple(quantized)


def _warn_uncalibrated(qat_variables: Variables) -> None:
    """Warns when activation observers have never seen a batch (they stay float when run)."""
    observers = _observers(qat_variables.get(QUANT_STATS, {}))
    idle = [
        "/".join(path)
        for path, obs in observers.items()
        if np.any(np.asarray(obs["num_batches"]) == 0)
    ]
    if idle:
        shown = _first_few(idle)
        warnings.warn(
            f"{len(idle)} of {len(observers)} activation observers never saw a batch ({shown}): "
            "their activations stay float in the converted model (weights are int8, but those "
            "matmuls are not integer ones); run qat.calibrate before qat.convert",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def _module_name(path: tuple[str, ...]) -> str:
    """A module path for messages: `Dense_0/dot_general`, a one-name path under `<root>`."""
    return "/".join(path) if len(path) > 1 else "/".join(("<root>", *path))


def _compute_dtype(dtype: Any) -> Any:
    """`dtype` as a NumPy float dtype (None stays None); `TypeError` naming `dtype` otherwise."""
    if dtype is None:
        return None
    try:
        resolved = jnp.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"dtype must be a floating dtype or None, got {dtype!r}") from error
    if not jnp.issubdtype(resolved, jnp.floating):
        raise TypeError(f"dtype must be a floating dtype or None, got {resolved.name}")
    return resolved


def convert(qat_variables: Variables, bits: int | None = None, dtype: Any = None) -> dict[str, Any]:
    """The int8 model: int8 kernels where the QAT model quantized, per-channel scales in `'int8'`.

    Exactly the layers that ran through `QATDotGeneral` are converted (found
    by the `bits` markers their `QATDotGeneral` wrote to `'quant_stats'`);
    every other leaf, a float `nn.Dense` head included, is returned
    unchanged. A converted layer's `kernel` (`(I, F)` of `Linear`/`nn.Dense`,
    `(V, I, F)` of `VariableLinear`) becomes its integer codes
    `round(w / s)`, `s = max|w| / qmax` over the input axis, dtype int8 and
    the same shape; its scale goes to `int8/<layer>/dot_general/weight_scale`
    (`(F,)` or `(V, F)`). A kernel contracted over other axes (recorded by
    the QAT layer, e.g. `nn.DenseGeneral` with several input or feature
    axes) is quantized over those, its scale of the kernel's shape with 1s
    at the contracted axes. Biases, LayerNorm and embeddings stay float.
    The other collections are carried over: `'quant_stats'` (and
    `'quant_params'`) for the activations, the model's own state (e.g.
    BatchNorm's `'batch_stats'`) as it is.

    Args:
      qat_variables: the QAT model's variables (from `from_fp32`, calibrated, trained).
      bits: optional check: the bit width the QAT model used (its
        `QATConfig.bits`); the width itself is always the one recorded in
        the variables.
      dtype: the compute dtype the QAT model's dense layers cast their
        kernels to before the contraction (the TFT's `TFTConfig.dtype`, e.g.
        `'bfloat16'`; `nn.Dense(dtype=...)`). Each kernel is rounded to it
        before quantizing, so codes and scales are exactly those the QAT
        forward used; quantizing the float32 parameters of a bfloat16 model
        instead changes about one code in nine. None (the default) quantizes
        the parameters as stored, which is exact for float32 compute.

    Raises:
      ValueError: no layer was quantized (variables not made by `from_fp32`
        of a QAT model with quantization on), `bits` differs from the QAT
        config's, a quantized contraction's second operand is not its
        layer's `kernel` param of at least 2 axes (an activation, say: only
        weight contractions convert), or a kernel is already integer (the
        variables are `convert`'s output: converting them again would read
        the codes as weights).

    Warns:
      UserWarning: some activation observers never saw a batch (`calibrate`
        was not run): those activations stay float in `int8_apply`, so the
        result is not an integer model there.
    """
    _check_variables("qat_variables", qat_variables)
    if "params" not in qat_variables:
        raise ValueError(f"qat_variables must hold 'params', got keys {sorted(qat_variables)}")
    if bits is not None and (isinstance(bits, bool) or not isinstance(bits, numbers.Integral)):
        raise TypeError(f"bits must be an int or None, got {type(bits).__name__} {bits!r}")
    bits = None if bits is None else int(bits)  # a NumPy integer too, as QATConfig takes
    dtype = _compute_dtype(dtype)
    layers = quantized_layers(qat_variables)
    if not layers:
        raise ValueError(
            "qat_variables has no quantized layer (no 'bits' marker in 'quant_stats'): make "
            "them with qat.from_fp32 of a QAT model whose QATConfig.bits is not None and whose "
            "wrapped model passes its dot_general_cls to the layers to quantize, e.g. "
            f"{_HOOK_EXAMPLE} (a model with the field that hands it to no layer quantizes "
            "nothing)"
        )
    if any(width is None for width in layers.values()):
        raise ValueError("convert reads the bit widths on the host: call it outside jax.jit")
    if bits is not None and set(layers.values()) != {bits}:
        raise ValueError(
            f"bits={bits} does not match the QAT model's QATConfig.bits "
            f"{sorted(set(layers.values()))}: the weights were trained for that width"
        )
    params = traverse_util.flatten_dict(unfreeze(qat_variables["params"]))
    kernel_paths = []
    for path in layers:
        kernel_path = (*path[:-1], "kernel")
        if kernel_path not in params:
            raise ValueError(
                f"the quantized contraction '{_module_name(path)}' has no 'kernel' param "
                f"beside it (in '{_module_name(path[:-1])}'): its second operand is not a "
                "'kernel' parameter (an activation, as in dot_general(h, h, ...), or a "
                "parameter under another name), and qat.convert converts only weight "
                "contractions, whose second operand is their layer's 'kernel' of >= 2 axes "
                "((I, F) or (V, I, F)); contract such operands with lax.dot_general rather "
                "than the dot_general_cls hook, or name the weight 'kernel'"
            )
        if jnp.ndim(params[kernel_path]) < 2:
            raise ValueError(
                f"the quantized contraction '{_module_name(path)}' contracts a 'kernel' of "
                f"shape {jnp.shape(params[kernel_path])}: qat.convert needs a kernel of >= 2 "
                "axes ((I, F) or (V, I, F))"
            )
        if not jnp.issubdtype(jnp.result_type(params[kernel_path]), jnp.floating):
            raise ValueError(
                f"the kernel of quantized layer {_module_name(path[:-1])} is "
                f"{jnp.result_type(params[kernel_path])}, not float: qat_variables are already "
                "converted (qat.convert's output); convert the QAT variables instead"
            )
        kernel_paths.append(kernel_path)
    _check_ranges_finite(qat_variables, "qat_variables")
    _warn_uncalibrated(qat_variables)
    stats = traverse_util.flatten_dict(unfreeze(qat_variables.get(QUANT_STATS, {})))
    contracted = tuple(
        _contracted_axes(path, stats, jnp.ndim(params[kernel_path]))
        for path, kernel_path in zip(layers, kernel_paths, strict=True)
    )
    quantized = _quantize_kernels(
        tuple(params[path] for path in kernel_paths), tuple(layers.values()), contracted, dtype
    )
    scales = {}
    for path, kernel_path, (codes, scale) in zip(layers, kernel_paths, quantized, strict=True):
        params[kernel_path] = codes
        scales[(*path, "weight_scale")] = scale
    converted = {
        "params": traverse_util.unflatten_dict(params),
        INT8: traverse_util.unflatten_dict(scales),
    }
    for name, collection in qat_variables.items():
        if name not in converted:
            converted[name] = unfreeze(collection)
    return converted


def _check_int8_variables(qat_model: _QuantizedModel, int8_variables: Variables) -> None:
    _check_variables("int8_variables", int8_variables)
    if INT8 not in int8_variables:
        raise ValueError("int8_variables lacks the 'int8' collection: make it with qat.convert")
    layers = quantized_layers(int8_variables)
    widths = {width for width in layers.values() if width is not None}
    if widths and widths != {qat_model.qat_config.bits}:
        raise ValueError(
            f"int8_variables were converted from a {sorted(widths)}-bit QAT model, qat_model has "
            f"QATConfig.bits={qat_model.qat_config.bits}"
        )
    offsets = traverse_util.flatten_dict(unfreeze(int8_variables.get(QUANT_PARAMS, {})))
    learned = any(path[-1] == "scale_offset" for path in offsets)
    # With learnable_scale every observed activation has an offset (bounded ones have none).
    observed = bool(_observers(int8_variables.get(QUANT_STATS, {})))
    if learned != qat_model.qat_config.learnable_scale and (learned or observed):
        held = "hold" if learned else "do not hold"
        raise ValueError(
            f"int8_variables {held} learned activation step sizes ('quant_params'/"
            f"scale_offset), but qat_model has QATConfig.learnable_scale="
            f"{qat_model.qat_config.learnable_scale}: apply them with the QAT model's config "
            f"(learnable_scale={learned}), or the activations are quantized with other scales "
            f"than the QAT model trained with"
        )
    params = traverse_util.flatten_dict(unfreeze(int8_variables.get("params", {})))
    for path in layers:
        kernel = params.get((*path[:-1], "kernel"))
        if kernel is not None and jnp.result_type(kernel) != jnp.int8:
            raise ValueError(
                f"the kernel of quantized layer {_module_name(path[:-1])} is "
                f"{jnp.result_type(kernel)}, not int8: convert the variables with qat.convert"
            )
    _check_ranges_finite(int8_variables, "int8_variables")


@overload
def int8_apply(
    qat_model: QATTemporalFusionTransformer,
    int8_variables: Variables,
    *inputs: Any,
    **kwargs: Any,
) -> TFTOutput: ...


@overload
def int8_apply(
    qat_model: _QuantizedModel, int8_variables: Variables, *inputs: Any, **kwargs: Any
) -> Any: ...


def int8_apply(
    qat_model: _QuantizedModel, int8_variables: Variables, *inputs: Any, **kwargs: Any
) -> Any:
    """The deterministic forward of the converted model with integer matmuls.

    `inputs` and `kwargs` are the model's (for the TFT `static, historical,
    future[, known_history, static_categorical]`); `deterministic=True` is
    added when the model takes it. Every quantized layer computes
    `int8 x int8 -> int32` (`lax.dot_general` with
    `preferred_element_type=int32`) and rescales; see `Int8DotGeneral`. Wrap
    it in `jax.jit` (with `qat_model` static) for speed.

    With float32 compute the output equals the calibrated fake-quantized
    forward to float32 rounding, but for rare activations at a rounding tie:
    the fake-quantized forward sums a layer's products in float32, the
    integer one exactly, so an input to the next quantizer within float32
    rounding of `(k + 1/2) * scale` may round to neighbouring codes on the two
    sides (one activation step, times the weights that read it, carried
    through the later layers). The integer side is the exact one. With
    bfloat16 compute it does not reach that. Convert with
    `convert(..., dtype=<compute dtype>)` so the kernel codes and scales are
    exactly those of the QAT forward (without it about one code in nine
    differs by one). What remains is bfloat16 itself: the QAT forward rounds
    its fake-quantized operands `(q - zp) * s` to bfloat16 (up to half an
    activation step, a quarter of a weight step) while the integer sum is
    exact, and every bfloat16 intermediate differs slightly between the two,
    so downstream activations can land on neighbouring codes: on a small
    bfloat16 TFT the outputs differ by up to about two output steps on
    average and by far more in single elements, as the bfloat16 and float32
    FP32 models do.

    Returns:
      The model's output: a `TFTOutput` for a `QATTemporalFusionTransformer`.

    Raises:
      ValueError: quantization is off, the variables are not `convert`'s
        output, or they were converted from a model of another bit width
        (checked outside `jax.jit` only: the widths are read on the host) or
        of another `learnable_scale`.
    """
    _check_model(qat_model)
    if not qat_model.qat_config.enabled:
        raise ValueError("qat_model.qat_config.bits is None: there is no int8 model to run")
    _check_int8_variables(qat_model, int8_variables)
    model = qat_model.with_dot_general(integer_factory(qat_model.qat_config))
    with _inputs_fitting("int8_apply: the inputs"):
        return model.apply(
            int8_variables, *inputs, **qat_model.inference_kwargs(kwargs, len(inputs))
        )


def tree_bytes(tree: Any) -> int:
    """Total bytes of the array leaves of a pytree."""
    # An array's own `.nbytes` (`jnp.asarray` of a host array would compile a transfer);
    # Python scalars as NumPy reads them.
    leaves = jax.tree.leaves(tree)
    return int(sum(leaf.nbytes if hasattr(leaf, "nbytes") else np.asarray(leaf).nbytes
                   for leaf in leaves))  # fmt: skip


def model_size(qat_variables: Variables, int8_variables: Variables) -> dict[str, float]:
    """Bytes of the float model (its `'params'`) against the int8 model (all it reads).

    Returns `{'fp32_bytes', 'int8_bytes', 'ratio'}` with `ratio = int8 / fp32`.
    Raises `ValueError` when `qat_variables['params']` holds no bytes (no ratio).
    """
    _check_variables("qat_variables", qat_variables)
    _check_variables("int8_variables", int8_variables)
    if "params" not in qat_variables:
        raise ValueError(f"qat_variables must hold 'params', got keys {sorted(qat_variables)}")
    fp32_bytes = tree_bytes(qat_variables["params"])
    if fp32_bytes == 0:
        raise ValueError("qat_variables['params'] holds no parameters: there is no size ratio")
    int8_bytes = tree_bytes(dict(int8_variables))
    return {"fp32_bytes": fp32_bytes, "int8_bytes": int8_bytes, "ratio": int8_bytes / fp32_bytes}
