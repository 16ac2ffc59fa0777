"""`train_step` against float64 NumPy references on a linear quantile model.

One step is clipping by global norm then AdamW with bias correction; a step
with a NaN gradient is skipped without advancing the update count or the
schedule; a batch without an observed target changes nothing but the step;
and an own optax chain's clipped gradient norm is reported as `train_step`
is told. The model and the references are in `tests/linear_quantile_model.py`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
import optax
import pytest

from tests.linear_quantile_model import (
    DECAY,
    LR,
    MODEL,
    NumpyClipAdamW,
    _host,
    all_masked,
    linear_batch,
    numpy_loss_and_grads,
)
from tests.schedule_reference import warmup_cosine
from tft_jax.schedules import WarmupCosine
from tft_jax.train import create_train_state, make_optimizer, train_step, warmup_cosine_schedule


def numpy_warmup_cosine(count: int, schedule: WarmupCosine) -> float:
    """The float64 learning rate of `schedule` at step `count`."""
    return warmup_cosine(count, *(float(x) for x in jax.tree.leaves(schedule)))


def _host_tree(tree: Any) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


@pytest.mark.parametrize("clip", [0.05, None])
def test_train_step_is_float64_clip_then_adamw_and_a_skipped_step_advances_no_count(
    clip: float | None,
) -> None:
    """Five steps, the third with a NaN target: the reference skips it entirely.

    The in-state warmup + cosine rate and the bias correction of the steps after
    the skip use the update count (2, then 3, 4), not the step count: one more
    would change every later update measurably. `quant_params` is clipped
    with the rest but never decayed (the default mask).
    """
    schedule = warmup_cosine_schedule(0.05, total_steps=6, warmup_steps=2, end_lr=0.005)
    tx = make_optimizer(schedule, clip_norm=clip, weight_decay=0.2)
    state = create_train_state(MODEL, tx, jax.random.key(0), linear_batch(0))
    reference = NumpyClipAdamW(
        _host(state), lambda c: numpy_warmup_cosine(c, schedule), clip, 0.2, {"w", "bias"}
    )
    clipped_once = False
    for step in range(5):
        batch = linear_batch(10 + step, nan_target=step == 2)
        if step == 2:
            grads = {name: np.full(1, np.nan) for name in reference.params}
        else:
            loss, grads = numpy_loss_and_grads(reference.params, batch)
            norm = math.sqrt(sum(float(np.sum(g**2)) for g in grads.values()))
            clipped_once |= clip is not None and norm > clip
        state, metrics = train_step(state, batch, jax.random.key(step))
        reference.step(grads)
        assert int(metrics["skipped"]) == (step == 2)
        if step != 2:
            np.testing.assert_allclose(float(metrics["loss"]), loss, rtol=1e-5)
            np.testing.assert_allclose(float(metrics["grad_norm"]), norm, rtol=1e-5)
        got = _host(state)
        for name, want in reference.params.items():
            np.testing.assert_allclose(got[name], want, rtol=2e-5, atol=2e-6, err_msg=name)
    assert clipped_once == (clip is not None)
    assert int(state.step) == 5 and int(state.skipped_steps) == 1
    assert int(state.opt_state.count) == reference.count == 4
    np.testing.assert_allclose(
        np.asarray(state.opt_state.mu),
        np.concatenate([np.ravel(reference.mu[k]) for k in ("bias", "w", "log_scale")]),
        rtol=2e-5,
        atol=1e-8,
    )


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
