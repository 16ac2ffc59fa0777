"""The TFT's interpretable multi-head attention: per-head Q/K, one shared V, heads averaged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from tft_jax._dropout import resolve_deterministic
from tft_jax.attention import scaled_dot_product_attention
from tft_jax.linear import Linear

Array = Any
Dtype = Any


class InterpretableMultiHeadAttention(nn.Module):
    """Attention whose averaged weights are interpretable (Lim et al. 2021, eq. 14-16).

    Each head has its own query and key projection (`D/heads` columns of one
    `D -> D` map), all heads share one value projection `D -> D/heads`, and
    the head outputs are averaged before the output projection, so the
    averaged weights describe what the block actually mixes. Q/K/V and the
    output projection have no bias, as in the paper's code.

    Args (call):
      queries: `(B, Tq, D)`; keys_values: `(B, Tk, D)`; mask: boolean
      `(Tq, Tk)`, True = may attend; deterministic: required when
      `dropout_rate > 0` (False: dropout on, with the `'dropout'` RNG).

    Returns:
      `(output (B, Tq, D), weights (B, heads, Tq, Tk))`.
    """

    num_heads: int
    features: int
    dropout_rate: float = 0.0
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    dot_general_cls: Callable[..., nn.Module] | None = None

    @nn.compact
    def __call__(
        self,
        queries: Array,
        keys_values: Array,
        mask: Array | None = None,
        deterministic: bool | None = None,
    ) -> tuple[Array, Array]:
        deterministic = resolve_deterministic(
            "InterpretableMultiHeadAttention",
            deterministic,
            self.dropout_rate,
            self.is_initializing(),
        )
        for name, x in (("queries", queries), ("keys_values", keys_values)):
            if jnp.ndim(x) != 3:
                raise ValueError(
                    f"InterpretableMultiHeadAttention: {name} must be 3-D (B, T, D), got shape "
                    f"{tuple(jnp.shape(x))}"
                )
        if self.features % self.num_heads:
            raise ValueError(
                f"InterpretableMultiHeadAttention: features ({self.features}) must be divisible "
                f"by num_heads ({self.num_heads})"
            )
        head_dim = self.features // self.num_heads

        def project(features: int, name: str, x: Array) -> Array:
            return Linear(
                features,
                use_bias=False,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                dot_general_cls=self.dot_general_cls,
                name=name,
            )(x)

        def split_heads(x: Array) -> Array:
            batch, steps, _ = x.shape
            return x.reshape(batch, steps, self.num_heads, head_dim).transpose(0, 2, 1, 3)

        query = split_heads(project(self.features, "query", queries))
        key = split_heads(project(self.features, "key", keys_values))
        value = project(head_dim, "value", keys_values)[:, None]  # (B, 1, Tk, head_dim)
        heads, weights = scaled_dot_product_attention(query, key, value, mask)
        heads = nn.Dropout(self.dropout_rate)(heads, deterministic=deterministic)
        averaged = jnp.mean(heads, axis=1)
        output = project(self.features, "out", averaged)
        output = nn.Dropout(self.dropout_rate)(output, deterministic=deterministic)
        return output, weights
