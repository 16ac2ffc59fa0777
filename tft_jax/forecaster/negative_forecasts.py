"""Forecasts below 0 of a target the table never holds below 0: said, not returned silently.

A count (sales, visitors) forecast by a model with no floor comes back below
0 at its low quantiles, and `DataConfig.nonnegative` is off by default. The
remedies exist (`nonnegative=True` clips the forecasts at 0 in original
units; `target_transform='log1p'` models the count on a log scale), but a
user who does not know to look for them got negative sales without a word.

`count_negative` counts one model's negative forecast values by quantile
level (`NegativeForecasts`, which adds up over `backtest`'s cutoffs), and
`negative_forecast_message` says them, or returns None: with
`nonnegative=True` (nothing is below 0 then), on a table whose target holds a
negative value (a quantity that can be negative; `nonnegative=True` on such a
table has its own warning), or when no forecast is below 0.
`announce_negative_forecasts` warns with it, naming the user's line.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tft_jax.caller_frame import user_stacklevel
from tft_jax.data.tables import plain_value

if TYPE_CHECKING:
    from tft_jax.data import WindowSet
    from tft_jax.forecaster.config import DataConfig

# The remedies as the message says them to a Python user; the CLI says them as its flags
# (`tft_jax.cli.cli_text`): a command that reads a run cannot change either setting.
CLIP_REMEDY = (
    "set DataConfig.nonnegative=True to clip the forecasts at 0 (a fitted Forecaster takes "
    "it without training again)"
)
LOG_REMEDY = "train with target_transform='log1p' (--target-transform log1p)"


@dataclasses.dataclass(frozen=True)
class NegativeForecasts:
    """One model's forecast values below 0, by quantile level.

    Attributes:
      below: per level, how many of its forecast values are below 0.
      values: forecast values per level (windows x horizon steps).
      lowest: the lowest forecast value (NaN for no values).
      lowest_at: where it is ('series 'a' at 2024-01-01'), None where not said.
    """

    below: tuple[int, ...]
    values: int
    lowest: float
    lowest_at: str | None = None

    def __add__(self, other: NegativeForecasts) -> NegativeForecasts:
        """Both counts together (`backtest`'s cutoffs), the lower of the lowest values."""
        if len(self.below) != len(other.below):
            raise ValueError(
                f"cannot add counts of {len(self.below)} and {len(other.below)} quantile levels"
            )
        # NaN (no values) compares False: the other's lowest is kept.
        lower = other if other.lowest < self.lowest or np.isnan(self.lowest) else self
        return NegativeForecasts(
            below=tuple(a + b for a, b in zip(self.below, other.below, strict=True)),
            values=self.values + other.values,
            lowest=lower.lowest,
            lowest_at=lower.lowest_at,
        )

    @property
    def any(self) -> bool:
        """Whether some forecast value is below 0."""
        return any(self.below)


def count_negative(
    forecast: np.ndarray, where: Callable[[int, int], str] | None = None
) -> NegativeForecasts:
    """The values of `forecast` below 0 by quantile level.

    Args:
      forecast: `(N, H, Q)` quantile forecasts in original units, as returned
        (after `Forecaster.postprocess`).
      where: `(window, step) -> text` naming the series and time of a
        forecast; called once, for the lowest value when it is below 0.
    """
    forecast = np.asarray(forecast)
    if forecast.ndim != 3:
        raise ValueError(f"forecast must be (windows, steps, levels), got shape {forecast.shape}")
    below = (forecast < 0).sum(axis=(0, 1))
    values = forecast.shape[0] * forecast.shape[1]
    if forecast.size == 0:
        return NegativeForecasts(tuple(int(n) for n in below), values, float("nan"))
    flat = int(np.nanargmin(forecast)) if not np.isnan(forecast).all() else 0
    index = np.unravel_index(flat, forecast.shape)
    lowest = float(forecast[index])
    at = where(int(index[0]), int(index[1])) if where is not None and lowest < 0 else None
    return NegativeForecasts(tuple(int(n) for n in below), values, lowest, at)


def forecast_place(series_ids: Sequence[Any], windows: WindowSet) -> Callable[[int, int], str]:
    """`(window, step) -> text` naming the series and time of a forecast of `windows`
    (`series_ids`: the id of each series code of their panel)."""

    def place(window: int, step: int) -> str:
        series = plain_value(series_ids[int(windows.series_code[window])])
        return f"series {series!r} at {windows.panel.times[windows.starts[window] + step]}"

    return place


def level_name(level: float) -> str:
    """A quantile level as a percentile: 0.1 -> 'P10', 0.025 -> 'P2.5'."""
    return f"P{round(100 * level, 6):g}"


def negative_forecast_message(
    target: str,
    targets: np.ndarray,
    found: Mapping[str, NegativeForecasts],
    levels: Sequence[float],
    *,
    nonnegative: bool,
    target_transform: str = "none",
    scope: str = "",
) -> str | None:
    """What to say of the forecasts in `found` below 0, or None when there is nothing to say.

    Args:
      target: the target column's name.
      targets: the target values of the table the forecasts were made from
        (NaN for missing ones, which are not looked at).
      found: each model's `count_negative`, by model name.
      levels: the quantile levels, in the forecasts' order.
      nonnegative: `DataConfig.nonnegative`: with it, nothing is said.
      target_transform: `DataConfig.target_transform`; with 'log1p' already,
        only the clip is advised.
      scope: which forecasts, leading the message ('predict', 'evaluate, the
        test split').

    Nothing is said with `nonnegative`, for a table whose target holds a
    value below 0 (a quantity that can be negative), or when no model's
    forecast is below 0.
    """
    if nonnegative:
        return None
    observed = np.asarray(targets, dtype=float)
    if (observed < 0).any():  # NaN compares False: a missing target is not negative
        return None
    negative = {name: counts for name, counts in found.items() if counts.any}
    if not negative:
        return None
    parts = []
    for name, counts in negative.items():
        shown = ", ".join(
            f"{level_name(level)}: {below:,} of {counts.values:,}"
            for level, below in zip(levels, counts.below, strict=True)
            if below
        )
        at = f", {counts.lowest_at}" if counts.lowest_at else ""
        parts.append(f"{name} {shown} (lowest {counts.lowest:.4g}{at})")
    remedies = CLIP_REMEDY if target_transform == "log1p" else f"{CLIP_REMEDY}, or {LOG_REMEDY}"
    lead = f"{scope}: " if scope else ""
    return (
        f"{lead}forecasts of {target!r} below 0, though no target of the table is below 0: "
        f"{'; '.join(parts)}; if {target!r} cannot be negative, {remedies}"
    )


def announce_negative_forecasts(
    data: DataConfig,
    targets: np.ndarray,
    found: Mapping[str, NegativeForecasts],
    levels: Sequence[float],
    scope: str,
) -> None:
    """Warns `negative_forecast_message` under the settings `data` (a `UserWarning` naming
    the user's line), if there is anything to say."""
    message = negative_forecast_message(
        data.target,
        targets,
        found,
        levels,
        nonnegative=data.nonnegative,
        target_transform=data.target_transform,
        scope=scope,
    )
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=user_stacklevel())
