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


def test_interpretable_attention_drops_out_each_head_before_the_average():
    # The docstring and the paper's code drop each head's output, then average: with H
    # equal heads and the kept ones rescaled by 1/(1-p), an averaged element is
    # k/(H(1-p)) times the clean one, k the heads kept. Dropout on the average instead
    # gives only 0 or 1/(1-p). The output dropout after the projection multiplies by
    # 0 or 1/(1-p) once more.
    heads, features, rate = 4, 8, 0.5
    head_dim = features // heads
    layer = InterpretableMultiHeadAttention(num_heads=heads, features=features, dropout_rate=rate)
    x = jnp.asarray(np.random.default_rng(3).normal(size=(4, 6, features)), jnp.float32)
    params = dict(jax.jit(lambda: layer.init(jax.random.key(0), x, x))()["params"])
    # Zero query and key kernels: every head has the same uniform weights, so the same
    # output (the heads share the value projection).
    for name in ("query", "key"):
        params[name] = {"kernel": jnp.zeros_like(params[name]["kernel"])}
    # Output feature j copies averaged feature j mod head_dim: the projection mixes nothing.
    params["out"] = {"kernel": jnp.asarray(np.tile(np.eye(head_dim, dtype=np.float32), heads))}
    variables = {"params": params}
    clean, noisy = jax.jit(
        lambda v: (
            layer.apply(v, x, x, deterministic=True)[0],
            layer.apply(v, x, x, deterministic=False, rngs={"dropout": jax.random.key(1)})[0],
        )
    )(variables)
    clean, noisy = np.asarray(clean, np.float64), np.asarray(noisy, np.float64)
    assert np.all(np.abs(clean) > 1e-3)
    ratio = noisy / clean
    # k/(H(1-p)) per head dropout, times 0 or 1/(1-p) for the output dropout.
    allowed = np.arange(heads + 1) / (heads * (1 - rate) ** 2)
    nearest = allowed[np.argmin(np.abs(ratio[..., None] - allowed), axis=-1)]
    np.testing.assert_allclose(ratio, nearest, rtol=1e-5, atol=1e-5)
    levels = set(np.unique(nearest[nearest > 0]).tolist())
    assert len(levels) >= 3, f"kept elements only at ratios {sorted(levels)}: not per head"
