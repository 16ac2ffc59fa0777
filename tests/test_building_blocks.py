"""The public building blocks take nested Python lists like arrays, as Flax's own layers do,
and name an input of another width than the one they were initialized with.

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
from tft_jax.gating import FeatureLayerNorm, GateAddNorm, GatedLinearUnit, GatedResidualNetwork
from tft_jax.interpretable_attention import InterpretableMultiHeadAttention
from tft_jax.linear import Linear, VariableLinear
from tft_jax.lstm import LSTM


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
