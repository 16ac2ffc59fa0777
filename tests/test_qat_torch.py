"""Cross-check against PyTorch's fake quantizers, LSQ and observers (needs the 'peers' extra)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from qat import FakeQuantize, QATConfig, QuantizationObserver, fake_quantize, lsq_fake_quantize

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.peers

RNG = np.random.default_rng(0)


def torch_forward_and_grad(function, x, *args):
    tensor = torch.tensor(x, requires_grad=True)
    y = function(tensor, *args)
    cotangent = torch.linspace(0.5, 1.5, y.numel()).reshape(y.shape)
    (y * cotangent).sum().backward()
    return y.detach().numpy(), tensor.grad.numpy(), cotangent.numpy()


def jax_forward_and_grad(function, x, cotangent):
    y, pullback = jax.vjp(function, jnp.asarray(x))
    return np.asarray(y), np.asarray(pullback(jnp.asarray(cotangent))[0])


@pytest.mark.parametrize(
    ("qmin", "qmax", "zero_point"), [(-128, 127, 0), (0, 255, 100), (0, 15, 3)]
)
def test_per_tensor_matches_torch_on_ties_bounds_and_random_values(qmin, qmax, zero_point):
    scale = 0.0625  # a power of two: torch's x * (1/s) and our x / s are then both exact
    half_steps = np.arange(2 * (qmin - zero_point - 3), 2 * (qmax - zero_point + 3) + 1)
    x = np.concatenate([half_steps / 2 * scale, RNG.normal(scale=5.0, size=64)]).astype(np.float32)
    expected, expected_grad, cotangent = torch_forward_and_grad(
        torch.fake_quantize_per_tensor_affine, x, scale, zero_point, qmin, qmax
    )
    y, grad = jax_forward_and_grad(
        lambda x: fake_quantize(x, scale, zero_point, qmin, qmax), x, cotangent
    )
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(grad, expected_grad)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_per_channel_matches_torch_on_each_axis(axis):
    x = RNG.normal(scale=3.0, size=(3, 4, 5)).astype(np.float32)
    channels = x.shape[axis]
    scale = (2.0 ** -RNG.integers(2, 6, channels)).astype(np.float32)
    zero_point = RNG.integers(0, 256, channels).astype(np.int32)
    expected, expected_grad, cotangent = torch_forward_and_grad(
        torch.fake_quantize_per_channel_affine,
        x,
        torch.tensor(scale),
        torch.tensor(zero_point),
        axis,
        0,
        255,
    )
    cfg = QATConfig(symmetric=False, per_channel=True, channel_axis=axis)
    quantizer = FakeQuantize.create(cfg, scale=scale, zero_point=zero_point)
    y, grad = jax_forward_and_grad(quantizer, x, cotangent)
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(grad, expected_grad)


def near_ties(scale: np.float32, size: int) -> np.ndarray:
    """float32 inputs within two ulps of `(k + 1/2) * scale`, `k` in [-100, 100)."""
    x = (RNG.integers(-100, 100, size).astype(np.float32) + np.float32(0.5)) * scale
    return x + RNG.integers(-2, 3, size).astype(np.float32) * np.spacing(x)


def test_near_ties_round_as_torch_with_a_scale_that_is_not_a_power_of_two():
    # `x / s` and torch's `x * (1/s)` round apart for many of these inputs: our codes
    # are torch's, per tensor, per channel (also eagerly, where jnp broadcasts the
    # scale before dividing) and for the learnable step size, forward and gradient.
    scale = np.float32(0.0371)
    x = near_ties(scale, 2048)
    assert np.sum(np.round(x / scale) != np.round(x * (np.float32(1) / scale))) > 50
    expected = torch.fake_quantize_per_tensor_affine(torch.tensor(x), float(scale), 0, -128, 127)
    np.testing.assert_array_equal(np.asarray(fake_quantize(x, scale, 0, -128, 127)), expected)
    per_channel = torch.fake_quantize_per_channel_affine(
        torch.tensor(x.reshape(256, 8)),
        torch.full((8,), float(scale)),
        torch.zeros(8, dtype=torch.int32),
        1,
        -128,
        127,
    ).numpy()
    channel_scales = np.full((1, 8), scale)
    np.testing.assert_array_equal(
        np.asarray(fake_quantize(x.reshape(256, 8), channel_scales, 0, -128, 127)), per_channel
    )
    x_t = torch.tensor(x, requires_grad=True)
    scale_t = torch.tensor([float(scale)], requires_grad=True)
    y_t = torch._fake_quantize_learnable_per_tensor_affine(
        x_t, scale_t, torch.tensor([0.0]), -128, 127, 1.0
    )
    y_t.sum().backward()
    np.testing.assert_array_equal(
        np.asarray(lsq_fake_quantize(x, scale, 0.0, -128, 127, 1.0)), y_t.detach().numpy()
    )
    step_grad = jax.grad(
        lambda s: jnp.sum(lsq_fake_quantize(jnp.asarray(x), s, 0.0, -128, 127, 1.0))
    )(jnp.float32(scale))
    np.testing.assert_allclose(float(step_grad), float(scale_t.grad[0]), rtol=1e-4)


@pytest.mark.parametrize(("qmin", "qmax", "zero_point"), [(-8, 7, 0), (0, 255, 60)])
def test_lsq_matches_torch_learnable_fake_quantize(qmin, qmax, zero_point):
    x = RNG.normal(scale=4.0, size=50).astype(np.float32)
    scale, grad_factor = 0.125, 0.3
    x_t = torch.tensor(x, requires_grad=True)
    scale_t = torch.tensor([scale], requires_grad=True)
    zero_point_t = torch.tensor([float(zero_point)], requires_grad=True)
    y_t = torch._fake_quantize_learnable_per_tensor_affine(
        x_t, scale_t, zero_point_t, qmin, qmax, grad_factor
    )
    cotangent = np.linspace(-1.0, 1.0, 50, dtype=np.float32)
    (y_t * torch.tensor(cotangent)).sum().backward()

    def weighted(x, s, zp):
        return jnp.sum(cotangent * lsq_fake_quantize(x, s, zp, qmin, qmax, grad_factor))

    y = lsq_fake_quantize(x, scale, zero_point, qmin, qmax, grad_factor)
    dx, ds, dzp = jax.grad(weighted, argnums=(0, 1, 2))(
        jnp.asarray(x), jnp.float32(scale), jnp.float32(zero_point)
    )
    np.testing.assert_array_equal(np.asarray(y), y_t.detach().numpy())
    np.testing.assert_array_equal(np.asarray(dx), x_t.grad.numpy())
    np.testing.assert_allclose(float(ds), float(scale_t.grad[0]), rtol=1e-4)
    np.testing.assert_allclose(float(dzp), float(zero_point_t.grad[0]), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("kind", "symmetric"),
    [("minmax", False), ("minmax", True), ("moving_average", False), ("moving_average", True)],
)
def test_observer_qparams_match_torch_observers(kind, symmetric):
    from torch.ao.quantization import MinMaxObserver, MovingAverageMinMaxObserver

    observer_cls = MinMaxObserver if kind == "minmax" else MovingAverageMinMaxObserver
    torch_observer = observer_cls(
        dtype=torch.qint8 if symmetric else torch.quint8,
        qscheme=torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine,
    )
    observer = QuantizationObserver.create(QATConfig(symmetric=symmetric, observer=kind))
    for shift in (0.5, -1.0, 2.0):
        batch = (RNG.normal(size=(6, 7)) + shift).astype(np.float32)
        torch_observer(torch.tensor(batch))
        observer = observer.observe(batch)
    expected_scale, expected_zero_point = torch_observer.calculate_qparams()
    scale, zero_point = observer.qparams()
    np.testing.assert_allclose(float(scale), float(expected_scale), rtol=1e-6)
    assert int(zero_point) == int(expected_zero_point)


def test_per_channel_observer_matches_torch():
    from torch.ao.quantization import PerChannelMinMaxObserver

    x = RNG.normal(size=(5, 4, 3)).astype(np.float32)
    torch_observer = PerChannelMinMaxObserver(ch_axis=1, dtype=torch.quint8)
    torch_observer(torch.tensor(x))
    expected_scale, expected_zero_point = torch_observer.calculate_qparams()
    cfg = QATConfig(symmetric=False, per_channel=True, channel_axis=1)
    scale, zero_point = QuantizationObserver.create(cfg).observe(x).qparams()
    np.testing.assert_allclose(np.asarray(scale), expected_scale.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(zero_point), expected_zero_point.numpy())


@pytest.mark.peers
@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("symmetric", [True, False])
def test_observer_qparams_match_torch_at_every_bit_width(bits, symmetric):
    torch = pytest.importorskip("torch")
    from torch.ao.quantization import MinMaxObserver

    cfg = QATConfig(bits=bits, symmetric=symmetric)
    torch_observer = MinMaxObserver(
        dtype=torch.qint8 if symmetric else torch.quint8,
        qscheme=torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine,
        quant_min=cfg.qmin,
        quant_max=cfg.qmax,
    )
    observer = QuantizationObserver.create(cfg)
    for batch in (
        np.full((3, 4), 2.5, np.float32),
        np.zeros((3, 4), np.float32),
        (RNG.normal(size=(3, 4)) * 2 - 0.5).astype(np.float32),
    ):
        torch_observer(torch.tensor(batch))
        observer = observer.observe(batch)
    expected_scale, expected_zero_point = torch_observer.calculate_qparams()
    scale, zero_point = observer.qparams()
    np.testing.assert_allclose(float(scale), float(expected_scale), rtol=1e-6)
    assert int(zero_point) == int(expected_zero_point)


@pytest.mark.peers
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_per_channel_lsq_matches_torch_learnable_per_channel(bits):
    torch = pytest.importorskip("torch")
    qmin, qmax = 0, 2**bits - 1
    x = (RNG.normal(size=(6, 3)) * 2).astype(np.float32)
    scale = np.array([0.07, 0.3, 0.011], np.float32)
    zero_point = RNG.integers(qmin, qmax + 1, 3).astype(np.float32)
    cotangent = RNG.normal(size=x.shape).astype(np.float32)
    grad_factor = 0.37
    x_t, scale_t, zero_point_t = (
        torch.tensor(value, requires_grad=True) for value in (x, scale, zero_point)
    )
    y_t = torch._fake_quantize_learnable_per_channel_affine(
        x_t, scale_t, zero_point_t, 1, qmin, qmax, grad_factor
    )
    (y_t * torch.tensor(cotangent)).sum().backward()

    def weighted(x, s, zp):
        return jnp.sum(cotangent * lsq_fake_quantize(x, s[None], zp[None], qmin, qmax, grad_factor))

    args = (jnp.asarray(x), jnp.asarray(scale), jnp.asarray(zero_point))
    y = lsq_fake_quantize(args[0], args[1][None], args[2][None], qmin, qmax, grad_factor)
    dx, ds, dzp = jax.grad(weighted, argnums=(0, 1, 2))(*args)
    np.testing.assert_array_equal(np.asarray(y), y_t.detach().numpy())
    np.testing.assert_array_equal(np.asarray(dx), x_t.grad.numpy())
    np.testing.assert_allclose(np.asarray(ds), scale_t.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dzp), zero_point_t.grad.numpy(), rtol=1e-4, atol=1e-6)
