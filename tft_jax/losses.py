"""Quantile (pinball) loss and the paper's normalized quantile risk."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = Any


def _as_float(function: str, name: str, value: Any, allow_bool: bool = True) -> Array:
    """`value` as an array, integers and booleans as float32.

    Booleans only with `allow_bool` (a target of flags is 0/1 data; a boolean
    prediction is no forecast: `TypeError`).

    Integers are converted on the host: `jnp.asarray` of an int64 NumPy
    array wraps values beyond int32 (bytes, cents) around silently.
    Raises `TypeError` naming the argument for anything else: a complex array
    would lose its imaginary part silently, strings would fail deep in JAX.
    """
    on_host = not isinstance(value, jax.Array | jax.core.Tracer)
    try:
        array = np.asarray(value) if on_host else value
    except (TypeError, ValueError) as error:
        kind = getattr(value, "dtype", type(value).__name__)
        raise TypeError(f"{function}: {name} must be a real-valued array, got {kind}") from error
    if not allow_bool and array.dtype == np.bool_:
        raise TypeError(
            f"{function}: {name} must hold real numbers (a float or int dtype), got dtype bool"
        )
    if on_host and array.dtype.kind in "iub":
        array = array.astype(np.float32)
    dtype = array.dtype
    if not (
        jnp.issubdtype(dtype, jnp.floating)
        or jnp.issubdtype(dtype, jnp.integer)
        or jnp.issubdtype(dtype, jnp.bool_)
    ):
        raise TypeError(f"{function}: {name} must be a real-valued array, got dtype {dtype}")
    with np.errstate(over="ignore"):  # beyond float32's range: `_check_finite` names it
        array = jnp.asarray(array)
    if not jnp.issubdtype(array.dtype, jnp.floating):
        array = array.astype(jnp.float32)
    return array


def _concrete_levels(function: str, name: str, value: Any) -> np.ndarray:
    """Quantile levels as a float64 NumPy array; `TypeError` naming `name` if they are not numbers.

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
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{function}: {name} must be numbers in (0, 1), got {value!r}") from error


def _check_finite(function: str, name: str, value: Array, raw: Any = None) -> None:
    """Raises `ValueError` when a concrete `value` holds NaN or ±inf (the loss would be, silently).

    `raw` is the argument as passed: a finite float64 NumPy value beyond
    float32's range became ±inf only when cast to float32, so it is reported
    as out of float32's range rather than as non-finite input. A traced value
    (under `jax.jit`, `jax.grad`) is not checked: that would need a host
    round trip in every compiled step. Neither is an array of several
    processes.
    """
    if isinstance(value, jax.core.Tracer):
        return
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return  # other processes' rows cannot be read here
    if bool(jnp.all(jnp.isfinite(value))):  # one scalar to the host, not the array
        return
    finite = np.isfinite(np.asarray(value))  # read only to name the first bad element
    where = tuple(int(i) for i in np.argwhere(~finite)[0])
    if raw is not None and not isinstance(raw, jax.Array):
        given = np.asarray(raw, dtype=np.float64).reshape(finite.shape)
        too_large = ~finite & np.isfinite(given)
        if too_large.any():
            first = tuple(int(i) for i in np.argwhere(too_large)[0])
            limit = float(jnp.finfo(value.dtype).max)
            raise ValueError(
                f"{function}: {name} holds {int(too_large.sum())} finite value(s) beyond "
                f"{value.dtype}'s range (|x| > {limit:.7g}), the first {float(given[first])!r} at "
                f"index {first}; rescale them, or enable jax_enable_x64 for float64"
            )
    raise ValueError(
        f"{function}: {name} holds {int((~finite).sum())} non-finite value(s) (NaN or ±inf), "
        f"the first at index {where}; the result would be non-finite"
    )


def _result_dtype(pred: Array, target: Array) -> Any:
    """float32, or float64 when an input is float64 under `jax_enable_x64`."""
    return jnp.promote_types(jnp.result_type(pred, target), jnp.float32)


def _host_error(
    raw_pred: Any, raw_target: Any, target_shape: tuple[int, ...], dtype: Any
) -> np.ndarray | None:
    """float64 NumPy `target - pred` when the loss is computed on the host, else None.

    The host path is taken when an input is a NumPy array (or Python numbers),
    neither is traced and the result is float32: NumPy targets near 1e8
    rounded to float32 (a spacing of 8) before subtracting lose an error of a
    few units entirely, and float32 sums of values near 1e37 overflow to inf.
    `target` gets a trailing axis to match `pred` when it has one less.
    """
    raw = (raw_pred, raw_target)
    traced = any(isinstance(value, jax.core.Tracer) for value in raw)
    on_host = any(not isinstance(value, jax.Array) for value in raw)
    if dtype == jnp.float64 or not on_host or traced:
        return None
    target = np.asarray(raw_target, np.float64).reshape(target_shape)
    pred = np.asarray(raw_pred, np.float64)
    if target.ndim < pred.ndim:
        target = target[..., None]
    return target - pred


def _device_error(pred: Array, target: Array, dtype: Any) -> Array:
    """`target - pred` in `dtype` (`target` with a trailing axis when it has one less)."""
    if target.ndim < pred.ndim:
        target = target[..., None]
    return target.astype(dtype) - pred.astype(dtype)


def _host_result(function: str, value: float, dtype: Any) -> Array:
    """A float64 host result as a `dtype` scalar; `ValueError` when it exceeds `dtype`'s range.

    The sums are exact enough in float64; only a result that float32 cannot
    hold (it would become ±inf) is refused, rather than returned as inf.
    """
    limit = float(jnp.finfo(dtype).max)
    if not abs(value) <= limit:
        raise ValueError(
            f"{function}: the result {value!r} (computed in float64) exceeds {jnp.dtype(dtype)}'s "
            f"range (|x| <= {limit:.7g}); rescale the inputs, or enable jax_enable_x64"
        )
    return jnp.asarray(value, dtype)


def pinball_of_error64(error: np.ndarray, quantile: Any) -> np.ndarray:
    """`max(q e, (q - 1) e)` in float64 NumPy (the host path of the losses, and the metrics)."""
    return np.maximum(quantile * error, (quantile - 1.0) * error)


def _check_device_result(function: str, value: Array) -> Array:
    """`value`, or `ValueError` when a concrete result from finite inputs is not finite.

    The inputs were checked finite, so a non-finite result is a float32 sum
    that overflowed. Traced results are not checked (no host round trip in a
    compiled step).
    """
    if isinstance(value, jax.core.Tracer):
        return value
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return value
    if not bool(jnp.isfinite(value)):
        raise ValueError(
            f"{function}: the {value.dtype} sum overflowed to {float(value)} from finite "
            f"inputs; pass NumPy arrays (summed in float64 on the host), rescale the inputs, "
            "or enable jax_enable_x64"
        )
    return value


def pinball(pred: Array, target: Array, quantile: Array) -> Array:
    """Elementwise quantile loss `max(q (y - ŷ), (q - 1)(y - ŷ))`."""
    return _pinball_of_error(target - pred, quantile)


def _pinball_of_error(error: Array, quantile: Array) -> Array:
    """`max(q e, (q - 1) e)` of the error `e = y - ŷ`."""
    return jnp.maximum(quantile * error, (quantile - 1.0) * error)


def quantile_loss(pred: Array, target: Array, quantiles: Sequence[float]) -> Array:
    """Mean pinball loss over every element and quantile level.

    Args:
      pred: `(..., Q)` predicted quantiles.
      target: `(...)` observed values.
      quantiles: the `Q` levels, each in (0, 1); concrete numbers (static
        under `jax.jit`), as they are validated on the host.

    Returns:
      A float32 scalar (float64 when an input is float64 under
      `jax_enable_x64`): the mean of `max(q·(y−ŷ_q), (q−1)·(y−ŷ_q))`. When
      an input is a NumPy array and neither is traced, `y − ŷ` and the mean
      are computed in float64 on the host and only the result is cast; under
      `jax.jit` / `jax.grad` everything is computed in the result's dtype.

    Raises:
      ValueError: on mismatched shapes, levels outside (0, 1), no values
        at all (the mean would be a silent NaN), a NaN or ±inf in a
        concrete `pred` or `target` (traced values are not checked), a
        finite float64 input beyond float32's range (it would become ±inf),
        or a concrete result beyond the result dtype's range.
      TypeError: `pred` or `target` not real numbers (a boolean `pred` included),
        or `quantiles` traced.
    """
    raw_pred, raw_target = pred, target
    pred = _as_float("quantile_loss", "pred", pred, allow_bool=False)
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
    _check_finite("quantile_loss", "pred", pred, raw_pred)
    _check_finite("quantile_loss", "target", target, raw_target)
    dtype = _result_dtype(pred, target)
    host = _host_error(raw_pred, raw_target, target.shape, dtype)
    if host is not None:
        mean = float(np.mean(pinball_of_error64(host, levels)))
        return _host_result("quantile_loss", mean, dtype)
    error = _device_error(pred, target, dtype)
    loss = jnp.mean(_pinball_of_error(error, jnp.asarray(levels, dtype)))
    return _check_device_result("quantile_loss", loss)


class ZeroTargetError(ValueError):
    """`q_risk` of targets whose absolute values sum to zero: the normalized risk is undefined."""


_ZERO_TARGET = "q_risk: sum(|target|) is zero, so the normalized risk is undefined"


def q_risk(pred: Array, target: Array, q: float | np.floating) -> Array:
    """The paper's normalized quantile loss `2 Σ QL_q(y, ŷ) / Σ |y|` (Lim et al. 2021).

    Args:
      pred: predictions of the `q` quantile, any shape.
      target: observed values, the same shape as `pred`.
      q: the quantile level in (0, 1).

    Returns:
      A float32 scalar (float64 when an input is float64 under
      `jax_enable_x64`). When an input is a NumPy array and neither is
      traced, `y − ŷ` and both sums are computed in float64 on the host and
      only the ratio is cast (float32 sums of values near 1e37 overflow);
      under `jax.jit` / `jax.grad` everything is computed in the result's
      dtype.

    Raises:
      ZeroTargetError: (a `ValueError`) `Σ|y|` is zero for concrete inputs
        (the risk is undefined there).
      ValueError: mismatched shapes, a NaN or ±inf in a concrete `pred` or
        `target`, a finite float64 input beyond float32's range (it would
        become ±inf), or a concrete result beyond the result dtype's range.
      TypeError: `pred` or `target` not real numbers (a boolean `pred`
        included), or `q` traced.
    """
    raw_pred, raw_target = pred, target
    pred = _as_float("q_risk", "pred", pred, allow_bool=False)
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
    _check_finite("q_risk", "pred", pred, raw_pred)
    _check_finite("q_risk", "target", target, raw_target)
    # The result in the inputs' precision, not `q`'s: a NumPy float64 `q` would
    # make the risk of float32 inputs float64 under `jax_enable_x64`.
    dtype = _result_dtype(pred, target)
    host = _host_error(raw_pred, raw_target, target.shape, dtype)
    if host is not None:
        host_numerator = 2.0 * float(np.sum(pinball_of_error64(host, level)))
        host_denominator = float(np.sum(np.abs(np.asarray(raw_target, np.float64))))
        if host_denominator == 0.0:
            raise ZeroTargetError(_ZERO_TARGET)
        return _host_result("q_risk", host_numerator / host_denominator, dtype)
    error = _device_error(pred, target, dtype)
    numerator = 2.0 * jnp.sum(_pinball_of_error(error, jnp.asarray(level, dtype)))
    denominator = jnp.sum(jnp.abs(target.astype(dtype)))
    if not isinstance(denominator, jax.core.Tracer) and float(denominator) == 0.0:
        raise ZeroTargetError(_ZERO_TARGET)
    # Each sum on its own: an overflowed denominator alone gives a ratio of 0, not inf.
    _check_device_result("q_risk", numerator)
    _check_device_result("q_risk", denominator)
    return numerator / denominator
