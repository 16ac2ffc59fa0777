"""The TFT's interpretable multi-head attention: per-head Q/K, one shared V, heads averaged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from tft_jax._dropout import resolve_deterministic
from tft_jax.attention import scaled_dot_product_attention
from tft_jax.gating import check_dropout_rate, check_positive_int
from tft_jax.linear import Linear, check_floating

Array = Any
Dtype = Any


class InterpretableMultiHeadAttention(nn.Module):
    """Attention whose averaged weights are interpretable (Lim et al. 2021, eq. 14-16).

    Each head has its own query and key projection (`D/heads` columns of one
    `D -> D` map), all heads share one value projection `D -> D/heads`, and
    the head outputs are averaged before the output projection, so the
    averaged weights describe what the block actually mixes. Q/K/V and the
    output projection have no bias, as in the paper's code.

    Dropout (when `deterministic=False`) applies to each head's output before
    the average and to the output projection, never to the attention
    probabilities: as in the paper's code (its `ScaledDotProductAttention` is
    built with `attn_dropout=0`) and pytorch-forecasting (built without
    dropout). The returned weights are never dropped out.

    Args (call):
      queries: `(B, Tq, D)` floating point, `D = features`; keys_values:
      `(B, Tk, D)` floating point, `Tq, Tk >= 1`; mask: boolean `(Tq, Tk)` (or
      `(B, 1|heads, Tq, Tk)` per example), True = may attend, a query with
      no allowed key getting zero weights; deterministic: required when
      `dropout_rate > 0` (False: dropout on, with the `'dropout'` RNG).

    Returns:
      `(output (B, Tq, D), weights (B, heads, Tq, Tk))`: the output in the
      compute dtype (`dtype`, else the inputs' and parameters' promoted
      dtype: bfloat16 inputs with the default float32 parameters and no
      `dtype` compute and return float32; pass `dtype=jnp.bfloat16` to
      compute in bfloat16), the weights in at least float32 (the softmax's
      own precision, not rounded to a bfloat16 compute dtype), so each row
      with an allowed key sums to 1 to float32 precision.

    Raises:
      TypeError: `queries` or `keys_values` is not floating point (an integer
        array would be cast silently), or `mask` is not boolean.
      ValueError: an input is not 3-D, has no step (`Tq` or `Tk` is 0: there
        would be nothing to attend from or to), its last axis is not
        `features`, the batch sizes differ, or `mask` has another shape.
    """

    num_heads: int
    features: int
    dropout_rate: float = 0.0
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    dot_general_cls: Callable[..., nn.Module] | None = None

    def __post_init__(self) -> None:
        owner = "InterpretableMultiHeadAttention"
        check_positive_int(owner, "num_heads", self.num_heads)
        check_positive_int(owner, "features", self.features)
        if self.features % self.num_heads:
            raise ValueError(
                f"{owner}: features ({self.features}) must be divisible by num_heads "
                f"({self.num_heads})"
            )
        check_dropout_rate(owner, self.dropout_rate)
        super().__post_init__()

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
        queries, keys_values = jnp.asarray(queries), jnp.asarray(keys_values)
        for name, x in (("queries", queries), ("keys_values", keys_values)):
            if jnp.ndim(x) != 3:
                raise ValueError(
                    f"InterpretableMultiHeadAttention: {name} must be 3-D (B, T, D), got shape "
                    f"{tuple(jnp.shape(x))}"
                )
            # Else a width other than the parameters' fails in Flax as a ScopeParamShapeError
            # naming no argument (or, at init, builds projections of another width).
            if x.shape[-1] != self.features:
                raise ValueError(
                    f"InterpretableMultiHeadAttention: {name}.shape[-1] must equal "
                    f"features={self.features}, got {x.shape[-1]} (shape {tuple(x.shape)})"
                )
            check_floating("InterpretableMultiHeadAttention", name, x)
            # Else zero steps gave an empty output (Tq = 0) or zeros with weights
            # (B, heads, Tq, 0) (Tk = 0), silently; TemporalSelfAttention refuses T = 0 too.
            if x.shape[1] == 0:
                steps = "Tq" if name == "queries" else "Tk"
                raise ValueError(
                    f"InterpretableMultiHeadAttention: {name} must have at least one step, "
                    f"{steps} > 0 in (B, {steps}, D), got shape {tuple(x.shape)}"
                )
        if queries.shape[0] != keys_values.shape[0]:
            raise ValueError(
                "InterpretableMultiHeadAttention: queries and keys_values must have the same "
                f"batch size, got shapes {tuple(queries.shape)} and {tuple(keys_values.shape)}"
            )
        mask = self._check_mask(mask, queries.shape[0], queries.shape[1], keys_values.shape[1])
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
        # The kernel rounds its weights to its inputs' dtype: given them in at least float32
        # it returns the softmax unrounded (bfloat16 rows miss 1 by a few thousandths). The
        # head outputs are then formed as the kernel forms them from the weights rounded to
        # the compute dtype, so the layer's output is the same as from bfloat16 inputs; the
        # kernel's own float32 output is unused (pruned under jit).
        weights_dtype = jnp.promote_types(query.dtype, jnp.float32)
        _, weights = scaled_dot_product_attention(
            query.astype(weights_dtype), key.astype(weights_dtype), value, mask
        )
        heads = jnp.matmul(weights.astype(query.dtype), value.astype(query.dtype))
        heads = nn.Dropout(self.dropout_rate)(heads, deterministic=deterministic)
        averaged = jnp.mean(heads, axis=1)
        output = project(self.features, "out", averaged)
        output = nn.Dropout(self.dropout_rate)(output, deterministic=deterministic)
        return output, weights

    def _check_mask(
        self, mask: Array | None, batch: int, num_queries: int, num_keys: int
    ) -> Array | None:
        """`mask` as a boolean array after checking its dtype and shape.

        The kernel would read a float mask as `mask != 0` (an additive 0/-inf
        mask inverted) and broadcast a `(B, Tq, Tk)` mask's batch axis against
        the heads, both silently.

        Raises:
          TypeError: `mask` is not boolean.
          ValueError: `mask` is not `(Tq, Tk)` or `(B, 1|heads, Tq, Tk)`.
        """
        if mask is None:
            return None
        # A NumPy mask stays one: the kernel then sees on the host whether every row attends.
        mask = mask if isinstance(mask, np.ndarray) else jnp.asarray(mask)
        owner = "InterpretableMultiHeadAttention"
        if mask.dtype != jnp.bool_:
            raise TypeError(f"{owner}: mask must be boolean (True = may attend), got {mask.dtype}")
        allowed = (
            (num_queries, num_keys),
            (batch, 1, num_queries, num_keys),
            (batch, self.num_heads, num_queries, num_keys),
        )
        if mask.shape not in allowed:
            raise ValueError(
                f"{owner}: mask must have shape (Tq, Tk) = ({num_queries}, {num_keys}) or "
                f"(B, 1|heads, Tq, Tk) = ({batch}, 1 or {self.num_heads}, {num_queries}, "
                f"{num_keys}), got {tuple(mask.shape)}"
            )
        return mask
