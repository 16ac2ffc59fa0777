"""The folded, chunked variable selection path equals the layer-by-layer layout.

The reference is the same model with a `dot_general_cls` that is plain
`lax.dot_general`: a model with the hook set takes the layer-by-layer path
(embeddings computed, each GRN layer its own matmul, no chunks), so both run
from one parameter tree and one dropout key.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax import lax

from tft_jax import TemporalFusionTransformer
from tft_jax.embeddings import AffineEmbedding, RealEmbedding
from tft_jax.variable_selection import VariableSelectionNetwork

from .fast_path_configs import small_config


class PlainDotGeneral(nn.Module):
    """The `dot_general_cls` protocol with no change to the product."""

    lhs_bounds: tuple[float, float] | None = None

    def __call__(self, lhs, rhs, dimension_numbers):
        return lax.dot_general(lhs, rhs, dimension_numbers)


def assert_trees_close(actual, expected, rtol, per_leaf=True):
    """Every leaf within `rtol` of the expected leaf's largest magnitude.

    With `per_leaf=False` the scale is the largest magnitude in the whole tree
    (for gradients: a leaf whose gradient is ~1e-6 of the others cancels
    catastrophically in float32 in either layout).
    """
    leaves = [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(expected)]
    tree_scale = max((np.max(np.abs(leaf)) for leaf in leaves if leaf.size), default=0.0)
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(actual), leaves, strict=True):
        got = np.asarray(got, np.float64)
        assert got.shape == want.shape, jax.tree_util.keystr(path)
        if not want.size:
            continue
        scale = max(np.max(np.abs(want)) if per_leaf else tree_scale, 1e-30)
        error = np.max(np.abs(got - want)) / scale
        assert error <= rtol, f"{jax.tree_util.keystr(path)}: relative error {error:.2e}"


@pytest.mark.parametrize(
    "num_variables, width, chunk_rows",
    # Several chunks, the last padded; one variable with an identity skip (width == D).
    [(4, 5, 5), (1, 6, 4)],
)
def test_folded_selection_equals_layer_by_layer_with_dropout_and_gradients(
    num_variables, width, chunk_rows
):
    batch, steps, features, with_context = 3, 7, 6, True
    rng = np.random.default_rng(num_variables)
    values = rng.normal(size=(batch, steps, num_variables)).astype(np.float32)
    context = rng.normal(size=(batch, features)).astype(np.float32) if with_context else None

    def build(dot_general_cls):
        embedding = RealEmbedding(num_variables, width, lazy=True, dot_general_cls=dot_general_cls)
        vsn = VariableSelectionNetwork(
            num_variables,
            features,
            dropout_rate=0.3,
            dot_general_cls=dot_general_cls,
            chunk_rows=chunk_rows,
        )
        return embedding, vsn

    class Pair(nn.Module):
        dot_general_cls: object = None

        @nn.compact
        def __call__(self, values, context, deterministic):
            embedding, vsn = build(self.dot_general_cls)
            embedded = embedding(values)
            assert isinstance(embedded, AffineEmbedding) == (self.dot_general_cls is None)
            return vsn(embedded, context, deterministic)

    fast, layered = Pair(), Pair(PlainDotGeneral)
    keys = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    variables = jax.jit(fast.init, static_argnums=3)(keys, values, context, True)
    assert_trees_close(
        jax.jit(layered.init, static_argnums=3)(keys, values, context, True), variables, 0.0
    )
    cotangent = rng.normal(size=(batch, steps, features)).astype(np.float32)

    @functools.partial(jax.jit, static_argnums=0)
    def value_and_grads(model, params, values):
        def scalar(params, values):
            combined, weights = model.apply(
                {"params": params}, values, context, False, rngs={"dropout": jax.random.key(2)}
            )
            return jnp.sum(combined * cotangent) + jnp.sum(jnp.sin(3.0 * weights)), (
                combined,
                weights,
            )

        grads = jax.grad(scalar, argnums=(0, 1), has_aux=True)(params, values)
        return grads, model.apply({"params": params}, values, context, True)[0]

    (grads, outputs), deterministic = value_and_grads(fast, variables["params"], values)
    (want_grads, want_outputs), _ = value_and_grads(layered, variables["params"], values)
    assert_trees_close(outputs, want_outputs, 2e-6)
    assert_trees_close(grads, want_grads, 2e-6, per_leaf=False)
    # Dropout acted (so the outputs above agree because the masks are the same).
    assert np.max(np.abs(np.asarray(deterministic) - np.asarray(outputs[0]))) > 1e-3


@pytest.mark.parametrize("lazy", [True, False], ids=["folded", "layer-by-layer"])
def test_selection_refuses_embeddings_without_a_batch_axis(lazy):
    # (V, width) with no batch: the folded path failed with an IndexError deep in the
    # chunk loop, the layer-by-layer one ran it as if unbatched.
    num_variables, width = 3, 4
    slope = jnp.ones((num_variables, width))
    embedded = (
        AffineEmbedding(jnp.ones((num_variables,)), slope, jnp.zeros_like(slope))
        if lazy
        else jnp.ones((num_variables, width))
    )
    vsn = VariableSelectionNetwork(num_variables, 6)
    with pytest.raises(ValueError, match=r"embedded must have shape \(B, \[T,\] 3, width\)"):
        vsn.init(jax.random.key(0), embedded)


def test_folded_selection_with_dropout_takes_an_empty_batch():
    # A (0, T, V) batch in training mode: the dropout mask's reshape to (0, -1) raised a
    # ZeroDivisionError on the fast path only.
    num_variables, width, features = 3, 4, 6
    embedding = RealEmbedding(num_variables, width, lazy=True)
    vsn = VariableSelectionNetwork(num_variables, features, dropout_rate=0.3, chunk_rows=4)
    values = jnp.zeros((0, 5, num_variables))

    @jax.jit
    def setup(values):  # the embedding and the selection's parameters, in one program
        embedded = embedding.apply(embedding.init(jax.random.key(0), values), values)
        return embedded, vsn.init(jax.random.key(1), embedded, deterministic=True)

    embedded, params = setup(values)
    combined, weights = jax.jit(
        functools.partial(vsn.apply, deterministic=False, rngs={"dropout": jax.random.key(2)})
    )(params, embedded)
    assert combined.shape == (0, 5, features) and weights.shape == (0, 5, num_variables)


def test_model_fast_path_equals_layer_by_layer_in_outputs_loss_and_gradients():
    # No statics (the static selection takes no fast path; fewer operations to
    # compile); the context reaching the fast path is tested above.
    config = small_config(num_static_features=0)
    rng = np.random.default_rng(0)
    batch = 3
    static = None
    historical = rng.normal(
        size=(batch, config.sequence_length, config.num_observed_features)
    ).astype(np.float32)
    future = rng.normal(size=(batch, config.prediction_horizon, config.num_known_features)).astype(
        np.float32
    )
    known = rng.normal(size=(batch, config.sequence_length, config.num_known_features)).astype(
        np.float32
    )
    target = rng.normal(size=(batch, config.prediction_horizon)).astype(np.float32)
    fast = TemporalFusionTransformer(config)
    layered = TemporalFusionTransformer(config, dot_general_cls=PlainDotGeneral)
    inputs = (static, historical, future, known)
    keys = {"params": jax.random.key(3), "dropout": jax.random.key(4)}
    variables = jax.jit(fast.init)(keys, *inputs)
    assert_trees_close(jax.jit(layered.init)(keys, *inputs), variables, 0.0)

    @functools.partial(jax.jit, static_argnums=0)
    def loss_and_grads(model, params):
        def loss(params):
            out = model.apply(
                {"params": params}, *inputs, deterministic=False, rngs={"dropout": keys["dropout"]}
            )
            errors = out.quantiles - target[..., None]
            levels = jnp.asarray(config.quantiles)
            return jnp.mean(jnp.maximum(levels * errors, (levels - 1) * errors)), out

        return jax.value_and_grad(loss, has_aux=True)(params)

    (loss, out), grads = loss_and_grads(fast, variables["params"])
    (want_loss, want_out), want_grads = loss_and_grads(layered, variables["params"])
    np.testing.assert_allclose(loss, want_loss, rtol=2e-6)
    assert_trees_close(dataclasses.asdict(out), dataclasses.asdict(want_out), 5e-6)
    assert_trees_close(grads, want_grads, 2e-6, per_leaf=False)


def test_affine_embedding_materializes_to_the_prescaler_output_exactly():
    values = np.random.default_rng(1).normal(size=(2, 5, 3)).astype(np.float32)
    lazy = RealEmbedding(3, 4, lazy=True)
    eager = RealEmbedding(3, 4)
    variables = lazy.init(jax.random.key(0), values)
    assert_trees_close(eager.init(jax.random.key(0), values), variables, 0.0)
    np.testing.assert_array_equal(
        lazy.apply(variables, values).materialize(), eager.apply(variables, values)
    )
    with pytest.raises(ValueError, match=r"\(\.\.\., 3\)"):
        lazy.apply(variables, values[..., :2])


def test_chunks_are_cache_sized_on_cpu_and_the_whole_batch_elsewhere():
    from tft_jax.chunked_selection import DEFAULT_CHUNK_BYTES, default_chunk_rows

    # The paper's electricity history: 64 x 168 rows, 15 variables, D = 160, float32.
    num_rows, row_bytes = 64 * 168, 15 * 160 * 4
    rows = default_chunk_rows(num_rows, row_bytes)
    if jax.default_backend() != "cpu":
        assert rows == num_rows
        return
    assert rows * row_bytes <= DEFAULT_CHUNK_BYTES < (rows + 1) * row_bytes
    assert default_chunk_rows(num_rows, 2 * DEFAULT_CHUNK_BYTES) == 1  # never zero rows
    assert default_chunk_rows(num_rows, 2 * row_bytes) == rows // 2  # twice as wide, half the rows
