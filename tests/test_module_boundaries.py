"""Bad input to the research-surface modules fails at the boundary, naming the argument.

Each case here used to pass silently with a wrong result (a float mask read as
`mask != 0`, a skip broadcast over time, codes of a missing column clamped to
the last one, a dropout rate outside [0, 1) rescaling activations, a NaN
quantile level giving a NaN loss) or to fail deep inside JAX (a scan
broadcasting error, a division by zero in an initializer). Every check runs on
static shapes and dtypes before anything is compiled, so the file is fast.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tft_jax import (
    AttentionHead,
    GateAddNorm,
    GatedLinearUnit,
    GatedResidualNetwork,
    InterpretableMultiHeadAttention,
    PositionalEncoding,
    TemporalSelfAttention,
    VariableSelectionNetwork,
    q_risk,
    quantile_loss,
)
from tft_jax.embeddings import CategoricalEmbedding, RealEmbedding
from tft_jax.layer_norm import layer_norm
from tft_jax.linear import Linear, VariableLinear
from tft_jax.lstm import LSTM

KEY = jax.random.key(0)


def init(module, *args, **kwargs):
    return module.init(KEY, *args, **kwargs)


# --- attention -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mask, error, message",
    [
        (np.zeros((3, 5), np.float32), TypeError, "mask must be boolean"),
        # (B, Tq, Tk) with B == heads used to broadcast its batch axis against the heads.
        (np.ones((2, 3, 5), bool), ValueError, r"got \(2, 3, 5\)"),
        (np.ones((5, 3), bool), ValueError, r"\(Tq, Tk\) = \(3, 5\)"),
    ],
    ids=["float", "batch_without_head_axis", "transposed"],
)
def test_interpretable_attention_rejects_a_mask_of_the_wrong_dtype_or_shape(mask, error, message):
    layer = InterpretableMultiHeadAttention(num_heads=2, features=4)
    with pytest.raises(error, match=message):
        init(layer, jnp.ones((2, 3, 4)), jnp.ones((2, 5, 4)), mask)


def test_interpretable_attention_takes_a_per_example_mask_and_zeroes_a_row_without_keys():
    layer = InterpretableMultiHeadAttention(num_heads=2, features=4)
    queries, keys_values = jnp.ones((2, 3, 4)), jnp.ones((2, 5, 4))
    mask = np.ones((2, 1, 3, 5), bool)
    mask[1, 0, 2] = False
    variables = jax.jit(lambda: init(layer, queries, keys_values, mask))()  # one program
    output, weights = layer.apply(variables, queries, keys_values, mask)
    assert weights.shape == (2, 2, 3, 5)
    np.testing.assert_array_equal(np.asarray(weights[1, :, 2]), 0.0)
    assert np.all(np.isfinite(np.asarray(output)))


def test_interpretable_attention_rejects_mismatched_batches_and_bad_sizes():
    layer = InterpretableMultiHeadAttention(num_heads=2, features=4)
    with pytest.raises(ValueError, match=r"same batch size.*\(1, 3, 4\).*\(2, 5, 4\)"):
        init(layer, jnp.ones((1, 3, 4)), jnp.ones((2, 5, 4)))
    with pytest.raises(ValueError, match="num_heads must be a positive int, got 0"):
        InterpretableMultiHeadAttention(num_heads=0, features=4)
    with pytest.raises(ValueError, match=r"dropout_rate must be in \[0, 1\), got -0.5"):
        InterpretableMultiHeadAttention(num_heads=2, features=4, dropout_rate=-0.5)


def test_attention_head_validates_its_sizes_and_temperature_shape():
    with pytest.raises(ValueError, match="AttentionHead: head_dim must be a positive int, got 0"):
        AttentionHead(hidden_dim=4, head_dim=0)
    head = AttentionHead(hidden_dim=4, head_dim=2)
    # A (T,) temperature used to divide the logits along the key axis.
    with pytest.raises(ValueError, match=r"temperature must be a scalar, got shape \(3,\)"):
        init(head, jnp.ones((2, 3, 4)), None, jnp.ones(3))


@pytest.mark.parametrize(
    "module, name",
    [
        (PositionalEncoding(4), "PositionalEncoding"),
        (AttentionHead(4, 2), "AttentionHead"),
        (TemporalSelfAttention(4, 2), "TemporalSelfAttention"),
    ],
    ids=["positional_encoding", "attention_head", "temporal_self_attention"],
)
def test_integer_sequences_are_rejected_instead_of_truncating_the_encoding(module, name):
    with pytest.raises(TypeError, match=f"{name}: x must be floating point.*int32"):
        init(module, jnp.ones((1, 3, 4), jnp.int32))


# --- gating and variable selection -----------------------------------------------------


@pytest.mark.parametrize("skip_shape", [(2, 1, 4), (), (2, 3, 1)])
def test_gate_add_norm_rejects_a_skip_that_would_broadcast(skip_shape):
    with pytest.raises(ValueError, match=r"GateAddNorm: skip must have shape \(2, 3, 4\)"):
        init(GateAddNorm(4), jnp.ones((2, 3, 4)), jnp.ones(skip_shape))


@pytest.mark.parametrize("module", [GatedLinearUnit, GateAddNorm, GatedResidualNetwork])
@pytest.mark.parametrize("rate", [-0.5, 1.0, 1.5, float("nan")])
def test_gating_blocks_reject_a_dropout_rate_outside_zero_one(module, rate):
    with pytest.raises(ValueError, match=f"{module.__name__}: dropout_rate must be in"):
        module(4, dropout_rate=rate)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(features=0), "features must be a positive int, got 0"),
        (dict(features=4, hidden_features=-1), "hidden_features must be a positive int or None"),
        (dict(features=4, num_variables=0), "num_variables must be a positive int or None"),
    ],
)
def test_grn_rejects_non_positive_sizes_when_built(kwargs, message):
    with pytest.raises(ValueError, match=f"GatedResidualNetwork: {message}"):
        GatedResidualNetwork(**kwargs)


@pytest.mark.parametrize("module", [GatedLinearUnit, GateAddNorm, GatedResidualNetwork])
@pytest.mark.parametrize("rate", [None, "0.1"], ids=["none", "string"])
def test_gating_blocks_name_a_dropout_rate_that_is_not_a_number(module, rate):
    # Before: "'<=' not supported between instances of 'float' and 'NoneType'", no field named.
    with pytest.raises(TypeError, match=f"{module.__name__}: dropout_rate must be a float"):
        module(4, dropout_rate=rate)


@pytest.mark.parametrize("deterministic", [2, -1, 0.5])
def test_gating_blocks_refuse_a_deterministic_that_is_not_a_bool(deterministic):
    # 0 and 1 read as bools; 2 or -1 is no answer to "is dropout off?" and would have
    # switched dropout off silently (truthy), as the string "False" would.
    module = GatedLinearUnit(4, dropout_rate=0.5)
    x = jnp.ones((2, 3, 4))
    variables = module.init(jax.random.key(0), x, deterministic=True)
    for ok in (0, 1, True, np.bool_(False)):
        module.apply(variables, x, deterministic=ok, rngs={"dropout": jax.random.key(1)})
    with pytest.raises(TypeError, match="GatedLinearUnit: deterministic must be a bool"):
        module.apply(variables, x, deterministic=deterministic)


@pytest.mark.parametrize("chunk_rows", [0, -1, 2.5])
def test_variable_selection_rejects_a_chunk_size_that_is_not_a_positive_int(chunk_rows):
    # 0 used to divide by zero in the chunk count, -1 to run as one chunk, silently.
    with pytest.raises(ValueError, match="VariableSelectionNetwork: chunk_rows must be a positive"):
        VariableSelectionNetwork(num_variables=3, features=4, chunk_rows=chunk_rows)


def test_grn_with_a_context_needs_a_batch_axis():
    # x (4,) used to be read as a batch of 4 and broadcast to (4, 4) against the context.
    with pytest.raises(ValueError, match=r"must have a batch axis.*\(4,\)"):
        init(GatedResidualNetwork(4), jnp.ones((4,)), jnp.ones((4, 3)))


def test_variable_selection_names_itself_and_the_callers_shapes():
    vsn = VariableSelectionNetwork(num_variables=3, features=4)
    with pytest.raises(
        ValueError, match=r"VariableSelectionNetwork: embedded must have shape .*got \(2, 5, 2, 6\)"
    ):
        init(vsn, jnp.ones((2, 5, 2, 6)))
    with pytest.raises(
        ValueError, match=r"VariableSelectionNetwork: context must have shape .*got \(2, 5, 4\)"
    ):
        init(vsn, jnp.ones((2, 5, 3, 6)), jnp.ones((2, 5, 4)))
    with pytest.raises(ValueError, match="num_variables must be a positive int, got 0"):
        VariableSelectionNetwork(num_variables=0, features=4)


def test_variable_selection_folded_path_checks_the_variable_count():
    # The folded path read the count from the embedding, ignoring num_variables.
    embedding = RealEmbedding(2, 3, lazy=True)
    lazy = embedding.apply(init(embedding, jnp.ones((2, 2))), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match=r"num_variables=3, got \(2, 2, 3\)"):
        init(VariableSelectionNetwork(num_variables=3, features=4), lazy)


# --- linear, embeddings, LSTM ----------------------------------------------------------


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Linear(0), "Linear: features must be a positive int, got 0"),
        (lambda: Linear(-1), "Linear: features must be a positive int, got -1"),
        (lambda: VariableLinear(0, 3), "VariableLinear: num_variables must be a positive int"),
        (lambda: VariableLinear(2, 0), "VariableLinear: features must be a positive int"),
        (lambda: LSTM(0), "LSTM: features must be a positive int, got 0"),
        (lambda: RealEmbedding(3, 0), "RealEmbedding: width must be a positive int, got 0"),
        (lambda: RealEmbedding(0, 3), "RealEmbedding: num_variables must be a positive int"),
        (lambda: CategoricalEmbedding((3,), 0), "CategoricalEmbedding: width must be a positive"),
    ],
    ids=[
        "linear_zero",
        "linear_negative",
        "variable_linear_variables",
        "variable_linear_features",
        "lstm",
        "real_embedding_width",
        "real_embedding_variables",
        "categorical_embedding_width",
    ],
)
def test_layers_reject_non_positive_sizes_when_built(build, message):
    # These failed in init as a ZeroDivisionError in the initializer or an XLA error about
    # a negative dimension (a zero-width categorical embedding passed, empty).
    with pytest.raises(ValueError, match=message):
        build()


def test_linear_rejects_a_scalar():
    with pytest.raises(ValueError, match=r"Linear: x must have a feature axis \(\.\.\., I\)"):
        init(Linear(3), jnp.ones(()))


@pytest.mark.parametrize("scalar", [3.0, 3, np.float32(3.0)])
def test_linear_rejects_a_python_or_numpy_scalar_with_value_error(scalar):
    with pytest.raises(ValueError, match=r"Linear: x must have a feature axis \(\.\.\., I\)"):
        Linear(4).init(jax.random.key(0), scalar)


def test_grn_names_a_scalar_input_instead_of_an_index_error():
    with pytest.raises(ValueError, match=r"GatedResidualNetwork: x must have a feature axis"):
        GatedResidualNetwork(3).init(jax.random.key(0), 2.0)


@pytest.mark.parametrize(
    "codes, error, message",
    [
        (np.zeros((2, 1), np.int32), ValueError, r"must have shape \(\.\.\., 2\).*got \(2, 1\)"),
        (np.zeros((2, 3), np.int32), ValueError, r"must have shape \(\.\.\., 2\).*got \(2, 3\)"),
        (np.zeros((2, 2), np.float32), TypeError, "must be integers, got float32"),
    ],
    ids=["missing_column", "extra_column", "float_codes"],
)
def test_categorical_embedding_checks_the_codes(codes, error, message):
    with pytest.raises(error, match=f"CategoricalEmbedding: codes {message}"):
        init(CategoricalEmbedding((3, 4), 5), codes)


@pytest.mark.parametrize(
    "codes, message",
    [
        (
            np.array([[0, 4], [2, 0]], np.int32),
            r"codes\[\.\.\., 1\] must lie in \[0, 4\).*\[0, 4\]",
        ),
        (
            np.array([[-1, 0], [2, 3]], np.int32),
            r"codes\[\.\.\., 0\] must lie in \[0, 3\).*\[-1, 2\]",
        ),
    ],
    ids=["past_the_last_row", "negative"],
)
def test_categorical_embedding_rejects_concrete_codes_outside_the_table(codes, message):
    # Used directly (not through the model) such codes were clipped to the last or the
    # first row of the table, silently.
    embedding = CategoricalEmbedding((3, 4), 5)
    variables = init(embedding, np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError, match=f"CategoricalEmbedding: {message}"):
        embedding.apply(variables, codes)


@pytest.mark.parametrize(
    "cardinalities, message",
    [
        ((), "cardinalities must not be empty"),
        ((3, 0), r"cardinalities\[1\] must be a positive int, got 0"),
        ((3, True), r"cardinalities\[1\] must be a positive int, got True"),
        ((2.0, 3), r"cardinalities\[0\] must be a positive int, got 2\.0"),
    ],
)
def test_categorical_embedding_names_the_bad_cardinality(cardinalities, message):
    codes = np.zeros((2, max(len(cardinalities), 1)), np.int32)
    with pytest.raises(ValueError, match=f"CategoricalEmbedding: {message}"):
        init(CategoricalEmbedding(cardinalities, 5), codes)


def test_real_embedding_reports_the_callers_shape_on_the_eager_path():
    with pytest.raises(
        ValueError, match=r"RealEmbedding expects x of shape \(\.\.\., 3\), got \(2, 2\)"
    ):
        init(RealEmbedding(3, 5), jnp.ones((2, 2)))


@pytest.mark.parametrize(
    "inputs, state, message",
    [
        (jnp.ones((5, 3)), None, r"inputs must be 3-D \(B, T, I\), got shape \(5, 3\)"),
        (
            jnp.ones((2, 5, 3)),
            (jnp.zeros((2, 3)),) * 2,
            r"initial_state h must have shape .* \(2, 4\).*\(2, 3\)",
        ),
        (
            jnp.ones((2, 5, 3)),
            (jnp.zeros((3, 4)),) * 2,
            r"initial_state h must have shape .* \(2, 4\).*\(3, 4\)",
        ),
        (jnp.ones((2, 5, 3)), (jnp.zeros((2, 4)),), "initial_state must be a pair"),
    ],
    ids=["2d_inputs", "state_features", "state_batch", "one_state"],
)
def test_lstm_checks_inputs_and_initial_state_before_the_scan(inputs, state, message):
    with pytest.raises(ValueError, match=f"LSTM: {message}"):
        init(LSTM(4), inputs, state)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_])
def test_lstm_refuses_integer_or_boolean_inputs_with_the_building_blocks_message(dtype):
    # Its projection would cast them to float silently, reading codes as magnitudes.
    with pytest.raises(TypeError, match=r"^LSTM: inputs must be floating point \(float32, .*got "):
        init(LSTM(4), jnp.ones((2, 5, 3), dtype))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_lstm_half_precision_params_are_flax_s_orthogonal_kernel_rounded(dtype):
    # Before: the orthogonal initializer's QR raised NotImplementedError in half precision.
    inputs = jnp.ones((2, 5, 3), dtype)
    half = jax.jit(LSTM(4, param_dtype=dtype).init)(KEY, inputs)
    full = jax.jit(LSTM(4).init)(KEY, inputs.astype(jnp.float32))
    half, full = (tree["params"]["cell"]["recurrent"]["kernel"] for tree in (half, full))
    assert half.dtype == dtype
    np.testing.assert_array_equal(np.asarray(half), np.asarray(full.astype(dtype)))


# --- losses ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred_shape, quantiles, message",
    [
        ((2, 3, 3), (0.1, float("nan"), 0.9), r"must lie in \(0, 1\)"),
        ((2, 3, 0), (), "must hold at least one level"),
    ],
    ids=["nan_level", "no_levels"],
)
def test_quantile_loss_rejects_levels_that_give_a_nan_loss(pred_shape, quantiles, message):
    with pytest.raises(ValueError, match=f"quantile_loss: quantiles {message}"):
        quantile_loss(jnp.ones(pred_shape), jnp.zeros((2, 3)), quantiles)


def test_q_risk_rejects_several_levels_with_a_message_naming_q():
    with pytest.raises(ValueError, match=r"q_risk: q must be one quantile level.*\(2,\)"):
        q_risk(jnp.ones((2, 3)), jnp.ones((2, 3)), np.array([0.1, 0.9]))


# --- layer_norm --------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("nan"), float("inf")])
def test_layer_norm_rejects_an_epsilon_that_gives_nan_or_garbage(epsilon):
    # With epsilon=0 a constant row normalized to 0 * inf = NaN, values and gradients.
    with pytest.raises(ValueError, match="layer_norm: epsilon must be positive and finite"):
        layer_norm(jnp.ones((1, 4)), jnp.ones(4), jnp.zeros(4), epsilon)
