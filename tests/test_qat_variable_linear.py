"""The int8 `VariableLinear` in a QAT model against a float64 reference on every grid and range.

The per-variable kernel `(V, I, F)` (one weight scale per `(V, F)`), both
variable layouts, every bit width and one-sided or constant activation ranges
(zero point at either end of the grid, where the int8 path's zero-point
correction `(zp - 2^(b-1)) * sum_k w_k` is largest) are checked in both the
fake-quantized and the integer forward.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import linen as nn

from qat import QATConfig, QATModel, calibrate, convert, from_fp32, int8_apply
from tft_jax.linear import VariableLinear

EPS32 = float(np.finfo(np.float32).eps)


class PerVariable(nn.Module):
    """One `VariableLinear(V=3, F=5)`: `(B, T, 3, I) -> (B, T, 3, 5)` (or variable-major)."""

    dot_general_cls: object = None
    variable_major: bool = False

    @nn.compact
    def __call__(self, x):
        return VariableLinear(
            3, 5, dot_general_cls=self.dot_general_cls, variable_major=self.variable_major
        )(x)


def reference(x_calibration, x, kernel, bias, bits, variable_major):
    """Float64 fake quantization of both operands, then the per-variable contraction."""
    w_qmax = 2 ** (bits - 1) - 1
    w_scale = np.maximum(
        (np.abs(kernel).max(1, keepdims=True) / np.float32(w_qmax)).astype(np.float32), EPS32
    ).astype(np.float64)
    kernel_q = np.clip(np.round(kernel / w_scale), -w_qmax - 1, w_qmax) * w_scale
    a_qmax = 2**bits - 1
    low = min(float(x_calibration.min()), 0.0)
    high = max(float(x_calibration.max()), 0.0)
    a_scale = float(max(np.float32(np.float32(high - low) / np.float32(a_qmax)), EPS32))
    zero_point = np.clip(-np.round(low / a_scale), 0, a_qmax)
    x_q = (np.clip(np.round(x / a_scale) + zero_point, 0, a_qmax) - zero_point) * a_scale
    per_variable = x_q if variable_major else np.moveaxis(x_q, -2, 0)
    y = np.einsum("v...i,vio->v...o", per_variable, kernel_q)
    if variable_major:
        return y + bias[:, None, None, :]
    return np.moveaxis(y, 0, -2) + bias


@pytest.mark.parametrize(
    ("bits", "variable_major", "kind"),
    [
        (8, False, "two-sided"),
        (8, True, "positive"),
        (8, False, "negative"),
        (8, True, "constant"),
        (4, True, "two-sided"),
        (4, False, "positive"),
        (2, False, "negative"),
        (3, True, "two-sided"),
    ],
)
def test_int8_variable_linear_matches_a_float64_reference(bits, variable_major, kind):
    rng = np.random.default_rng(bits * 10 + variable_major)
    shape = (3, 4, 2, 6) if variable_major else (4, 2, 3, 6)
    x = rng.normal(size=shape).astype(np.float32) * 3
    x = {
        "two-sided": x,
        "positive": np.abs(x),
        "negative": -np.abs(x),
        "constant": np.full(shape, 2.5, np.float32),
    }[kind]
    model = PerVariable(variable_major=variable_major)
    fp32 = model.init(jax.random.key(bits), x)
    qat_model = QATModel(model, QATConfig(bits=bits))
    calibrated = calibrate(qat_model, from_fp32(fp32, qat_model, x), [x])
    # Beyond the calibrated range too: both forwards clip there.
    test_x = x * np.float32(1.3) + np.float32(0.1)

    fake = np.asarray(qat_model.apply(calibrated, test_x), np.float64)
    integer = np.asarray(int8_apply(qat_model, convert(calibrated), test_x), np.float64)
    params = jax.tree.map(lambda a: np.asarray(a, np.float64), fp32["params"]["VariableLinear_0"])
    expected = reference(
        x.astype(np.float64), test_x.astype(np.float64), params["kernel"], params["bias"],
        bits, variable_major,
    )  # fmt: skip
    tolerance = 1e-5 * np.abs(expected).max() + 1e-6
    np.testing.assert_allclose(fake, expected, rtol=0, atol=tolerance)
    np.testing.assert_allclose(integer, expected, rtol=0, atol=tolerance)
