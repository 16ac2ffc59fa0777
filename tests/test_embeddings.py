"""The real and categorical embeddings take nested Python lists like arrays."""

from __future__ import annotations

import jax
import numpy as np

from tests.block_inputs import _X
from tft_jax.embeddings import CategoricalEmbedding, RealEmbedding


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
