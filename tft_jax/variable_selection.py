"""The variable selection network: learned, input-dependent weights over input variables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from tft_jax._dropout import resolve_deterministic
from tft_jax.chunked_selection import combine_variables
from tft_jax.embeddings import AffineEmbedding
from tft_jax.folded_selection import folded_selection
from tft_jax.gating import (
    GatedResidualNetwork,
    check_context_width,
    check_dropout_rate,
    check_positive_int,
)
from tft_jax.linear import check_floating
from tft_jax.operand_quantizers import supports_operand_quantizers
from tft_jax.quantized_selection import quantized_selection

Array = Any
Dtype = Any


class VariableSelectionNetwork(nn.Module):
    """Selects among `V` embedded variables: `(..., V, width) -> ((..., D), weights (..., V))`.

    Each variable passes through its own GRN (all `V` computed as one batched
    contraction); a GRN over the flattened embeddings, conditioned on the
    optional static context, gives softmax weights, and the output is the
    weighted sum of the processed variables (Lim et al. 2021, eq. 6-8). With a
    single variable the weight is 1 and the context conditions that
    variable's GRN instead, so the context still acts. The weight GRN's hidden
    width is `selection_hidden_features` (default `features`, the paper;
    pytorch-forecasting uses `min(features, V)`).

    The per-variable GRNs run variable-major: the narrow embeddings are
    transposed once to `(V, B, [T,] width)`, every per-variable layer is then
    a contraction with the variable axis leading (where XLA puts it), and the
    wide `(V, B, [T,] D)` result is combined by one contraction over `V`. The
    other layout would transpose the `D`-wide activations after every layer,
    forward and backward.

    Given real inputs as an `AffineEmbedding` (`RealEmbedding(lazy=True)`)
    and no `dot_general_cls`, the same function runs through
    `tft_jax.folded_selection`: the embedding folded into the first layers,
    the GRNs and the weighted sum over chunks of `chunk_rows` rows under
    `lax.scan` + `jax.checkpoint` (None: on CPU as many rows as keep a
    chunk's `(V, rows, D)` intermediates within
    `tft_jax.chunked_selection.DEFAULT_CHUNK_BYTES`, one chunk on
    accelerators). Same parameters, same dropout masks. The
    quantized model does not fold (every quantizer sees what it sees
    without the fold). When its `dot_general_cls` hands out frozen operand
    quantizers (`tft_jax.operand_quantizers`: QAT with the observers
    frozen), the GRNs and the weighted sum run over the same chunks through
    `tft_jax.quantized_selection`, each layer quantized as layer by layer
    (a quantized prescaler's `AffineEmbedding` multiplied out chunk by
    chunk); otherwise (calibrating observers, int8) the embedding is
    materialized and the layers run one by one.

    Args (call):
      embedded: `(B, [T,] V, width)`, or an `AffineEmbedding` of `(B, [T,] V)` inputs
        (slope and intercept `(V, width)`).
      context: optional `(B, C)` static context (any width `C`; the model passes
        its `(B, D)` selection context). Given at `init`, it must be given at
        every `apply`.

    Returns `(selected (..., D), weights (..., V))`: `selected` in the compute
    dtype, `dtype`, else the promotion of the inputs and the parameters, so
    bfloat16 embeddings with the default float32 `param_dtype` and no
    `dtype` compute and return float32 (pass `dtype=jnp.bfloat16` to compute
    in bfloat16); the weights in at least float32.

    Raises:
      TypeError: `embedded` (an `AffineEmbedding`'s values) or `context` is
        not floating point (an integer array would be cast silently).
      ValueError: `embedded` or `context` of the wrong shape (naming the
        argument), or `context` left out of a call whose parameters were
        initialized with one (its GRN layer would silently be skipped).
    """

    num_variables: int
    features: int
    dropout_rate: float = 0.0
    selection_hidden_features: int | None = None
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    dot_general_cls: Callable[..., nn.Module] | None = None
    chunk_rows: int | None = None

    def __post_init__(self) -> None:
        owner = "VariableSelectionNetwork"
        check_positive_int(owner, "num_variables", self.num_variables)
        check_positive_int(owner, "features", self.features)
        check_positive_int(
            owner, "selection_hidden_features", self.selection_hidden_features, optional=True
        )
        # chunk_rows=0 divided by zero in the chunk count; a negative count ran as one chunk.
        check_positive_int(owner, "chunk_rows", self.chunk_rows, optional=True)
        check_dropout_rate(owner, self.dropout_rate)
        super().__post_init__()

    @nn.compact
    def __call__(
        self, embedded: Array, context: Array | None = None, deterministic: bool | None = None
    ) -> tuple[Array, Array]:
        deterministic = resolve_deterministic(
            "VariableSelectionNetwork", deterministic, self.dropout_rate, self.is_initializing()
        )
        if not isinstance(embedded, AffineEmbedding):
            embedded = jnp.asarray(embedded)
        if context is not None:
            context = jnp.asarray(context)
        self._check_dtypes(embedded, context)
        self._check_inputs(embedded, context)
        self._check_context_matches_parameters(context)
        self._check_width_matches_parameters(embedded.shape[-1])
        if isinstance(embedded, AffineEmbedding) and self.dot_general_cls is None:
            return folded_selection(self, embedded, context, deterministic, self.chunk_rows)
        if supports_operand_quantizers(self.dot_general_cls):
            return quantized_selection(self, embedded, context, deterministic, self.chunk_rows)
        if isinstance(embedded, AffineEmbedding):
            embedded = embedded.materialize()
        width = embedded.shape[-1]
        common = dict(
            dropout_rate=self.dropout_rate,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            dot_general_cls=self.dot_general_cls,
        )
        single = self.num_variables == 1
        processed = GatedResidualNetwork(
            self.features,
            hidden_features=width,
            num_variables=self.num_variables,
            variable_major=True,
            name="variable_grns",
            **common,
        )(jnp.moveaxis(embedded, -2, 0), context if single else None, deterministic)
        if single:
            weights = jnp.ones(embedded.shape[:-1], jnp.promote_types(embedded.dtype, jnp.float32))
        else:
            flat = embedded.reshape(*embedded.shape[:-2], self.num_variables * width)
            logits = GatedResidualNetwork(
                self.num_variables,
                hidden_features=self.selection_hidden_features or self.features,
                name="selection_grn",
                **common,
            )(flat, context, deterministic)
            weights = nn.softmax(
                logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1
            )
        return combine_variables(weights, processed), weights

    @staticmethod
    def _check_dtypes(embedded: Array | AffineEmbedding, context: Array | None) -> None:
        """Raises `TypeError` naming the argument unless the inputs are floating point.

        The GRNs would cast integer embeddings or an integer context to the
        compute dtype silently (categorical codes belong in a
        `CategoricalEmbedding` first).
        """
        owner = "VariableSelectionNetwork"
        if isinstance(embedded, AffineEmbedding):
            check_floating(owner, "embedded.values", embedded.values)
        else:
            check_floating(owner, "embedded", embedded)
        if context is not None:
            check_floating(owner, "context", context)

    def _check_inputs(self, embedded: Array | AffineEmbedding, context: Array | None) -> None:
        """Raises `ValueError` naming the argument unless the shapes fit `(B, [T,] V, width)`.

        Without it a wrong variable count surfaces as a `VariableLinear` error
        about the internal variable-major layout (or, on the folded path, is
        not noticed at all), and a wrong context as an error about the
        flattened input of the selection GRN.
        """
        shape = tuple(embedded.shape)
        # A batch axis is required: without one the chunked paths have no batch to
        # index (an IndexError), and the layer-by-layer one silently ran unbatched.
        if len(shape) < 3 or shape[-2] != self.num_variables:
            raise ValueError(
                f"VariableSelectionNetwork: embedded must have shape (B, [T,] "
                f"{self.num_variables}, width) for num_variables={self.num_variables}, got {shape}"
            )
        # A zero width divided by zero in the fast paths' kernel initializers.
        if shape[-1] < 1:
            raise ValueError(
                f"VariableSelectionNetwork: embedded must have a positive width (its last "
                f"axis), got shape {shape}"
            )
        if isinstance(embedded, AffineEmbedding):
            # Else a slope or intercept of another variable count or width failed in an
            # einsum of the fold (or broadcast silently when materialized).
            expected = (self.num_variables, shape[-1])
            for name in ("slope", "intercept"):
                got = tuple(jnp.shape(getattr(embedded, name)))
                if got != expected:
                    raise ValueError(
                        f"VariableSelectionNetwork: embedded.{name} must have shape {expected} "
                        f"(num_variables, width) for embedded.values of shape "
                        f"{tuple(embedded.values.shape)}, got {got}"
                    )
        if context is None:
            return
        if jnp.ndim(context) != 2 or jnp.shape(context)[0] != shape[0]:
            raise ValueError(
                f"VariableSelectionNetwork: context must have shape (B, C) with B = "
                f"embedded.shape[0] for embedded of shape {shape}, got {tuple(jnp.shape(context))}"
            )

    def _check_width_matches_parameters(self, width: int) -> None:
        """Raises `ValueError` if the embedding width differs from the one at init.

        The fused paths failed with Flax's parameter-shape error at a scope
        ("/variable_grns/skip"), naming neither the argument nor the widths.
        """
        if self.is_initializing():
            return
        grns = self.variables.get("params", {}).get("variable_grns", {})
        kernel = grns.get("input", {}).get("kernel") if hasattr(grns, "get") else None
        if kernel is not None and int(np.shape(kernel)[-2]) != width:
            raise ValueError(
                f"VariableSelectionNetwork: embedded has width {width} (its last axis), but "
                f"the network was initialized with width {int(np.shape(kernel)[-2])}"
            )

    def _check_context_matches_parameters(self, context: Array | None) -> None:
        """Raises `ValueError` if `context` is None but the parameters hold a context layer,
        or is given without one or of another width than it was initialized with.

        Flax ignores parameters a call does not use: without this check a
        network initialized with a context and applied without one silently
        dropped the static context's term from its GRN.
        """
        if self.is_initializing():
            return
        params = self.variables.get("params", {})
        holder = "variable_grns" if self.num_variables == 1 else "selection_grn"
        if context is not None:
            check_context_width(
                "VariableSelectionNetwork", jnp.asarray(context), params, f"{holder}/context"
            )
            return
        if "context" in params.get(holder, {}):
            raise ValueError(
                "VariableSelectionNetwork: context is None, but the parameters hold a context "
                f"layer ({holder}/context): the network was initialized with a context, so "
                "pass one"
            )
