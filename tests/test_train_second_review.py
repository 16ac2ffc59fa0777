"""Second review of `tft_jax.train`: batches without an observed target, `fit`'s arguments.

The references are float64 NumPy: `NumpyClipAdamW` (clip by global norm,
then AdamW with bias correction) and the closed-form loss and gradient of the
linear quantile model of `tests/test_train_review.py`. A batch whose every
target is masked carries no information: the reference never sees it.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax
import pytest

from tests.test_train_review import (
    MODEL,
    NumpyClipAdamW,
    _host,
    linear_batch,
    numpy_loss_and_grads,
)
from tft_jax.train import Batch, create_train_state, fit, make_optimizer, train_step

LR, DECAY = 0.05, 0.2


def all_masked(seed: int) -> Batch:
    """A batch of `linear_batch(seed)` with no observed target (every mask zero)."""
    batch = linear_batch(seed)
    return batch.replace(target_mask=np.zeros(np.shape(batch.target), np.float32))


def _host_tree(tree: Any) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


@pytest.mark.parametrize("optimizer", ["make_optimizer", "optax.adamw"])
def test_a_batch_without_an_observed_target_changes_nothing_but_the_step(optimizer: str) -> None:
    """Before the fix, Adam's momentum and the weight decay moved every parameter by
    about the learning rate on an all-masked batch, and the update count advanced."""
    if optimizer == "make_optimizer":
        tx = make_optimizer(LR, clip_norm=None, weight_decay=DECAY)
    else:
        tx = optax.adamw(LR, weight_decay=DECAY)
    state = create_train_state(MODEL, tx, jax.random.key(0), linear_batch(0))
    reference = NumpyClipAdamW(_host(state), LR, None, DECAY, {"w", "bias"})
    if optimizer != "make_optimizer":
        reference.decayed = {"w", "bias", "log_scale"}  # optax.adamw decays every leaf
    state, _ = train_step(state, linear_batch(1), jax.random.key(1))
    reference.step(numpy_loss_and_grads(reference.params, linear_batch(1))[1])
    kept = _host_tree((state.params, state.extra_params, state.opt_state, state.model_state))

    state, metrics = train_step(state, all_masked(2), jax.random.key(2))
    got = _host_tree((state.params, state.extra_params, state.opt_state, state.model_state))
    for after, before in zip(got, kept, strict=True):
        np.testing.assert_array_equal(after, before)
    assert int(metrics["skipped"]) == 0 and int(state.skipped_steps) == 0  # not a failure
    assert int(state.step) == 2  # every call counts, as for a skipped step
    assert float(metrics["observed"]) == 0.0 and float(metrics["loss"]) == 0.0

    # The next step is the reference's second update (bias correction and all).
    state, metrics = train_step(state, linear_batch(3), jax.random.key(3))
    reference.step(numpy_loss_and_grads(reference.params, linear_batch(3))[1])
    assert float(metrics["observed"]) == np.size(linear_batch(3).target)
    for name, want in reference.params.items():
        np.testing.assert_allclose(_host(state)[name], want, rtol=2e-5, atol=2e-6, err_msg=name)


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
