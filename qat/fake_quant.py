"""Fake quantization with a straight-through gradient, and the `FakeQuantize` pytree.

Fake quantization rounds a float tensor onto the integer grid `[qmin, qmax]`
and maps it straight back: `(clip(round(x * (1/s)) + zp, qmin, qmax) - zp) * s`,
so training sees the quantization error while every tensor stays floating
point. Rounding is half to even (`jnp.round`, PyTorch's `nearbyint`).

`x` is multiplied by the reciprocal of the scale, as PyTorch's fake
quantization kernels do (`inv_scale = 1 / scale`), not divided by it: the two
differ by one ulp of the quotient for about a quarter of the inputs, which
rounds `x` to the neighbouring code where `x / s` lies within that ulp of a
tie. Written out, the codes are the same on every backend and for every
scale shape (XLA rewrites a division by a broadcast scale into that
multiplication, but divides by a scale of `x`'s full shape), with the
reciprocal itself correctly rounded on every backend (`qat.division`).

The gradient is the clipped straight-through estimator of PyTorch's
`fake_quantize_per_tensor_affine`: `g * 1[qmin <= round(x * (1/s)) + zp <= qmax]`,
inclusive at both ends and exactly 0 or 1 per element. It is written out in a
`jax.custom_jvp` rule (differentiating the forward would give 0 almost
everywhere (round) and 0.5 at a clip bound, `jnp.clip` splits ties) whose
transpose is that estimator.

The estimator is a surrogate gradient for training: use reverse mode
(`jax.grad`, `jax.vjp`). Forward mode (`jax.jvp`, `jax.jacfwd`, calling the
function `jax.linearize` returns) raises `ForwardModeError` naming
`fake_quantize`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Self

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.custom_derivatives import SymbolicZero

from qat._forward_mode import reverse_mode_only
from qat.config import QATConfig
from qat.division import reciprocal
from qat.observers import QuantizationObserver

Array = Any


def compute_dtype(dtype: Any) -> Any:
    """The float type quantization arithmetic runs in: at least float32 (bfloat16 is too coarse)."""
    return jnp.promote_types(dtype, jnp.float32)


def sum_to_shape(values: Array, shape: tuple[int, ...]) -> Array:
    """Sums `values` over the axes that broadcasting `shape` up to `values.shape` created.

    The adjoint of broadcasting: the cotangent of a broadcast parameter.
    """
    extra = values.ndim - len(shape)
    values = jnp.sum(values, axis=tuple(range(extra))) if extra else values
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and values.shape[i] != 1)
    return jnp.sum(values, axis=axes, keepdims=True) if axes else values


# The widest grid ends: the codes are computed in float32 at least, which holds
# every integer of `[-2^24, 2^24]` exactly and skips odd ones past it.
GRID_LIMIT = 2**24


def check_grid(qmin: Any, qmax: Any) -> tuple[int, int]:
    """Validates an integer grid `[qmin, qmax]` given as Python ints, `qmin < qmax`.

    Both ends must lie in `[-2^24, 2^24]`: the codes `round(x/s) + zp` are
    float32 (at least), exact for every integer only up to `2^24`, so a wider
    grid would silently skip codes (and past int32, JAX refuses the bound
    with an `OverflowError` deep in the clip).
    """
    for name, value in (("qmin", qmin), ("qmax", qmax)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be a Python int, got {type(value).__name__} {value!r}")
    for name, value in (("qmin", qmin), ("qmax", qmax)):
        if not -GRID_LIMIT <= value <= GRID_LIMIT:
            raise ValueError(
                f"{name} must be in [-2**24, 2**24] = [{-GRID_LIMIT}, {GRID_LIMIT}] (the codes "
                f"are float32, exact for every integer only up to 2**24), got qmin={qmin}, "
                f"qmax={qmax}"
            )
    if not qmin < qmax:
        raise ValueError(f"qmin must be < qmax, got qmin={qmin}, qmax={qmax}")
    return int(qmin), int(qmax)


def check_broadcastable(name: str, value: Array, x_shape: tuple[int, ...]) -> None:
    """Raises if concrete `value` is not numeric, or if it does not broadcast to `x_shape` as is."""
    if is_concrete(value):
        _check_numeric(name, value)
    try:
        shape = jnp.broadcast_shapes(jnp.shape(value), x_shape)
    except ValueError:
        shape = None
    if shape != tuple(x_shape):
        raise ValueError(
            f"{name} of shape {tuple(jnp.shape(value))} must broadcast to x's shape "
            f"{tuple(x_shape)}"
        )


def is_concrete(value: Any) -> bool:
    """Whether `value` holds data now (not a tracer of `jax.jit`, `jax.grad`, ...)."""
    return not isinstance(value, jax.core.Tracer)


def _invalid_entries(values: np.ndarray, bad: np.ndarray, limit: int = 4) -> str:
    """`values` where `bad` holds, at most `limit` of them, for an error message."""
    shown = values[bad].ravel()[:limit].tolist()
    more = int(bad.sum()) - len(shown)
    return f"{shown}" + (f" (and {more} more)" if more > 0 else "")


def _check_numeric(name: str, value: Any) -> None:
    """Raises `TypeError` naming `name` unless `value` is a number or numeric array."""
    try:
        array = value if isinstance(value, jax.Array | np.ndarray) else np.asarray(value)
        dtype = array.dtype
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be a number or numeric array, got {value!r}") from error
    if not (jnp.issubdtype(dtype, jnp.number) or dtype == np.bool_):
        raise TypeError(
            f"{name} must be a number or numeric array, got {type(value).__name__} {value!r} "
            f"(dtype {dtype})"
        )


def check_qparams(
    scale: Array,
    zero_point: Array,
    qmin: int,
    qmax: int,
    *,
    positive_scale: bool = True,
    dtype: Any = None,
    integer_zero_point: bool = True,
) -> None:
    """Raises for qparams that would give NaN, inf or a wrong grid; traced values pass unchecked.

    `scale` must be finite (and > 0 with `positive_scale`): a zero, infinite or
    NaN step size turns the output into NaN (`0/0`, `0*inf`), a negative one
    mirrors the grid. With `dtype` (the dtype the arithmetic runs in) the scale
    must also stay so once cast to it: `1e300` overflows float32 to inf, and a
    positive scale below its smallest normal number is 0 to XLA, which flushes
    subnormals (both gave NaN). `zero_point` must be an integer value in
    `[qmin, qmax]` (PyTorch's `fake_quantize_*_affine` refuses one outside too):
    the grid is then shifted off the range of the codes. Without
    `integer_zero_point` (a learnable zero point, rounded onto the grid by its
    user) it need only be finite. Only concrete values
    are checked (under `jax.jit` they are tracers and the call stays free of host syncs).
    """
    for name, value in (("scale", scale), ("zero_point", zero_point)):
        if is_concrete(value):
            _check_numeric(name, value)
    if is_concrete(scale):
        values = np.asarray(scale, np.float64)
        bad = ~np.isfinite(values) | ((values <= 0) if positive_scale else False)
        wanted = "finite and > 0" if positive_scale else "finite"
        if np.any(bad):
            raise ValueError(f"scale must be {wanted}, got {_invalid_entries(values, bad)}")
        if dtype is not None:
            info = jnp.finfo(dtype)
            with np.errstate(over="ignore"):
                cast = np.asarray(values, np.dtype(dtype)).astype(np.float64)
            bad = ~np.isfinite(cast)
            limits = f"|scale| <= {float(info.max):.4g}"
            if positive_scale:
                bad = bad | (cast < float(info.tiny))
                limits = f"{float(info.tiny):.4g} <= scale <= {float(info.max):.4g}; XLA "
                limits += "flushes smaller, subnormal values to 0"
            if np.any(bad):
                raise ValueError(
                    f"scale must be {wanted} in {np.dtype(dtype).name}, the dtype the arithmetic "
                    f"runs in ({limits}), got {_invalid_entries(values, bad)}"
                )
    if is_concrete(zero_point):
        values = np.asarray(zero_point, np.float64)
        bad = ~np.isfinite(values)
        wanted = "finite"
        if integer_zero_point:
            bad = bad | (values != np.round(values)) | (values < qmin) | (values > qmax)
            wanted = f"an integer in [qmin, qmax] = [{qmin}, {qmax}]"
        if np.any(bad):
            raise ValueError(f"zero_point must be {wanted}, got {_invalid_entries(values, bad)}")


def _grid_position(x: Array, scale: Array, zero_point: Array) -> Array:
    """`round(x * (1/s)) + zp` in the compute dtype (not yet clipped): PyTorch's codes."""
    return jnp.round(x * reciprocal(scale)) + zero_point


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _fake_quantize(x: Array, scale: Array, zero_point: Array, qmin: int, qmax: int) -> Array:
    position = _grid_position(x, scale, zero_point)
    return (jnp.clip(position, qmin, qmax) - zero_point) * scale


def _fake_quantize_fwd(x, scale, zero_point, qmin, qmax):
    """`(y, residuals)`: the forward and what the estimator needs (the in-range mask)."""
    position = _grid_position(x, scale, zero_point)
    inside = (position >= qmin) & (position <= qmax)
    y = (jnp.clip(position, qmin, qmax) - zero_point) * scale
    return y, (inside, scale, zero_point)


def _fake_quantize_bwd(qmin, qmax, residuals, g):
    """The estimator's cotangents `(g * mask, 0, 0)` for `(x, scale, zero_point)`."""
    del qmin, qmax
    inside, scale, zero_point = residuals
    # Scale and zero point are constants of the estimator (PyTorch's
    # fake_quantize_*_affine gives them no gradient); `lsq_fake_quantize` learns the scale.
    return (
        jnp.where(inside, g, jnp.zeros_like(g)),
        jnp.zeros_like(scale),
        jnp.zeros_like(zero_point),
    )


def _fake_quantize_jvp(qmin, qmax, primals, tangents):
    # The estimator's map `g -> g * mask` is symmetric, so the tangent map is the
    # backward rule applied to the tangent of x; JAX transposes it into exactly
    # that rule for jax.grad. Forward mode stops at `reverse_mode_only`.
    y, residuals = _fake_quantize_fwd(*primals, qmin, qmax)
    x_dot = tangents[0]
    if isinstance(x_dot, SymbolicZero):
        return y, SymbolicZero(jax.typeof(y))
    masked = _fake_quantize_bwd(qmin, qmax, residuals, x_dot)[0]
    return y, reverse_mode_only(masked, "fake_quantize")


_fake_quantize.defjvp(_fake_quantize_jvp, symbolic_zeros=True)


def fake_quantize(
    x: Array, scale: Array, zero_point: Array, qmin: int | np.integer, qmax: int | np.integer
) -> Array:
    """Quantizes `x` onto `[qmin, qmax]` and back, with the clipped straight-through gradient.

    Forward: `(clip(round(x * (1/s)) + zp, qmin, qmax) - zp) * s`, rounding
    half to even, with the reciprocal of the scale as PyTorch computes it (the
    module docstring says why). Backward: `g * 1[qmin <= round(x * (1/s)) + zp
    <= qmax]` (inclusive at both ends); `scale` and `zero_point` receive zero
    gradient. The backward is a surrogate for training: use reverse mode
    (`jax.grad`, `jax.vjp`); forward mode (`jax.jvp`, `jax.jacfwd`,
    the function `jax.linearize` returns) raises `ForwardModeError`.

    Args:
      x: float array of any shape.
      scale: positive finite step size, broadcastable to `x` (a scalar per tensor,
        or e.g. shape `(1, C)` for per-channel along the last axis of `(N, C)`).
      zero_point: integer-valued zero point in `[qmin, qmax]`, broadcastable to `x`.
      qmin: lowest integer of the grid (a Python or NumPy int, at least `-2**24`).
      qmax: highest integer of the grid (a Python or NumPy int, at most `2**24`).

    Returns:
      An array of `x`'s shape and dtype. The arithmetic runs in at least float32.
      `+-inf` saturate to the grid's ends, as any value beyond them does (as in
      PyTorch; an int8 code has no infinity) and get no gradient; NaN stays NaN.

    Raises:
      ValueError: a concrete (not traced) `scale` that is not finite and
        positive as a normal number of the compute dtype (float32 overflows
        1e300 to inf, XLA flushes subnormals to 0), or a concrete `zero_point`
        that is not an integer in `[qmin, qmax]` (either would give NaN or a
        shifted grid), or a grid with `qmin >= qmax` or an end outside
        `[-2**24, 2**24]` (float32 codes are exact only there).
      TypeError: a `scale` or `zero_point` that is not a number or numeric array.

    References:
      PyTorch `torch.fake_quantize_per_tensor_affine` / `per_channel_affine`.
    """
    qmin, qmax = check_grid(qmin, qmax)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating array, got dtype {x.dtype}")
    check_broadcastable("scale", scale, x.shape)
    check_broadcastable("zero_point", zero_point, x.shape)
    dtype = compute_dtype(x.dtype)
    check_qparams(scale, zero_point, qmin, qmax, dtype=dtype)
    y = _fake_quantize(
        x.astype(dtype), jnp.asarray(scale, dtype), jnp.asarray(zero_point, dtype), qmin, qmax
    )
    return y.astype(x.dtype)


def quantize(x: Array, scale: Array, zero_point: Array, qmin: int, qmax: int) -> Array:
    """The integer codes `clip(round(x * (1/s)) + zp, qmin, qmax)` as int32 (no gradient)."""
    dtype = compute_dtype(x.dtype)
    position = _grid_position(
        x.astype(dtype), jnp.asarray(scale, dtype), jnp.asarray(zero_point, dtype)
    )
    return jnp.clip(position, qmin, qmax).astype(jnp.int32)


def _float_array(name: str, value: Any) -> Array:
    """`value` as a float32 array; a `TypeError` naming `name` when it is not numeric or bool."""
    _check_numeric(name, value)
    array = jnp.asarray(value)
    if array.dtype == jnp.bool_:
        raise TypeError(f"{name} must be a number or numeric array, got dtype {array.dtype}")
    return array.astype(jnp.float32)


def channel_broadcast(values: Array, ndim: int, axis: int | None) -> Array:
    """Reshapes per-channel `values (C,)` to broadcast along `axis` of an `ndim`-d array.

    With `axis=None` (per tensor) `values` is returned unchanged.
    """
    if axis is None:
        return values
    shape = [1] * ndim
    shape[axis % ndim] = values.shape[0]
    return jnp.reshape(values, shape)


@struct.dataclass
class FakeQuantize:
    """A fake quantizer with fixed qparams: a pytree holding `scale` and `zero_point`.

    Per tensor, `scale` and `zero_point` are scalars; per channel they have
    shape `(C,)` and apply along `channel_axis` of the input. Both leaves are
    float32 (the zero point holds an integer value), so the quantizer is a
    pytree `jax.grad` can differentiate with respect to; the straight-through
    estimator gives both a zero gradient (learn the step size with
    `lsq_fake_quantize`). The grid bounds are static fields.
    """

    scale: Array
    zero_point: Array
    qmin: int = struct.field(pytree_node=False)
    qmax: int = struct.field(pytree_node=False)
    channel_axis: int | None = struct.field(pytree_node=False, default=None)

    if TYPE_CHECKING:  # added by `flax.struct.dataclass` at runtime; declared for type checkers

        def replace(self, **changes: Any) -> Self:
            """A copy with the given fields replaced (`dataclasses.replace`)."""
            ...

    @classmethod
    def create(cls, cfg: QATConfig, *, scale: Any, zero_point: Any = 0) -> FakeQuantize:
        """A fake quantizer on `cfg`'s grid with the given qparams.

        Per channel (`cfg.per_channel`), `scale` is `(C,)` and `zero_point` a
        scalar or `(C,)`; per tensor both are scalars. `scale` must be finite
        and positive; `zero_point` an integer in `[cfg.qmin, cfg.qmax]`, and 0
        for a symmetric `cfg` (its grid is centred on 0 by definition).
        """
        if not isinstance(cfg, QATConfig):
            raise TypeError(f"cfg must be a QATConfig, got {type(cfg).__name__}")
        scale = _float_array("scale", scale)
        expected_ndim = 1 if cfg.per_channel else 0
        if scale.ndim != expected_ndim:
            layout = "per-channel (C,)" if cfg.per_channel else "per-tensor scalar"
            raise ValueError(f"scale must be a {layout}, got shape {tuple(scale.shape)}")
        zero_point = _float_array("zero_point", zero_point)
        if zero_point.ndim > 1 or zero_point.shape not in ((), scale.shape):
            raise ValueError(
                f"zero_point must be a scalar or of scale's shape {tuple(scale.shape)}, got "
                f"shape {tuple(zero_point.shape)}"
            )
        zero_point = jnp.broadcast_to(zero_point, scale.shape)
        check_qparams(scale, zero_point, cfg.qmin, cfg.qmax, dtype=scale.dtype)
        if cfg.symmetric and is_concrete(zero_point) and bool(jnp.any(zero_point != 0)):
            raise ValueError(
                f"zero_point must be 0 for a symmetric QATConfig (symmetric=True), got "
                f"{zero_point}; use QATConfig(symmetric=False) for an affine grid"
            )
        return cls(
            scale=scale,
            zero_point=zero_point,
            qmin=cfg.qmin,
            qmax=cfg.qmax,
            channel_axis=cfg.channel_axis if cfg.per_channel else None,
        )

    @classmethod
    def from_observer(cls, observer: QuantizationObserver) -> FakeQuantize:
        """A fake quantizer with the qparams a `QuantizationObserver` has computed.

        Raises `ValueError` for an observer that has not observed a batch: its
        qparams are the eps-floored placeholder (scale ~1e-7), which would clip
        every input to about +-1e-5. (A traced observer, inside `jax.jit`, is
        not checked.)
        """
        if not isinstance(observer, QuantizationObserver):
            raise TypeError(
                f"observer must be a qat.QuantizationObserver, got {type(observer).__name__}"
            )
        # A per-channel observer keeps shape () until its first batch: that is static,
        # so it is refused under jax.jit too (it failed later with an IndexError).
        unobserved_channels = observer.per_channel and jnp.ndim(observer.min_val) == 0
        if unobserved_channels or (
            is_concrete(observer.num_batches) and int(observer.num_batches) == 0
        ):
            raise ValueError(
                "observer has not observed any batch (num_batches == 0), so it has no range "
                "to quantize with: call observer = observer.observe(x) first"
            )
        scale, zero_point = observer.qparams()
        return cls(
            scale=scale,
            zero_point=jnp.asarray(zero_point, jnp.float32),
            qmin=observer.qmin,
            qmax=observer.qmax,
            channel_axis=observer.channel_axis if observer.per_channel else None,
        )

    def scale_zero_point(self) -> tuple[Array, Array]:
        """`(scale, zero_point)` as float32: scalars, or `(C,)` per channel."""
        return self.scale, self.zero_point

    def __call__(self, x: Array) -> Array:
        """Fake-quantizes `x` (any shape; per channel, `x.shape[channel_axis] == C`)."""
        x = jnp.asarray(x)
        if self.channel_axis is not None:
            if not -x.ndim <= self.channel_axis < x.ndim:
                raise ValueError(
                    f"channel_axis {self.channel_axis} is out of range for x of shape "
                    f"{tuple(x.shape)}"
                )
            if x.shape[self.channel_axis] != self.scale.shape[0]:
                raise ValueError(
                    f"x has {x.shape[self.channel_axis]} channels on axis {self.channel_axis}, "
                    f"the quantizer has {self.scale.shape[0]}"
                )
        scale = channel_broadcast(self.scale, x.ndim, self.channel_axis)
        zero_point = channel_broadcast(self.zero_point, x.ndim, self.channel_axis)
        return fake_quantize(x, scale, zero_point, self.qmin, self.qmax)
