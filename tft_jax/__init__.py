"""tft-jax: the Temporal Fusion Transformer as Flax Linen modules.

Importing the package loads the model, its building blocks and the losses
only. Names from heavier modules (training: `Batch`, `make_optimizer`) are
imported on first access; `tft_jax.data`, `qat` and the CLI are never imported
here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tft_jax.attention import (
    AttentionHead,
    PositionalEncoding,
    TemporalSelfAttention,
    causal_mask,
    scaled_dot_product_attention,
    sinusoidal_encoding,
)
from tft_jax.config import TFTConfig
from tft_jax.gating import GateAddNorm, GatedLinearUnit, GatedResidualNetwork
from tft_jax.interpretable_attention import InterpretableMultiHeadAttention
from tft_jax.linear import Linear, VariableLinear
from tft_jax.losses import q_risk, quantile_loss
from tft_jax.model import TemporalFusionTransformer, TFTOutput
from tft_jax.variable_selection import VariableSelectionNetwork

if TYPE_CHECKING:
    from tft_jax.forecaster import Forecaster
    from tft_jax.train import Batch, make_optimizer

# Public names imported on first access: `name -> module`.
_LAZY = {
    "Forecaster": "tft_jax.forecaster",
    "Batch": "tft_jax.train",
    "make_optimizer": "tft_jax.train",
}


if not TYPE_CHECKING:  # a type checker would accept any misspelled name through it

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'tft_jax' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups skip __getattr__
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AttentionHead",
    "Batch",
    "Forecaster",
    "GateAddNorm",
    "GatedLinearUnit",
    "GatedResidualNetwork",
    "InterpretableMultiHeadAttention",
    "Linear",
    "PositionalEncoding",
    "TFTConfig",
    "TFTOutput",
    "TemporalFusionTransformer",
    "TemporalSelfAttention",
    "VariableLinear",
    "VariableSelectionNetwork",
    "causal_mask",
    "make_optimizer",
    "q_risk",
    "quantile_loss",
    "scaled_dot_product_attention",
    "sinusoidal_encoding",
]

__version__ = "0.2.0.dev3"
