"""Quantization-aware training and int8 inference for the TFT and any Linen model.

Fake quantization with a straight-through gradient (`fake_quantize`,
`FakeQuantize`), range observers (`QuantizationObserver`), learned step size
(`lsq_fake_quantize`), the contraction modules that plug into a dense layer's
`dot_general_cls` hook (`QATDotGeneral`, `Int8DotGeneral`, and the factories
`qat_dot_general`, `int8_dot_general`), the QAT wrappers
(`QATModel` for any Linen model with that hook, `QATTemporalFusionTransformer`)
and the conversion to int8 (`from_fp32`, `calibrate`, `convert`, `int8_apply`,
`model_size`).

The straight-through estimators are `jax.custom_jvp` rules that only reverse
mode accepts: differentiate with `jax.grad` or `jax.vjp`. Forward mode
(`jax.jvp`, `jax.jacfwd`, the function `jax.linearize` returns) raises `ForwardModeError` (a
`TypeError`) naming `fake_quantize` or `lsq_fake_quantize`. A second
derivative (`jax.hessian`, `grad` of `grad`) does not apply the estimator
twice: it differentiates the rule's formulas, where `round` has derivative
zero. For `fake_quantize` w.r.t. `x` that is zero (the Hessian of
`sum(fake_quantize(x)**2)` is 0, not `2 * mask`); the LSQ step-size rule
depends on the step size, so its second derivative is not zero.
"""

from qat._forward_mode import ForwardModeError
from qat.config import QATConfig
from qat.dot_general import Int8DotGeneral, QATDotGeneral, int8_dot_general, qat_dot_general
from qat.fake_quant import FakeQuantize, fake_quantize
from qat.lsq import lsq_fake_quantize
from qat.model import (
    QATModel,
    QATTemporalFusionTransformer,
    calibrate,
    convert,
    from_fp32,
    int8_apply,
    model_size,
    quantized_layers,
)
from qat.observers import QuantizationObserver

__all__ = [
    "FakeQuantize",
    "ForwardModeError",
    "Int8DotGeneral",
    "QATConfig",
    "QATDotGeneral",
    "QATModel",
    "QATTemporalFusionTransformer",
    "QuantizationObserver",
    "calibrate",
    "convert",
    "fake_quantize",
    "from_fp32",
    "int8_apply",
    "int8_dot_general",
    "lsq_fake_quantize",
    "model_size",
    "qat_dot_general",
    "quantized_layers",
]
