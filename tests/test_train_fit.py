"""`fit` on a linear quantile model, against float64 NumPy references and replays.

The training loss it records is the mean per observed target, as `evaluate`'s
validation loss is (and so is `experiments.train_run`'s), leaving out batches
without an observed target; `best_state` is the state of the lowest validation
loss and training stops `patience` evaluations after it; and the arguments and
batches `fit` cannot use are refused, by name, before anything trains.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh

from tests.linear_quantile_model import (
    DECAY,
    LR,
    MODEL,
    QUANTILES,
    B,
    H,
    NumpyClipAdamW,
    _host,
    all_masked,
    linear_batch,
    numpy_loss_and_grads,
    run_experiments_on_the_linear_model,
)
from tft_jax import experiments
from tft_jax.train import (
    Batch,
    copy_state,
    create_train_state,
    evaluate,
    fit,
    make_optimizer,
    step_key,
    train_step,
)

# ---------------------------------------------------------------------------
# The training loss: per observed target, batches without one left out


def masked(batch: Batch, observed: np.ndarray) -> Batch:
    """`batch` with `target_mask = observed` and NaN targets where it is 0 (filled gaps)."""
    observed = np.asarray(observed, np.float32)
    target = np.where(observed != 0, np.asarray(batch.target), np.nan).astype(np.float32)
    return batch.replace(target=target, target_mask=observed)


def numpy_masked_loss(params: dict[str, np.ndarray], batch: Batch) -> tuple[float, int]:
    """The linear model's mean pinball loss over the observed targets, and their number."""
    future = np.asarray(batch.future, np.float64)
    pred = np.exp(float(params["log_scale"])) * (future @ params["w"]) + params["bias"]
    levels = np.asarray(QUANTILES, np.float64)
    observed = np.asarray(batch.target_mask) != 0
    error = np.asarray(batch.target, np.float64)[observed][:, None] - pred[observed]
    losses = np.maximum(levels * error, (levels - 1.0) * error)
    return float(losses.mean()), int(observed.sum())


def uneven_batches() -> list[Batch]:
    """Three masked batches of 12, 1 (far off: a large loss) and 4 observed targets."""
    one = np.zeros((3, 2), np.float32)
    one[1, 0] = 1.0
    return [
        masked(linear_batch(40, rows=6), np.ones((6, 2))),
        masked(linear_batch(41, rows=3, shift=25.0), one),
        masked(linear_batch(42, rows=3), np.array([[1, 0], [1, 1], [0, 1]])),
    ]


def fresh_state():
    return create_train_state(
        MODEL, make_optimizer(0.05, clip_norm=None), jax.random.key(0), linear_batch(0)
    )


def hand_run(state, batches: list[Batch], seed: int) -> tuple[object, list[float], list[int]]:
    """The researcher's own loop over `batches` (a copy of `state`, the keys `fit` draws):
    the final state and each step's reference loss and observed-target count, each
    step's reported loss and count checked against them."""
    by_hand, seed_key = copy_state(state), jax.random.key(seed)
    losses, counts = [], []
    for step, batch in enumerate(batches):
        want_loss, want_count = numpy_masked_loss(_host(by_hand), batch)
        by_hand, metrics = train_step(by_hand, batch, step_key(seed_key, step))
        np.testing.assert_allclose(float(metrics["loss"]), want_loss, rtol=1e-5)
        assert float(metrics["observed"]) == want_count
        losses.append(want_loss)
        counts.append(want_count)
    return by_hand, losses, counts


def test_fit_train_loss_is_the_mean_per_observed_target_as_val_loss_is() -> None:
    """Before the fix the history's training loss was the plain mean of the batch
    means: a batch with one observed target weighed as much as one with twelve,
    unlike `evaluate`'s validation loss (per observed target), so the two curves
    of one run measured different things."""
    batches, state = uneven_batches(), fresh_state()
    by_hand, losses, counts = hand_run(state, batches, seed=0)
    per_target = float(np.dot(losses, counts) / np.sum(counts))
    per_batch = float(np.mean(losses))
    assert abs(per_target - per_batch) > 0.2 * per_target  # the two readings differ here

    result = fit(state, batches, epochs=1, seed=0, quiet=True)
    assert result.history["step"] == [3]
    np.testing.assert_allclose(result.history["train_loss"], [per_target], rtol=1e-5)
    for name, value in _host(by_hand).items():
        np.testing.assert_array_equal(_host(result.state)[name], value, err_msg=name)


def test_the_clipping_experiments_train_loss_is_the_mean_per_observed_target_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`experiments.train_run` records its own training loss: the plain mean of the
    batch means before the fix, while `fit`'s is per observed target. (The linear
    stand-in has no observers, so the run's `calibrate=False` is not passed on.)"""
    run_experiments_on_the_linear_model(monkeypatch)
    batches, state = uneven_batches()[:2], fresh_state()
    _, losses, counts = hand_run(state, batches, seed=3)
    record = experiments.train_run(
        state, lambda epoch: batches, [batches[0]], steps=2, eval_every=2, seed=3,
        calibrate_steps=0,
    )  # fmt: skip
    want = float(np.dot(losses, counts) / np.sum(counts))
    assert abs(want - np.mean(losses)) > 0.2 * want
    np.testing.assert_allclose(record["train_loss"], [want], rtol=1e-5)


def test_fit_train_loss_leaves_out_batches_without_an_observed_target() -> None:
    """The history's training loss is the mean over the batches that trained; an
    all-masked batch's loss of 0 pulled it down by a third here before the fix."""
    tx = make_optimizer(LR, clip_norm=None, weight_decay=DECAY)
    state = create_train_state(MODEL, tx, jax.random.key(4), linear_batch(0))
    reference = NumpyClipAdamW(_host(state), LR, None, DECAY, {"w", "bias"})
    losses = []
    for seed in (10, 12):
        loss, grads = numpy_loss_and_grads(reference.params, linear_batch(seed))
        losses.append(loss)
        reference.step(grads)

    train = [linear_batch(10), all_masked(11), linear_batch(12)]
    result = fit(state, train, epochs=1, quiet=True)
    assert result.history["step"] == [3] and result.history["skipped_steps"] == [0]
    np.testing.assert_allclose(result.history["train_loss"], [np.mean(losses)], rtol=1e-5)
    for name, want in reference.params.items():
        np.testing.assert_allclose(
            _host(result.state)[name], want, rtol=2e-5, atol=2e-6, err_msg=name
        )


def test_fit_train_loss_is_nan_when_no_batch_since_the_evaluation_had_a_target() -> None:
    tx = make_optimizer(LR)
    state = create_train_state(MODEL, tx, jax.random.key(5), linear_batch(0))
    result = fit(state, [linear_batch(20), all_masked(21)], epochs=1, eval_every=1, quiet=True)
    assert result.history["step"] == [1, 2]
    assert np.isfinite(result.history["train_loss"][0])
    assert np.isnan(result.history["train_loss"][1])  # not the empty batch's 0


# ---------------------------------------------------------------------------
# Best state and early stopping


def test_fit_keeps_the_state_of_the_lowest_validation_loss_and_stops_after_patience() -> None:
    """Replayed step by step: `best_state` is the state at the first minimum of the
    validation losses, and training stops `patience` evaluations after it."""
    tx = make_optimizer(0.1, clip_norm=None)
    train = [linear_batch(40 + i, shift=6.0) for i in range(3)]  # val has no shift
    val = [linear_batch(60), linear_batch(61, rows=1)]  # a last partial batch
    state = create_train_state(MODEL, tx, jax.random.key(1), train[0])

    replay = create_train_state(MODEL, tx, jax.random.key(1), train[0])
    losses, snapshots = [], []
    for step in range(30):
        replay, _ = train_step(replay, train[step % 3], jax.random.key(step))
        losses.append(evaluate(replay, val))
        snapshots.append(_host(replay))
    patience = 3
    best, since, stop = math.inf, 0, len(losses)
    for index, loss in enumerate(losses):
        if loss < best:
            best, best_index, since = loss, index, 0
        else:
            since += 1
            if since >= patience:
                stop = index + 1
                break
    assert stop < len(losses), "the replay must stop early for the test to tell"
    assert best_index > 0, "the best state must not be the first for the test to tell"

    result = fit(state, train, val, epochs=10, eval_every=1, patience=patience, quiet=True)
    assert result.stop_reason == "early_stopping"
    assert result.history["step"] == list(range(1, stop + 1))
    np.testing.assert_allclose(result.history["val_loss"], losses[:stop], rtol=1e-6)
    got = _host(result.best_state)
    for name, want in snapshots[best_index].items():
        np.testing.assert_allclose(got[name], want, rtol=1e-6, err_msg=name)
    assert int(result.best_state.step) == best_index + 1


def test_fit_without_validation_returns_the_trained_state_as_best_state() -> None:
    """With no validation batches there is nothing to choose by: `best_state` is the
    final state, the researcher's own loop over the batches, not the initial one."""
    batches, state = uneven_batches(), fresh_state()
    initial = _host(state)  # before fit donates it
    by_hand, _, _ = hand_run(state, batches, seed=0)
    result = fit(state, batches, epochs=1, seed=0, quiet=True)
    final, best = _host(result.state), _host(result.best_state)
    assert int(result.best_state.step) == int(result.state.step) == len(batches)
    for name, value in _host(by_hand).items():
        np.testing.assert_array_equal(final[name], value, err_msg=name)
        np.testing.assert_array_equal(best[name], value, err_msg=name)
    assert all(not np.array_equal(best[name], initial[name]) for name in initial)


# ---------------------------------------------------------------------------
# Arguments and batches refused before training


@pytest.mark.parametrize(
    ("val", "message"),
    [
        ([linear_batch(70), linear_batch(71, nan_target=True)], r"batch 1 holds 1 NaN or inf"),
        (
            [linear_batch(72).replace(target_mask=np.zeros((B, H), np.float32))],
            r"val_batches hold no observed target",
        ),
    ],
)
def test_fit_refuses_validation_data_it_cannot_score_before_training(val, message) -> None:
    # Found by `evaluate` at the first evaluation before: after an epoch of training.
    steps: list[int] = []
    state = create_train_state(MODEL, make_optimizer(0.1), jax.random.key(2), val[0])

    def counted(epoch: int) -> Any:
        for index in range(3):
            steps.append(index)
            yield linear_batch(80 + index)

    with pytest.raises(ValueError, match=f"^fit: .*{message}"):
        fit(state, counted, val, epochs=1, quiet=True)
    assert steps == []


@pytest.mark.parametrize("seed", [1.5, None, "0", True])
def test_fit_refuses_a_seed_that_is_not_an_int_naming_it(seed: Any) -> None:
    """Before: a TypeError about a traced float32 from `jax.random.key` for 1.5, a
    ValueError about `jnp.array` for None, and True trained silently as seed 1."""
    state = create_train_state(MODEL, make_optimizer(LR), jax.random.key(6), linear_batch(0))
    with pytest.raises(TypeError, match=r"^fit: seed must be an int, got"):
        fit(state, [linear_batch(30)], epochs=1, seed=seed, quiet=True)


def test_fit_refuses_patience_without_validation_batches() -> None:
    """Before: nothing counted toward the patience and training ran every epoch,
    `stop_reason` 'completed', with no word that early stopping was off."""
    state = create_train_state(MODEL, make_optimizer(LR), jax.random.key(7), linear_batch(0))
    with pytest.raises(ValueError, match=r"^fit: patience=2 needs val_batches"):
        fit(state, [linear_batch(40)], epochs=3, patience=2, quiet=True)


@pytest.mark.parametrize("calibrate_steps", [0, 3])
def test_fit_refuses_calibrate_steps_for_a_model_without_observers(calibrate_steps: int) -> None:
    """Before: 0 failed inside the trace (the model refusing `calibrate`), 3 raised
    an error naming `train_step`'s calibrate=True, an argument the caller never gave."""
    state = create_train_state(MODEL, make_optimizer(LR), jax.random.key(8), linear_batch(0))
    with pytest.raises(ValueError, match=rf"^fit: calibrate_steps={calibrate_steps} needs"):
        fit(state, [linear_batch(50)], epochs=1, calibrate_steps=calibrate_steps, quiet=True)


def test_fit_names_a_batch_the_mesh_cannot_split_before_training() -> None:
    """Before the fix a validation batch of 3 windows on a 2-device mesh failed at
    the first evaluation, after a whole epoch of training (the state donated),
    with a message naming no batch ("the global batch size 3 is not
    divisible..."). Checked here on an abstract 2-device mesh: the check reads its
    size before anything is placed on it."""
    mesh = AbstractMesh((2,), ("data",))
    state = create_train_state(MODEL, make_optimizer(0.05), jax.random.key(1), linear_batch(0))
    train = [linear_batch(50, rows=4), linear_batch(51, rows=4)]
    val = [linear_batch(52, rows=4), linear_batch(53, rows=3)]
    with pytest.raises(ValueError, match=r"^fit: val_batches\[1\] is a global batch of 3 "):
        fit(state, train, val, epochs=1, quiet=True, mesh=mesh)
    odd_train = [*train, linear_batch(54, rows=5)]
    with pytest.raises(ValueError, match=r"^fit: train_batches\[2\] is a global batch of 5 "):
        fit(state, odd_train, epochs=1, quiet=True, mesh=mesh)
    assert int(state.step) == 0  # nothing trained, and the buffers were not donated:
    jax.block_until_ready(copy_state(state))
