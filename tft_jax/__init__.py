"""tft-jax: the Temporal Fusion Transformer as Flax Linen modules.

Importing the package loads the model and the losses only; training
(`tft_jax.train`), data (`tft_jax.data`) and the CLI are imported on demand.
"""

from tft_jax.attention import (
    AttentionHead,
    PositionalEncoding,
    TemporalSelfAttention,
    causal_mask,
    scaled_dot_product_attention,
    sinusoidal_encoding,
)
from tft_jax.config import TFTConfig
from tft_jax.losses import q_risk, quantile_loss
from tft_jax.model import TemporalFusionTransformer, TFTOutput

__all__ = [
    "AttentionHead",
    "PositionalEncoding",
    "TFTConfig",
    "TFTOutput",
    "TemporalFusionTransformer",
    "TemporalSelfAttention",
    "causal_mask",
    "q_risk",
    "quantile_loss",
    "scaled_dot_product_attention",
    "sinusoidal_encoding",
]

__version__ = "0.1.0"
