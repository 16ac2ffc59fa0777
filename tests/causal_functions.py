"""Two sequence functions the causality checks are tested on: one causal, one not."""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.jit
def cumsum(x: jax.Array) -> jax.Array:
    """Running sum over time, `(B, T, D) -> (B, T, D)`: output `t` reads inputs `<= t`."""
    return jnp.cumsum(x, axis=1)


@jax.jit
def reverse_cumsum(x: jax.Array) -> jax.Array:
    """Sums from the end, `(B, T, D) -> (B, T, D)`: output `t` reads the inputs after `t`."""
    return jnp.flip(jnp.cumsum(jnp.flip(x, axis=1), axis=1), axis=1)
