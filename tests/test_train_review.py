"""Second review of the training loop, the flat optimizer and the schedules.

References written here in float64 NumPy, independent of `tft_jax`: a linear
quantile model whose loss gradient has a closed form, global-norm clipping,
AdamW with bias correction (Kingma & Ba 2015; Loshchilov & Hutter 2019),
the warmup + cosine schedule, and `optax.apply_if_finite` semantics for a
skipped step (neither the update count nor the schedule advances).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import struct

from tft_jax.flat_optimizer import flat_adamw, flatten
from tft_jax.schedules import WarmupCosine
from tft_jax.train import (
    Batch,
    create_train_state,
    evaluate,
    fit,
    make_optimizer,
    train_step,
    warmup_cosine_schedule,
)

QUANTILES = (0.1, 0.5, 0.9)
B, T, H, K = 3, 2, 2, 2
B1, B2, EPS = 0.9, 0.999, 1e-8


class LinearConfig(NamedTuple):
    quantiles: tuple[float, ...] = QUANTILES


@struct.dataclass
class LinearOutput:
    quantiles: jax.Array


class LinearQuantiles(nn.Module):
    """`pred[b, h, q] = exp(log_scale) · Σ_k future[b, h, k] · w[k, q] + bias[q]`.

    `w` and `bias` are `'params'`; `log_scale` is a `'quant_params'` scalar
    (trained, like a QAT step size, and never decayed by default).
    """

    config: LinearConfig = LinearConfig()

    @nn.compact
    def __call__(
        self,
        static: Any,
        historical: Any,
        future: Any,
        known_history: Any = None,
        static_categorical: Any = None,
        deterministic: bool = True,
    ) -> LinearOutput:
        levels = len(self.config.quantiles)
        w = self.param("w", nn.initializers.normal(1.0), (future.shape[-1], levels))
        bias = self.param("bias", nn.initializers.normal(1.0), (levels,))
        log_scale = self.variable("quant_params", "log_scale", lambda: jnp.full((), 0.3))
        return LinearOutput(jnp.exp(log_scale.value) * (future @ w) + bias)


def linear_batch(
    seed: int, *, nan_target: bool = False, rows: int = B, shift: float = 0.0
) -> Batch:
    rng = np.random.default_rng(seed)
    target = (shift + 3.0 * rng.standard_normal((rows, H))).astype(np.float32)
    if nan_target:
        target[0, 0] = np.nan
    return Batch(
        static=np.zeros((rows, 1), np.float32),
        historical=np.zeros((rows, T, 1), np.float32),
        future=(2.0 * rng.standard_normal((rows, H, K))).astype(np.float32),
        known_history=None,
        static_categorical=None,
        target=target,
    )


def numpy_loss_and_grads(params: dict[str, np.ndarray], batch: Batch) -> tuple[float, dict]:
    """Mean pinball loss of the linear model and its gradient, in float64."""
    w, bias, log_scale = params["w"], params["bias"], float(params["log_scale"])
    future = np.asarray(batch.future, np.float64)
    target = np.asarray(batch.target, np.float64)
    levels = np.asarray(QUANTILES)
    linear = future @ w
    pred = math.exp(log_scale) * linear + bias
    error = target[..., None] - pred
    loss = float(np.mean(np.maximum(levels * error, (levels - 1.0) * error)))
    # d loss / d pred: -q where the target lies above, (1 - q) below (no ties here).
    assert np.all(error != 0)
    d_pred = np.where(error > 0, -levels, 1.0 - levels) / error.size
    grads = {
        "w": math.exp(log_scale) * np.einsum("bhk,bhq->kq", future, d_pred),
        "bias": d_pred.sum(axis=(0, 1)),
        "log_scale": np.asarray(math.exp(log_scale) * np.sum(d_pred * linear)),
    }
    return loss, grads


def numpy_warmup_cosine(count: int, schedule: WarmupCosine) -> float:
    peak, total, warmup, end = (float(x) for x in jax.tree.leaves(schedule))
    if count < warmup:
        return peak * count / warmup
    progress = min(count - warmup, total - warmup) / (total - warmup)
    return end + (peak - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


class NumpyClipAdamW:
    """Clip by global norm, then AdamW, in float64; a skipped step changes nothing."""

    def __init__(self, params: dict, lr: Any, clip: float | None, decay: float, decayed: set):
        self.params = {k: np.asarray(v, np.float64) for k, v in params.items()}
        self.mu = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.nu = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.lr, self.clip, self.decay, self.decayed = lr, clip, decay, decayed
        self.count = 0

    def step(self, grads: dict) -> None:
        norm = math.sqrt(sum(float(np.sum(g**2)) for g in grads.values()))
        if not math.isfinite(norm):
            return  # skipped: params, moments and count kept (optax.apply_if_finite)
        scale = 1.0 if self.clip is None or norm < self.clip else self.clip / norm
        lr = self.lr(self.count) if callable(self.lr) else self.lr
        self.count += 1
        for name, g in grads.items():
            g = g * scale
            self.mu[name] = B1 * self.mu[name] + (1 - B1) * g
            self.nu[name] = B2 * self.nu[name] + (1 - B2) * g**2
            m_hat = self.mu[name] / (1 - B1**self.count)
            v_hat = self.nu[name] / (1 - B2**self.count)
            direction = m_hat / (np.sqrt(v_hat) + EPS)
            if name in self.decayed:
                direction = direction + self.decay * self.params[name]
            self.params[name] = self.params[name] - lr * direction


def _host(state: Any) -> dict[str, np.ndarray]:
    return {
        "w": np.asarray(state.params["w"], np.float64),
        "bias": np.asarray(state.params["bias"], np.float64),
        "log_scale": np.asarray(state.extra_params["quant_params"]["log_scale"], np.float64),
    }


MODEL = LinearQuantiles()


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


def test_flat_adamw_without_a_mask_decays_every_leaf_as_optax_adamw_does() -> None:
    """optax's `adamw(mask=None)` decays all leaves; so must `flat_adamw(mask=None)`."""
    rng = np.random.default_rng(5)
    params = {"a": rng.standard_normal((2, 3)), "b": rng.standard_normal(4)}
    grads = [{k: 2.0 * rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(3)]
    as32 = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)  # noqa: E731
    tx = flat_adamw(0.03, clip_norm=1.0, weight_decay=0.3)
    reference = NumpyClipAdamW(params, 0.03, 1.0, 0.3, {"a", "b"})
    current, opt_state = as32(params), tx.init(as32(params))
    for gradient in grads:
        updates, opt_state = tx.update(as32(gradient), opt_state, current)
        current = optax.apply_updates(current, updates)
        reference.step(gradient)
    for name in params:
        np.testing.assert_allclose(np.asarray(current[name]), reference.params[name], rtol=2e-5)
    assert flatten(current).shape == (10,)


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
