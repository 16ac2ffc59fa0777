"""The variable selection network over chunks of rows, each layer quantized as it is layer by layer.

The quantized model (a `dot_general_cls` such as `qat`'s `QATDotGeneral`)
cannot take the folded fast path (`tft_jax.folded_selection`): folding the
embedding into the first layers would skip the quantizers of those layers'
inputs. It can take the chunks. With frozen quantizers (operand quantizers,
`tft_jax.operand_quantizers`), every dense layer of the selection GRN and
the per-variable GRNs asks its quantizer once, outside the loop, for its
fake-quantized kernel (per-channel scales from the whole kernel) and its
activation quantizer (elementwise with frozen per-tensor parameters, the
LSQ gradient scale of the whole activation). The real inputs' prescaler does the
same (`RealEmbedding(lazy=True)` returns the quantized inputs and kernel as
an `AffineEmbedding`), so the `(rows, V, width)` embeddings are multiplied
out inside each chunk, and their gradient reduced there, instead of being
written to memory whole, forward and backward. The selection GRN, the
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

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from tft_jax.chunked_selection import (
    FirstLayers,
    chunked_selection,
    dense,
    per_variable_dense,
)
from tft_jax.embeddings import AffineEmbedding

Array = Any


def quantized_selection(
    module: nn.Module,
    embedded: Array | AffineEmbedding,
    context: Array | None,
    deterministic: bool,
    chunk_rows: int | None = None,
) -> tuple[Array, Array]:
    """`VariableSelectionNetwork.__call__` for a `dot_general_cls` with operand quantizers.

    Called from inside `module`'s compact `__call__` with the embeddings
    `(B, [T,] V, width)`, or the quantized prescaler's `AffineEmbedding` of
    `(B, [T,] V)` inputs (then multiplied out inside each chunk, in both
    layouts the first layers read, instead of written whole and read back),
    and the optional `(B, C)` context; it declares `variable_grns` and
    `selection_grn` (parameters, quantizers and dropout masks) under their
    usual names and returns `(combined (B, [T,] D), weights (B, [T,] V))`.
    `chunk_rows` None: `default_chunk_rows`.
    """
    if isinstance(embedded, AffineEmbedding):
        num_variables, width = embedded.slope.shape
        lead_shape = embedded.values.shape[:-1]
        dtype = module.dtype or jnp.result_type(embedded.values, embedded.slope, module.param_dtype)
        slope, intercept = embedded.slope.astype(dtype), embedded.intercept.astype(dtype)
        rows = embedded.values.astype(dtype).reshape(-1, num_variables)

        def row_major(values: Array) -> Array:
            # (R, V) -> (R, V, width), as `AffineEmbedding.materialize` computes it.
            return values[..., None] * slope + intercept

        def variable_major(values: Array) -> Array:
            # (R, V) -> (V, R, width): the same elements, no transpose of the wide array.
            return values.T[..., None] * slope[:, None, :] + intercept[:, None, :]

    else:
        num_variables, width = embedded.shape[-2:]
        lead_shape = embedded.shape[:-2]
        dtype = module.dtype or jnp.result_type(embedded, module.param_dtype)
        rows = embedded.astype(dtype).reshape(-1, num_variables, width)

        def row_major(values: Array) -> Array:
            return values

        def variable_major(values: Array) -> Array:
            return jnp.swapaxes(values, 0, 1)

    def first_layers(
        variable: dict[str, Any], selection: dict[str, Any] | None
    ) -> Callable[[Array], FirstLayers]:
        def chunk(inputs: Array) -> FirstLayers:
            # inputs: the chunk's (R, V, width) embeddings or (R, V) prescaler inputs.
            selection_skip = selection_hidden = None
            if selection is not None:
                flat = row_major(inputs).reshape(-1, num_variables * width)
                skip = selection["skip"]
                selection_skip = flat if skip is None else dense(flat, skip)
                selection_hidden = dense(flat, selection["input"])
            per_variable = variable_major(inputs)  # (V, R, width)
            skip = variable["skip"]
            return FirstLayers(
                selection_skip=selection_skip,
                selection_hidden=selection_hidden,
                variable_skip=(
                    per_variable if skip is None else per_variable_dense(per_variable, skip)
                ),
                variable_hidden=per_variable_dense(per_variable, variable["input"]),
            )

        return chunk

    return chunked_selection(
        module, rows, lead_shape, width, context, deterministic, dtype, first_layers, chunk_rows
    )
