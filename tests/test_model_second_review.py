"""Second review of the model modules: the attention kernel's precision in bfloat16.

Each test states a property that broke before its fix and compares against an
independent float64 NumPy computation of the same values.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tft_jax.attention import scaled_dot_product_attention

# One rounding to bfloat16 (8 significant bits) moves a value by at most 2^-8 of itself.
BFLOAT16_ROUNDING = 2.0**-8


def _float64_softmax_weights(query: np.ndarray, key: np.ndarray) -> np.ndarray:
    """`softmax(Q Kᵀ / sqrt(d))` in float64: `(..., Tq, d), (..., Tk, d) -> (..., Tq, Tk)`."""
    logits = query @ np.swapaxes(key, -1, -2) / np.sqrt(query.shape[-1])
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def test_bfloat16_attention_weights_are_the_float64_softmax_rounded_once():
    # Logits up to ~20: rounded to bfloat16 before the softmax they were off by up to 0.06,
    # which moved weights by up to 5%, ten times the weights' own final bfloat16 rounding.
    rng = np.random.default_rng(0)
    depth = 16
    query = jnp.asarray(2.0 * rng.normal(size=(2, 2, 6, depth)), jnp.bfloat16)
    key = jnp.asarray(2.0 * rng.normal(size=(2, 2, 40, depth)), jnp.bfloat16)
    value = jnp.asarray(rng.normal(size=(2, 1, 40, depth)), jnp.bfloat16)
    output, weights = scaled_dot_product_attention(query, key, value)
    # The inputs are exact bfloat16 values; the reference reads those very values.
    expected = _float64_softmax_weights(np.asarray(query, np.float64), np.asarray(key, np.float64))
    assert weights.dtype == output.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(weights, np.float64), expected, rtol=BFLOAT16_ROUNDING * 1.01, atol=1e-30
    )
