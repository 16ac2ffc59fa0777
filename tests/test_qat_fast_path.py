"""The chunked QAT variable selection equals the layer-by-layer one, quantizers included.

The reference is the same QAT contraction behind a factory that does not
announce operand quantizers (`layer_by_layer`): the variable selection then
runs one quantized call per layer on the whole activation. Both read one
parameter tree, one `quant_stats` tree and one dropout key.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

import tft_jax.chunked_selection as chunked_selection
from qat import QATConfig, QATDotGeneral, qat_dot_general
from tft_jax import TemporalFusionTransformer
from tft_jax.embeddings import RealEmbedding
from tft_jax.losses import quantile_loss
from tft_jax.variable_selection import VariableSelectionNetwork

from .fast_path_configs import small_config

FEATURES = 6
BATCH, STEPS = 3, 7
STATS, PARAMS = "quant_stats", "quant_params"


def layer_by_layer(factory):
    """The same contraction modules, without the operand-quantizer announcement."""
    return lambda **kwargs: factory(**kwargs)


def assert_trees_close(actual, expected, rtol, per_leaf=True):
    """Every leaf within `rtol` of the expected leaf's (or the whole tree's) largest magnitude."""
    leaves = [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(expected)]
    tree_scale = max((np.max(np.abs(leaf)) for leaf in leaves if leaf.size), default=0.0)
    actual_leaves = jax.tree_util.tree_leaves_with_path(actual)
    assert len(actual_leaves) == len(leaves)
    for (path, got), want in zip(actual_leaves, leaves, strict=True):
        got = np.asarray(got, np.float64)
        assert got.shape == want.shape, jax.tree_util.keystr(path)
        if not want.size:
            continue
        scale = max(np.max(np.abs(want)) if per_leaf else tree_scale, 1e-30)
        error = np.max(np.abs(got - want)) / scale
        assert error <= rtol, f"{jax.tree_util.keystr(path)}: relative error {error:.2e}"


class EmbedAndSelect(nn.Module):
    """Quantized real embedding then variable selection: the history path of the QAT TFT."""

    num_variables: int
    width: int
    dot_general_cls: object
    chunk_rows: int

    @nn.compact
    def __call__(self, values, context, deterministic):
        embedded = RealEmbedding(
            self.num_variables, self.width, lazy=True, dot_general_cls=self.dot_general_cls
        )(values)
        return VariableSelectionNetwork(
            self.num_variables,
            FEATURES,
            dropout_rate=0.3,
            dot_general_cls=self.dot_general_cls,
            chunk_rows=self.chunk_rows,
        )(embedded, context, deterministic)


def selection_inputs(num_variables, seed):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(BATCH, STEPS, num_variables)).astype(np.float32)
    context = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    return values, context


@functools.partial(jax.jit, static_argnums=0)
def calibrated_stats(model, variables, values, context):
    _, state = model.apply(variables, values, context, True, mutable=[STATS])
    return state[STATS]


@functools.partial(jax.jit, static_argnums=0)
def selection_value_and_grads(model, variables, values, context, cotangent):
    """Outputs with dropout, and gradients of a scalar of them w.r.t. params, step sizes, inputs."""
    trainable = {k: v for k, v in variables.items() if k in ("params", PARAMS)}

    def scalar(trainable, values):
        combined, weights = model.apply(
            {**variables, **trainable},
            values,
            context,
            False,
            rngs={"dropout": jax.random.key(2)},
        )
        return jnp.sum(combined * cotangent) + jnp.sum(jnp.sin(3.0 * weights)), (combined, weights)

    grads, outputs = jax.grad(scalar, argnums=(0, 1), has_aux=True)(trainable, values)
    deterministic = model.apply(variables, values, context, True)[0]
    return grads, outputs, deterministic


@pytest.mark.parametrize(
    "num_variables, width, chunk_rows, calibrated, learnable_scale",
    [
        # Several chunks, the last padded (21 rows in chunks of 5); calibrated observers
        # with LSQ step sizes.
        (4, 5, 5, True, True),
        # One variable with an identity skip (width == D); observers that saw nothing
        # (activations pass through unquantized, weights are quantized).
        (1, FEATURES, 4, False, False),
    ],
)
def test_chunked_qat_selection_equals_layer_by_layer_in_outputs_and_every_gradient(
    num_variables, width, chunk_rows, calibrated, learnable_scale
):
    config = QATConfig(learnable_scale=learnable_scale)
    values, context = selection_inputs(num_variables, seed=num_variables)
    chunked = EmbedAndSelect(num_variables, width, qat_dot_general(config), chunk_rows)
    layered = EmbedAndSelect(
        num_variables, width, layer_by_layer(qat_dot_general(config)), chunk_rows
    )
    keys = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    init = jax.jit(chunked.init, static_argnums=3)
    variables = init(keys, values, context, True)
    # Same variables (fresh observers hold +-inf, so compared exactly).
    jax.tree.map(
        np.testing.assert_array_equal,
        jax.jit(layered.init, static_argnums=3)(keys, values, context, True),
        variables,
    )
    if learnable_scale:
        # Step sizes away from the observers' own, so the LSQ gradient is not degenerate.
        variables[PARAMS] = jax.tree.map(lambda s: s + 0.01, variables[PARAMS])
    if calibrated:
        calibrating = EmbedAndSelect(
            num_variables, width, qat_dot_general(config, calibrate=True), chunk_rows
        )
        variables[STATS] = calibrated_stats(calibrating, variables, values, context)
    cotangent = np.random.default_rng(5).normal(size=(BATCH, STEPS, FEATURES)).astype(np.float32)

    grads, outputs, deterministic = selection_value_and_grads(
        chunked, variables, values, context, cotangent
    )
    want_grads, want_outputs, _ = selection_value_and_grads(
        layered, variables, values, context, cotangent
    )
    assert_trees_close(outputs, want_outputs, 2e-6)
    assert_trees_close(grads, want_grads, 2e-6, per_leaf=False)
    if learnable_scale:
        # The step sizes' own gradients, leaf by leaf. Each is a sum of terms of both
        # signs over every element (the LSQ gradient), added chunk by chunk here and
        # in one reduction there: float32 cancellation (~1e-4 of a leaf seen), so 1e-3;
        # a wrong gradient scale or a lost chunk would be off by O(1).
        assert_trees_close(grads[0][PARAMS], want_grads[0][PARAMS], 1e-3)
        assert any(float(jnp.abs(g)) > 0 for g in jax.tree.leaves(grads[0][PARAMS]))
    # Dropout acted (so the outputs agree because the masks are the same).
    assert np.max(np.abs(np.asarray(deterministic) - np.asarray(outputs[0]))) > 1e-3


def test_calibration_observes_each_layer_once_on_its_whole_activation():
    num_variables, width = 4, 5
    values, context = selection_inputs(num_variables, seed=7)
    config = QATConfig()
    model = EmbedAndSelect(num_variables, width, qat_dot_general(config, calibrate=True), 5)
    variables = jax.jit(model.init, static_argnums=3)(
        {"params": jax.random.key(0)}, values, context, True
    )

    @jax.jit
    def observed_ranges(variables):
        seen = {}

        def record(next_fun, args, kwargs, context):
            if isinstance(context.module, QATDotGeneral) and context.method_name == "__call__":
                lhs = args[0]
                seen.setdefault("/".join(context.module.path), []).append(
                    (jnp.min(lhs), jnp.max(lhs))
                )
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(record):
            _, state = model.apply(variables, values, context, True, mutable=[STATS])
        return state[STATS], seen

    stats, seen = observed_ranges(variables)
    observers = {
        path[: -len("/num_batches")]: path
        for path in traverse_util.flatten_dict(stats, sep="/")
        if path.endswith("num_batches")
    }
    # Every observer was called through the contraction itself (the layer-by-layer path),
    # once, and holds the range of that whole activation.
    assert set(seen) == set(observers)
    flat_stats = traverse_util.flatten_dict(stats, sep="/")
    for path, calls in seen.items():
        assert len(calls) == 1, path
        low, high = calls[0]
        assert int(flat_stats[f"{path}/num_batches"]) == 1
        assert float(flat_stats[f"{path}/min"]) == float(low), path
        assert float(flat_stats[f"{path}/max"]) == float(high), path


def test_frozen_quantizers_announce_operand_quantizers_and_calibrating_ones_do_not():
    # The chunked quantized selection runs only when the factory announces them: a
    # frozen QAT contraction does (else the model silently takes the slow path), an
    # observer being calibrated must not, nor a float layer.
    from qat.dot_general import quantizing_factory
    from tft_jax.operand_quantizers import supports_operand_quantizers

    assert supports_operand_quantizers(quantizing_factory(QATConfig()))
    assert not supports_operand_quantizers(quantizing_factory(QATConfig(), calibrate=True))
    assert not supports_operand_quantizers(None)
    assert not supports_operand_quantizers(jax.lax.dot_general)


def test_operand_quantizers_refuse_to_calibrate_without_the_whole_activation():
    module = QATDotGeneral(QATConfig(), calibrate=True)
    kernel = jnp.ones((3, 2))
    numbers = (((1,), (0,)), ((), ()))
    call = dict(method=QATDotGeneral.operand_quantizers, mutable=[STATS])
    # One compiled init (op by op, each initializer op compiles on its own).
    variables = jax.jit(lambda key: module.init(key, kernel, numbers, (4, 3), **call))(
        jax.random.key(0)
    )
    with pytest.raises(ValueError, match="whole activation"):
        module.apply(variables, kernel, numbers, (4, 3), **call)


@pytest.mark.slow
def test_qat_model_chunked_step_equals_layer_by_layer_in_loss_outputs_and_gradients(
    monkeypatch,
):
    # Chunks of 5 rows: the history (18 rows) and the horizon (9) run several, the last
    # padded. No statics (fewer operations to compile; the context is tested above).
    monkeypatch.setattr(chunked_selection, "default_chunk_rows", lambda num_rows, row_bytes: 5)
    config = small_config(num_static_features=0)
    qat_config = QATConfig(learnable_scale=True)
    rng = np.random.default_rng(0)
    inputs = dict(
        static=None,
        historical=rng.normal(size=(BATCH, 6, 4)).astype(np.float32),
        future=rng.normal(size=(BATCH, 3, 3)).astype(np.float32),
        known_history=rng.normal(size=(BATCH, 6, 3)).astype(np.float32),
    )
    target = rng.normal(size=(BATCH, 3)).astype(np.float32)
    chunked = TemporalFusionTransformer(config, dot_general_cls=qat_dot_general(qat_config))
    layered = TemporalFusionTransformer(
        config, dot_general_cls=layer_by_layer(qat_dot_general(qat_config))
    )
    calibrating = TemporalFusionTransformer(
        config, dot_general_cls=qat_dot_general(qat_config, calibrate=True)
    )
    variables = jax.jit(chunked.init)({"params": jax.random.key(3)}, **inputs)
    _, state = jax.jit(functools.partial(calibrating.apply, deterministic=True, mutable=[STATS]))(
        variables, **inputs
    )
    variables = {**variables, **state}
    variables[PARAMS] = jax.tree.map(lambda s: s + 0.01, variables[PARAMS])

    @functools.partial(jax.jit, static_argnums=0)
    def loss_and_grads(model, variables):
        trainable = {k: v for k, v in variables.items() if k in ("params", PARAMS)}

        def loss(trainable):
            out = model.apply(
                {**variables, **trainable},
                **inputs,
                deterministic=False,
                rngs={"dropout": jax.random.key(4)},
            )
            return quantile_loss(out.quantiles, target, config.quantiles), out

        return jax.value_and_grad(loss, has_aux=True)(trainable)

    (loss, out), grads = loss_and_grads(chunked, variables)
    (want_loss, want_out), want_grads = loss_and_grads(layered, variables)
    np.testing.assert_allclose(loss, want_loss, rtol=2e-6)
    assert_trees_close(dataclasses.asdict(out), dataclasses.asdict(want_out), 5e-6)
    assert_trees_close(grads["params"], want_grads["params"], 2e-6, per_leaf=False)
    # A step size's gradient sums terms of both signs over its activation: see above.
    assert_trees_close(grads[PARAMS], want_grads[PARAMS], 1e-3)
