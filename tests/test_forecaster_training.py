"""`tft_jax.forecaster.training`: the validation batches a `Forecaster` fit evaluates."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.evaluation import subset
from tft_jax.forecaster.training import validation_batches

from .cli_tables import TINY_TRAINING, write_table
from .forecaster_stores import DATA


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    csv = write_table(tmp_path_factory.mktemp("validation") / "stores.csv")
    return prepare_dataset(csv, **DATA.prepare_options())


def _windows_targets(dataset, count: int, batch_size: int) -> np.ndarray:
    """`(N, H)` targets of the validation windows, in whole training batches.

    `count` windows evenly spaced over the split (all if fewer): the windows
    validation took before it used batches of the eval size.
    """
    total = len(dataset.validation)
    positions = (
        np.arange(total)
        if count >= total
        else np.linspace(0, total - 1, count).round().astype(np.int64)
    )
    return dataset.validation.take(positions[: len(positions) // batch_size * batch_size])["target"]


@pytest.mark.parametrize(("validation_windows", "eval_batch_size"), [(16, 32), (40, 16), (24, 8)])
def test_batches_of_the_eval_size_hold_each_validation_window_once(
    dataset, validation_windows, eval_batch_size
):
    training = dataclasses.replace(
        TINY_TRAINING, validation_windows=validation_windows, eval_batch_size=eval_batch_size
    )
    batches = validation_batches(dataset, training)
    expected = _windows_targets(dataset, validation_windows, training.batch_size)
    count = len(expected)
    assert {batch.batch_size for batch in batches} == {eval_batch_size}
    assert len(batches) == -(-count // eval_batch_size)
    masks = np.concatenate([np.asarray(batch.target_mask) for batch in batches])
    targets = np.concatenate([np.asarray(batch.target) for batch in batches])
    # The filled-up rows repeat the last window with its targets masked out; the
    # stores table has no missing target, so every real row is fully observed.
    np.testing.assert_array_equal(masks[:count], 1.0)
    np.testing.assert_array_equal(masks[count:], 0.0)
    np.testing.assert_array_equal(targets[:count], expected)
    np.testing.assert_array_equal(
        targets[count:], targets[count - 1 : count].repeat(len(targets) - count, 0)
    )


def test_an_eval_size_the_devices_cannot_split_keeps_the_training_batches(dataset, monkeypatch):
    training = dataclasses.replace(TINY_TRAINING, validation_windows=16, eval_batch_size=32)
    monkeypatch.setattr(jax, "device_count", lambda: 3)  # 32 windows do not split over 3
    batches = validation_batches(dataset, training)
    assert [batch.batch_size for batch in batches] == [training.batch_size] * 2
    targets = np.concatenate([np.asarray(batch.target) for batch in batches])
    np.testing.assert_array_equal(targets, _windows_targets(dataset, 16, training.batch_size))


def test_a_validation_split_smaller_than_one_training_batch_is_refused(dataset):
    size = len(dataset.validation) + 1
    training = dataclasses.replace(TINY_TRAINING, batch_size=size, validation_windows=size)
    with pytest.raises(ValueError, match=r"the validation split has \d+ windows, fewer than one"):
        validation_batches(dataset, training)


def test_a_validation_split_without_windows_asks_for_a_larger_fraction_only(dataset):
    # "fewer than one batch of 4; lower the batch size or raise the validation
    # fraction": no batch size helps a split of no windows.
    empty = dataclasses.replace(dataset, validation=subset(dataset.validation, np.arange(0)))
    with pytest.raises(ValueError, match=r"validation split has no windows .* raise the valid"):
        validation_batches(empty, TINY_TRAINING)
