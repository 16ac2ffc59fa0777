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

from qat import (
    Int8DotGeneral,
    QATConfig,
    QATModel,
    calibrate,
    convert,
    from_fp32,
    int8_apply,
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


def _float64_dot_general(lhs, rhs, dimension_numbers):
    """`lax.dot_general` as a float64 einsum: output `(batch..., lhs free..., rhs free...)`."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    lhs_letters = [next(letters) for _ in range(lhs.ndim)]
    rhs_letters = [next(letters) for _ in range(rhs.ndim)]
    lhs_paired, rhs_paired = (*lhs_contract, *lhs_batch), (*rhs_contract, *rhs_batch)
    for lhs_axis, rhs_axis in zip(lhs_paired, rhs_paired, strict=True):
        rhs_letters[rhs_axis] = lhs_letters[lhs_axis]
    lhs_free = [c for axis, c in enumerate(lhs_letters) if axis not in lhs_paired]
    rhs_free = [c for axis, c in enumerate(rhs_letters) if axis not in rhs_paired]
    output = [lhs_letters[axis] for axis in lhs_batch] + lhs_free + rhs_free
    spec = f"{''.join(lhs_letters)},{''.join(rhs_letters)}->{''.join(output)}"
    return np.einsum(spec, lhs, rhs)


def _positive_operands(lhs_shape, rhs_shape, seed):
    """Activations on the integer grid of `lhs_bounds=(-10, 245)` and large positive int8 codes.

    With scale 1 and zero point 10, every term `(q - zp) w` is at least 240 * 120, so a
    contraction of more than 74,565 terms exceeds int32 in every output.
    """
    rng = np.random.default_rng(seed)
    lhs = rng.integers(240, 246, size=lhs_shape).astype(np.float32)
    rhs = rng.integers(120, 128, size=rhs_shape).astype(np.int8)
    return lhs, rhs


@pytest.mark.parametrize(
    "lhs_shape, rhs_shape, dimension_numbers",
    [
        # Two adjacent axes, as nn.DenseGeneral(axis=(-2, -1)): 300 * 300 terms.
        ((2, 300, 300), (300, 300, 2), (((1, 2), (0, 1)), ((), ()))),
        # Two axes, not adjacent on the lhs, paired in reverse order on the rhs.
        ((300, 2, 300), (300, 3, 300), (((0, 2), (2, 0)), ((), ()))),
        # Three axes, permuted, beside a batch axis; the first alone (2) is short, the
        # other two (300 * 300) exceed the limit by themselves.
        ((2, 300, 2, 2, 300), (300, 2, 2, 300, 2), (((3, 1, 4), (2, 0, 3)), ((0,), (1,)))),
    ],
)
def test_int8_contraction_over_several_axes_counts_all_their_terms_per_int32_sum(
    lhs_shape, rhs_shape, dimension_numbers
):
    # The pieces were sized from the first contracted axis alone: every output here
    # summed more than 2^31 in one int32 accumulator and wrapped, silently.
    lhs, rhs = _positive_operands(lhs_shape, rhs_shape, seed=len(lhs_shape))
    (_, rhs_contract), _ = dimension_numbers
    terms = int(np.prod([rhs_shape[axis] for axis in rhs_contract]))
    assert terms * 240 * 120 > 2**31 - 1 and terms > max_int32_contraction(8)
    scale_shape = tuple(1 if axis in rhs_contract else n for axis, n in enumerate(rhs_shape))
    weight_scale = np.random.default_rng(1).uniform(0.5, 2.0, size=scale_shape)
    weight_scale = weight_scale.astype(np.float32)
    layer = Int8DotGeneral(config=QATConfig(bits=8), lhs_bounds=(-10.0, 245.0))
    got = layer.apply({"int8": {"weight_scale": weight_scale}}, lhs, rhs, dimension_numbers)
    # Independent reference: the float64 product of the dequantized operands (codes on a
    # grid of step 1, so the activation is its own dequantized value).
    expected = _float64_dot_general(
        lhs.astype(np.float64),
        rhs.astype(np.float64) * weight_scale.astype(np.float64),
        dimension_numbers,
    )
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=1e-6)


class TwoAxisHead(nn.Module):
    """A hooked `nn.DenseGeneral` contracting the last two input axes into one feature."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        return nn.DenseGeneral(
            1, axis=(-2, -1), use_bias=False, dot_general_cls=self.dot_general_cls
        )(x)


def test_int8_apply_of_a_layer_contracting_two_long_axes_matches_the_float_sum():
    # 300 * 300 terms of 255 * 127 each: int8_apply wrapped int32 and returned a wrong
    # value without a warning while the FP32 and fake-quantized forwards gave 90,000.
    x = np.ones((2, 300, 300), np.float32)
    x[1, :, ::2] = 0.0
    model = TwoAxisHead()
    qat_model = QATModel(model, QATConfig(bits=8))
    fp32 = {"params": {"DenseGeneral_0": {"kernel": jnp.ones((300, 300, 1), jnp.float32)}}}
    qat_vars = calibrate(qat_model, from_fp32(fp32, qat_model, x), [x])
    got = np.asarray(int8_apply(qat_model, convert(qat_vars), x), np.float64)
    expected = x.astype(np.float64).sum(axis=(1, 2))[:, None]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
