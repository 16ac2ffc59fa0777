"""Review tests: the checks' default tolerances follow the output's magnitude; the losses and
baselines against float64 closed forms, and the baselines refuse histories they cannot use."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from properties import checks
from tft_jax.baselines import seasonal_naive, seasonal_naive_with_drift
from tft_jax.losses import q_risk, quantile_loss

# properties.checks: default tolerances relative to the output's magnitude


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


# tft_jax.losses


def _pinball64(pred: np.ndarray, target: np.ndarray, levels: np.ndarray) -> np.ndarray:
    error = target[..., None].astype(np.float64) - pred.astype(np.float64)
    return np.maximum(levels * error, (levels - 1.0) * error)


def test_quantile_loss_with_unsorted_levels_equals_float64_numpy() -> None:
    rng = np.random.default_rng(3)
    levels = np.array([0.9, 0.02, 0.5, 0.25])
    pred = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    target = rng.standard_normal((2, 3, 5)).astype(np.float32)
    want = _pinball64(pred, target, levels).mean()
    np.testing.assert_allclose(float(quantile_loss(pred, target, levels)), want, rtol=1e-6)


def test_quantile_loss_gradient_is_the_pinball_slope_and_a_subgradient_at_zero_error() -> None:
    levels = (0.1, 0.9)
    target = jnp.zeros(3)
    pred = jnp.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    grad = np.asarray(jax.grad(lambda p: quantile_loss(p, target, levels))(pred))
    count = pred.size
    # d/dŷ of max(q e, (q - 1) e), e = y - ŷ: -q where e > 0, 1 - q where e < 0.
    np.testing.assert_allclose(grad[0, 0], -0.1 / count, rtol=1e-6)
    np.testing.assert_allclose(grad[1, 0], 0.9 / count, rtol=1e-6)
    np.testing.assert_allclose(grad[2, 1], 0.1 / count, rtol=1e-6)
    # At zero error any slope in [-q, 1 - q] is a subgradient; JAX's max splits the tie.
    for row, column, q in ((0, 1, 0.9), (1, 1, 0.9), (2, 0, 0.1)):
        assert -q / count - 1e-9 <= grad[row, column] <= (1.0 - q) / count + 1e-9


def test_q_risk_is_float32_under_x64_with_a_numpy_float64_level() -> None:
    rng = np.random.default_rng(4)
    pred = rng.standard_normal(6).astype(np.float32)
    target = rng.standard_normal(6).astype(np.float32)
    with jax.enable_x64(True):
        risk = q_risk(pred, target, np.float64(0.9))
    assert risk.dtype == jnp.float32
    want = 2.0 * _pinball64(pred[:, None], target, np.array([0.9])).sum() / np.abs(target).sum()
    np.testing.assert_allclose(float(risk), want, rtol=1e-6)


# tft_jax.baselines


def test_drift_at_a_history_shorter_than_two_seasons_is_the_mean_seasonal_difference() -> None:
    history = np.array([[1.0, 4.0, 2.0, 7.0, 3.0]])  # T = 5, m = 3: two seasonal differences
    period = 3
    differences = [history[0, t] - history[0, t - period] for t in range(period, 5)]
    drift = np.mean(differences)  # (7 - 1 + 3 - 4) / 2 = 2.5
    want = [history[0, 2 + h % period] + (h // period + 1) * drift for h in range(7)]
    np.testing.assert_allclose(seasonal_naive_with_drift(history, 7, period)[0], want)


def test_drift_refuses_a_nan_anywhere_in_the_history() -> None:
    # The first step is not copied, but the drift reads it: every forecast was NaN.
    history = np.array([[np.nan, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match=r"NaN/inf .* drift .*series 0, step 0"):
        seasonal_naive_with_drift(history, 2, 2)


def test_seasonal_naive_refuses_nan_only_where_it_copies() -> None:
    history = np.array([[np.nan, 1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(seasonal_naive(history, 3, 2), [[2.0, 3.0, 2.0]])
    history[0, 3] = np.inf
    with pytest.raises(ValueError, match=r"NaN/inf .*series 0, step 3"):
        seasonal_naive(history, 3, 2)


@pytest.mark.parametrize(
    "history",
    [np.array([[1 + 1j, 2 + 0j]]), np.array([["a", "b"]]), np.array([[1.0, None]], dtype=object)],
    ids=["complex", "strings", "object"],
)
@pytest.mark.parametrize("baseline", [seasonal_naive, seasonal_naive_with_drift])
def test_baselines_refuse_a_history_that_is_not_real_numbers(history, baseline) -> None:
    # Complex lost its imaginary part in the drift, strings and None were copied or
    # failed deep in NumPy.
    with pytest.raises(TypeError, match="history must hold real numbers"):
        baseline(history, 2, 1)
