"""`VariableSelectionNetwork`: the folded, chunked path and the argument errors of both paths.

The folded path equals the float64 reference (`tests/reference_tft.py`) at
every chunking and size (one step, no time axis, chunks that do not divide the
rows, one variable, width 1), its gradients w.r.t. every parameter equal the
reference's finite differences, and its dropout masks do not depend on the
chunking. Inconsistent embeddings, a zero width and a context the network was
not initialized with (or without) are refused, by name, on both paths.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax import lax

from tests import reference_tft as ref
from tests.reference_parameters import random_parameters
from tft_jax.embeddings import AffineEmbedding, RealEmbedding
from tft_jax.variable_selection import VariableSelectionNetwork

WIDTH, FEATURES, CONTEXT = 3, 4, 5


class PlainDotGeneral(nn.Module):
    """The `dot_general_cls` protocol with no change to the product: the layer-by-layer path."""

    lhs_bounds: tuple[float, float] | None = None

    def __call__(self, lhs: Any, rhs: Any, dimension_numbers: Any) -> Any:
        return lax.dot_general(lhs, rhs, dimension_numbers)


class LazySelection(nn.Module):
    """Real inputs embedded lazily, then selected (the model's fast path for real variables)."""

    num_variables: int
    width: int = WIDTH
    chunk_rows: int | None = None
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x: Any, context: Any, deterministic: bool = True) -> Any:
        embedded = RealEmbedding(self.num_variables, self.width, lazy=True, name="embedding")(x)
        return VariableSelectionNetwork(
            self.num_variables,
            FEATURES,
            dropout_rate=self.dropout_rate,
            chunk_rows=self.chunk_rows,
            name="selection",
        )(embedded, context, deterministic)


def reference(x: np.ndarray, params: Any, context: np.ndarray | None) -> tuple[Any, Any]:
    """The float64 NumPy embedding + selection (`tests/reference_tft.py`)."""
    embedded = ref.real_embedding(x, params["embedding"])
    return ref.variable_selection(embedded, params["selection"], context)


def draw(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


@functools.cache
def jitted_apply(module: nn.Module) -> Any:
    return jax.jit(lambda params, x, context: module.apply({"params": params}, x, context))


# (variables, width, lead shape, chunk rows): one step (T = 1), static inputs (no time
# axis), a chunk of one row, chunks that do not divide the rows, a chunk larger than all
# rows, one variable, and a width of 1 (the selection GRN's skip is the identity).
CASES = [
    (3, WIDTH, (2, 1), 1),
    (3, WIDTH, (2, 5), 3),
    (3, WIDTH, (3,), 2),
    (1, WIDTH, (2, 5), 4),
    (3, 1, (2, 5), 100),
]


@pytest.mark.parametrize("with_context", [True, False], ids=["context", "no context"])
@pytest.mark.parametrize(("variables", "width", "lead", "chunk_rows"), CASES)
def test_folded_selection_equals_the_float64_reference_for_every_chunking(
    variables, width, lead, chunk_rows, with_context
):
    module = LazySelection(variables, width, chunk_rows)
    x = draw(*lead, variables, seed=1)
    context = draw(lead[0], CONTEXT, seed=2) if with_context else None
    params = random_parameters(module, x, context)
    combined, weights = jitted_apply(module)(params, x, context)
    expected, expected_weights = reference(x, ref.to_float64(params), context)
    assert combined.shape == (*lead, FEATURES) and weights.shape == (*lead, variables)
    np.testing.assert_allclose(np.asarray(combined, np.float64), expected, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(np.asarray(weights, np.float64), expected_weights, atol=2e-6)
    np.testing.assert_allclose(np.sum(np.asarray(weights, np.float64), axis=-1), 1.0, atol=1e-6)


@pytest.mark.parametrize(("variables", "chunk_rows"), [(3, 3), (1, 4)])
def test_folded_selection_gradients_equal_the_reference_s_finite_differences(variables, chunk_rows):
    """Directional derivatives along random directions in (parameters, inputs, context).

    The float64 reference's central difference is exact to ~1e-9 at this step; the
    float32 gradient of the folded, chunked, rematerialized path must match it. A
    gradient lost for any one leaf (a fold built outside the traced parameters, a
    chunk whose cotangent is dropped) moves the directional derivative by O(1).
    """
    lead = (2, 5)
    module = LazySelection(variables, WIDTH, chunk_rows)
    x = draw(*lead, variables, seed=3)
    context = draw(lead[0], CONTEXT, seed=4)
    params = random_parameters(module, x, context, seed=5)
    cotangent = draw(*lead, FEATURES, seed=6).astype(np.float64)

    def scalar64(params, x, context):
        combined, weights = reference(x, params, context)
        return float(np.sum(combined * cotangent) + np.sum(np.sin(3.0 * weights)))

    def scalar32(params, x, context):
        combined, weights = module.apply({"params": params}, x, context)
        return jnp.sum(combined * cotangent.astype(np.float32)) + jnp.sum(jnp.sin(3.0 * weights))

    grads = jax.jit(jax.grad(scalar32, argnums=(0, 1, 2)))(params, x, context)
    primal = (ref.to_float64(params), x.astype(np.float64), context.astype(np.float64))
    rng = np.random.default_rng(7)
    step = 1e-5
    for _ in range(3):
        direction = jax.tree.map(lambda leaf: rng.normal(size=np.shape(leaf)), primal)
        plus = jax.tree.map(lambda p, d: p + step * d, primal, direction)
        minus = jax.tree.map(lambda p, d: p - step * d, primal, direction)
        expected = (scalar64(*plus) - scalar64(*minus)) / (2 * step)
        got = sum(
            float(np.sum(np.asarray(g, np.float64) * d))
            for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(direction), strict=True)
        )
        assert abs(got - expected) <= 1e-4 * max(1.0, abs(expected)), (got, expected)
    # Every parameter leaf (and the inputs and the context) has a gradient.
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        assert float(np.max(np.abs(leaf))) > 0.0, jax.tree_util.keystr(path)


def test_dropout_masks_do_not_depend_on_the_chunking():
    # Masks are drawn once for all rows and split with them: chunkings that divide the
    # rows, do not, or exceed them give the same training-mode output.
    x = draw(3, 7, 4, seed=8)
    context = draw(3, CONTEXT, seed=9)
    modules = [LazySelection(4, WIDTH, rows, dropout_rate=0.4) for rows in (1, 5, 1000)]
    params = jax.jit(modules[0].init)(jax.random.key(0), x, context)["params"]

    def train(module):
        return module.apply(
            {"params": params}, x, context, False, rngs={"dropout": jax.random.key(1)}
        )

    outputs = [jax.jit(train, static_argnums=0)(module) for module in modules]
    for combined, weights in outputs[1:]:
        np.testing.assert_allclose(combined, outputs[0][0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(weights, outputs[0][1], rtol=1e-5, atol=1e-6)
    deterministic, _ = jitted_apply(modules[0])(params, x, context)
    assert np.max(np.abs(np.asarray(deterministic) - np.asarray(outputs[0][0]))) > 1e-3


# ---------------------------------------------------------------------------
# Argument errors


@functools.partial(jax.jit, static_argnums=0)
def init_jitted(vsn: VariableSelectionNetwork, *args: Any) -> Any:
    """`vsn.init` at key 0, jitted: op by op it compiled each primitive apart."""
    return vsn.init(jax.random.key(0), *args)


@functools.partial(jax.jit, static_argnums=0)
def apply_jitted(vsn: VariableSelectionNetwork, variables: Any, *args: Any) -> Any:
    return vsn.apply(variables, *args)


def affine(values_variables: int, slope_shape: tuple[int, ...], intercept_shape: tuple[int, ...]):
    return AffineEmbedding(
        jnp.ones((2, 5, values_variables)), jnp.ones(slope_shape), jnp.zeros(intercept_shape)
    )


@pytest.mark.parametrize("dot_general_cls", [None, PlainDotGeneral], ids=["folded", "layered"])
@pytest.mark.parametrize(
    ("slope", "intercept", "message"),
    [
        # A slope for 2 variables: an einsum error about a label 'v' on the folded path.
        ((2, 4), (3, 4), r"embedded\.slope must have shape \(3, 4\).*got \(2, 4\)"),
        # One intercept row: the layer-by-layer path broadcast it over the variables.
        ((3, 4), (1, 4), r"embedded\.intercept must have shape \(3, 4\).*got \(1, 4\)"),
    ],
)
def test_selection_refuses_an_affine_embedding_of_inconsistent_parts(
    dot_general_cls, slope, intercept, message
):
    vsn = VariableSelectionNetwork(3, FEATURES, dot_general_cls=dot_general_cls)
    with pytest.raises(ValueError, match=message):
        vsn.init(jax.random.key(0), affine(3, slope, intercept))


@pytest.mark.parametrize("lazy", [True, False], ids=["folded", "layered"])
def test_selection_refuses_embeddings_of_zero_width(lazy):
    # The folded path divided by zero in a kernel initializer (a bare ZeroDivisionError).
    embedded = affine(3, (3, 0), (3, 0)) if lazy else jnp.ones((2, 5, 3, 0))
    with pytest.raises(ValueError, match=r"embedded must have a positive width.*\(2, 5, 3, 0\)"):
        VariableSelectionNetwork(3, FEATURES).init(jax.random.key(0), embedded)


@pytest.mark.parametrize("variables", [3, 1])
@pytest.mark.parametrize("dot_general_cls", [None, PlainDotGeneral], ids=["folded", "layered"])
def test_selection_initialized_with_a_context_refuses_a_call_without_one(
    variables, dot_general_cls
):
    # Flax ignores unused parameters: the context's term was silently dropped.
    embedded = affine(variables, (variables, WIDTH), (variables, WIDTH))
    vsn = VariableSelectionNetwork(variables, FEATURES, dot_general_cls=dot_general_cls)
    params = init_jitted(vsn, embedded, jnp.ones((2, CONTEXT)))
    with pytest.raises(ValueError, match="context is None, but the parameters hold a context"):
        vsn.apply(params, embedded)
    # Without a context at init, none is needed.
    apply_jitted(vsn, init_jitted(vsn, embedded), embedded)


@pytest.mark.parametrize("variables", [3, 1])
@pytest.mark.parametrize("dot_general_cls", [None, PlainDotGeneral], ids=["folded", "layered"])
def test_selection_refuses_a_context_it_was_not_initialized_with(variables, dot_general_cls):
    # Flax said "Could not find parameter named kernel in scope /selection_grn/context",
    # or named an initializer's shape for a context of another width.
    embedded = affine(variables, (variables, WIDTH), (variables, WIDTH))
    vsn = VariableSelectionNetwork(variables, FEATURES, dot_general_cls=dot_general_cls)
    without = init_jitted(vsn, embedded)
    with pytest.raises(ValueError, match=r"a context was given, but the network was initialized "):
        vsn.apply(without, embedded, jnp.ones((2, CONTEXT)))
    with_context = init_jitted(vsn, embedded, jnp.ones((2, CONTEXT)))
    with pytest.raises(
        ValueError,
        match=rf"context has width {CONTEXT + 1} \(its last axis\), but the network was "
        rf"initialized with a context of width {CONTEXT}",
    ):
        vsn.apply(with_context, embedded, jnp.ones((2, CONTEXT + 1)))


@pytest.mark.parametrize("variables", [3, 1])
@pytest.mark.parametrize("dot_general_cls", [None, PlainDotGeneral], ids=["folded", "layered"])
def test_selection_names_an_embedding_of_another_width_than_at_init(variables, dot_general_cls):
    # The folded path failed with Flax's ScopeParamShapeError at "/variable_grns/skip".
    vsn = VariableSelectionNetwork(variables, FEATURES, dot_general_cls=dot_general_cls)
    params = init_jitted(vsn, affine(variables, (variables, WIDTH), (variables, WIDTH)))
    wider = WIDTH + 2
    message = rf"embedded has width {wider} \(its last axis\), .* initialized with width {WIDTH}"
    with pytest.raises(ValueError, match=message):
        vsn.apply(params, affine(variables, (variables, wider), (variables, wider)))
    with pytest.raises(ValueError, match=message):
        vsn.apply(params, jnp.ones((2, 5, variables, wider)))


def test_folded_selection_takes_a_context_given_as_nested_lists():
    # The folded path called `.astype` on the list (the layer-by-layer one converted it).
    embedded = affine(3, (3, WIDTH), (3, WIDTH))
    context = [[0.5] * CONTEXT, [-0.5] * CONTEXT]
    vsn = VariableSelectionNetwork(3, FEATURES)
    # Jitted with the inputs closed over: the network gets the very list, as called op by op.
    params = jax.jit(lambda key: vsn.init(key, embedded, context))(jax.random.key(0))
    combined, _ = jax.jit(lambda params: vsn.apply(params, embedded, context))(params)
    as_array = jax.jit(lambda params: vsn.apply(params, embedded, np.asarray(context)))(params)
    np.testing.assert_array_equal(combined, as_array[0])
