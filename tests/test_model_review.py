"""Second review pass of the model code: categorical inputs over time against the reference,
and input checks that must name the argument instead of crashing elsewhere.

The whole-model reference (`tests/reference_tft.py`) covers real inputs and
categorical statics; here its building blocks (variable selection, GRN, LSTM,
interpretable attention, each float64 NumPy from the paper) are composed into
a forward that also embeds categorical known and observed inputs over time,
so the column order of the selection weights and the sharing of the known
tables between history and horizon are checked against the equations.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import reference_tft as ref
from tests.test_reference_tft import cast, random_parameters
from tft_jax.attention import (
    AttentionHead,
    PositionalEncoding,
    TemporalSelfAttention,
    scaled_dot_product_attention,
)
from tft_jax.config import TFTConfig
from tft_jax.gating import GateAddNorm, GatedLinearUnit, GatedResidualNetwork
from tft_jax.interpretable_attention import InterpretableMultiHeadAttention
from tft_jax.linear import Linear, VariableLinear
from tft_jax.model import TemporalFusionTransformer

B, T, H = 2, 4, 3

CATEGORICAL_CONFIG = dict(
    num_static_features=1,
    static_categorical_cardinalities=(3,),
    num_known_features=2,
    known_categorical_cardinalities=(4, 5),
    num_observed_features=2,
    observed_categorical_cardinalities=(3,),
    hidden_dim=8,
    num_heads=2,
    sequence_length=T,
    prediction_horizon=H,
    variable_hidden_dim=4,
    dropout_rate=0.1,
)


def _config(use_known_history: bool, dtype: str = "float32") -> TFTConfig:
    return TFTConfig(
        **CATEGORICAL_CONFIG,
        use_known_history=use_known_history,
        dtype=dtype,
        param_dtype=dtype,
    )


def _inputs(cfg: TFTConfig) -> dict[str, Any]:
    rng = np.random.default_rng(0)

    def codes(leading: tuple[int, ...], cardinalities: tuple[int, ...]) -> np.ndarray:
        return np.stack([rng.integers(0, n, leading) for n in cardinalities], -1).astype(np.int32)

    values: dict[str, Any] = dict(
        static=rng.normal(size=(B, cfg.num_static_features)),
        historical=rng.normal(size=(B, T, cfg.num_observed_features)),
        future=rng.normal(size=(B, H, cfg.num_known_features)),
        static_categorical=codes((B,), cfg.static_categorical_cardinalities),
        future_categorical=codes((B, H), cfg.known_categorical_cardinalities),
        observed_categorical=codes((B, T), cfg.observed_categorical_cardinalities),
    )
    if cfg.use_known_history:
        values["known_history"] = rng.normal(size=(B, T, cfg.num_known_features))
        values["known_categorical_history"] = codes((B, T), cfg.known_categorical_cardinalities)
    return values


@functools.cache
def _parameters(use_known_history: bool) -> Any:
    """Random float64 parameters in the model's layout (LayerNorms away from 1 and 0)."""
    cfg = _config(use_known_history)
    return random_parameters(cfg, _inputs(cfg), np.random.default_rng(11))


def _embed_codes(codes: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
    """Column `i` of `codes (..., C)` looks up `embedding_i`: `(..., C, width)`."""
    return np.stack(
        [tables[f"embedding_{i}"][codes[..., i]] for i in range(codes.shape[-1])], axis=-2
    )


def _reference_forward(params: Any, values: dict[str, Any]) -> dict[str, np.ndarray]:
    """The paper's TFT with categorical inputs over time, from `reference_tft`'s blocks.

    Variables, in the documented order: history = observed reals, observed
    categoricals, then (with known history) known reals and known
    categoricals; horizon = known reals, known categoricals. The known tables
    (real prescalers and categorical embeddings) are the same over the
    history and the horizon.
    """
    p = ref.to_float64(params)
    steps = values["historical"].shape[1]
    static_embedded = np.concatenate(
        [
            ref.real_embedding(values["static"], p["static_embedding"]),
            _embed_codes(values["static_categorical"], p["static_categorical_embedding"]),
        ],
        axis=-2,
    )
    static_encoding, static_weights = ref.variable_selection(static_embedded, p["static_selection"])
    contexts = {
        name: ref.grn(static_encoding, p[f"static_context_{name}"]) for name in ref.CONTEXTS
    }

    def known(reals: np.ndarray, codes: np.ndarray) -> list[np.ndarray]:
        return [
            ref.real_embedding(reals, p["known_embedding"]),
            _embed_codes(codes, p["known_categorical_embedding"]),
        ]

    history_parts = [
        ref.real_embedding(values["historical"], p["observed_embedding"]),
        _embed_codes(values["observed_categorical"], p["observed_categorical_embedding"]),
    ]
    if "known_history" in values:
        history_parts += known(values["known_history"], values["known_categorical_history"])
    history, history_weights = ref.variable_selection(
        np.concatenate(history_parts, axis=-2), p["history_selection"], contexts["selection"]
    )
    horizon, future_weights = ref.variable_selection(
        np.concatenate(known(values["future"], values["future_categorical"]), axis=-2),
        p["future_selection"],
        contexts["selection"],
    )
    encoded, state = ref.lstm(history, p["encoder"], (contexts["state_h"], contexts["state_c"]))
    decoded, _ = ref.lstm(horizon, p["decoder"], state)
    temporal = ref.gate_add_norm(
        np.concatenate([encoded, decoded], axis=1),
        np.concatenate([history, horizon], axis=1),
        p["lstm_gate"],
    )
    enriched = ref.grn(temporal, p["static_enrichment"], contexts["enrichment"])
    attended, attention = ref.interpretable_attention(
        enriched[:, steps:], enriched, p["attention"], attend_to_self=True
    )
    gated = ref.gate_add_norm(attended, enriched[:, steps:], p["attention_gate"])
    features = ref.gate_add_norm(
        ref.grn(gated, p["positionwise_grn"]), temporal[:, steps:], p["output_gate"]
    )
    return dict(
        quantiles=ref.dense(features, p["quantile_head"]),
        attention=attention,
        static_weights=static_weights,
        history_weights=history_weights,
        future_weights=future_weights,
    )


@pytest.mark.parametrize("use_known_history", [True, False])
def test_categorical_inputs_over_time_equal_the_float64_reference(use_known_history):
    params = _parameters(use_known_history)
    values = _inputs(_config(use_known_history))
    expected = _reference_forward(params, values)
    model = TemporalFusionTransformer(_config(use_known_history, "float64"))
    with jax.enable_x64(True):
        output = jax.device_get(
            jax.jit(lambda v, x: model.apply({"params": v}, **x, deterministic=True))(
                cast(params, np.float64), cast(values, np.float64)
            )
        )
    for field in ref.OUTPUT_FIELDS:
        np.testing.assert_allclose(
            np.asarray(getattr(output, field), np.float64),
            expected[field],
            rtol=1e-10,
            atol=1e-10,
            err_msg=f"{field} differs from the float64 reference",
        )
    # Every categorical column carries weight that depends on its codes.
    assert np.ptp(expected["history_weights"][..., 2]) > 1e-3
    assert np.ptp(expected["future_weights"][..., 3]) > 1e-3


@pytest.mark.parametrize("scalar", [3.0, 3, np.float32(3.0)])
def test_linear_rejects_a_python_or_numpy_scalar_with_value_error(scalar):
    with pytest.raises(ValueError, match=r"Linear expects x of shape \(\.\.\., I\)"):
        Linear(4).init(jax.random.key(0), scalar)


def test_attention_kernel_refuses_a_mask_that_would_enlarge_the_output():
    """A `(B, 1, Tq, Tk)` mask with 3-D `(B, Tq, d)` inputs used to broadcast the
    weights to `(B, B, Tq, Tk)` and the output to `(B, B, Tq, dv)`, silently."""
    x = jnp.ones((2, 3, 4))
    with pytest.raises(ValueError, match=r"mask must broadcast to the logits' shape.*\(2, 3, 3\)"):
        scaled_dot_product_attention(x, x, x, np.ones((2, 1, 3, 3), bool))
    # A mask that broadcasts without enlarging is still taken, with the documented result.
    rows = np.array([[True], [True], [False]])  # (Tq, 1): the last query sees nothing
    output, weights = scaled_dot_product_attention(x, x, x, rows)
    assert output.shape == (2, 3, 4) and weights.shape == (2, 3, 3)
    np.testing.assert_allclose(np.asarray(weights[:, :2]), 1.0 / 3.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(weights[:, 2]), 0.0)


@pytest.mark.parametrize(
    "query_shape, key_shape, value_shape, match",
    [
        ((1, 2, 4), (1, 3, 5), (1, 3, 4), r"query .* and key .* the same depth d"),
        ((1, 2, 4), (1, 3, 4), (1, 2, 4), r"key .* and value .* the same number of steps Tk"),
        ((2, 2, 4), (3, 3, 4), (3, 3, 4), r"leading axes of query, key and value"),
        ((4,), (3, 4), (3, 4), r"query must have at least 2 axes"),
    ],
)
def test_attention_kernel_names_the_arguments_whose_shapes_do_not_fit(
    query_shape, key_shape, value_shape, match
):
    with pytest.raises(ValueError, match=match):
        scaled_dot_product_attention(
            jnp.ones(query_shape), jnp.ones(key_shape), jnp.ones(value_shape)
        )


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


def test_grn_names_a_scalar_input_instead_of_an_index_error():
    with pytest.raises(ValueError, match=r"GatedResidualNetwork: x must have a feature axis"):
        GatedResidualNetwork(3).init(jax.random.key(0), 2.0)
