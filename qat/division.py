"""Correctly rounded float32 division `a / b` on every backend, for quantization parameters.

A quantizer's codes depend on the last bit of its scale and of `1 / s` (an
input near a tie `x / s = k + 0.5` rounds to one code or the other), so an
observer's scale and zero point, and the codes, should be the bits PyTorch
and NumPy give. XLA's float32 division is not correctly rounded in general:
on GPU it is PTX's `div.full.f32` (within an ulp or two; openxla/xla#37181),
TPUs divide approximately, and on every backend XLA rewrites a division by a
constant or a broadcast divisor into a multiplication by its reciprocal. A
quarter or more of such quotients come out one ulp off.

`divide` is a primitive lowered per platform. On CPUs and GPUs it divides
in float64 and rounds to float32: the exact quotient of two float32 numbers
is never a midpoint between two float32 numbers, nor within `2^-49` of one
(relative), so a float64 quotient, within `2^-52` however XLA computes it
(a division, or a multiplication by a rounded reciprocal), rounds to the
correctly rounded float32 quotient.

The same theorem lets LLVM's instruction combiner rewrite
`fptrunc(fdiv(fpext a, fpext b))` into a float32 `fdiv a, b`: exact on a
CPU, whose float32 division is IEEE, but on a GPU XLA lowers that to its
approximate `div.full`, and the float64 form gave XLA's bits (found on an
H200; the test suite's `-O0` builds skip the combiner). On GPUs the float64
quotient is therefore rounded to float32's format by `reduce_precision`
(integer operations on its bits, which LLVM cannot fold back into a float32
division) before the exact conversion. Quotients below float32's smallest
normal number flush to zero there, as XLA's CPU code flushes them anyway.

TPUs have no float64: there it computes the quotient from the two
significands in integer arithmetic (`integer_divide`), which every backend
does exactly and no compiler rewrites. Other dtypes divide as XLA does.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo
from jax.interpreters import ad, batching, mlir

Array = Any

_MANTISSA_BITS = 23
_IMPLICIT_BIT = 1 << _MANTISSA_BITS
_EXPONENT_BIAS = 127


def rounded_quotient(dividend: Array, shift: Array, divisor: Array, estimate: Array) -> Array:
    """`round(n * 2^shift / m)`, ties to even, from an estimate within 100 of it.

    Args:
      dividend: int32 significands `n` in `[2^23, 2^24)`.
      shift: int32 array of 23 or 24, chosen so that the quotient is in `[2^23, 2^24]`.
      divisor: int32 significands `m` in `[2^23, 2^24)`.
      estimate: int32, within 100 of `n * 2^shift / m`.

    Returns:
      int32 array of the broadcast shape.

    The remainder `n 2^shift - q m` of such an estimate `q` is below `2^31` in
    magnitude, so its value modulo `2^32` (wrapping uint32 shifts and
    products) read as int32 is the remainder itself.
    """
    m = divisor.astype(jnp.uint32)
    wrapped = (dividend.astype(jnp.uint32) << shift.astype(jnp.uint32)) - (
        estimate.astype(jnp.uint32) * m
    )
    remainder = lax.bitcast_convert_type(wrapped, jnp.int32)
    correction = jnp.floor_divide(remainder, divisor)
    quotient = estimate + correction
    remainder = remainder - correction * divisor  # now in [0, m)
    half_up = 2 * remainder > divisor
    tie_to_odd = (2 * remainder == divisor) & (quotient % 2 == 1)
    return quotient + (half_up | tie_to_odd).astype(jnp.int32)


def _fields(value: Array) -> tuple[Array, Array]:
    """`(biased exponent, 24-bit significand)` of float32 magnitudes."""
    bits = lax.bitcast_convert_type(value, jnp.int32) & 0x7FFFFFFF
    return bits >> _MANTISSA_BITS, (bits & (_IMPLICIT_BIT - 1)) | _IMPLICIT_BIT


def integer_divide(a: Array, b: Array) -> Array:
    """`a / b` for float32, correctly rounded by integer arithmetic; shapes broadcast.

    Exact wherever `a` and `b` are normal numbers and the quotient is one;
    everywhere else (zeros, subnormals, `inf`, NaN, a quotient that would
    overflow or be subnormal) the backend's division.
    """
    a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
    a_exponent, n = _fields(a)
    b_exponent, m = _fields(b)
    # n / m lies in (1/2, 2): scaled by 2^24 below 1, by 2^23 from 1 up, it is in [2^23, 2^24).
    below_one = n < m
    shift = jnp.where(below_one, 24, 23)
    scaled = n.astype(jnp.float32) * jnp.where(below_one, 2.0**24, 2.0**23).astype(jnp.float32)
    # Within 3 of the quotient wherever XLA's division is within 2 ulp.
    estimate = (scaled / m.astype(jnp.float32)).astype(jnp.int32)
    quotient = rounded_quotient(n, shift, m, estimate)
    carry = quotient >> (_MANTISSA_BITS + 1)  # 1 where the quotient rounded up to 2^24
    # a / b = quotient * 2^(A - B - shift) for biased exponents A, B.
    exponent = a_exponent - b_exponent + _EXPONENT_BIAS + _MANTISSA_BITS - shift + carry
    mantissa = jnp.where(carry == 1, 0, quotient - _IMPLICIT_BIT)
    sign = (lax.bitcast_convert_type(a, jnp.int32) ^ lax.bitcast_convert_type(b, jnp.int32)) & (
        -(1 << 31)
    )
    exact = lax.bitcast_convert_type(sign | (exponent << _MANTISSA_BITS) | mantissa, jnp.float32)
    normal_inputs = (a_exponent >= 1) & (a_exponent < 255) & (b_exponent >= 1) & (b_exponent < 255)
    in_range = normal_inputs & (exponent >= 1) & (exponent < 255)
    return jnp.where(in_range, exact, a / b)


def _float64_divide(a: Array, b: Array) -> Array:
    """`a / b` of float32 operands computed in float64, rounded to float32."""
    return (a.astype(jnp.float64) / b.astype(jnp.float64)).astype(jnp.float32)


def _float64_divide_in_float32_format(a: Array, b: Array) -> Array:
    """`_float64_divide` with the quotient rounded by `reduce_precision` first (GPUs)."""
    quotient = a.astype(jnp.float64) / b.astype(jnp.float64)
    rounded = lax.reduce_precision(quotient, exponent_bits=8, mantissa_bits=_MANTISSA_BITS)
    return rounded.astype(jnp.float32)


def _lower_in_float64(ctx: Any, a: Any, b: Any, *, gpu: bool = False) -> Sequence[Any]:
    """StableHLO `convert(convert(a, f64) / convert(b, f64), f32)`.

    On GPUs (`gpu`), a `reduce_precision` to float32's format sits between
    the division and the final conversion (see the module docstring).
    Emitted as a few operations rather than traced from a function: a QAT
    model holds over a thousand divisions, and tracing each added to compile
    time. A symbolic shape (`jax.export` with polymorphic dimensions) is
    traced instead. The float64 values never leave the lowered code.
    """
    (aval,) = ctx.avals_out
    if not all(isinstance(size, int) for size in aval.shape):
        traced = _float64_divide_in_float32_format if gpu else _float64_divide
        with jax.enable_x64(True):
            return mlir.lower_fun(traced, multiple_results=False)(ctx, a, b)
    wide = ir.RankedTensorType.get(aval.shape, ir.F64Type.get())
    narrow = ir.RankedTensorType.get(aval.shape, ir.F32Type.get())
    quotient = stablehlo.divide(stablehlo.convert(wide, a), stablehlo.convert(wide, b))
    if gpu:
        quotient = stablehlo.reduce_precision(quotient, 8, _MANTISSA_BITS)
    return [stablehlo.convert(narrow, quotient)]


def _eager_divide(a: Array, b: Array) -> Array:
    """An eager call (also under `jax.disable_jit`): NumPy's float32 quotient, on `a`'s devices."""
    with np.errstate(all="ignore"):
        quotient = np.asarray(a, np.float32) / np.asarray(b, np.float32)
    return jax.device_put(quotient, a.sharding if isinstance(a, jax.Array) else None)


def _batch_divide(args: Sequence[Array], dims: Sequence[Any]) -> tuple[Array, int]:
    """The batching rule: both operands batched on axis 0, then of one shape.

    `divide` binds operands of equal shapes (the lowering's `stablehlo.divide`
    needs them); under `vmap` one may be unbatched, so it is broadcast along
    the batch axis rather than left a size-1 axis.
    """
    size = next(x.shape[d] for x, d in zip(args, dims, strict=True) if d is not None)
    a, b = (batching.bdim_at_front(x, d, size) for x, d in zip(args, dims, strict=True))
    a, b = jnp.broadcast_arrays(a, b)
    return _divide_p.bind(a, b), 0


_divide_p = Primitive("correctly_rounded_divide")
_divide_p.def_impl(_eager_divide)
_divide_p.def_abstract_eval(lambda a, b: a.update(weak_type=False))
batching.primitive_batchers[_divide_p] = _batch_divide
ad.defjvp(
    _divide_p,
    lambda g, a, b: g / b,
    lambda g, a, b: -g * _divide_p.bind(a, b) / b,
)
mlir.register_lowering(_divide_p, _lower_in_float64)
for _gpu_platform in ("cuda", "rocm"):
    mlir.register_lowering(
        _divide_p, functools.partial(_lower_in_float64, gpu=True), platform=_gpu_platform
    )
mlir.register_lowering(
    _divide_p, mlir.lower_fun(integer_divide, multiple_results=False), platform="tpu"
)


def divide(a: Array, b: Array) -> Array:
    """`a / b`, correctly rounded for float32 on every backend; shapes broadcast.

    Float32 quotients (Python numbers take the other operand's dtype) come
    from the module's primitive (float64 on CPUs and GPUs, `integer_divide`
    on TPUs); other dtypes from XLA's division. On GPUs a float32 quotient
    below the smallest normal float32 flushes to zero.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    dtype = jnp.result_type(a, b)
    if dtype != jnp.float32:
        return a / b
    a, b = jnp.broadcast_arrays(a.astype(dtype), b.astype(dtype))
    return _divide_p.bind(a, b)


def reciprocal(scale: Array) -> Array:
    """`1 / scale`, correctly rounded for float32 on every backend (`divide`)."""
    scale = jnp.asarray(scale)
    return divide(jnp.ones((), scale.dtype), scale)


__all__ = ["divide", "integer_divide", "reciprocal", "rounded_quotient"]
