"""Learned step size quantization: forward, the LSQ gradient formula, positivity of the step."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qat import fake_quantize, lsq_fake_quantize
from qat.config import integer_range
from qat.lsq import default_grad_scale, initial_step_size

from .quantization_references import reference_gradients

EPS = np.finfo(np.float32).eps
RNG = np.random.default_rng(31)


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def lsq_gradients(x, scale, zero_point, qmin, qmax, grad_scale, cotangent):
    def weighted(x, scale, zero_point):
        y = lsq_fake_quantize(x, scale, zero_point, qmin, qmax, grad_scale)
        return jnp.sum(cotangent * y)

    return jax.grad(weighted, argnums=(0, 1, 2))(x, scale, zero_point)


def test_step_size_gradient_matches_the_paper_on_a_worked_example():
    # 4-bit signed: Qn = 8, Qp = 7; s = 1. Elements: below the grid, above it, and two inside.
    x = jnp.array([-10.0, 10.0, 0.3, 2.6])
    grad = jax.grad(lambda s: jnp.sum(lsq_fake_quantize(x, s, 0, -8, 7)))(1.0)
    g = 1 / math.sqrt(4 * 7)
    expected = (-8 + 7 + (0 - 0.3) + (3 - 2.6)) * g
    np.testing.assert_allclose(float(grad), expected, rtol=1e-6)


@pytest.mark.parametrize("scale", [0.37, -0.37])
def test_forward_equals_fake_quantize_with_the_absolute_step(scale):
    x = jnp.linspace(-60.0, 60.0, 41)
    np.testing.assert_array_equal(
        np.asarray(lsq_fake_quantize(x, scale, 3, 0, 255)),
        np.asarray(fake_quantize(x, abs(scale), 3, 0, 255)),
    )


def test_ties_round_to_even_in_the_forward_and_the_step_gradient():
    # x / s = k + 0.5 exactly (s a power of two): codes round half to even, as NumPy's.
    scale, zero_point = 0.25, 3.0
    ratio = np.arange(-20.5, 21.0, 1.0, dtype=np.float32)
    x = ratio * np.float32(scale)
    code = np.clip(np.round(ratio) + zero_point, 0, 15)
    expected = ((code - zero_point) * scale).astype(np.float32)
    y = lsq_fake_quantize(x, scale, zero_point, 0, 15, 1.0)
    np.testing.assert_array_equal(np.asarray(y), expected)
    cotangent = np.ones_like(x)
    _, d_scale, _ = lsq_gradients(x, scale, zero_point, 0, 15, 1.0, cotangent)
    _, want, _ = reference_gradients(x, scale, zero_point, 0, 15, cotangent, 1.0)
    np.testing.assert_allclose(float(d_scale), want, rtol=1e-6)


@given(
    hnp.arrays(np.float32, (12,), elements=st.floats(-20, 20, width=32)),
    st.floats(0.0625, 2.0, width=32),
    st.sampled_from([2, 4, 8]),
    st.booleans(),
    st.integers(0, 3),
)
def test_gradients_match_numpy_for_x_scale_and_zero_point(x, scale, bits, symmetric, zp_index):
    qmin, qmax = integer_range(bits, symmetric)
    zero_point = 0 if symmetric else [qmin, qmax, (qmin + qmax) // 2, qmin + 1][zp_index]
    cotangent = np.linspace(-1.0, 2.0, 12, dtype=np.float32)
    grad_scale = 1 / math.sqrt(12 * qmax)
    dx, dscale, dzp = lsq_gradients(
        x, np.float32(scale), np.float32(zero_point), qmin, qmax, grad_scale, cotangent
    )
    expected = reference_gradients(x, float(scale), zero_point, qmin, qmax, cotangent, grad_scale)
    np.testing.assert_array_equal(np.asarray(dx), expected[0])
    np.testing.assert_allclose(float(dscale), expected[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(dzp), expected[2], rtol=1e-4, atol=1e-5)


def test_default_gradient_scale_is_one_over_sqrt_n_qmax():
    x = jnp.linspace(-3.0, 5.0, 24)

    def d_scale(grad_scale):
        return jax.grad(lambda s: jnp.sum(lsq_fake_quantize(x, s, 0, -8, 7, grad_scale)))(0.4)

    np.testing.assert_allclose(
        float(d_scale(None)), float(d_scale(1.0)) / math.sqrt(24 * 7), rtol=1e-6
    )


def test_per_channel_step_sizes_get_their_own_channel_gradient():
    rng = np.random.default_rng(0)
    x = rng.normal(scale=3.0, size=(5, 3)).astype(np.float32)
    scale = np.array([[0.1, 0.5, 2.0]], np.float32)
    grad = jax.grad(lambda s: jnp.sum(lsq_fake_quantize(x, s, 0, -8, 7, 1.0)))(scale)
    assert grad.shape == (1, 3)
    for channel in range(3):
        expected = reference_gradients(x[:, channel], scale[0, channel], 0, -8, 7, 1.0, 1.0)[1]
        np.testing.assert_allclose(float(grad[0, channel]), expected, rtol=1e-5, atol=1e-6)


def test_clipped_elements_get_the_exact_derivative():
    # Outside the grid y = (qmax - zp) * s is linear in s: finite differences agree with LSQ.
    x = jnp.array([40.0, 55.0, -30.0])

    def total(s):
        return jnp.sum(lsq_fake_quantize(x, s, 0, -8, 7, 1.0))

    step = 1e-3
    finite_difference = (total(1.0 + step) - total(1.0 - step)) / (2 * step)
    np.testing.assert_allclose(float(jax.grad(total)(1.0)), float(finite_difference), rtol=1e-3)


def test_negative_scale_gets_a_sign_flipped_gradient():
    x = jnp.linspace(-3.0, 3.0, 13)

    def d_scale(s):
        return jax.grad(lambda s: jnp.sum(lsq_fake_quantize(x, s, 0, -8, 7) ** 2))(s)

    np.testing.assert_allclose(float(d_scale(-0.3)), -float(d_scale(0.3)), rtol=1e-6)


def test_zero_scale_stays_finite_and_can_recover():
    x = jnp.linspace(-1.0, 1.0, 9)
    y = lsq_fake_quantize(x, 0.0, 0, -128, 127)
    grad = jax.grad(lambda s: jnp.sum((lsq_fake_quantize(x, s, 0, -128, 127) - x) ** 2))(0.0)
    assert np.all(np.isfinite(np.asarray(y)))
    assert np.isfinite(float(grad)) and float(grad) < 0.0  # descent increases the step


def test_descending_the_lsq_gradient_shrinks_the_quantization_error():
    x = jnp.asarray(np.random.default_rng(1).normal(size=256), jnp.float32)

    def error(s):
        return jnp.mean((lsq_fake_quantize(x, s, 0, -8, 7) - x) ** 2)

    step_size = jnp.float32(0.01)  # far too small: almost everything is clipped
    initial = float(error(step_size))
    update = jax.jit(lambda s: s - 0.05 * jnp.sign(jax.grad(error)(s)) * s)
    for _ in range(60):
        step_size = update(step_size)
    assert float(error(step_size)) < 0.1 * initial


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="qmin must be < qmax"):
        lsq_fake_quantize(jnp.ones(3), 0.1, 0, 3, 3)
    with pytest.raises(ValueError, match=r"scale of shape \(2,\)"):
        lsq_fake_quantize(jnp.ones(3), jnp.ones(2), 0, 0, 3)


def test_a_scale_that_overflows_float32_raises_instead_of_giving_nan():
    # 1e300 is finite as a Python float but inf in float32, where the step size lives:
    # every output was NaN (0 * inf at the grid's zero, inf - inf elsewhere).
    with pytest.raises(ValueError, match=r"scale must be finite in float32.*got \[1e\+300\]"):
        lsq_fake_quantize(jnp.array([-1.0, 0.0, 1.0]), 1e300, 0, -128, 127)
    # A tiny scale is no error: the eps floor of the step size makes it harmless.
    y = lsq_fake_quantize(jnp.array([0.0, 1.0]), 1e-40, 0, -128, 127)
    np.testing.assert_array_equal(np.asarray(y), [0.0, 127 * EPS])


def test_near_ties_and_the_step_gradient_use_x_times_the_reciprocal():
    # `x / s` and `x * (1/s)` round apart for many of these inputs (not a power-of-two
    # step); the forward codes and the step gradient `round(r) - r` follow PyTorch's
    # `r = x * (1/s)`, also for a step of x's full shape (which XLA divided by).
    rng = np.random.default_rng(1)
    step = np.float32(0.0371)
    x = (rng.integers(-100, 100, 2048).astype(np.float32) + np.float32(0.5)) * step
    x = x + rng.integers(-2, 3, x.size).astype(np.float32) * np.spacing(x)
    assert np.sum(np.round(x / step) != np.round(x * (np.float32(1) / step))) > 50
    cotangent = np.linspace(0.5, 1.5, x.size, dtype=np.float32)
    expected = reference_gradients(x, step, 0, -128, 127, cotangent, 1.0)
    dx, dscale, _ = lsq_gradients(jnp.asarray(x), step, 0.0, -128, 127, 1.0, cotangent)
    np.testing.assert_array_equal(np.asarray(dx), expected[0])
    np.testing.assert_allclose(float(dscale), expected[1], rtol=1e-5)
    codes = np.clip(np.round(x * (np.float32(1) / step)), -128, 127)
    for scale in (step, np.full(x.shape, step)):
        y = lsq_fake_quantize(jnp.asarray(x), jnp.asarray(scale), 0.0, -128, 127, 1.0)
        np.testing.assert_array_equal(np.asarray(y), (codes * step).astype(np.float32))


def test_under_vmap_the_default_scale_counts_one_example_and_an_explicit_one_fixes_it():
    # The docstring's caveat: a call under vmap sees one example's N, so the summed
    # step gradient is sqrt(B) times the batched call's; the batch's scale undoes it.
    x = np.random.default_rng(5).normal(size=(16, 32)).astype(np.float32)
    weights = np.random.default_rng(6).uniform(0.5, 1.5, x.shape).astype(np.float32)

    def loss(scale, rows, grad_scale=None):
        return jnp.sum(lsq_fake_quantize(rows, scale, 0.0, -128, 127, grad_scale) * weights[0])

    step = jnp.float32(0.02)
    batched = jax.grad(lambda s: jnp.sum(lsq_fake_quantize(x, s, 0.0, -128, 127) * weights[0]))(
        step
    )
    per_example = jax.grad(lambda s: jnp.sum(jax.vmap(lambda r: loss(s, r))(x)))(step)
    np.testing.assert_allclose(per_example / batched, np.sqrt(16), rtol=1e-5)
    whole = default_grad_scale(x.size, 1, 127)
    fixed = jax.grad(lambda s: jnp.sum(jax.vmap(lambda r: loss(s, r, whole))(x)))(step)
    np.testing.assert_allclose(fixed, batched, rtol=1e-5)


@pytest.mark.parametrize("zero_point", [2.4, 2.6, -3.0, 300.0])
def test_a_learned_zero_point_off_the_integers_is_rounded_and_clipped_onto_the_grid(zero_point):
    # It was refused eagerly (and used off the grid under jit), though its gradient moves
    # it off the integers at the first step. The grid now uses clip(round(zp), 0, 255).
    x = np.random.default_rng(7).normal(size=64).astype(np.float32) * 2
    upstream = np.random.default_rng(8).uniform(0.5, 1.5, 64).astype(np.float32)
    on_grid = float(np.clip(np.round(zero_point), 0, 255))
    scale = np.float32(0.1)

    def quantized(v, s, z):
        return lsq_fake_quantize(v, s, z, 0, 255, 1.0)

    y, pullback = jax.vjp(quantized, x, scale, np.float32(zero_point))
    expected_y, expected_pullback = jax.vjp(quantized, x, scale, np.float32(on_grid))
    np.testing.assert_array_equal(y, expected_y)
    np.testing.assert_array_equal(y, fake_quantize(x, scale, on_grid, 0, 255))
    for got, expected in zip(pullback(upstream), expected_pullback(upstream), strict=True):
        np.testing.assert_array_equal(got, expected)
    jitted = jax.jit(lambda z: lsq_fake_quantize(x, scale, z, 0, 255))(np.float32(zero_point))
    np.testing.assert_array_equal(jitted, y)


def test_a_learned_zero_point_matches_torch_learnable_fake_quantize():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(9).normal(size=64).astype(np.float32) * 2
    upstream = np.random.default_rng(10).uniform(0.5, 1.5, 64).astype(np.float32)
    for zero_point in (2.4, 2.6, 300.0):
        inputs = [torch.tensor(v, requires_grad=True) for v in (x, [0.1], [zero_point])]
        out = torch._fake_quantize_learnable_per_tensor_affine(*inputs, 0, 255, 1.0)
        out.backward(torch.tensor(upstream))
        y, pullback = jax.vjp(
            lambda v, s, z: lsq_fake_quantize(v, s, z, 0, 255, 1.0),
            x,
            np.float32(0.1),
            np.float32(zero_point),
        )
        np.testing.assert_array_equal(y, out.detach().numpy())
        for got, tensor in zip(pullback(upstream), inputs, strict=True):
            # float32 sums over the 64 elements, accumulated in another order
            np.testing.assert_allclose(np.ravel(got), tensor.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_a_non_finite_zero_point_is_still_refused():
    with pytest.raises(ValueError, match=r"zero_point must be finite, got"):
        lsq_fake_quantize(np.ones(4, np.float32), 0.1, np.nan, 0, 255)


@pytest.mark.parametrize("zero_point", [0, 5])
def test_lsq_step_size_gradient_is_the_papers_formula_times_its_gradient_scale(zero_point):
    qmin, qmax = (-8, 7) if zero_point == 0 else (0, 15)
    x = (RNG.normal(size=(4, 3)) * 0.6).astype(np.float32)
    upstream = RNG.normal(size=(4, 3)).astype(np.float32)
    scale = np.array([0.07, 0.1, 0.05], np.float32)  # per channel along the last axis

    def loss(s):
        return jnp.sum(lsq_fake_quantize(x, s, zero_point, qmin, qmax) * upstream)

    got = np.asarray(jax.jit(jax.grad(loss))(jnp.asarray(scale)))
    ratio = x.astype(np.float64) / scale
    position = np.round(ratio) + zero_point
    partial = np.where(
        position < qmin,
        qmin - zero_point,
        np.where(position > qmax, qmax - zero_point, np.round(ratio) - ratio),
    )
    assert (position < qmin).any() or (position > qmax).any()
    # N: the elements sharing one step size (a column of 4).
    expected = (partial * upstream).sum(axis=0) / np.sqrt(4 * qmax)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "qmin, qmax, zero_point, ratios",
    [
        # x/s from qmax to half a step above it, and from half a step below qmin to qmin.
        (-128, 127, 0.0, [127.0, 127.2, 127.3, 127.45, -128.0, -128.2, -128.45]),
        # The same band on an affine grid, shifted by the zero point: x/s + zp near 255 and 0.
        (0, 255, 3.0, [252.0, 252.3, 252.45, -3.0, -3.3, -3.45]),
    ],
)
def test_within_half_a_step_outside_the_grid_the_rounded_position_decides(
    qmin, qmax, zero_point, ratios
):
    # Documented rule (PyTorch's variant): clipped iff round(x/s) + zp is off the grid.
    # These x/s round onto the grid, so d y/d s = round(x/s) - x/s and d y/d x = 1,
    # where Esser et al.'s eq. 3 (deciding from x/s itself) gives qmax - zp or qmin - zp and 0.
    step, grad_scale = 0.25, 0.5  # a power of two: x/s is exact in float32
    ratios = [*ratios, qmax - zero_point + 0.7, qmin - zero_point - 0.7, 100.2]
    x = np.asarray(ratios, np.float32) * np.float32(step)
    # One step size per element, so its gradient is that element's d y/d s.
    grad_x, grad_step = jax.grad(
        lambda x, s: jnp.sum(lsq_fake_quantize(x, s, zero_point, qmin, qmax, grad_scale)),
        argnums=(0, 1),
    )(jnp.asarray(x), jnp.full(x.shape, step, jnp.float32))

    ratio = x.astype(np.float64) / step
    position = np.round(ratio) + zero_point
    inside = (qmin <= position) & (position <= qmax)
    documented = np.where(
        inside,
        np.round(ratio) - ratio,
        np.where(position < qmin, qmin - zero_point, qmax - zero_point),
    )
    np.testing.assert_allclose(np.asarray(grad_step), documented * grad_scale, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(grad_x), inside.astype(np.float32))

    band = slice(0, len(ratios) - 3)
    shifted = ratio + zero_point
    eq3 = np.where(
        shifted <= qmin,
        qmin - zero_point,
        np.where(shifted >= qmax, qmax - zero_point, np.round(ratio) - ratio),
    )
    assert inside[band].all() and not np.isclose(eq3[band], documented[band]).any()
    if zero_point == 0.0:
        # The worked example of the docstring: x/s = 127.3 gives -0.3, not 127.
        assert np.isclose(float(grad_step[2]), -0.3 * grad_scale, atol=1e-6)


# ---------------------------------------------------------------------------
# clip_from: PyTorch's rounded-position rule (the default) or eq. 3's unrounded one


def eq3_partials(x, step, zero_point, qmin, qmax):
    """Esser et al. 2020, eq. 3, on an affine grid, in float64: `(d y/d x, d y/d s)` per element.

    Clipped where `x/s + zp <= qmin` or `>= qmax` (d y/d s = qmin - zp, qmax - zp;
    d y/d x = 0); inside, d y/d s = round(x/s) - x/s and d y/d x = 1.
    """
    ratio = np.asarray(x, np.float64) / step
    unrounded = ratio + zero_point
    below, above = unrounded <= qmin, unrounded >= qmax
    d_step = np.where(below, qmin - zero_point, np.where(above, qmax - zero_point, 0.0))
    inside = ~(below | above)
    return inside.astype(np.float64), np.where(inside, np.round(ratio) - ratio, d_step)


def rounded_partials(x, step, zero_point, qmin, qmax):
    """PyTorch's variant in float64: clipped where `round(x/s) + zp` is off the grid."""
    ratio = np.asarray(x, np.float64) / step
    position = np.round(ratio) + zero_point
    below, above = position < qmin, position > qmax
    d_step = np.where(below, qmin - zero_point, np.where(above, qmax - zero_point, 0.0))
    inside = ~(below | above)
    return inside.astype(np.float64), np.where(inside, np.round(ratio) - ratio, d_step)


REFERENCES = {"rounded": rounded_partials, "unrounded": eq3_partials}


def boundary_positions(qmin: int, qmax: int) -> np.ndarray:
    """Unrounded positions `x/s + zp`: both ends exactly, within half a step outside, near them."""
    offsets = [0.0, 0.2, 0.45, 0.5, -0.3, -0.5, 0.7, 3.7]
    return np.array(
        [qmax + o for o in offsets] + [qmin - o for o in offsets] + [(qmin + qmax) / 2 + 0.3]
    )


@pytest.mark.parametrize("clip_from", ["rounded", "unrounded"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_each_clip_rule_matches_its_float64_formula_at_the_grid_ends(clip_from, bits, symmetric):
    qmin, qmax = integer_range(bits, symmetric)
    zero_point = 0 if symmetric else (qmax + 1) // 4
    step, grad_scale = 0.25, 0.5  # a power of two: x/s is exact in float32 and float64
    rng = np.random.default_rng(bits + 10 * symmetric)
    positions = np.concatenate(
        [boundary_positions(qmin, qmax), rng.uniform(qmin - 3, qmax + 3, 40)]
    )
    x = ((positions - zero_point) * step).astype(np.float32)
    cotangent = rng.uniform(0.5, 1.5, x.size).astype(np.float32)

    def loss(x, s, z):
        y = lsq_fake_quantize(x, s, z, qmin, qmax, grad_scale, clip_from=clip_from)
        return jnp.sum(cotangent * y)

    # One step size and zero point per element: their gradients are per element too.
    scale = jnp.full(x.shape, step, jnp.float32)
    grad_x, grad_step, grad_zp = jax.grad(loss, argnums=(0, 1, 2))(
        jnp.asarray(x), scale, jnp.full(x.shape, zero_point, jnp.float32)
    )
    d_x, d_step = REFERENCES[clip_from](x, step, zero_point, qmin, qmax)
    np.testing.assert_array_equal(np.asarray(grad_x), cotangent * d_x)
    np.testing.assert_allclose(np.asarray(grad_step), cotangent * d_step * grad_scale, atol=1e-6)
    clipped_zp = np.where(d_x == 1.0, 0.0, -step) * cotangent * grad_scale
    np.testing.assert_allclose(np.asarray(grad_zp), clipped_zp, atol=1e-7)
    # The forward is fake_quantize's whichever rule decides the gradient.
    np.testing.assert_array_equal(
        np.asarray(lsq_fake_quantize(x, step, zero_point, qmin, qmax, clip_from=clip_from)),
        np.asarray(fake_quantize(x, step, zero_point, qmin, qmax)),
    )
    # The two rules disagree on these inputs, so each assertion above tells them apart.
    other = REFERENCES["unrounded" if clip_from == "rounded" else "rounded"]
    assert np.any(other(x, step, zero_point, qmin, qmax)[1] != d_step)


def test_the_eq3_rule_at_the_documented_worked_example():
    # x/s = 127.3 (zp 0, 8 bits): eq. 3 gives d y/d s = 127 and d y/d x = 0;
    # exactly at x/s = 127 too (rounded: 0 and 1).
    x = jnp.asarray(np.float32([127.3 * 0.25, 127 * 0.25]))
    grad_x, grad_step = jax.grad(
        lambda x, s: jnp.sum(lsq_fake_quantize(x, s, 0, -128, 127, 1.0, "unrounded")),
        argnums=(0, 1),
    )(x, jnp.full((2,), 0.25, jnp.float32))
    np.testing.assert_array_equal(np.asarray(grad_x), [0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(grad_step), [127.0, 127.0])


def test_the_default_clip_rule_is_the_rounded_one_bit_for_bit():
    x = np.random.default_rng(4).normal(size=64).astype(np.float32) * 3
    cotangent = np.linspace(-1.0, 1.0, 64, dtype=np.float32)

    def gradients(*clip_from):
        def loss(x, s, z):
            return jnp.sum(cotangent * lsq_fake_quantize(x, s, z, 0, 15, None, *clip_from))

        return jax.grad(loss, argnums=(0, 1, 2))(x, np.float32(0.2), np.float32(3.0))

    for default, rounded in zip(gradients(), gradients("rounded"), strict=True):
        np.testing.assert_array_equal(np.asarray(default), np.asarray(rounded))


@pytest.mark.parametrize(
    ("clip_from", "error", "match"),
    [
        ("paper", ValueError, r"clip_from must be one of \('rounded', 'unrounded'\), got 'paper'"),
        (True, TypeError, r"clip_from must be one of .*, got bool True"),
    ],
)
def test_a_bad_clip_rule_is_named(clip_from, error, match):
    with pytest.raises(error, match=match):
        lsq_fake_quantize(np.ones(3, np.float32), 0.1, 0, -8, 7, clip_from=clip_from)


# ---------------------------------------------------------------------------
# initial_step_size: the paper's 2 * mean(|x|) / sqrt(Q_P)


@pytest.mark.parametrize("qmax", [1, 7, 127, 255])
def test_initial_step_size_per_tensor_is_twice_the_mean_magnitude_over_sqrt_qmax(qmax):
    x = RNG.normal(loc=0.3, scale=2.0, size=(6, 5, 4)).astype(np.float32)
    expected = 2 * np.mean(np.abs(x.astype(np.float64))) / np.sqrt(qmax)
    got = initial_step_size(x, qmax)
    assert got.shape == () and got.dtype == jnp.float32
    np.testing.assert_allclose(float(got), expected, rtol=1e-6)


@pytest.mark.parametrize("channel_axis", [0, 1, -1, -3])  # -3: the first axis, counted back
def test_initial_step_size_per_channel_reduces_every_other_axis(channel_axis):
    x = RNG.normal(size=(6, 5, 4)) * np.array([0.1, 1.0, 3.0, 10.0])
    x = x.astype(np.float32)
    magnitude = np.abs(x.astype(np.float64))
    axes = tuple(a for a in range(3) if a != channel_axis % 3)
    expected = 2 * magnitude.mean(axis=axes) / np.sqrt(7)
    got = initial_step_size(x, 7, channel_axis=channel_axis)
    assert got.shape == (x.shape[channel_axis],)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6)
    # Under jax.jit too (no host check of the traced values).
    jitted = jax.jit(lambda v: initial_step_size(v, 7, channel_axis))(x)
    np.testing.assert_allclose(np.asarray(jitted), expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((np.ones(3, np.float32), 0), {}, ValueError, r"qmax must be a positive int .*got 0"),
        ((np.ones(3, np.float32), 7.0), {}, TypeError, r"qmax must be a positive Python int"),
        ((np.ones(3, np.int32), 7), {}, TypeError, r"x must be a floating array, got dtype int32"),
        ((np.ones(0, np.float32), 7), {}, ValueError, r"at least one element, got shape \(0,\)"),
        ((np.float32([1.0, np.nan]), 7), {}, ValueError, r"x must be finite: it holds 1 NaN"),
        ((np.ones((2, 3), np.float32), 7), {"channel_axis": 2}, ValueError, "out of range"),
        ((np.ones((2, 3), np.float32), 7), {"channel_axis": 1.0}, TypeError, "channel_axis must"),
    ],
)
def test_initial_step_size_names_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        initial_step_size(*args, **kwargs)
