"""Tests of the optimizer, the train step and the training loop (`tft_jax.train`).

The optimizer and train-step mechanics are checked on a tiny stand-in
forecaster with the TFT's call signature (a handful of parameters, so each
check is exact and compiles in a second) against numpy references written
here; the training dynamics run the real `TemporalFusionTransformer`.
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
import sys
import warnings
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import struct
from hypothesis import given
from hypothesis import strategies as st

from tft_jax.config import TFTConfig
from tft_jax.model import TemporalFusionTransformer
from tft_jax.train import (
    Batch,
    FitResult,
    Optimizer,
    TrainState,
    create_train_state,
    eval_step,
    evaluate,
    fit,
    in_state_schedule,
    make_optimizer,
    predict,
    train_step,
    warmup_cosine_schedule,
    with_schedule_steps,
)

from .tracing import recorded_traces

QUANTILES = (0.1, 0.5, 0.9)
B, T, H, S, U, K = 4, 3, 2, 2, 2, 2


# ---------------------------------------------------------------------------
# Stand-in models with the TFT's apply signature


class TinyConfig(NamedTuple):
    quantiles: tuple[float, ...] = QUANTILES
    horizon: int = H


@struct.dataclass
class TinyOutput:
    quantiles: jax.Array


def _flat_inputs(static: Any, historical: Any, future: Any) -> jax.Array:
    batch = historical.shape[0]
    return jnp.concatenate(
        [static, historical.reshape(batch, -1), future.reshape(batch, -1)], axis=-1
    )


class TinyForecaster(nn.Module):
    """A two-layer network with dropout: inputs flattened -> `(B, H, Q)` quantiles."""

    config: TinyConfig = TinyConfig()

    @nn.compact
    def __call__(
        self,
        static: Any,
        historical: Any,
        future: Any,
        known_history: Any = None,
        static_categorical: Any = None,
        deterministic: bool = True,
    ) -> TinyOutput:
        x = _flat_inputs(static, historical, future)
        hidden = jnp.tanh(nn.Dense(8, name="hidden")(x))
        hidden = nn.Dropout(0.25)(hidden, deterministic=deterministic)
        levels = len(self.config.quantiles)
        out = nn.Dense(self.config.horizon * levels, name="head")(hidden)
        return TinyOutput(quantiles=out.reshape(x.shape[0], self.config.horizon, levels))


class ObservedForecaster(nn.Module):
    """The stand-in with the QAT model's collections besides `'params'`.

    `quant_stats` (not trained): with `calibrate=True` (and the collection
    mutable) an observer records the running maximum of `|x|`; the input is
    always divided by it. `quant_params` (trained, like LSQ step sizes): a
    log-scale applied to the input.
    """

    config: TinyConfig = TinyConfig()

    @nn.compact
    def __call__(
        self,
        static: Any,
        historical: Any,
        future: Any,
        known_history: Any = None,
        static_categorical: Any = None,
        deterministic: bool = True,
        calibrate: bool = False,
    ) -> TinyOutput:
        x = _flat_inputs(static, historical, future)
        max_abs = self.variable("quant_stats", "max_abs", lambda: jnp.ones((), jnp.float32))
        if calibrate:
            max_abs.value = jnp.maximum(max_abs.value, jnp.max(jnp.abs(x)))
        log_scale = self.variable("quant_params", "log_scale", lambda: jnp.zeros((), jnp.float32))
        x = x / max_abs.value * jnp.exp(log_scale.value)
        levels = len(self.config.quantiles)
        out = nn.Dense(self.config.horizon * levels, name="head")(x)
        return TinyOutput(quantiles=out.reshape(x.shape[0], self.config.horizon, levels))


def make_batch(seed: int, scale: float = 1.0) -> Batch:
    rng = np.random.default_rng(seed)
    return Batch(
        static=(scale * rng.normal(size=(B, S))).astype(np.float32),
        historical=(scale * rng.normal(size=(B, T, U))).astype(np.float32),
        future=(scale * rng.normal(size=(B, H, K))).astype(np.float32),
        known_history=None,
        static_categorical=None,
        target=rng.normal(size=(B, H)).astype(np.float32),
    )


def host_copy(tree: Any) -> Any:
    """A numpy copy that survives the donation of the device buffers."""
    return jax.tree.map(lambda leaf: np.array(leaf, copy=True), tree)


def assert_trees_equal(left: Any, right: Any) -> None:
    assert jax.tree.structure(left) == jax.tree.structure(right)
    for a, b in zip(jax.tree.leaves(left), jax.tree.leaves(right), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---------------------------------------------------------------------------
# Independent references


def reference_loss(pred: jax.Array, target: jax.Array) -> jax.Array:
    """Mean pinball loss, written independently of `tft_jax.losses`."""
    levels = jnp.asarray(QUANTILES)
    error = target[..., None] - pred
    return jnp.mean(jnp.where(error >= 0, levels * error, (levels - 1.0) * error))


@partial(jax.jit, static_argnums=0)
def reference_grads(model: nn.Module, params: Any, batch: Batch, rng: jax.Array) -> Any:
    """The reference loss's gradient, jitted: one compile instead of one per primitive."""

    def loss(p: Any) -> jax.Array:
        out = model.apply(
            {"params": p},
            batch.static,
            batch.historical,
            batch.future,
            deterministic=False,
            rngs={"dropout": rng},
        )
        return reference_loss(out.quantiles, jnp.asarray(batch.target))

    return jax.grad(loss)(params)


class NumpyAdamW:
    """AdamW (Loshchilov & Hutter) after optional global-norm clipping, in float64 numpy."""

    def __init__(self, params: Any, lr: float, weight_decay: float, clip_norm: float | None):
        self.lr, self.weight_decay, self.clip_norm = lr, weight_decay, clip_norm
        self.b1, self.b2, self.eps = 0.9, 0.999, 1e-8
        self.params = jax.tree.map(lambda p: np.asarray(p, np.float64), params)
        self.mu = jax.tree.map(np.zeros_like, self.params)
        self.nu = jax.tree.map(np.zeros_like, self.params)
        self.count = 0

    def step(self, grads: Any) -> None:
        grads = jax.tree.map(lambda g: np.asarray(g, np.float64), grads)
        norm = math.sqrt(sum(float(np.sum(g**2)) for g in jax.tree.leaves(grads)))
        if self.clip_norm is not None and norm >= self.clip_norm:
            grads = jax.tree.map(lambda g: g * (self.clip_norm / norm), grads)
        self.count += 1
        self.mu = jax.tree.map(lambda m, g: self.b1 * m + (1 - self.b1) * g, self.mu, grads)
        self.nu = jax.tree.map(lambda v, g: self.b2 * v + (1 - self.b2) * g**2, self.nu, grads)
        mu_hat = jax.tree.map(lambda m: m / (1 - self.b1**self.count), self.mu)
        nu_hat = jax.tree.map(lambda v: v / (1 - self.b2**self.count), self.nu)
        self.params = jax.tree.map(
            lambda p, m, v: p - self.lr * (m / (np.sqrt(v) + self.eps) + self.weight_decay * p),
            self.params,
            mu_hat,
            nu_hat,
        )


def global_norm(tree: Any) -> float:
    squares = (float(np.sum(np.asarray(x, np.float64) ** 2)) for x in jax.tree.leaves(tree))
    return math.sqrt(sum(squares))


# ---------------------------------------------------------------------------
# Shared stand-in states (one optimizer, hence one compilation, per setting)

LR, WEIGHT_DECAY, CLIP = 1e-2, 0.1, 1e-4
TINY = TinyForecaster()
TINY_TX = make_optimizer(LR, clip_norm=CLIP, weight_decay=WEIGHT_DECAY)
OBSERVED = ObservedForecaster()
OBSERVED_TX = make_optimizer(LR, clip_norm=1.0, weight_decay=WEIGHT_DECAY)


def tiny_state(seed: int = 0) -> TrainState:
    return create_train_state(TINY, TINY_TX, jax.random.key(seed), make_batch(0))


# ---------------------------------------------------------------------------
# make_optimizer and the schedule


def test_make_optimizer_is_an_optax_transformation_recording_its_threshold() -> None:
    tx = make_optimizer(1e-3, clip_norm=0.5)
    assert isinstance(tx, optax.GradientTransformation)
    assert isinstance(tx, Optimizer)
    assert tx.clip_norm == 0.5
    assert make_optimizer(clip_norm=None).clip_norm is None


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"learning_rate": 0.0}, ValueError, "learning_rate"),
        ({"learning_rate": -1e-3}, ValueError, "learning_rate"),
        ({"learning_rate": "fast"}, TypeError, "learning_rate"),
        ({"clip_norm": 0.0}, ValueError, "clip_norm"),
        ({"clip_norm": float("inf")}, ValueError, "clip_norm"),
        ({"weight_decay": -0.1}, ValueError, "weight_decay"),
        ({"weight_decay": True}, TypeError, "weight_decay"),
    ],
)
def test_make_optimizer_rejects_bad_arguments_naming_them(
    kwargs: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        make_optimizer(**kwargs)


def tree_strategy() -> st.SearchStrategy[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """A small `(params, grads)` pair of pytrees with two leaves."""

    @st.composite
    def build(draw: st.DrawFn) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        seed = draw(st.integers(0, 2**16))
        rng = np.random.default_rng(seed)
        params = {
            "w": rng.normal(size=(3, 2)).astype(np.float32),
            "b": rng.normal(size=(2,)).astype(np.float32),
        }
        grads = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()}
        return params, grads

    return build()


@given(
    trees=tree_strategy(),
    log_ratio=st.floats(-3.0, 3.0),
    weight_decay=st.sampled_from([0.0, 0.05]),
)
def test_first_update_equals_numpy_adamw_of_clipped_gradients(
    trees: tuple[dict[str, np.ndarray], dict[str, np.ndarray]],
    log_ratio: float,
    weight_decay: float,
) -> None:
    params, grads = trees
    clip = float(global_norm(grads) * 10.0**log_ratio)
    tx = make_optimizer(1e-2, clip_norm=clip, weight_decay=weight_decay)
    updates, _ = tx.update(grads, tx.init(params), params)
    reference = NumpyAdamW(params, 1e-2, weight_decay, clip)
    reference.step(grads)
    for name in params:
        expected = reference.params[name] - params[name]
        np.testing.assert_allclose(updates[name], expected, rtol=2e-5, atol=1e-8)


def test_weight_decay_is_applied_after_clipping_and_never_scaled() -> None:
    rng = np.random.default_rng(1)
    params = {"w": 3.0 * np.ones((4, 3), np.float32), "b": -2.0 * np.ones((3,), np.float32)}
    grads = {k: 100.0 * rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()}
    lr, clip, decay = 1e-2, 1e-3, 0.1
    with_decay = make_optimizer(lr, clip_norm=clip, weight_decay=decay)
    without = make_optimizer(lr, clip_norm=clip, weight_decay=0.0)
    decayed, _ = with_decay.update(grads, with_decay.init(params), params)
    plain, _ = without.update(grads, without.init(params), params)
    decay_part = {k: np.asarray(decayed[k]) - np.asarray(plain[k]) for k in params}
    for name in params:
        np.testing.assert_allclose(decay_part[name], -lr * decay * params[name], rtol=1e-5)
    # The decay term is far larger than anything the clip would allow through.
    assert global_norm(decay_part) > 100 * lr * clip


def test_clip_norm_none_leaves_gradients_unclipped() -> None:
    rng = np.random.default_rng(2)
    params = {"w": rng.normal(size=(3, 3)).astype(np.float32)}
    grads = {"w": 1e3 * rng.normal(size=(3, 3)).astype(np.float32)}
    tx = make_optimizer(1e-2, clip_norm=None)
    state = tx.init(params)
    for _ in range(2):  # the second step depends on the gradient scale through Adam's moments
        updates, state = tx.update(grads, state, params)
    reference = optax.adamw(1e-2, weight_decay=0.0)
    ref_state = reference.init(params)
    for _ in range(2):
        ref_updates, ref_state = reference.update(grads, ref_state, params)
    np.testing.assert_array_equal(updates["w"], ref_updates["w"])


def test_warmup_cosine_schedule_rises_linearly_then_decays_to_end() -> None:
    schedule = warmup_cosine_schedule(1e-3, total_steps=100, warmup_steps=10)
    assert float(schedule(0)) == 0.0
    np.testing.assert_allclose(float(schedule(5)), 0.5e-3, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(10)), 1e-3, rtol=1e-6)
    midpoint = 10 + 90 // 2
    np.testing.assert_allclose(float(schedule(midpoint)), 0.5e-3, rtol=1e-5)
    np.testing.assert_allclose(float(schedule(100)), 0.0, atol=1e-12)
    with pytest.raises(ValueError, match="warmup_steps"):
        warmup_cosine_schedule(1e-3, total_steps=10, warmup_steps=10)
    with pytest.raises(ValueError, match="total_steps"):
        warmup_cosine_schedule(1e-3, total_steps=0, warmup_steps=0)


# ---------------------------------------------------------------------------
# train_step


def test_train_step_update_equals_numpy_adamw_of_clipped_gradients_over_three_steps() -> None:
    state = tiny_state()
    reference = NumpyAdamW(host_copy(state.params), LR, WEIGHT_DECAY, CLIP)
    unclipped = NumpyAdamW(host_copy(state.params), LR, WEIGHT_DECAY, None)
    for step in range(3):
        batch, rng = make_batch(10 + step), jax.random.key(100 + step)
        ref_params = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), reference.params)
        grads = reference_grads(TINY, ref_params, batch, rng)
        norm = global_norm(grads)
        assert norm >= 100 * CLIP  # the regime of the issue: gradients 100x the threshold
        state, metrics = train_step(state, batch, rng)
        reference.step(grads)
        unclipped.step(grads)
        np.testing.assert_allclose(float(metrics["grad_norm"]), norm, rtol=1e-5)
        assert float(metrics["clipped_grad_norm"]) <= CLIP * (1 + 1e-6)
        np.testing.assert_allclose(float(metrics["clipped_grad_norm"]), CLIP, rtol=1e-5)
        assert int(metrics["skipped"]) == 0
        for got, want in zip(
            jax.tree.leaves(state.params), jax.tree.leaves(reference.params), strict=True
        ):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-7)
    # The check can tell: without clipping the trajectory would differ measurably.
    pairs = zip(jax.tree.leaves(state.params), jax.tree.leaves(unclipped.params), strict=True)
    differences = [np.max(np.abs(np.asarray(a) - b)) for a, b in pairs]
    assert max(differences) > 1e-5
    assert int(state.step) == 3 and int(state.skipped_steps) == 0


def test_train_step_below_threshold_reports_equal_norms() -> None:
    state = create_train_state(OBSERVED, OBSERVED_TX, jax.random.key(0), make_batch(0))
    state, metrics = train_step(state, make_batch(3), jax.random.key(1), calibrate=False)
    assert float(metrics["grad_norm"]) < 1.0
    assert float(metrics["clipped_grad_norm"]) == float(metrics["grad_norm"])


@pytest.mark.parametrize("poison", ["target_nan", "input_inf"])
def test_non_finite_step_is_skipped_with_state_unchanged_and_counted(poison: str) -> None:
    state = tiny_state()
    state, _ = train_step(state, make_batch(1), jax.random.key(1))
    before = host_copy((state.params, state.opt_state))
    bad = make_batch(2)
    if poison == "target_nan":
        target = np.array(bad.target)
        target[0, 0] = np.nan
        bad = bad.replace(target=target)
    else:
        historical = np.array(bad.historical)
        historical[1, 0, 0] = np.inf
        bad = bad.replace(historical=historical)
    state, metrics = train_step(state, bad, jax.random.key(2))
    assert int(metrics["skipped"]) == 1
    assert not math.isfinite(float(metrics["grad_norm"])) or not math.isfinite(
        float(metrics["loss"])
    )
    assert int(state.skipped_steps) == 1
    assert int(state.step) == 2
    assert_trees_equal((state.params, state.opt_state), before)
    # Training continues normally afterwards.
    state, metrics = train_step(state, make_batch(3), jax.random.key(3))
    assert int(metrics["skipped"]) == 0 and int(state.skipped_steps) == 1
    changed = [
        not np.array_equal(np.asarray(a), b)
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before[0]), strict=True)
    ]
    assert all(changed)


def test_another_optax_optimizer_trains_and_skips_a_non_finite_step_too() -> None:
    state = create_train_state(TINY, optax.adamw(LR), jax.random.key(0), make_batch(0))
    state, metrics = train_step(state, make_batch(1), jax.random.key(1))
    assert int(metrics["skipped"]) == 0
    before = host_copy((state.params, state.opt_state))
    bad = make_batch(2)
    target = np.array(bad.target)
    target[0, 0] = np.nan
    state, metrics = train_step(state, bad.replace(target=target), jax.random.key(2))
    assert int(metrics["skipped"]) == 1 and int(state.skipped_steps) == 1
    assert_trees_equal((state.params, state.opt_state), before)


def rate_turning(bad: float, from_step: int) -> Any:
    """A schedule of `LR` that gives `bad` from update `from_step` on (fine at step 0)."""
    return lambda count: jnp.where(count >= from_step, bad, LR)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -LR])
def test_a_scheduled_rate_gone_bad_after_step_0_skips_steps_and_keeps_the_params(
    bad: float,
) -> None:
    tx = make_optimizer(rate_turning(bad, 2), clip_norm=CLIP, weight_decay=WEIGHT_DECAY)
    state = create_train_state(TINY, tx, jax.random.key(0), make_batch(0))
    skipped = []
    for step in range(4):
        if step == 2:
            kept = host_copy((state.params, state.opt_state))
        state, metrics = train_step(state, make_batch(1 + step), jax.random.key(step))
        skipped.append(int(metrics["skipped"]))
        assert math.isfinite(float(metrics["loss"])) and math.isfinite(float(metrics["grad_norm"]))
    # Applied, the NaN or inf rate would have turned every parameter non-finite.
    assert skipped == [0, 0, 1, 1] and int(state.skipped_steps) == 2
    assert_trees_equal((state.params, state.opt_state), kept)


SKIP_WARNING = (
    "fit (FP32): step {step}: {count} step(s) since the previous evaluation skipped (non-finite "
    "loss or gradient, or an unusable learning rate); their updates were not applied"
)


def skip_warnings(caught: Any) -> list[str]:
    return [str(w.message) for w in caught if "skipped" in str(w.message)]


@pytest.mark.parametrize("quiet", [False, True])
def test_fit_announces_skipped_steps_at_the_evaluation_after_them(quiet: bool) -> None:
    # A repair the user did not ask for is announced even when quiet: quiet=True
    # silenced the note, and steps went unapplied without a word.
    tx = make_optimizer(rate_turning(math.nan, 3), clip_norm=CLIP, weight_decay=WEIGHT_DECAY)
    state = create_train_state(TINY, tx, jax.random.key(0), make_batch(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(
            state,
            [make_batch(100 + i) for i in range(4)],
            epochs=1,
            eval_every=2,
            label="FP32",
            quiet=quiet,
        )
    assert result.history["skipped_steps"] == [0, 1]
    assert skip_warnings(caught) == [SKIP_WARNING.format(step=4, count=1)]
    # Training the same state on (a new run, counting its own steps): only its skips are announced.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = fit(
            result.state,
            [make_batch(200 + i) for i in range(2)],
            epochs=1,
            label="FP32",
            quiet=quiet,
        )
    assert again.history["skipped_steps"] == [3]
    assert skip_warnings(caught) == [SKIP_WARNING.format(step=2, count=2)]


def _with_nan(batch: Batch, field: str) -> Batch:
    values = getattr(batch, field).copy()
    values[0, 1] = np.nan
    return dataclasses.replace(batch, **{field: values})


def test_skipped_steps_name_the_training_batch_that_holds_nan_data() -> None:
    # Before: "N step(s) ... skipped (non-finite loss ...)" and nothing on the cause, and
    # a run whose every step was skipped ended 'completed' with the untrained model.
    state = create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0))
    batches = [make_batch(100), _with_nan(make_batch(101), "target"), make_batch(102)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(state, batches, epochs=1, quiet=True)
    assert skip_warnings(caught) == [
        "fit: step 3: 1 step(s) since the previous evaluation skipped (non-finite loss or "
        "gradient, or an unusable learning rate); their updates were not applied; "
        "train_batches: batch 1 holds 1 NaN or inf targets (the first at window 0, horizon "
        "step 1): mark missing targets with batch.target_mask"
    ]
    state = create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0))
    batches = [_with_nan(make_batch(100 + i), "historical") for i in range(2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(state, batches, epochs=1, quiet=True)
    said = skip_warnings(caught)
    assert len(said) == 2 and said[1].startswith(
        "fit: every one of the 2 steps was skipped (non-finite loss or gradient, or an "
        "unusable learning rate): the model never trained; train_batches: batch 0: "
        "batch.historical holds 2 NaN or inf values (the first at index (0, 1, 0))"
    ), said
    assert int(result.state.skipped_steps) == 2


def test_quant_stats_never_enter_params_gradients_or_weight_decay() -> None:
    batch = make_batch(4, scale=5.0)
    state = create_train_state(OBSERVED, OBSERVED_TX, jax.random.key(0), batch)
    assert set(state.params) == {"head"}
    assert set(state.extra_params) == {"quant_params"}
    assert set(state.model_state) == {"quant_stats"}
    # Adam's moments cover the trained collections only (one flat vector of their scalars).
    trained_size = sum(np.size(leaf) for leaf in jax.tree.leaves(state.trainables()))
    assert state.opt_state.mu.shape == (trained_size,)

    # Calibration: the observer follows its own rule; the gradient covers the
    # trained collections only.
    trainables = host_copy(state.trainables())
    grads = jax.jit(
        jax.grad(  # jitted: one compile instead of one per primitive
            lambda trained: reference_loss(
                OBSERVED.apply(
                    {**trained, "quant_stats": {"max_abs": jnp.ones(())}},
                    batch.static,
                    batch.historical,
                    batch.future,
                    calibrate=True,
                    mutable=["quant_stats"],
                )[0].quantiles,
                jnp.asarray(batch.target),
            )
        )
    )(trainables)
    state, metrics = train_step(state, batch, jax.random.key(1), calibrate=True)
    expected_max = max(
        float(np.max(np.abs(x))) for x in (batch.static, batch.historical, batch.future)
    )
    np.testing.assert_allclose(
        float(state.model_state["quant_stats"]["max_abs"]), expected_max, rtol=1e-6
    )
    np.testing.assert_allclose(float(metrics["grad_norm"]), global_norm(grads), rtol=1e-5)
    assert float(state.extra_params["quant_params"]["log_scale"]) != 0.0

    # Frozen observers stay bit-identical through training with weight decay.
    frozen = host_copy(state.model_state)
    for step in range(3):
        state, _ = train_step(state, make_batch(20 + step, 9.0), jax.random.key(step), False)
    assert_trees_equal(state.model_state, frozen)


def test_create_train_state_starts_from_given_variables_and_checks_them() -> None:
    source = tiny_state(seed=5)
    variables = host_copy(source.variables)
    state = create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0), variables=variables)
    assert_trees_equal(state.params, variables["params"])
    wrong = {"params": {**variables["params"], "head": {"kernel": np.zeros((8, 1), np.float32)}}}
    with pytest.raises(ValueError, match="head"):
        create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0), variables=wrong)
    extra = {**variables, "extra": {"x": np.zeros(1, np.float32)}}
    with pytest.raises(ValueError, match="collections"):
        create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0), variables=extra)
    # An empty one holds nothing to keep (qat.from_fp32's 'quant_stats' with bits=None).
    empty = create_train_state(
        TINY, TINY_TX, jax.random.key(0), make_batch(0), variables={**variables, "extra": {}}
    )
    assert "extra" not in empty.variables


def test_fit_leaves_the_variables_a_state_was_created_from_alive() -> None:
    # fit donates its state; the state held the caller's own arrays, so an FP32 model's
    # variables (which qat.from_fp32 shares) were deleted by fine-tuning from them.
    variables = jax.tree.map(jnp.asarray, host_copy(tiny_state(seed=5).variables))
    before = host_copy(variables)
    state = create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0), variables=variables)
    fit(state, [make_batch(1)], epochs=1, quiet=True)
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(variables))
    assert_trees_equal(host_copy(variables), before)


class MergedDeterministic(nn.Module):
    """Flax's own style: `deterministic` is None unless given, and required with dropout."""

    @nn.compact
    def __call__(
        self, static, historical, future, known_history=None, static_categorical=None,
        deterministic: bool | None = None,
    ) -> TinyOutput:  # fmt: skip
        hidden = nn.Dense(8)(_flat_inputs(static, historical, future))
        hidden = nn.Dropout(0.25)(hidden, deterministic=deterministic)
        return TinyOutput(quantiles=nn.Dense(H * 3)(hidden).reshape(-1, H, 3))


class WithoutDeterministic(nn.Module):
    @nn.compact
    def __call__(self, static, historical, future, known_history=None, static_categorical=None):
        return TinyOutput(quantiles=nn.Dense(H * 3)(_flat_inputs(static, historical, future)))


class ShapedOutput(nn.Module):
    """Returns `.quantiles` of a given shape and dtype, whatever the batch."""

    shape: tuple[int, ...] = (B, H, 3)
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, static, historical, future, known_history=None,
                 static_categorical=None, deterministic=True):  # fmt: skip
        scale = self.param("scale", nn.initializers.ones, ())
        return TinyOutput(quantiles=(scale * jnp.ones(self.shape)).astype(self.dtype))


def test_create_train_state_calls_the_model_with_deterministic_as_the_step_does() -> None:
    # A Flax-style model (nn.merge_param) failed at init: "Parameter 'deterministic' must be
    # passed"; one without the keyword passed init and failed at the first step.
    state = create_train_state(
        MergedDeterministic(), TINY_TX, jax.random.key(0), make_batch(0), quantiles=QUANTILES
    )
    state, metrics = train_step(state, make_batch(1), jax.random.key(1))
    assert math.isfinite(float(metrics["loss"]))
    with pytest.raises(TypeError, match=r"create_train_state: the model must take a `determin"):
        create_train_state(
            WithoutDeterministic(), TINY_TX, jax.random.key(0), make_batch(0), quantiles=QUANTILES
        )


def test_an_output_that_breaks_the_loss_contract_is_refused_by_predict_and_the_step() -> None:
    # predict returned any output; integer quantiles trained with zero gradients, silently.
    for shape, match in (((B, H + 1, 3), r"\(B, H, Q\) = \(4, 2, 3\).*got \(4, 3, 3\)"),
                         ((B * H * 3,), r"\(B, H, Q\) = \(4, 2, 3\).*got \(24,\)")):  # fmt: skip
        state = create_train_state(
            ShapedOutput(shape), TINY_TX, jax.random.key(0), make_batch(0), quantiles=QUANTILES
        )
        with pytest.raises(
            ValueError, match=rf"predict: the model's .quantiles must have shape {match}"
        ):
            predict(state, make_batch(1))
    state = create_train_state(
        ShapedOutput(dtype=jnp.int32), TINY_TX, jax.random.key(0), make_batch(0),
        quantiles=QUANTILES,
    )  # fmt: skip
    with pytest.raises(TypeError, match=r"predict: the model's .quantiles must be floating"):
        predict(state, make_batch(1))
    with pytest.raises(TypeError, match=r"batch_loss: the model's .quantiles must be floating"):
        train_step(state, make_batch(1), jax.random.key(1))
    assert predict(
        create_train_state(ShapedOutput(), TINY_TX, jax.random.key(0), make_batch(0),
                           quantiles=QUANTILES),
        make_batch(1),
    ).quantiles.shape == (B, H, 3)  # fmt: skip


def test_calibrate_true_without_model_state_is_rejected() -> None:
    state = tiny_state()
    with pytest.raises(ValueError, match="calibrate=True"):
        train_step(state, make_batch(1), jax.random.key(0), calibrate=True)


def test_train_step_rejects_wrong_argument_types() -> None:
    state = tiny_state()
    with pytest.raises(TypeError, match="Batch"):
        train_step(state, {"target": np.zeros((B, H))}, jax.random.key(0))
    with pytest.raises(TypeError, match="TrainState"):
        train_step(state.params, make_batch(1), jax.random.key(0))
    bad_target = make_batch(1).replace(target=np.zeros((B, H, 1), np.float32))
    with pytest.raises(ValueError, match="target"):
        train_step(state, bad_target, jax.random.key(0))


def test_create_train_state_needs_quantiles_from_the_model_or_the_caller() -> None:
    class Bare(nn.Module):
        @nn.compact
        def __call__(self, static: Any, historical: Any, future: Any, **_: Any) -> TinyOutput:
            return TinyOutput(quantiles=jnp.zeros((historical.shape[0], H, 3)))

    with pytest.raises(TypeError, match="quantiles"):
        create_train_state(Bare(), TINY_TX, jax.random.key(0), make_batch(0))


def test_masked_loss_refuses_fewer_quantile_levels_than_the_model_outputs() -> None:
    # Before: with a target mask, one level broadcast over the model's three
    # outputs and the loss came out as a number (the unmasked path raised).
    # (create_train_state refuses levels other than the model's own: set on the state.)
    state = create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0))
    state = state.replace(quantiles=(0.5,))
    masked = make_batch(1).replace(target_mask=np.ones((B, H), np.float32))
    with pytest.raises(
        ValueError, match=r"batch_loss: output\.quantiles must have shape \(\.\.\., 1\)"
    ):
        eval_step(state, masked)


def test_create_train_state_refuses_quantile_levels_outside_0_1() -> None:
    # Before: accepted, and a masked batch's loss used the level 1.5 silently.
    with pytest.raises(ValueError, match=r"create_train_state: quantiles must be .* in \(0, 1\)"):
        create_train_state(
            TINY, TINY_TX, jax.random.key(0), make_batch(0), quantiles=(0.1, 0.5, 1.5)
        )


def test_create_train_state_refuses_a_bare_string_as_trainable() -> None:
    # Before: read character by character, so 'quant_params' went to model_state
    # and was never trained, silently.
    with pytest.raises(TypeError, match="create_train_state: trainable must be a sequence"):
        create_train_state(
            OBSERVED, OBSERVED_TX, jax.random.key(0), make_batch(0), trainable="quant_params"
        )
    state = create_train_state(
        OBSERVED, OBSERVED_TX, jax.random.key(0), make_batch(0), trainable=["quant_params"]
    )
    assert list(state.extra_params) == ["quant_params"]
    assert list(state.model_state) == ["quant_stats"]


def numpy_pinball_mean(pred: np.ndarray, target: np.ndarray, observed: np.ndarray) -> float:
    levels = np.asarray(QUANTILES, np.float64)
    error = target.astype(np.float64)[..., None] - pred.astype(np.float64)
    losses = np.maximum(levels * error, (levels - 1.0) * error)
    return float(losses[observed].mean())


def test_target_mask_restricts_the_loss_to_observed_steps_even_over_nan_gaps() -> None:
    state = tiny_state()
    batch = make_batch(5)
    mask = np.ones((B, H), np.float32)
    mask[0, 1] = mask[2, 0] = 0.0
    target = np.array(batch.target)
    target[mask == 0] = np.nan  # what a filled gap may hold
    masked = batch.replace(target=target, target_mask=mask)
    pred = np.asarray(predict(state, masked).quantiles)
    expected = numpy_pinball_mean(pred, target, mask != 0)
    np.testing.assert_allclose(float(eval_step(state, masked)), expected, rtol=1e-6)
    state, metrics = train_step(state, masked, jax.random.key(0))
    assert int(metrics["skipped"]) == 0
    assert math.isfinite(float(metrics["grad_norm"]))


def test_evaluate_is_the_mean_over_every_target_whatever_the_batch_sizes() -> None:
    state = tiny_state()
    full = make_batch(6)
    mask = np.ones((B, H), np.float32)
    mask[1] = 0.0
    parts = [
        jax.tree.map(lambda x: x[:1], full),
        jax.tree.map(lambda x: x[1:], full).replace(target_mask=mask[1:]),
    ]
    pred = np.asarray(predict(state, full).quantiles)
    expected = numpy_pinball_mean(pred, np.asarray(full.target), mask != 0)
    np.testing.assert_allclose(evaluate(state, parts), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="no observed target"):
        evaluate(state, [])


def test_target_mask_of_the_wrong_shape_is_rejected() -> None:
    bad = make_batch(1).replace(target_mask=np.ones((B, H + 1), np.float32))
    with pytest.raises(ValueError, match="target_mask"):
        train_step(tiny_state(), bad, jax.random.key(0))


# ---------------------------------------------------------------------------
# fit on the stand-in


def test_fit_stops_after_patience_evaluations_without_improvement() -> None:
    frozen = make_optimizer(optax.constant_schedule(0.0), clip_norm=1.0)
    state = create_train_state(TINY, frozen, jax.random.key(0), make_batch(0))
    batches = [make_batch(30 + i) for i in range(2)]
    result = fit(state, batches, [make_batch(40)], epochs=10, patience=2, quiet=True)
    # A zero learning rate never improves on the first evaluation: 1 + patience evaluations.
    assert isinstance(result, FitResult)
    assert result.history["epoch"] == [0, 1, 2]
    assert result.history["step"] == [2, 4, 6]
    assert len(set(result.history["val_loss"])) == 1
    assert int(result.state.step) == 6


def test_a_run_stopped_early_resumed_with_a_larger_patience_trains_on(tmp_path, capsys) -> None:
    # A zero learning rate never improves on the first evaluation: patience 2
    # stops at step 6. Resumed with the same patience it returns at once; with
    # patience 4 it trains on to 1 + 4 evaluations (step 10), saying 4, not 2.
    frozen = make_optimizer(optax.constant_schedule(0.0), clip_norm=1.0)

    def run(patience: int | None) -> FitResult:
        state = create_train_state(TINY, frozen, jax.random.key(0), make_batch(0))
        batches = [make_batch(30 + i) for i in range(2)]
        return fit(
            state, batches, [make_batch(40)], epochs=8, patience=patience, resume=True,
            checkpoint_dir=tmp_path, label="FP32", log_seconds=1e9,
        )  # fmt: skip

    assert int(run(2).state.step) == 6
    again = run(2)
    assert again.stop_reason == "early_stopping" and int(again.state.step) == 6
    capsys.readouterr()
    longer = run(4)
    assert longer.stop_reason == "early_stopping"
    assert longer.history["step"] == [2, 4, 6, 8, 10]
    assert "FP32: stopped early at step 10/16: no lower validation loss in 4 evaluations" in (
        capsys.readouterr().err
    )
    unlimited = run(None)  # no patience: no early stop, every epoch
    assert unlimited.stop_reason == "completed" and int(unlimited.state.step) == 16


def test_fit_evaluates_every_n_steps_and_once_more_after_the_last() -> None:
    batches = [make_batch(60 + i) for i in range(3)]
    result = fit(
        tiny_state(), batches, [make_batch(70)], epochs=5, eval_every=3, max_steps=7, quiet=True
    )
    assert result.history["step"] == [3, 6, 7]
    assert result.history["epoch"] == [0, 1, 2]
    assert int(result.state.step) == 7
    assert all(isinstance(loss, float) for loss in result.history["val_loss"])


@pytest.mark.parametrize(
    ("eval_every", "steps", "epochs"),
    [
        (None, [3, 6, 9], [0, 1, 2]),
        (2, [2, 4, 6, 8, 9], [0, 1, 1, 2, 2]),
        (4, [4, 8, 9], [1, 2, 2]),
    ],
)
def test_fit_labels_each_evaluation_with_the_epoch_of_its_last_batch(eval_every, steps, epochs):
    # Three epochs of three batches: the evaluation after the last one said epoch 3 (an
    # epoch that never ran) unless it fell on an eval_every multiple.
    batches = [make_batch(80 + i) for i in range(3)]
    result = fit(
        tiny_state(), batches, [make_batch(90)], epochs=3, eval_every=eval_every, quiet=True
    )
    assert result.history["step"] == steps
    assert result.history["epoch"] == epochs


def test_fit_calibrates_observers_for_the_first_calibrate_steps_only() -> None:
    batches = [make_batch(80 + i, scale=2.0 + 3.0 * i) for i in range(4)]
    state = create_train_state(OBSERVED, OBSERVED_TX, jax.random.key(0), batches[0])
    result = fit(state, batches, epochs=1, calibrate_steps=2, quiet=True)
    seen = [
        max(float(np.max(np.abs(x))) for x in (b.static, b.historical, b.future)) for b in batches
    ]
    observed = float(result.state.model_state["quant_stats"]["max_abs"])
    np.testing.assert_allclose(observed, max(seen[:2]), rtol=1e-6)
    assert observed < max(seen)
    assert result.history["val_loss"] == [None]


def test_fit_is_deterministic_given_the_seed_and_depends_on_it() -> None:
    def run(seed: int) -> list[np.ndarray]:
        state = tiny_state()
        result = fit(state, lambda epoch: [make_batch(50 + epoch)], epochs=3, seed=seed, quiet=True)
        return [np.asarray(leaf) for leaf in jax.tree.leaves(result.state.params)]

    first, again, other = run(0), run(0), run(1)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))


# ---------------------------------------------------------------------------
# The real model

TFT_CONFIG = TFTConfig(
    num_static_features=1,
    num_known_features=2,
    num_observed_features=1,
    hidden_dim=8,
    num_heads=2,
    sequence_length=6,
    prediction_horizon=3,
    quantiles=QUANTILES,
    dropout_rate=0.1,
)


def synthetic_tft_batch(seed: int, batch_size: int = 16) -> Batch:
    """A learnable problem: the target is a fixed function of the known future inputs."""
    cfg = TFT_CONFIG
    rng = np.random.default_rng(seed)
    steps = cfg.sequence_length + cfg.prediction_horizon
    phase = rng.uniform(0, 2 * np.pi, size=(batch_size, 1))
    time = np.arange(steps)[None, :]
    known = np.stack([np.sin(phase + 0.7 * time), np.cos(phase + 0.7 * time)], axis=-1)
    level = rng.normal(size=(batch_size, 1))
    series = 2.0 * known[..., 0] + level
    history = series[:, : cfg.sequence_length, None]
    return Batch(
        static=level.astype(np.float32),
        historical=history.astype(np.float32),
        future=known[:, cfg.sequence_length :].astype(np.float32),
        known_history=None,
        static_categorical=None,
        target=series[:, cfg.sequence_length :].astype(np.float32),
    )


@pytest.mark.slow
def test_tft_training_lowers_the_loss_and_keeps_the_best_validation_state() -> None:
    model = TemporalFusionTransformer(TFT_CONFIG)
    tx = make_optimizer(1e-2, clip_norm=1.0)
    train = [synthetic_tft_batch(seed) for seed in range(4)]
    val = [synthetic_tft_batch(100)]
    state = create_train_state(model, tx, jax.random.key(0), train[0])
    initial_val = evaluate(state, val)
    result = fit(state, train, val, epochs=10, seed=0, quiet=True)
    history = result.history
    assert history["epoch"] == list(range(10))
    assert history["step"] == [4 * (e + 1) for e in range(10)]
    assert all(math.isfinite(loss) for loss in history["train_loss"])
    assert min(history["val_loss"]) < 0.5 * initial_val
    assert history["train_loss"][-1] < 0.5 * history["train_loss"][0]
    best = int(np.argmin(history["val_loss"]))
    assert evaluate(result.best_state, val) == pytest.approx(history["val_loss"][best], rel=1e-6)
    assert int(result.best_state.step) == history["step"][best]
    output = predict(result.state, val[0])
    assert output.quantiles.shape == (16, TFT_CONFIG.prediction_horizon, len(QUANTILES))


@pytest.mark.slow
def test_qat_model_trains_params_and_quant_params_while_quant_stats_only_observe() -> None:
    from qat.config import QATConfig
    from qat.model import QATTemporalFusionTransformer, from_fp32

    # The batch size of the FP32 test above: its compiled FP32 init serves this one.
    batch = synthetic_tft_batch(7)
    tx = make_optimizer(1e-2, clip_norm=1.0, weight_decay=1e-4)
    fp32 = create_train_state(TemporalFusionTransformer(TFT_CONFIG), tx, jax.random.key(0), batch)
    qat_model = QATTemporalFusionTransformer(TFT_CONFIG, QATConfig(learnable_scale=True))
    variables = from_fp32(fp32.variables, qat_model, batch.static, batch.historical, batch.future)
    state = create_train_state(qat_model, tx, jax.random.key(0), batch, variables=variables)
    assert set(state.extra_params) == {"quant_params"}
    assert set(state.model_state) == {"quant_stats"}
    trained_size = sum(np.size(leaf) for leaf in jax.tree.leaves(state.trainables()))
    assert set(state.trainables()) == {"params", "quant_params"}
    assert state.opt_state.mu.shape == (trained_size,)
    assert_trees_equal(state.params, host_copy(fp32.params))

    before = host_copy(state.variables)
    state, metrics = train_step(state, batch, jax.random.key(1), calibrate=True)
    assert int(metrics["skipped"]) == 0
    assert all(math.isfinite(float(metrics[name])) for name in ("loss", "grad_norm"))
    after = host_copy(state.variables)
    for collection in ("params", "quant_params", "quant_stats"):
        pairs = zip(
            jax.tree.leaves(after[collection]), jax.tree.leaves(before[collection]), strict=True
        )
        assert any(not np.array_equal(a, b) for a, b in pairs), collection


def test_weight_decay_never_touches_quantizer_step_sizes():
    tx = make_optimizer(learning_rate=0.1, clip_norm=None, weight_decay=0.5)
    trainables = {"params": {"w": jnp.ones(3)}, "quant_params": {"scale_offset": jnp.ones(())}}
    zero_grads = jax.tree.map(jnp.zeros_like, trainables)
    updates, _ = tx.update(zero_grads, tx.init(trainables), trainables)
    np.testing.assert_allclose(updates["params"]["w"], -0.1 * 0.5 * np.ones(3), rtol=1e-6)
    assert float(updates["quant_params"]["scale_offset"]) == 0.0


# ---------------------------------------------------------------------------
# The step as one conditional update, and its ahead-of-time lowering


def test_skipped_step_keeps_observers_and_reports_a_nan_clipped_norm() -> None:
    state = create_train_state(OBSERVED, OBSERVED_TX, jax.random.key(0), make_batch(0))
    state, _ = train_step(state, make_batch(1), jax.random.key(1), calibrate=True)
    before = host_copy((state.trainables(), state.opt_state, state.model_state))
    historical = np.array(make_batch(2).historical)
    historical[0, 0, 0] = np.inf  # the observer would record inf
    bad = make_batch(2).replace(historical=historical)
    state, metrics = train_step(state, bad, jax.random.key(2), calibrate=True)
    assert int(metrics["skipped"]) == 1
    assert math.isnan(float(metrics["clipped_grad_norm"]))
    assert_trees_equal((state.trainables(), state.opt_state, state.model_state), before)


def test_copy_state_survives_the_donation_of_the_original() -> None:
    from tft_jax.train import copy_state

    state, batch, rng = tiny_state(), make_batch(1), jax.random.key(1)
    before = host_copy(state)
    copy = copy_state(state)
    train_step(state, batch, rng)  # donates the buffers of `state`
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state.params))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(copy))
    assert_trees_equal(copy, before)


def stacked(batches: list[Batch]) -> Batch:
    """The batches stacked along a new leading axis (what `lax.scan` iterates over)."""
    return jax.tree.map(lambda *leaves: jnp.stack([jnp.asarray(x) for x in leaves]), *batches)


@pytest.mark.parametrize("options", [None, "fast"])
def test_train_steps_scanned_under_jit_equal_the_same_steps_run_eagerly(options) -> None:
    # `train_step` read `state.step.is_deleted()`, which a tracer cannot answer:
    # the step could not run inside the caller's jit, scan or eval_shape.
    from tft_jax.train import FAST_COMPILE_OPTIONS, copy_state

    # Options are for a top-level jit only: traced, the step leaves them to the caller's.
    compiler_options = FAST_COMPILE_OPTIONS if options else None
    batches = [make_batch(1 + step) for step in range(3)]
    keys = jax.random.split(jax.random.key(7), 3)
    state = tiny_state()
    eager, losses = copy_state(state), []
    for batch, key in zip(batches, keys, strict=True):
        eager, metrics = train_step(eager, batch, key)
        losses.append(float(metrics["loss"]))

    def body(carry: TrainState, inputs: tuple[Batch, jax.Array]) -> tuple[TrainState, jax.Array]:
        carry, metrics = train_step(carry, *inputs, compiler_options=compiler_options)
        return carry, metrics["loss"]

    scanned, scanned_losses = jax.jit(lambda s, xs: jax.lax.scan(body, s, xs))(
        copy_state(state), (stacked(batches), keys)
    )
    assert len(set(losses)) == 3  # three different steps
    np.testing.assert_allclose(np.asarray(scanned_losses), losses, rtol=1e-6)
    assert int(scanned.step) == 3 and int(scanned.opt_state.count) == 3
    for got, want in zip(
        jax.tree.leaves(scanned.params), jax.tree.leaves(eager.params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)
    shapes = jax.eval_shape(lambda s: train_step(s, batches[0], keys[0])[1], state)
    assert shapes["loss"].shape == () and shapes["loss"].dtype == jnp.float32


def test_eval_step_and_predict_run_under_jit_as_they_do_eagerly() -> None:
    state, batch = tiny_state(), make_batch(2)
    want = float(eval_step(state, batch))
    assert float(jax.jit(eval_step)(state, batch)) == pytest.approx(want, rel=1e-6)
    np.testing.assert_allclose(
        np.asarray(jax.jit(predict)(state, batch).quantiles),
        np.asarray(predict(state, batch).quantiles),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        float(reference_loss(predict(state, batch).quantiles, jnp.asarray(batch.target))),
        want,
        rtol=1e-6,
    )


def test_create_train_state_traced_gives_the_shapes_and_values_of_the_eager_state() -> None:
    # The nested init jit took INIT_COMPILE_OPTIONS, which only a top-level jit may:
    # jax.eval_shape (an abstract target for a checkpoint restore) and jax.jit failed.
    def build(key: jax.Array) -> TrainState:
        return create_train_state(OBSERVED, OBSERVED_TX, key, make_batch(0))

    eager = build(jax.random.key(3))
    abstract = jax.eval_shape(build, jax.random.key(3))
    assert jax.tree.structure(abstract) == jax.tree.structure(eager)
    assert [(a.shape, a.dtype) for a in jax.tree.leaves(abstract)] == [
        (b.shape, b.dtype) for b in jax.tree.leaves(eager)
    ]
    jitted = jax.jit(build)(jax.random.key(3))
    assert jax.tree.structure(jitted) == jax.tree.structure(eager)
    for got, want in zip(jax.tree.leaves(jitted), jax.tree.leaves(eager), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_lower_train_step_compiles_the_step_that_train_step_runs(caplog) -> None:
    import jax.stages

    from tft_jax.train import FAST_COMPILE_OPTIONS, copy_state, lower_train_step

    state, batch, rng = tiny_state(), make_batch(1), jax.random.key(1)
    lowered = lower_train_step(state, batch, rng)
    assert isinstance(lowered, jax.stages.Lowered)
    compiled = lowered.compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    assert analysis["flops"] > 0
    # Lowering donates nothing (the state is still usable); train_step then
    # runs that very executable without compiling again, and computes what
    # the compiled step computes.
    copy, second_copy = copy_state(state), copy_state(state)
    with jax.log_compiles(), caplog.at_level("WARNING"):
        expected_state, expected_metrics = train_step(copy, batch, rng)
    assert not [r for r in caplog.records if "_train_step" in r.getMessage()]
    got_state, got_metrics = compiled(state, batch, rng)
    assert_trees_equal(got_metrics, expected_metrics)
    assert_trees_equal(got_state.params, expected_state.params)
    # Other compiler options are another executable (and the log shows compiles).
    with jax.log_compiles(), caplog.at_level("WARNING"):
        _, other_metrics = train_step(
            second_copy, batch, rng, compiler_options=FAST_COMPILE_OPTIONS
        )
    assert [r for r in caplog.records if "_train_step" in r.getMessage()]
    np.testing.assert_allclose(other_metrics["loss"], expected_metrics["loss"], rtol=1e-6)
    with pytest.raises(TypeError, match="lower_train_step: batch must be"):
        lower_train_step(tiny_state(), {"target": np.zeros((B, H))}, rng)
    with pytest.raises(ValueError, match="lower_train_step: calibrate=True"):
        lower_train_step(tiny_state(), batch, rng, calibrate=True)
    with pytest.raises(TypeError, match="train_step: compiler_options must be"):
        train_step(tiny_state(), batch, rng, compiler_options="fast")


# ---------------------------------------------------------------------------
# The time budget and the progress display, on a fake clock


class FakeClock:
    """A clock that stands still until told to advance (`now` seconds)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ticking(clock: FakeClock, batches: list[Batch], seconds: float = 1.0) -> Any:
    """A batch source whose every batch takes `seconds` on `clock` (fetched before its step)."""

    def source(epoch: int) -> Any:
        for batch in batches:
            clock.now += seconds
            yield batch

    return source


@pytest.mark.parametrize(("budget", "last_step"), [(4.5, 5), (5.0, 5), (5.5, 6)])
def test_time_budget_stops_at_the_first_step_that_spends_it(budget: float, last_step: int) -> None:
    # The clock starts at 100 and step s ends at 100 + s: the budget counts from fit's start.
    clock = FakeClock(100.0)
    batches = [make_batch(90 + i) for i in range(4)]
    result = fit(
        tiny_state(),
        ticking(clock, batches),
        epochs=10,
        time_budget=budget,
        clock=clock,
        quiet=True,
    )
    assert result.stop_reason == "time_budget"
    assert int(result.state.step) == last_step
    assert last_step - 1 < budget <= last_step
    assert result.history["step"] == [4, last_step]


def test_time_budget_run_still_evaluates_keeps_the_best_state_and_checkpoints(tmp_path) -> None:
    from tft_jax.checkpoint import TrainingCheckpointer, load_state

    clock = FakeClock()
    batches = [make_batch(90 + i) for i in range(4)]
    val = [make_batch(95)]
    common = dict(epochs=10, max_steps=9, eval_every=4, checkpoint_dir=tmp_path, quiet=True)
    result = fit(tiny_state(), ticking(clock, batches), val, time_budget=5.5, clock=clock, **common)
    assert result.stop_reason == "time_budget"
    assert result.history["step"] == [4, 6]  # the final evaluation follows the stop
    assert all(isinstance(loss, float) for loss in result.history["val_loss"])
    assert evaluate(result.state, val) == pytest.approx(result.history["val_loss"][-1], rel=1e-6)
    best = int(np.argmin(result.history["val_loss"]))
    assert int(result.best_state.step) == result.history["step"][best]
    with TrainingCheckpointer(tmp_path) as checkpointer:
        assert checkpointer.steps() == [4, 6]
        assert checkpointer.steps("best") == [result.history["step"][best]]
    latest = load_state(tmp_path, tiny_state(), prefer="latest")
    assert_trees_equal(latest.params, host_copy(result.state.params))

    # The budget counts the resumed run's earlier time: spent, it stops at once;
    # without a budget the run trains on to max_steps.
    again = fit(tiny_state(), ticking(clock, batches), val, resume=True, time_budget=5.5, **common)
    assert again.stop_reason == "time_budget"
    assert again.history == result.history
    on = fit(tiny_state(), ticking(clock, batches), val, resume=True, clock=clock, **common)
    assert on.stop_reason == "completed"
    assert on.history["step"] == [4, 6, 8, 9]


@pytest.mark.parametrize(
    ("ending", "last_step", "steps"),
    [("max_steps", 8, [5, 8]), ("time_budget", 6, [2, 4, 6])],
)
def test_a_run_ending_at_a_saved_step_resumes_as_finished_with_its_final_evaluation(
    tmp_path, ending: str, last_step: int, steps: list[int]
) -> None:
    # The last step is one the loop saves anyway (every 4 steps; an evaluation
    # every 2), before the final evaluation (max_steps) or the stop (the time
    # budget, spent at step 6) is known: the checkpoint must still hold them.
    clock = FakeClock()
    batches = [make_batch(90 + i) for i in range(5)]
    val = [make_batch(95)]
    if ending == "max_steps":
        common = dict(epochs=3, max_steps=8, checkpoint_every=4)
    else:
        common = dict(epochs=10, eval_every=2, time_budget=5.5)
    common.update(checkpoint_dir=tmp_path, clock=clock, quiet=True)
    result = fit(tiny_state(), ticking(clock, batches), val, **common)
    assert int(result.state.step) == last_step and result.history["step"] == steps
    # A finished run returns its results at once (no extra step, no lost evaluation).
    again = fit(tiny_state(), ticking(clock, batches), val, resume=True, **common)
    assert again.stop_reason == result.stop_reason
    assert int(again.state.step) == last_step
    assert again.history == result.history


def test_a_resumed_run_announces_the_skips_its_checkpoint_had_not_announced(tmp_path) -> None:
    # Steps 3 and 4 are skipped, the checkpoint at step 5 holds them, the run dies at
    # step 6 before its evaluation at step 8; resumed, it still reports all 5 skips.
    tx = make_optimizer(rate_turning(math.nan, 3), clip_norm=CLIP, weight_decay=WEIGHT_DECAY)
    batches = [make_batch(100 + i) for i in range(8)]

    class Killed(Exception):
        """The stand-in for a killed run."""

    def dying(epoch: int) -> Any:
        for index, batch in enumerate(batches):
            if index == 6:
                raise Killed
            yield batch

    common = dict(epochs=1, eval_every=8, checkpoint_dir=tmp_path, label="FP32")
    with pytest.raises(Killed):
        fit(
            create_train_state(TINY, tx, jax.random.key(0), make_batch(0)),
            dying,
            checkpoint_every=5,
            **common,
        )
    state = create_train_state(TINY, tx, jax.random.key(0), make_batch(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(state, batches, resume=True, **common)
    assert result.history["skipped_steps"] == [5]
    assert skip_warnings(caught) == [SKIP_WARNING.format(step=8, count=5)]


def test_fit_arguments_of_time_are_checked_and_named() -> None:
    state, batches = tiny_state(), [make_batch(0)]
    with pytest.raises(ValueError, match=r"fit: time_budget must be finite and > 0, got 0\.0"):
        fit(state, batches, epochs=1, time_budget=0.0)
    with pytest.raises(TypeError, match="fit: time_budget must be a float, got str '3m'"):
        fit(state, batches, epochs=1, time_budget="3m")
    with pytest.raises(ValueError, match="fit: checkpoint_every_seconds must be finite"):
        fit(state, batches, epochs=1, checkpoint_every_seconds=-1.0)
    with pytest.raises(TypeError, match="fit: label must be a string"):
        fit(state, batches, epochs=1, label=32)
    with pytest.raises(TypeError, match="fit: clock must be a callable"):
        fit(state, batches, epochs=1, clock=0.0)


def test_without_a_terminal_progress_is_plain_labelled_lines_with_eta(capsys) -> None:
    clock = FakeClock()
    batches = [make_batch(100 + i) for i in range(4)]
    result = fit(
        tiny_state(),
        ticking(clock, batches),
        [make_batch(105)],
        epochs=2,
        max_steps=8,  # the total of a generator's epochs is unknown otherwise
        eval_every=4,
        label="FP32",
        log_seconds=3.0,
        clock=clock,
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "\r" not in captured.err
    # Step s ends at s seconds; the rate (1 step/s) is measured from the
    # compiled first step, a line is due 3 s after the previous one.
    loss = r"\d+\.\d{4}"
    train = [f"{value:.4f}" for value in result.history["train_loss"]]
    val = [f"{value:.4f}" for value in result.history["val_loss"]]
    expected = [
        r"FP32: compiling the train step\.\.\.",
        r"FP32: compiled in 0\.0s",
        rf"FP32: step 4/8  loss {loss}  elapsed 4\.0s  ETA 4\.0s",
        rf"FP32: step 4/8  train_loss {train[0]}  val_loss {val[0]} \(evaluated in 0\.0s\)  "
        r"elapsed 4\.0s  ETA 4\.0s",
        rf"FP32: step 7/8  loss {loss}  elapsed 7\.0s  ETA 1\.0s",
        rf"FP32: step 8/8  train_loss {train[1]}  val_loss {val[1]} \(evaluated in 0\.0s\)  "
        r"elapsed 8\.0s  ETA 0\.0s",
        r"FP32: finished at step 8/8 after 8\.0s",
    ]
    lines = captured.err.splitlines()
    assert len(lines) == len(expected), captured.err
    for line, pattern in zip(lines, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_on_a_terminal_progress_is_a_bar_named_by_the_label(monkeypatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    fit(tiny_state(), [make_batch(100 + i) for i in range(4)], epochs=1, label="QAT")
    text = terminal.getvalue()
    assert text.startswith("QAT: compiling the train step...\nQAT: compiled in ")
    assert "\r" in text and re.search(r"QAT: 100%\S* 4/4", text)
    assert re.search(r"\nQAT: finished at step 4/4 after \d+\.\ds\n$", text)


def test_quiet_fit_prints_nothing(capsys, tmp_path) -> None:
    fit(
        tiny_state(),
        [make_batch(100 + i) for i in range(2)],
        [make_batch(105)],
        epochs=2,
        checkpoint_dir=tmp_path,
        resume=True,
        time_budget=60.0,
        label="FP32",
        log_seconds=0.0,
        quiet=True,
    )
    assert capsys.readouterr() == ("", "")


# ---------------------------------------------------------------------------
# The schedule in the optimizer state: one compiled step, refitted by the budget


def schedule_state(peak: float, total: int, warmup: int, end: float = 0.0) -> TrainState:
    tx = make_optimizer(warmup_cosine_schedule(peak, total, warmup, end), clip_norm=None)
    return create_train_state(TINY, tx, jax.random.key(0), make_batch(0))


def test_states_that_differ_only_in_schedule_numbers_share_one_compiled_step() -> None:
    from tft_jax.steps import _STEP_JITS

    batch, rng = make_batch(1), jax.random.key(1)
    # No warmup: the first update is `-peak · direction`, the same direction for both.
    first, second = schedule_state(1e-2, 40, 0), schedule_state(3e-3, 100, 0, 1e-5)
    start = host_copy(first.params)
    first, _ = train_step(first, batch, rng)
    step = _STEP_JITS[()]
    compiled = step._cache_size()
    second, _ = train_step(second, batch, rng)
    second, _ = train_step(with_schedule_steps(second, 60), batch, rng)
    assert step._cache_size() == compiled
    assert in_state_schedule(second).total_steps == 60
    # Each state trains with its own numbers.
    moved = np.asarray(first.params["head"]["bias"]) - start["head"]["bias"]
    assert np.all(np.abs(moved) > 0)
    rerun, _ = train_step(schedule_state(3e-3, 100, 0, 1e-5), batch, rng)
    ratio = (np.asarray(rerun.params["head"]["bias"]) - start["head"]["bias"]) / moved
    np.testing.assert_allclose(ratio, 3e-3 / 1e-2, rtol=1e-4)
    assert step._cache_size() == compiled


def test_equal_models_share_one_compiled_train_step_evaluate_and_predict() -> None:
    """A refit (a new model object equal to the last) neither traces nor compiles again."""
    from tft_jax.steps import _STEP_JITS, _output_loss, deterministic_output

    batch, rng = make_batch(1), jax.random.key(1)
    tx = lambda: make_optimizer(LR, clip_norm=CLIP, weight_decay=WEIGHT_DECAY)  # noqa: E731
    first = create_train_state(TinyForecaster(), tx(), jax.random.key(0), batch)
    first, _ = train_step(first, batch, rng)
    evaluate(first, [batch])
    forward = deterministic_output._cache_size()
    predict(first, batch)  # the forward that evaluate ran: one program for both
    assert deterministic_output._cache_size() == forward
    functions = (_STEP_JITS[()], deterministic_output, _output_loss)
    sizes = [f._cache_size() for f in functions]
    second = create_train_state(TinyForecaster(), tx(), jax.random.key(2), batch)
    assert second.apply_fn == first.apply_fn and hash(second.apply_fn) == hash(first.apply_fn)
    second, _ = train_step(second, batch, rng)
    evaluate(second, [batch])
    predict(second, batch)
    assert [f._cache_size() for f in functions] == sizes
    # The shared step still runs each model's own parameters.
    assert not np.allclose(host_copy(first.params)["head"]["bias"], second.params["head"]["bias"])


def test_given_variables_are_checked_against_shapes_traced_once_per_equal_model() -> None:
    batch = make_batch(1)
    variables = create_train_state(TinyForecaster(), TINY_TX, jax.random.key(0), batch).variables
    create_train_state(TinyForecaster(), TINY_TX, jax.random.key(1), batch, variables=variables)
    with recorded_traces() as traced:
        again = create_train_state(
            TinyForecaster(), TINY_TX, jax.random.key(2), batch, variables=variables
        )
    assert traced == []
    jax.tree.map(np.testing.assert_array_equal, again.params, variables["params"])


def test_models_that_differ_or_cannot_be_hashed_keep_their_own_apply() -> None:
    from tft_jax.train import ModelApply

    assert ModelApply(TinyForecaster()) != ModelApply(TinyForecaster(TinyConfig(horizon=3)))

    class Listed(nn.Module):  # a list field: the module cannot be hashed
        sizes: Any = None

        @nn.compact
        def __call__(self, x: Any) -> Any:
            return nn.Dense(self.sizes[0])(x)

    model = Listed([2])
    apply = ModelApply(model)
    assert apply == ModelApply(model) and hash(apply) == hash(ModelApply(model))
    assert apply != ModelApply(Listed([2]))
    x = jnp.ones((1, 3))
    variables = model.init(jax.random.key(0), x)
    np.testing.assert_array_equal(apply(variables, x), model.apply(variables, x))


def test_with_schedule_steps_rejects_what_it_cannot_do_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="with_schedule_steps: state's optimizer keeps no"):
        with_schedule_steps(tiny_state(), 10)
    state = schedule_state(1e-2, 40, 4)
    with pytest.raises(ValueError, match=r"total_steps must be above .* warmup steps \(4\), got 4"):
        with_schedule_steps(state, 4)
    with pytest.raises(TypeError, match="total_steps must be an int"):
        with_schedule_steps(state, 10.0)  # type: ignore[arg-type]
    for _ in range(3):
        state, _ = train_step(state, make_batch(1), jax.random.key(1))
    assert in_state_schedule(with_schedule_steps(state, 5)).total_steps == 5
    # The schedule reads the optimizer's update count (3 here), not the step, which
    # skipped steps advance too: a total below the count is refused, the step does not matter.
    short = schedule_state(1e-2, 40, 1)
    for _ in range(3):
        short, _ = train_step(short, make_batch(1), jax.random.key(1))
    short = short.replace(step=jnp.asarray(8, jnp.int32))
    with pytest.raises(ValueError, match=r"below the state's update count \(3"):
        with_schedule_steps(short, 2)
    assert in_state_schedule(with_schedule_steps(short, 3)).total_steps == 3
    assert in_state_schedule(tiny_state()) is None


def numpy_schedule(count: int, peak: float, total: int, warmup: int) -> float:
    """The warmup + cosine learning rate after `count` updates (to 0 at `total`), in float64."""
    if count < warmup:
        return peak * count / warmup
    return (
        peak
        * 0.5
        * (1.0 + math.cos(math.pi * min(count - warmup, total - warmup) / (total - warmup)))
    )


PEAK, PLANNED, WARMUP = 1e-2, 40, 4


def recording_state(rates: list[float]) -> TrainState:
    """A tiny state whose optimizer reports the learning rate of every update into `rates`.

    With targets far above every prediction, the gradient of the head's bias
    is the same at every step, so Adam's direction for it is -1 and its
    update is the learning rate itself (AdamW without decay or clipping).
    """

    def record(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        jax.debug.callback(
            lambda bias: rates.append(float(np.mean(bias))), updates["params"]["head"]["bias"]
        )
        return updates, state

    tx = optax.chain(
        make_optimizer(warmup_cosine_schedule(PEAK, PLANNED, WARMUP), clip_norm=None),
        optax.GradientTransformation(lambda params: optax.EmptyState(), record),
    )
    return create_train_state(TINY, tx, jax.random.key(0), far_batch(0))


def far_batch(seed: int) -> Batch:
    return make_batch(seed).replace(target=np.full((B, H), 1e3, np.float32))


def test_time_budget_refits_the_schedule_to_the_step_the_budget_stops_at(capsys) -> None:
    # One second per step: measured over steps 2-6, the 20.5 s budget then
    # leaves 14.5 s, so it is spent at the end of step 21, where fit stops.
    from tft_jax.steps import _STEP_JITS

    clock, rates = FakeClock(), []
    batches = [far_batch(90 + i) for i in range(4)]
    state = recording_state(rates)
    compiled = _STEP_JITS[()]._cache_size()
    result = fit(
        state,
        ticking(clock, batches),
        epochs=10,
        max_steps=PLANNED,
        time_budget=20.5,
        clock=clock,
        label="FP32",
        log_seconds=1e9,
    )
    assert result.stop_reason == "time_budget" and int(result.state.step) == 21
    assert result.schedule_steps == 21
    assert in_state_schedule(result.state).total_steps == 21
    assert _STEP_JITS[()]._cache_size() == compiled + 1  # the refit compiled nothing
    lines = capsys.readouterr().err.splitlines()
    note = "FP32: the time budget fits about 21 steps: the learning rate now decays to step 21"
    assert lines.count(note) == 1 and lines.index(note) < len(lines) - 1, lines
    # Updates 0-5 before the refit follow the planned cosine, 6-20 the refitted one.
    want = [numpy_schedule(count, PEAK, PLANNED, WARMUP) for count in range(6)]
    want += [numpy_schedule(count, PEAK, 21, WARMUP) for count in range(6, 21)]
    assert len(rates) == 21
    np.testing.assert_allclose(rates, want, rtol=1e-5, atol=1e-9)
    assert rates[-1] < 1e-2 * PEAK  # the last step trains at the cosine's low end


def test_time_budget_counts_the_evaluations_in_the_refitted_total() -> None:
    # Steps take 1 s, each evaluation (every 4 steps) 2 s: 1.5 s a step. From
    # step 6 at 8 s, the 26 s budget allows 12 steps: it is spent at step 18.
    clock = FakeClock()

    class SlowValidation(list):
        def __iter__(self) -> Any:
            clock.now += 2.0
            return super().__iter__()

    result = fit(
        recording_state([]),
        ticking(clock, [far_batch(90 + i) for i in range(4)]),
        SlowValidation([far_batch(95)]),
        epochs=10,
        max_steps=PLANNED,
        eval_every=4,
        time_budget=26.0,
        clock=clock,
        quiet=True,
    )
    assert int(result.state.step) == 18
    assert result.schedule_steps == 18


def compiling_validation(clock: FakeClock, first_seconds: float) -> list[Batch]:
    """One validation batch whose first evaluation takes `first_seconds` on `clock` (as
    compiling the evaluation does), the later ones nothing."""

    class CompilingValidation(list):
        evaluations = 0

        def __iter__(self) -> Any:
            clock.now += first_seconds if self.evaluations == 0 else 0.0
            self.evaluations += 1
            return super().__iter__()

    return CompilingValidation([far_batch(95)])


def budget_run(
    clock: FakeClock, source: Any, budget: float, validation: Any = None, **options: Any
) -> FitResult:
    """`fit` of the recording state on `source` under `budget` seconds of `clock`, quietly."""
    options.setdefault("quiet", True)
    return fit(
        recording_state([]), source, validation, epochs=20, max_steps=PLANNED,
        time_budget=budget, clock=clock, **options,
    )  # fmt: skip


def test_the_first_evaluations_compilation_is_not_counted_as_every_evaluations_cost() -> None:
    # Steps take 1 s; the first evaluation (at step 2) 10 s, as compiling it
    # does, the later ones nothing. Refitted at step 6 (16 s), after the
    # evaluations of steps 2 and 4: the 30 s budget leaves 14 steps of 1 s, so
    # the cosine ends at step 20, where the budget is spent. Counting the 10 s
    # in every evaluation's cost (3.5 s a step) ended it at step 10.
    clock = FakeClock()
    batches = ticking(clock, [far_batch(90 + i) for i in range(4)])
    result = budget_run(clock, batches, 30.0, compiling_validation(clock, 10.0), eval_every=2)
    assert result.stop_reason == "time_budget"
    assert int(result.state.step) == 20 and result.schedule_steps == 20


def compiling_then_ticking(clock: FakeClock, batches: list[Batch], compile_seconds: float) -> Any:
    """`ticking` at 0.125 s a step, the first step also taking `compile_seconds`."""

    def source(epoch: int) -> Any:
        for index, batch in enumerate(batches):
            clock.now += 0.125 + (compile_seconds if epoch == 0 and index == 0 else 0.0)
            yield batch

    return source


def test_a_short_budget_mostly_spent_compiling_still_ends_the_cosine_where_it_stops() -> None:
    # 3.5 s of compilation, then 0.125 s a step: 5 steps measured (0.625 s,
    # more than 5% of the 5 s budget) leave 0.75 s at step 6, 6 more steps.
    clock = FakeClock()
    batches = compiling_then_ticking(clock, [far_batch(90 + i) for i in range(4)], 3.5)
    result = budget_run(clock, batches, 5.0)
    assert result.stop_reason == "time_budget"
    assert int(result.state.step) == 12 and result.schedule_steps == 12


def changing_pace(clock: FakeClock, batches: list[Batch], until: float, then: float) -> Any:
    """A batch source whose batches take `until[1]` s each while `clock` is below
    `until[0]`, `then` s after (the machine's load changed mid-run)."""
    limit, before = until

    def source(epoch: int) -> Any:
        for batch in batches:
            clock.now += before if clock.now < limit else then
            yield batch

    return source


def assert_decays_without_jumps(rates: list[float], largest_drop: float) -> None:
    """Past the warmup the rates never rise, drop at most `largest_drop` an update, and
    reach the cosine's low end only at the last update (none trains at rate ~0)."""
    decaying = np.asarray(rates[WARMUP:])
    steps = np.diff(decaying)
    assert np.all(steps <= 1e-6 * PEAK), decaying  # never rises (a later end would jump up)
    assert -steps.min() <= largest_drop, decaying  # nor drops (an earlier end would)
    assert decaying[-1] < 3e-2 * PEAK, decaying  # decayed by the stop
    assert np.all(decaying[:-1] > 1e-3 * PEAK), decaying  # and not before it


def test_the_refitted_cosine_follows_steps_that_got_faster_without_a_jump(capsys) -> None:
    # 1 s a step until 12 s, 0.5 s after: the refit at step 6 ends the cosine at
    # step 25, where 1 s steps would spend the 25 s budget; at 0.5 s the run goes
    # on to step 38. Without following the pace, updates 25-37 trained at rate 0.
    clock, rates = FakeClock(), []
    batches = changing_pace(clock, [far_batch(90 + i) for i in range(4)], (12.0, 1.0), 0.5)
    result = fit(
        recording_state(rates), batches, epochs=20, max_steps=PLANNED, time_budget=25.0,
        clock=clock, label="FP32", log_seconds=1e9,
    )  # fmt: skip
    assert result.stop_reason == "time_budget" and int(result.state.step) == 38
    assert 36 <= result.schedule_steps <= 38  # within the pace's noise threshold of the stop
    assert len(rates) == 38
    # A cosine over the shortest decay here (21 updates) drops at most PEAK * pi / 42.
    assert_decays_without_jumps(rates, largest_drop=PEAK * math.pi / 42)
    err = capsys.readouterr().err
    assert "FP32: the step time changed: the time budget now fits about" in err, err


def test_the_cosine_follows_steps_that_got_slower_and_decays_by_the_stop() -> None:
    # 0.25 s a step until 3 s, 1 s after: at step 9 the whole 40-step cosine fits
    # the 20 s budget; from step 12 on it does not, and the stop is at step 29.
    # Without following the pace the run stopped at a quarter of the peak rate.
    clock, rates = FakeClock(), []
    batches = changing_pace(clock, [far_batch(90 + i) for i in range(4)], (3.0, 0.25), 1.0)
    result = fit(
        recording_state(rates), batches, epochs=20, max_steps=PLANNED, time_budget=20.0,
        clock=clock, quiet=True,
    )  # fmt: skip
    assert result.stop_reason == "time_budget" and int(result.state.step) == 29
    assert abs(result.schedule_steps - 29) <= 1  # the pace's noise threshold
    # The shrunk cosine decays faster: from the rate at the follow over what is left.
    assert_decays_without_jumps(rates, largest_drop=0.2 * PEAK)


def test_the_refit_waits_for_an_evaluation_after_the_first_which_compiles() -> None:
    # 0.125 s a step, the first evaluation (step 4) 1 s, the later ones nothing.
    # At step 6 only the first is measured: the refit waits for the one of
    # step 8, then at step 9 (2.125 s) the 5 s budget leaves 23 steps: step 32.
    clock = FakeClock()
    batches = compiling_then_ticking(clock, [far_batch(90 + i) for i in range(4)], 0.0)
    result = budget_run(clock, batches, 5.0, compiling_validation(clock, 1.0), eval_every=4)
    assert result.stop_reason == "time_budget"
    assert int(result.state.step) == 32 and result.schedule_steps == 32


def test_observers_updated_over_the_whole_run_leave_no_compile_for_the_refit_to_wait_for() -> None:
    # calibrate_steps >= max_steps: the step with frozen observers never compiles, so the
    # refit measures from the first step, as without calibration (stopping at step 21).
    clock = FakeClock()
    tx = make_optimizer(warmup_cosine_schedule(PEAK, PLANNED, WARMUP), clip_norm=None)
    state = create_train_state(OBSERVED, tx, jax.random.key(0), far_batch(0))
    result = fit(
        state,
        ticking(clock, [far_batch(90 + i) for i in range(4)]),
        epochs=20,
        max_steps=PLANNED,
        time_budget=20.5,
        clock=clock,
        calibrate_steps=PLANNED,
        quiet=True,
    )
    assert result.stop_reason == "time_budget" and int(result.state.step) == 21
    assert result.schedule_steps == 21


def test_a_budget_spent_before_the_step_time_is_measured_says_the_cosine_did_not_end(
    capsys,
) -> None:
    clock = FakeClock()
    batches = compiling_then_ticking(clock, [far_batch(90 + i) for i in range(4)], 3.5)
    result = budget_run(clock, batches, 3.8, quiet=False, label="FP32", log_seconds=1e9)
    assert result.stop_reason == "time_budget" and int(result.state.step) == 3
    assert result.schedule_steps == PLANNED
    err = capsys.readouterr().err
    assert (
        "FP32: stopped on the time budget of 3.8s at step 3/40 after 3.9s; the learning rate "
        f"did not decay to its end: stopped after 3 of the schedule's {PLANNED} updates (warmup "
        f"{WARMUP}), still in the warmup: the budget ran out before the step time was measured; "
        "give a larger time budget, or fewer steps"
    ) in err, err


def test_no_refit_when_the_planned_steps_fit_in_the_budget(capsys) -> None:
    clock, rates = FakeClock(), []
    result = fit(
        recording_state(rates),
        ticking(clock, [far_batch(90 + i) for i in range(4)]),
        epochs=10,
        max_steps=12,  # ends at 12 s, well within the budget
        time_budget=100.0,
        clock=clock,
        label="FP32",
    )
    assert result.stop_reason == "completed" and result.schedule_steps == PLANNED
    assert "time budget fits" not in capsys.readouterr().err
    want = [numpy_schedule(count, PEAK, PLANNED, WARMUP) for count in range(12)]
    np.testing.assert_allclose(rates, want, rtol=1e-5, atol=1e-9)


def test_a_budget_that_never_binds_leaves_the_planned_cosine_under_a_lower_max_steps(
    capsys,
) -> None:
    # max_steps=30 below the 40-step schedule, 1 s a step, a 100 s budget: the budget
    # never stops the run. The pace's re-estimates cut the cosine to step 30 (the cap),
    # saying "the step time changed", where a run without a budget keeps 40.
    clock, rates = FakeClock(), []
    result = fit(
        recording_state(rates), ticking(clock, [far_batch(90 + i) for i in range(4)]),
        epochs=20, max_steps=30, time_budget=100.0, clock=clock, label="FP32",
        log_seconds=1e9,
    )  # fmt: skip
    assert result.stop_reason == "completed" and result.schedule_steps == PLANNED
    assert "step time changed" not in capsys.readouterr().err
    want = [numpy_schedule(count, PEAK, PLANNED, WARMUP) for count in range(30)]
    np.testing.assert_allclose(rates, want, rtol=1e-5, atol=1e-9)


def test_a_learning_rate_compiled_into_the_step_is_neither_refitted_nor_reported() -> None:
    clock = FakeClock()
    result = fit(
        tiny_state(),
        ticking(clock, [make_batch(90 + i) for i in range(4)]),
        epochs=10,
        time_budget=8.5,
        clock=clock,
        quiet=True,
    )
    assert result.stop_reason == "time_budget" and int(result.state.step) == 9
    assert result.schedule_steps is None


def test_a_resumed_run_keeps_the_refitted_schedule(tmp_path, capsys) -> None:
    class Killed(Exception):
        pass

    clock, rates = FakeClock(), []
    batches = [far_batch(90 + i) for i in range(4)]

    def killed_at_step_13(epoch: int) -> Any:
        if epoch == 3:
            raise Killed
        yield from ticking(clock, batches)(epoch)

    common = dict(
        epochs=10,
        max_steps=PLANNED,
        time_budget=20.5,
        checkpoint_dir=tmp_path,
        checkpoint_every=4,
        clock=clock,
        quiet=True,
    )
    with pytest.raises(Killed):
        fit(recording_state(rates), killed_at_step_13, **common)
    assert len(rates) == 12

    # A fresh template planned for 40 steps: the checkpoint's refitted 21 wins.
    # (The batches of epoch 2 that resume skips take no time.)
    def resumed(epoch: int) -> Any:
        yield from batches if epoch < 3 else ticking(clock, batches)(epoch)

    rates.clear()
    capsys.readouterr()
    result = fit(recording_state(rates), resumed, resume=True, **{**common, "quiet": False})
    # Said on resume (it was not): the budget's schedule stands, its end following the pace.
    assert (
        "the learning rate follows the schedule the time budget refitted to end at step 21; "
        "its end follows the measured step time" in capsys.readouterr().err
    )
    assert result.stop_reason == "time_budget" and int(result.state.step) == 21
    assert result.schedule_steps == 21
    want = [numpy_schedule(count, PEAK, 21, WARMUP) for count in range(12, 21)]
    np.testing.assert_allclose(rates, want, rtol=1e-5, atol=1e-9)


def test_a_resumed_run_without_a_refit_takes_the_callers_schedule(tmp_path) -> None:
    batches = [far_batch(90 + i) for i in range(4)]
    common = dict(epochs=10, checkpoint_dir=tmp_path, quiet=True)
    first = fit(schedule_state(PEAK, 8, WARMUP), batches, max_steps=8, **common)
    assert first.schedule_steps == 8
    # The learning rate jumps from the 8-step cosine's end (0) to the 12-step one's at step 8:
    # said, as it was not before. The closed form of the new rate at step 8:
    new_rate = 0.5 * PEAK * (1 + math.cos(math.pi * (8 - WARMUP) / (12 - WARMUP)))
    message = (
        rf"resuming at step 8 on another learning-rate schedule: the checkpoint's ends at step "
        rf"8 \(warmup {WARMUP}\), this run's at step 12 \(warmup {WARMUP}\); the rate goes on "
        rf"from {new_rate:.3g} \(the checkpoint's schedule gives 0 there\)"
    )
    with pytest.warns(UserWarning, match=message):
        longer = fit(schedule_state(PEAK, 12, WARMUP), batches, max_steps=12, resume=True, **common)
    assert int(longer.state.step) == 12 and longer.schedule_steps == 12
    # The same schedule again: nothing to say.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(schedule_state(PEAK, 12, WARMUP), batches, max_steps=12, resume=True, **common)


# ---------------------------------------------------------------------------
# Input-validation gaps: create_train_state levels and clip_norm, params that are
# not the model's, NaN NumPy targets in eval_step, mixed batches in predict


@pytest.mark.parametrize("levels", [(0.9, 0.5, 0.1), (0.2, 0.5, 0.8), (0.1, 0.9), (0.5,)])
def test_create_train_state_refuses_levels_other_than_the_models(levels: Any) -> None:
    # Before: accepted, and the loss trained each output column as another level.
    shown = re.escape(str(tuple(float(q) for q in levels)))
    with pytest.raises(
        ValueError,
        match=rf"create_train_state: quantiles {shown} differ from model\.config\.quantiles "
        r"\(0\.1, 0\.5, 0\.9\); the loss would train each output column as another level",
    ):
        create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0), quantiles=levels)


def test_create_train_state_takes_the_models_own_levels_given_again() -> None:
    given = np.asarray(QUANTILES, np.float32)  # float32 spellings of the same levels
    state = create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0), quantiles=given)
    assert state.quantiles == tuple(float(q) for q in given)


@pytest.mark.parametrize("clip_norm", [-1.0, 0.0, float("nan"), float("inf")])
def test_create_train_state_refuses_a_clip_norm_that_is_not_positive(clip_norm: float) -> None:
    # Before: accepted, and every step reported clipped_grad_norm == clip_norm.
    with pytest.raises(ValueError, match=r"create_train_state: clip_norm must be finite and > 0"):
        create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0), clip_norm=clip_norm)
    with pytest.raises(TypeError, match=r"create_train_state: clip_norm must be a float"):
        create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0), clip_norm="1")
    state = create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0), clip_norm=None)
    assert state.clip_norm is None


@pytest.fixture(scope="module")
def kept_state() -> TrainState:
    """A TINY train state that no test donates (eval_step and predict only)."""
    return create_train_state(TINY, TINY_TX, jax.random.key(0), make_batch(0))


def _other_params(state: TrainState) -> dict[str, Any]:
    params = dict(state.params)
    hidden = dict(params["hidden"])
    hidden["kernel"] = jnp.zeros((hidden["kernel"].shape[0], 16), jnp.float32)
    params["hidden"] = hidden
    return params


@pytest.mark.parametrize("call", ["train_step", "eval_step", "predict"])
def test_steps_refuse_params_of_another_shape(kept_state: TrainState, call: str) -> None:
    # Before: Flax's ScopeParamShapeError from deep inside the jitted step.
    state = kept_state.replace(params=_other_params(kept_state))
    width = kept_state.params["hidden"]["kernel"].shape[0]
    run = {
        "train_step": lambda: train_step(state, make_batch(1), jax.random.key(1)),
        "eval_step": lambda: eval_step(state, make_batch(1)),
        "predict": lambda: predict(state, make_batch(1)),
    }[call]
    with pytest.raises(
        ValueError,
        match=rf"{call}: state\.params do not match the model: params/hidden/kernel has shape "
        rf"\({width}, 16\), the model needs \({width}, 8\)",
    ):
        run()


def test_create_train_state_names_the_first_variable_that_does_not_fit(
    kept_state: TrainState,
) -> None:
    # The message listed both whole trees of (shape, dtype) pairs.
    width = kept_state.params["hidden"]["kernel"].shape[0]
    with pytest.raises(
        ValueError,
        match=rf"create_train_state: variables\['params'\] does not match the model: "
        rf"hidden/kernel has shape \({width}, 16\), the model needs \({width}, 8\)$",
    ):
        create_train_state(
            TINY, TINY_TX, jax.random.key(0), make_batch(0),
            variables={"params": _other_params(kept_state)},
        )  # fmt: skip
    wide = jax.tree.map(lambda leaf: np.asarray(leaf, np.float64), kept_state.params)
    with pytest.raises(ValueError, match=r"has dtype float64, the model needs float32$"):
        create_train_state(
            TINY, TINY_TX, jax.random.key(0), make_batch(0), variables={"params": wide}
        )


def test_steps_refuse_params_missing_a_leaf_naming_it(kept_state: TrainState) -> None:
    # Before: Flax's ScopeParamNotFoundError from inside the traced step.
    params = dict(kept_state.params)
    del params["head"]
    with pytest.raises(
        ValueError, match=r"eval_step: state\.params do not match the model: params/head/bias is"
    ):
        eval_step(kept_state.replace(params=params), make_batch(1))
    with pytest.raises(
        ValueError, match=r"evaluate: batch 0: state\.params do not match the model: params/head"
    ):
        evaluate(kept_state.replace(params=params), [make_batch(1)])


def test_steps_refuse_the_params_of_a_wider_tft() -> None:
    config = TFTConfig(
        num_static_features=S,
        num_known_features=K,
        num_observed_features=U,
        hidden_dim=8,
        num_heads=2,
        sequence_length=T,
        prediction_horizon=H,
        dropout_rate=0.0,
    )
    wider = dataclasses.replace(config, hidden_dim=16)
    tx = make_optimizer(1e-2)
    narrow_state = create_train_state(
        TemporalFusionTransformer(config), tx, jax.random.key(0), make_batch(0)
    )
    wide_params = jax.eval_shape(
        lambda: (
            create_train_state(
                TemporalFusionTransformer(wider), tx, jax.random.key(0), make_batch(0)
            ).params
        )
    )
    wide_params = jax.jit(
        lambda: jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), wide_params)
    )()
    with pytest.raises(
        ValueError,
        match=r"predict: state\.params do not match the model: params/\S+ has shape \(.*16.*\), "
        r"the model needs \(.*8.*\)",
    ):
        predict(narrow_state.replace(params=wide_params), make_batch(1))


def test_the_params_of_another_container_run_as_the_models(kept_state: TrainState) -> None:
    frozen = kept_state.replace(params=nn.FrozenDict(kept_state.params))
    np.testing.assert_allclose(
        float(eval_step(frozen, make_batch(1))), float(eval_step(kept_state, make_batch(1)))
    )


def test_eval_step_refuses_a_nan_numpy_target_as_evaluate_does(kept_state: TrainState) -> None:
    # Before: eval_step returned NaN where evaluate raised.
    batch = make_batch(1)
    target = batch.target.copy()
    target[1, 0] = np.nan
    message = r"holds 1 NaN or inf targets \(the first at window 1, horizon step 0\)"
    with pytest.raises(ValueError, match=rf"eval_step: batch {message}"):
        eval_step(kept_state, batch.replace(target=target))
    with pytest.raises(ValueError, match=rf"evaluate: batch 0 {message}"):
        evaluate(kept_state, [batch.replace(target=target)])
    # Masked out, the NaN is no observed target.
    mask = np.ones_like(target)
    mask[1, 0] = 0.0
    assert np.isfinite(float(eval_step(kept_state, batch.replace(target=target, target_mask=mask))))


def test_predict_checks_the_numpy_inputs_of_a_batch_that_mixes_numpy_and_jax(
    kept_state: TrainState,
) -> None:
    # Before: any JAX field turned the check off, and the output was NaN.
    batch = make_batch(1)
    historical = batch.historical.copy()
    historical[0, 1, 0] = np.nan
    mixed = batch.replace(historical=historical, future=jnp.asarray(batch.future))
    with pytest.raises(ValueError, match=r"predict: batch\.historical holds 1 NaN or inf values"):
        predict(kept_state, mixed)
    assert predict(kept_state, batch.replace(future=jnp.asarray(batch.future))).quantiles.shape
