"""Quantile (pinball) loss and the paper's normalized quantile risk."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = Any


def _as_float(function: str, name: str, value: Any) -> Array:
    """`value` as an array, integers and booleans as float32.

    Raises `TypeError` naming the argument for anything else: a complex array
    would lose its imaginary part silently, strings would fail deep in JAX.
    """
    try:
        array = jnp.asarray(value)
    except TypeError as error:
        kind = getattr(value, "dtype", type(value).__name__)
        raise TypeError(f"{function}: {name} must be a real-valued array, got {kind}") from error
    dtype = array.dtype
    if not (
        jnp.issubdtype(dtype, jnp.floating)
        or jnp.issubdtype(dtype, jnp.integer)
        or jnp.issubdtype(dtype, jnp.bool_)
    ):
        raise TypeError(f"{function}: {name} must be a real-valued array, got dtype {dtype}")
    if not jnp.issubdtype(dtype, jnp.floating):
        array = array.astype(jnp.float32)
    return array


def _concrete_levels(function: str, name: str, value: Any) -> np.ndarray:
    """Quantile levels as a float32 NumPy array; `TypeError` naming `name` if they are not numbers.

    The levels are validated on the host, so they must be concrete (a traced
    value under `jax.jit` is refused with a hint rather than failing deep in
    JAX); pass them as a static argument or close over them.
    """
    if isinstance(value, jax.core.Tracer) or any(
        isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value)
    ):
        raise TypeError(
            f"{function}: {name} must be concrete numbers (a Python float or sequence, a NumPy "
            f"array), got a traced value {value!r}; under jax.jit pass it as a static argument"
        )
    if value is None or isinstance(value, str | bytes):
        raise TypeError(f"{function}: {name} must be numbers in (0, 1), got {value!r}")
    try:
        return np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{function}: {name} must be numbers in (0, 1), got {value!r}") from error


def pinball(pred: Array, target: Array, quantile: Array) -> Array:
    """Elementwise quantile loss `max(q (y - ŷ), (q - 1)(y - ŷ))`."""
    error = target - pred
    return jnp.maximum(quantile * error, (quantile - 1.0) * error)


def quantile_loss(pred: Array, target: Array, quantiles: Sequence[float]) -> Array:
    """Mean pinball loss over every element and quantile level.

    Args:
      pred: `(..., Q)` predicted quantiles.
      target: `(...)` observed values.
      quantiles: the `Q` levels, each in (0, 1); concrete numbers (static
        under `jax.jit`), as they are validated on the host.

    Returns:
      A float32 scalar: the mean of `max(q·(y−ŷ_q), (q−1)·(y−ŷ_q))`.

    Raises:
      ValueError: on mismatched shapes, levels outside (0, 1), or no values
        at all (the mean would be a silent NaN).
      TypeError: `pred` or `target` not real numbers, or `quantiles` traced.
    """
    pred = _as_float("quantile_loss", "pred", pred)
    target = _as_float("quantile_loss", "target", target)
    levels = _concrete_levels("quantile_loss", "quantiles", quantiles).reshape(-1)
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
    if target.size == 0:
        # The mean over no element is 0 / 0: a NaN loss, silently.
        raise ValueError(
            f"quantile_loss: pred and target hold no values (pred shape {tuple(pred.shape)}), "
            "so the mean loss is undefined"
        )
    losses = pinball(
        pred.astype(jnp.float32), target[..., None].astype(jnp.float32), jnp.asarray(levels)
    )
    return jnp.mean(losses)


class ZeroTargetError(ValueError):
    """`q_risk` of targets whose absolute values sum to zero: the normalized risk is undefined."""


def q_risk(pred: Array, target: Array, q: float) -> Array:
    """The paper's normalized quantile loss `2 Σ QL_q(y, ŷ) / Σ |y|` (Lim et al. 2021).

    Args:
      pred: predictions of the `q` quantile, any shape.
      target: observed values, the same shape as `pred`.
      q: the quantile level in (0, 1).

    Returns:
      A float32 scalar. Raises `ZeroTargetError` (a `ValueError`) when `Σ|y|` is
      zero for concrete inputs (the risk is undefined there).
    """
    pred = _as_float("q_risk", "pred", pred)
    target = _as_float("q_risk", "target", target)
    if pred.shape != target.shape:
        raise ValueError(
            f"q_risk: pred and target must have the same shape, got {tuple(pred.shape)} "
            f"and {tuple(target.shape)}"
        )
    level = _concrete_levels("q_risk", "q", q)
    if level.ndim != 0:
        raise ValueError(
            f"q_risk: q must be one quantile level (a scalar), got shape {level.shape}"
        )
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"q_risk: q must lie in (0, 1), got {q}")
    if target.size == 0:  # else reported as targets summing to zero
        raise ValueError(
            f"q_risk: pred and target hold no values (shape {tuple(target.shape)}), so the "
            "risk is undefined"
        )
    # The validated float32 level, not `q`: a NumPy float64 `q` would make the
    # risk float64 under `jax_enable_x64`, against the documented float32.
    numerator = 2.0 * jnp.sum(
        pinball(pred.astype(jnp.float32), target.astype(jnp.float32), jnp.asarray(level))
    )
    denominator = jnp.sum(jnp.abs(target.astype(jnp.float32)))
    if not isinstance(denominator, jax.core.Tracer) and float(denominator) == 0.0:
        raise ZeroTargetError("q_risk: sum(|target|) is zero, so the normalized risk is undefined")
    return numerator / denominator
