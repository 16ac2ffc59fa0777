"""The public building blocks take nested Python lists like arrays, as Flax's own layers do,
name an input of another width than the one they were initialized with, and refuse, as
the attention blocks do, integer inputs (the GRN and the variable selection network cast
them silently) and attention over zero steps.

Each block (Linear, VariableLinear, the gating blocks, the positional encoding,
the attention head and blocks) applied to nested lists must equal the same
call on arrays. The LSTM's and the embeddings' cases are in `test_lstm.py` and
`test_embeddings.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tft_jax.attention import AttentionHead, PositionalEncoding, TemporalSelfAttention
from tft_jax.embeddings import AffineEmbedding
from tft_jax.gating import FeatureLayerNorm, GateAddNorm, GatedLinearUnit, GatedResidualNetwork
from tft_jax.interpretable_attention import InterpretableMultiHeadAttention
from tft_jax.linear import Linear, VariableLinear
from tft_jax.lstm import LSTM
from tft_jax.variable_selection import VariableSelectionNetwork


def _nested(shape: tuple[int, ...]) -> list:
    """A nested Python list of `shape` holding 0.1, 0.2, ... (no `.shape`, no `.ndim`)."""
    return (np.arange(1, np.prod(shape) + 1) / 10.0).reshape(shape).tolist()


# (module, positional inputs as nested lists); each must equal the same call on arrays.
LIST_INPUT_CASES = {
    "Linear": (lambda: Linear(3), [(2, 4)]),
    "VariableLinear": (lambda: VariableLinear(2, 3), [(5, 2, 4)]),
    "GatedLinearUnit": (lambda: GatedLinearUnit(3), [(2, 4)]),
    "GateAddNorm": (lambda: GateAddNorm(3), [(2, 4), (2, 3)]),
    "GatedResidualNetwork": (lambda: GatedResidualNetwork(3), [(2, 4), (2, 5)]),
    "PositionalEncoding": (lambda: PositionalEncoding(4), [(2, 3, 4)]),
    "AttentionHead": (lambda: AttentionHead(4, 2), [(2, 3, 4)]),
    "TemporalSelfAttention": (lambda: TemporalSelfAttention(4, 2), [(2, 3, 4)]),
    "InterpretableMultiHeadAttention": (
        lambda: InterpretableMultiHeadAttention(2, 4),
        [(2, 1, 4), (2, 3, 4)],
    ),
}


@pytest.mark.parametrize("name", sorted(LIST_INPUT_CASES))
def test_public_blocks_take_nested_lists_like_arrays(name):
    """Flax's own layers take array-likes; these raised AttributeError ('list' object has no
    attribute 'shape') or IndexError from inside the module."""
    build, shapes = LIST_INPUT_CASES[name]
    module = build()
    arrays = [jnp.asarray(_nested(shape), jnp.float32) for shape in shapes]
    variables = module.init(jax.random.key(0), *arrays)
    expected = module.apply(variables, *arrays)
    got = module.apply(variables, *(_nested(shape) for shape in shapes))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6),
        got,
        expected,
    )


# (module, inputs at init as shapes, the input that is widened, the message's start):
# each raised Flax's ScopeParamShapeError ("the given initializer is expected to
# generate shape ...") for an input of another width, naming a scope, not the input.
WIDTH_CASES = {
    "Linear": (lambda: Linear(3), [(2, 4)], 0, "Linear: x"),
    "VariableLinear": (lambda: VariableLinear(2, 3), [(5, 2, 4)], 0, "VariableLinear: x"),
    "GatedLinearUnit": (lambda: GatedLinearUnit(3), [(2, 4)], 0, "GatedLinearUnit: x"),
    "GatedLinearUnit per variable": (
        lambda: GatedLinearUnit(3, num_variables=2),
        [(5, 2, 4)],
        0,
        "GatedLinearUnit: x",
    ),
    "GateAddNorm": (lambda: GateAddNorm(3), [(2, 4), (2, 3)], 0, "GateAddNorm: x"),
    "FeatureLayerNorm": (lambda: FeatureLayerNorm(), [(2, 4)], 0, "FeatureLayerNorm: x"),
    "FeatureLayerNorm per variable": (
        lambda: FeatureLayerNorm(num_variables=2),
        [(5, 2, 4)],
        0,
        "FeatureLayerNorm: x",
    ),
    "LSTM": (lambda: LSTM(3), [(2, 5, 4)], 0, "LSTM: inputs"),
}


@pytest.mark.parametrize("name", sorted(WIDTH_CASES))
def test_an_input_of_another_width_than_at_init_is_named(name):
    build, shapes, widened, owner = WIDTH_CASES[name]
    module = build()
    arrays = [jnp.ones(shape, jnp.float32) for shape in shapes]
    variables = module.init(jax.random.key(0), *arrays)
    module.apply(variables, *arrays)  # the width it was initialized with works
    wider = list(arrays)
    wider[widened] = jnp.ones((*shapes[widened][:-1], 7), jnp.float32)
    message = rf"^{owner} has width 7 \(its last axis\), but the .* inputs of width 4"
    with pytest.raises(ValueError, match=message):
        module.apply(variables, *wider)
    with pytest.raises(ValueError, match=message):  # the same check while tracing
        jax.jit(module.apply)(variables, *wider)


def _zero_variables(module, *inputs):
    """Zero variables of the shapes `module.init` gives: traced, not run (the checks come
    first in the call, so the values never matter)."""
    shapes = jax.eval_shape(module.init, jax.random.key(0), *inputs)
    return jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), shapes)


# (module, float inputs at init as shapes, the input made integer, the argument's name).
INTEGER_INPUT_CASES = {
    "GatedResidualNetwork x": (lambda: GatedResidualNetwork(3), [(2, 4)], 0, "x"),
    "GatedResidualNetwork context": (
        lambda: GatedResidualNetwork(3),
        [(2, 4), (2, 5)],
        1,
        "context",
    ),
    "VariableSelectionNetwork embedded": (
        lambda: VariableSelectionNetwork(2, 3),
        [(2, 2, 4)],
        0,
        "embedded",
    ),
    "VariableSelectionNetwork context": (
        lambda: VariableSelectionNetwork(2, 3),
        [(2, 2, 4), (2, 5)],
        1,
        "context",
    ),
}


@pytest.mark.parametrize("name", sorted(INTEGER_INPUT_CASES))
def test_an_integer_input_is_named_not_cast(name):
    # The first layer cast integer codes to the compute dtype and read them as magnitudes,
    # silently; the attention blocks already refused them with this TypeError.
    build, shapes, made_integer, argument = INTEGER_INPUT_CASES[name]
    module = build()
    arrays = [jnp.ones(shape, jnp.float32) for shape in shapes]
    variables = _zero_variables(module, *arrays)
    arrays[made_integer] = arrays[made_integer].astype(jnp.int32)
    owner = name.split()[0]
    message = rf"^{owner}: {argument} must be floating point .*got int32"
    with pytest.raises(TypeError, match=message):
        module.apply(variables, *arrays)
    with pytest.raises(TypeError, match=message):  # at init too
        module.init(jax.random.key(0), *arrays)


def test_variable_selection_names_integer_values_of_an_affine_embedding():
    module = VariableSelectionNetwork(2, 3)
    values = jnp.ones((2, 2), jnp.int32)
    embedded = AffineEmbedding(values, jnp.ones((2, 4)), jnp.zeros((2, 4)))
    with pytest.raises(TypeError, match=r"embedded\.values must be floating point .*got int32"):
        module.init(jax.random.key(0), embedded)


@pytest.mark.parametrize("empty", ["queries", "keys_values"])
def test_interpretable_attention_refuses_zero_steps(empty):
    # Tq = 0 returned an empty output, Tk = 0 zeros with weights (B, heads, Tq, 0), both
    # silently; TemporalSelfAttention refuses T = 0 as well.
    module = InterpretableMultiHeadAttention(2, 4)
    inputs = {"queries": jnp.ones((2, 1, 4)), "keys_values": jnp.ones((2, 3, 4))}
    variables = _zero_variables(module, *inputs.values())
    inputs[empty] = inputs[empty][:, :0]
    steps = "Tq" if empty == "queries" else "Tk"
    message = rf"{empty} must have at least one step, {steps} > 0 .*got shape \(2, 0, 4\)"
    with pytest.raises(ValueError, match=message):
        module.apply(variables, *inputs.values())
    with pytest.raises(ValueError, match=message):
        module.init(jax.random.key(0), *inputs.values())
