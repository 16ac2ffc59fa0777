"""Layer normalization over the last axis, with its derivative written in closed form.

`jax.grad` of the textbook formula differentiates the mean, the variance and
the reciprocal square root one by one: several passes over the `(..., F)`
activations and their cotangents, each its own reduction. The closed form
needs two reductions for the input's cotangent and one per parameter, and
every TFT block ends in a LayerNorm (the `(V, rows, D)` per-variable GRNs of
the variable selection networks most of all). It is a JVP rule
(`jax.custom_jvp`), so forward mode (`jax.jvp`, `jax.jacfwd`) works and
reverse mode is its transpose.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

Array = Any
Dtype = Any

DEFAULT_EPSILON = 1e-6


def layer_norm(
    x: Array,
    scale: Array,
    bias: Array,
    epsilon: float = DEFAULT_EPSILON,
    dtype: Dtype | None = None,
) -> Array:
    """`(x - mean) / sqrt(variance + epsilon) * scale + bias` over the last axis of `x`.

    Args:
      x: `(..., F)` activations; the statistics are computed in at least float32.
      scale, bias: broadcastable to `x` (`(F,)`, or e.g. `(V, 1, F)` per variable).
      epsilon: added to the variance, inside the square root; must be positive
        and finite (with 0 a constant row is `0 · inf = NaN`, and a negative
        one can take the square root of a negative number).
      dtype: the result's dtype (default `x.dtype`, or the statistics' float
        dtype for an integer `x`: casting back to integers would truncate the
        normalized values).

    Returns:
      `(..., F)` in `dtype`.

    Raises:
      TypeError: `epsilon` is traced (an argument of the caller's `jax.jit`):
        it is a constant of the closed-form derivative, so it must be static.
      ValueError: `epsilon` is not a positive finite number.
    """
    if isinstance(epsilon, jax.core.Tracer):
        raise TypeError(
            "layer_norm: epsilon must be a static Python float, got a traced value of shape "
            f"{epsilon.shape} and dtype {epsilon.dtype}; under jax.jit pass it as a static "
            "argument (static_argnames=...)"
        )
    epsilon = float(epsilon)
    if not 0.0 < epsilon < math.inf:
        raise ValueError(f"layer_norm: epsilon must be positive and finite, got {epsilon}")
    wide = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    if dtype is None:
        dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else wide.dtype
    return _affine_normalize(wide, scale, bias, epsilon).astype(dtype)


def _normalize(x: Array, epsilon: float) -> tuple[Array, Array]:
    """`((x - mean) * inv_std, inv_std)` over the last axis, `inv_std` with a size-1 last axis."""
    centered = x - jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(centered), axis=-1, keepdims=True)
    inv_std = jnp.reciprocal(jnp.sqrt(variance + epsilon))
    return centered * inv_std, inv_std


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _affine_normalize(x: Array, scale: Array, bias: Array, epsilon: float) -> Array:
    normalized, _ = _normalize(x, epsilon)
    return normalized * scale + bias


@_affine_normalize.defjvp
def _affine_normalize_jvp(
    epsilon: float, primals: tuple[Array, Array, Array], tangents: tuple[Array, Array, Array]
) -> tuple[Array, Array]:
    # With n = (x - mean) * inv_std over F features, the derivative of n along
    # dx is inv_std * (dx - mean(dx) - n * mean(n * dx)).
    x, scale, bias = primals
    dx, dscale, dbias = tangents
    normalized, inv_std = _normalize(x, epsilon)
    dnormalized = inv_std * (
        dx
        - jnp.mean(dx, axis=-1, keepdims=True)
        - normalized * jnp.mean(normalized * dx, axis=-1, keepdims=True)
    )
    primal_out = normalized * scale + bias
    tangent_out = dnormalized * scale + normalized * dscale + dbias
    return primal_out, tangent_out.astype(primal_out.dtype)
