"""Fourth review of the building blocks, used as a researcher composing their own model.

Each test is a way a user of `GatedResidualNetwork`, `TemporalSelfAttention`,
`LSTM` and `RealEmbedding` got a silently wrong result or an error that did
not name the argument.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tft_jax import GatedResidualNetwork, TemporalSelfAttention
from tft_jax.embeddings import RealEmbedding
from tft_jax.lstm import LSTM

_RNG = np.random.default_rng(0)
_X = _RNG.normal(size=(2, 3, 4)).astype(np.float32)  # (B, T, I)
_CONTEXT = _RNG.normal(size=(2, 5)).astype(np.float32)  # (B, C)


def _numpy_grn(params: dict, x: np.ndarray, context: np.ndarray | None) -> np.ndarray:
    """The paper's GRN in float64: LayerNorm(skip(x) + GLU(W1 ELU(W2 x + W3 c + b2) + b1))."""

    def dense(name: str, z: np.ndarray, tree: dict = params) -> np.ndarray:
        layer = tree[name]
        out = z @ np.asarray(layer["kernel"], np.float64)
        return out + np.asarray(layer["bias"], np.float64) if "bias" in layer else out

    x = np.asarray(x, np.float64)
    skip = dense("skip", x) if "skip" in params else x
    eta = dense("input", x)
    if context is not None:
        eta = eta + dense("context", np.asarray(context, np.float64))[:, None, :]
    eta = dense("hidden", np.where(eta > 0, eta, np.expm1(np.minimum(eta, 0.0))))
    gate_add_norm = params["gate_add_norm"]
    value, gate = np.split(dense("projection", eta, gate_add_norm["glu"]), 2, axis=-1)
    z = skip + value / (1.0 + np.exp(-gate))
    mean = z.mean(-1, keepdims=True)
    variance = ((z - mean) ** 2).mean(-1, keepdims=True)
    norm = gate_add_norm["layer_norm"]
    return (z - mean) / np.sqrt(variance + 1e-6) * np.asarray(
        norm["scale"], np.float64
    ) + np.asarray(norm["bias"], np.float64)


@pytest.fixture(scope="module")
def grn_with_context() -> tuple[GatedResidualNetwork, dict]:
    """A GRN `(2, 3, 4) -> (2, 3, 6)` with a `(2, 5)` context; random LayerNorm parameters too."""
    grn = GatedResidualNetwork(6, hidden_features=3)
    variables = grn.init(jax.random.key(0), _X, _CONTEXT)
    leaves, tree = jax.tree.flatten(variables)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    variables = jax.tree.unflatten(
        tree,
        [
            jax.random.normal(k, leaf.shape, leaf.dtype)
            for k, leaf in zip(keys, leaves, strict=True)
        ],
    )
    return grn, variables


def test_grn_with_context_and_a_learned_skip_matches_the_paper_equations(grn_with_context):
    grn, variables = grn_with_context
    got = grn.apply(variables, _X, _CONTEXT)
    expected = _numpy_grn(variables["params"], _X, _CONTEXT)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_grn_initialized_with_a_context_refuses_a_call_without_one(grn_with_context):
    # Flax skips parameters a call does not use: the context term was dropped silently.
    grn, variables = grn_with_context
    with pytest.raises(ValueError, match="context is None, but the parameters hold a context"):
        grn.apply(variables, _X)


def test_grn_refuses_a_context_of_another_width_or_none_at_init(grn_with_context):
    grn, variables = grn_with_context
    wider = np.ones((*_CONTEXT.shape[:-1], _CONTEXT.shape[-1] + 2), np.float32)
    with pytest.raises(ValueError, match=r"context has width \d+ \(its last axis\), but the "):
        grn.apply(variables, _X, wider)
    without = grn.init(jax.random.key(1), _X)
    with pytest.raises(ValueError, match=r"a context was given, but the network was initialized "):
        grn.apply(without, _X, _CONTEXT)


def test_grn_initialized_without_a_context_still_runs_without_one():
    grn = GatedResidualNetwork(4)
    variables = grn.init(jax.random.key(0), _X)
    np.testing.assert_allclose(
        grn.apply(variables, _X), _numpy_grn(variables["params"], _X, None), rtol=1e-5, atol=1e-5
    )


def test_lstm_takes_nested_lists_like_arrays():
    lstm = LSTM(2)
    state = (np.full((2, 2), 0.5, np.float32), np.zeros((2, 2), np.float32))
    variables = lstm.init(jax.random.key(0), _X)
    expected = lstm.apply(variables, _X, state)
    got = lstm.apply(variables, _X.tolist(), [state[0].tolist(), state[1].tolist()])
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(a, b)


def test_real_embedding_takes_nested_lists_like_arrays():
    embedding = RealEmbedding(4, 3)
    variables = embedding.init(jax.random.key(0), _X)
    np.testing.assert_array_equal(
        embedding.apply(variables, _X.tolist()), embedding.apply(variables, _X)
    )


@pytest.fixture(scope="module")
def attention_block() -> tuple[TemporalSelfAttention, dict, np.ndarray]:
    block = TemporalSelfAttention(4, 2)
    x = _RNG.normal(size=(1, 3, 4)).astype(np.float32)
    return block, block.init(jax.random.key(0), x), x


@pytest.mark.parametrize("name", ["causal", "return_weights"])
def test_attention_flags_must_be_bools_not_truthy_strings(attention_block, name):
    # causal="False" was truthy: the block silently ran causal.
    block, variables, x = attention_block
    with pytest.raises(TypeError, match=f"{name} must be a bool, got str 'False'"):
        block.apply(variables, x, **{name: "False"})


@pytest.mark.parametrize("name", ["causal", "return_weights"])
def test_attention_flags_traced_under_jit_are_named(attention_block, name):
    block, variables, x = attention_block
    run = jax.jit(lambda flag: block.apply(variables, x, **{name: flag}))
    with pytest.raises(TypeError, match=f"{name} must be a concrete Python bool"):
        run(jnp.asarray(True))


def test_attention_flags_accept_numpy_bools(attention_block):
    block, variables, x = attention_block
    np.testing.assert_array_equal(
        block.apply(variables, x, causal=np.bool_(False)), block.apply(variables, x, causal=False)
    )
