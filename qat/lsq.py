"""Learned step size quantization (LSQ): a fake quantizer whose scale is trainable.

The forward is `fake_quantize` with step size `s = max(|scale|, eps)` (the
input multiplied by `1/s`, as there and in PyTorch; `x/s` below stands for
that product). By default the backward is PyTorch's variant of LSQ
(`_fake_quantize_learnable_per_tensor_affine`, matched bit for bit): the
LSQ gradient of Esser et al. 2020, eq. 3, on an affine grid with zero point
`zp`, with inside and outside the grid decided from the rounded position
`round(x/s) + zp`, the same mask as the straight-through gradient of
`fake_quantize`:

  d y / d s = round(x/s) - x/s   where qmin <= round(x/s) + zp <= qmax,
              qmin - zp          below the grid,
              qmax - zp          above it;
  d y / d x = 1 on the grid, 0 off it,

summed over the elements sharing a step size and multiplied by the gradient
scale `g = 1 / sqrt(N * qmax)`, `N` the number of elements per step size
(the whole tensor's, PyTorch's `x.numel()`, for one step size per tensor).

Eq. 3 decides from the unrounded `x/s` instead: clipped where
`x/s + zp <= qmin` or `>= qmax`. The two differ only within half a step
outside the grid, where `x/s + zp` rounds onto `qmin` or `qmax`: at
`x/s = 127.3` (`zp = 0`, `qmax = 127`) eq. 3 gives `d y / d s = 127` and
`d y / d x = 0`, this gives `round(x/s) - x/s = -0.3` and `d y / d x = 1`
(and at exactly `x/s + zp = qmax`, 0 rather than `qmax - zp`).

`clip_from='unrounded'` (`QATConfig.lsq_clip_from`) computes eq. 3 itself:

  d y / d s = round(x/s) - x/s   where qmin < x/s + zp < qmax,
              qmin - zp          where x/s + zp <= qmin,
              qmax - zp          where x/s + zp >= qmax;
  d y / d x = 1 where qmin < x/s + zp < qmax, 0 elsewhere,

with the same forward, gradient scale and zero-point gradient (`-s` where
clipped, 0 inside, by the same mask).

The raw parameter receives `sign(scale) * dL/ds` (sign(0) = +1): the exact
derivative where `|scale| > eps`, and straight through at the eps floor so
that a step size pushed to 0 can recover.

The gradient is a surrogate for training: use reverse mode (`jax.grad`,
`jax.vjp`); forward mode (`jax.jvp`, `jax.jacfwd`, the function `jax.linearize` returns) raises
`ForwardModeError` naming `lsq_fake_quantize`.

`initial_step_size` is the paper's initialisation of a step size from data,
`2 * mean(|x|) / sqrt(qmax)`.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from qat import fake_quant
from qat._forward_mode import reverse_mode_only
from qat.config import ClipFrom, check_clip_from
from qat.division import reciprocal
from qat.fake_quant import check_broadcastable, check_grid, check_qparams, compute_dtype
from qat.observers import EPS

Array = Any


def default_grad_scale(num_elements: int, scale_size: int, qmax: int) -> float:
    """The LSQ gradient scale `1 / sqrt(N * qmax)`, `N = num_elements / scale_size`."""
    per_step = max(num_elements // max(scale_size, 1), 1)
    return 1.0 / math.sqrt(per_step * max(qmax, 1))


def initial_step_size(x: Array, qmax: int, channel_axis: int | None = None) -> Array:
    """LSQ's initial step size `2 * mean(|x|) / sqrt(qmax)` (Esser et al. 2020, section 2.1).

    The paper initialises each step size from the first tensor it quantizes
    (weights at the start, or the first batch's activations), so that the
    step starts at the scale of the data rather than at an arbitrary
    constant. Nothing here calls it: the QAT models start from the observer's
    step size; use it for a stand-alone `lsq_fake_quantize`.

    Args:
      x: a float array with at least one element, finite (checked outside `jax.jit`).
      qmax: the grid's highest integer (`Q_P` of the paper), a positive Python int.
      channel_axis: None for one step size for the whole tensor (a scalar), or
        an axis of `x` for one per slice along it (shape `(C,)`, the mean taken
        over every other axis).

    Returns:
      The step size in `x`'s compute dtype (at least float32). An all-zero
      `x` (or channel) gives 0, which `lsq_fake_quantize` floors at float32 eps.

    Raises:
      TypeError: `x` is not floating, `qmax` or `channel_axis` is not an int.
      ValueError: `x` is empty or holds NaN or inf, `qmax < 1`, or
        `channel_axis` is out of range for `x`.
    """
    if isinstance(qmax, bool) or not isinstance(qmax, numbers.Integral):
        raise TypeError(f"qmax must be a positive Python int, got {type(qmax).__name__} {qmax!r}")
    if qmax < 1:
        raise ValueError(f"qmax must be a positive int (the grid's highest integer), got {qmax}")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating array, got dtype {x.dtype}")
    if x.size == 0:
        raise ValueError(f"x must hold at least one element, got shape {tuple(x.shape)}")
    axes = _other_axes(x.ndim, channel_axis)
    magnitude = jnp.abs(x.astype(compute_dtype(x.dtype)))
    if fake_quant.is_concrete(magnitude):
        non_finite = int(jnp.sum(~jnp.isfinite(magnitude)))
        if non_finite:
            raise ValueError(
                f"x must be finite: it holds {non_finite} NaN or inf value(s) of {x.size}, "
                "which would make the step size NaN or inf"
            )
    return 2.0 * jnp.mean(magnitude, axis=axes) / math.sqrt(qmax)


def _other_axes(ndim: int, channel_axis: int | None) -> tuple[int, ...] | None:
    """The axes a per-channel mean reduces (all but `channel_axis`); None: every axis."""
    if channel_axis is None:
        return None
    if isinstance(channel_axis, bool) or not isinstance(channel_axis, numbers.Integral):
        raise TypeError(
            f"channel_axis must be an int or None, got {type(channel_axis).__name__} "
            f"{channel_axis!r}"
        )
    if not -ndim <= channel_axis < ndim:
        raise ValueError(f"channel_axis {channel_axis} is out of range for x of {ndim} axes")
    return tuple(axis for axis in range(ndim) if axis != channel_axis % ndim)


def _check_grad_scale(grad_scale: Any) -> float:
    """`grad_scale` as a Python float; it is static (part of the gradient rule), finite, >= 0."""
    if isinstance(grad_scale, jax.core.Tracer):
        raise TypeError(
            "grad_scale must be a concrete Python float (it is a static part of the gradient "
            "rule), got a traced value: compute it outside jax.jit or leave it None"
        )
    scalar_array = isinstance(grad_scale, np.ndarray | jax.Array) and grad_scale.shape == ()
    if isinstance(grad_scale, bool) or not (isinstance(grad_scale, numbers.Real) or scalar_array):
        raise TypeError(
            f"grad_scale must be a float or None, got {type(grad_scale).__name__} {grad_scale!r}"
        )
    value = float(grad_scale)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"grad_scale must be finite and >= 0, got {value}")
    return value


def _step_size(scale: Array) -> Array:
    return jnp.maximum(jnp.abs(scale), EPS)


def _grid_zero_point(zero_point: Array, qmin: int, qmax: int) -> Array:
    """The zero point the grid uses: `clip(round(zp), qmin, qmax)` (PyTorch's `nearbyint`)."""
    return jnp.clip(jnp.round(zero_point), qmin, qmax)


def _lsq_forward(x: Array, scale: Array, zero_point: Array, qmin: int, qmax: int) -> Array:
    step = _step_size(scale)
    zero_point = _grid_zero_point(zero_point, qmin, qmax)
    # Looked up on the module: a fault that replaces the grid reaches LSQ too.
    position = fake_quant._grid_position(x, step, zero_point)
    return (jnp.clip(position, qmin, qmax) - zero_point) * step


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4, 5, 6))
def _lsq(
    x: Array,
    scale: Array,
    zero_point: Array,
    qmin: int,
    qmax: int,
    grad_scale: float,
    clip_from: ClipFrom,
):
    del grad_scale, clip_from
    return _lsq_forward(x, scale, zero_point, qmin, qmax)


def _lsq_partials(
    x: Array, scale: Array, zero_point: Array, qmin: int, qmax: int, clip_from: ClipFrom
) -> tuple[Array, Array, Array, Array]:
    """`(inside, dy/dstep, dy/dzero_point, sign(scale))` per element (before grad scaling)."""
    step = _step_size(scale)
    zero_point = _grid_zero_point(zero_point, qmin, qmax)
    ratio = x * reciprocal(step)
    if clip_from == "rounded":
        position = fake_quant._grid_position(x, step, zero_point)
        rounded = position - zero_point  # exact inside the grid, the only place it is used
        below = position < qmin
        above = position > qmax
    else:
        # Eq. 3: the unrounded position decides, and its ends count as clipped.
        unrounded = ratio + zero_point
        rounded = jnp.round(ratio)
        below = unrounded <= qmin
        above = unrounded >= qmax
    inside = ~(below | above)
    d_step = jnp.where(
        below, qmin - zero_point, jnp.where(above, qmax - zero_point, rounded - ratio)
    )
    d_zero_point = jnp.where(inside, jnp.zeros_like(step), -step)
    sign = jnp.where(scale < 0, -1.0, 1.0).astype(scale.dtype)
    return inside, d_step, d_zero_point, sign


def _lsq_jvp(qmin, qmax, grad_scale, clip_from, primals, tangents):
    # A linear tangent map whose transpose is the estimator: `g * inside` for x,
    # `sum(g * dy/dstep) * grad_scale * sign` for the scale (the broadcast of the
    # scale's tangent transposes into that sum), `sum(g * dy/dzp) * grad_scale`
    # for the zero point. Forward mode stops at `reverse_mode_only`.
    x, scale, zero_point = primals
    y = _lsq_forward(x, scale, zero_point, qmin, qmax)
    inside, d_step, d_zero_point, sign = _lsq_partials(x, scale, zero_point, qmin, qmax, clip_from)
    x_dot, scale_dot, zero_point_dot = tangents
    terms = []
    if not isinstance(x_dot, SymbolicZero):
        terms.append(jnp.where(inside, x_dot, jnp.zeros_like(x_dot)))
    if not isinstance(scale_dot, SymbolicZero):
        terms.append(d_step * (scale_dot * (grad_scale * sign)))
    if not isinstance(zero_point_dot, SymbolicZero):
        terms.append(d_zero_point * (zero_point_dot * grad_scale))
    if not terms:
        return y, SymbolicZero(jax.typeof(y))
    tangent = functools.reduce(jnp.add, terms)
    return y, reverse_mode_only(jnp.broadcast_to(tangent, y.shape), "lsq_fake_quantize")


_lsq.defjvp(_lsq_jvp, symbolic_zeros=True)


def lsq_fake_quantize(
    x: Array,
    scale: Array,
    zero_point: Array,
    qmin: int,
    qmax: int,
    grad_scale: float | None = None,
    clip_from: ClipFrom = "rounded",
) -> Array:
    """Fake-quantizes `x` with a learnable step size (LSQ).

    By default the gradient is PyTorch's rounded-position variant of LSQ
    (see the module docstring): an element counts as clipped when
    `round(x/s) + zp` is off the grid, so `x/s` within half a step outside
    the grid gets `d y / d s = round(x/s) - x/s` and `d y / d x = 1`, where
    Esser et al.'s eq. 3 gives the clipped value and 0. `clip_from='unrounded'`
    gives eq. 3's gradient.

    Args:
      x: float array of any shape.
      scale: the raw step-size parameter, broadcastable to `x`; the forward uses
        `max(|scale|, eps)`, so it stays positive whatever the optimizer does.
        It must be finite (NaN or inf would make the output NaN).
      zero_point: the zero point, broadcastable to `x`, finite; the grid uses
        `clip(round(zero_point), qmin, qmax)`, so a learned zero point moved
        off the integers by its gradient stays on the grid (as PyTorch's
        `_LearnableFakeQuantize`). Its gradient is `-s` at clipped elements
        and 0 inside (times `grad_scale`), passed straight through the rounding.
      qmin: lowest integer of the grid (a Python int).
      qmax: highest integer of the grid (a Python int).
      grad_scale: multiplier of the step-size gradient, a finite float >= 0
        known outside `jax.jit` (it is static); None means
        `1 / sqrt(N * qmax)` with `N = x.size / scale.size` (PyTorch's
        `_LearnableFakeQuantize` with grad scaling per tensor; per channel PyTorch
        uses `N = x.size`, here `N` counts the elements sharing a step size).
        `N` is what this call sees: under `jax.vmap` over a batch of `B`
        that is one example, and the summed step gradient comes out
        `sqrt(B)` times the batched call's; pass
        `grad_scale=qat.lsq.default_grad_scale(B * x.size, scale.size, qmax)` there.
      clip_from: where the gradient decides that an element is clipped:
        `'rounded'` (the default), from `round(x/s) + zp` off the grid, as
        PyTorch and the straight-through mask of `fake_quantize`; or
        `'unrounded'`, from `x/s + zp <= qmin` or `>= qmax`, as eq. 3. The
        forward does not depend on it.

    Returns:
      An array of `x`'s shape and dtype, equal to `fake_quantize(x, max(|scale|, eps), ...)`.

    Raises:
      ValueError: a concrete `scale` that is not finite (in the compute dtype), a concrete
        `zero_point` that is not finite, or a
        `grad_scale` that is negative or not finite.
      TypeError: a `grad_scale` that is not a number, or is traced; a `scale` or
        `zero_point` that is not a number or numeric array; a `clip_from`
        that is not a string (one that is not `'rounded'` or `'unrounded'`
        is a `ValueError`).

    References:
      Esser et al., "Learned Step Size Quantization", ICLR 2020 (eq. 3).
      PyTorch, `torch._fake_quantize_learnable_per_tensor_affine` and
      `torch.ao.quantization._LearnableFakeQuantize`.
    """
    qmin, qmax = check_grid(qmin, qmax)
    check_clip_from(clip_from)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating array, got dtype {x.dtype}")
    check_broadcastable("scale", scale, x.shape)
    check_broadcastable("zero_point", zero_point, x.shape)
    dtype = compute_dtype(x.dtype)
    check_qparams(
        scale, zero_point, qmin, qmax, positive_scale=False, dtype=dtype, integer_zero_point=False
    )
    if grad_scale is None:
        grad_scale = default_grad_scale(x.size, int(jnp.size(scale)), qmax)
    else:
        grad_scale = _check_grad_scale(grad_scale)
    y = _lsq(
        x.astype(dtype),
        jnp.asarray(scale, dtype),
        jnp.asarray(zero_point, dtype),
        qmin,
        qmax,
        float(grad_scale),
        clip_from,
    )
    return y.astype(x.dtype)
