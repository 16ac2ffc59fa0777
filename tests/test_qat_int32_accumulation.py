"""int8 contractions accumulate in int32: contractions too long for one int32 sum are split.

`max_int32_contraction(bits)` bounds the worst-case sum of one piece; a longer
contraction (or one split into small pieces) still matches a float64 reference
and the fake-quantized forward.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from qat import QATConfig, QATModel, calibrate, convert, from_fp32, int8_apply
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
