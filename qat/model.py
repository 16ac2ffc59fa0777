"""The quantization-aware TFT, its conversion to int8 and integer inference.

`QATTemporalFusionTransformer` is `tft_jax.TemporalFusionTransformer` itself
with `QATDotGeneral` injected into every dense layer (every weight matmul of
the model goes through `tft_jax.linear`); no model code is copied. The
wrapper shares its scope with the wrapped model, so its `'params'` tree is
the FP32 model's, and `from_fp32` only adds a fresh `'quant_stats'`
collection (plus `'quant_params'` with `learnable_scale`).

Typical flow::

    qat_vars = from_fp32(fp32_vars, qat_model, static, historical, future)
    qat_vars = calibrate(qat_model, qat_vars, batches)     # observers see data
    ... train qat_vars['params'] with calibrate=False ...  # fake-quant forward, STE gradient
    int8_vars = convert(qat_vars)
    out = int8_apply(qat_model, int8_vars, static, historical, future)

The activation-activation products inside attention (`QKᵀ`, `PV`) and the
variable-selection weighting are not weight matmuls and stay in float.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.core import unfreeze

from qat.config import QATConfig
from qat.dot_general import (
    INT8,
    QUANT_PARAMS,
    QUANT_STATS,
    Int8DotGeneral,
    QATDotGeneral,
    quantize_weight,
)
from tft_jax.config import TFTConfig
from tft_jax.model import TemporalFusionTransformer, TFTOutput

Array = Any
Variables = Mapping[str, Any]
_INPUT_NAMES = ("static", "historical", "future", "known_history", "static_categorical")


class QATTemporalFusionTransformer(nn.Module):
    """The TFT with fake quantization in every dense layer (the FP32 model with QATDotGeneral).

    Attributes:
      config: the model's `TFTConfig`.
      qat_config: bits, moving-average constant and `learnable_scale`. The
        layout is fixed: weights per-channel symmetric (scale `max|w|/qmax`,
        no state), activations per-tensor affine observed with a moving
        average in `'quant_stats'` (the LSTM hidden state uses its known range
        `[-1, 1]` instead). `bits=None` switches quantization off: the output
        is then exactly the FP32 model's.

    With `learnable_scale=True` each observed activation also has a trainable
    step-size offset in the `'quant_params'` collection (see `QATDotGeneral`);
    a training step then differentiates `'params'` and `'quant_params'`.

    Call arguments are the FP32 model's plus `calibrate`: True updates the
    activation observers (apply with `mutable=['quant_stats']`), False freezes
    them. An observer that has not seen a batch leaves its activation
    unquantized, so before the first calibration only the weights are
    fake-quantized.
    """

    config: TFTConfig
    qat_config: QATConfig = QATConfig()

    def __post_init__(self) -> None:
        if not isinstance(self.config, TFTConfig):
            raise TypeError(f"config must be a TFTConfig, got {type(self.config).__name__}")
        if not isinstance(self.qat_config, QATConfig):
            raise TypeError(f"qat_config must be a QATConfig, got {type(self.qat_config).__name__}")
        super().__post_init__()

    @nn.compact
    def __call__(
        self,
        static: Array | None,
        historical: Array,
        future: Array,
        known_history: Array | None = None,
        static_categorical: Array | None = None,
        deterministic: bool = True,
        calibrate: bool = False,
    ) -> TFTOutput:
        if calibrate and not self.is_mutable_collection(QUANT_STATS):
            raise ValueError(
                "calibrate=True updates the observers: apply with mutable=['quant_stats']"
            )
        dot_general_cls = functools.partial(
            QATDotGeneral, config=self.qat_config, calibrate=calibrate
        )
        model = TemporalFusionTransformer(self.config, dot_general_cls=dot_general_cls)
        nn.share_scope(self, model)
        return model(static, historical, future, known_history, static_categorical, deterministic)


def _int8_model(qat_model: QATTemporalFusionTransformer) -> TemporalFusionTransformer:
    """The same TFT with integer contractions; its variable tree is the QAT model's."""
    dot_general_cls = functools.partial(Int8DotGeneral, config=qat_model.qat_config)
    return TemporalFusionTransformer(qat_model.config, dot_general_cls=dot_general_cls)


def _check_model(qat_model: Any) -> None:
    if not isinstance(qat_model, QATTemporalFusionTransformer):
        raise TypeError(
            f"qat_model must be a QATTemporalFusionTransformer, got {type(qat_model).__name__}"
        )


def _tree_shapes(tree: Any) -> Any:
    return jax.tree.map(lambda leaf: (tuple(jnp.shape(leaf)), jnp.result_type(leaf).name), tree)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _fresh_state(
    qat_model: QATTemporalFusionTransformer, collections: tuple[str, ...], *inputs: Any
) -> dict[str, Any]:
    """The initial non-parameter collections; XLA prunes the unused params init and forward."""
    rngs = {"params": jax.random.key(0), "dropout": jax.random.key(0)}
    variables = qat_model.init(rngs, *inputs)
    return {name: variables[name] for name in collections}


def from_fp32(
    fp32_variables: Variables,
    qat_model: QATTemporalFusionTransformer,
    static: Array | None,
    historical: Array,
    future: Array,
    known_history: Array | None = None,
    static_categorical: Array | None = None,
) -> dict[str, Any]:
    """The QAT model's variables from a trained FP32 model's: same params, fresh observers.

    The sample inputs only fix shapes. Returns `{'params': fp32 params,
    'quant_stats': fresh}` (and `'quant_params'` of zeros with `learnable_scale`).
    Raises `ValueError` if the FP32 params do not match the QAT model's tree.
    """
    _check_model(qat_model)
    if "params" not in fp32_variables:
        raise ValueError(f"fp32_variables must hold 'params', got keys {sorted(fp32_variables)}")
    inputs = (static, historical, future, known_history, static_categorical)
    rngs = {"params": jax.random.key(0), "dropout": jax.random.key(0)}
    expected = jax.eval_shape(qat_model.init, rngs, *inputs)
    params = unfreeze(fp32_variables["params"])
    if _tree_shapes(params) != _tree_shapes(unfreeze(expected["params"])):
        raise ValueError(
            "fp32_variables['params'] does not match the QAT model's parameter tree: "
            f"got {_tree_shapes(params)}, expected {_tree_shapes(unfreeze(expected['params']))}"
        )
    state_collections = tuple(name for name in expected if name != "params")
    state = unfreeze(_fresh_state(qat_model, state_collections, *inputs))
    state.setdefault(QUANT_STATS, {})
    return {"params": params, **state}


def _batch_inputs(batch: Any) -> dict[str, Any]:
    """The model inputs of a batch given as a mapping or an object with those attributes."""
    if isinstance(batch, Mapping):
        return {name: batch.get(name) for name in _INPUT_NAMES}
    return {name: getattr(batch, name, None) for name in _INPUT_NAMES}


@functools.partial(jax.jit, static_argnums=0)
def _calibration_step(
    qat_model: QATTemporalFusionTransformer, variables: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    """The variables after one deterministic forward with the observers updating."""
    _, updates = qat_model.apply(variables, **inputs, calibrate=True, mutable=[QUANT_STATS])
    return {**variables, QUANT_STATS: updates[QUANT_STATS]}


def calibrate(
    qat_model: QATTemporalFusionTransformer,
    qat_variables: Variables,
    batches: Iterable[Any],
    num_batches: int | None = None,
) -> dict[str, Any]:
    """Runs the observers over at most `num_batches` batches (default `calibration_batches`).

    Each batch is a mapping or an object (e.g. `tft_jax.train.Batch`) with
    `static, historical, future` and optionally `known_history,
    static_categorical`. The forward is deterministic; only `'quant_stats'` changes.
    """
    _check_model(qat_model)
    limit = qat_model.qat_config.calibration_batches if num_batches is None else num_batches
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"num_batches must be a positive int, got {num_batches!r}")

    variables = dict(qat_variables)
    for index, batch in enumerate(batches):
        if index == limit:
            break
        variables = _calibration_step(qat_model, variables, _batch_inputs(batch))
    return variables


def _quantize_kernels(params: Any, bits: int) -> tuple[Any, Any]:
    """Int8 kernels in the params tree and the matching `'int8'` weight scales tree."""
    if not isinstance(params, Mapping):
        return params, None
    new_params: dict[str, Any] = {}
    scales: dict[str, Any] = {}
    for name, value in params.items():
        if name == "kernel" and not isinstance(value, Mapping):
            if jnp.ndim(value) < 2:
                raise ValueError(f"a kernel must have >= 2 axes, got shape {jnp.shape(value)}")
            # Linear (I, F) and VariableLinear (V, I, F) both contract axis -2.
            contracting = (jnp.ndim(value) - 2,)
            kernel, scale = quantize_weight(jnp.asarray(value), contracting, bits)
            new_params[name] = kernel
            scales["dot_general"] = {"weight_scale": jnp.squeeze(scale, contracting)}
        else:
            new_params[name], child_scales = _quantize_kernels(value, bits)
            if child_scales:
                scales[name] = child_scales
    return new_params, scales


_quantize_all_kernels = jax.jit(_quantize_kernels, static_argnums=1)


def convert(qat_variables: Variables, bits: int = 8) -> dict[str, Any]:
    """The int8 model: int8 kernels in `'params'`, per-channel scales in `'int8'`.

    Every leaf named `kernel` (the kernels of `Linear` `(I, F)` and
    `VariableLinear` `(V, I, F)`) becomes its integer codes
    `round(w / s)`, `s = max|w| / qmax` over the input axis, with the same
    shape and dtype int8; the scales go to `int8/<layer>/dot_general/weight_scale`
    (`(F,)` or `(V, F)`). Biases, LayerNorm and embeddings stay float.
    `'quant_stats'` (and `'quant_params'`) are carried over for the activations.
    `bits` must be the QAT model's `qat_config.bits`.
    """
    if "params" not in qat_variables:
        raise ValueError(f"qat_variables must hold 'params', got keys {sorted(qat_variables)}")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int in 2..8, got {bits!r}")
    params, scales = _quantize_all_kernels(unfreeze(qat_variables["params"]), bits)
    converted = {"params": params, INT8: scales or {}}
    for name in (QUANT_STATS, QUANT_PARAMS):
        if name in qat_variables:
            converted[name] = unfreeze(qat_variables[name])
    return converted


def int8_apply(
    qat_model: QATTemporalFusionTransformer,
    int8_variables: Variables,
    static: Array | None,
    historical: Array,
    future: Array,
    known_history: Array | None = None,
    static_categorical: Array | None = None,
) -> TFTOutput:
    """The deterministic forward of the converted model with integer matmuls.

    Every dense layer computes `int8 x int8 -> int32` (`lax.dot_general` with
    `preferred_element_type=int32`) and rescales; see `Int8DotGeneral`.
    Wrap it in `jax.jit` (with `qat_model` static) for speed.
    """
    _check_model(qat_model)
    if not qat_model.qat_config.enabled:
        raise ValueError("qat_model.qat_config.bits is None: there is no int8 model to run")
    if INT8 not in int8_variables:
        raise ValueError("int8_variables lacks the 'int8' collection: make it with qat.convert")
    return _int8_model(qat_model).apply(
        int8_variables, static, historical, future, known_history, static_categorical, True
    )


def tree_bytes(tree: Any) -> int:
    """Total bytes of the array leaves of a pytree."""
    return int(sum(jnp.asarray(leaf).nbytes for leaf in jax.tree.leaves(tree)))


def model_size(qat_variables: Variables, int8_variables: Variables) -> dict[str, float]:
    """Bytes of the float model (its `'params'`) against the int8 model (all it reads).

    Returns `{'fp32_bytes', 'int8_bytes', 'ratio'}` with `ratio = int8 / fp32`.
    """
    fp32_bytes = tree_bytes(qat_variables["params"])
    int8_bytes = tree_bytes(dict(int8_variables))
    return {"fp32_bytes": fp32_bytes, "int8_bytes": int8_bytes, "ratio": int8_bytes / fp32_bytes}
