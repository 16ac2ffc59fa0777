"""The variable selection network over chunks of rows, each layer quantized as it is layer by layer.

The quantized model (a `dot_general_cls` such as `qat`'s `QATDotGeneral`)
cannot take the folded fast path (`tft_jax.folded_selection`): folding the
embedding into the first layers would skip the quantizers of those layers'
inputs. It can take the chunks. With frozen quantizers (operand quantizers,
`tft_jax.operand_quantizers`), every dense layer of the selection GRN and
the per-variable GRNs asks its quantizer once, outside the loop, for its
fake-quantized kernel (per-channel scales from the whole kernel) and its
activation quantizer (elementwise with frozen per-tensor parameters, the
LSQ gradient scale of the whole activation). The selection GRN, the
per-variable GRNs, their LayerNorms and the weighted sum then run over
chunks of rows (batch x time flattened, the last chunk padded) under
`lax.scan`, each chunk under `jax.checkpoint`, applying those quantizers to
the chunk's activations. Every element sees the same quantization as in one
layer-by-layer call, and gradients reach the kernels and any learnable step
size through the loop.

Parameters, quantizer variables and dropout masks are declared at the
layer-by-layer paths, with the same shapes and initializers, so `init`
gives the same variables and a training step equals the layer-by-layer one
to float32 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from flax import linen as nn
from jax import lax

from tft_jax.folded_selection import (
    DenseLayer,
    _chunked_rows,
    _dropout,
    _GRNParams,
    _layer_norm,
    default_chunk_rows,
)

Array = Any

# Variable-major batched contraction: `(V, R, I) x (V, I, F) -> (V, R, F)`.
_PER_VARIABLE = (((2,), (1,)), ((0,), (0,)))


def _dense(x: Array, layer: DenseLayer) -> Array:
    """`quantize_input(x) @ kernel + bias`: `(R, I) -> (R, F)`."""
    y = layer.quantize_input(x) @ layer.kernel
    return y if layer.bias is None else y + layer.bias


def _per_variable_dense(x: Array, layer: DenseLayer) -> Array:
    """The per-variable layer on variable-major rows: `(V, R, I) -> (V, R, F)`."""
    y = lax.dot_general(layer.quantize_input(x), layer.kernel, _PER_VARIABLE)
    return y + layer.bias[:, None]


def _glu(x: Array, layer: DenseLayer, dense: Callable[[Array, DenseLayer], Array]) -> Array:
    """`value ⊙ σ(gate)` from the fused projection: the input quantized once, two contractions.

    The kernel's halves are those of the kernel quantized per output
    channel, so they equal the halves the fused contraction would use.
    `dense` is `_dense` or `_per_variable_dense`.
    """
    quantized = layer.quantize_input(x)
    features = layer.kernel.shape[-1] // 2
    value = dense(quantized, DenseLayer(layer.kernel[..., :features], layer.bias[..., :features]))
    gate = dense(quantized, DenseLayer(layer.kernel[..., features:], layer.bias[..., features:]))
    return value * nn.sigmoid(gate)


def quantized_selection(
    module: nn.Module,
    embedded: Array,
    context: Array | None,
    deterministic: bool,
    chunk_rows: int | None = None,
) -> tuple[Array, Array]:
    """`VariableSelectionNetwork.__call__` for a `dot_general_cls` with operand quantizers.

    Called from inside `module`'s compact `__call__` with the computed
    embeddings `(B, [T,] V, width)` and the optional `(B, C)` context; it
    declares `variable_grns` and `selection_grn` (parameters, quantizers and
    dropout masks) under their usual names and returns `(combined (B, [T,]
    D), weights (B, [T,] V))`. `chunk_rows` None: `default_chunk_rows`.
    """
    num_variables, width = embedded.shape[-2:]
    features = module.features
    lead_shape = embedded.shape[:-2]
    num_rows = math.prod(lead_shape)
    chunk_rows = default_chunk_rows(num_rows) if chunk_rows is None else chunk_rows
    single = num_variables == 1
    dtype = module.dtype or jnp.result_type(embedded, module.param_dtype)
    deterministic = deterministic or module.dropout_rate == 0.0
    common = dict(
        dropout_rate=module.dropout_rate,
        param_dtype=module.param_dtype,
        dtype=dtype,
        dot_general_cls=module.dot_general_cls,
    )
    context_features = None if context is None else context.shape[-1]
    batch = lead_shape[0]

    variable = _GRNParams(
        width,
        features,
        width,
        num_variables,
        context_features if single else None,
        name="variable_grns",
        **common,
    )((num_variables, *lead_shape, width), deterministic, batch)
    selection = None
    if not single:
        selection_hidden = module.selection_hidden_features or features
        selection = _GRNParams(
            num_variables * width,
            num_variables,
            selection_hidden,
            None,
            context_features,
            name="selection_grn",
            **common,
        )((*lead_shape, selection_hidden), deterministic, batch)

    def per_row(projected: Array) -> Array:
        """`(B, F)` -> `(rows, F)`, each batch row repeated over its time steps."""
        repeated = jnp.broadcast_to(
            projected.reshape((batch,) + (1,) * (len(lead_shape) - 1) + projected.shape[-1:]),
            (*lead_shape, projected.shape[-1]),
        )
        return repeated.reshape(num_rows, projected.shape[-1])

    # The context terms `(B, F)`, quantized and projected once, repeated per row.
    context = None if context is None else context.astype(dtype)
    variable_context = (
        per_row(_dense(context, variable["context"])) if single and context is not None else None
    )
    variable_keep = variable["glu"]["keep"]
    if variable_keep is not None:
        variable_keep = variable_keep.reshape(num_variables, num_rows, width)
    selection_context = selection_keep = None
    if selection is not None:
        if context is not None:
            selection_context = per_row(_dense(context, selection["context"]))
        selection_keep = selection["glu"]["keep"]
        if selection_keep is not None:
            selection_keep = selection_keep.reshape(num_rows, -1)
    rate = module.dropout_rate
    rows_embedded = embedded.astype(dtype).reshape(num_rows, num_variables, width)

    def body(
        embedded: Array,
        selection_context: Array | None,
        variable_context: Array | None,
        selection_keep: Array | None,
        variable_keep: Array | None,
    ) -> tuple[Array, Array]:
        # embedded (R, V, width); contexts (R, F); keeps (R, hidden) and (V, R, width).
        rows = embedded.shape[0]
        if selection is None:
            weights = jnp.ones((rows, num_variables), jnp.promote_types(dtype, jnp.float32))
        else:
            flat = embedded.reshape(rows, num_variables * width)
            skip = flat if selection["skip"] is None else _dense(flat, selection["skip"])
            hidden = _dense(flat, selection["input"])
            if selection_context is not None:
                hidden = hidden + selection_context
            hidden = _dense(nn.elu(hidden), selection["hidden"])
            hidden = _dropout(hidden, selection_keep, rate)
            gated = _glu(hidden, selection["glu"]["projection"], _dense)
            scale, bias = selection["layer_norm"]
            logits = _layer_norm(skip.astype(gated.dtype) + gated, scale, bias, dtype)
            weights = nn.softmax(logits.astype(jnp.promote_types(dtype, jnp.float32)), axis=-1)

        per_variable = jnp.swapaxes(embedded, 0, 1)  # (V, R, width)
        skip = (
            per_variable
            if variable["skip"] is None
            else _per_variable_dense(per_variable, variable["skip"])
        )
        hidden = _per_variable_dense(per_variable, variable["input"])
        if variable_context is not None:
            hidden = hidden + variable_context[None]
        hidden = _per_variable_dense(nn.elu(hidden), variable["hidden"])
        hidden = _dropout(hidden, variable_keep, rate)
        gated = _glu(hidden, variable["glu"]["projection"], _per_variable_dense)
        scale, bias = variable["layer_norm"]
        processed = _layer_norm(
            skip.astype(gated.dtype) + gated, scale[:, None], bias[:, None], dtype
        )
        combined = jnp.einsum("rv,vrd->rd", weights.astype(processed.dtype), processed)
        return combined, weights

    combined, weights = _chunked_rows(
        body,
        (rows_embedded, selection_context, variable_context, selection_keep, variable_keep),
        (0, 0, 0, 0, 1),
        num_rows,
        chunk_rows,
    )
    return combined.reshape(*lead_shape, features), weights.reshape(*lead_shape, num_variables)
