"""`tft_jax.forecaster.training`: the validation batches a `Forecaster` fit evaluates."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.evaluation import subset
from tft_jax.forecaster.training import schedule_of, steps_of, validation_batches

from .cli_tables import TINY_TRAINING, write_table
from .forecaster_stores import DATA


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    csv = write_table(tmp_path_factory.mktemp("validation") / "stores.csv")
    return prepare_dataset(csv, **DATA.prepare_options())


def _window_positions(total: int, count: int, batch_size: int) -> np.ndarray:
    """Positions of `count` validation windows (the split's `total` if fewer), rounded down to
    whole training batches, evenly spaced over the whole split."""
    count = min(count, total) // batch_size * batch_size
    return np.arange(total) if count == total else np.linspace(0, total - 1, count).round()


def _windows_targets(dataset, count: int, batch_size: int) -> np.ndarray:
    """`(N, H)` targets of the validation windows `_window_positions` picks."""
    positions = _window_positions(len(dataset.validation), count, batch_size).astype(np.int64)
    return dataset.validation.take(positions)["target"]


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


@pytest.mark.parametrize("validation_windows", [2048, 40])
def test_validation_spans_every_series_when_the_split_is_not_a_whole_number_of_batches(
    dataset, validation_windows
):
    # Windows come series by series. With more windows asked than the split holds (the
    # default 2048 on any small table), the count was rounded to whole batches after
    # the windows were taken, by keeping the split's first ones: the last series lost
    # its windows without a word ({a: 23, b: 23, c: 18, d: 0, e: 0} on five series).
    total, batch_size = len(dataset.validation), TINY_TRAINING.batch_size
    assert total % batch_size and validation_windows // batch_size * batch_size != total
    training = dataclasses.replace(TINY_TRAINING, validation_windows=validation_windows)
    batches = validation_batches(dataset, training)
    masks = np.concatenate([np.asarray(batch.target_mask)[:, 0] for batch in batches])
    targets = np.concatenate([np.asarray(batch.target) for batch in batches])[masks == 1.0]
    # Each validated window, found by its targets among the split's (the stores' are distinct).
    every = dataset.validation.take(np.arange(total))["target"]
    found = [int(np.flatnonzero((every == row).all(axis=1))[0]) for row in targets]
    assert len(found) == min(validation_windows, total) // batch_size * batch_size
    assert found == sorted(found) and found[-1] == total - 1  # spread to the split's end
    series = dataset.validation.series_code
    assert set(series[found]) == set(series)


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


@pytest.mark.parametrize("max_steps", [None, 3, 10**6])
def test_steps_are_whole_batches_per_epoch_times_epochs_capped_by_max_steps(dataset, max_steps):
    training = dataclasses.replace(TINY_TRAINING, epochs=3, max_steps=max_steps)
    per_epoch = len(dataset.train) // training.batch_size  # whole batches only
    total = 3 * per_epoch
    expected = total if max_steps is None else min(total, max_steps)
    assert steps_of(dataset, training) == (per_epoch, expected)


@pytest.mark.parametrize(("total", "expected"), [(10, 0), (100, 5), (1000, 50), (100_000, 200)])
def test_default_warmup_is_5_percent_of_the_steps_at_most_200(total, expected):
    assert expected == min(200, math.floor(0.05 * total))
    assert schedule_of(1e-3, total, None)[1] == expected
    assert schedule_of(1e-3, total, 7)[1] == 7  # given: kept


@pytest.mark.parametrize("warmup", [10, 11])
def test_a_warmup_of_all_the_steps_or_more_is_refused(warmup):
    # The cosine after a warmup of every step would divide by a span of 0.
    with pytest.raises(ValueError, match=rf"warmup_steps \({warmup}\) must be below the total"):
        schedule_of(1e-3, 10, warmup)
