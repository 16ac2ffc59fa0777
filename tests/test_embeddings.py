"""The real and categorical embeddings take nested Python lists like arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.block_inputs import _X
from tft_jax.embeddings import AffineEmbedding, CategoricalEmbedding, RealEmbedding


def test_real_embedding_takes_nested_lists_like_arrays():
    embedding = RealEmbedding(4, 3)
    variables = embedding.init(jax.random.key(0), _X)
    np.testing.assert_array_equal(
        embedding.apply(variables, _X.tolist()), embedding.apply(variables, _X)
    )


def test_categorical_embedding_takes_codes_given_as_nested_lists():
    # The dtype check could not read a list's dtype (a bare TypeError from jnp.result_type).
    table = CategoricalEmbedding((3, 2), 4)
    codes = [[0, 1], [2, 0]]
    table_params = table.init(jax.random.key(0), codes)
    np.testing.assert_array_equal(
        table.apply(table_params, codes), table.apply(table_params, np.asarray(codes))
    )


def test_categorical_embedding_looks_each_column_up_in_its_own_table():
    # NumPy gather: column c of the codes indexes embedding_c, the result (..., C, width).
    table = CategoricalEmbedding((3, 5, 2), 4)
    codes = np.array([[[0, 4, 1], [2, 0, 0]], [[1, 3, 1], [2, 2, 0]]], np.int32)
    variables = table.init(jax.random.key(0), codes)
    got = np.asarray(table.apply(variables, codes))
    params = variables["params"]
    want = np.stack(
        [np.asarray(params[f"embedding_{c}"])[codes[..., c]] for c in range(3)], axis=-2
    )
    assert got.shape == (2, 2, 3, 4)
    np.testing.assert_array_equal(got, want)
    half = CategoricalEmbedding((3, 5, 2), 4, dtype=jnp.bfloat16)
    assert half.apply(variables, codes).dtype == jnp.bfloat16


@pytest.mark.parametrize("column", [0, 1])
def test_categorical_embedding_refuses_a_concrete_code_equal_to_its_cardinality(column):
    table = CategoricalEmbedding((3, 5), 4)
    variables = table.init(jax.random.key(0), np.zeros((1, 2), np.int32))
    codes = np.array([[2, 4], [0, 0]], np.int32)
    codes[1, column] = (3, 5)[column]  # one past the last row: the gather clips it silently
    with pytest.raises(ValueError, match=rf"codes\[\.\.\., {column}\] must lie in"):
        table.apply(variables, codes)


def test_affine_embeddings_concatenated_stand_for_their_embeddings_side_by_side():
    rng = np.random.default_rng(0)

    def part(variables: int) -> AffineEmbedding:
        return AffineEmbedding(
            values=jnp.asarray(rng.normal(size=(2, 3, variables)), jnp.float32),
            slope=jnp.asarray(rng.normal(size=(variables, 4)), jnp.float32),
            intercept=jnp.asarray(rng.normal(size=(variables, 4)), jnp.float32),
        )

    parts = [part(2), part(3)]
    joined = AffineEmbedding.concatenate(parts)
    want = np.concatenate(
        [
            np.asarray(p.values, np.float64)[..., None] * np.asarray(p.slope, np.float64)
            + np.asarray(p.intercept, np.float64)
            for p in parts
        ],
        axis=-2,
    )
    assert joined.shape == (2, 3, 5, 4)
    np.testing.assert_allclose(np.asarray(joined.materialize()), want, rtol=1e-6, atol=1e-6)
