"""`qat.convert(..., dtype=...)`: the int8 codes of the kernel a layer computing in `dtype` sees.

A bfloat16 compute dtype gives the codes of the bfloat16-rounded kernel the QAT
forward used; no dtype (or float32) quantizes the stored parameters; a dtype
that is not floating is refused.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from qat import QATConfig, QATModel, convert, from_fp32

IN_FEATURES, OUT_FEATURES = 24, 16


class BFloat16Dense(nn.Module):
    """One bias-free dense layer computing in bfloat16 with float32 parameters."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(
            OUT_FEATURES,
            use_bias=False,
            dtype=jnp.bfloat16,
            param_dtype=jnp.float32,
            dot_general_cls=self.dot_general_cls,
        )(x)


def bfloat16_setup() -> tuple[QATModel, dict[str, Any]]:
    """The QAT model of `BFloat16Dense` and its variables (a kernel inexact in bfloat16)."""
    model = BFloat16Dense()
    x = jnp.zeros((1, IN_FEATURES), jnp.float32)
    kernel = np.random.default_rng(3).normal(size=(IN_FEATURES, OUT_FEATURES))
    fp32 = {"params": {"Dense_0": {"kernel": jnp.asarray(kernel, jnp.float32)}}}
    qat_model = QATModel(model, QATConfig(bits=8))
    return qat_model, from_fp32(fp32, qat_model, x)


def numpy_bfloat16_codes(kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reference `(codes, scale)` of the kernel as the layer sees it (rounded to bfloat16).

    Per output channel `s = max|w| / 127` and `codes = round_half_even(w / s)`,
    in float32 as the forward computes them, from the bfloat16-rounded weights.
    """
    rounded = np.asarray(jnp.asarray(kernel).astype(jnp.bfloat16).astype(jnp.float32))
    scale = (np.max(np.abs(rounded), axis=0) / np.float32(127)).astype(np.float32)
    codes = np.round(rounded / scale).astype(np.int8)
    return codes, scale


def test_convert_with_bfloat16_dtype_gives_the_codes_of_the_rounded_kernel():
    _, variables = bfloat16_setup()
    kernel = np.asarray(variables["params"]["Dense_0"]["kernel"])
    want_codes, want_scale = numpy_bfloat16_codes(kernel)
    with pytest.warns(UserWarning, match="never saw a batch"):
        converted = convert(variables, dtype="bfloat16")
    codes = np.asarray(converted["params"]["Dense_0"]["kernel"])
    scale = np.asarray(converted["int8"]["Dense_0"]["dot_general"]["weight_scale"])
    # XLA may divide by 127 as a multiplication by its reciprocal: one float32 ulp.
    np.testing.assert_allclose(scale, want_scale, rtol=2.5e-7, atol=0)
    np.testing.assert_array_equal(codes, want_codes)


def test_convert_with_bfloat16_dtype_matches_the_kernel_the_qat_forward_used():
    # Uncalibrated observers leave the activation float, so the identity input
    # reads out the fake-quantized bfloat16 kernel the QAT forward contracted with.
    qat_model, variables = bfloat16_setup()
    identity = jnp.eye(IN_FEATURES, dtype=jnp.float32)
    used = np.asarray(qat_model.apply(variables, identity).astype(jnp.float32))
    with pytest.warns(UserWarning, match="never saw a batch"):
        converted = convert(variables, dtype=jnp.bfloat16)
    codes = np.asarray(converted["params"]["Dense_0"]["kernel"], np.float32)
    scale = np.asarray(converted["int8"]["Dense_0"]["dot_general"]["weight_scale"])
    dequantized = jnp.asarray(codes * scale).astype(jnp.bfloat16).astype(jnp.float32)
    np.testing.assert_array_equal(np.asarray(dequantized), used)


def test_convert_without_dtype_still_quantizes_the_stored_parameters():
    # The default is unchanged: float32 compute quantizes the float32 kernel itself.
    _, variables = bfloat16_setup()
    kernel = np.asarray(variables["params"]["Dense_0"]["kernel"])
    with pytest.warns(UserWarning, match="never saw a batch"):
        plain = convert(variables)
    with pytest.warns(UserWarning, match="never saw a batch"):
        float32 = convert(variables, dtype="float32")
    scale = (np.max(np.abs(kernel), axis=0) / np.float32(127)).astype(np.float32)
    np.testing.assert_array_equal(
        np.asarray(plain["params"]["Dense_0"]["kernel"]), np.round(kernel / scale)
    )
    jax.tree.map(np.testing.assert_array_equal, plain, float32)


@pytest.mark.parametrize("dtype", ["int8", "not-a-dtype", jnp.int32])
def test_convert_refuses_a_dtype_that_is_not_floating(dtype):
    _, variables = bfloat16_setup()
    with pytest.raises(TypeError, match="dtype must be a floating dtype"):
        convert(variables, dtype=dtype)
