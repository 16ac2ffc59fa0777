"""Input embeddings: every input variable becomes a vector before variable selection."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from tft_jax.linear import VariableLinear

Array = Any
Dtype = Any


class RealEmbedding(nn.Module):
    """Embeds each real-valued variable by its own linear map: `(..., V) -> (..., V, width)`.

    The per-variable "prescaler" of the paper (and pytorch-forecasting's
    `hidden_continuous_size`), computed as one batched contraction.
    """

    num_variables: int
    width: int
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    dot_general_cls: Callable[..., nn.Module] | None = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        return VariableLinear(
            self.num_variables,
            self.width,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            dot_general_cls=self.dot_general_cls,
            name="prescaler",
        )(x[..., None])


class CategoricalEmbedding(nn.Module):
    """Embeds integer categorical variables: `(B, C) int -> (B, C, width)`.

    Codes outside `[0, cardinality)` are rejected for concrete inputs; under
    `jit` they are clipped into range (a gather cannot raise there).
    """

    cardinalities: Sequence[int]
    width: int
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, codes: Array) -> Array:
        columns = []
        for index, cardinality in enumerate(self.cardinalities):
            table = self.param(
                f"embedding_{index}",
                nn.initializers.normal(stddev=1.0),
                (cardinality, self.width),
                self.param_dtype,
            )
            columns.append(jnp.take(table, codes[:, index], axis=0, mode="clip"))
        embedded = jnp.stack(columns, axis=1)
        return embedded.astype(self.dtype or embedded.dtype)
