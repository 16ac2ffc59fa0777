"""The TFT's building blocks against the float64 NumPy reference (`tests/reference_tft.py`).

LSTM (also against Flax's own `OptimizedLSTMCell` with the same weights), GRN
(with and without a context and a learned skip, one and many variables, both
layouts), LayerNorm at a tiny variance, VSN (many variables, one variable with
a context), embeddings and the interpretable attention. Parameters are random,
with the shapes `init` gives (`jax.eval_shape`, nothing compiled for init).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from properties import faults
from tests import reference_tft as ref
from tests.reference_parameters import random_parameters
from tft_jax.attention import causal_mask
from tft_jax.embeddings import CategoricalEmbedding, RealEmbedding
from tft_jax.gating import FeatureLayerNorm, GatedResidualNetwork
from tft_jax.interpretable_attention import InterpretableMultiHeadAttention
from tft_jax.lstm import LSTM
from tft_jax.variable_selection import VariableSelectionNetwork

TOLERANCE = dict(rtol=2e-5, atol=2e-6)


def normal(*shape: int, seed: int = 1, scale: float = 1.0) -> np.ndarray:
    return (scale * np.random.default_rng(seed).normal(size=shape)).astype(np.float32)


@functools.cache
def jitted(module: nn.Module, **kwargs: Any):
    return jax.jit(lambda params, *args: module.apply({"params": params}, *args, **kwargs))


def assert_close(actual: Any, expected: Any, **tolerance: float) -> None:
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, **(tolerance or TOLERANCE))


# ---------------------------------------------------------------------------
# LSTM

BATCH, STEPS, INPUTS, FEATURES = 2, 5, 3, 4


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "zero state"])
def test_lstm_equals_the_reference(seeded):
    module = LSTM(FEATURES)
    x = normal(BATCH, STEPS, INPUTS)
    state = (normal(BATCH, FEATURES, seed=2), normal(BATCH, FEATURES, seed=3)) if seeded else None
    params = random_parameters(module, x, state)
    outputs, (h, c) = jitted(module)(params, x, state)
    expected, (h_ref, c_ref) = ref.lstm(x, ref.to_float64(params), state)
    assert_close(outputs, expected)
    assert_close(h, h_ref)
    assert_close(c, c_ref)
    assert_close(outputs[:, -1], h_ref)


def test_lstm_equals_flax_optimized_lstm_cell_with_the_same_weights():
    """Gate order (input, forget, candidate, output) and state layout, against Flax's cell.

    Flax's cell names the gates `i, f, g, o`, keeps the bias on the recurrent part and
    carries `(c, h)`; ours carries `(h, c)` and has the bias on the input projection.
    """
    module = LSTM(FEATURES)
    x = normal(BATCH, STEPS, INPUTS)
    state = (normal(BATCH, FEATURES, seed=2), normal(BATCH, FEATURES, seed=3))
    params = random_parameters(module, x, state)
    w_x, bias = params["input"]["kernel"], params["input"]["bias"]
    w_h = params["cell"]["recurrent"]["kernel"]
    cell_params = {}
    for index, gate in enumerate("ifgo"):
        block = slice(index * FEATURES, (index + 1) * FEATURES)
        cell_params[f"i{gate}"] = {"kernel": w_x[:, block]}
        cell_params[f"h{gate}"] = {"kernel": w_h[:, block], "bias": bias[block]}

    def flax_lstm(cell_params, x, h, c):
        cell = nn.OptimizedLSTMCell(FEATURES)

        def step(carry, x_t):
            carry, out = cell.apply({"params": cell_params}, carry, x_t)
            return carry, out

        (c, h), outputs = jax.lax.scan(step, (c, h), jnp.swapaxes(x, 0, 1))
        return jnp.swapaxes(outputs, 0, 1), (h, c)

    expected, (h_flax, c_flax) = jax.jit(flax_lstm)(cell_params, x, *state)
    outputs, (h, c) = jitted(module)(params, x, state)
    assert_close(outputs, np.asarray(expected, np.float64))
    assert_close(h, np.asarray(h_flax, np.float64))
    assert_close(c, np.asarray(c_flax, np.float64))


def test_lstm_initializer_opens_the_forget_gate_in_the_reference_gate_order():
    """The forget-gate bias of 1 lands in the second block: the gate the reference treats as f."""
    module = LSTM(FEATURES)
    x = normal(BATCH, STEPS, INPUTS)
    bias = np.asarray(jax.jit(module.init)(jax.random.key(0), x)["params"]["input"]["bias"])
    expected = np.zeros(4 * FEATURES)
    expected[FEATURES : 2 * FEATURES] = 1.0
    np.testing.assert_array_equal(bias, expected)


# ---------------------------------------------------------------------------
# GRN and LayerNorm


@pytest.mark.parametrize(
    ("inputs", "features", "context"),
    [(5, 3, 4), (4, 4, None), (4, 4, 6)],
    ids=["skip+context", "identity", "identity+context"],
)
def test_grn_equals_the_reference(inputs, features, context):
    module = GatedResidualNetwork(features, hidden_features=7)
    x = normal(BATCH, STEPS, inputs)
    c = normal(BATCH, context, seed=4) if context else None
    params = random_parameters(module, x, c)
    assert ("skip" in params) == (inputs != features)
    assert ("context" in params) == (context is not None)
    got = jitted(module, deterministic=True)(params, x, c)
    assert_close(got, ref.grn(x, ref.to_float64(params), c))


@pytest.mark.parametrize("variable_major", [True, False])
def test_per_variable_grns_equal_one_reference_grn_per_variable(variable_major):
    variables, inputs, features = 3, 4, 5
    module = GatedResidualNetwork(features, num_variables=variables, variable_major=variable_major)
    x = normal(BATCH, STEPS, variables, inputs)  # (B, T, V, I)
    laid_out = np.moveaxis(x, 2, 0) if variable_major else x
    params = random_parameters(module, laid_out)
    got = np.asarray(jitted(module, deterministic=True)(params, laid_out), np.float64)
    if variable_major:
        got = np.moveaxis(got, 0, 2)
    p = ref.to_float64(params)
    for v in range(variables):
        assert_close(got[:, :, v], ref.grn(x[:, :, v], ref._variable_slice(p, v)))


def test_per_variable_grn_refuses_a_context_for_x_without_a_batch_axis():
    # (V, I) has no batch axis: a (V, C) context used to be added row v to variable v.
    module = GatedResidualNetwork(5, num_variables=3)
    with pytest.raises(ValueError, match=r"batch axis.*\(B, \.\.\., V, I\).*\(3, 4\)"):
        module.init(jax.random.key(0), normal(3, 4), normal(3, 2))


def test_layer_norm_at_a_tiny_variance_equals_the_reference():
    """Variance ~1e-6, the size of epsilon: where `sqrt(var + eps)` and `sqrt(var) + eps` part."""
    module = FeatureLayerNorm()
    x = normal(BATCH, STEPS, 6, scale=1e-3)
    params = random_parameters(module, x)
    expected = ref.layer_norm(x.astype(np.float64), ref.to_float64(params))
    assert_close(jitted(module)(params, x), expected)
    wrong = faults.REFERENCE_FAULTS[1]
    assert "epsilon" in wrong.name
    with wrong.patch():
        broken = jax.jit(lambda p, x: module.apply({"params": p}, x))(params, x)
    error = float(np.max(np.abs(np.asarray(broken, np.float64) - expected)))
    assert error > 0.1, f"the epsilon fault moved the output by only {error}"


# ---------------------------------------------------------------------------
# Variable selection and embeddings


@pytest.mark.parametrize(
    ("variables", "time_axis", "context"),
    [(3, True, 8), (1, False, 8)],
    ids=["many over time+context", "one static+context"],
)
def test_variable_selection_equals_the_reference(variables, time_axis, context):
    width, features = 4, 8
    module = VariableSelectionNetwork(variables, features, selection_hidden_features=5)
    shape = (BATCH, STEPS, variables, width) if time_axis else (BATCH, variables, width)
    x = normal(*shape)
    c = normal(BATCH, context, seed=4) if context else None
    params = random_parameters(module, x, c)
    combined, weights = jitted(module, deterministic=True)(params, x, c)
    expected, expected_weights = ref.variable_selection(x, ref.to_float64(params), c)
    assert_close(combined, expected)
    assert_close(weights, expected_weights)
    if variables == 1 and context:
        # The context acts (through the only variable's GRN), as the reference says it must.
        moved, _ = jitted(module, deterministic=True)(params, x, 2 * c)
        assert np.max(np.abs(np.asarray(moved) - np.asarray(combined))) > 1e-3


def test_embeddings_equal_the_reference():
    real = RealEmbedding(3, 4)
    x = normal(BATCH, STEPS, 3)
    params = random_parameters(real, x)
    assert_close(jitted(real)(params, x), ref.real_embedding(x, ref.to_float64(params)))
    categorical = CategoricalEmbedding((3, 5), 4)
    codes = np.array([[0, 4], [2, 1]], np.int32)
    params = random_parameters(categorical, codes)
    assert_close(
        jitted(categorical)(params, codes), ref.categorical_embedding(codes, ref.to_float64(params))
    )


# ---------------------------------------------------------------------------
# Interpretable attention


@pytest.mark.parametrize("attend_to_self", [True, False])
def test_interpretable_attention_equals_the_reference(attend_to_self):
    heads, features, keys, queries = 2, 8, 6, 3
    module = InterpretableMultiHeadAttention(heads, features)
    x = normal(BATCH, keys, features)
    mask = causal_mask(queries, keys, attend_to_self)
    np.testing.assert_array_equal(mask, ref.decoder_mask(queries, keys, attend_to_self))
    params = random_parameters(module, x[:, -queries:], x, mask)
    output, weights = jitted(module, deterministic=True)(params, x[:, -queries:], x, mask)
    expected, expected_weights = ref.interpretable_attention(
        x[:, -queries:].astype(np.float64),
        x.astype(np.float64),
        ref.to_float64(params),
        attend_to_self,
    )
    assert_close(output, expected)
    assert_close(weights, expected_weights)


# ---------------------------------------------------------------------------
# The folded, chunked selection path (real inputs given lazily) against the same reference


class _LazySelection(nn.Module):
    """Real inputs embedded lazily, then selected: the model's fast path for real variables."""

    num_variables: int
    chunk_rows: int

    @nn.compact
    def __call__(self, x: Any, context: Any) -> Any:
        embedded = RealEmbedding(self.num_variables, 4, lazy=True, name="embedding")(x)
        return VariableSelectionNetwork(
            self.num_variables,
            8,
            selection_hidden_features=5,
            chunk_rows=self.chunk_rows,
            name="selection",
        )(embedded, context, deterministic=True)


@pytest.mark.parametrize("variables", [3, 1])
def test_folded_chunked_selection_equals_the_reference(variables):
    """10 rows (batch x time) in chunks of 4: three chunks, the last one padded."""
    module = _LazySelection(variables, chunk_rows=4)
    x = normal(BATCH, STEPS, variables)
    c = normal(BATCH, 8, seed=4)
    params = random_parameters(module, x, c)
    combined, weights = jitted(module)(params, x, c)
    p = ref.to_float64(params)
    embedded = ref.real_embedding(x, p["embedding"])
    expected, expected_weights = ref.variable_selection(embedded, p["selection"], c)
    assert_close(combined, expected)
    assert_close(weights, expected_weights)
