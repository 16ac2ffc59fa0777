"""Straight-through estimators: exact in reverse mode, a clear error in forward mode."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from qat import FakeQuantize, QATConfig, fake_quantize, lsq_fake_quantize
from qat._forward_mode import ForwardModeError

SCALE, QMIN, QMAX = 0.1, -8, 7
# Points on both sides of each grid bound: -0.85 rounds to -8 (in), -0.86 to -9 (out).
X = np.array([-1.0, -0.86, -0.85, -0.8, 0.0, 0.33, 0.7, 0.74, 0.75, 1.0], np.float32)


def numpy_ste_mask(x):
    # float32 division, as the quantizer computes (-0.85 / 0.1 is -8.4999995 there).
    position = np.round(x.astype(np.float32) / np.float32(SCALE))
    return ((position >= QMIN) & (position <= QMAX)).astype(np.float32)


def quantizer(name):
    if name == "fake_quantize":
        return lambda x: fake_quantize(x, SCALE, 0, QMIN, QMAX)
    return lambda x: lsq_fake_quantize(x, SCALE, 0.0, QMIN, QMAX)


FORWARD_MODES = {
    "jvp": lambda f, x: jax.jvp(f, (x,), (jnp.ones_like(x),)),
    "jit_of_jvp": lambda f, x: jax.jit(lambda x: jax.jvp(f, (x,), (x,)))(x),
    "jvp_of_jit": lambda f, x: jax.jvp(jax.jit(f), (x,), (x,)),
    "jacfwd": lambda f, x: jax.jacfwd(f)(x),
    "linearize": lambda f, x: jax.linearize(f, x)[1](x),
}


@pytest.mark.parametrize("mode", FORWARD_MODES)
@pytest.mark.parametrize("name", ["fake_quantize", "lsq_fake_quantize"])
def test_forward_mode_raises_naming_the_quantizer_and_reverse_mode(name, mode):
    message = rf"{name} has a straight-through gradient.*use reverse mode \(jax.grad/vjp\)"
    with pytest.raises(ForwardModeError, match=message):
        FORWARD_MODES[mode](quantizer(name), jnp.asarray(X))


def test_forward_mode_error_is_a_type_error():
    assert issubclass(ForwardModeError, TypeError)


def sum_fn(name):
    f = quantizer(name)
    return lambda x: jnp.sum(f(x) * jnp.arange(1.0, x.shape[-1] + 1))


@pytest.mark.parametrize("name", ["fake_quantize", "lsq_fake_quantize"])
def test_reverse_mode_is_the_exact_clipped_ste_under_jit_vmap_and_scan(name):
    expected = numpy_ste_mask(X) * np.arange(1.0, X.size + 1)
    f = sum_fn(name)
    np.testing.assert_array_equal(jax.grad(f)(X), expected)
    np.testing.assert_array_equal(jax.jit(jax.grad(f))(X), expected)
    batch = np.stack([X, X / 2])
    np.testing.assert_array_equal(
        jax.vmap(jax.grad(f))(batch),
        np.stack([expected, numpy_ste_mask(X / 2) * np.arange(1.0, X.size + 1)]),
    )

    def scanned(x):  # the same quantizer twice in a scan: d/dx = mask(x) * mask(f(x))
        final, _ = jax.lax.scan(lambda c, _: (quantizer(name)(c), None), x, None, length=2)
        return jnp.sum(final)

    np.testing.assert_array_equal(jax.jit(jax.grad(scanned))(X), numpy_ste_mask(X))


def test_fake_quantize_module_is_differentiable_with_respect_to_its_fields():
    fq = FakeQuantize.create(QATConfig(bits=4, symmetric=False), scale=0.1, zero_point=3)
    assert fq.zero_point.dtype == jnp.float32 and float(fq.zero_point) == 3.0
    x = np.linspace(-0.5, 1.5, 9).astype(np.float32)
    grads = jax.grad(lambda q, x: jnp.sum(q(x)), argnums=(0, 1))(fq, x)
    field_grads, x_grad = grads
    # The estimator gives the qparams zero gradient, x the in-range mask.
    assert float(field_grads.scale) == 0.0 and float(field_grads.zero_point) == 0.0
    position = np.round(x / np.float32(0.1)) + 3
    np.testing.assert_array_equal(x_grad, ((position >= 0) & (position <= 15)).astype(np.float32))
    not_an_integer = r"zero_point must be an integer in \[qmin, qmax\] = \[0, 255\], got \[2\.5\]"
    with pytest.raises(ValueError, match=not_an_integer):
        FakeQuantize.create(QATConfig(symmetric=False), scale=0.1, zero_point=2.5)


def test_fake_quantize_from_observer_keeps_the_zero_point_as_a_float_of_its_value():
    from qat import QuantizationObserver

    observer = QuantizationObserver.create(QATConfig(symmetric=False)).observe(
        np.array([-1.0, 3.0], np.float32)
    )
    _, observed_zero_point = observer.qparams()
    fq = FakeQuantize.from_observer(observer)
    assert fq.zero_point.dtype == jnp.float32
    assert float(fq.zero_point) == int(observed_zero_point)
    jax.grad(functools.partial(lambda q, x: jnp.sum(q(x)), x=np.ones(3, np.float32)))(fq)
