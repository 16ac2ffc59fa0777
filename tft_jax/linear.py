"""Dense layers whose contraction can be replaced, the hook that quantization uses.

Every matrix product of the TFT that multiplies an activation by a weight goes
through `Linear` or `VariableLinear`. Both call `lax.dot_general` by default; a
module factory passed as `dot_general_cls` takes its place, which is how
`qat` injects fake quantization and integer matmuls without a copy of the
model code (the same pattern as Flax's `nn.Dense(dot_general_cls=...)`).

The protocol of `dot_general_cls`: it is called as
``dot_general_cls(name="dot_general", lhs_bounds=bounds)`` inside the layer's
scope, and the module it returns is called like ``lax.dot_general``:
``module(lhs, rhs, dimension_numbers) -> array``. ``lhs`` is the activation,
``rhs`` the kernel (passed unconverted when it is an integer array, so an int8
kernel stays int8). The kernel axes that are not contracted are its output
channels. ``lhs_bounds`` is ``(low, high)`` when the activation has a range
known from the math (an LSTM hidden state lies in ``[-1, 1]``), else None.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax import lax

from tft_jax.config import canonical_dtype

Array = Any
Dtype = Any
Initializer = Callable[..., Array]

default_kernel_init = nn.initializers.glorot_uniform()


def check_positive_int(owner: str, name: str, value: Any, optional: bool = False) -> None:
    """Raises `ValueError` unless `value` is a positive int (or None when `optional`).

    A zero or negative size would otherwise fail deep inside parameter
    initialization (a division by zero in the initializer, or an XLA error
    about a negative dimension) without naming the field.
    """
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        expected = "a positive int or None" if optional else "a positive int"
        raise ValueError(f"{owner}: {name} must be {expected}, got {value!r}")


def check_floating(owner: str, name: str, x: Array) -> None:
    """Raises `TypeError` unless `x` is a floating-point array.

    The first layer would cast an integer (or boolean) input to the compute
    dtype silently, so codes meant for an embedding would be read as
    magnitudes; the attention blocks refuse them through it too.
    """
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"{owner}: {name} must be floating point (float32, bfloat16, ...), got {dtype}"
        )


def check_float_dtype(owner: str, name: str, value: Any, optional: bool = False) -> None:
    """Raises unless `value` names a floating dtype (float32, bfloat16, ...), or is None when
    `optional`.

    A string that is no dtype failed deep inside JAX at the first call, and an
    integer `param_dtype` made integer parameters that the initializers
    truncate. `TFTConfig`'s own check (`canonical_dtype`), with the owner.
    """
    if optional and value is None:
        return
    canonical_dtype(f"{owner}: {name}", value)


def check_feature_axis(owner: str, name: str, x: Array) -> None:
    """Raises `ValueError` unless `x` has a last (feature) axis of positive width.

    A scalar failed with an `IndexError` reading `x.shape[-1]`, and a width of
    0 with a `ZeroDivisionError` inside the kernel initializer (its fan-in).
    Shapes only: works under `jax.jit`.
    """
    shape = tuple(np.shape(x))
    if not shape:
        raise ValueError(f"{owner}: {name} must have a feature axis (..., I), got shape {shape}")
    if shape[-1] == 0:
        raise ValueError(
            f"{owner}: {name} must have a positive width (its last axis), got shape {shape}"
        )


class InputWidthError(ValueError):
    """An input whose last axis is not the width the layer's parameters were made for."""


def check_input_width(
    owner: str,
    x: Array,
    params: Any,
    path: Sequence[str],
    *,
    name: str = "x",
    what: str = "layer",
    axis: int = -2,
) -> None:
    """Raises `InputWidthError` (a `ValueError`) unless `x`'s last axis has the width the
    parameters were made for.

    Flax raised `ScopeParamShapeError` instead ("the given initializer is
    expected to generate shape ..."), naming a scope and an initializer but
    not the argument. `path` leads through `params` (the module's `'params'`
    collection) to the array whose `axis` is the input width (a kernel's
    `-2`, a LayerNorm scale's `-1`). Nothing is checked before that array
    exists (during `init`) or when it is absent. Shapes only: no cost in a
    compiled program.
    """
    check_feature_axis(owner, name, x)  # a scalar has no width to compare
    node = params
    for key in path:
        node = node.get(key) if hasattr(node, "get") else None
        if node is None:
            return
    width = int(np.shape(node)[axis])
    if np.shape(x)[-1] != width:
        raise InputWidthError(
            f"{owner}: {name} has width {np.shape(x)[-1]} (its last axis), but the {what} was "
            f"initialized with inputs of width {width}"
        )


def _cast_operands(
    x: Array, kernel: Array, bias: Array | None, dtype: Dtype | None
) -> tuple[Array, Array, Array | None]:
    """Casts activation, kernel and bias to the compute dtype; integer kernels stay integer."""
    if dtype is None:
        float_operands = [x, bias] if bias is not None else [x]
        if not jnp.issubdtype(kernel.dtype, jnp.integer):
            float_operands.append(kernel)
        dtype = jnp.result_type(*float_operands)
    x = jnp.asarray(x, dtype)
    if not jnp.issubdtype(kernel.dtype, jnp.integer):
        kernel = jnp.asarray(kernel, dtype)
    if bias is not None:
        bias = jnp.asarray(bias, dtype)
    return x, kernel, bias


class Linear(nn.Module):
    """Affine map over the last axis: `(..., I) -> (..., features)`.

    Parameters: `kernel (I, features)`, `bias (features,)`.
    """

    features: int
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init
    bias_init: Initializer = nn.initializers.zeros_init()
    dot_general_cls: Callable[..., nn.Module] | None = None
    input_bounds: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        check_positive_int("Linear", "features", self.features)
        check_float_dtype("Linear", "dtype", self.dtype, optional=True)
        check_float_dtype("Linear", "param_dtype", self.param_dtype)
        super().__post_init__()

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = jnp.asarray(x)  # a nested list or a scalar: no `.shape` to read otherwise
        check_feature_axis("Linear", "x", x)
        # An integer or boolean x would be cast to the compute dtype silently.
        check_floating("Linear", "x", x)
        check_input_width("Linear", x, self.variables.get("params", {}), ("kernel",))
        kernel = self.param(
            "kernel", self.kernel_init, (x.shape[-1], self.features), self.param_dtype
        )
        bias = (
            self.param("bias", self.bias_init, (self.features,), self.param_dtype)
            if self.use_bias
            else None
        )
        x, kernel, bias = _cast_operands(x, kernel, bias, self.dtype)
        dimension_numbers = (((x.ndim - 1,), (0,)), ((), ()))
        if self.dot_general_cls is None:
            y = lax.dot_general(x, kernel, dimension_numbers)
        else:
            dot_general = self.dot_general_cls(name="dot_general", lhs_bounds=self.input_bounds)
            y = dot_general(x, kernel, dimension_numbers)
        if bias is not None:
            y = y + bias
        return y


class VariableLinear(nn.Module):
    """One affine map per input variable, computed as a single batched contraction.

    `x (..., V, I) -> (..., V, features)` with parameters `kernel (V, I, features)`
    and `bias (V, features)`: variable `v` uses only `kernel[v]`, so the V
    per-variable networks of a variable selection network cost one matmul.

    With `variable_major=True` the variable axis comes first instead:
    `x (V, ..., I) -> (V, ..., features)`, the same parameters and the same
    values. That is the layout the batched contraction produces, so no
    transpose of the (possibly wide) output is needed; a stack of
    per-variable layers (the per-variable GRNs) runs in it end to end and
    the caller moves the variable axis once.
    """

    num_variables: int
    features: int
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.variance_scaling(
        1.0, "fan_avg", "uniform", in_axis=-2, out_axis=-1, batch_axis=(0,)
    )
    bias_init: Initializer = nn.initializers.zeros_init()
    dot_general_cls: Callable[..., nn.Module] | None = None
    variable_major: bool = False

    def __post_init__(self) -> None:
        for name in ("num_variables", "features"):
            check_positive_int("VariableLinear", name, getattr(self, name))
        check_float_dtype("VariableLinear", "dtype", self.dtype, optional=True)
        check_float_dtype("VariableLinear", "param_dtype", self.param_dtype)
        super().__post_init__()

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = jnp.asarray(x)
        variable_axis = 0 if self.variable_major else x.ndim - 2
        if x.ndim < 2 or x.shape[variable_axis] != self.num_variables:
            expected = (
                f"({self.num_variables}, ..., I)"
                if self.variable_major
                else f"(..., {self.num_variables}, I)"
            )
            raise ValueError(f"VariableLinear expects x of shape {expected}, got {tuple(x.shape)}")
        check_feature_axis("VariableLinear", "x", x)
        check_floating("VariableLinear", "x", x)  # cast silently otherwise, as in `Linear`
        check_input_width("VariableLinear", x, self.variables.get("params", {}), ("kernel",))
        kernel = self.param(
            "kernel",
            self.kernel_init,
            (self.num_variables, x.shape[-1], self.features),
            self.param_dtype,
        )
        bias = (
            self.param(
                "bias", self.bias_init, (self.num_variables, self.features), self.param_dtype
            )
            if self.use_bias
            else None
        )
        x, kernel, bias = _cast_operands(x, kernel, bias, self.dtype)
        dimension_numbers = (((x.ndim - 1,), (1,)), ((variable_axis,), (0,)))
        if self.dot_general_cls is None:
            y = lax.dot_general(x, kernel, dimension_numbers)
        else:
            dot_general = self.dot_general_cls(name="dot_general", lhs_bounds=None)
            y = dot_general(x, kernel, dimension_numbers)
        # dot_general puts the batch (variable) axis first: (V, ..., features).
        if not self.variable_major:
            y = jnp.moveaxis(y, 0, -2)
        if bias is not None:
            y = y + (variable_major_broadcast(bias, y.ndim) if self.variable_major else bias)
        return y


def variable_major_broadcast(per_variable: Array, ndim: int) -> Array:
    """`(V, F) -> (V, 1, ..., 1, F)` with `ndim` axes, to broadcast over `(V, ..., F)`."""
    return per_variable.reshape(per_variable.shape[:1] + (1,) * (ndim - 2) + per_variable.shape[1:])
