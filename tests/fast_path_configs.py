"""The small TFT configuration both fast-path test files build their models from."""

from __future__ import annotations

from typing import Any

from tft_jax import TFTConfig


def small_config(**overrides: Any) -> TFTConfig:
    """Every input kind (statics, known with history, observed), dropout on, small widths."""
    fields = dict(
        num_static_features=2,
        num_known_features=3,
        num_observed_features=4,
        hidden_dim=8,
        num_heads=2,
        sequence_length=6,
        prediction_horizon=3,
        dropout_rate=0.2,
        variable_hidden_dim=4,
        use_known_history=True,
    )
    fields.update(overrides)
    return TFTConfig(**fields)
