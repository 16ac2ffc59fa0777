"""tft-jax: the Temporal Fusion Transformer as Flax Linen modules."""
