"""Every check in `properties.checks` passes on a correct function and fails on a wrong one."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from properties import checks
from qat import fake_quantize
from tft_jax import TemporalSelfAttention

from .causal_functions import cumsum, reverse_cumsum

_RNG = np.random.default_rng(0)
_X = _RNG.standard_normal((3, 5, 4)).astype(np.float32)  # (B, T, D)
_W = _RNG.standard_normal((4, 4)).astype(np.float32)


# Functions under test: built once, jitted at module level, tiny shapes.


def _masked_attention(x, shift):
    """Self-attention whose step t sees steps <= t + shift (shift 0: causal)."""
    steps = x.shape[1]
    allowed = jnp.arange(steps)[None, :] <= jnp.arange(steps)[:, None] + shift
    logits = jnp.einsum("btd,bsd->bts", x, x)
    logits = jnp.where(allowed, logits, -jnp.inf)
    return jnp.einsum("bts,bsd->btd", jax.nn.softmax(logits, axis=-1), x)


_causal_attention = jax.jit(lambda x: _masked_attention(x, 0))
_leaky_attention = jax.jit(lambda x: _masked_attention(x, 1))


@jax.jit
def _per_sample(x):
    return jnp.tanh(x @ _W)


@jax.jit
def _batch_centered(x):
    """Subtracts the batch mean: every sample's output depends on the others."""
    return x - x.mean(axis=0, keepdims=True)


@jax.jit
def _backward_mixing(x):
    """Forward is exactly per sample; the gradient flows into every sample through the mean."""
    mean = x.mean(axis=0, keepdims=True)
    return jnp.tanh(x @ _W) + (mean - jax.lax.stop_gradient(mean))


@jax.jit
def _embedded(inputs):
    """A pytree input with an integer leaf: `values * table[ids]` per sample."""
    values, ids = inputs
    table = jnp.arange(1.0, 6.0)
    return values * table[ids][:, None]


def _loss(params, x):
    hidden = jnp.tanh(x @ params["w"] + params["b"])
    return jnp.sum(hidden**2)


def _loss_with_dead_bias(params, x):
    hidden = jnp.tanh(x @ params["w"] + jax.lax.stop_gradient(params["b"]))
    return jnp.sum(hidden**2)


_PARAMS = {"w": _W, "b": _RNG.standard_normal(4).astype(np.float32)}
_grads = jax.jit(jax.grad(_loss))
_dead_grads = jax.jit(jax.grad(_loss_with_dead_bias))


@jax.custom_vjp
def _fake_quantize(x, scale, zero_point, qmin, qmax):
    """Reference fake quantizer: forward of PyTorch, clipped STE backward."""
    codes = jnp.clip(jnp.round(x / scale) + zero_point, qmin, qmax)
    return (codes - zero_point) * scale


def _fake_quantize_fwd(x, scale, zero_point, qmin, qmax):
    codes = jnp.round(x / scale) + zero_point
    inside = (codes >= qmin) & (codes <= qmax)
    return _fake_quantize(x, scale, zero_point, qmin, qmax), inside


def _fake_quantize_bwd(inside, g):
    return (jnp.where(inside, g, 0.0), None, None, None, None)


_fake_quantize.defvjp(_fake_quantize_fwd, _fake_quantize_bwd)


@jax.custom_vjp
def _strict_ste(x, scale, zero_point, qmin, qmax):
    """Fake quantizer whose STE mask excludes the bounds (`>` for `>=`, pytorch/ao PR #4806)."""
    return _fake_quantize(x, scale, zero_point, qmin, qmax)


def _strict_ste_fwd(x, scale, zero_point, qmin, qmax):
    codes = jnp.round(x / scale) + zero_point
    return _strict_ste(x, scale, zero_point, qmin, qmax), (codes > qmin) & (codes < qmax)


_strict_ste.defvjp(_strict_ste_fwd, _fake_quantize_bwd)


def _clip_ste(x, scale, zero_point, qmin, qmax):
    """STE through `jnp.clip`: its gradient at exactly a bound is 0.5."""
    units = x / scale
    rounded = units + jax.lax.stop_gradient(jnp.round(units) - units)
    return (jnp.clip(rounded + zero_point, qmin, qmax) - zero_point) * scale


def _floor_quantize(x, scale, zero_point, qmin, qmax):
    """Truncates instead of rounding: error up to a whole step."""
    return (jnp.clip(jnp.floor(x / scale) + zero_point, qmin, qmax) - zero_point) * scale


def _unclipped_quantize(x, scale, zero_point, qmin, qmax):
    """Rounds but never saturates."""
    del qmin, qmax
    return jnp.round(x / scale) * scale + 0 * zero_point


_SCALE, _ZERO_POINT, _QMIN, _QMAX = np.float32(0.5), 0, -8, 7
# Every grid point (the bounds included), ties, and values beyond both ends.
_GRID_X = (np.arange(-12.0, 12.0, 0.5) * _SCALE).astype(np.float32)


# assert_finite


def test_finite_passes_on_finite_tree_with_integer_leaves():
    checks.assert_finite({"a": np.ones(3, np.float32), "b": (np.arange(4), 2.0)})


def test_finite_names_every_non_finite_leaf():
    tree = {"ok": np.ones(2), "bad": {"nan": np.array([1.0, np.nan]), "inf": np.array([np.inf])}}
    with pytest.raises(AssertionError) as error:
        checks.assert_finite(tree, name="grads")
    message = str(error.value)
    assert "['bad']['nan']: 1 NaN, 0 inf" in message
    assert "['bad']['inf']: 0 NaN, 1 inf" in message
    assert "['ok']" not in message


def test_finite_detects_nan_in_bfloat16_leaf():
    leaf = np.array([1.0, np.nan], np.float32).astype(jnp.bfloat16)
    with pytest.raises(AssertionError, match="1 NaN"):
        checks.assert_finite([leaf])


def test_typed_prng_keys_are_integer_leaves_and_refused_as_batch_inputs():
    # A train state holding a jax.random.key: NumPy cannot hold the key, and the
    # checks used to crash on it instead of checking the float leaves.
    state = {"rng": jax.random.key(0), "w": np.array([1.0, np.nan], np.float32)}
    with pytest.raises(AssertionError, match=r"\['w'\]: 1 NaN") as error:
        checks.assert_finite(state)
    assert "rng" not in str(error.value)
    checks.assert_finite({"rng": state["rng"], "w": np.ones(2, np.float32)})
    with pytest.raises(TypeError, match=r"x\[1\] is a PRNG key array"):
        checks.assert_batch_independent(
            lambda inputs: inputs[0], (np.ones((2, 3), np.float32), jax.random.split(state["rng"]))
        )


# assert_nonzero_grads


def test_nonzero_grads_passes_when_every_parameter_learns():
    checks.assert_nonzero_grads(_grads(_PARAMS, _X[0]), min_norm=1e-6)


def test_nonzero_grads_reports_stop_gradient_leaf_by_path():
    with pytest.raises(AssertionError) as error:
        checks.assert_nonzero_grads(_dead_grads(_PARAMS, _X[0]), min_norm=1e-6)
    message = str(error.value)
    assert "1 of 2 leaves" in message
    assert "['b']: norm 0" in message
    assert "['w']" not in message


def test_nonzero_grads_treats_nan_norm_as_dead_and_rejects_negative_min_norm():
    with pytest.raises(AssertionError, match="norm nan"):
        checks.assert_nonzero_grads({"w": np.array([np.nan, 1.0])})
    with pytest.raises(ValueError, match="min_norm"):
        checks.assert_nonzero_grads({"w": np.ones(2)}, min_norm=-1.0)


def test_nonzero_grads_default_min_norm_reports_an_exactly_zero_gradient():
    # Dead means a norm <= min_norm: with the default 0 an all-zero leaf is dead.
    grads = {"w": np.ones(3), "b": np.zeros(2)}
    assert float(np.linalg.norm(grads["b"])) == 0.0
    with pytest.raises(AssertionError, match=r"\['b'\]: norm 0"):
        checks.assert_nonzero_grads(grads)
    # At a threshold equal to a leaf's norm (|3| = 3 with min_norm=3) the leaf is dead too.
    with pytest.raises(AssertionError, match=r"\['w'\]"):
        checks.assert_nonzero_grads({"w": np.array([3.0, 0.0])}, min_norm=3.0)


def test_nonzero_grads_per_element_treats_an_infinite_element_as_dead():
    # |inf| exceeds every threshold, yet an infinite gradient is not a live one.
    with pytest.raises(AssertionError, match=r"1 of 3 elements dead at \(1,\)|1 of 3 elements"):
        checks.assert_nonzero_grads({"w": np.array([1.0, np.inf, 2.0])}, per_element=True)


def test_nonzero_grads_min_relative_catches_a_gradient_that_is_rounding_noise():
    # The key bias shifts every attention logit of a row alike, which the softmax
    # ignores: its gradient is zero in exact arithmetic and rounding noise in float32,
    # which passes min_norm=0 (whether per_element passes depends on the rounding).
    block = TemporalSelfAttention(hidden_dim=8, num_heads=2)
    x = jax.random.normal(jax.random.key(0), (3, 5, 8))
    params = block.init(jax.random.key(1), x, causal=True, deterministic=True)["params"]

    def loss(params):
        return jnp.sum(jnp.sin(block.apply({"params": params}, x, causal=True, deterministic=True)))

    grads = jax.grad(loss)(params)
    checks.assert_nonzero_grads(grads)
    with pytest.raises(AssertionError, match=r"0\.0001 of the largest norm") as error:
        checks.assert_nonzero_grads(grads, min_relative=1e-4)
    assert str(error.value).splitlines()[1:] == [
        f"  ['key']['bias']: norm {float(jnp.linalg.norm(grads['key']['bias'])):.3g}"
    ]
    # Elements: the largest |g| of the tree is the bar's scale.
    tree = {"w": np.array([1.0, -4.0, 3e-5]), "b": np.array([2e-4])}
    with pytest.raises(
        AssertionError, match=r"\['w'\] \(shape \(3,\)\): 1 of 3 elements dead at \[2\]"
    ):
        checks.assert_nonzero_grads(tree, per_element=True, min_relative=2.5e-5)
    checks.assert_nonzero_grads(tree, per_element=True, min_relative=1e-6)
    for bad in (-0.1, 1.0, math.nan):
        with pytest.raises(ValueError, match="min_relative"):
            checks.assert_nonzero_grads(tree, min_relative=bad)


def test_nonzero_grads_and_finite_skip_the_float0_gradient_of_an_integer_input():
    # jax.grad(..., allow_int=True) gives integer leaves a float0 gradient,
    # which the checks skip like integer leaves instead of refusing the tree.
    params = {"w": np.ones(3, np.float32), "steps": np.arange(3)}
    grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2 * p["steps"]), allow_int=True)(params)
    assert grads["steps"].dtype == jax.dtypes.float0
    checks.assert_finite(grads)
    with pytest.raises(AssertionError, match=r"\['w'\] \(shape \(3,\)\): 1 of 3 elements dead"):
        checks.assert_nonzero_grads(grads, per_element=True)


# assert_causal


def test_causal_passes_on_cumsum_and_masked_attention_exactly():
    checks.assert_causal(cumsum, _X)
    checks.assert_causal(_causal_attention, _X)


def test_causal_catches_reverse_cumsum():
    with pytest.raises(AssertionError, match="not causal along axis 1") as error:
        checks.assert_causal(reverse_cumsum, _X)
    assert "t=0" in str(error.value)


def test_causal_catches_mask_shifted_by_one_step():
    with pytest.raises(AssertionError, match="not causal"):
        checks.assert_causal(_leaky_attention, _X, max_positions=2)


def test_causal_catches_a_leak_from_exactly_one_step_ahead_in_the_forward_pass():
    # y[t] reads x[t + 1]: perturbing from t + 1 on shows it; from t + 2 on it would not.
    def one_step_ahead(x):
        return jnp.cumsum(x, axis=1) + 0.5 * jnp.roll(x, -1, axis=1)

    with pytest.raises(AssertionError, match="not causal along axis 1") as error:
        checks.assert_causal(one_step_ahead, _X, check_gradients=False)
    assert "t=0" in str(error.value)


def test_causal_rejects_output_of_other_length():
    with pytest.raises(ValueError, match="expected the input length 5"):
        checks.assert_causal(lambda x: x[:, :2], _X)


# assert_batch_independent and assert_batch_order_equivariant


def test_batch_independent_passes_on_per_sample_function_and_pytree_with_integers():
    checks.assert_batch_independent(_per_sample, _X)
    ids = np.array([0, 4, 2], np.int32)
    checks.assert_batch_independent(_embedded, (_X[:, 0], ids))


def test_batch_independent_catches_batch_mean_in_forward():
    with pytest.raises(AssertionError, match="mixes samples") as error:
        checks.assert_batch_independent(_batch_centered, _X, check_gradients=False)
    assert "[sample 0] changed" in str(error.value)


def test_batch_independent_catches_gradient_that_mixes_samples_behind_exact_forward():
    checks.assert_batch_independent(_backward_mixing, _X, check_gradients=False)
    with pytest.raises(AssertionError, match="gradient of outputs\\[sample 0\\]"):
        checks.assert_batch_independent(_backward_mixing, _X)


def test_batch_order_equivariance_holds_per_sample_and_fails_for_order_dependent_fn():
    checks.assert_batch_order_equivariant(_per_sample, _X)
    with pytest.raises(AssertionError, match="fn\\(x\\[perm\\]\\) != fn\\(x\\)\\[perm\\]"):
        checks.assert_batch_order_equivariant(lambda x: jnp.cumsum(x, axis=0), _X)


# assert_jit_matches_eager


def test_jit_matches_eager_on_jitted_and_plain_functions():
    checks.assert_jit_matches_eager(_causal_attention, _X)
    checks.assert_jit_matches_eager(lambda w, x: {"y": jnp.tanh(x @ w)}, _W, _X)


def test_jit_matches_eager_catches_trace_dependent_branch():
    def traced_differently(x):
        return x * 2.0 if isinstance(x, jax.core.Tracer) else x

    with pytest.raises(AssertionError, match="jit\\(fn\\) differs"):
        checks.assert_jit_matches_eager(traced_differently, _X[0])


# assert_grads_match_finite_differences


def test_grads_match_finite_differences_in_float64_and_float32_fallback():
    x, y = _X[0, 0], _X[1, 0]
    checks.assert_grads_match_finite_differences(lambda a, b: jnp.sin(a) * b, (x, y), order=2)
    checks.assert_grads_match_finite_differences(lambda a: jnp.tanh(a) ** 2, (x,), use_x64=False)
    assert jnp.asarray(1.0).dtype == jnp.float32  # 64-bit mode does not leak out


def test_grads_match_finite_differences_catches_wrong_custom_derivative():
    @jax.custom_jvp
    def sine(a):
        return jnp.sin(a)

    @sine.defjvp
    def sine_jvp(primals, tangents):
        (a,), (da,) = primals, tangents
        return jnp.sin(a), jnp.sin(a) * da  # should be cos(a)

    with pytest.raises(AssertionError, match="differ from central finite differences"):
        checks.assert_grads_match_finite_differences(sine, (_X[0, 0],))


# assert_ste_gradient


def test_ste_gradient_passes_on_clipped_straight_through_estimator():
    checks.assert_ste_gradient(_fake_quantize, _GRID_X, _SCALE, _ZERO_POINT, _QMIN, _QMAX)
    affine_x = (np.arange(-4.0, 20.0, 0.5) * 0.25).astype(np.float32)
    checks.assert_ste_gradient(_fake_quantize, affine_x, np.float32(0.25), 3, 0, 15)


def test_ste_gradient_catches_jnp_clip_half_gradient_at_bounds():
    with pytest.raises(AssertionError) as error:
        checks.assert_ste_gradient(_clip_ste, _GRID_X, _SCALE, _ZERO_POINT, _QMIN, _QMAX)
    message = str(error.value)
    assert "0 inside the grid, 4 at qmin or qmax, 0 outside the grid" in message  # ties included
    assert "gradient / g = 0.5" in message


def test_ste_gradient_catches_mask_that_excludes_bounds():
    with pytest.raises(AssertionError, match="0 inside the grid, 4 at qmin or qmax"):
        checks.assert_ste_gradient(_strict_ste, _GRID_X, _SCALE, _ZERO_POINT, _QMIN, _QMAX)


def test_ste_gradient_accepts_either_side_only_where_xla_rounds_a_tie_differently():
    # x / s is exactly 7.5 in IEEE division (code 8, outside) but XLA computes
    # x * (1 / s) = 7.4999995 (code 7, inside); 8 * s is outside either way.
    scale = np.float32(3.03287)
    x = np.array([7.5 * scale, 7 * scale, 8 * scale], np.float32)
    checks.assert_ste_gradient(_fake_quantize, x, scale, 0, -8, 7)

    def unmasked(x, scale, zero_point, qmin, qmax):
        return x + jax.lax.stop_gradient(_fake_quantize(x, scale, zero_point, qmin, qmax) - x)

    with pytest.raises(AssertionError, match="1 outside the grid"):
        checks.assert_ste_gradient(unmasked, x, scale, 0, -8, 7)


def test_ste_gradient_of_a_float16_input_uses_the_scale_as_given_not_cast_to_float16():
    # x / s = 1.49999 with the float32 scale: code 1 + 2 = 3, inside [0, 3], gradient g
    # (qat.fake_quantize computes in float32); with the scale cast to float16 the
    # quotient rounds to 1.5, code 4, and the check used to demand a zero gradient.
    scale = np.float32(13.593851)
    x = np.array([20.390625, 0.0, 200.0], np.float16)
    checks.assert_ste_gradient(fake_quantize, x, scale, 2, 0, 3)

    def unmasked(x, scale, zero_point, qmin, qmax):
        quantized = fake_quantize(x, scale, zero_point, qmin, qmax)
        return x + jax.lax.stop_gradient(quantized - x)

    with pytest.raises(AssertionError, match="0 inside the grid, 0 at qmin or qmax, 1 outside"):
        checks.assert_ste_gradient(unmasked, x, scale, 2, 0, 3)


def test_ste_gradient_of_a_quantizer_returning_a_wider_dtype_than_x():
    # A float16 x quantized in float32 (output float32): the gradient is the float32
    # upstream cast back to float16, which used to differ from it bit for bit.
    x = (np.arange(-12, 12) * 0.5).astype(np.float16)

    def in_float32(x, scale, zero_point, qmin, qmax):
        return fake_quantize(x.astype(jnp.float32), scale, zero_point, qmin, qmax)

    checks.assert_ste_gradient(in_float32, x, np.float32(0.5), 0, -8, 7)

    def unmasked(x, scale, zero_point, qmin, qmax):
        wide = x.astype(jnp.float32)
        return wide + jax.lax.stop_gradient(in_float32(x, scale, zero_point, qmin, qmax) - wide)

    with pytest.raises(AssertionError, match="0 inside the grid, 0 at qmin or qmax, 8 outside"):
        checks.assert_ste_gradient(unmasked, x, np.float32(0.5), 0, -8, 7)


def _code_space_ste(x, scale, zero_point, qmin, qmax, inclusive=True):
    """A correct clipped STE applied to the codes `x / scale`: its gradient is `(g / s) * s`."""
    codes = x / scale + zero_point
    rounded = jnp.round(codes)
    inside = (
        (rounded >= qmin) & (rounded <= qmax)
        if inclusive
        else ((rounded > qmin) & (rounded < qmax))
    )
    straight = codes + jax.lax.stop_gradient(rounded - codes)
    saturated = jax.lax.stop_gradient(jnp.clip(rounded, qmin, qmax))
    return (jnp.where(inside, straight, saturated) - zero_point) * scale


_CODE_SPACE_X = (np.random.default_rng(0).standard_normal(64) * 5).astype(np.float32)
_CODE_SPACE_SCALE = np.float32(0.1)


def test_ste_gradient_accepts_a_code_space_ste_whose_gradient_is_an_ulp_off_g():
    upstream = np.random.default_rng(1).uniform(0.5, 1.5, 64).astype(np.float32)
    _, pullback = jax.vjp(
        lambda v: _code_space_ste(v, _CODE_SPACE_SCALE, 0, -128, 127), _CODE_SPACE_X
    )
    (gradient,) = pullback(upstream)
    difference = np.abs(np.asarray(gradient, np.float64) - upstream)
    assert np.any(difference > 0)  # (g / s) * s is not g bit for bit
    assert np.all(difference <= 2 * np.spacing(upstream))  # but within two ulps of it
    checks.assert_ste_gradient(_code_space_ste, _CODE_SPACE_X, _CODE_SPACE_SCALE, 0, -128, 127)
    grid = np.concatenate([_CODE_SPACE_X, np.float32([-12.8, 12.7, -13.0, 13.0])])
    with pytest.raises(AssertionError, match=r"0 inside the grid, 2 at qmin or qmax"):
        checks.assert_ste_gradient(
            lambda *a: _code_space_ste(*a, inclusive=False), grid, _CODE_SPACE_SCALE, 0, -128, 127
        )


def test_ste_gradient_fails_a_gradient_beyond_its_ulps_and_prints_the_difference():
    # 16 ulps off g is no rounding of an STE: caught, and printed with the digits
    # that show it (".6g" printed "gradient / g = 1, expected 1").
    @jax.custom_vjp
    def almost(x, scale, zero_point, qmin, qmax):
        return _fake_quantize(x, scale, zero_point, qmin, qmax)

    def almost_fwd(x, scale, zero_point, qmin, qmax):
        codes = jnp.round(x / scale) + zero_point
        inside = (codes >= qmin) & (codes <= qmax)
        return _fake_quantize(x, scale, zero_point, qmin, qmax), inside

    def almost_bwd(inside, g):
        return (jnp.where(inside, g * np.float32(1 + 16 * 2.0**-23), 0.0), None, None, None, None)

    almost.defvjp(almost_fwd, almost_bwd)
    x = np.float32([1.0, 5.0])
    with pytest.raises(AssertionError, match=r"beyond 4 ulps of float32") as error:
        checks.assert_ste_gradient(almost, x, _SCALE, _ZERO_POINT, _QMIN, _QMAX)
    assert re.search(r"gradient / g = 1\.00000[12]\d*, expected 1", str(error.value))


# assert_quantization_error_bounded


def test_quantization_error_bounded_for_round_to_nearest_with_saturation():
    x = np.concatenate([_GRID_X, _RNG.uniform(-6, 6, 64).astype(np.float32)])
    checks.assert_quantization_error_bounded(_fake_quantize, x, _SCALE, _ZERO_POINT, _QMIN, _QMAX)


def test_quantization_error_bound_catches_floor_and_missing_saturation():
    x = np.array([0.3, 0.7, -0.7, 3.4], np.float32)  # inside [-4, 3.5]
    with pytest.raises(AssertionError, match="inside the range"):
        checks.assert_quantization_error_bounded(_floor_quantize, x, _SCALE, 0, _QMIN, _QMAX)
    beyond = np.array([10.0, -10.0], np.float32)
    with pytest.raises(AssertionError, match="outside the range"):
        checks.assert_quantization_error_bounded(_unclipped_quantize, beyond, _SCALE, 0, -8, 7)


# assert_rounds_to_grid


def _clip_only(x, scale, zero_point, qmin, qmax):
    """Clips to the range without rounding: error 0 inside, so the error bound holds."""
    return jnp.clip(x, (qmin - zero_point) * scale, (qmax - zero_point) * scale)


def _ties_away(x, scale, zero_point, qmin, qmax):
    """Rounds ties away from zero (C's round): within half a step, as the bound asks."""
    ratio = x / scale
    codes = jnp.sign(ratio) * jnp.floor(jnp.abs(ratio) + 0.5) + zero_point
    return (jnp.clip(codes, qmin, qmax) - zero_point) * scale


def test_rounds_to_grid_passes_the_project_quantizer_and_the_reference_in_every_dtype():
    for dtype in (np.float32, np.float16, jnp.bfloat16):
        x = _GRID_X.astype(dtype)
        checks.assert_rounds_to_grid(fake_quantize, x, _SCALE, _ZERO_POINT, _QMIN, _QMAX)
    checks.assert_rounds_to_grid(_fake_quantize, _GRID_X, _SCALE, 3, 0, 15)
    checks.assert_rounds_to_grid(_ties_away, _GRID_X, _SCALE, 0, _QMIN, _QMAX, ties="away")


def test_rounds_to_grid_catches_what_the_error_bound_lets_through():
    # Both stay within half a step, so the error bound passes them.
    for quantizer in (_clip_only, _ties_away):
        checks.assert_quantization_error_bounded(quantizer, _GRID_X, _SCALE, 0, _QMIN, _QMAX)
    x = np.array([0.25, 0.75, -0.25, 1.3], np.float32)  # ties 0.5, 1.5, -0.5 and an off-grid value
    with pytest.raises(AssertionError, match=r"(?s)at 4 of 4 elements.*x\[0\] = 0.25 \(x / scale = "
                       r"0.5\): fq\(x\) = 0.25 \(0.5 steps\), expected 0 \(0 steps\)"):  # fmt: skip
        checks.assert_rounds_to_grid(_clip_only, x, _SCALE, 0, _QMIN, _QMAX)
    # 0.5 and -0.5 go to +-1 instead of 0; 1.5 goes to 2 either way.
    with pytest.raises(AssertionError, match=r"ties to even\) at 2 of 4 elements"):
        checks.assert_rounds_to_grid(_ties_away, x, _SCALE, 0, _QMIN, _QMAX)
    with pytest.raises(AssertionError, match=r"ties away from zero\) at 2 of 4 elements"):
        checks.assert_rounds_to_grid(_fake_quantize, x, _SCALE, 0, _QMIN, _QMAX, ties="away")


def test_float16_inputs_with_a_scale_below_float16s_normal_range_pass_both_checks():
    # fake_quantize computes in float32 with the scale as given; the checks cast the
    # scale to float16 (a subnormal there, 0.08% off) and failed it by up to 1.6 steps.
    rng = np.random.default_rng(4)
    for scale in (np.float32(1e-3 / 127), np.float32(2e-6)):
        x = (rng.uniform(-140, 140, 200) * scale).astype(np.float16)
        for check in (checks.assert_rounds_to_grid, checks.assert_quantization_error_bounded):
            check(fake_quantize, x, scale, 0, -128, 127)


def test_rounds_to_grid_sees_a_bfloat16_output_one_code_off_at_the_top_of_the_grid():
    # 12.7 and 12.6 are neighbouring bfloat16 values: a slack of one ulp let a
    # quantizer that never reaches qmax pass.
    def stops_short(x, scale, zero_point, qmin, qmax):
        return fake_quantize(x, scale, zero_point, qmin, qmax - 1)

    x = (np.arange(100.0, 131.0) * 0.1).astype(jnp.bfloat16)
    checks.assert_rounds_to_grid(fake_quantize, x, np.float32(0.1), 0, -128, 127)
    with pytest.raises(AssertionError, match=r"x\[27\] = 12.6875 \(x / scale = 126.875\): "
                       r"fq\(x\) = 12.625"):  # fmt: skip
        checks.assert_rounds_to_grid(stops_short, x, np.float32(0.1), 0, -128, 127)


def test_rounds_to_grid_refuses_an_unknown_tie_rule():
    with pytest.raises(ValueError, match=r"ties must be one of \['away', 'even'\], got 'up'"):
        checks.assert_rounds_to_grid(_fake_quantize, _GRID_X, _SCALE, 0, _QMIN, _QMAX, ties="up")


# assert_idempotent


def test_idempotent_fake_quantize_and_not_when_dequantizing_with_another_scale():
    def quantize(x):
        return _fake_quantize(x, _SCALE, _ZERO_POINT, _QMIN, _QMAX)

    def stale_scale(x):
        return jnp.round(x / _SCALE) * (_SCALE * 1.25)

    checks.assert_idempotent(quantize, _GRID_X)
    with pytest.raises(AssertionError, match="fn\\(fn\\(x\\)\\) != fn\\(x\\)"):
        checks.assert_idempotent(stale_scale, _GRID_X)


def test_idempotent_fails_on_a_nan_output_instead_of_matching_nan_with_nan():
    # A zero scale gives 0 / 0: NaN, and NaN == NaN made any such fn "idempotent".
    def zero_scale(x):
        return jnp.round(jnp.asarray(x) / 0.0) * 0.0

    with pytest.raises(AssertionError, match=r"fn\(x\) is NaN"):
        checks.assert_idempotent(zero_scale, np.array([0.0, 0.5, -1.5], np.float32))


# assert_clipped


_CLIP = optax.clip_by_global_norm(1.0)
_clip_update = jax.jit(lambda grads: _CLIP.update(grads, _CLIP.init(grads))[0])


def test_clipped_holds_for_optax_global_norm_clipping_large_and_small():
    large = {"a": np.full(3, 2.0, np.float32), "b": np.array([[-1.0, 4.0]], np.float32)}
    small = jax.tree_util.tree_map(lambda g: g / 100, large)
    for grads in (large, small):
        checks.assert_clipped(_clip_update(grads), 1.0, grads=grads)


def test_clipped_catches_per_leaf_clipping_and_renormalizing_small_grads():
    grads = {"a": np.full(3, 2.0, np.float32), "b": np.array([[-1.0, 4.0]], np.float32)}
    per_leaf = {k: v / np.linalg.norm(v) for k, v in grads.items()}
    with pytest.raises(AssertionError, match=r"global norm of updates is 1\.41"):
        checks.assert_clipped(per_leaf, 1.0)
    small = jax.tree_util.tree_map(lambda g: g / 100, grads)
    norm = np.sqrt(sum(np.sum(v**2) for v in small.values()))
    renormalized = jax.tree_util.tree_map(lambda g: g / norm, small)
    with pytest.raises(AssertionError, match="not grads \\* min"):
        checks.assert_clipped(renormalized, 1.0, grads=small)


@pytest.mark.parametrize("wrong", [0.0, 0.5, -1.0])
def test_clipped_catches_wrong_updates_of_gradients_far_inside_the_ball(wrong):
    # The absolute slack was rtol * max_norm = 1e-5: every element of a gradient of
    # norm ~1e-6 fit inside it, so zeroed, halved or negated updates passed.
    grads = {"w": np.random.default_rng(0).standard_normal(16).astype(np.float32) * 1e-7}
    checks.assert_clipped(_clip_update(grads), 1.0, grads=grads)
    updates = jax.tree_util.tree_map(lambda g: g * np.float32(wrong), grads)
    with pytest.raises(AssertionError, match="not grads \\* min"):
        checks.assert_clipped(updates, 1.0, grads=grads)


# count_compiles and assert_max_compiles


def test_count_compiles_counts_one_lowering_per_new_shape():
    def add_one(x):
        return x + 1

    add_one_jit = jax.jit(add_one)
    with checks.count_compiles() as log:
        add_one_jit(np.zeros(2, np.float32))
        add_one_jit(np.ones(2, np.float32))
        add_one_jit(np.zeros(3, np.float32))
    assert log.count == 2
    assert all("add_one" in name for name in log.names)
    with checks.count_compiles() as log:
        add_one_jit(np.zeros(3, np.float32))
    assert log.count == 0


def test_assert_max_compiles_fails_when_a_jit_retraces():
    square = jax.jit(lambda x: x * x)
    expected = "2 computations compiled, expected at most 1"
    with pytest.raises(AssertionError, match=expected), checks.assert_max_compiles(1):
        square(np.zeros(2, np.float32))
        square(np.zeros(4, np.float32))
