"""Quantile (pinball) loss and the paper's normalized quantile risk."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = Any


def _as_float(name: str, value: Any) -> Array:
    array = jnp.asarray(value)
    if not jnp.issubdtype(array.dtype, jnp.floating):
        array = array.astype(jnp.float32)
    return array


def pinball(pred: Array, target: Array, quantile: Array) -> Array:
    """Elementwise quantile loss `max(q (y - ŷ), (q - 1)(y - ŷ))`."""
    error = target - pred
    return jnp.maximum(quantile * error, (quantile - 1.0) * error)


def quantile_loss(pred: Array, target: Array, quantiles: Sequence[float]) -> Array:
    """Mean pinball loss over every element and quantile level.

    Args:
      pred: `(..., Q)` predicted quantiles.
      target: `(...)` observed values.
      quantiles: the `Q` levels, each in (0, 1).

    Returns:
      A float32 scalar: the mean of `max(q·(y−ŷ_q), (q−1)·(y−ŷ_q))`.
    """
    pred = _as_float("pred", pred)
    target = _as_float("target", target)
    levels = np.asarray(quantiles, dtype=np.float32).reshape(-1)
    if levels.size == 0:
        raise ValueError("quantile_loss: quantiles must hold at least one level, got none")
    if pred.ndim < 1 or pred.shape[-1] != levels.size:
        raise ValueError(
            f"quantile_loss: pred must have shape (..., {levels.size}) for {levels.size} "
            f"quantiles, got {tuple(pred.shape)}"
        )
    if pred.shape[:-1] != target.shape:
        raise ValueError(
            f"quantile_loss: target must have shape {tuple(pred.shape[:-1])} (pred without its "
            f"quantile axis), got {tuple(target.shape)}"
        )
    # Written so that a NaN level fails too (every comparison with NaN is False).
    if not np.all((levels > 0.0) & (levels < 1.0)):
        raise ValueError(f"quantile_loss: quantiles must lie in (0, 1), got {levels.tolist()}")
    losses = pinball(
        pred.astype(jnp.float32), target[..., None].astype(jnp.float32), jnp.asarray(levels)
    )
    return jnp.mean(losses)


def q_risk(pred: Array, target: Array, q: float) -> Array:
    """The paper's normalized quantile loss `2 Σ QL_q(y, ŷ) / Σ |y|` (Lim et al. 2021).

    Args:
      pred: predictions of the `q` quantile, any shape.
      target: observed values, the same shape as `pred`.
      q: the quantile level in (0, 1).

    Returns:
      A float32 scalar. Raises `ValueError` when `Σ|y|` is zero for concrete
      inputs (the risk is undefined there).
    """
    pred = _as_float("pred", pred)
    target = _as_float("target", target)
    if pred.shape != target.shape:
        raise ValueError(
            f"q_risk: pred and target must have the same shape, got {tuple(pred.shape)} "
            f"and {tuple(target.shape)}"
        )
    if np.ndim(q) != 0:
        raise ValueError(
            f"q_risk: q must be one quantile level (a scalar), got shape {np.shape(q)}"
        )
    if not 0.0 < float(q) < 1.0:
        raise ValueError(f"q_risk: q must lie in (0, 1), got {q}")
    numerator = 2.0 * jnp.sum(pinball(pred.astype(jnp.float32), target.astype(jnp.float32), q))
    denominator = jnp.sum(jnp.abs(target.astype(jnp.float32)))
    if not isinstance(denominator, jax.core.Tracer) and float(denominator) == 0.0:
        raise ValueError("q_risk: sum(|target|) is zero, so the normalized risk is undefined")
    return numerator / denominator
