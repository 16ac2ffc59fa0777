"""`InterpretableMultiHeadAttention`: the inputs it refuses by name, and where dropout acts.

An integer input or one whose width is not `features` is named (not cast
silently, nor a Flax shape error); dropout acts on the heads and the output,
never on the returned weights. Its float32 weights in bfloat16 are checked in
`test_interpretable_outputs.py`, its values against the float64 reference in
`test_reference_modules.py`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tft_jax import InterpretableMultiHeadAttention

WIDTH4 = InterpretableMultiHeadAttention(num_heads=2, features=4)
WIDTH4_ONES = np.ones((2, 3, 4), np.float32)


@functools.cache
def width4_variables() -> dict[str, Any]:
    """`WIDTH4`'s variables on `WIDTH4_ONES`: one jitted init for all the cases below."""
    return jax.jit(lambda: WIDTH4.init(jax.random.key(0), WIDTH4_ONES, WIDTH4_ONES))()


@pytest.mark.parametrize("name", ["queries", "keys_values"])
@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (np.ones((2, 3, 4), np.int32), TypeError, r"{name} must be floating point .*got int32"),
        (
            np.ones((2, 3, 6), np.float32),
            ValueError,
            r"{name}.shape\[-1\] must equal features=4, got 6 \(shape \(2, 3, 6\)\)",
        ),
    ],
    ids=["integer", "width"],
)
def test_interpretable_attention_names_an_integer_input_or_a_width_other_than_features(
    name, bad, error, message
):
    # Integers were cast silently; another width failed as Flax's ScopeParamShapeError.
    inputs = {"queries": WIDTH4_ONES, "keys_values": WIDTH4_ONES, name: bad}
    with pytest.raises(error, match=message.format(name=name)):
        WIDTH4.apply(width4_variables(), **inputs)


def test_interpretable_attention_drops_out_heads_and_output_never_the_weights():
    # The documented placement (the paper's code and pytorch-forecasting): the returned
    # weights are the same with dropout on, the output is not.
    layer = InterpretableMultiHeadAttention(num_heads=2, features=8, dropout_rate=0.5)
    x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 5, 8)), jnp.float32)
    # Jitted, both runs in one program: op by op, each primitive compiled apart.
    variables = jax.jit(lambda: layer.init(jax.random.key(0), x, x))()
    (quiet, quiet_weights), (noisy, noisy_weights) = jax.jit(
        lambda v: (
            layer.apply(v, x, x, deterministic=True),
            layer.apply(v, x, x, deterministic=False, rngs={"dropout": jax.random.key(1)}),
        )
    )(variables)
    np.testing.assert_array_equal(np.asarray(noisy_weights), np.asarray(quiet_weights))
    assert not np.allclose(np.asarray(noisy), np.asarray(quiet))
