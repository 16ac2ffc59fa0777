"""Boundary checks of `Linear` and `VariableLinear`: bad input fails early and clearly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tft_jax.linear import Linear, VariableLinear, check_input_width


def test_linear_refuses_a_zero_width_x_at_init() -> None:
    # Before: ZeroDivisionError from the kernel initializer (glorot's fan-in of 0).
    with pytest.raises(
        ValueError,
        match=r"Linear: x must have a positive width \(its last axis\), got shape "
        r"\(2, 4, 0\)",
    ):
        Linear(4).init(jax.random.key(0), jnp.ones((2, 4, 0)))
    with pytest.raises(
        ValueError,
        match=r"VariableLinear: x must have a positive width \(its last axis\), got "
        r"shape \(2, 3, 0\)",
    ):
        VariableLinear(3, 4).init(jax.random.key(0), jnp.ones((2, 3, 0)))


def test_check_input_width_refuses_a_scalar_instead_of_an_index_error() -> None:
    # Before: IndexError at `np.shape(x)[-1]`.
    params = {"kernel": np.ones((3, 4), np.float32)}
    with pytest.raises(ValueError, match=r"Owner: x must have a feature axis \(\.\.\., I\), got"):
        check_input_width("Owner", np.float32(1.0), params, ("kernel",))


@pytest.mark.parametrize("dtype", [jnp.int32, np.bool_])
def test_linear_refuses_an_x_that_is_not_floating(dtype: object) -> None:
    # Before: cast to the parameters' float32 silently (codes read as magnitudes).
    layer = Linear(2)
    variables = layer.init(jax.random.key(0), jnp.ones((2, 3)))
    with pytest.raises(TypeError, match=r"Linear: x must be floating point .*, got (int32|bool)"):
        layer.apply(variables, jnp.ones((2, 3), dtype))
    with pytest.raises(TypeError, match=r"Linear: x must be floating point"):
        layer.init(jax.random.key(0), np.ones((2, 3), dtype))
    with pytest.raises(TypeError, match=r"VariableLinear: x must be floating point"):
        VariableLinear(3, 2).init(jax.random.key(0), jnp.ones((2, 3, 4), dtype))


@pytest.mark.parametrize("layer", [Linear, lambda **kw: VariableLinear(2, **kw)])
def test_linear_layers_refuse_dtypes_that_are_not_floating(layer: object) -> None:
    with pytest.raises(TypeError, match=r"Linear: dtype must be a floating dtype, got 'floaty'"):
        layer(features=3, dtype="floaty")
    with pytest.raises(ValueError, match=r"Linear: param_dtype must be one of .*, got 'int32'"):
        layer(features=3, param_dtype=jnp.int32)
    assert layer(features=3, dtype=jnp.bfloat16).dtype == jnp.bfloat16
