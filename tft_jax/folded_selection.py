"""The variable selection network's fast path: folded embeddings and a chunked, rematerialized scan.

Same parameters, same function, less work than the layer-by-layer modules:

* **Fold.** A real input's embedding is `e_v = s_v a_v + b_v` (its
  prescaler, a rank-1 affine map of the scalar `s_v`). The first layers that
  read `e_v` (the per-variable GRN's learned skip `width -> D` and input layer
  `width -> width`, and the selection GRN's skip and input layer over the
  flattened embeddings) are affine too, so each composition is again a
  rank-1 affine map of `s_v`: `s_v (a_v W) + (b_v W + c)`. The composed
  weights are computed from the parameters inside the step (so gradients
  reach every parameter) and applied as broadcasts: two of the four
  per-variable matmuls, and the selection GRN's `V·width`-wide contractions,
  disappear.
* **Chunks.** The GRNs and the weighted sum run over chunks of rows under
  `lax.scan` + `jax.checkpoint` (`tft_jax.chunked_selection`, which also
  declares the parameters and draws the dropout masks exactly as the
  layer-by-layer modules do, so `init` and a training step equal theirs).

Fake quantization (`dot_general_cls`) observes and quantizes the embedding
and each layer's activation and weight separately; folding would skip those
quantizers, so the quantized model takes the chunks without the fold
(`tft_jax.quantized_selection`) or, with observers being calibrated, the layer-by-layer form (see
`VariableSelectionNetwork`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from tft_jax.chunked_selection import (
    DenseLayer,
    FirstLayers,
    chunked_selection,
    dense,
    layer_bias,
)
from tft_jax.embeddings import AffineEmbedding

Array = Any


def _fold_per_variable(
    slope: Array, intercept: Array, layer: DenseLayer | None
) -> tuple[Array, Array]:
    """`(a_v W_v, b_v W_v + c_v)` for `e_v = s a_v + b_v`: `(V, F)` each; None is the identity."""
    if layer is None:
        return slope, intercept
    kernel, bias = layer.kernel, layer_bias(layer)
    return (
        jnp.einsum("vw,vwf->vf", slope, kernel),
        jnp.einsum("vw,vwf->vf", intercept, kernel) + bias,
    )


def _fold_flat(slope: Array, intercept: Array, layer: DenseLayer | None) -> DenseLayer:
    """The same for a layer over the flattened embeddings `(V·width, F)`.

    The result is a dense layer over the scalar inputs: kernel `(V, F)`, bias `(F,)`.
    """
    num_variables, width = slope.shape
    if layer is None:  # width 1: the flattened embedding itself
        return DenseLayer(jnp.diag(slope[:, 0]), intercept[:, 0])
    kernel, bias = layer.kernel, layer_bias(layer)
    kernel = kernel.reshape(num_variables, width, kernel.shape[-1])
    return DenseLayer(
        jnp.einsum("vw,vwf->vf", slope, kernel),
        jnp.einsum("vw,vwf->f", intercept, kernel) + bias,
    )


def folded_selection(
    module: nn.Module,
    embedded: AffineEmbedding,
    context: Array | None,
    deterministic: bool,
    chunk_rows: int | None = None,
) -> tuple[Array, Array]:
    """`VariableSelectionNetwork.__call__` for real inputs given as an `AffineEmbedding`.

    Called from inside `module`'s compact `__call__`: it declares the
    module's parameters (`variable_grns`, `selection_grn`) under their usual
    names and returns `(combined (..., D), weights (..., V))`. `chunk_rows`
    None: `default_chunk_rows`.
    """
    num_variables, width = embedded.slope.shape
    lead_shape = embedded.values.shape[:-1]
    dtype = module.dtype or jnp.result_type(embedded.values, embedded.slope, module.param_dtype)
    slope, intercept = embedded.slope.astype(dtype), embedded.intercept.astype(dtype)

    def first_layers(
        variable: dict[str, Any], selection: dict[str, Any] | None
    ) -> Callable[[Array], FirstLayers]:
        # The folded weights, `(V, F)` each, computed once outside the loop.
        skip_slope, skip_intercept = _fold_per_variable(slope, intercept, variable["skip"])
        input_slope, input_intercept = _fold_per_variable(slope, intercept, variable["input"])
        if selection is not None:
            selection_skip = _fold_flat(slope, intercept, selection["skip"])
            selection_input = _fold_flat(slope, intercept, selection["input"])

        def chunk(values: Array) -> FirstLayers:
            # values (R, V): the scalar inputs of the chunk's rows.
            scalars = values.T[..., None]  # (V, R, 1)
            return FirstLayers(
                selection_skip=None if selection is None else dense(values, selection_skip),
                selection_hidden=None if selection is None else dense(values, selection_input),
                variable_skip=scalars * skip_slope[:, None, :] + skip_intercept[:, None, :],
                variable_hidden=scalars * input_slope[:, None, :] + input_intercept[:, None, :],
            )

        return chunk

    values = embedded.values.astype(dtype).reshape(-1, num_variables)
    return chunked_selection(
        module, values, lead_shape, width, context, deterministic, dtype, first_layers, chunk_rows
    )
