"""`properties.checks` catch bugs their perturbations could miss.

A permutation that leaves a sample in place, noise that never sets a value to
zero, and `check_grads`' absolute tolerance each let a broken function pass;
each test shows the check failing on the broken function and passing on a correct one.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from properties import checks

from .causal_functions import cumsum

X = np.random.default_rng(0).standard_normal((3, 5, 4)).astype(np.float32)  # (B, T, D)


# assert_batch_order_equivariant: one random permutation fixed a sample


@jax.jit
def last_sample_as_padding(x: jax.Array) -> jax.Array:
    """Treats the last sample of the batch as padding: its output is 0 wherever it came from."""
    return jnp.tanh(x).at[-1].set(0.0)


@pytest.mark.parametrize("batch", [4, 8])
def test_batch_order_catches_a_function_that_treats_the_last_sample_differently(batch):
    # Seed 0's permutation of 4 (and of 8) samples fixes the last one: a function that
    # zeroes the last sample passed, since it is batch independent and that sample
    # never moved. The cyclic shift and the swap generate every permutation.
    x = np.random.default_rng(1).standard_normal((batch, 3)).astype(np.float32)
    checks.assert_batch_order_equivariant(jax.jit(jnp.tanh), x)
    checks.assert_batch_independent(last_sample_as_padding, x)  # not a mixing bug
    with pytest.raises(AssertionError, match=r"fn\(x\[perm\]\) != fn\(x\)\[perm\]"):
        checks.assert_batch_order_equivariant(last_sample_as_padding, x)


# assert_causal and assert_batch_independent: noise never makes a value zero


@jax.jit
def mean_over_unpadded_window(x: jax.Array) -> jax.Array:
    """Running sum / the number of nonzero (unpadded) steps of the WHOLE window: a leak."""
    valid = jnp.any(x != 0, axis=-1, keepdims=True).astype(x.dtype)
    return jnp.cumsum(x, axis=1) / jnp.sum(valid, axis=1, keepdims=True)


@jax.jit
def mean_over_unpadded_steps_so_far(x: jax.Array) -> jax.Array:
    """Running sum / the number of nonzero steps up to `t`: causal."""
    valid = jnp.any(x != 0, axis=-1, keepdims=True).astype(x.dtype)
    return jnp.cumsum(x, axis=1) / jnp.maximum(jnp.cumsum(valid, axis=1), 1.0)


def test_causal_catches_a_padding_count_taken_over_the_whole_window():
    # The later steps were only ever replaced by noisy copies, never by zeros: a count
    # of nonzero steps over the window did not change, and the leak passed.
    checks.assert_causal(mean_over_unpadded_steps_so_far, X)
    checks.assert_causal(cumsum, X)
    with pytest.raises(AssertionError, match=r"t=0, .*\(later inputs set to 0\)"):
        checks.assert_causal(mean_over_unpadded_window, X, check_gradients=False)


@jax.jit
def divided_by_real_samples(x: jax.Array) -> jax.Array:
    """Each sample divided by the number of nonzero (unpadded) samples in the batch."""
    real = jnp.sum(jnp.any(x != 0, axis=tuple(range(1, x.ndim))))
    return x / real


def test_batch_independent_catches_a_count_of_nonzero_samples():
    checks.assert_batch_independent(jax.jit(jnp.tanh), X)
    with pytest.raises(AssertionError, match=r"\[sample 0\] changed \(other samples set to 0\)"):
        checks.assert_batch_independent(divided_by_real_samples, X)


# assert_grads_match_finite_differences: check_grads' absolute tolerance


def _sine_with_derivative(factor: float) -> Any:
    """`sin` whose derivative is `factor * cos` (1.0: correct)."""

    @jax.custom_jvp
    def sine(a: jax.Array) -> jax.Array:
        return jnp.sin(a)

    @sine.defjvp
    def sine_jvp(primals: Any, tangents: Any) -> Any:
        (a,), (da,) = primals, tangents
        return jnp.sin(a), factor * jnp.cos(a) * da

    return sine


@pytest.mark.parametrize(
    ("scale", "factor"), [(1e-4, 1.01), (1e-7, 1.01), (1e-7, 0.0), (1e-7, -1.0)]
)
def test_finite_differences_catch_a_wrong_gradient_of_a_small_function(scale, factor):
    # check_grads' default tolerance is 1e-5 absolute as well as relative: a function
    # with derivatives of 1e-7 passed with a zero or negated gradient, and one of 1e-4
    # with a gradient 1% off.
    x = np.random.default_rng(0).standard_normal(4).astype(np.float32)
    wrong = _sine_with_derivative(factor)
    with pytest.raises(AssertionError, match="differ from central finite differences") as error:
        checks.assert_grads_match_finite_differences(lambda a: scale * wrong(a), (x,))
    assert "divided by its derivative's scale" in str(error.value)


@pytest.mark.parametrize("scale", [1e3, 1e-4, 1e-7, 1e-25])
def test_finite_differences_pass_correct_gradients_at_every_scale(scale):
    x, y = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    right = _sine_with_derivative(1.0)
    checks.assert_grads_match_finite_differences(lambda a, b: scale * right(a) * b, (x, y))
    checks.assert_grads_match_finite_differences(
        lambda a: {"small": scale * jnp.tanh(a) ** 2, "large": jnp.cosh(a)}, (x,), order=2
    )
    checks.assert_grads_match_finite_differences(
        lambda a: scale * jnp.tanh(a) ** 2, (x,), use_x64=False
    )


def test_finite_differences_leave_an_explicit_atol_in_the_function_units():
    # An explicit atol is the user's: nothing is rescaled (a zero gradient of 1e-7-sized
    # derivatives passes atol=1e-5, as asked).
    x = np.random.default_rng(0).standard_normal(4).astype(np.float32)
    zero = _sine_with_derivative(0.0)
    checks.assert_grads_match_finite_differences(lambda a: 1e-7 * zero(a), (x,), atol=1e-5)
