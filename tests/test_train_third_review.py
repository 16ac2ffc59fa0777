"""Third review of the training surface, used the way a researcher's own loop uses it.

References are float64 NumPy, independent of `tft_jax`: the masked pinball
loss of the linear quantile model of `tests/test_train_review.py` (each batch's
mean over its observed targets and the levels), and the mean of a whole stretch
of training per observed target, as `evaluate` weighs validation batches.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh

from tests.test_train_review import MODEL, QUANTILES, _host, linear_batch, numpy_loss_and_grads
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
    monkeypatch.setattr(
        experiments,
        "train_step",
        lambda state, batch, key, calibrate: train_step(state, batch, key),
    )
    monkeypatch.setattr(
        experiments, "evaluate", lambda state, batches, calibrate: evaluate(state, batches)
    )
    batches, state = uneven_batches()[:2], fresh_state()
    _, losses, counts = hand_run(state, batches, seed=3)
    record = experiments.train_run(
        state, lambda epoch: batches, [batches[0]], steps=2, eval_every=2, seed=3,
        calibrate_steps=0,
    )  # fmt: skip
    want = float(np.dot(losses, counts) / np.sum(counts))
    assert abs(want - np.mean(losses)) > 0.2 * want
    np.testing.assert_allclose(record["train_loss"], [want], rtol=1e-5)


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


def test_an_own_optax_chain_reports_the_clipped_norm_of_the_threshold_it_is_given() -> None:
    """A researcher's `optax.chain(clip_by_global_norm(c), adamw)`: `train_step` cannot
    read `c` from it, so `clipped_grad_norm` is `grad_norm` unless `c` is passed to
    `create_train_state` (as its docstring now says); with it, the metric is the
    norm of the gradients optax clipped, and the update is optax's own."""
    clip = 0.05
    tx = optax.chain(optax.clip_by_global_norm(clip), optax.adamw(0.05, weight_decay=0.1))
    batch = linear_batch(60)
    for given, reported in ((None, "grad_norm"), (clip, "clipped")):
        state = create_train_state(MODEL, tx, jax.random.key(2), linear_batch(0), clip_norm=given)
        _, grads = numpy_loss_and_grads(_host(state), batch)
        norm = float(np.sqrt(sum(np.sum(g**2) for g in grads.values())))
        assert norm > 10 * clip  # clipping acts
        trainables = state.trainables()
        grads = {name: np.asarray(g, np.float32) for name, g in grads.items()}
        want_updates, _ = tx.update(
            {
                "params": {"bias": grads["bias"], "w": grads["w"]},
                "quant_params": {"log_scale": grads["log_scale"]},
            },
            tx.init(trainables),
            trainables,
        )
        want = optax.apply_updates(trainables, want_updates)
        state, metrics = train_step(state, batch, jax.random.key(3))
        np.testing.assert_allclose(float(metrics["grad_norm"]), norm, rtol=1e-5)
        expected = norm if reported == "grad_norm" else clip
        np.testing.assert_allclose(float(metrics["clipped_grad_norm"]), expected, rtol=1e-6)
        for got_leaf, want_leaf in zip(
            jax.tree.leaves(state.trainables()), jax.tree.leaves(want), strict=True
        ):
            np.testing.assert_allclose(np.asarray(got_leaf), np.asarray(want_leaf), rtol=1e-5)
