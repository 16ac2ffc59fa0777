"""The public surface: top-level names, lazy imports, py.typed, `deterministic`, rank errors."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tft_jax
from tft_jax import (
    GateAddNorm,
    GatedLinearUnit,
    GatedResidualNetwork,
    InterpretableMultiHeadAttention,
    TemporalFusionTransformer,
    TFTConfig,
    VariableSelectionNetwork,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_building_blocks_and_training_names_are_exported_at_the_top_level():
    from tft_jax import gating, linear, train, variable_selection

    assert tft_jax.GatedResidualNetwork is gating.GatedResidualNetwork
    assert tft_jax.GateAddNorm is gating.GateAddNorm
    assert tft_jax.GatedLinearUnit is gating.GatedLinearUnit
    assert tft_jax.VariableSelectionNetwork is variable_selection.VariableSelectionNetwork
    assert tft_jax.Linear is linear.Linear and tft_jax.VariableLinear is linear.VariableLinear
    assert tft_jax.Batch is train.Batch and tft_jax.make_optimizer is train.make_optimizer
    assert set(tft_jax.__all__) <= set(dir(tft_jax))
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        tft_jax.Nothing  # noqa: B018


def test_importing_tft_jax_loads_neither_training_nor_qat_nor_the_cli():
    code = (
        "import sys, tft_jax\n"
        "heavy = [m for m in ('qat', 'tft_jax.cli', 'tft_jax.train', 'optax', 'tft_jax.data')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "import properties\n"
        "assert properties.checks.assert_finite and 'hypothesis' not in sys.modules\n"
        "assert properties.strategies.attention_configs\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_package_ships_a_py_typed_marker():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in ("tft_jax", "qat", "properties"):
        assert (ROOT / package / "py.typed").is_file()
        assert "py.typed" in data["package-data"][package]


def small_tft_config(dropout_rate: float) -> TFTConfig:
    return TFTConfig(
        num_static_features=1,
        num_known_features=1,
        num_observed_features=1,
        hidden_dim=4,
        num_heads=1,
        sequence_length=2,
        prediction_horizon=1,
        dropout_rate=dropout_rate,
    )


X = np.ones((2, 3, 4), np.float32)
CONTEXT = np.ones((2, 4), np.float32)


def block_calls(rate: float):
    """`(name, module, args)` of every module with dropout, on tiny inputs."""
    cfg = small_tft_config(rate)
    tft_inputs = (np.ones((2, 1)), np.ones((2, 2, 1)), np.ones((2, 1, 1)))
    return [
        ("GatedLinearUnit", GatedLinearUnit(4, rate), (X,)),
        ("GateAddNorm", GateAddNorm(4, rate), (X, X)),
        ("GatedResidualNetwork", GatedResidualNetwork(4, dropout_rate=rate), (X, CONTEXT)),
        ("VariableSelectionNetwork", VariableSelectionNetwork(3, 4, rate), (X, CONTEXT)),
        ("InterpretableMultiHeadAttention", InterpretableMultiHeadAttention(2, 4, rate), (X, X)),
        ("TemporalFusionTransformer", TemporalFusionTransformer(cfg), tft_inputs),
    ]


@pytest.mark.parametrize("index", range(6), ids=[name for name, _, _ in block_calls(0.0)])
def test_dropout_without_deterministic_raises_and_without_dropout_it_may_be_left_out(index):
    name, module, args = block_calls(0.5)[index]
    apply = jax.jit(module.apply, static_argnames="deterministic")
    if name == "TemporalFusionTransformer":
        # Shapes suffice (the error comes while tracing); its dropout paths are in test_model.
        shapes = jax.eval_shape(module.init, jax.random.key(0), *args)
        variables = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), shapes)
        with pytest.raises(ValueError, match=f"{name}: dropout_rate=0.5 > 0, so deterministic"):
            apply(variables, *args)
        return
    variables = jax.jit(module.init)(jax.random.key(0), *args)  # init needs no `deterministic`
    with pytest.raises(ValueError, match=f"{name}: dropout_rate=0.5 > 0, so deterministic must"):
        apply(variables, *args)
    trained = apply(variables, *args, deterministic=False, rngs={"dropout": jax.random.key(1)})
    evaluated = apply(variables, *args, deterministic=True)
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(evaluated), strict=True)
    )
    _, plain, _ = block_calls(0.0)[index]
    # Without dropout the argument may be left out; the result is the deterministic one.
    without = jax.jit(plain.apply)(variables, *args)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), without, evaluated
    )


@pytest.mark.parametrize(
    "context",
    [np.ones((2, 3, 4), np.float32), np.ones((4,), np.float32), np.ones((5, 4), np.float32)],
    ids=["rank3", "rank1", "other_batch"],
)
def test_grn_context_of_the_wrong_shape_is_named(context):
    grn = GatedResidualNetwork(4)
    variables = grn.init(jax.random.key(0), X, CONTEXT)
    shape = str(tuple(context.shape))
    with pytest.raises(ValueError, match=r"context must have shape \(B, C\) = \(2, C\).*got "):
        grn.apply(variables, X, context)
    with pytest.raises(ValueError, match=rf"{shape.replace('(', '.').replace(')', '.')}"):
        grn.apply(variables, X, context)


def test_attention_inputs_of_the_wrong_rank_are_named():
    layer = InterpretableMultiHeadAttention(2, 4)
    variables = layer.init(jax.random.key(0), X, X)
    message = r"keys_values must be 3-D \(B, T, D\), got shape \(3, 4\)"
    with pytest.raises(ValueError, match=message):
        layer.apply(variables, X, jnp.ones((3, 4)))
    with pytest.raises(ValueError, match=r"features \(4\) must be divisible by num_heads \(3\)"):
        InterpretableMultiHeadAttention(3, 4).init(jax.random.key(0), X, X)


def test_struct_dataclasses_keep_their_runtime_replace_and_pytree_fields():
    # `replace` is declared for type checkers under TYPE_CHECKING only: at runtime
    # it stays flax.struct's, and the fields (leaves and static ones) are unchanged.
    import dataclasses

    from qat import FakeQuantize, QATConfig
    from tft_jax import TFTOutput

    output = TFTOutput(*(np.full((2,), i, np.float32) for i in range(5)))
    assert [f.name for f in dataclasses.fields(TFTOutput)] == [
        "quantiles",
        "attention",
        "static_weights",
        "history_weights",
        "future_weights",
    ]
    replaced = output.replace(quantiles=np.zeros(3, np.float32))
    assert type(replaced) is TFTOutput and replaced.quantiles.shape == (3,)
    assert replaced.attention is output.attention and len(jax.tree.leaves(output)) == 5

    quantizer = FakeQuantize.create(QATConfig(), scale=0.5)
    static = {f.name: f.metadata.get("pytree_node", True) for f in dataclasses.fields(FakeQuantize)}
    assert static == {
        "scale": True,
        "zero_point": True,
        "qmin": False,
        "qmax": False,
        "channel_axis": False,
    }
    moved = quantizer.replace(scale=jnp.float32(0.25))
    assert type(moved) is FakeQuantize and float(moved.scale) == 0.25
    assert (moved.qmin, moved.qmax) == (quantizer.qmin, quantizer.qmax) == (-128, 127)
    assert len(jax.tree.leaves(quantizer)) == 2


def test_sequence_config_fields_given_as_lists_are_stored_as_tuples():
    # Annotated `Sequence[...]` (what the constructors take); stored as tuples, so
    # equality, hashing (configs are static arguments under jax.jit) and JSON keep working.
    import dataclasses

    from tft_jax.forecaster.config import DataConfig, ForecasterConfig, ModelConfig

    config = TFTConfig(quantiles=[0.1, 0.5, 0.9], static_categorical_cardinalities=[3, 4])
    same = TFTConfig(quantiles=(0.1, 0.5, 0.9), static_categorical_cardinalities=(3, 4))
    assert config == same and hash(config) == hash(same)
    assert config.quantiles == (0.1, 0.5, 0.9) and config.static_categorical_cardinalities == (3, 4)
    assert dataclasses.replace(config, known_categorical_cardinalities=[2]) == dataclasses.replace(
        same, known_categorical_cardinalities=(2,)
    )

    data = DataConfig(
        id_col="id", time_col="t", target="y", freq="h", known_cols=["k"], categorical_cols=["k"]
    )
    assert data.known_cols == ("k",) and data.categorical_cols == ("k",)
    assert data.table_spec().known_cols == ("k",)
    model = ModelConfig(quantiles=[0.1, 0.5, 0.9])
    assert model.quantiles == (0.1, 0.5, 0.9) and hash(model) == hash(ModelConfig())
    full = ForecasterConfig(data=data, model=model)
    assert ForecasterConfig.from_json(full.to_json()) == full
    assert hash(ForecasterConfig.from_json(full.to_json())) == hash(full)
