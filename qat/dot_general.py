"""Contractions that plug into a dense layer's `dot_general_cls`: fake-quant QAT and true int8.

Both modules follow the protocol of `tft_jax.linear` (and of `flax.linen.Dense`,
which builds `dot_general_cls()` without arguments): built inside a dense
layer and called like `lax.dot_general(lhs, rhs, dimension_numbers)`, `lhs`
the activation and `rhs` the layer's `kernel` parameter, whose second-to-last
axis is the contracted input axis (`Linear`/`nn.Dense` `(I, F)`,
`VariableLinear` `(V, I, F)`). `qat_dot_general` and `int8_dot_general` build
factories that name the module `dot_general` in every layer, so the QAT and
the int8 model find their variables at the same paths.

Every enabled `QATDotGeneral` records its bit width in `'quant_stats'`
(`bits`, an int32 scalar, written by `init`): that marker is how `qat.convert`
knows exactly which layers are quantized and with how many bits. A kernel
contracted over other axes than its second-to-last alone (`nn.DenseGeneral`
with several input or feature axes) also records which (`contracted_axes`,
a 0/1 mask over its axes), so that `qat.convert` quantizes the same channels.

Quantization layout (the standard QAT recipe):

* weights: per-channel symmetric, one scale per kernel slice along the axes
  that are not contracted (output features, and the variable axis of a
  `VariableLinear`). The scale is computed from the current kernel,
  `max|w| / qmax`, so weights need no state. Dividing by `qmax` rather than
  by PyTorch's `(qmax - qmin) / 2` keeps the largest weight on the grid
  (`+max|w|` would otherwise land on 127.5, round to 128 and be clipped,
  which also zeroes its straight-through gradient).
* activations: per-tensor affine. With `lhs_bounds` the range is fixed by the
  math (the LSTM hidden state lies in `[-1, 1]`) and no state is kept.
  Otherwise a moving-average min-max observer lives in the `'quant_stats'`
  collection (`min`, `max`, `num_batches`), updated only when
  `calibrate=True` (never by `init`); a layer called twice per forward
  observes twice. Until an observer has seen a batch its activations pass
  through unquantized (only the weights are fake-quantized).

Fake quantization has a straight-through gradient (a `jax.custom_jvp` rule): use
reverse mode (`jax.grad`, `jax.vjp`); forward mode (`jax.jvp`, `jax.linearize`,
`jax.jacfwd`) raises.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import numbers
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax.core.tracers import current_trace
from jax import lax

from qat.config import QATConfig, check_fixed_layout_config, integer_range
from qat.division import divide
from qat.fake_quant import fake_quantize, is_concrete, quantize
from qat.lsq import default_grad_scale, lsq_fake_quantize
from qat.observers import EPS, QuantizationObserver, batch_range, compute_qparams

Array = Any
DimensionNumbers = tuple[
    tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]
]

QUANT_STATS = "quant_stats"
QUANT_PARAMS = "quant_params"
INT8 = "int8"
BITS = "bits"
# A kernel contracted over other axes than its second-to-last alone records which,
# as a mask over its axes (1: contracted), so that `qat.convert` quantizes the same
# channels; the usual `(I, F)`/`(V, I, F)` layers record nothing.
CONTRACTED_AXES = "contracted_axes"
DOT_GENERAL_NAME = "dot_general"
# What a lift around a hooked layer must map (said when one does not).
_LIFT_ADVICE = (
    "a lifted transform (nn.scan, nn.vmap) around a hooked layer hides every collection "
    "it does not map: list 'quant_stats', 'quant_params' and 'int8' in its variable_axes "
    "along with 'params' (e.g. variable_axes={'params': 0, 'quant_stats': 0, "
    "'quant_params': 0, 'int8': 0})"
)


# The layers observed so far in one calibrating forward: path -> (the JAX trace
# they were observed in, the observer before the forward, the min and max of
# every call's activation so far).
_CALIBRATION_PASS: contextvars.ContextVar[dict[tuple[str, ...], tuple[Any, ...]] | None]
_CALIBRATION_PASS = contextvars.ContextVar("qat_calibration_pass", default=None)


@contextlib.contextmanager
def calibration_pass() -> Iterator[None]:
    """One calibrating forward: a layer called several times in it is observed once.

    Its observer sees the range of all its calls, as one batch: with a moving
    average, observing each call as a batch of its own would average the
    calls' ranges (the first call alone sets it on the first forward) and
    clip the activations of the call with the wider range. `QATModel` and
    `QATTemporalFusionTransformer` open one per call with `calibrate=True`.

    Calls in different JAX traces cannot share values: a layer called under
    `nn.remat` or `nn.jit` (each call traced on its own) or in both branches
    of `nn.cond` is observed once per call, each call a batch of its own.
    """
    token = _CALIBRATION_PASS.set({})
    try:
        yield
    finally:
        _CALIBRATION_PASS.reset(token)


def activation_config(cfg: QATConfig) -> QATConfig:
    """The activation quantizer of the QAT model: per-tensor affine, moving average."""
    return dataclasses.replace(cfg, symmetric=False, per_channel=False, observer="moving_average")


def weight_grid(bits: int) -> tuple[int, int]:
    """The symmetric weight grid `[-2^(b-1), 2^(b-1) - 1]`."""
    return integer_range(bits, symmetric=True)


def weight_scale(kernel: Array, contracting: tuple[int, ...], bits: int) -> Array:
    """Per-channel symmetric scale `max|w| / qmax`, reduced over `contracting` (dims kept).

    Floored at float32 eps so an all-zero channel gets a finite positive scale.
    """
    qmax = weight_grid(bits)[1]
    magnitude = jnp.max(jnp.abs(kernel.astype(jnp.float32)), axis=contracting, keepdims=True)
    return jnp.maximum(divide(magnitude, qmax), EPS)


def fake_quantize_weight(kernel: Array, contracting: tuple[int, ...], bits: int) -> Array:
    """The kernel fake-quantized per channel (symmetric); the gradient is straight through."""
    scale = lax.stop_gradient(weight_scale(kernel, contracting, bits))
    qmin, qmax = weight_grid(bits)
    return fake_quantize(kernel, scale, 0, qmin, qmax)


def quantize_weight(kernel: Array, contracting: tuple[int, ...], bits: int) -> tuple[Array, Array]:
    """`(int8 kernel, scale)`: integer codes and the per-channel scale (contracted dims kept)."""
    scale = weight_scale(kernel, contracting, bits)
    qmin, qmax = weight_grid(bits)
    return quantize(kernel, scale, 0, qmin, qmax).astype(jnp.int8), scale


def rhs_channels_to_output(
    channel_values: Array, dimension_numbers: DimensionNumbers, lhs_ndim: int, rhs_ndim: int
) -> Array:
    """Reshapes per-channel values of the kernel to broadcast against the contraction's output.

    `channel_values` has the kernel's shape with the contracting axes removed
    (kernel order). `lax.dot_general` orders its output as
    `(batch..., lhs free..., rhs free...)`; this returns the values permuted and
    padded with singleton lhs-free axes to match.
    """
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    remaining = [axis for axis in range(rhs_ndim) if axis not in rhs_contract]
    rhs_free = [axis for axis in remaining if axis not in rhs_batch]
    order = [remaining.index(axis) for axis in (*rhs_batch, *rhs_free)]
    values = jnp.transpose(channel_values, order)
    lhs_free = lhs_ndim - len(lhs_contract) - len(lhs_batch)
    shape = values.shape[: len(rhs_batch)] + (1,) * lhs_free + values.shape[len(rhs_batch) :]
    return jnp.reshape(values, shape)


def lhs_rows_with_nan(lhs: Array, dimension_numbers: DimensionNumbers, rhs_ndim: int) -> Array:
    """Where a contraction's output reads a NaN of `lhs`: a boolean mask broadcasting to it.

    True at the output positions whose contracted `lhs` entries hold a NaN,
    in `lax.dot_general`'s output order `(batch..., lhs free..., rhs free...)`
    with singleton rhs-free axes. A float contraction propagates those NaNs;
    an integer one would read them as arbitrary codes.
    """
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    contract = tuple(axis % lhs.ndim for axis in lhs_contract)
    batch = tuple(axis % lhs.ndim for axis in lhs_batch)
    remaining = [axis for axis in range(lhs.ndim) if axis not in contract]
    free = [axis for axis in remaining if axis not in batch]
    mask = jnp.any(jnp.isnan(lhs), axis=contract)
    mask = jnp.transpose(mask, [remaining.index(axis) for axis in (*batch, *free)])
    rhs_free = rhs_ndim - len(rhs_contract) - len(rhs_batch)
    return jnp.reshape(mask, mask.shape + (1,) * rhs_free)


def _contracting_dims(dimension_numbers: DimensionNumbers, rhs: Array) -> tuple[int, ...]:
    (_, rhs_contract), _ = dimension_numbers
    return tuple(axis % rhs.ndim for axis in rhs_contract)


def observed_range_finite(min_val: Array, max_val: Array, num_batches: Array) -> bool:
    """Whether a concrete observer's range is finite wherever it has seen a batch.

    Read on the host (NumPy), for concrete values only. An observer of a
    layer under `nn.scan`/`nn.vmap` holds one range per copy (`(L,)`
    leaves), each checked; one that has seen nothing holds `+inf`/`-inf`, its
    legitimate empty range.
    """
    seen = np.asarray(num_batches) > 0
    finite = np.isfinite(np.asarray(min_val)) & np.isfinite(np.asarray(max_val))
    return bool(np.all(~seen | finite))


def non_finite_range_message(where: str) -> str:
    """Why an observer holding a NaN or inf range is refused, and what to do; `where` leads."""
    return (
        f"{where} a NaN or inf activation range ('{QUANT_STATS}' min/max) after seeing "
        "batches: a calibration batch held a non-finite value (NaN or inf, or an activation "
        "that overflowed), which an observer updated under jax.jit cannot refuse and whose "
        "moving average then keeps for good. Every scale computed from that range is NaN or "
        "inf, and the layer's outputs would be zeros or NaN. Recalibrate fresh observers from "
        "clean batches: qat.from_fp32 with these variables' 'params', then qat.calibrate, "
        "which checks each batch"
    )


def check_calibrate_flag(owner: str, calibrate: Any) -> None:
    """Raises `TypeError` naming `calibrate` unless it is a bool (or a concrete boolean scalar).

    The flag chooses in Python whether the observers update: a string such as
    `"False"`, or any other truthy value, would silently switch calibration
    on. A NumPy bool and a concrete 0-d boolean array (both read with `bool`)
    pass; a traced value cannot choose in Python (pass it as a static argument).
    """
    if isinstance(calibrate, bool | np.bool_):
        return
    if isinstance(calibrate, jax.core.Tracer):
        raise TypeError(
            f"{owner}: calibrate must be a concrete bool, got a traced value (it chooses in "
            "Python whether the observers update: make it a static argument of the jit)"
        )
    if (
        hasattr(calibrate, "dtype")
        and np.ndim(calibrate) == 0
        and np.dtype(calibrate.dtype) == np.bool_
    ):
        return
    raise TypeError(
        f"{owner}: calibrate must be a bool, got {type(calibrate).__name__} {calibrate!r}"
    )


class EmptyCalibrationInput(ValueError):
    """A layer met an empty activation while calibrating (its range would be of nothing)."""


class _ActivationQParams(nn.Module):
    """Shared logic: the activation grid and its qparams from bounds or the observer."""

    config: QATConfig
    lhs_bounds: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        # Else a dict, say, failed deep in the call: "'FrozenDict' has no attribute 'enabled'".
        if not isinstance(self.config, QATConfig):
            raise TypeError(
                f"{type(self).__name__}: config must be a QATConfig, got "
                f"{type(self.config).__name__}"
            )
        super().__post_init__()

    @property
    def activation_grid(self) -> tuple[int, int]:
        return integer_range(self.config._required_bits(), symmetric=False)

    def _observer(self) -> QuantizationObserver:
        """The observer held in `'quant_stats'` (created fresh on init)."""
        if not (self.has_variable(QUANT_STATS, "min") or self.is_mutable_collection(QUANT_STATS)):
            raise ValueError(
                f"{'/'.join(self.path)}: no '{QUANT_STATS}' observer is visible here: "
                "either the variables lack it (make them with qat.from_fp32, and the int8 "
                f"ones with qat.convert) or {_LIFT_ADVICE}"
            )
        fresh = QuantizationObserver.create(activation_config(self.config))
        low = self.variable(QUANT_STATS, "min", lambda: fresh.min_val)
        high = self.variable(QUANT_STATS, "max", lambda: fresh.max_val)
        count = self.variable(QUANT_STATS, "num_batches", lambda: fresh.num_batches)
        self._check_range_finite(low.value, high.value, count.value)
        return fresh.replace(min_val=low.value, max_val=high.value, num_batches=count.value)

    def _check_range_finite(self, low: Array, high: Array, count: Array) -> None:
        """Raises `ValueError` for a concrete observed range holding NaN or inf.

        Checked on the host in an eager call only: traced values (under
        `jax.jit`) add nothing to the program; `qat.calibrate`, `qat.convert`
        and `qat.int8_apply` check the variables themselves.
        """
        if not all(is_concrete(value) for value in (low, high, count)):
            return
        if not observed_range_finite(low, high, count):
            where = f"the activation observer of layer '{'/'.join(self.path)}' holds"
            raise ValueError(non_finite_range_message(where))

    def _store(self, observer: QuantizationObserver) -> None:
        self.put_variable(QUANT_STATS, "min", observer.min_val)
        self.put_variable(QUANT_STATS, "max", observer.max_val)
        self.put_variable(QUANT_STATS, "num_batches", observer.num_batches)

    def _observe_in_pass(self, observer: QuantizationObserver, x: Array) -> QuantizationObserver:
        """`observer` after `x` and the layer's earlier calls in this `calibration_pass`.

        The activation observer is per tensor, so observing the pair of the
        calls' overall min and max equals observing all their activations.
        Only calls in the same JAX trace are combined: a transform that
        traces its body more than once (`nn.scan` does) starts afresh in each.
        """
        seen = _CALIBRATION_PASS.get()
        path = tuple(self.path)
        if x.size == 0:  # the range of nothing: min/max of an empty array, deep in JAX
            raise EmptyCalibrationInput(
                f"calibrating {'/'.join(path)}: its input must hold at least one element, got "
                f"shape {tuple(x.shape)} (an empty batch)"
            )
        if seen is None:
            return observer.observe(x)
        low, high = batch_range(x, None)
        trace = current_trace()
        if path in seen and seen[path][0] == trace:
            _, observer, earlier_low, earlier_high = seen[path]
            low, high = jnp.minimum(earlier_low, low), jnp.maximum(earlier_high, high)
        seen[path] = (trace, observer, low, high)
        return observer.observe(jnp.stack([low, high]))

    def _bounded_qparams(self, bounds: tuple[float, float]) -> tuple[Array, Array]:
        low, high = bounds
        qmin, qmax = self.activation_grid
        return compute_qparams(low, high, qmin, qmax, symmetric=False)

    def _check_lifted_collections(self) -> None:
        """Raises `ValueError` when `init` cannot create this layer's quantization variables.

        `init` makes every collection mutable, so a layer finds one of its
        collections immutable and empty there only inside a lifted transform
        (`nn.scan`, `nn.vmap`) that does not map it; Flax then failed deep
        in its scope lookup (`ScopeCollectionNotFound`), or, for a layer with
        `lhs_bounds`, left out the `bits` marker so that `qat.convert` skipped
        it. A collection the lift broadcasts holds the variables already
        (Flax creates them before the loop), which is fine.
        """
        if not self.is_initializing():
            return
        needed = [(QUANT_STATS, BITS)]
        if self.config.learnable_scale and self.lhs_bounds is None:
            needed.append((QUANT_PARAMS, "scale_offset"))
        hidden = [
            collection
            for collection, name in needed
            if not (self.is_mutable_collection(collection) or self.has_variable(collection, name))
        ]
        if hidden:
            raise ValueError(
                f"{'/'.join(self.path)}: the quantized layer cannot create its "
                f"{' and '.join(repr(c) for c in hidden)} variables during init: "
                f"{_LIFT_ADVICE}"
            )

    def _scale_offset(self) -> Array:
        """The trainable LSQ offset of the observed step size (collection `'quant_params'`)."""
        return self.variable(QUANT_PARAMS, "scale_offset", lambda: jnp.zeros((), jnp.float32)).value


def _check_bounds(lhs_bounds: tuple[float, float] | None) -> None:
    """Raises unless `lhs_bounds` is None or two finite real numbers `low < high`.

    An infinite bound makes the activation scale inf, and the output NaN.
    """
    if lhs_bounds is None:
        return
    if (
        not isinstance(lhs_bounds, tuple | list)
        or len(lhs_bounds) != 2
        or not all(
            isinstance(bound, numbers.Real) and not isinstance(bound, bool) for bound in lhs_bounds
        )
    ):
        raise TypeError(
            f"lhs_bounds must be a pair (low, high) of real numbers, got {lhs_bounds!r}"
        )
    low, high = lhs_bounds
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"lhs_bounds must be finite with low < high, got {lhs_bounds}")


class QATDotGeneral(_ActivationQParams):
    """`lax.dot_general` with fake-quantized operands (weights per channel, activations per tensor).

    Attributes:
      config: bits and observer settings; `bits=None` makes this exactly
        `lax.dot_general` (no variables, no rounding).
      calibrate: update the activation observer with this call's `lhs`. Needs
        the `'quant_stats'` collection mutable; False freezes the observer.
      lhs_bounds: a known activation range `(low, high)`; then the activation
        is quantized on that fixed range from the start and no observer is kept.

    Whatever the activation, `init` writes the bit width to `'quant_stats'`
    (`bits`), the marker by which `qat.convert` finds the quantized layers.

    With `config.learnable_scale`, an observed activation uses the step size
    `s_observer + scale_offset`, `scale_offset` a trainable scalar in the
    `'quant_params'` collection (initialised to 0) with the LSQ gradient
    (its clipping rule chosen by `config.lsq_clip_from`). It
    lives outside `'params'` so that the parameter tree stays the FP32 one.
    Until the observer has seen a batch, activations pass through unquantized.

    The call is `lax.dot_general(quantize_lhs(lhs), rhs', ...)` with
    `(rhs', quantize_lhs) = operand_quantizers(rhs, dimension_numbers,
    lhs.shape, observed=lhs)`; a frozen quantizer hands the same pair out to
    code that contracts the activation in pieces (see
    `tft_jax.operand_quantizers`).
    """

    calibrate: bool = False

    def __call__(
        self,
        lhs: Array,
        rhs: Array,
        dimension_numbers: DimensionNumbers,
        precision: Any = None,
        preferred_element_type: Any = None,
    ) -> Array:
        rhs, quantize_lhs = self.operand_quantizers(
            rhs, dimension_numbers, tuple(lhs.shape), observed=lhs
        )
        return lax.dot_general(
            quantize_lhs(lhs), rhs, dimension_numbers, precision, preferred_element_type
        )

    @nn.compact
    def operand_quantizers(
        self,
        rhs: Array,
        dimension_numbers: DimensionNumbers,
        lhs_shape: tuple[int, ...],
        observed: Array | None = None,
    ) -> tuple[Array, Callable[[Array], Array]]:
        """`(fake-quantized rhs, quantize_lhs)`: the operands' quantizers (observer updated first).

        The kernel's per-channel scale comes from the whole kernel; the
        activation's per-tensor `(scale, zero point)` from the bounds, the
        observer (after it saw `observed` when calibrating) or, with
        `learnable_scale`, the observer's scale plus the trainable offset.
        `quantize_lhs` is elementwise with those fixed parameters, so it may
        be applied to any rows of the `lhs_shape` activation separately
        (inside a loop, say) with the same result; its LSQ gradient scale is
        that of the whole `lhs_shape` tensor. Raises `ValueError` when
        calibrating without `observed` (the observer must see the whole
        activation at once) or without a mutable `'quant_stats'`.
        """
        if not self.config.enabled:
            return rhs, _identity
        _check_bounds(self.lhs_bounds)
        self._check_lifted_collections()
        contracting = _contracting_dims(dimension_numbers, rhs)
        if self.is_mutable_collection(QUANT_STATS) or self.has_variable(QUANT_STATS, BITS):
            self.variable(QUANT_STATS, BITS, lambda: jnp.asarray(self.config.bits, jnp.int32))
        if not is_default_contraction(contracting, rhs.ndim) and (
            self.is_mutable_collection(QUANT_STATS)
            or self.has_variable(QUANT_STATS, CONTRACTED_AXES)
        ):
            mask = [int(axis in contracting) for axis in range(rhs.ndim)]
            self.variable(QUANT_STATS, CONTRACTED_AXES, lambda: jnp.asarray(mask, jnp.int32))
        rhs = fake_quantize_weight(rhs, contracting, self.config._required_bits())
        return rhs, self._activation_quantizer(lhs_shape, observed)

    def _check_variables_fit(self) -> None:
        """Raises `ValueError` for variables made for another QAT configuration.

        Checked while tracing: FP32 variables (no observers) failed in Flax's
        scope lookup, and a learned step size the config does not use (or the
        reverse) was ignored, silently, or failed there too. A bit width other
        than the variables' is caught here when the marker is concrete (an
        eager call; `qat.calibrate` checks it on the host).
        """
        if self.is_initializing():
            return
        path = "/".join(self.path)
        if not self.has_variable(QUANT_STATS, "min") and not self.is_mutable_collection(
            QUANT_STATS
        ):
            raise ValueError(
                f"{path}: the variables hold no '{QUANT_STATS}' observers (FP32 variables?): "
                "make the QAT model's variables with qat.from_fp32(fp32_variables, qat_model, "
                f"*inputs); if they do, {_LIFT_ADVICE}"
            )
        learned = self.has_variable(QUANT_PARAMS, "scale_offset")
        if learned != self.config.learnable_scale:
            held = "hold a learned step size" if learned else "hold no learned step size"
            raise ValueError(
                f"{path}: the variables {held} ('{QUANT_PARAMS}/scale_offset') but the "
                f"model's QATConfig has learnable_scale={self.config.learnable_scale}: apply "
                "them with the QATConfig they were made with (qat.from_fp32 makes them)"
            )
        if self.has_variable(QUANT_STATS, BITS):
            marker: Array = self.get_variable(QUANT_STATS, BITS)
            if is_concrete(marker) and np.any(np.asarray(marker) != self.config.bits):
                raise ValueError(
                    f"{path}: the variables were made for {np.unique(np.asarray(marker)).tolist()} "
                    f"bits but the model's QATConfig has bits={self.config.bits}: apply them "
                    "with the QATConfig they were made with"
                )

    def _activation_quantizer(
        self, lhs_shape: tuple[int, ...], observed: Array | None
    ) -> Callable[[Array], Array]:
        qmin, qmax = self.activation_grid
        if self.lhs_bounds is not None:
            scale, zero_point = self._bounded_qparams(self.lhs_bounds)
            return lambda lhs: fake_quantize(lhs, scale, zero_point, qmin, qmax)
        if self.calibrate and not self.is_mutable_collection(QUANT_STATS):
            raise ValueError(
                "calibrate=True updates the observers: apply with mutable=['quant_stats']"
            )
        self._check_variables_fit()
        observer = self._observer()
        if self.calibrate and not self.is_initializing():
            if observed is None:
                raise ValueError(
                    "calibrate=True: the observer must see the whole activation at once; "
                    "call the contraction itself, not its operand quantizers"
                )
            observer = self._observe_in_pass(observer, observed)
            self._store(observer)
        scale, zero_point = observer.qparams()
        calibrated = observer.is_calibrated
        if self.config.learnable_scale:
            step = scale + self._scale_offset()
            grad_scale = default_grad_scale(math.prod(lhs_shape), 1, qmax)

            def quantize(lhs: Array) -> Array:
                quantized = lsq_fake_quantize(
                    lhs, step, zero_point, qmin, qmax, grad_scale, self.config.lsq_clip_from
                )
                return jnp.where(calibrated, quantized, lhs)

        else:

            def quantize(lhs: Array) -> Array:
                quantized = fake_quantize(lhs, scale, zero_point, qmin, qmax)
                return jnp.where(calibrated, quantized, lhs)

        return quantize


def _identity(x: Array) -> Array:
    return x


class Int8DotGeneral(_ActivationQParams):
    """`lax.dot_general` with integer operands: `int8 x int8 -> int32`, then rescaled.

    `rhs` is the int8 kernel made by `qat.convert`; its per-channel scales
    are read from the `'int8'` collection (`weight_scale`, the kernel's shape
    with the contracted axes kept as 1s). The activation is quantized with the same
    qparams as `QATDotGeneral` (its bounds, or the calibrated observer in
    `'quant_stats'`), shifted to int8 by `2^(b-1)`, contracted in int32 with
    the zero-point correction `sum_k (q_k - zp) w_k = sum_k q_k w_k - zp sum_k w_k`,
    and rescaled by `s_activation * s_weight`. An activation whose observer
    never saw a batch stays float (as in QAT) and meets the dequantized kernel.

    `flax.linen.Dense` casts its kernel to the compute dtype before calling the
    contraction; the int8 codes are small integers, exact in every float type
    (bfloat16 included), so a floating `rhs` is read back as those codes. Only
    `qat.convert`'s output holds such a kernel: `qat.int8_apply` checks that
    every quantized layer's kernel is int8 before running.
    """

    @nn.compact
    def __call__(
        self,
        lhs: Array,
        rhs: Array,
        dimension_numbers: DimensionNumbers,
        precision: Any = None,
        preferred_element_type: Any = None,
    ) -> Array:
        if not self.config.enabled:
            return lax.dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type)
        _check_bounds(self.lhs_bounds)
        if jnp.issubdtype(rhs.dtype, jnp.floating):
            # nn.Dense cast the int8 codes to its compute dtype: exact, so cast them back.
            _check_float_codes(rhs, self.config._required_bits(), self.path)
            rhs = rhs.astype(jnp.int8)
        elif rhs.dtype != jnp.int8:
            raise TypeError(
                f"Int8DotGeneral expects the int8 kernel made by qat.convert (or that kernel "
                f"cast to a float dtype by nn.Dense), got {rhs.dtype}"
            )
        contracting = _contracting_dims(dimension_numbers, rhs)
        channel_shape = tuple(n for axis, n in enumerate(rhs.shape) if axis not in contracting)
        scale_shape = int8_scale_shape(tuple(rhs.shape), contracting)
        if not (self.is_initializing() or self.has_variable(INT8, "weight_scale")):
            raise ValueError(
                f"no int8 weight_scale for the layer at '{'/'.join(self.path)}': the "
                "variables must come from qat.convert, and the layers' contraction must carry "
                "the QAT one's name (build it with qat.int8_dot_general and the QAT side with "
                "qat.qat_dot_general, both named 'dot_general', or run qat.int8_apply); if "
                f"they hold it, {_LIFT_ADVICE}"
            )
        stored = self.variable(INT8, "weight_scale", lambda: jnp.ones(scale_shape, jnp.float32))
        _check_scale_fits(
            tuple(stored.value.shape), tuple(rhs.shape), contracting, "/".join(self.path)
        )
        out_dtype = preferred_element_type or lhs.dtype
        weight_scale_out = rhs_channels_to_output(
            stored.value.reshape(channel_shape), dimension_numbers, lhs.ndim, rhs.ndim
        )

        if self.lhs_bounds is not None:
            scale, zero_point = self._bounded_qparams(self.lhs_bounds)
            y = self._integer_contraction(lhs, rhs, scale, zero_point, dimension_numbers)
            return (y * weight_scale_out).astype(out_dtype)

        observer = self._observer()
        scale, zero_point = observer.qparams()
        if self.config.learnable_scale:
            scale = jnp.maximum(jnp.abs(scale + self._scale_offset()), EPS)

        def integer_path(lhs: Array) -> Array:
            return self._integer_contraction(lhs, rhs, scale, zero_point, dimension_numbers)

        def float_path(lhs: Array) -> Array:
            dequantized = rhs.astype(lhs.dtype)
            return lax.dot_general(lhs, dequantized, dimension_numbers, precision).astype(
                jnp.float32
            )

        y = lax.cond(observer.is_calibrated, integer_path, float_path, lhs)
        return (y * weight_scale_out).astype(out_dtype)

    def _integer_contraction(
        self,
        lhs: Array,
        rhs: Array,
        scale: Array,
        zero_point: Array,
        dimension_numbers: DimensionNumbers,
    ) -> Array:
        """`s_a * sum_k (q_k - zp) w_k` in float32, the sum computed in int32.

        A contraction of more than `max_int32_contraction(bits)` terms (the
        product of the sizes of all its contracted axes) is summed in pieces
        of at most that many terms (each exact in int32), added in float32. A
        contraction over several axes is first merged into one axis, so that
        every piece counts the terms of all of them.

        An output that reads a NaN input is NaN, as in the fake-quantized
        forward (a NaN has no integer code).
        """
        qmin, qmax = self.activation_grid
        bits = self.config._required_bits()
        shift = 2 ** (bits - 1)
        codes = (quantize(lhs, scale, zero_point, qmin, qmax) - shift).astype(jnp.int8)
        chunk = max_int32_contraction(bits)
        (_, rhs_contract), _ = dimension_numbers
        terms = math.prod(rhs.shape[axis % rhs.ndim] for axis in rhs_contract)
        operands = (codes, rhs, dimension_numbers)
        if len(rhs_contract) > 1 and terms > chunk:
            # The pieces run along one axis: merge the contracted axes so each counts all terms.
            operands = _merge_contracted_axes(*operands)
        piece_codes, piece_rhs, piece_numbers = operands
        total = _int32_contraction_in_pieces(
            piece_codes, piece_rhs, zero_point - shift, piece_numbers, chunk
        )
        y = total * scale
        return jnp.where(lhs_rows_with_nan(lhs, dimension_numbers, rhs.ndim), jnp.nan, y)


def _merge_contracted_axes(
    lhs: Array, rhs: Array, dimension_numbers: DimensionNumbers
) -> tuple[Array, Array, DimensionNumbers]:
    """`(lhs, rhs, dimension_numbers)` of the same contraction over one merged contracted axis.

    `lhs` becomes `(batch..., free..., K)` and `rhs` `(batch..., K, free...)`,
    `K` the product of the contracted sizes, both flattened in the order of
    the contraction's pairs. Batch and free axes keep their order, so
    `lax.dot_general` gives the same output, `(batch..., lhs free..., rhs free...)`.
    """
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    lhs_contract = tuple(axis % lhs.ndim for axis in lhs_contract)
    rhs_contract = tuple(axis % rhs.ndim for axis in rhs_contract)
    lhs_batch = tuple(axis % lhs.ndim for axis in lhs_batch)
    rhs_batch = tuple(axis % rhs.ndim for axis in rhs_batch)
    lhs_free = [axis for axis in range(lhs.ndim) if axis not in (*lhs_contract, *lhs_batch)]
    rhs_free = [axis for axis in range(rhs.ndim) if axis not in (*rhs_contract, *rhs_batch)]
    lhs = jnp.transpose(lhs, (*lhs_batch, *lhs_free, *lhs_contract))
    lhs = jnp.reshape(lhs, (*lhs.shape[: lhs.ndim - len(lhs_contract)], -1))
    rhs = jnp.transpose(rhs, (*rhs_batch, *rhs_contract, *rhs_free))
    batch = len(rhs_batch)
    rhs = jnp.reshape(rhs, (*rhs.shape[:batch], -1, *rhs.shape[batch + len(rhs_contract) :]))
    batch_axes = tuple(range(batch))
    merged = (((lhs.ndim - 1,), (batch,)), (batch_axes, batch_axes))
    return lhs, rhs, merged


def _int32_contraction_in_pieces(
    codes: Array, rhs: Array, offset: Array, dimension_numbers: DimensionNumbers, chunk: int
) -> Array:
    """`sum_k (codes_k - offset) w_k` in float32 from int32 sums of at most `chunk` terms each.

    The pieces run along the first contracted axis, so a contraction over
    several axes must hold at most `chunk` terms in all (`_merge_contracted_axes`
    makes it one axis).
    """
    (lhs_contract, rhs_contract), _ = dimension_numbers
    lhs_axis, rhs_axis = lhs_contract[0] % codes.ndim, rhs_contract[0] % rhs.ndim
    length = rhs.shape[rhs_axis]
    total = None
    # A longer contraction could exceed int32 and wrap silently: sum int32 pieces in float32.
    for start in range(0, max(length, 1), chunk):  # one piece when length is 0
        stop = min(start + chunk, length)
        piece = _int32_contraction(
            _slice(codes, start, stop, lhs_axis, length),
            _slice(rhs, start, stop, rhs_axis, length),
            offset,
            dimension_numbers,
            codes.ndim,
        ).astype(jnp.float32)
        total = piece if total is None else total + piece
    return total


def max_int32_contraction(bits: int) -> int:
    """The longest contraction whose int32 sum `sum_k (q_k - zp) w_k` cannot overflow.

    Per term `|q - zp| <= 2^b - 1` and `|w| <= 2^7` (any int8 code), and the two
    partial sums (`sum q w`, `zp sum w`) are smaller still: 65,793 terms at 8 bits.
    """
    return (2**31 - 1) // ((2**bits - 1) * 2**7)


def _slice(values: Array, start: int, stop: int, axis: int, length: int) -> Array:
    """`values[start:stop]` along `axis` (`values` itself when that is the whole axis)."""
    if start == 0 and stop == length:
        return values
    return lax.slice_in_dim(values, start, stop, axis=axis)


def _int32_contraction(
    codes: Array, rhs: Array, offset: Array, dimension_numbers: DimensionNumbers, lhs_ndim: int
) -> Array:
    """`sum_k (codes_k - offset) w_k` in int32 as `sum_k codes_k w_k - offset sum_k w_k`.

    `offset` is `zp - 2^(b-1)`, the zero point on the shifted int8 codes.
    """
    accumulator = lax.dot_general(codes, rhs, dimension_numbers, preferred_element_type=jnp.int32)
    rhs_sums = jnp.sum(rhs.astype(jnp.int32), axis=_contracting_dims(dimension_numbers, rhs))
    rhs_sums = rhs_channels_to_output(rhs_sums, dimension_numbers, lhs_ndim, rhs.ndim)
    return accumulator - offset * rhs_sums


def is_default_contraction(contracting: tuple[int, ...], rhs_ndim: int) -> bool:
    """Whether a kernel is contracted over its second-to-last axis alone (`(I, F)`, `(V, I, F)`)."""
    return tuple(contracting) == (rhs_ndim - 2,)


def int8_scale_shape(rhs_shape: tuple[int, ...], contracting: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of `qat.convert`'s `weight_scale` for a kernel contracted over `contracting`.

    The kernel's shape without its contracted axis for the usual layers
    (`(F,)`, `(V, F)`); for any other contraction (`nn.DenseGeneral` with
    several input or feature axes) the contracted axes are kept as 1s, so
    that the scale's shape says which axes the codes were quantized over.
    """
    if is_default_contraction(contracting, len(rhs_shape)):
        return tuple(n for axis, n in enumerate(rhs_shape) if axis not in contracting)
    return tuple(1 if axis in contracting else n for axis, n in enumerate(rhs_shape))


def _check_scale_fits(
    stored: tuple[int, ...], rhs_shape: tuple[int, ...], contracting: tuple[int, ...], path: str
) -> None:
    """Raises unless `qat.convert` quantized this kernel over the axes it is contracted over."""
    expected = int8_scale_shape(rhs_shape, contracting)
    if stored == expected:
        return
    if not is_default_contraction(contracting, len(rhs_shape)) and stored == int8_scale_shape(
        rhs_shape, (len(rhs_shape) - 2,)
    ):
        raise ValueError(
            f"the int8 layer at '{path}' contracts kernel axes {contracting} of a "
            f"{len(rhs_shape)}-axis kernel, but its weight_scale {stored} was made over the "
            "second-to-last axis (by qat.convert of variables that do not record the "
            f"contraction): convert the QAT variables again (made by qat.from_fp32) so that "
            f"the scale has shape {expected}"
        )
    raise ValueError(
        f"int8 weight_scale has shape {stored}, the kernel {rhs_shape} contracted over axes "
        f"{contracting} needs {expected}"
    )


def _check_float_codes(rhs: Array, bits: int, path: tuple[str, ...]) -> None:
    """Raises unless a concrete float kernel holds integer codes on the weight grid.

    A float kernel that is not `qat.convert`'s codes (the FP32 weights, say)
    would be truncated to int8 silently, which zeroes weights below 1 in
    magnitude. Traced kernels (inside `jax.jit`) cannot be checked.
    """
    if isinstance(rhs, jax.core.Tracer):
        return
    qmin, qmax = weight_grid(bits)
    codes = np.asarray(rhs, np.float64)
    bad = (codes != np.round(codes)) | (codes < qmin) | (codes > qmax)
    if not bad.any():
        return
    raise ValueError(
        f"the kernel of the int8 layer at '{'/'.join(path)}' holds {int(bad.sum())} values "
        f"that are not {bits}-bit integer codes in [{qmin}, {qmax}] (e.g. "
        f"{codes[bad][:3].tolist()}): "
        "it is not qat.convert's int8 kernel (FP32 weights?); convert the QAT variables "
        "with qat.convert"
    )


@dataclasses.dataclass(frozen=True)
class _NamedFactory:
    """A `dot_general_cls`: `cls(name="dot_general", lhs_bounds=..., **fields)`.

    `supports_operand_quantizers` announces, per `tft_jax.operand_quantizers`,
    that the modules it builds hand out frozen operand quantizers.
    """

    cls: type[nn.Module]
    fields: tuple[tuple[str, Any], ...]
    supports_operand_quantizers: bool = False

    def __call__(
        self, name: str = DOT_GENERAL_NAME, lhs_bounds: Any = None, **kwargs: Any
    ) -> nn.Module:
        return self.cls(name=name, lhs_bounds=lhs_bounds, **dict(self.fields), **kwargs)


def qat_dot_general(config: QATConfig, calibrate: bool = False) -> Callable[..., nn.Module]:
    """A `dot_general_cls` for `Linear`, `VariableLinear` or `nn.Dense`: a `QATDotGeneral`.

    The module is named `dot_general` in every layer (`nn.Dense` would
    otherwise name it after its class), the name `int8_dot_general` uses too.
    Calibrated through `QATModel` (or `QATTemporalFusionTransformer`), a
    layer called more than once per forward updates its observer once, with
    the range of all its calls (`calibration_pass`); applied on its own, each
    call is observed as a batch.
    With frozen observers (`calibrate=False`) it supports operand quantizers:
    the variable selection networks then contract their activations chunk by
    chunk with the same quantization (`tft_jax.operand_quantizers`).

    The layout is the QAT models' (weights per-channel symmetric, activations
    per-tensor affine with a moving-average observer): a `config` whose
    `symmetric`, `per_channel`, `channel_axis` or `observer` differ from
    their defaults is warned about once per process (they configure
    stand-alone observers and fake quantizers only).

    Raises:
      TypeError: `config` is not a `QATConfig`, or `calibrate` is not a bool.
    """
    check_fixed_layout_config(config, "qat_dot_general", "config")
    check_calibrate_flag("qat_dot_general", calibrate)
    return quantizing_factory(config, calibrate)


def int8_dot_general(config: QATConfig) -> Callable[..., nn.Module]:
    """A `dot_general_cls` running the converted layer in integers: an `Int8DotGeneral`.

    `config` is checked as by `qat_dot_general`: `TypeError` unless a
    `QATConfig`, a warning once for layout fields it does not use.
    """
    check_fixed_layout_config(config, "int8_dot_general", "config")
    return integer_factory(config)


def quantizing_factory(config: QATConfig, calibrate: bool = False) -> Callable[..., nn.Module]:
    """`qat_dot_general` without its checks: for the QAT models, which check their config once."""
    return _NamedFactory(
        QATDotGeneral,
        (("config", config), ("calibrate", calibrate)),
        supports_operand_quantizers=not calibrate,
    )


def integer_factory(config: QATConfig) -> Callable[..., nn.Module]:
    """`int8_dot_general` without its checks: for `qat.int8_apply` (its model checked them)."""
    return _NamedFactory(Int8DotGeneral, (("config", config),))
