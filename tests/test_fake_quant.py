"""`fake_quantize` and `FakeQuantize` against independent numpy and float64 references.

Quantizers built from observers, the straight-through gradient at the grid ends
and the (zero) second derivative are checked too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qat import FakeQuantize, QATConfig, QuantizationObserver, fake_quantize, lsq_fake_quantize
from qat.config import integer_range
from qat.fake_quant import quantize

from .quantization_references import away_from_ties

BITS = (2, 4, 8)
RNG = np.random.default_rng(31)


def reference(x, scale, zero_point, qmin, qmax):
    """Numpy fake quantization in float32: `(forward, straight-through mask)`.

    `x` times the reciprocal of the scale, as PyTorch's fake quantization computes it.
    """
    x = np.asarray(x, np.float32)
    scale = np.asarray(scale, np.float32)
    zero_point = np.asarray(zero_point, np.float32)
    position = np.round(x * (np.float32(1) / scale)) + zero_point  # numpy rounds half to even too
    forward = (np.clip(position, qmin, qmax) - zero_point) * scale
    mask = ((position >= qmin) & (position <= qmax)).astype(np.float32)
    return forward, mask


@functools.partial(jax.jit, static_argnums=(3, 4))
def forward_and_vjp(x, scale, zero_point, qmin, qmax, cotangent):
    y, pullback = jax.vjp(lambda x: fake_quantize(x, scale, zero_point, qmin, qmax), x)
    return y, pullback(cotangent)[0]


@jax.jit
def quantizer_forward_and_vjp(quantizer, x, cotangent):
    y, pullback = jax.vjp(quantizer, x)
    return y, pullback(cotangent)[0]


def grid(bits: int, symmetric: bool) -> tuple[int, int, int]:
    qmin, qmax = integer_range(bits, symmetric)
    zero_point = 0 if symmetric else qmin + (qmax - qmin) // 3
    return qmin, qmax, zero_point


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", BITS)
def test_forward_and_gradient_match_numpy_on_every_half_step(bits, symmetric):
    qmin, qmax, zero_point = grid(bits, symmetric)
    scale = np.float32(0.125)  # a power of two: x / scale is exact, so ties are real ties
    half_steps = np.arange(2 * (qmin - zero_point - 3), 2 * (qmax - zero_point + 3) + 1)
    x = (half_steps / 2 * scale).astype(np.float32)
    cotangent = np.linspace(0.5, 2.0, x.size, dtype=np.float32)

    y, grad = forward_and_vjp(x, scale, zero_point, qmin, qmax, cotangent)
    expected, mask = reference(x, scale, zero_point, qmin, qmax)

    np.testing.assert_array_equal(np.asarray(y), expected)
    np.testing.assert_array_equal(np.asarray(grad), cotangent * mask)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", BITS)
def test_gradient_is_one_exactly_at_both_bounds_and_zero_one_step_beyond(bits, symmetric):
    qmin, qmax, zero_point = grid(bits, symmetric)
    scale = np.float32(0.25)
    x = (
        np.array(
            [qmin - zero_point, qmax - zero_point, qmin - zero_point - 1, qmax - zero_point + 1],
            np.float32,
        )
        * scale
    )
    _, grad = forward_and_vjp(x, scale, zero_point, qmin, qmax, np.ones(4, np.float32))
    # jax.grad of jnp.clip would give 0.5 at the bounds; the STE mask is inclusive.
    np.testing.assert_array_equal(np.asarray(grad), [1.0, 1.0, 0.0, 0.0])


def test_ties_round_half_to_even():
    scale = np.float32(1.0)
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5], np.float32)
    y, _ = forward_and_vjp(x, scale, 0, -128, 127, np.ones(6, np.float32))
    np.testing.assert_array_equal(np.asarray(y), [0.0, 2.0, 2.0, -0.0, -2.0, -2.0])


def test_half_step_beyond_qmax_rounds_out_of_range_and_gets_no_gradient():
    # 127.5 rounds to 128 (even), outside [-128, 127]; -128.5 rounds to -128, inside.
    x = np.array([127.5, -128.5], np.float32)
    y, grad = forward_and_vjp(x, np.float32(1.0), 0, -128, 127, np.ones(2, np.float32))
    np.testing.assert_array_equal(np.asarray(y), [127.0, -128.0])
    np.testing.assert_array_equal(np.asarray(grad), [0.0, 1.0])


@st.composite
def quantization_cases(draw):
    bits = draw(st.sampled_from(BITS))
    symmetric = draw(st.booleans())
    qmin, qmax = integer_range(bits, symmetric)
    zero_point = 0 if symmetric else draw(st.integers(qmin, qmax))
    scale = np.float32(draw(st.floats(0.0009765625, 10.0, width=32)))
    x = draw(hnp.arrays(np.float32, (16,), elements=st.floats(-3000, 3000, width=32)))
    return x, scale, zero_point, qmin, qmax


@given(quantization_cases())
def test_forward_and_gradient_match_numpy_on_random_inputs(case):
    x, scale, zero_point, qmin, qmax = case
    cotangent = np.arange(1, 17, dtype=np.float32)
    y, grad = forward_and_vjp(x, scale, zero_point, qmin, qmax, cotangent)
    expected, mask = reference(x, scale, zero_point, qmin, qmax)
    np.testing.assert_array_equal(np.asarray(y), expected)
    np.testing.assert_array_equal(np.asarray(grad), cotangent * mask)
    assert set(np.unique(np.asarray(grad) / cotangent)) <= {0.0, 1.0}


@given(quantization_cases(), st.floats(0.0, 1.0))
def test_error_is_at_most_half_a_step_inside_the_range(case, fraction):
    _, scale, zero_point, qmin, qmax = case
    low, high = (qmin - zero_point) * scale, (qmax - zero_point) * scale
    x = np.linspace(low, high, 16, dtype=np.float32)
    x = np.clip(x + np.float32(fraction) * scale, low, high).astype(np.float32)
    y, _ = forward_and_vjp(x, scale, zero_point, qmin, qmax, np.ones(16, np.float32))
    slack = 4 * np.finfo(np.float32).eps * max(abs(low), abs(high))
    assert np.max(np.abs(np.asarray(y) - x)) <= scale / 2 + slack


@given(quantization_cases())
def test_fake_quantization_is_idempotent(case):
    x, scale, zero_point, qmin, qmax = case
    ones = np.ones(16, np.float32)
    once, _ = forward_and_vjp(x, scale, zero_point, qmin, qmax, ones)
    twice, _ = forward_and_vjp(once, scale, zero_point, qmin, qmax, ones)
    np.testing.assert_array_equal(np.asarray(twice), np.asarray(once))


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_per_channel_matches_numpy_on_each_axis(axis):
    rng = np.random.default_rng(3)
    x = rng.normal(scale=2.0, size=(2, 3, 4)).astype(np.float32)
    channels = x.shape[axis]
    scale = rng.uniform(0.02, 0.2, channels).astype(np.float32)
    zero_point = rng.integers(0, 256, channels)
    cfg = QATConfig(symmetric=False, per_channel=True, channel_axis=axis)
    quantizer = FakeQuantize.create(cfg, scale=scale, zero_point=zero_point)
    cotangent = rng.uniform(0.5, 1.5, x.shape).astype(np.float32)

    y, grad = quantizer_forward_and_vjp(quantizer, x, cotangent)

    shape = [1, 1, 1]
    shape[axis] = channels
    expected, mask = reference(x, scale.reshape(shape), zero_point.reshape(shape), 0, 255)
    np.testing.assert_array_equal(np.asarray(y), expected)
    np.testing.assert_array_equal(np.asarray(grad), cotangent * mask)


def test_scale_and_zero_point_get_zero_gradient():
    x = jnp.linspace(-3.0, 3.0, 11)

    def loss(scale, zero_point):
        return jnp.sum(fake_quantize(x, scale, zero_point, 0, 15) ** 2)

    d_scale, d_zero_point = jax.grad(loss, argnums=(0, 1))(0.3, 2.0)
    assert d_scale == 0.0 and d_zero_point == 0.0


def test_bfloat16_input_gives_bfloat16_output_computed_in_float32():
    x = jnp.linspace(-2.0, 2.0, 33, dtype=jnp.bfloat16)
    y = fake_quantize(x, 0.1, 0, -128, 127)
    assert y.dtype == jnp.bfloat16
    expected = fake_quantize(x.astype(jnp.float32), 0.1, 0, -128, 127).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(expected, np.float32))


def test_fake_quantize_jits_and_vmaps_over_the_batch():
    x = jnp.arange(12.0).reshape(3, 4) / 7
    vmapped = jax.vmap(lambda row: fake_quantize(row, 0.25, 0, -8, 7))(x)
    np.testing.assert_array_equal(np.asarray(vmapped), reference(x, 0.25, 0, -8, 7)[0])


def test_from_observer_quantizes_with_the_observer_qparams():
    from qat import QuantizationObserver

    cfg = QATConfig(symmetric=False)
    x = jnp.linspace(-1.0, 3.0, 9)
    observer = QuantizationObserver.create(cfg).observe(x)
    quantizer = FakeQuantize.from_observer(observer)
    scale, zero_point = quantizer.scale_zero_point()
    assert (quantizer.qmin, quantizer.qmax) == (0, 255)
    np.testing.assert_array_equal(
        np.asarray(quantizer(x)), reference(x, scale, zero_point, 0, 255)[0]
    )


def test_create_uses_the_config_grid():
    quantizer = FakeQuantize.create(QATConfig(bits=4), scale=0.5)
    assert (quantizer.qmin, quantizer.qmax) == (-8, 7)
    np.testing.assert_array_equal(np.asarray(quantizer(jnp.array([10.0, -10.0]))), [3.5, -4.0])


def test_fake_quantizer_is_a_pytree_of_its_qparams():
    quantizer = FakeQuantize.create(QATConfig(per_channel=True), scale=[0.1, 0.2])
    leaves = jax.tree.leaves(quantizer)
    assert len(leaves) == 2
    rebuilt = jax.tree.unflatten(jax.tree.structure(quantizer), leaves)
    assert rebuilt.qmax == 127 and rebuilt.channel_axis == -1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(qmin=5, qmax=5), ValueError, "qmin must be < qmax"),
        (dict(qmin=0.0, qmax=5), TypeError, "qmin must be a Python int"),
        (dict(scale=jnp.ones(3)), ValueError, r"scale of shape \(3,\) must broadcast"),
        (dict(zero_point=jnp.ones((2, 4))), ValueError, "zero_point of shape"),
        (dict(x=jnp.arange(4)), TypeError, "floating"),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs, error, match):
    arguments = dict(x=jnp.ones(4), scale=0.1, zero_point=0, qmin=-8, qmax=7) | kwargs
    with pytest.raises(error, match=match):
        fake_quantize(**arguments)


@pytest.mark.parametrize(
    ("cfg", "kwargs", "match"),
    [
        (QATConfig(), dict(scale=0.0), r"scale must be finite and > 0, got \[0\.0\]"),
        (QATConfig(), dict(scale=[0.1, 0.2]), "per-tensor scalar"),
        (QATConfig(per_channel=True), dict(scale=0.1), r"per-channel \(C,\)"),
        (
            QATConfig(symmetric=False),
            dict(scale=0.1, zero_point=300),
            r"zero_point must be an integer in \[qmin, qmax\] = \[0, 255\], got \[300\.0\]",
        ),
    ],
)
def test_create_rejects_invalid_qparams(cfg, kwargs, match):
    with pytest.raises(ValueError, match=match):
        FakeQuantize.create(cfg, **kwargs)


def test_per_channel_call_rejects_a_channel_count_mismatch():
    quantizer = FakeQuantize.create(QATConfig(per_channel=True), scale=[0.1, 0.2])
    with pytest.raises(ValueError, match="3 channels on axis -1, the quantizer has 2"):
        quantizer(jnp.ones((4, 3)))


@pytest.mark.parametrize("scale", [1e300, 1e-40, 1e-50])
def test_a_scale_float32_cannot_hold_raises_instead_of_giving_nan(scale):
    # Finite and > 0 as a Python float, but the arithmetic runs in float32: 1e300 is
    # inf there (every output NaN) and 1e-40, 1e-50 are 0 to XLA (NaN at x = 0).
    x = jnp.array([-1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"scale must be finite and > 0 in float32.*got \["):
        fake_quantize(x, scale, 0, -128, 127)
    # A scale float32 holds as a normal number still quantizes: no false alarm.
    np.testing.assert_array_equal(
        np.asarray(fake_quantize(x, 2.0**-120, 0, -128, 127)),
        [-(2.0**-120) * 128, 0.0, 2.0**-120 * 127],
    )


def test_create_rejects_a_subnormal_float32_scale():
    # 1e-40 is a positive float32, but a subnormal one: XLA computes 0/0 = NaN at x = 0.
    with pytest.raises(ValueError, match=r"scale must be finite and > 0 in float32.*got \[9\.9999"):
        FakeQuantize.create(QATConfig(), scale=np.float32(1e-40))


@pytest.mark.parametrize("function", ["fake_quantize", "lsq_fake_quantize"])
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(scale="0.1"), r"scale must be a number or numeric array, got str '0\.1'"),
        (dict(scale=None), "scale must be a number or numeric array, got NoneType None"),
        (dict(zero_point="3"), "zero_point must be a number or numeric array, got str '3'"),
    ],
)
def test_non_numeric_qparams_raise_type_error_naming_them(function, kwargs, match):
    # A string scale failed in numpy ("could not convert string to float") without
    # naming the argument; None passed as NaN ("got [nan]").
    from qat import lsq_fake_quantize

    quantizer = {"fake_quantize": fake_quantize, "lsq_fake_quantize": lsq_fake_quantize}[function]
    arguments = dict(x=jnp.ones(4), scale=0.1, zero_point=0, qmin=0, qmax=15) | kwargs
    with pytest.raises(TypeError, match=match):
        quantizer(**arguments)


def test_from_observer_refuses_an_unobserved_per_channel_observer_under_jit():
    # Its state keeps shape () until the first batch (static even when traced): the
    # quantizer it gave failed later, on call, with "IndexError: tuple index out of range".
    from qat import QuantizationObserver

    observer = QuantizationObserver.create(QATConfig(per_channel=True, channel_axis=0))

    @jax.jit
    def quantize_with(observer, x):
        return FakeQuantize.from_observer(observer)(x)

    with pytest.raises(ValueError, match="has not observed any batch"):
        quantize_with(observer, jnp.ones((3, 4)))
    observed = observer.observe(jnp.arange(12.0).reshape(3, 4))
    np.testing.assert_array_equal(
        np.asarray(quantize_with(observed, jnp.ones((3, 4)))),
        np.asarray(FakeQuantize.from_observer(observed)(jnp.ones((3, 4)))),
    )


def near_ties(scale: float, size: int, seed: int = 0) -> np.ndarray:
    """float32 inputs within two ulps of `(k + 1/2) * scale`: `x / s`, `x * (1/s)` round apart."""
    rng = np.random.default_rng(seed)
    x = (rng.integers(-100, 100, size).astype(np.float32) + np.float32(0.5)) * np.float32(scale)
    return x + rng.integers(-2, 3, size).astype(np.float32) * np.spacing(x)


@pytest.mark.parametrize("layout", ["scalar", "per_channel", "full"])
def test_near_ties_round_as_x_times_the_reciprocal_for_every_scale_shape(layout):
    # A scale that is not a power of two: `x / s` and `x * (1/s)` differ by an ulp for
    # about a quarter of these inputs and round to neighbouring codes for many of them.
    # XLA rewrites a division by a broadcast scale into the multiplication but divides
    # by a scale of x's full shape: the codes depended on how the scale was given.
    x = near_ties(0.0371, 4096).reshape(512, 8)
    scale = {
        "scalar": np.float32(0.0371),
        "per_channel": np.full((1, 8), 0.0371, np.float32),
        "full": np.full(x.shape, 0.0371, np.float32),
    }[layout]
    divided = np.round(x / np.float32(0.0371))
    assert np.sum(divided != np.round(x * (np.float32(1) / np.float32(0.0371)))) > 100
    expected, mask = reference(x, scale, 0, -128, 127)
    cotangent = np.ones_like(x)
    y, grad = forward_and_vjp(jnp.asarray(x), jnp.asarray(scale), 0.0, -128, 127, cotangent)
    np.testing.assert_array_equal(np.asarray(y), expected)
    np.testing.assert_array_equal(np.asarray(grad), mask)
    np.testing.assert_array_equal(np.asarray(fake_quantize(x, scale, 0, -128, 127)), expected)
    codes = np.round(x * (np.float32(1) / np.broadcast_to(scale, x.shape)))
    np.testing.assert_array_equal(
        np.asarray(quantize(jnp.asarray(x), jnp.asarray(scale), 0.0, -128, 127)),
        np.clip(codes, -128, 127).astype(np.int32),
    )


def test_infinities_saturate_to_the_grid_ends_without_gradient_and_nan_stays_nan():
    x = np.array([np.inf, -np.inf, np.nan, 0.3], np.float32)
    scale, zero_point, qmin, qmax = np.float32(0.5), 2, -8, 7
    y, pullback = jax.vjp(lambda v: fake_quantize(v, scale, zero_point, qmin, qmax), x)
    np.testing.assert_array_equal(y[:2], [(qmax - zero_point) * 0.5, (qmin - zero_point) * 0.5])
    assert np.isnan(y[2]) and y[3] == 0.5
    (gradient,) = pullback(np.ones(4, np.float32))
    np.testing.assert_array_equal(np.asarray(gradient)[[0, 1, 3]], [0.0, 0.0, 1.0])


# Observer-derived quantizers and derivatives against float64 and closed forms.


def reference_fake_quantize(x, scale, zero_point, qmin, qmax):
    """`(clip(round(x/s) + zp, qmin, qmax) - zp) * s` in float64, round half to even."""
    x, scale = np.asarray(x, np.float64), np.asarray(scale, np.float64)
    codes = np.clip(np.round(x / scale) + zero_point, qmin, qmax)
    return (codes - zero_point) * scale


@pytest.mark.parametrize(
    ("symmetric", "per_channel", "channel_axis"),
    [(True, False, -1), (False, False, -1), (True, True, 0), (True, True, -1), (False, True, 1)],
)
def test_fake_quantizer_from_observer_matches_float64_reference(
    symmetric, per_channel, channel_axis
):
    cfg = QATConfig(bits=8, symmetric=symmetric, per_channel=per_channel, channel_axis=channel_axis)
    x = (RNG.normal(size=(6, 5)) * np.array([0.1, 1.0, 3.0, 0.5, 2.0]) + 0.3).astype(np.float32)
    quantizer = FakeQuantize.from_observer(QuantizationObserver.create(cfg).observe(x))

    axes = None if not per_channel else tuple(a for a in range(2) if a != channel_axis % 2)
    low = np.minimum(x.astype(np.float64).min(axis=axes, keepdims=True), 0.0)
    high = np.maximum(x.astype(np.float64).max(axis=axes, keepdims=True), 0.0)
    if symmetric:
        qmin, qmax = -128, 127
        scale = np.maximum(-low, high) / 127.5
        zero_point = np.zeros_like(scale)
    else:
        qmin, qmax = 0, 255
        scale = (high - low) / 255
        zero_point = np.clip(qmin - np.round(low / scale), qmin, qmax)
    got_scale, got_zero_point = quantizer.scale_zero_point()
    np.testing.assert_allclose(np.asarray(got_scale), scale.squeeze(), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(got_zero_point), zero_point.squeeze())

    expected = reference_fake_quantize(x, scale, zero_point, qmin, qmax)
    got = np.asarray(quantizer(x), np.float64)
    clean = away_from_ties(x, scale)
    np.testing.assert_allclose(got[clean], expected[clean], atol=1e-6)
    # A symmetric range puts its extreme on 127.5 (or -127.5): a tie, one code either way.
    step = np.broadcast_to(scale, x.shape)
    assert np.all(np.abs(got - expected)[~clean] <= step[~clean] * (1 + 1e-6))


def test_fake_quantize_rounds_half_to_even_and_clips_at_both_grid_ends():
    x = jnp.array([0.5, 1.5, 2.5, -0.5, -2.5, 6.5, 7.5, -7.5, -8.5, -9.0, 100.0])
    got = fake_quantize(x, 1.0, 0, -8, 7)
    np.testing.assert_array_equal(np.asarray(got), [0, 2, 2, 0, -2, 6, 7, -8, -8, -8, 7])
    # Affine: codes 0..15 with zero point 3, step 0.5.
    got = fake_quantize(jnp.array([-1.75, -1.5, -1.25, 0.0, 6.0, 6.25, 6.5]), 0.5, 3, 0, 15)
    np.testing.assert_array_equal(np.asarray(got), [-1.5, -1.5, -1.0, 0.0, 6.0, 6.0, 6.0])


def test_straight_through_gradient_is_one_on_the_grid_ends_and_zero_past_them():
    # Step 1: round(x) is exact, so the mask is 1[qmin <= round(x) + zp <= qmax].
    x = jnp.array([-9.0, -8.5, -8.0, -7.6, 0.0, 6.6, 7.0, 7.49, 7.5, 8.0])
    grad = jax.jit(jax.grad(lambda x: jnp.sum(fake_quantize(x, 1.0, 0, -8, 7) * 3.0)))(x)
    # -8.5 rounds to -8 (even): inside; 7.5 rounds to 8: outside.
    np.testing.assert_array_equal(np.asarray(grad), 3.0 * np.array([0, 1, 1, 1, 1, 1, 1, 1, 0, 0]))
    # With a zero point the mask shifts with it.
    x = jnp.array([-3.6, -3.4, 0.0, 12.4, 12.6])
    grad = jax.jit(jax.grad(lambda x: jnp.sum(fake_quantize(x, 1.0, 3, 0, 15))))(x)
    np.testing.assert_array_equal(np.asarray(grad), [0, 1, 1, 1, 0])


def test_second_derivative_of_fake_quantize_is_zero_not_the_estimator_applied_twice():
    # As the package docstring says: round has derivative 0 in the rule's formulas.
    x = jnp.array([0.12, -0.37, 5.0, -5.0, 0.25])

    def loss(x):
        return jnp.sum(fake_quantize(x, 0.1, 0, -8, 7) ** 2)

    np.testing.assert_array_equal(np.asarray(jax.jit(jax.hessian(loss))(x)), np.zeros((5, 5)))
    np.testing.assert_array_equal(
        np.asarray(jax.grad(loss)(x)),
        2 * np.asarray(fake_quantize(x, 0.1, 0, -8, 7)) * np.array([1, 1, 0, 0, 1]),
    )


@pytest.mark.parametrize(
    ("qmin", "qmax", "named"),
    [
        (0, 2**40, "qmax"),  # was JAX's OverflowError, deep in the clip
        (-(2**31), 2**31 - 1, "qmin"),  # fits int32, but float32 codes skip odd integers there
        (0, 2**24 + 1, "qmax"),
        (-(2**24) - 1, 0, "qmin"),
    ],
)
def test_a_grid_float32_codes_cannot_hold_is_refused_naming_its_ends(qmin, qmax, named):
    x = np.float32([0.0, 1.0])
    match = rf"{named} must be in \[-2\*\*24, 2\*\*24\].*got qmin={qmin}, qmax={qmax}"
    with pytest.raises(ValueError, match=match):
        fake_quantize(x, 1.0, 0, qmin, qmax)
    with pytest.raises(ValueError, match=match):
        lsq_fake_quantize(x, 1.0, 0, qmin, qmax)


def test_the_widest_grid_keeps_every_code_exact():
    # At +-2^24 every integer is a float32: codes round-trip as a float64 reference says.
    limit = 2**24
    ratios = np.array([-limit, -limit + 1, -3.0, 0.0, 5.0, limit - 1, limit], np.float64)
    x = ratios.astype(np.float32)  # scale 1: x/s is the code itself
    expected = np.clip(np.round(ratios), -limit, limit)
    np.testing.assert_array_equal(np.asarray(fake_quantize(x, 1.0, 0, -limit, limit)), expected)
