"""Learned step size quantization (LSQ): a fake quantizer whose scale is trainable.

The forward is `fake_quantize` with step size `s = max(|scale|, eps)`. The
backward passes the clipped straight-through gradient to `x` and gives the
step size the LSQ gradient (Esser et al. 2020, eq. 3), generalised to an
affine grid with zero point `zp` as in PyTorch's
`_fake_quantize_learnable_per_tensor_affine`:

  d y / d s = round(x/s) - x/s   where qmin <= round(x/s) + zp <= qmax,
              qmin - zp          below the grid,
              qmax - zp          above it,

summed over the elements sharing a step size and multiplied by the gradient
scale `g = 1 / sqrt(N * qmax)`, `N` the number of elements per step size.
The raw parameter receives `sign(scale) * dL/ds` (sign(0) = +1): the exact
derivative where `|scale| > eps`, and straight through at the eps floor so
that a step size pushed to 0 can recover.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from qat.fake_quant import check_broadcastable, check_grid, compute_dtype, sum_to_shape
from qat.observers import EPS

Array = Any


def default_grad_scale(num_elements: int, scale_size: int, qmax: int) -> float:
    """The LSQ gradient scale `1 / sqrt(N * qmax)`, `N = num_elements / scale_size`."""
    per_step = max(num_elements // max(scale_size, 1), 1)
    return 1.0 / math.sqrt(per_step * max(qmax, 1))


def _step_size(scale: Array) -> Array:
    return jnp.maximum(jnp.abs(scale), EPS)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _lsq(x: Array, scale: Array, zero_point: Array, qmin: int, qmax: int, grad_scale: float):
    del grad_scale
    step = _step_size(scale)
    position = jnp.round(x / step) + zero_point
    return (jnp.clip(position, qmin, qmax) - zero_point) * step


def _lsq_fwd(x, scale, zero_point, qmin, qmax, grad_scale):
    return _lsq(x, scale, zero_point, qmin, qmax, grad_scale), (x, scale, zero_point)


def _lsq_bwd(qmin, qmax, grad_scale, residuals, g):
    x, scale, zero_point = residuals
    step = _step_size(scale)
    ratio = x / step
    rounded = jnp.round(ratio)
    position = rounded + zero_point
    below = position < qmin
    above = position > qmax
    inside = ~(below | above)
    d_step = jnp.where(
        below, qmin - zero_point, jnp.where(above, qmax - zero_point, rounded - ratio)
    )
    d_zero_point = jnp.where(inside, jnp.zeros_like(step), -step)
    sign = jnp.where(scale < 0, -1.0, 1.0).astype(scale.dtype)
    return (
        jnp.where(inside, g, jnp.zeros_like(g)),
        sum_to_shape(g * d_step, scale.shape) * grad_scale * sign,
        sum_to_shape(g * d_zero_point, zero_point.shape) * grad_scale,
    )


_lsq.defvjp(_lsq_fwd, _lsq_bwd)


def lsq_fake_quantize(
    x: Array,
    scale: Array,
    zero_point: Array,
    qmin: int,
    qmax: int,
    grad_scale: float | None = None,
) -> Array:
    """Fake-quantizes `x` with a learnable step size (LSQ).

    Args:
      x: float array of any shape.
      scale: the raw step-size parameter, broadcastable to `x`; the forward uses
        `max(|scale|, eps)`, so it stays positive whatever the optimizer does.
      zero_point: integer-valued zero point, broadcastable to `x`. Its gradient
        is `-s` at clipped elements and 0 inside (times `grad_scale`).
      qmin: lowest integer of the grid (a Python int).
      qmax: highest integer of the grid (a Python int).
      grad_scale: multiplier of the step-size gradient; None means
        `1 / sqrt(N * qmax)` with `N = x.size / scale.size` (PyTorch's
        `_LearnableFakeQuantize` with grad scaling).

    Returns:
      An array of `x`'s shape and dtype, equal to `fake_quantize(x, max(|scale|, eps), ...)`.

    References:
      Esser et al., "Learned Step Size Quantization", ICLR 2020.
    """
    qmin, qmax = check_grid(qmin, qmax)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating array, got dtype {x.dtype}")
    check_broadcastable("scale", scale, x.shape)
    check_broadcastable("zero_point", zero_point, x.shape)
    if grad_scale is None:
        grad_scale = default_grad_scale(x.size, int(jnp.size(scale)), qmax)
    dtype = compute_dtype(x.dtype)
    y = _lsq(
        x.astype(dtype),
        jnp.asarray(scale, dtype),
        jnp.asarray(zero_point, dtype),
        qmin,
        qmax,
        float(grad_scale),
    )
    return y.astype(x.dtype)
