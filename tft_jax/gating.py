"""Gating blocks of the TFT: GLU, gated residual network, gate-add-norm.

Each block works on `(..., F)` inputs, or, with `num_variables=V`, on
`(..., V, F)` inputs with separate weights per variable computed as one
batched contraction (the per-variable GRNs of a variable selection network).
With `variable_major=True` as well, the variable axis comes first,
`(V, ..., F)`: the layout the batched contractions produce, so a whole
per-variable GRN runs without transposing its wide activations (same
parameters, same values).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from tft_jax._dropout import resolve_deterministic
from tft_jax.layer_norm import DEFAULT_EPSILON, layer_norm
from tft_jax.linear import (
    Linear,
    VariableLinear,
    check_feature_axis,
    check_float_dtype,
    check_floating,
    check_input_width,
    check_positive_int,
    variable_major_broadcast,
)

Array = Any
Dtype = Any


def check_dropout_rate(owner: str, dropout_rate: float) -> None:
    """Raises `ValueError` unless `0 <= dropout_rate < 1`.

    `nn.Dropout` accepts any rate: a negative one keeps everything and rescales
    by `1 / (1 - rate) < 1`, one above 1 zeroes everything, both silently.

    Raises:
      TypeError: `dropout_rate` is not a number (None, a string), which would
        otherwise fail in the comparison without naming the field.
      ValueError: it is outside [0, 1).
    """
    try:
        in_range = 0.0 <= dropout_rate < 1.0
    except TypeError:
        raise TypeError(
            f"{owner}: dropout_rate must be a float in [0, 1), got "
            f"{type(dropout_rate).__name__} {dropout_rate!r}"
        ) from None
    if not in_range:
        raise ValueError(f"{owner}: dropout_rate must be in [0, 1), got {dropout_rate!r}")


def _check_gated_config(owner: str, module: nn.Module) -> None:
    """The constructor checks shared by the gating blocks."""
    check_positive_int(owner, "features", module.features)
    check_positive_int(owner, "num_variables", module.num_variables, optional=True)
    check_dropout_rate(owner, module.dropout_rate)
    check_float_dtype(owner, "dtype", module.dtype, optional=True)
    check_float_dtype(owner, "param_dtype", module.param_dtype)


def make_dense(
    features: int,
    num_variables: int | None,
    *,
    name: str,
    use_bias: bool = True,
    dtype: Dtype | None = None,
    param_dtype: Dtype = jnp.float32,
    dot_general_cls: Callable[..., nn.Module] | None = None,
    variable_major: bool = False,
) -> nn.Module:
    """`Linear`, or with `num_variables` a `VariableLinear` (one affine map per variable).

    `variable_major` (only with `num_variables`) selects the `(V, ..., I)` layout.
    """
    common = dict(
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        dot_general_cls=dot_general_cls,
        name=name,
    )
    if num_variables is None:
        if variable_major:
            raise ValueError("make_dense: variable_major=True needs num_variables")
        return Linear(features, **common)
    return VariableLinear(num_variables, features, variable_major=variable_major, **common)


class FeatureLayerNorm(nn.Module):
    """LayerNorm over the last axis; with `num_variables`, scale and bias `(V, F)` per variable.

    Per-variable inputs are `(..., V, F)`, or `(V, ..., F)` with `variable_major`.
    """

    num_variables: int | None = None
    epsilon: float = DEFAULT_EPSILON
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    variable_major: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        params = self.variables.get("params", {})
        check_input_width("FeatureLayerNorm", x, params, ("scale",), what="layer norm", axis=-1)
        shape = (x.shape[-1],) if self.num_variables is None else (self.num_variables, x.shape[-1])
        scale = self.param("scale", nn.initializers.ones_init(), shape, self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros_init(), shape, self.param_dtype)
        if self.variable_major and self.num_variables is not None:
            scale = variable_major_broadcast(scale, x.ndim)
            bias = variable_major_broadcast(bias, x.ndim)
        # Statistics in at least float32, whatever the compute dtype; without a dtype the
        # result has x's (a float dtype for integer x).
        return layer_norm(x, scale, bias, self.epsilon, self.dtype)


class GatedLinearUnit(nn.Module):
    """GLU with input dropout: `Dropout(x) -> (W4 x + b4) ⊙ σ(W5 x + b5)`, `(..., I) -> (..., F)`.

    Both halves come from one fused projection to `2F`. With `dropout_rate > 0`
    the call needs `deterministic` (True: inference, False: training). A
    non-floating `x` (integers, booleans) raises `TypeError`, as in the
    other blocks: the projection would cast it to the compute dtype silently.
    """

    features: int
    dropout_rate: float = 0.0
    num_variables: int | None = None
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    dot_general_cls: Callable[..., nn.Module] | None = None
    variable_major: bool = False

    def __post_init__(self) -> None:
        _check_gated_config("GatedLinearUnit", self)
        super().__post_init__()

    @nn.compact
    def __call__(self, x: Array, deterministic: bool | None = None) -> Array:
        deterministic = resolve_deterministic(
            "GatedLinearUnit", deterministic, self.dropout_rate, self.is_initializing()
        )
        x = jnp.asarray(x)
        check_feature_axis("GatedLinearUnit", "x", x)
        check_floating("GatedLinearUnit", "x", x)
        params = self.variables.get("params", {})
        check_input_width("GatedLinearUnit", x, params, ("projection", "kernel"), what="unit")
        x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
        projected = make_dense(
            2 * self.features,
            self.num_variables,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            dot_general_cls=self.dot_general_cls,
            variable_major=self.variable_major,
            name="projection",
        )(x)
        value, gate = jnp.split(projected, 2, axis=-1)
        return value * nn.sigmoid(gate)


class GateAddNorm(nn.Module):
    """`LayerNorm(skip + GLU(x))`: the gated skip connection of the TFT, `(..., F)`.

    A non-floating `x` or `skip` raises `TypeError` (it would be cast silently).
    """

    features: int
    dropout_rate: float = 0.0
    num_variables: int | None = None
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    dot_general_cls: Callable[..., nn.Module] | None = None
    variable_major: bool = False

    def __post_init__(self) -> None:
        _check_gated_config("GateAddNorm", self)
        super().__post_init__()

    @nn.compact
    def __call__(self, x: Array, skip: Array, deterministic: bool | None = None) -> Array:
        deterministic = resolve_deterministic(
            "GateAddNorm", deterministic, self.dropout_rate, self.is_initializing()
        )
        x, skip = jnp.asarray(x), jnp.asarray(skip)
        check_feature_axis("GateAddNorm", "x", x)
        check_floating("GateAddNorm", "x", x)
        check_floating("GateAddNorm", "skip", skip)
        params = self.variables.get("params", {})
        check_input_width("GateAddNorm", x, params, ("glu", "projection", "kernel"), what="block")
        # The output has x's shape with `features` last; a skip of another shape would
        # broadcast silently in the sum (a (B, 1, F) skip over every step, say).
        expected = (*jnp.shape(x)[:-1], self.features)
        if tuple(jnp.shape(skip)) != expected:
            raise ValueError(
                f"GateAddNorm: skip must have shape {expected} (x's shape with features="
                f"{self.features} last), got {tuple(jnp.shape(skip))}"
            )
        gated = GatedLinearUnit(
            self.features,
            self.dropout_rate,
            self.num_variables,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            dot_general_cls=self.dot_general_cls,
            variable_major=self.variable_major,
            name="glu",
        )(x, deterministic)
        return FeatureLayerNorm(
            self.num_variables,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            variable_major=self.variable_major,
            name="layer_norm",
        )(skip.astype(gated.dtype) + gated)


def _check_context(context: Array, x: Array, variable_major: bool, per_variable: bool) -> None:
    """Raises `ValueError` unless `context` is `(B, C)` with `x`'s batch size."""
    # A batch axis besides the feature axis (and the variable axis, per variable); a 1-D
    # x would have its feature axis taken for the batch, a (V, I) per-variable x its
    # variable axis, and broadcast against the context.
    if variable_major:
        layout = "(V, B, ..., I)"
    else:
        layout = "(B, ..., V, I)" if per_variable else "(B, ..., I)"
    if x.ndim < (3 if per_variable else 2):
        raise ValueError(
            f"GatedResidualNetwork: x must have a batch axis to go with a context, {layout}, "
            f"got x of shape {tuple(x.shape)}"
        )
    batch = x.shape[1] if variable_major else x.shape[0]
    if jnp.ndim(context) != 2 or context.shape[0] != batch:
        raise ValueError(
            f"GatedResidualNetwork: context must have shape (B, C) = ({batch}, C) for x of "
            f"shape {tuple(x.shape)} {layout}, got {tuple(jnp.shape(context))}"
        )


def _broadcast_context(context: Array, ndim: int, variable_major: bool) -> Array:
    """`(B, F)` -> `(B, 1, ..., 1, F)`, or `(1, B, 1, ..., 1, F)` for variable-major inputs.

    The result has `ndim` axes and broadcasts over time and variables.
    """
    batch, features = context.shape
    if variable_major:
        return context.reshape((1, batch) + (1,) * (ndim - 3) + (features,))
    return context.reshape((batch,) + (1,) * (ndim - 2) + (features,))


def check_context_width(owner: str, context: Array, params: Any, where: str) -> None:
    """Raises `ValueError` unless the parameters hold a context layer of `context`'s width.

    Flax said only "Could not find parameter named kernel in scope /context"
    for a network initialized without a context, and named an initializer's
    shape for one of another width; `where` is the context layer's path.
    """
    layer: Any = params
    for name in where.split("/"):
        layer = layer.get(name, {}) if hasattr(layer, "get") else {}
    kernel = layer.get("kernel") if hasattr(layer, "get") else None
    if kernel is None:
        raise ValueError(
            f"{owner}: a context was given, but the network was initialized without one (its "
            f"parameters hold no {where} layer): initialize it with a context, or leave the "
            "context out"
        )
    width = int(np.shape(kernel)[-2])
    if context.shape[-1] != width:
        raise ValueError(
            f"{owner}: context has width {context.shape[-1]} (its last axis), but the network "
            f"was initialized with a context of width {width}"
        )


def _check_input_width(x: Array, params: Any) -> None:
    """Raises `ValueError` unless `x` has the input width the network was initialized with.

    Flax named only a scope ("Could not find parameter named kernel in scope
    /skip", or an initializer's shape at "/input").
    """
    check_input_width("GatedResidualNetwork", x, params, ("input", "kernel"), what="network")


class GatedResidualNetwork(nn.Module):
    """The TFT's gated residual network, `(..., I) -> (..., features)`.

    `η2 = ELU(W2 x + W3 c + b2)`, `η1 = W1 η2 + b1`,
    `GRN(x, c) = LayerNorm(skip(x) + GLU(η1))`, where `skip` is the identity
    when `I == features` and a learned linear map otherwise, and the context
    term `W3 c` (no bias) is present only when a context is given.

    Args (call):
      x: `(B, ..., I)`; with `num_variables=V` `(B, ..., V, I)`, or
        `(V, B, ..., I)` with `variable_major=True` as well.
      context: optional `(B, C)`, broadcast over every axis of `x` but the
        batch and the feature axis (time, variables).
      deterministic: required when `dropout_rate > 0` (False: dropout on, with
        the `'dropout'` RNG; True: off); may be left out without dropout.

    Returns `(..., features)` in the compute dtype: `dtype`, else the
    promotion of the inputs and the parameters, so bfloat16 inputs with the
    default float32 `param_dtype` and no `dtype` compute and return float32
    (pass `dtype=jnp.bfloat16` to compute in bfloat16).

    Raises:
      TypeError: `x` or `context` is not floating point (an integer array
        would be cast to the compute dtype silently).
      ValueError: `context` is not `(B, C)` with `x`'s batch size, `context`
        is left out of a call whose parameters hold a context layer (Flax
        would skip that layer silently: the network initialized with a
        context would run without it), or dropout is on and `deterministic`
        was not given.
    """

    features: int
    hidden_features: int | None = None
    dropout_rate: float = 0.0
    num_variables: int | None = None
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    dot_general_cls: Callable[..., nn.Module] | None = None
    variable_major: bool = False

    def __post_init__(self) -> None:
        _check_gated_config("GatedResidualNetwork", self)
        check_positive_int(
            "GatedResidualNetwork", "hidden_features", self.hidden_features, optional=True
        )
        super().__post_init__()

    @nn.compact
    def __call__(
        self, x: Array, context: Array | None = None, deterministic: bool | None = None
    ) -> Array:
        deterministic = resolve_deterministic(
            "GatedResidualNetwork", deterministic, self.dropout_rate, self.is_initializing()
        )
        hidden = self.hidden_features or self.features
        x = jnp.asarray(x)
        check_feature_axis("GatedResidualNetwork", "x", x)
        check_floating("GatedResidualNetwork", "x", x)
        if not self.is_initializing():
            _check_input_width(x, self.variables.get("params", {}))
        if context is not None:
            context = jnp.asarray(context)
            check_floating("GatedResidualNetwork", "context", context)
            _check_context(context, x, self.variable_major, self.num_variables is not None)
            if not self.is_initializing():
                check_context_width(
                    "GatedResidualNetwork", context, self.variables.get("params", {}), "context"
                )
        elif not self.is_initializing() and "context" in self.variables.get("params", {}):
            raise ValueError(
                "GatedResidualNetwork: context is None, but the parameters hold a context "
                "layer (context/kernel): the network was initialized with a context, so pass one"
            )

        def dense(features: int, name: str) -> nn.Module:
            return make_dense(
                features,
                self.num_variables,
                name=name,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                dot_general_cls=self.dot_general_cls,
                variable_major=self.variable_major,
            )

        skip = x if x.shape[-1] == self.features else dense(self.features, "skip")(x)
        eta = dense(hidden, "input")(x)
        if context is not None:
            projected_context = Linear(
                hidden,
                use_bias=False,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                dot_general_cls=self.dot_general_cls,
                name="context",
            )(context)
            eta = eta + _broadcast_context(projected_context, eta.ndim, self.variable_major)
        eta = nn.elu(eta)
        eta = dense(hidden, "hidden")(eta)
        return GateAddNorm(
            self.features,
            self.dropout_rate,
            self.num_variables,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            dot_general_cls=self.dot_general_cls,
            variable_major=self.variable_major,
            name="gate_add_norm",
        )(eta, skip, deterministic)
