"""A linear quantile model with a closed-form loss gradient, and a float64 clip + AdamW.

The references of the training tests (`test_train_step.py`, `test_train_fit.py`,
`test_flat_optimizer.py`), written in float64 NumPy, independent of `tft_jax`:
the model's mean pinball loss and its gradient, and global-norm clipping then
AdamW with bias correction (Kingma & Ba 2015; Loshchilov & Hutter 2019), where
a skipped step changes nothing (`optax.apply_if_finite`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import struct

from tft_jax.train import Batch

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

LR, DECAY = 0.05, 0.2


def all_masked(seed: int) -> Batch:
    """A batch of `linear_batch(seed)` with no observed target (every mask zero)."""
    batch = linear_batch(seed)
    return batch.replace(target_mask=np.zeros(np.shape(batch.target), np.float32))


def run_experiments_on_the_linear_model(monkeypatch: Any) -> None:
    """`experiments`' steps without `calibrate`: the linear stand-in has no observers."""
    from tft_jax import experiments
    from tft_jax.train import evaluate, train_step

    monkeypatch.setattr(
        experiments,
        "train_step",
        lambda state, batch, key, calibrate: train_step(state, batch, key),
    )
    monkeypatch.setattr(
        experiments, "evaluate", lambda state, batches, calibrate: evaluate(state, batches)
    )
