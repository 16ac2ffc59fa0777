"""`QATConfig.lsq_clip_from` reaches the QAT layers' learned step size, and loads old configs.

The learned step-size offset of a `QATModel` layer gets the gradient of the
clip rule its config names, checked against a float64 NumPy reference of
each formula; a config saved before the field existed still builds the same
`QATConfig`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from qat import QATConfig, QATModel, calibrate, from_fp32


class OneLayer(nn.Module):
    """One hooked `nn.Dense` without bias: its input is the model's."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        return nn.Dense(3, use_bias=False, dot_general_cls=self.dot_general_cls)(x)


RNG = np.random.default_rng(3)
CALIBRATION = (RNG.normal(size=(10, 4)) * 1.2).astype(np.float32)
UPSTREAM = RNG.normal(size=(12, 3)).astype(np.float32)


def activation_step(bits: int) -> tuple[float, float]:
    """`(scale, zero point)` of the moving-average observer after `CALIBRATION`, in float64."""
    qmin, qmax = 0, 2**bits - 1
    low = min(float(CALIBRATION.min()), 0.0)
    high = max(float(CALIBRATION.max()), 0.0)
    scale = float(np.float32((high - low) / (qmax - qmin)))
    return scale, float(np.clip(qmin - np.round(low / scale), qmin, qmax))


def inputs(bits: int) -> np.ndarray:
    """`CALIBRATION` wider, plus rows within half a step outside the grid and just inside it.

    (The exact ends are `test_lsq`'s, with a power-of-two step: here `x/s` is
    rounded in float32, which may land either side of an end.)
    """
    scale, zero_point = activation_step(bits)
    qmax = 2**bits - 1
    positions = np.array([qmax + 0.1, qmax + 0.3, qmax + 0.45, -0.1, -0.3, -0.45, qmax - 0.2, 0.2])
    crafted = ((positions - zero_point) * scale).astype(np.float32).reshape(2, 4)
    return np.concatenate([CALIBRATION * 1.5, crafted])


def reference_offset_gradient(bits: int, kernel: np.ndarray, clip_from: str) -> float:
    """d sum(UPSTREAM * y) / d scale_offset of one layer, from the LSQ formulas in float64."""
    scale, zero_point = activation_step(bits)
    qmin, qmax = 0, 2**bits - 1
    # Weights: per-channel symmetric fake quantization, scale max|w| / (2^(b-1) - 1).
    weight_qmax = 2 ** (bits - 1) - 1
    weight_scale = np.abs(kernel).max(axis=0, keepdims=True) / weight_qmax
    weights = np.clip(np.round(kernel / weight_scale), -weight_qmax - 1, weight_qmax) * weight_scale
    upstream = UPSTREAM.astype(np.float64) @ weights.T  # d loss / d fake-quantized activation
    x = inputs(bits).astype(np.float64)
    ratio = x / scale
    if clip_from == "unrounded":  # eq. 3: the unrounded position, its ends clipped
        below, above = ratio + zero_point <= qmin, ratio + zero_point >= qmax
    else:  # PyTorch's: the rounded position off the grid
        below, above = np.round(ratio) + zero_point < qmin, np.round(ratio) + zero_point > qmax
    d_step = np.where(
        below, qmin - zero_point, np.where(above, qmax - zero_point, np.round(ratio) - ratio)
    )
    grad_scale = 1 / np.sqrt(x.size * qmax)
    return float(np.sum(upstream * d_step) * grad_scale)


@functools.cache
def offset_gradient(bits: int, clip_from: str) -> tuple[float, np.ndarray]:
    """`(d loss / d scale_offset, float64 kernel)` of the QAT model with that clip rule."""
    model = OneLayer()
    fp32 = model.init(jax.random.key(1), CALIBRATION)
    config = QATConfig(bits=bits, learnable_scale=True, lsq_clip_from=clip_from)
    qat_model = QATModel(model, config)
    variables = calibrate(qat_model, from_fp32(fp32, qat_model, CALIBRATION), [CALIBRATION])
    x = inputs(bits)

    def loss(quant_params):
        return jnp.sum(qat_model.apply({**variables, "quant_params": quant_params}, x) * UPSTREAM)

    gradient = jax.grad(loss)(variables["quant_params"])
    kernel = np.asarray(fp32["params"]["Dense_0"]["kernel"], np.float64)
    return float(jax.tree.leaves(gradient)[0]), kernel


@pytest.mark.parametrize("clip_from", ["rounded", "unrounded"])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_the_layer_step_size_gets_the_gradient_of_its_configured_clip_rule(bits, clip_from):
    got, kernel = offset_gradient(bits, clip_from)
    expected = reference_offset_gradient(bits, kernel, clip_from)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    # The rules differ on these inputs: the config is what picked the formula.
    other = reference_offset_gradient(
        bits, kernel, "unrounded" if clip_from == "rounded" else "rounded"
    )
    assert abs(other - expected) > 1e-3 * max(abs(expected), 1e-3)


def test_a_config_recorded_before_the_field_existed_builds_the_default():
    # A run folder's summary.qat.qat_config written before lsq_clip_from lacks it.
    recorded = {
        key: value
        for key, value in dataclasses.asdict(QATConfig(bits=4, learnable_scale=True)).items()
        if key != "lsq_clip_from"
    }
    loaded = QATConfig(**recorded)
    assert loaded == QATConfig(bits=4, learnable_scale=True)
    assert loaded.lsq_clip_from == "rounded"
    assert dataclasses.asdict(QATConfig())["lsq_clip_from"] == "rounded"
    assert QATConfig(learnable_scale=True, lsq_clip_from="unrounded") != QATConfig(
        learnable_scale=True
    )
