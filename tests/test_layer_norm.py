"""`layer_norm`: the formula, and its closed-form derivative against float64 finite differences."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tft_jax.layer_norm import DEFAULT_EPSILON, layer_norm

EPSILON = 1e-3  # large enough that moving it outside the square root shows


def numpy_layer_norm(x, scale, bias, epsilon=EPSILON):
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * scale + bias


def numerical_gradient(f, x, step=1e-6):
    """Central differences of the scalar `f` at every entry of float64 `x`."""
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[index] += step
        down[index] -= step
        grad[index] = (f(up) - f(down)) / (2 * step)
    return grad


# Shapes of x, scale: a plain feature axis, and per-variable parameters
# broadcast over a variable-major `(V, rows, F)` activation.
CASES = {"features": ((3, 4, 5), (5,)), "per_variable": ((2, 3, 4), (2, 1, 4))}


def draw(case, seed=0):
    rng = np.random.default_rng(seed)
    x_shape, p_shape = CASES[case]
    # Small spread on some rows, so epsilon is not negligible against the variance.
    x = rng.normal(size=x_shape) * rng.choice([0.02, 1.0, 3.0], size=(*x_shape[:-1], 1))
    return x, rng.normal(size=p_shape), rng.normal(size=p_shape), rng.normal(size=x_shape)


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_float64_formula(case):
    x, scale, bias, _ = draw(case)
    ours = layer_norm(jnp.float32(x), jnp.float32(scale), jnp.float32(bias), EPSILON)
    np.testing.assert_allclose(ours, numpy_layer_norm(x, scale, bias), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_match_float64_finite_differences(case):
    x, scale, bias, weights = draw(case, seed=1)

    def loss(x, scale, bias):
        return jnp.sum(jnp.float32(weights) * jnp.sin(layer_norm(x, scale, bias, EPSILON)))

    ours = jax.grad(loss, argnums=(0, 1, 2))(jnp.float32(x), jnp.float32(scale), jnp.float32(bias))
    references = (
        numerical_gradient(lambda v: np.sum(weights * np.sin(numpy_layer_norm(v, scale, bias))), x),
        numerical_gradient(lambda v: np.sum(weights * np.sin(numpy_layer_norm(x, v, bias))), scale),
        numerical_gradient(lambda v: np.sum(weights * np.sin(numpy_layer_norm(x, scale, v))), bias),
    )
    for name, got, want in zip(("x", "scale", "bias"), ours, references, strict=True):
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=name)


def test_forward_mode_matches_float64_directional_derivative():
    x, scale, bias, direction = draw("per_variable", seed=2)
    tangents = tuple(jnp.float32(t) for t in (direction, 0.5 * scale, -bias))
    _, ours = jax.jvp(
        lambda x, s, b: layer_norm(x, s, b, EPSILON),
        (jnp.float32(x), jnp.float32(scale), jnp.float32(bias)),
        tangents,
    )
    step = 1e-6

    def at(t):
        return numpy_layer_norm(x + t * direction, scale + t * 0.5 * scale, bias - t * bias)

    np.testing.assert_allclose(ours, (at(step) - at(-step)) / (2 * step), rtol=2e-4, atol=2e-4)


def test_bfloat16_input_keeps_its_dtype_with_float32_statistics():
    x, scale, bias, _ = draw("features", seed=3)
    x = x + 1000.0  # a mean that bfloat16 statistics would get visibly wrong
    out = layer_norm(jnp.bfloat16(x), jnp.float32(scale), jnp.float32(bias))
    assert out.dtype == jnp.bfloat16
    rounded = np.asarray(jnp.bfloat16(x), np.float64)
    reference = numpy_layer_norm(rounded, scale, bias, DEFAULT_EPSILON)
    np.testing.assert_allclose(np.asarray(out, np.float64), reference, rtol=2e-2, atol=3e-2)
    grad = jax.grad(lambda x: jnp.sum(layer_norm(x, scale, bias).astype(jnp.float32)))(
        jnp.bfloat16(x)
    )
    assert grad.dtype == jnp.bfloat16


def test_integer_input_gives_float_output_not_truncated_integers():
    # The result used to be cast back to x's dtype: [1, 2, 3, 4] normalized to [-1, 0, 0, 1].
    x = np.array([[1, 2, 3, 4]], np.int32)
    scale, bias = np.ones(4, np.float32), np.zeros(4, np.float32)
    out = layer_norm(x, scale, bias)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(
        out, numpy_layer_norm(x, scale, bias, DEFAULT_EPSILON), rtol=1e-5, atol=1e-5
    )


def test_a_traced_epsilon_is_refused_naming_it_and_a_static_one_works_under_jit():
    # float(epsilon) on a tracer raised a raw ConcretizationTypeError.
    x, scale, bias, _ = draw("features", seed=4)
    x, scale, bias = jnp.float32(x), jnp.float32(scale), jnp.float32(bias)
    with pytest.raises(TypeError, match="layer_norm: epsilon must be a static Python float"):
        jax.jit(lambda epsilon: layer_norm(x, scale, bias, epsilon))(EPSILON)
    static = jax.jit(lambda x, epsilon: layer_norm(x, scale, bias, epsilon), static_argnums=1)
    np.testing.assert_allclose(
        static(x, EPSILON), numpy_layer_norm(x, scale, bias), rtol=2e-5, atol=2e-5
    )
