"""Second QAT review: int32 accumulation of long contractions, moving averages near float32 max,
and low bit widths against PyTorch and float64 references."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from qat import (
    QATConfig,
    QATModel,
    QuantizationObserver,
    calibrate,
    convert,
    from_fp32,
    int8_apply,
    lsq_fake_quantize,
)
from qat import dot_general as qat_dot_general_module
from qat.dot_general import max_int32_contraction
from tft_jax import VariableLinear

RNG = np.random.default_rng(4)


class SingleDense(nn.Module):
    """One hooked bias-free `nn.Dense` with a single output feature."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        return nn.Dense(1, use_bias=False, dot_general_cls=self.dot_general_cls)(x)


def test_int8_contraction_longer_than_int32_range_matches_float64_reference():
    # 8 bits, activation range [0, 1] (zero point 0, code 255 for a 1), kernel of ones
    # (code 127): each term of sum_k (q_k - zp) w_k is 255 * 127, so 70,000 of them
    # exceed int32 and wrapped to a negative output before the sum was split.
    length = 70_000
    assert length > max_int32_contraction(8)
    assert length * 255 * 127 > 2**31 - 1
    x = np.ones((2, length), np.float32)
    x[0, 0] = 0.0
    x[1, ::2] = 0.0
    model = SingleDense()
    qat_model = QATModel(model, QATConfig(bits=8))
    fp32 = {"params": {"Dense_0": {"kernel": jnp.ones((length, 1), jnp.float32)}}}
    qat_vars = calibrate(qat_model, from_fp32(fp32, qat_model, x), [x])
    got = np.asarray(int8_apply(qat_model, convert(qat_vars), x), np.float64)
    # Codes times scales: (255 * 1/255) * (127 * 1/127) = 1 per nonzero input.
    expected = x.astype(np.float64).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    np.testing.assert_allclose(got, np.asarray(qat_model.apply(qat_vars, x)), rtol=1e-5)


class PerVariable(nn.Module):
    """A hooked `VariableLinear`: a contraction with a batch (variable) axis."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        return VariableLinear(3, 4, dot_general_cls=self.dot_general_cls)(x)


def test_int8_contraction_split_into_pieces_equals_the_whole(monkeypatch):
    # The split path (pieces along the contracted axis, here with a variable batch axis
    # and a zero point that is not the shift) must give what one int32 contraction gives.
    x = (RNG.normal(size=(5, 3, 10)) + 0.7).astype(np.float32)
    model = PerVariable()
    qat_model = QATModel(model, QATConfig(bits=6))
    fp32 = jax.jit(model.init)(jax.random.PRNGKey(0), x)
    int8_vars = convert(calibrate(qat_model, from_fp32(fp32, qat_model, x), [x]))
    whole = np.asarray(int8_apply(qat_model, int8_vars, x))
    monkeypatch.setattr(qat_dot_general_module, "max_int32_contraction", lambda bits: 3)
    pieces = np.asarray(int8_apply(qat_model, int8_vars, x))
    np.testing.assert_allclose(pieces, whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bits", range(2, 9))
def test_max_int32_contraction_bounds_the_worst_case_sum(bits):
    # Worst case per term: |q - zp| = 2^b - 1 times |w| = 128 (any int8 code).
    limit = max_int32_contraction(bits)
    worst_term = (2**bits - 1) * 128
    assert limit * worst_term <= 2**31 - 1 < (limit + 1) * worst_term


def test_moving_average_of_ranges_near_float32_max_stays_finite():
    # min_val + c * (new - min_val) overflowed to +inf for new - min_val > 3.4e38, and a
    # min_val of +inf reads as "nothing observed": the negative side of the range vanished.
    cfg = QATConfig(symmetric=False, observer="moving_average", averaging_constant=0.01)
    observer = QuantizationObserver.create(cfg)
    observer = observer.observe(np.array([-3e38, 3e38], np.float32))
    observer = observer.observe(np.array([3e38, 3e38], np.float32))
    expected_min = -3e38 + 0.01 * (3e38 - -3e38)
    np.testing.assert_allclose(float(observer.min_val), expected_min, rtol=1e-6)
    np.testing.assert_allclose(float(observer.max_val), 3e38, rtol=1e-6)
    scale, zero_point = observer.qparams()
    expected_scale = (3e38 - expected_min) / 255
    np.testing.assert_allclose(float(scale), expected_scale, rtol=1e-5)
    assert int(zero_point) == round(-expected_min / expected_scale)


def test_moving_average_of_ordinary_ranges_keeps_the_difference_form():
    # The overflow branch must not change ordinary updates: m + c * (new - m) in float32.
    cfg = QATConfig(symmetric=False, observer="moving_average", averaging_constant=0.3)
    observer = QuantizationObserver.create(cfg)
    batches = [RNG.normal(size=(5, 3)).astype(np.float32) * (i + 1) for i in range(4)]
    low = high = None
    for batch in batches:
        observer = observer.observe(batch)
        new_low, new_high = np.float32(batch.min()), np.float32(batch.max())
        if low is None:
            low, high = new_low, new_high
        else:
            low = np.float32(low + np.float32(0.3) * (new_low - low))
            high = np.float32(high + np.float32(0.3) * (new_high - high))
    assert float(observer.min_val) == pytest.approx(float(low), rel=1e-6)
    assert float(observer.max_val) == pytest.approx(float(high), rel=1e-6)


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
