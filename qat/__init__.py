"""Quantization-aware training and int8 inference for the TFT.

Fake quantization with a straight-through gradient (`fake_quantize`,
`FakeQuantize`), range observers (`QuantizationObserver`), learned step size
(`lsq_fake_quantize`), the contraction modules that plug into
`tft_jax.linear` (`QATDotGeneral`, `Int8DotGeneral`), and the quantized TFT
with its conversion to int8 (`QATTemporalFusionTransformer`, `from_fp32`,
`calibrate`, `convert`, `int8_apply`, `model_size`).
"""

from qat.config import QATConfig
from qat.dot_general import Int8DotGeneral, QATDotGeneral
from qat.fake_quant import FakeQuantize, fake_quantize
from qat.lsq import lsq_fake_quantize
from qat.model import (
    QATTemporalFusionTransformer,
    calibrate,
    convert,
    from_fp32,
    int8_apply,
    model_size,
)
from qat.observers import QuantizationObserver

__all__ = [
    "FakeQuantize",
    "Int8DotGeneral",
    "QATConfig",
    "QATDotGeneral",
    "QATTemporalFusionTransformer",
    "QuantizationObserver",
    "calibrate",
    "convert",
    "fake_quantize",
    "from_fp32",
    "int8_apply",
    "lsq_fake_quantize",
    "model_size",
]
