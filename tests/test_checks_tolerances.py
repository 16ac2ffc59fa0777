"""The default tolerances of `properties.checks` follow the output's magnitude: a wrong
result at 1e-8 is caught, float32 rounding of an output at 1e6 is allowed, and an explicit
`atol` stays absolute. The default finite-difference step follows the dtype: float64's
passes a sharply curved function and still catches a derivative 0.1% off."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
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


def test_jit_matches_eager_allows_rounding_noise_in_a_leaf_that_is_zero_by_symmetry() -> None:
    # The gradient of a key bias is zero (softmax ignores a shift shared by a row), so it
    # holds rounding noise of the loss's scale, different under jit: a tolerance scaled by
    # that leaf alone failed a correct attention block.
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 16, 8)).astype(np.float32) for _ in range(3))

    def key_bias_gradient_and_loss(bias: jax.Array) -> tuple[jax.Array, jax.Array]:
        def loss(bias: jax.Array) -> jax.Array:
            logits = jnp.einsum("btd,bsd->bts", q, k + bias)
            return jnp.sum(jax.nn.softmax(logits, -1) @ v * v)

        return jax.grad(loss)(bias), loss(bias)

    bias = np.zeros(8, np.float32)
    compiled = np.asarray(jax.jit(key_bias_gradient_and_loss)(bias)[0])
    with jax.disable_jit():
        eager = np.asarray(key_bias_gradient_and_loss(bias)[0])
    assert not np.array_equal(compiled, eager) and np.abs(eager).max() < 1e-4
    checks.assert_jit_matches_eager(key_bias_gradient_and_loss, bias)


def test_batch_order_scales_its_default_atol_by_each_sample() -> None:
    # A bias that depends on the position in the batch (not equivariant) went unseen
    # once one sample was in units of 1e6: every sample got an absolute tolerance of 1.
    def positional(batch: jax.Array) -> jax.Array:
        return batch + 0.05 * jnp.arange(batch.shape[0], dtype=batch.dtype)[:, None]

    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    x[0] *= 1e6
    with pytest.raises(AssertionError, match=r"fn\(x\[perm\]\) != fn\(x\)\[perm\]"):
        checks.assert_batch_order_equivariant(positional, x)
    # Equivariant functions of such a batch pass.
    checks.assert_batch_order_equivariant(lambda batch: jnp.tanh(batch) * 3.0 + batch, x)


def test_clipping_is_compared_element_by_element_however_small_a_leaf() -> None:
    # The absolute tolerance rtol * ||updates|| (1e-5) left a bias gradient of 1e-7 per
    # element unchecked: clipping per leaf, or zeroing that leaf, passed.
    rng = np.random.default_rng(0)
    grads = {
        "w": rng.standard_normal((100, 100)).astype(np.float32),
        "b": np.full(100, 1e-7, np.float32),
    }
    clipped, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    checks.assert_clipped(clipped, 1.0, grads=grads)  # the reference passes
    per_leaf = {**clipped, "b": grads["b"]}  # the bias is inside the ball on its own
    with pytest.raises(AssertionError, match=r"\['b'\]: 100 of 100 elements differ"):
        checks.assert_clipped(per_leaf, 1.0, grads=grads)
    with pytest.raises(AssertionError, match=r"\['b'\]"):
        checks.assert_clipped({**clipped, "b": np.zeros(100, np.float32)}, 1.0, grads=grads)


def test_perturbations_stay_finite_in_float16() -> None:
    # Noise on float16 values of 3e4 overflowed to inf, and a correct causal running mean
    # written as a masked matmul read 0 * inf = NaN at its masked steps.
    def running_mean(x: jax.Array) -> jax.Array:
        steps = x.shape[1]
        weights = jnp.tril(jnp.ones((steps, steps), x.dtype)) / jnp.arange(1, steps + 1)[:, None]
        return jnp.einsum("ts,bsd->btd", weights.astype(x.dtype), x)

    x = np.full((2, 4, 3), 3e4, np.float16)
    checks.assert_causal(running_mean, x, check_gradients=False)


def _bfloat16_inside_under_jit(x: jax.Array) -> jax.Array:
    """`x` rounded through bfloat16 when traced, `x` itself op by op: float32 out either way.

    The two sides differ by bfloat16 rounding only, as those of a Flax module
    with `dtype=jnp.bfloat16, param_dtype=jnp.float32` do.
    """
    if isinstance(x, jax.core.Tracer):
        return x.astype(jnp.bfloat16).astype(jnp.float32)
    return x


def test_jit_matches_eager_takes_the_compute_dtype_of_a_mixed_precision_function() -> None:
    x = np.random.default_rng(0).standard_normal(33).astype(np.float32)
    rounded = x.astype(jnp.bfloat16).astype(np.float32)
    assert np.max(np.abs(rounded - x)) > 1e-3  # far beyond float32's tolerance
    with pytest.raises(AssertionError, match="differs from fn run op by op") as error:
        checks.assert_jit_matches_eager(_bfloat16_inside_under_jit, x)
    message = str(error.value)
    assert "follow the outputs' dtype, float32" in message
    assert "pass compute_dtype=jnp.bfloat16 (rtol 0.02, atol 0.02" in message
    checks.assert_jit_matches_eager(_bfloat16_inside_under_jit, x, compute_dtype=jnp.bfloat16)
    checks.assert_jit_matches_eager(_bfloat16_inside_under_jit, x, compute_dtype="bfloat16")
    # The compute dtype loosens the tolerance to bfloat16 rounding, not to any result.
    with pytest.raises(AssertionError, match="differs from fn run op by op") as error:
        checks.assert_jit_matches_eager(_doubled_under_jit, x, compute_dtype=jnp.bfloat16)
    assert "compute_dtype" not in str(error.value)  # it was given: no hint


@pytest.mark.parametrize("compute_dtype", [jnp.int32, "float8", 3])
def test_jit_matches_eager_refuses_a_compute_dtype_without_a_tolerance(compute_dtype) -> None:
    with pytest.raises(ValueError, match=r"compute_dtype must be one of float64, float32"):
        checks.assert_jit_matches_eager(
            jnp.sin, np.ones(3, np.float32), compute_dtype=compute_dtype
        )


def _sine_of(frequency: float, derivative_factor: float = 1.0) -> Any:
    """`sin(frequency * x)` whose derivative is `derivative_factor` times the right one."""

    @jax.custom_jvp
    def sine(x: jax.Array) -> jax.Array:
        return jnp.sin(frequency * x)

    @sine.defjvp
    def sine_jvp(primals: Any, tangents: Any) -> Any:
        (x,), (dx,) = primals, tangents
        slope = derivative_factor * frequency * jnp.cos(frequency * x)
        return jnp.sin(frequency * x), slope * dx

    return sine


def test_finite_differences_default_step_in_float64_passes_a_sharply_curved_function() -> None:
    # sin(100 x): its third derivative is 1e4 times its first, so central differences at
    # the float32 step 1e-4 err by eps**2 / 6 * 1e4 of the derivative, above float64's
    # tolerance of 1e-5: the old default failed this correct derivative (as it failed a
    # correct float64 TFT); the float64 default of 1e-6 leaves that term 1e4 times smaller.
    assert checks.FLOAT32_FINITE_DIFFERENCE_EPS == 1e-4  # the old default for every dtype
    x = np.linspace(-1.0, 1.0, 5)
    sharp = _sine_of(100.0)
    checks.assert_grads_match_finite_differences(sharp, (x,))
    # An explicit eps is used as given: the float32 step fails it, as it did by default.
    with pytest.raises(AssertionError, match=r"eps 0\.0001, in float64"):
        checks.assert_grads_match_finite_differences(sharp, (x,), eps=1e-4)


def test_finite_differences_default_step_in_float64_still_catches_a_derivative_off_by_0_1pc():
    x = np.linspace(-1.0, 1.0, 5)
    with pytest.raises(AssertionError, match=r"eps 1e-06, in float64") as error:
        checks.assert_grads_match_finite_differences(_sine_of(1.0, 1.001), (x,))
    found = re.search(r"Max relative difference among violations: ([0-9.e+-]+)", str(error.value))
    assert found is not None and float(found.group(1)) == pytest.approx(1e-3, rel=1e-2)
    # A derivative 20% off is plainly wrong, not float32 round-off over the step: no hint.
    with pytest.raises(AssertionError) as error:
        checks.assert_grads_match_finite_differences(_sine_of(1.0, 1.2), (x,))
    assert "casts to float32" not in str(error.value)


def test_finite_differences_keep_the_float32_step_for_a_function_returning_float32() -> None:
    # Float64 arguments, float32 result: the function computes at float32 precision,
    # where a step of 1e-6 would measure its round-off (1e-7 over 1e-6).
    def in_float32(x: jax.Array) -> jax.Array:
        return jnp.tanh(x.astype(jnp.float32))

    checks.assert_grads_match_finite_differences(in_float32, (np.linspace(-1.0, 1.0, 5),))


_NEARLY_CONSTANT_RNG = np.random.default_rng(0)
_NEARLY_CONSTANT_X = _NEARLY_CONSTANT_RNG.normal(size=(3, 4))
_NEARLY_CONSTANT_W = _NEARLY_CONSTANT_RNG.normal(size=(4, 6))


def _squared_layer_norm(x: jax.Array) -> jax.Array:
    """`sum(LayerNorm(tanh(x @ W))**2)`: 18 up to 1e-4 (the LayerNorm's 1e-6 in the variance),
    a nearly constant function of `x`, as a block ending in a LayerNorm squared is."""
    h = jnp.tanh(x @ _NEARLY_CONSTANT_W)
    centred = h - h.mean(-1, keepdims=True)
    normed = centred / jnp.sqrt((centred**2).mean(-1, keepdims=True) + 1e-6)
    return (normed**2).sum()


def test_finite_differences_pass_a_nearly_constant_function_at_order_2() -> None:
    # f ~ 18 with a gradient of ~2e-4: float64 round-off of the values (and of the gradient,
    # computed by cancellation through the LayerNorm) over the step of 1e-6 made a few small
    # entries of the JVP of the VJP differ by 1.5e-4 (relative) from the correct derivative.
    # At 10 times the step the round-off is 10x smaller and the check passes.
    x = _NEARLY_CONSTANT_X
    with pytest.raises(AssertionError, match="JVP of VJP tangent"):
        checks.assert_grads_match_finite_differences(
            _squared_layer_norm, (x,), order=2, eps=checks.FLOAT64_FINITE_DIFFERENCE_EPS
        )
    checks.assert_grads_match_finite_differences(_squared_layer_norm, (x,), order=2)


def test_finite_differences_at_order_2_catch_a_wrong_second_derivative_at_both_steps() -> None:
    # The first derivative is exactly cos (the added term is 0 in value), its derivative is
    # -sin + 1e-3: wrong by 1e-3 in the second derivative only, whatever the step.
    @jax.custom_jvp
    def sine(x: jax.Array) -> jax.Array:
        return jnp.sin(x)

    @sine.defjvp
    def sine_jvp(primals: Any, tangents: Any) -> Any:
        (x,), (dx,) = primals, tangents
        return jnp.sin(x), (jnp.cos(x) + 1e-3 * (x - jax.lax.stop_gradient(x))) * dx

    x = np.linspace(-1.0, 1.0, 5)
    checks.assert_grads_match_finite_differences(sine, (x,))
    with pytest.raises(AssertionError, match=r"eps 1e-06, in float64") as error:
        checks.assert_grads_match_finite_differences(sine, (x,), order=2)
    assert "and at 10 times the step, eps 1e-05" in str(error.value)


def _scaled_under_jit(factor: float):
    """`x` op by op, `x * factor` when traced: a compiled result off by `factor - 1`."""

    def fn(x: jax.Array) -> jax.Array:
        return x * (factor if isinstance(x, jax.core.Tracer) else 1.0)

    return fn


# Mutant N1 (numerics.py:53, float32 default `(1e-5, 1e-6)` -> `(1e-3, 1e-6)`): the
# documented float32 default is rtol 1e-5, atol 1e-6 times the output's scale.
def test_jit_matches_eager_float32_default_rtol_is_1e_5() -> None:
    x = np.linspace(1.0, 2.0, 8, dtype=np.float32)
    with pytest.raises(AssertionError, match="differs from fn run op by op"):
        checks.assert_jit_matches_eager(_scaled_under_jit(1.0 + 1e-4), x)  # 1e-4 relative
    checks.assert_jit_matches_eager(_scaled_under_jit(1.0 + 4e-6), x)  # within 1e-5 + 1e-6


# Mutant N2 (numerics.py:176, the compute_dtype floor takes `min(rtol, floor_rtol)`):
# with compute_dtype=bfloat16 every default tolerance must be at least bfloat16's
# (rtol 2e-2, atol 2e-2 x scale), so a float32 output 3% off at the output's scale
# passes (3e-2 <= 2e-2 + 2e-2) while 5% does not; with rtol floored to float32's 1e-5
# the 3% one failed.
def test_jit_matches_eager_compute_dtype_floors_rtol_as_well_as_atol() -> None:
    x = np.ones(8, np.float32)
    checks.assert_jit_matches_eager(_scaled_under_jit(1.03), x, compute_dtype=jnp.bfloat16)
    with pytest.raises(AssertionError, match="differs from fn run op by op"):
        checks.assert_jit_matches_eager(_scaled_under_jit(1.05), x, compute_dtype=jnp.bfloat16)


# Mutant N5 (numerics.py:123, `fn if hasattr(fn, "lower") else jax.jit(fn)` -> always
# `jax.jit(fn)`): a function already jitted with a static argument is the compiled side as
# is; wrapped again, its static argument became a tracer and the check failed to trace it.
def test_jit_matches_eager_uses_an_already_jitted_function_with_its_static_arguments() -> None:
    first = jax.jit(lambda x, n: x[:n] * 2.0, static_argnums=1)
    x = np.arange(6, dtype=np.float32)
    checks.assert_jit_matches_eager(first, x, 3)
    assert first._cache_size() == 1  # the given function itself compiled, once


# Mutant N9 (numerics.py:447, `order < 1` -> `order < 0`): order 0 (no derivative at all:
# nothing checked) must be refused like any order below 1.
@pytest.mark.parametrize("order", [0, -1])
def test_finite_differences_refuse_an_order_below_one(order) -> None:
    with pytest.raises(ValueError, match=r"order must be an int >= 1, got " + str(order)):
        checks.assert_grads_match_finite_differences(jnp.sin, (np.ones(2),), order=order)


# Mutant N10 (numerics.py:345, `wide = all(...)` -> `any(...)`): a function that returns
# float32 for its float64 arguments computes at float32 precision and must be differenced
# at float32's step (1e-4, documented); at float64's 1e-6 float32 round-off of a value ~3
# (3 * 6e-8 / 2e-6 ~ 0.1 of a slope ~0.1) failed this correct function.
def test_finite_differences_take_float32_step_for_a_function_returning_float32() -> None:
    def fn(x: jax.Array) -> jax.Array:
        return (3.0 + 0.1 * jnp.sin(x)).astype(jnp.float32)

    checks.assert_grads_match_finite_differences(fn, (np.linspace(0.1, 1.0, 4),))


# Mutant N15 (numerics.py:600, the divisor's clamp `max(floor(log2 s), -60)` -> `min(...)`:
# every leaf with slopes below 1 divided by 2**-60): a leaf of slope ~1e-3 is divided by a
# power of two near 1e-3, not blown up by 2**60, where float64 round-off of a nearly constant
# element (cos^2 + sin^2 + e^x e^-x, derivative ~0) swamped the tolerance and failed a correct fn.
def test_finite_differences_pass_a_small_leaf_holding_a_nearly_constant_element() -> None:
    def fn(x: jax.Array) -> jax.Array:
        flat = jnp.cos(x[1:]) ** 2 + jnp.sin(x[1:]) ** 2 + jnp.exp(x[1:]) * jnp.exp(-x[1:])
        return 1e-3 * jnp.concatenate([jnp.sin(x[:1]), flat])

    point = (np.linspace(0.3, 2.9, 16),)
    checks.assert_grads_match_finite_differences(fn, point)
    # ... while a wrong derivative of such a small function is still caught (the division's
    # purpose): the derivative of 1e-3 sin replaced by 0.
    wrong = jax.custom_jvp(fn)
    wrong.defjvp(lambda primals, tangents: (fn(*primals), jnp.zeros(16)))
    with pytest.raises(AssertionError, match="differ from central finite differences"):
        checks.assert_grads_match_finite_differences(wrong, point, modes=("fwd",))


# Mutant N18 (numerics.py:330, `if not any(prod(shape))` -> `if not all(...)`): only an
# output with no element at all is refused; an empty leaf beside a non-empty one is fine.
def test_finite_differences_accept_an_empty_output_leaf_beside_a_non_empty_one() -> None:
    checks.assert_grads_match_finite_differences(
        lambda x: (jnp.sin(x), x[:0] * 2.0), (np.linspace(0.1, 1.0, 4),)
    )
    with pytest.raises(ValueError, match="fn must return at least one non-empty array"):
        checks.assert_grads_match_finite_differences(lambda x: x[:0] * 2.0, (np.ones(3),))
