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
* **Chunks.** The selection GRN, the per-variable GRNs, their LayerNorms and
  the weighted sum run over chunks of rows (batch x time flattened) under
  `lax.scan`, each chunk under `jax.checkpoint`: the `(V, rows, D)`
  intermediates of one chunk stay in cache and are recomputed in the backward
  pass instead of being written to memory and read back.

Dropout masks are drawn exactly as the layer-by-layer modules draw them (the
same RNG paths and shapes), so a training step equals theirs to float32
rounding. Parameters are declared under the same names and shapes with the
same initializers, so `init` gives the same values.

Fake quantization (`dot_general_cls`) observes and quantizes the embedding
and each layer's activation and weight separately; folding would skip those
quantizers, so the quantized model takes the chunks without the fold
(`tft_jax.quantized_selection`, which shares this module's parameter holders
and loop) or, with observers being calibrated, the layer-by-layer form (see
`VariableSelectionNetwork`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import lax

from tft_jax.embeddings import AffineEmbedding
from tft_jax.layer_norm import layer_norm
from tft_jax.linear import VariableLinear, default_kernel_init
from tft_jax.operand_quantizers import identity

Array = Any
Dtype = Any

# Rows (batch x time) per chunk on CPU: small enough that a chunk's widest
# intermediates, `(V, rows, D)` floats, stay in a core's cache.
DEFAULT_CHUNK_ROWS = 512


def default_chunk_rows(num_rows: int) -> int:
    """Rows per chunk when none is given: `DEFAULT_CHUNK_ROWS` on CPU, all rows elsewhere.

    Chunks run one after another; an accelerator needs the whole batch at
    once to fill its cores, and its working set is not held in a CPU cache.
    """
    return DEFAULT_CHUNK_ROWS if jax.default_backend() == "cpu" else max(num_rows, 1)


class DenseLayer(NamedTuple):
    """A dense layer's operands as a loop body uses them: `quantize_input(x) · kernel + bias`.

    `kernel` (`(I, F)`, or `(V, I, F)` per variable) and `bias` (`(F,)`,
    `(V, F)`, or None) are cast to the compute dtype; with a quantizing
    `dot_general_cls` the kernel is already fake-quantized and
    `quantize_input` is the activation's quantizer (else the identity).
    """

    kernel: Array
    bias: Array | None
    quantize_input: Callable[[Array], Array] = identity


class _DenseParams(nn.Module):
    """The parameters of a `Linear` / `VariableLinear` layer, declared but not applied.

    With `dot_general_cls` (one with operand quantizers) its quantizer is
    built at the layer's `dot_general` path and asked for the operands'
    quantization for an activation of shape `lhs_shape` (`(..., I)`, or
    `(V, ..., I)` per variable: the variable-major layout).
    """

    in_features: int
    features: int
    num_variables: int | None = None
    use_bias: bool = True
    param_dtype: Dtype = jnp.float32
    dtype: Dtype | None = None
    dot_general_cls: Callable[..., nn.Module] | None = None

    @nn.compact
    def __call__(self, lhs_shape: tuple[int, ...] | None = None) -> DenseLayer:
        if self.num_variables is None:
            shape, init = (self.in_features, self.features), default_kernel_init
            bias_shape: tuple[int, ...] = (self.features,)
        else:
            shape = (self.num_variables, self.in_features, self.features)
            init = VariableLinear.kernel_init
            bias_shape = (self.num_variables, self.features)
        kernel = self.param("kernel", init, shape, self.param_dtype)
        bias = (
            self.param("bias", nn.initializers.zeros_init(), bias_shape, self.param_dtype)
            if self.use_bias
            else None
        )
        dtype = self.dtype or self.param_dtype
        kernel = kernel.astype(dtype)
        bias = None if bias is None else bias.astype(dtype)
        if self.dot_general_cls is None:
            return DenseLayer(kernel, bias)
        if lhs_shape is None:
            raise ValueError("_DenseParams: a quantized layer needs its activation's lhs_shape")
        last = len(lhs_shape) - 1
        dimension_numbers = (
            (((last,), (0,)), ((), ()))
            if self.num_variables is None
            else (((last,), (1,)), ((0,), (0,)))
        )
        quantizer = self.dot_general_cls(name="dot_general", lhs_bounds=None)
        kernel, quantize_input = quantizer.operand_quantizers(kernel, dimension_numbers, lhs_shape)
        return DenseLayer(kernel, bias, quantize_input)


class _LayerNormParams(nn.Module):
    """The parameters of a `FeatureLayerNorm` in the compute dtype, declared but not applied."""

    features: int
    num_variables: int | None = None
    param_dtype: Dtype = jnp.float32
    dtype: Dtype | None = None

    @nn.compact
    def __call__(self) -> tuple[Array, Array]:
        shape = (
            (self.features,) if self.num_variables is None else (self.num_variables, self.features)
        )
        scale = self.param("scale", nn.initializers.ones_init(), shape, self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros_init(), shape, self.param_dtype)
        dtype = self.dtype or self.param_dtype
        return scale.astype(dtype), bias.astype(dtype)


class _DropoutKeep(nn.Module):
    """The keep mask that `nn.Dropout` (at this module's path) would draw for `shape`."""

    rate: float

    @nn.compact
    def __call__(self, shape: tuple[int, ...]) -> Array:
        return jax.random.bernoulli(self.make_rng("dropout"), 1.0 - self.rate, shape)


class _GLUParams(nn.Module):
    """`GatedLinearUnit`'s projection, and its input dropout mask when dropout is on."""

    in_features: int
    features: int
    num_variables: int | None
    dropout_rate: float
    param_dtype: Dtype
    dtype: Dtype | None = None
    dot_general_cls: Callable[..., nn.Module] | None = None

    @nn.compact
    def __call__(self, input_shape: tuple[int, ...], deterministic: bool) -> dict[str, Any]:
        keep = None
        if self.dropout_rate > 0.0 and not deterministic:
            keep = _DropoutKeep(self.dropout_rate, name="Dropout_0")(input_shape)
        projection = _DenseParams(
            self.in_features,
            2 * self.features,
            self.num_variables,
            param_dtype=self.param_dtype,
            dtype=self.dtype,
            dot_general_cls=self.dot_general_cls,
            name="projection",
        )(input_shape)
        return {"projection": projection, "keep": keep}


class _GRNParams(nn.Module):
    """Every parameter of a `GatedResidualNetwork` (and its dropout mask), under the same names.

    Returns a dict: `skip` (None when the skip is the identity), `input`,
    `context` (None without a context), `hidden` (each a `DenseLayer`),
    `glu` (`projection` and `keep`), `layer_norm` (scale, bias). The call
    takes the GLU's input shape (`(V, ..., hidden)` per variable), and the
    context's batch size when there is a context (for the quantizers' shapes).
    """

    in_features: int
    features: int
    hidden_features: int
    num_variables: int | None
    context_features: int | None
    dropout_rate: float
    param_dtype: Dtype
    dtype: Dtype | None = None
    dot_general_cls: Callable[..., nn.Module] | None = None

    @nn.compact
    def __call__(
        self,
        glu_input_shape: tuple[int, ...],
        deterministic: bool,
        context_batch: int | None = None,
    ) -> dict[str, Any]:
        def dense(
            in_features: int, features: int, name: str, lhs_shape: tuple[int, ...], **kwargs: Any
        ) -> DenseLayer:
            return _DenseParams(
                in_features,
                features,
                kwargs.pop("num_variables", self.num_variables),
                param_dtype=self.param_dtype,
                dtype=self.dtype,
                dot_general_cls=self.dot_general_cls,
                name=name,
                **kwargs,
            )(lhs_shape)

        hidden = self.hidden_features
        input_shape = (*glu_input_shape[:-1], self.in_features)
        skip = (
            None
            if self.in_features == self.features
            else dense(self.in_features, self.features, "skip", input_shape)
        )
        weights = {
            "skip": skip,
            "input": dense(self.in_features, hidden, "input", input_shape),
            "context": None,
        }
        if self.context_features is not None:
            weights["context"] = dense(
                self.context_features,
                hidden,
                "context",
                (context_batch, self.context_features),
                num_variables=None,
                use_bias=False,
            )
        weights["hidden"] = dense(hidden, hidden, "hidden", glu_input_shape)
        weights["glu"], weights["layer_norm"] = _GateAddNormParams(
            hidden,
            self.features,
            self.num_variables,
            self.dropout_rate,
            self.param_dtype,
            self.dtype,
            self.dot_general_cls,
            name="gate_add_norm",
        )(glu_input_shape, deterministic)
        return weights


class _GateAddNormParams(nn.Module):
    """`GateAddNorm`'s GLU and LayerNorm parameters."""

    in_features: int
    features: int
    num_variables: int | None
    dropout_rate: float
    param_dtype: Dtype
    dtype: Dtype | None = None
    dot_general_cls: Callable[..., nn.Module] | None = None

    @nn.compact
    def __call__(self, glu_input_shape: tuple[int, ...], deterministic: bool) -> tuple[Any, Any]:
        glu = _GLUParams(
            self.in_features,
            self.features,
            self.num_variables,
            self.dropout_rate,
            self.param_dtype,
            self.dtype,
            self.dot_general_cls,
            name="glu",
        )(glu_input_shape, deterministic)
        layer_norm = _LayerNormParams(
            self.features, self.num_variables, self.param_dtype, self.dtype, name="layer_norm"
        )()
        return glu, layer_norm


# ---------------------------------------------------------------------------
# The math


def _layer_norm(x: Array, scale: Array, bias: Array, dtype: Dtype) -> Array:
    """`FeatureLayerNorm`'s formula: statistics in at least float32 over the last axis."""
    return layer_norm(x, scale, bias, dtype=dtype)


def _dropout(x: Array, keep: Array | None, rate: float) -> Array:
    """`nn.Dropout` with a given keep mask (None: no dropout)."""
    if keep is None:
        return x
    return lax.select(keep, x / (1.0 - rate), jnp.zeros_like(x))


def _fold_per_variable(
    slope: Array, intercept: Array, layer: DenseLayer | None
) -> tuple[Array, Array]:
    """`(a_v W_v, b_v W_v + c_v)` for `e_v = s a_v + b_v`: `(V, F)` each; None is the identity."""
    if layer is None:
        return slope, intercept
    kernel, bias = layer.kernel, layer.bias
    return (
        jnp.einsum("vw,vwf->vf", slope, kernel),
        jnp.einsum("vw,vwf->vf", intercept, kernel) + bias,
    )


def _fold_flat(slope: Array, intercept: Array, layer: DenseLayer | None) -> tuple[Array, Array]:
    """The same for a layer over the flattened embeddings `(V·width, F)`: `(V, F)`, `(F,)`."""
    num_variables, width = slope.shape
    if layer is None:  # width 1: the flattened embedding itself
        return jnp.diag(slope[:, 0]), intercept[:, 0]
    kernel, bias = layer.kernel, layer.bias
    kernel = kernel.reshape(num_variables, width, kernel.shape[-1])
    return (
        jnp.einsum("vw,vwf->vf", slope, kernel),
        jnp.einsum("vw,vwf->f", intercept, kernel) + bias,
    )


def _split_glu(projection: DenseLayer) -> tuple[Array, Array, Array, Array]:
    """The value and gate halves of a GLU projection: kernels `(..., I, F)`, biases `(..., F)`."""
    kernel, bias = projection.kernel, projection.bias
    features = kernel.shape[-1] // 2
    value = kernel[..., :features], bias[..., :features]
    return *value, kernel[..., features:], bias[..., features:]


def _chunked_rows(
    body: Callable[..., tuple[Array, ...]],
    row_inputs: tuple[Array | None, ...],
    row_axes: tuple[int, ...],
    num_rows: int,
    chunk_rows: int,
) -> tuple[Array, ...]:
    """`body(*row_inputs)` computed over chunks of rows under `lax.scan` + `jax.checkpoint`.

    `row_inputs[i]` has its rows on axis `row_axes[i]` (None entries pass
    through); every output of `body` has its rows on axis 0. Rows are
    independent, so the result equals one call on all rows. With a single
    chunk, `body` runs once, without rematerialization.
    """
    chunks = max(1, math.ceil(num_rows / chunk_rows))
    if chunks == 1:
        return body(*row_inputs)
    rows = math.ceil(num_rows / chunks)
    padding = chunks * rows - num_rows

    def split(x: Array | None, axis: int) -> Array | None:
        if x is None:
            return None
        if padding:
            widths = [(0, 0)] * x.ndim
            widths[axis] = (0, padding)
            x = jnp.pad(x, widths)
        x = x.reshape((*x.shape[:axis], chunks, rows, *x.shape[axis + 1 :]))
        return jnp.moveaxis(x, axis, 0)

    xs = tuple(split(x, axis) for x, axis in zip(row_inputs, row_axes, strict=True))
    checkpointed = jax.checkpoint(body)

    def step(carry: None, chunk: tuple[Array | None, ...]) -> tuple[None, tuple[Array, ...]]:
        return carry, checkpointed(*chunk)

    _, ys = lax.scan(step, None, xs)
    return tuple(y.reshape((chunks * rows, *y.shape[2:]))[:num_rows] for y in ys)


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
    features = module.features
    lead_shape = embedded.values.shape[:-1]
    num_rows = math.prod(lead_shape)
    chunk_rows = default_chunk_rows(num_rows) if chunk_rows is None else chunk_rows
    single = num_variables == 1
    dtype = module.dtype or jnp.result_type(embedded.values, embedded.slope, module.param_dtype)
    deterministic = deterministic or module.dropout_rate == 0.0
    common = dict(dropout_rate=module.dropout_rate, param_dtype=module.param_dtype, dtype=dtype)
    context_features = None if context is None else context.shape[-1]

    # The per-variable GRNs run variable-major, `(V, *lead, width)` at the GLU input.
    # Parameters come in the compute dtype; dropout masks stay boolean.
    variable = _GRNParams(
        width,
        features,
        width,
        num_variables,
        context_features if single else None,
        name="variable_grns",
        **common,
    )((num_variables, *lead_shape, width), deterministic)
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
        )((*lead_shape, selection_hidden), deterministic)

    values = embedded.values.astype(dtype).reshape(num_rows, num_variables)
    slope, intercept = embedded.slope.astype(dtype), embedded.intercept.astype(dtype)
    context = None if context is None else context.astype(dtype)

    # Folded first layers, and the per-row context terms (`(B, F)` broadcast over time).
    skip_slope, skip_intercept = _fold_per_variable(slope, intercept, variable["skip"])
    input_slope, input_intercept = _fold_per_variable(slope, intercept, variable["input"])
    value_kernel, value_bias, gate_kernel, gate_bias = _split_glu(variable["glu"]["projection"])
    ln_scale, ln_bias = variable["layer_norm"]

    def per_row(projected: Array) -> Array:
        """`(B, F)` -> `(rows, F)`, each batch row repeated over its time steps."""
        batch = projected.shape[0]
        repeated = jnp.broadcast_to(
            projected.reshape((batch,) + (1,) * (len(lead_shape) - 1) + projected.shape[-1:]),
            (*lead_shape, projected.shape[-1]),
        )
        return repeated.reshape(num_rows, projected.shape[-1])

    variable_context = (
        per_row(context @ variable["context"].kernel) if single and context is not None else None
    )
    variable_keep = variable["glu"]["keep"]
    if variable_keep is not None:
        variable_keep = variable_keep.reshape(num_variables, num_rows, width)

    selection_context = selection_keep = None
    if selection is not None:
        sel_skip = _fold_flat(slope, intercept, selection["skip"])
        sel_input = _fold_flat(slope, intercept, selection["input"])
        sel_value_kernel, sel_value_bias, sel_gate_kernel, sel_gate_bias = _split_glu(
            selection["glu"]["projection"]
        )
        sel_scale, sel_bias = selection["layer_norm"]
        if context is not None:
            selection_context = per_row(context @ selection["context"].kernel)
        selection_keep = selection["glu"]["keep"]
        if selection_keep is not None:
            selection_keep = selection_keep.reshape(num_rows, -1)
    rate = module.dropout_rate

    def body(
        values: Array,
        selection_context: Array | None,
        variable_context: Array | None,
        selection_keep: Array | None,
        variable_keep: Array | None,
    ) -> tuple[Array, Array]:
        # values (R, V); contexts (R, F); keeps (R, hidden) and (V, R, width).
        if selection is None:
            weights = jnp.ones(values.shape, jnp.promote_types(dtype, jnp.float32))
        else:
            hidden = values @ sel_input[0] + sel_input[1]
            if selection_context is not None:
                hidden = hidden + selection_context
            hidden = nn.elu(hidden) @ selection["hidden"].kernel + selection["hidden"].bias
            hidden = _dropout(hidden, selection_keep, rate)
            gated = (hidden @ sel_value_kernel + sel_value_bias) * nn.sigmoid(
                hidden @ sel_gate_kernel + sel_gate_bias
            )
            skip = values @ sel_skip[0] + sel_skip[1]
            logits = _layer_norm(skip + gated, sel_scale, sel_bias, dtype)
            weights = nn.softmax(logits.astype(jnp.promote_types(dtype, jnp.float32)), axis=-1)

        scalars = values.T[..., None]  # (V, R, 1)
        skip = scalars * skip_slope[:, None, :] + skip_intercept[:, None, :]
        hidden = scalars * input_slope[:, None, :] + input_intercept[:, None, :]
        if variable_context is not None:
            hidden = hidden + variable_context[None]
        hidden_kernel, hidden_bias = variable["hidden"].kernel, variable["hidden"].bias
        batched = (((2,), (1,)), ((0,), (0,)))
        hidden = lax.dot_general(nn.elu(hidden), hidden_kernel, batched) + hidden_bias[:, None]
        hidden = _dropout(hidden, variable_keep, rate)
        value = lax.dot_general(hidden, value_kernel, batched) + value_bias[:, None]
        gate = lax.dot_general(hidden, gate_kernel, batched) + gate_bias[:, None]
        processed = _layer_norm(
            skip + value * nn.sigmoid(gate), ln_scale[:, None], ln_bias[:, None], dtype
        )
        combined = jnp.einsum("rv,vrd->rd", weights.astype(processed.dtype), processed)
        return combined, weights

    combined, weights = _chunked_rows(
        body,
        (values, selection_context, variable_context, selection_keep, variable_keep),
        (0, 0, 0, 0, 1),
        num_rows,
        chunk_rows,
    )
    return combined.reshape(*lead_shape, features), weights.reshape(*lead_shape, num_variables)
