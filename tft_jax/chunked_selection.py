"""The variable selection network over chunks of rows: the loop both fast paths share.

The selection GRN, the per-variable GRNs, their LayerNorms and the weighted
sum run over chunks of rows (batch x time flattened, the last chunk padded)
under `lax.scan`, each chunk under `jax.checkpoint`: the `(V, rows, D)`
intermediates of one chunk stay in cache and are recomputed in the backward
pass instead of being written to memory and read back (only the narrow
outputs of the unbatched contractions are kept: `CHUNK_REMAT_POLICY`).
Rows are independent, so the result equals one call on all rows.

Parameters (and quantizer variables, and dropout masks) are declared by
holder modules at the layer-by-layer modules' paths, with the same names,
shapes and initializers, so `init` gives the same variables and a training
step equals the layer-by-layer one to float32 rounding. The two callers
differ only in the GRNs' first layers, the ones that read the embeddings:

* `tft_jax.folded_selection` folds the real inputs' affine embeddings into
  them (broadcasts of the scalar inputs);
* `tft_jax.quantized_selection` applies them to the computed embeddings,
  each layer fake-quantized as layer by layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import lax

from tft_jax.layer_norm import layer_norm
from tft_jax.linear import VariableLinear, default_kernel_init
from tft_jax.operand_quantizers import identity

Array = Any
Dtype = Any

# Bytes of a chunk's widest intermediate on CPU, a `(V, rows, D)` array: about
# what a core's L2 cache holds, so that the elementwise passes over it (the
# GLU, the residual, the LayerNorm and their derivatives) stay in cache.
DEFAULT_CHUNK_BYTES = 5 << 18  # 1.25 MiB

# What a chunk keeps from its forward pass for the backward one: the outputs of
# its unbatched contractions (the selection GRN's layers, `(rows, F)` each: in
# the quantized model the widest is the `(rows, V*width)` input layer), small
# and costly to recompute. Everything else, the `(V, rows, D)` per-variable
# intermediates included, is recomputed.
CHUNK_REMAT_POLICY: Callable[..., bool] | None = (
    jax.checkpoint_policies.dots_with_no_batch_dims_saveable
)


def default_chunk_rows(num_rows: int, row_bytes: int) -> int:
    """Rows per chunk when none is given.

    On CPU as many rows of `row_bytes` (the widest intermediate's bytes per
    row, `V * D * itemsize`) as fit in `DEFAULT_CHUNK_BYTES`, at least one;
    elsewhere all `num_rows`: chunks run one after another, an accelerator
    needs the whole batch at once to fill its cores, and its working set is
    not held in a CPU cache.
    """
    if jax.default_backend() != "cpu":
        return max(num_rows, 1)
    return max(1, DEFAULT_CHUNK_BYTES // max(row_bytes, 1))


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
            shape: tuple[int, ...] = (self.in_features, self.features)
            init = default_kernel_init
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


class GRNParams(nn.Module):
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
                # Both callers pass the batch size along with a context.
                (cast(int, context_batch), self.context_features),
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
# The math of one chunk

# Variable-major batched contraction: `(V, R, I) x (V, I, F) -> (V, R, F)`.
_PER_VARIABLE = (((2,), (1,)), ((0,), (0,)))


def dense(x: Array, layer: DenseLayer) -> Array:
    """`quantize_input(x) @ kernel + bias`: `(R, I) -> (R, F)`."""
    y = layer.quantize_input(x) @ layer.kernel
    return y if layer.bias is None else y + layer.bias


def per_variable_dense(x: Array, layer: DenseLayer) -> Array:
    """The per-variable layer on variable-major rows: `(V, R, I) -> (V, R, F)`."""
    y = lax.dot_general(layer.quantize_input(x), layer.kernel, _PER_VARIABLE)
    return y + layer_bias(layer)[:, None]


def layer_bias(layer: DenseLayer) -> Array:
    """`layer.bias`, of a layer built with one (every layer but a GRN's context projection)."""
    if layer.bias is None:
        raise ValueError("this layer needs a bias (made with use_bias=True)")
    return layer.bias


def gated_linear_unit(
    x: Array, layer: DenseLayer, dense_op: Callable[[Array, DenseLayer], Array]
) -> Array:
    """`value ⊙ σ(gate)` from the fused projection: the input quantized once, two contractions.

    With a quantizer, the kernel's halves are those of the kernel quantized
    per output channel, so they equal the halves the fused contraction would
    use. `dense_op` is `dense` or `per_variable_dense`.
    """
    bias = layer_bias(layer)
    quantized = layer.quantize_input(x)
    features = layer.kernel.shape[-1] // 2
    value = dense_op(quantized, DenseLayer(layer.kernel[..., :features], bias[..., :features]))
    gate = dense_op(quantized, DenseLayer(layer.kernel[..., features:], bias[..., features:]))
    return value * nn.sigmoid(gate)


def apply_dropout(x: Array, keep: Array | None, rate: float) -> Array:
    """`nn.Dropout` with a given keep mask (None: no dropout)."""
    if keep is None:
        return x
    return lax.select(keep, x / (1.0 - rate), jnp.zeros_like(x))


def _grn_after_first_layers(
    hidden: Array,
    skip: Array,
    grn: dict[str, Any],
    keep: Array | None,
    rate: float,
    dtype: Dtype,
    per_variable: bool,
) -> Array:
    """A GRN from its first layers' outputs: `LayerNorm(skip + GLU(Dropout(W2 elu(hidden))))`.

    `hidden` is `W1 a (+ W3 c)`, `skip` the learned or identity skip: `(R,
    F)`, or `(V, R, F)` per variable.
    """
    dense_op = per_variable_dense if per_variable else dense
    hidden = apply_dropout(dense_op(nn.elu(hidden), grn["hidden"]), keep, rate)
    gated = gated_linear_unit(hidden, grn["glu"]["projection"], dense_op)
    scale, bias = grn["layer_norm"]
    if per_variable:
        scale, bias = scale[:, None], bias[:, None]
    return layer_norm(skip.astype(gated.dtype) + gated, scale, bias, dtype=dtype)


def combine_variables(weights: Array, processed: Array) -> Array:
    """`sum_v weights[..., v] * processed[v, ...]`: `(..., V)`, `(V, ..., D)` -> `(..., D)`.

    One contraction over `V`. XLA:CPU runs it well (its producer writes the
    operand in the layout the contraction wants); a multiply reduced over the
    leading axis runs as a slow strided reduction there instead.
    """
    return jnp.einsum("...v,v...d->...d", weights.astype(processed.dtype), processed)


class FirstLayers(NamedTuple):
    """The GRNs' first layers on one chunk of `R` rows, as `chunked_selection` needs them.

    `selection_skip`, `selection_hidden`: `(R, V)` and `(R, hidden)` (None
    with a single variable); `variable_skip`, `variable_hidden`: `(V, R, D)`
    and `(V, R, width)`, variable-major. Contexts are added by the caller.
    """

    selection_skip: Array | None
    selection_hidden: Array | None
    variable_skip: Array
    variable_hidden: Array


def chunked_rows(
    body: Callable[..., tuple[Array, ...]],
    row_inputs: tuple[Array | None, ...],
    row_axes: tuple[int, ...],
    num_rows: int,
    chunk_rows: int,
) -> tuple[Array, ...]:
    """`body(*row_inputs)` computed over chunks of rows under `lax.scan` + `jax.checkpoint`.

    `row_inputs[i]` has its rows on axis `row_axes[i]` (None entries pass
    through); every output of `body` has its rows on axis 0. Rows are
    independent, so the result equals one call on all rows. The checkpoint
    keeps what `CHUNK_REMAT_POLICY` saves; with a single chunk, `body` runs
    once, without rematerialization, as it does for a symbolic `num_rows`
    (`jax.export` with a polymorphic batch), which no chunk count divides.
    """
    if jax.export.is_symbolic_dim(num_rows):
        return body(*row_inputs)
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
    checkpointed = jax.checkpoint(body, policy=CHUNK_REMAT_POLICY)

    def step(carry: None, chunk: tuple[Array | None, ...]) -> tuple[None, tuple[Array, ...]]:
        return carry, checkpointed(*chunk)

    _, ys = lax.scan(step, None, xs)
    return tuple(y.reshape((chunks * rows, *y.shape[2:]))[:num_rows] for y in ys)


def chunked_selection(
    module: nn.Module,
    rows: Array,
    lead_shape: tuple[int, ...],
    width: int,
    context: Array | None,
    deterministic: bool,
    dtype: Dtype,
    first_layers: Callable[[dict[str, Any], dict[str, Any] | None], Callable[[Array], FirstLayers]],
    chunk_rows: int | None = None,
) -> tuple[Array, Array]:
    """`VariableSelectionNetwork.__call__` over chunks of rows.

    Called from inside `module`'s compact `__call__`: it declares
    `variable_grns` and `selection_grn` (with `module.dot_general_cls`'s
    quantizers and the dropout masks) under their usual names, then runs the
    GRNs and the weighted sum over chunks.

    Args:
      rows: `(num_rows, ...)` what the first layers read per row (rows on axis 0).
      lead_shape: `(B, [T])`, whose product is the number of rows.
      width: the embedding width.
      context: optional `(B, C)` static context.
      dtype: the compute dtype.
      first_layers: given the declared `(variable, selection)` GRN weights,
        returns the function of one chunk of `rows` that computes its
        `FirstLayers` (anything it precomputes from the weights is computed
        once, outside the loop).
      chunk_rows: rows per chunk; None: `default_chunk_rows`.

    Returns:
      `(combined (*lead_shape, D), weights (*lead_shape, V))`.
    """
    num_variables, features = module.num_variables, module.features
    num_rows = math.prod(lead_shape)
    if chunk_rows is None:
        row_bytes = num_variables * features * jnp.dtype(dtype).itemsize
        chunk_rows = default_chunk_rows(num_rows, row_bytes)
    single = num_variables == 1
    deterministic = deterministic or module.dropout_rate == 0.0
    common = dict(
        dropout_rate=module.dropout_rate,
        param_dtype=module.param_dtype,
        dtype=dtype,
        dot_general_cls=module.dot_general_cls,
    )
    context_features = None if context is None else context.shape[-1]
    batch = lead_shape[0]

    # The per-variable GRNs run variable-major, `(V, *lead, width)` at the GLU input.
    # Parameters come in the compute dtype; dropout masks stay boolean.
    variable = GRNParams(
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
        selection = GRNParams(
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

    # The context terms `(B, F)`, (quantized and) projected once, repeated per row.
    context = None if context is None else context.astype(dtype)
    variable_context = (
        per_row(dense(context, variable["context"])) if single and context is not None else None
    )
    variable_keep = variable["glu"]["keep"]
    if variable_keep is not None:
        variable_keep = variable_keep.reshape(num_variables, num_rows, width)
    selection_context = selection_keep = None
    if selection is not None:
        if context is not None:
            selection_context = per_row(dense(context, selection["context"]))
        selection_keep = selection["glu"]["keep"]
        if selection_keep is not None:
            # Not -1: with no rows (an empty batch) the size is 0 and -1 is ambiguous.
            selection_keep = selection_keep.reshape(num_rows, selection_keep.shape[-1])
    rate = module.dropout_rate
    chunk_first_layers = first_layers(variable, selection)

    def body(
        rows: Array,
        selection_context: Array | None,
        variable_context: Array | None,
        selection_keep: Array | None,
        variable_keep: Array | None,
    ) -> tuple[Array, Array]:
        # contexts (R, F); keeps (R, hidden) and (V, R, width).
        first = chunk_first_layers(rows)
        if selection is None:
            weights = jnp.ones(
                (rows.shape[0], num_variables), jnp.promote_types(dtype, jnp.float32)
            )
        else:
            hidden = first.selection_hidden
            if selection_context is not None:
                hidden = hidden + selection_context
            logits = _grn_after_first_layers(
                hidden, first.selection_skip, selection, selection_keep, rate, dtype, False
            )
            weights = nn.softmax(logits.astype(jnp.promote_types(dtype, jnp.float32)), axis=-1)
        hidden = first.variable_hidden
        if variable_context is not None:
            hidden = hidden + variable_context[None]
        processed = _grn_after_first_layers(
            hidden, first.variable_skip, variable, variable_keep, rate, dtype, True
        )
        return combine_variables(weights, processed), weights

    combined, weights = chunked_rows(
        body,
        (rows, selection_context, variable_context, selection_keep, variable_keep),
        (0, 0, 0, 0, 1),
        num_rows,
        chunk_rows,
    )
    return combined.reshape(*lead_shape, features), weights.reshape(*lead_shape, num_variables)
