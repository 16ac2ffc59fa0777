"""The default tolerances of `properties.checks` follow the output's magnitude: a wrong
result at 1e-8 is caught, float32 rounding of an output at 1e6 is allowed, and an explicit
`atol` stays absolute."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from properties import checks


def _doubled_under_jit(x: jax.Array) -> jax.Array:
    """Twice `x` when traced, `x` when run op by op: a wrong compiled result."""
    return x * (2.0 if isinstance(x, jax.core.Tracer) else 1.0)


def test_jit_matches_eager_default_catches_a_wrong_result_of_magnitude_1e_8() -> None:
    # A fixed atol of 1e-6 accepted every result whose values are all below it.
    x = np.full(5, 1e-8, np.float32)
    with pytest.raises(AssertionError, match="differs from fn run op by op"):
        checks.assert_jit_matches_eager(_doubled_under_jit, x)


def _sum_reassociated_under_jit(x: jax.Array) -> jax.Array:
    """`(B, N)`: rows `x[0] + x[1] + x[2]` summed in another order when traced, next to `x[0]`.

    Both orders are correct float32 sums; with `x[0] = 1e6` and `x[1] = -1e6`
    they differ by float32 rounding at 1e6 (~0.06) where the sum is near 0.
    """
    traced = isinstance(x, jax.core.Tracer)
    total = x[0] + (x[1] + x[2]) if traced else (x[0] + x[1]) + x[2]
    return jnp.stack([total, x[0]])


def test_jit_matches_eager_default_accepts_rounding_of_an_output_of_magnitude_1e6() -> None:
    n = 64
    x = np.stack([np.full(n, 1e6), np.full(n, -1e6), np.linspace(0.01, 0.3, n)]).astype(np.float32)
    got = np.asarray(jax.jit(_sum_reassociated_under_jit)(x))
    with jax.disable_jit():
        want = np.asarray(_sum_reassociated_under_jit(x))
    assert not np.array_equal(got, want)  # the example shows a rounding difference at all
    # The difference is float32 rounding at the leaf's magnitude, far below 1e-6 of it.
    assert np.max(np.abs(got - want)) <= 1e-6 * np.max(np.abs(want))
    checks.assert_jit_matches_eager(_sum_reassociated_under_jit, x)
    # An explicit atol is absolute, as before.
    with pytest.raises(AssertionError, match="differs from fn run op by op"):
        checks.assert_jit_matches_eager(_sum_reassociated_under_jit, x, atol=1e-6)


def test_batch_order_default_catches_a_wrong_order_at_magnitude_1e_8() -> None:
    x = np.random.default_rng(0).standard_normal((4, 3))

    def cumulative(batch: np.ndarray) -> np.ndarray:  # mixes samples: not equivariant
        return 1e-8 * np.cumsum(batch, axis=0)

    with pytest.raises(AssertionError, match=r"fn\(x\[perm\]\) != fn\(x\)\[perm\]"):
        checks.assert_batch_order_equivariant(cumulative, x)
    # An explicit atol is absolute: 1e-6 hides this function, as it did by default.
    checks.assert_batch_order_equivariant(cumulative, x, atol=1e-6)
