"""`fit` checks its NumPy batches on the host, as `train_step` and `evaluate` do.

`fit` places each batch on the device before its step; the step's checks
read only NumPy arrays, so a categorical code beyond its embedding was
clipped to the last category, silently, in training and in validation.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

from tft_jax import TemporalFusionTransformer, TFTConfig
from tft_jax.train import Batch, create_train_state, fit, make_optimizer, predict

CONFIG = TFTConfig(
    num_static_features=1,
    num_known_features=1,
    num_observed_features=1,
    hidden_dim=4,
    num_heads=2,
    sequence_length=3,
    prediction_horizon=2,
    dropout_rate=0.0,
    static_categorical_cardinalities=(3,),
)


def make_batch(rows: int = 4, **fields: Any) -> Batch:
    rng = np.random.default_rng(0)
    values: dict[str, Any] = dict(
        static=rng.normal(size=(rows, 1)).astype(np.float32),
        historical=rng.normal(size=(rows, 3, 1)).astype(np.float32),
        future=rng.normal(size=(rows, 2, 1)).astype(np.float32),
        known_history=None,
        static_categorical=rng.integers(0, 3, size=(rows, 1)).astype(np.int32),
        target=rng.normal(size=(rows, 2)).astype(np.float32),
    )
    return Batch(**{**values, **fields})


@pytest.fixture(scope="module")
def state():
    model = TemporalFusionTransformer(CONFIG)
    return create_train_state(model, make_optimizer(1e-2), jax.random.key(0), make_batch())


def out_of_range() -> Batch:
    return make_batch(static_categorical=np.full((4, 1), 103, np.int32))


def test_a_code_beyond_its_embedding_in_a_train_batch_is_refused(state) -> None:
    with pytest.raises(
        ValueError, match=r"fit: train batch 0 of epoch 0: train_step: .*static_categorical.*3"
    ):
        fit(state, [out_of_range()], None, epochs=1, quiet=True)


def test_a_code_beyond_its_embedding_in_a_validation_batch_is_refused_before_training(
    state,
) -> None:
    with pytest.raises(ValueError, match=r"fit: val_batches\[1\]: .*static_categorical.*3"):
        fit(state, [make_batch()], [make_batch(), out_of_range()], epochs=1, quiet=True)


def test_fields_of_another_batch_size_are_named_at_the_boundary(state) -> None:
    short_static = make_batch(static=np.zeros((3, 1), np.float32))
    with pytest.raises(ValueError, match=r"predict: batch.static must have the batch's B = 4 rows"):
        predict(state, short_static)
    with pytest.raises(
        TypeError, match=r"predict: batch.target must be a \(B, H\) array, got None"
    ):
        predict(state, make_batch(target=None))
