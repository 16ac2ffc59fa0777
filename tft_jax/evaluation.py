"""Evaluation on a split: batches of windows, predictions, metrics in the target's units, CSVs.

Every metric is computed on the original scale: model quantiles are mapped
back with the dataset's per-series inverse transform and compared with the
table's own target values (never a round trip through the scaler).

Metrics per model (`forecast_metrics`):

- `q_risk`: the paper's normalized quantile loss `2 Σ QL_q / Σ |y|` for every
  quantile level (as `tft_jax.losses.q_risk`), summed over all windows and
  horizon steps; `p50_q_risk` and `p90_q_risk` repeat the 0.5 and 0.9 levels.
- `mean_quantile_loss`: the pinball loss averaged over windows, steps and
  levels, in the target's units (as `tft_jax.losses.quantile_loss`).
- `mean_quantile_loss_scaled`: the same on the per-series scaled target, the
  quantity the model is trained on unless window normalization rescales each
  window further (comparable across series): forecasts and
  targets go through the target transform (`log1p`) before the division by
  the series' scale; None for a forecast outside the transform's domain (a
  drifting baseline at or below -1 with `log1p`), where it is undefined; an
  actual there is refused with a `ValueError` (data the transform cannot
  have been fitted on, as the data layer refuses it).

The metrics are computed in float64 NumPy, not with the float32 JAX losses:
a float32 copy of a target at a level of 1e8 is rounded to a multiple of 8,
so errors of a few units (and the q-risk of a good forecast) would be lost.

A point forecast (the seasonal naive baselines) is scored as if it predicted
every quantile level with that one value; a quantile forecast (the models,
the empirical quantile baseline) scores each level with its own column.

Windows prepared with `require_observed_target=False` may hold forecast
steps whose target was missing in the table (forward-filled, `target_mask`
0). Those are scored only when asked: `observed_steps` gives the `(N, H)`
mask of the observed steps, and `actuals`, `forecast_metrics`,
`mean_quantile_loss` and `baseline_metrics` take it as `observed`, scoring
the observed steps alone: q-risk is `2 Σ_observed QL_q / Σ_observed |y|`,
the mean losses are means over the observed steps (and levels). Without
`observed` a missing target is an error, never skipped.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tft_jax.atomic_files import replaced_atomically
from tft_jax.baselines import empirical_quantiles, seasonal_naive, seasonal_naive_with_drift
from tft_jax.data import PreparedDataset, WindowSet, batch_indices
from tft_jax.data.listing import repeated
from tft_jax.data.scaling import TARGET_TRANSFORMS, forward_transform
from tft_jax.losses import ZeroTargetError, pinball_of_error64
from tft_jax.quantile_levels import numeric_levels
from tft_jax.train import Batch

Predictor = Callable[[Batch], Any]


def to_batch(arrays: dict[str, np.ndarray]) -> Batch:
    """The `tft_jax.train.Batch` of a window dict from `WindowSet.take` / `.batches`."""
    return Batch(
        static=arrays["static"],
        historical=arrays["historical"],
        future=arrays["future"],
        known_history=arrays["known_history"],
        static_categorical=arrays["static_categorical"],
        target=arrays["target"],
        target_mask=arrays.get("target_mask"),
        known_categorical_history=arrays.get("known_categorical_history"),
        future_categorical=arrays.get("future_categorical"),
        observed_categorical=arrays.get("observed_categorical"),
    )


def padded_batches(windows: WindowSet, batch_size: int) -> Iterator[tuple[Batch, int]]:
    """Yields `(batch, valid)` over all windows in order, every batch of exactly `batch_size`.

    The last batch is filled up by repeating its final window so that a jitted
    predictor compiles once; only its first `valid` rows are real.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    count = len(windows)
    if count == 0:
        raise ValueError("there are no windows to evaluate")
    for first in range(0, count, batch_size):
        indices = np.arange(first, min(first + batch_size, count))
        valid = indices.size
        indices = np.concatenate([indices, np.full(batch_size - valid, indices[-1])])
        yield to_batch(windows.take(indices)), valid


def evenly_spaced(windows: WindowSet, count: int) -> WindowSet:
    """At most `count` windows of `windows`, evenly spaced over it (all of them if fewer)."""
    if len(windows) <= count:
        return windows
    return subset(windows, np.linspace(0, len(windows) - 1, count).round().astype(np.int64))


def fixed_batches(windows: WindowSet, batch_size: int, rows: slice = slice(None)) -> list[Batch]:
    """Consecutive batches of exactly `batch_size` windows (a short remainder is dropped).

    `rows` keeps only those rows of every batch, e.g. this process's share
    `tft_jax.distributed.process_rows(batch_size, i, P)` in a multi-process run.
    """
    return [
        to_batch(windows.take(indices[rows]))
        for indices in batch_indices(len(windows), batch_size, shuffle=False, drop_last=True)
    ]


def subset(windows: WindowSet, indices: np.ndarray) -> WindowSet:
    """The windows `indices` (M,) of `windows`, in that order, as a `WindowSet`."""
    return dataclasses.replace(windows, starts=windows.starts[np.asarray(indices, dtype=np.int64)])


def fan_window_indices(
    windows: WindowSet, per_series: int, codes: Sequence[int] | np.ndarray
) -> np.ndarray:
    """Indices of up to `per_series` back-to-back windows of each series code in `codes`, in order.

    For each series, its first window, then each next window starting at
    least `horizon` rows after the previous one: forecasts that tile a stretch
    of time without overlapping, as a fan chart shows them. A code without
    windows gives none.
    """
    chosen: list[int] = []
    for code in codes:
        (positions,) = np.nonzero(windows.series_code == code)
        next_start = -1
        taken = 0
        for position in positions:
            if taken == per_series:
                break
            if windows.starts[position] >= next_start:
                chosen.append(int(position))
                next_start = windows.starts[position] + windows.horizon
                taken += 1
    return np.asarray(chosen, dtype=np.int64)


def epoch_batches(
    windows: WindowSet, batch_size: int, seed: int, rows: slice = slice(None)
) -> Callable[[int], Iterator[Batch]]:
    """`epoch -> batches`: full-size shuffled batches, the order a function of `(seed, epoch)`.

    `rows` keeps only those rows of every (global) batch of `batch_size`: in a
    multi-process run each process passes its own
    `tft_jax.distributed.process_rows(batch_size, i, P)`; the shuffled order
    is the same in every process and each gathers only its own windows.
    """

    def batches(epoch: int) -> Iterator[Batch]:
        generator = np.random.default_rng([seed, epoch])
        for indices in batch_indices(len(windows), batch_size, seed=generator, drop_last=True):
            yield to_batch(windows.take(indices[rows]))

    return batches


@dataclasses.dataclass(frozen=True)
class Predictions:
    """A model's outputs over N windows: the forecasts and the averaged interpretability weights.

    Attributes:
      quantiles: `(N, H, Q)` forecasts on the model's (scaled) output scale.
      attention: `(H, T+H)` attention of each horizon query over the window,
        averaged over windows and heads.
      static_weights: `(S+C,)` static selection weights averaged over windows.
      history_weights: `(U+Uc[+K+Kc],)` history selection weights averaged over
        windows and steps (labels: `PreparedDataset.history_weight_names`).
      future_weights: `(K+Kc,)` future selection weights averaged over windows
        and steps (labels: `PreparedDataset.future_weight_names`).
    """

    quantiles: np.ndarray
    attention: np.ndarray
    static_weights: np.ndarray
    history_weights: np.ndarray
    future_weights: np.ndarray


def predict_windows(predict: Predictor, windows: WindowSet, batch_size: int = 256) -> Predictions:
    """Runs `predict` (a `Batch` to a `TFTOutput`) over every window and gathers `Predictions`.

    Weights are averaged on the fly, so the `(N, heads, H, T+H)` attention of
    all windows is never held at once.
    """
    quantiles = []
    sums: dict[str, np.ndarray] = {}
    reductions = {
        "attention": (0, 1),
        "static_weights": (0,),
        "history_weights": (0, 1),
        "future_weights": (0, 1),
    }
    for batch, valid in padded_batches(windows, batch_size):
        output = predict(batch)
        quantiles.append(np.asarray(output.quantiles, dtype=np.float64)[:valid])
        for name, axes in reductions.items():
            value = np.asarray(getattr(output, name), dtype=np.float64)[:valid]
            total = value.sum(axis=axes)
            if name != "static_weights":
                total = total / np.prod([value.shape[a] for a in axes[1:]])
            sums[name] = sums.get(name, 0.0) + total
    count = len(windows)
    return Predictions(
        quantiles=np.concatenate(quantiles, axis=0),
        **{name: total / count for name, total in sums.items()},
    )


def horizon_rows(windows: WindowSet) -> np.ndarray:
    """`(N, H)` panel rows of every window's forecast steps."""
    return windows.starts[:, None] + np.arange(windows.horizon)


def observed_steps(windows: WindowSet) -> np.ndarray:
    """`(N, H)` bool: True at the windows' forecast steps whose target was observed, False
    where it was missing in the table and filled (`target_mask` 0)."""
    return np.asarray(windows.panel.target_mask[horizon_rows(windows)] != 0)


def actuals(
    dataset: PreparedDataset, windows: WindowSet, observed: np.ndarray | None = None
) -> np.ndarray:
    """`(N, H)` observed targets of the windows' forecast steps in the target's units.

    Args:
      dataset: the prepared table the windows belong to.
      windows: the windows.
      observed: optional `(N, H)` bool mask of the steps to score (`observed_steps`):
        the steps it marks False come back NaN, for `forecast_metrics` given the
        same mask to leave out. Without it every step must have an observed
        target.

    Raises:
      ValueError: without `observed`, a forecast step with no observed target
        (windows prepared with `require_observed_target=False`); with it, a
        step it marks True that has none, or a mask of another shape.
      TypeError: an `observed` that is not boolean.
    """
    values = dataset.frame[dataset.spec.target].to_numpy(dtype=np.float64)[horizon_rows(windows)]
    missing = np.isnan(values)
    if observed is None:
        if missing.any():
            raise ValueError(
                f"{int(missing.sum())} forecast steps have no observed target; evaluate on "
                "windows prepared with require_observed_target=True, or pass "
                "observed=observed_steps(windows) to score the observed steps only"
            )
        return values
    mask = _observed_mask(observed, values.shape)
    if (missing & mask).any():
        window, step = (int(i) for i in np.argwhere(missing & mask)[0])
        raise ValueError(
            f"observed marks {int((missing & mask).sum())} forecast steps without an observed "
            f"target as observed (the first at window {window}, step {step}); build it with "
            "observed_steps(windows)"
        )
    return np.where(mask, values, np.nan)


def _observed_mask(observed: Any, shape: tuple[int, ...]) -> np.ndarray:
    """`observed` checked to be a bool array of `shape` (that of `actual`)."""
    mask = np.asarray(observed)
    if mask.dtype != np.bool_:
        raise TypeError(
            f"observed must be a bool array (True where the target was observed), got {mask.dtype}"
        )
    if mask.shape != shape:
        raise ValueError(f"observed must have the shape of actual {shape}, got {mask.shape}")
    return mask


def filled_history(dataset: PreparedDataset, windows: WindowSet) -> np.ndarray:
    """`(N, T)` history targets in the target's units, gaps filled as the model sees them.

    Observed steps are the table's own values; only the filled gaps come back
    from the model's float32 scaled target, whose round trip through the
    scaler is off by a float32 rounding (up to 4 at a level of 1e8 with
    `scaler='none'`): a seasonal naive forecast of an exactly periodic series
    would not score zero.
    """
    panel = windows.panel
    rows = windows.starts[:, None] + np.arange(-windows.history, 0)
    codes = panel.series_code[windows.starts]
    filled = dataset.inverse_transform(panel.target[rows].astype(np.float64), codes)
    observed = dataset.frame[dataset.spec.target].to_numpy(dtype=np.float64)[rows]
    return np.where(np.isnan(observed), filled, observed)


def seasonal_naive_forecast(
    dataset: PreparedDataset, windows: WindowSet, period: int
) -> np.ndarray:
    """`(N, H)` seasonal naive forecasts of the windows in the target's units (`baselines`)."""
    return seasonal_naive(filled_history(dataset, windows), windows.horizon, period)


def baseline_metrics(
    dataset: PreparedDataset,
    windows: WindowSet,
    quantiles: Sequence[float],
    periods: Sequence[int],
    nonnegative: bool = False,
    observed: np.ndarray | None = None,
) -> dict[str, dict[str, Any]]:
    """Metrics of seasonal naive, seasonal naive with drift and empirical quantiles at `periods`.

    Keys `seasonal_naive_<m>`, `drift_<m>` (where the history holds two
    whole seasons of `m`) and `empirical_<m>` (`baselines.empirical_quantiles`:
    the inverted-CDF quantiles of the last `m` history values at every step,
    for `m` >= 2 only: the quantiles of one value are that value, the
    forecast of `seasonal_naive_1`, which an `empirical_1` would duplicate
    and, named first in sorted order, take `best_of`'s ties from). The point
    forecasts score every level with their one value, the empirical
    quantiles each level with its own column. Every period must fit in the
    history (`seasonal_naive` raises otherwise).
    `nonnegative`: forecasts clipped at 0 first, as the models' are (a drift
    extrapolates a falling series below 0). `observed`: the `(N, H)` mask of
    the steps to score (see `actuals`), as the models are scored; the
    baselines read the filled history as the model does (`filled_history`).
    """
    history = filled_history(dataset, windows)
    score = window_scorer(dataset, windows, quantiles, observed)
    results = {}
    for period in sorted(set(periods)):
        forecasts = {f"seasonal_naive_{period}": seasonal_naive(history, windows.horizon, period)}
        if history.shape[1] // period >= 2:
            forecasts[f"drift_{period}"] = seasonal_naive_with_drift(
                history, windows.horizon, period
            )
        if period >= 2:
            forecasts[f"empirical_{period}"] = empirical_quantiles(
                history, windows.horizon, period, quantiles
            )
        for name, forecast in forecasts.items():
            if nonnegative:
                forecast = np.maximum(forecast, 0.0)
            results[name] = score(forecast)
    return results


def window_scorer(
    dataset: PreparedDataset,
    windows: WindowSet,
    quantiles: Sequence[float],
    observed: np.ndarray | None = None,
) -> Callable[[np.ndarray], dict[str, Any]]:
    """`forecast -> forecast_metrics(...)` against the actuals of `windows`.

    The actuals (`observed`: the `(N, H)` mask of the steps scored, see
    `actuals`), the windows' scales and the target transform are read once,
    so that every model and baseline of `windows` is scored alike.
    """
    actual = actuals(dataset, windows, observed)
    scale = window_scales(dataset, windows)
    transform = dataset.target_scaler.target_transform

    def score(forecast: np.ndarray) -> dict[str, Any]:
        return forecast_metrics(forecast, actual, quantiles, scale, transform, observed=observed)

    return score


def best_of(models: dict[str, dict[str, Any]]) -> str:
    """The name with the lowest P50 q-risk, among those where it is a number (not None or NaN).

    A None (levels without 0.5) failed inside `min` with a TypeError, and a
    NaN won or lost by its place in the dict (every comparison with it is
    False). Equal P50 q-risks (two seasonal periods of a strictly periodic
    series) go to the lower P90 q-risk, then to the name first in sorted
    order, so the choice does not depend on the order the models were listed.

    Raises:
      ValueError: no model has a P50 q-risk.
    """
    scored = {
        name: _number(metrics, "p50_q_risk")
        for name, metrics in models.items()
        if _number(metrics, "p50_q_risk") < np.inf
    }
    if not scored:
        raise ValueError(
            f"best_of: none of {list(models)} has a P50 q-risk (quantile levels without 0.5, "
            "or NaN forecasts)"
        )
    return min(scored, key=lambda name: (scored[name], _number(models[name], "p90_q_risk"), name))


def _number(metrics: dict[str, Any], key: str) -> float:
    """`metrics[key]` as a float; infinity when missing, None or NaN (never the best)."""
    value = metrics.get(key)
    return float("inf") if value is None or np.isnan(value) else float(value)


def monotone(quantiles: np.ndarray) -> np.ndarray:
    """Quantile forecasts `(..., Q)` sorted along the levels, as the library returns them
    (the rearrangement: see `tft_jax.forecaster.forecaster`'s module docstring)."""
    return np.sort(np.asarray(quantiles, dtype=np.float64), axis=-1)


def to_original_units(
    dataset: PreparedDataset, windows: WindowSet, quantiles: np.ndarray
) -> np.ndarray:
    """Scaled forecasts `(N, H, Q)` of `windows` in the target's units.

    Raises:
      ValueError: a forecast beyond float64 in the target's units (e.g. above
        ~709.8 in log1p units), naming its series, time and level index
        (`TargetScaler.inverse_transform`).
    """
    times = windows.panel.times

    def where(index: tuple[int, ...]) -> str:
        window, step = index[0], index[1]
        series = dataset.series_ids[int(windows.series_code[window])]
        level = f", quantile index {index[2]}" if len(index) > 2 else ""
        return f"the forecast of series {series!r} at {times[windows.starts[window] + step]}{level}"

    return dataset.target_scaler.inverse_transform(
        windows.denormalize(quantiles), windows.series_code, where
    )


def quantile_key(level: float) -> str:
    """The JSON key of a quantile level: '0.1', '0.5', ..."""
    return f"{float(level):g}"


def _pinball64(forecast: np.ndarray, actual: np.ndarray, levels: Sequence[float]) -> np.ndarray:
    """`(..., Q)` float64 pinball losses of `forecast` `(..., Q)` against `actual` `(...)`."""
    return pinball_of_error64(actual[..., None] - forecast, np.asarray(levels, np.float64))


def _scored_arrays(
    forecast: Any, actual: Any, quantiles: Any, observed: Any = None
) -> tuple[np.ndarray, np.ndarray, tuple[float, ...], np.ndarray | None]:
    """`(forecast (N, H, Q), actual (N, H), levels, mask)` in float64, checked as the metrics need.

    A point forecast `(N, H)` is used for every level. Raises `ValueError`
    for mismatched shapes, no level or one outside (0, 1), levels sharing a
    q-risk key, no value, or a value that is not finite (naming the first);
    `TypeError` for `quantiles` that are not numbers. With `observed` (a bool
    mask of `actual`'s shape, checked, returned as `mask`; None without it)
    only the actuals it marks must be finite, at least one of them; every
    forecast must be.
    """
    levels = _levels(quantiles)
    forecast = np.asarray(forecast, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    if forecast.shape == actual.shape:
        forecast = np.repeat(forecast[..., None], len(levels), axis=-1)
    if forecast.shape != (*actual.shape, len(levels)):
        raise ValueError(
            f"forecast must have shape {actual.shape} or {(*actual.shape, len(levels))} for "
            f"actual {actual.shape} and {len(levels)} quantiles, got {forecast.shape}"
        )
    if not levels or not all(0.0 < q < 1.0 for q in levels):
        # Written so that a NaN level fails too (every comparison with NaN is False).
        raise ValueError(f"quantiles must be at least one level in (0, 1), got {list(levels)}")
    keys = [quantile_key(q) for q in levels]
    if len(set(keys)) != len(keys):
        # The q-risk of one of them was dropped from the dict without a word.
        raise ValueError(
            f"quantiles {list(levels)} share the q-risk keys {keys}; use distinct levels"
        )
    if actual.size == 0:
        raise ValueError(f"actual holds no values (shape {actual.shape}): nothing to score")
    mask = None if observed is None else _observed_mask(observed, actual.shape)
    if mask is not None and not mask.any():
        raise ValueError(
            f"observed marks none of the {actual.size} steps of actual as observed: nothing "
            "to score"
        )
    for name, values in (("actual", actual), ("forecast", forecast)):
        # A NaN or inf made every metric NaN or inf (null in metrics.json) without a word.
        bad = ~np.isfinite(values)
        if name == "actual" and mask is not None:
            bad &= mask  # the steps left out may hold anything
        if bad.any():
            raise ValueError(
                f"{name} holds {int(bad.sum())} values that are not finite (the first "
                f"{values[bad][0]} at index {tuple(int(i) for i in np.argwhere(bad)[0])}); "
                "metrics need finite values: pass observed (`observed_steps`) to leave out "
                "steps without an observed target, and check the model of a NaN forecast"
            )
    return forecast, actual, levels, mask


def _observed_only(
    forecast: np.ndarray, actual: np.ndarray, scale: Any, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`(forecast (M, Q), actual (M,), scale (M,) or None)`: the `M` steps `mask` marks.

    `scale` (one per row of `actual`, checked as `_window_divisor` checks it)
    is repeated for each step of its row, so that the scores of the steps
    taken are those of the whole arrays restricted to them.
    """
    if scale is not None:
        scale = np.broadcast_to(_window_divisor(scale, actual.shape), actual.shape)[mask]
    return forecast[mask], actual[mask], scale


def mean_quantile_loss(
    forecast: np.ndarray,
    actual: np.ndarray,
    quantiles: Sequence[float],
    observed: np.ndarray | None = None,
) -> float:
    """The float64 mean pinball loss of `forecast` against `actual`, as `forecast_metrics` gives.

    Defined where q-risk is not (targets all zero), so `Forecaster.backtest`
    still reports it at such a cutoff. `forecast`: `(N, H, Q)` quantile
    forecasts, or `(N, H)` a point forecast used for every level.
    `observed`: optional `(N, H)` bool mask; the mean runs over the steps it
    marks True only (the others' actuals are never read).

    Raises:
      ValueError: mismatched shapes, no level or one outside (0, 1), no
        value (no step marked observed), or a value that is not finite.
      TypeError: `quantiles` not numbers, or `observed` not bool.
    """
    forecast, actual, levels, mask = _scored_arrays(forecast, actual, quantiles, observed)
    if mask is not None:
        forecast, actual, _ = _observed_only(forecast, actual, None, mask)
    return float(np.mean(_pinball64(forecast, actual, levels)))


def forecast_metrics(
    forecast: np.ndarray,
    actual: np.ndarray,
    quantiles: Sequence[float],
    scale: np.ndarray | None = None,
    target_transform: str = "none",
    observed: np.ndarray | None = None,
) -> dict[str, Any]:
    """q-risk per level, P50/P90 q-risk and mean quantile losses (see the module docstring).

    Args:
      forecast: `(N, H, Q)` quantile forecasts, or `(N, H)` a point forecast
        used for every level; in the target's units.
      actual: `(N, H)` observed values in the same units.
      quantiles: the `Q` levels.
      scale: optional `(N,)` positive per-window target scale (one per row
        of `actual`); adds `mean_quantile_loss_scaled` (the loss of
        `forecast / scale`).
      target_transform: the target transform the scale belongs to (one of
        `tft_jax.data.scaling.TARGET_TRANSFORMS`): the scaled loss is that of
        `transform(forecast) / scale` against `transform(actual) / scale`.
      observed: optional `(N, H)` bool mask of `actual`'s shape
        (`observed_steps`): every metric is computed over the steps it marks
        True only, `2 Σ_observed QL_q / Σ_observed |actual|` and means over
        those steps, and the actuals of the other steps (missing targets,
        NaN from `actuals`) are never read. None scores every step.

    Returns:
      A JSON-ready dict of floats (float64 sums, see the module docstring).

    Raises:
      ValueError: mismatched shapes, no level or one outside (0, 1), no value
        (with `observed`, no step marked True, or a mask of another shape),
        a NaN or infinite value in `forecast` or (at a scored step) `actual`,
        a `scale` not `(N,)` positive and finite, an unknown
        `target_transform`, or with a `scale` and `target_transform='log1p'`
        an `actual` at or below -1 (outside log1p's domain; a forecast there
        gives a None scaled loss); `tft_jax.losses.ZeroTargetError` (a
        `ValueError`) when `Σ|actual|` over the scored steps is zero (q-risk
        is undefined).
      TypeError: `quantiles` not numbers, or `observed` not bool.
    """
    forecast, actual, levels, mask = _scored_arrays(forecast, actual, quantiles, observed)
    # (N, H), the steps left out at 0 (in every transform's domain): errors name (window, step).
    scored_actual = actual if mask is None else np.where(mask, actual, 0.0)
    if mask is not None:  # the steps scored, as flat (M, Q) and (M,) arrays
        forecast, actual, scale = _observed_only(forecast, actual, scale, mask)
    losses = _pinball64(forecast, actual, levels)  # (N, H, Q) or (M, Q), float64
    total = float(np.sum(np.abs(actual)))
    if total == 0.0:
        raise ZeroTargetError("q_risk: sum(|target|) is zero, so the normalized risk is undefined")
    sums = losses.reshape(-1, len(levels)).sum(axis=0)
    risks = {quantile_key(q): float(2.0 * sums[i] / total) for i, q in enumerate(levels)}
    metrics: dict[str, Any] = {
        "p50_q_risk": risks.get("0.5"),
        "p90_q_risk": risks.get("0.9"),
        "mean_quantile_loss": float(np.mean(losses)),
        "q_risk": risks,
    }
    if target_transform not in TARGET_TRANSFORMS:
        raise ValueError(
            f"target_transform must be one of {TARGET_TRANSFORMS}, got {target_transform!r}"
        )
    if scale is not None:
        divisor = _window_divisor(scale, actual.shape)
        _check_actual_domain(scored_actual, target_transform)
        if target_transform == "log1p" and not np.all(forecast > -1.0):
            # log1p of a forecast at or below -1 is -inf or NaN: undefined, said as None.
            metrics["mean_quantile_loss_scaled"] = None
        else:
            metrics["mean_quantile_loss_scaled"] = float(
                np.mean(
                    _pinball64(
                        forward_transform(forecast, target_transform) / divisor[..., None],
                        forward_transform(actual, target_transform) / divisor,
                        levels,
                    )
                )
            )
    return metrics


def _levels(quantiles: Any) -> tuple[float, ...]:
    """`quantiles` as a tuple of floats (`numeric_levels`)."""
    return tuple(float(q) for q in numeric_levels(quantiles))


def _check_actual_domain(actual: np.ndarray, target_transform: str) -> None:
    """Raises `ValueError` naming `actual`'s first value outside the target transform's domain.

    `log1p` of an actual at or below -1 is -inf or NaN, which made the scaled
    loss NaN without a word. Unlike a forecast there (a drifting baseline,
    whose scaled loss is reported as None), such an actual is data the
    transform can never have been fitted on: the data layer refuses it too
    (`tft_jax.data.scaling.check_domain`).
    """
    if target_transform != "log1p":
        return
    bad = actual <= -1.0
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"actual holds {int(bad.sum())} values <= -1 (the first {actual[index]} at index "
            f"{index}), outside the domain of target_transform='log1p' (values > -1), so the "
            "scaled loss is undefined; fix those values or use target_transform='none'"
        )


def _window_divisor(scale: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`scale` `(N,)` shaped to divide values of `shape` `(N, ...)` row by row.

    Checked, not broadcast as it comes: a 1-D `actual` `(N,)` against a
    `(N, 1)` divisor made an `(N, N)` table and a wrong scaled loss without a
    word, a scale of another length failed deep in NumPy, and a zero scale
    gave NaN.
    """
    scale = np.asarray(scale, dtype=np.float64)
    if len(shape) == 0 or scale.shape != shape[:1]:
        raise ValueError(
            f"scale must have shape (N,), one per row of actual {shape}, got {scale.shape}"
        )
    if not np.all(np.isfinite(scale) & (scale > 0.0)):
        bad = int(np.flatnonzero(~(np.isfinite(scale) & (scale > 0.0)))[0])
        raise ValueError(f"scale must be positive and finite, got {scale[bad]} at row {bad}")
    return scale.reshape(-1, *(1,) * (len(shape) - 1))


def window_scales(dataset: PreparedDataset, windows: WindowSet) -> np.ndarray:
    """`(N,)` the target scale of each window's series."""
    return dataset.target_scaler.scale[windows.series_code]


def quantile_column(level: float) -> str:
    """The CSV column of a quantile level: 0.1 -> 'p10', 0.025 -> 'p2.5'."""
    return f"p{100.0 * float(level):g}"


def forecast_frame_columns(quantiles: Sequence[float]) -> tuple[str, ...]:
    """The columns `forecast_frame` adds besides the id and time columns, in order."""
    return ("forecast_start", "horizon", *map(quantile_column, quantiles), "actual")


def check_forecast_frame_columns(id_col: str, time_col: str, quantiles: Sequence[float]) -> None:
    """Raises unless `forecast_frame`'s columns for `quantiles` are distinct from each other
    and from the id and time columns.

    The frame is built by name: an id or time column called `horizon`,
    `actual`, `p50`, ... was replaced by that column without a word (ids
    becoming 1..H), and two levels of one `quantile_column` name (0.5 and
    0.5000001 are both 'p50') kept only the last.
    """
    added = forecast_frame_columns(quantiles)
    for role, column in (("id", id_col), ("time", time_col)):
        if column in added:
            raise ValueError(
                f"the {role} column {column!r} has the name of a column the forecast table "
                f"adds ({', '.join(added)}); rename that column of the table"
            )
    names = [quantile_column(q) for q in quantiles]
    twins = sorted(repeated(names))
    if twins:
        levels = [float(q) for q in quantiles if quantile_column(q) in twins]
        raise ValueError(
            f"quantile levels {levels} share the forecast column name(s) {twins}; use levels "
            "that differ in their first 6 significant digits of percent"
        )


def forecast_frame(
    dataset: PreparedDataset,
    windows: WindowSet,
    forecast: np.ndarray,
    quantiles: Sequence[float],
) -> pd.DataFrame:
    """Long-format forecasts, one row per (window, horizon step), in the target's units.

    Columns: the id column, `forecast_start` (the first forecast step of the
    window), the time column (the step forecast), `horizon` (1..H), one
    column per quantile (`quantile_column`) and `actual` (NaN where the
    target is missing: a step of a window kept with `require_observed_target=False`,
    not scored; an empty cell in the CSV `write_forecasts` writes).

    Raises:
      ValueError: `forecast` not `(N, H, Q)`, or a column name taken twice
        (`check_forecast_frame_columns`).
    """
    forecast = np.asarray(forecast, dtype=np.float64)
    count, horizon = len(windows), windows.horizon
    if forecast.shape != (count, horizon, len(quantiles)):
        raise ValueError(
            f"forecast must have shape {(count, horizon, len(quantiles))}, got {forecast.shape}"
        )
    spec = dataset.spec
    check_forecast_frame_columns(spec.id_col, spec.time_col, quantiles)
    rows = horizon_rows(windows).reshape(-1)
    frame = dataset.frame
    table = pd.DataFrame(
        {
            spec.id_col: frame[spec.id_col].to_numpy()[rows],
            "forecast_start": windows.forecast_start.repeat(horizon),
            spec.time_col: windows.panel.times[rows],
            "horizon": np.tile(np.arange(1, horizon + 1), count),
        }
    )
    for index, level in enumerate(quantiles):
        table[quantile_column(level)] = forecast[..., index].reshape(-1)
    table["actual"] = frame[spec.target].to_numpy(dtype=np.float64)[rows]
    return table


def write_forecasts(table: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Writes a `forecast_frame` table as CSV (ISO 8601 timestamps, no index), atomically.

    Times are written to the second; a time column holding a fraction of a
    second (a `freq` of `100ms`, say) is written in full, every row to the
    same precision (`2024-01-01T00:00:20.100000`): cut to the second,
    distinct steps would read back as one time. Aware times carry their UTC
    offset in ISO 8601's extended form (`+02:00`), as their `isoformat` does.
    """
    table = table.copy(deep=False)
    for column in table.columns:
        values = table[column]
        if pd.api.types.is_datetime64_any_dtype(values):
            timespec = _fraction_timespec(values)
            if timespec is None and getattr(values.dt, "tz", None) is not None:
                timespec = "seconds"  # strftime's %z writes +0200, Python 3.11 has no %:z
            if timespec is not None:
                table[column] = values.map(
                    lambda stamp, spec=timespec: (
                        "" if pd.isna(stamp) else stamp.isoformat(timespec=spec)
                    )
                )
    with replaced_atomically(path) as temporary:
        table.to_csv(temporary, index=False, date_format="%Y-%m-%dT%H:%M:%S%z")


def _fraction_timespec(times: pd.Series) -> str | None:
    """The `isoformat` precision that keeps every time of `times`; None on whole seconds.

    Read from the sub-second fields (the same in every zone): flooring aware
    times works in local clock time and raised on an hour that a clock change
    repeats.
    """
    present = times.dropna()
    nanoseconds = bool((present.dt.nanosecond != 0).any())
    if nanoseconds:
        return "nanoseconds"
    return "microseconds" if bool((present.dt.microsecond != 0).any()) else None


def _relative(new: float | None, reference: float | None) -> float | None:
    if new is None or reference is None or reference == 0:
        return None
    return (new - reference) / reference


def comparisons(models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Relative P50/P90 q-risk changes: fp32 vs seasonal naive and vs the best baseline
    (when `models` has `best_baseline`), int8 and qat vs fp32.

    `(new - reference) / reference`; None where either score is missing or the
    reference scores exactly 0 (a change relative to a perfect forecast has no value).
    """
    pairs = (
        ("fp32", "seasonal_naive"), ("fp32", "best_baseline"), ("qat", "fp32"), ("int8", "fp32")
    )  # fmt: skip
    result = {}
    for new, reference in pairs:
        if new in models and reference in models:
            for level in ("p50", "p90"):
                key = f"{level}_q_risk"
                result[f"{new}_vs_{reference}_{key}_relative"] = _relative(
                    models[new][key], models[reference][key]
                )
    return result
