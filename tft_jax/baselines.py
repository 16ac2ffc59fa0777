"""Baseline forecasts: seasonal naive (with and without drift) and empirical quantiles.

Seasonal naive forecasts: the last seasonal period of the history, repeated.

For a season of `m` steps the forecast of horizon step `h` (0-based) is the
observation `m · (h // m + 1) - h` steps before it, i.e. the value at the
same phase of the last full season before the forecast start:
`ŷ[h] = y[T - m + (h mod m)]` with `y` the `T` history values. It is the
usual "what happened this time last day / week" baseline (Hyndman &
Athanasopoulos, Forecasting: Principles and Practice, section 5.2).

The season comes from the sampling frequency (`seasonal_period`):

==================================  ================================
step                                 period
==================================  ================================
shorter than a day ('h', '15min')    steps per day (24 for hourly)
business hour ('bh', 'cbh')          steps per business day (8 on the
                                     default 09:00-17:00 hours)
business day ('B')                   5 (a working week)
day ('D')                            7 (a week)
week ('W')                           52 (a year)
month ('MS', 'ME')                   12 (a year)
quarter ('QS', 'QE')                 4 (a year)
year and longer                      1 (the last value)
==================================  ================================

A multiple of a unit counts in that unit: the period is the fewest steps
that make whole seasons ('2MS': 6, '2QS': 2, '2D': 7 steps, i.e. two whole
weeks, '2B': 5). Steps of a week or longer that are not calendar months make
a year of about 365.25 days ('2W': 26, '14D': 26, '10D': 37); half months
('SMS') make a year of 24.

Business hours ('bh', 'cbh') count only the opening hours (the offset's
`start`/`end`, 09:00-17:00 by default) on its working days (Monday to
Friday, or a `CustomBusinessHour`'s `weekmask`): the day is 8 steps and the
week 40 by default, and a multiple takes the fewest steps that make whole
business days ('2bh': 4, '3bh': 8, three days). A step of a business day or
more ('8bh') takes the business week as its season. Holidays are not
counted: around one the grid shifts by a day.

Empirical quantiles (`empirical_quantiles`): a probabilistic baseline for
a probabilistic model. The forecast of every horizon step at level `q` is
the `q`-quantile of the last `m` history values (one season), the same for
each step: `ŷ_q[h] = Q_q(y[T - m], ..., y[T - 1])`. A point forecast scores
every quantile level with its one value; these quantiles spread as the
recent values do, which matters most on intermittent demand (many zeros),
where the last season repeated step by step is a poor guess of any level.

The quantile is the inverted empirical CDF (Hyndman & Fan's definition 1,
NumPy's `method='inverted_cdf'`): the `k`-th smallest of the `n` values
with `k = ceil(q · n)`, always one of the sample values. That is the value
that minimises the pinball loss of level `q` over the sample:
`Σ_i max(q (y_i - x), (q - 1)(y_i - x))` is piecewise linear in `x` with
slope `#{y_i <= x} - q n` between sample values, so it is least where that
count first reaches `q n`: the in-sample fit of the loss the models are
trained and scored on. Where `q · n` is a whole number `k`, every value
between the `k`-th and `(k+1)`-th smallest minimises it and the lower (the
`k`-th) is taken; a product `q · n` within 1e-9 of a whole number counts
as that number, so that a level written in decimals ranks as its decimal
says (0.28 · 25, 7.000000000000001 in floats, ranks 7th, where NumPy's
`inverted_cdf` takes the 8th value). NumPy's default, linear
interpolation, gives values between two observations that need not
minimise the loss (0.8 for the 0.9-quantile of 0, 0, 1, whose minimiser
is 1).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import pandas as pd

from tft_jax.data.tables import parse_frequency, typical_step
from tft_jax.quantile_levels import numeric_levels

_DAY = pd.Timedelta(days=1)
_WEEK = pd.Timedelta(days=7)
_YEAR_DAYS = 365.25
_MONTHS_PER_STEP = {
    pd.offsets.MonthBegin: 1,
    pd.offsets.MonthEnd: 1,
    pd.offsets.BusinessMonthBegin: 1,
    pd.offsets.BusinessMonthEnd: 1,
    pd.offsets.QuarterBegin: 3,
    pd.offsets.QuarterEnd: 3,
    pd.offsets.BQuarterBegin: 3,
    pd.offsets.BQuarterEnd: 3,
    pd.offsets.YearBegin: 12,
    pd.offsets.YearEnd: 12,
    pd.offsets.BYearBegin: 12,
    pd.offsets.BYearEnd: 12,
}


def _whole_seasons(season: int, step: int) -> int:
    """The fewest steps of `step` units that span a whole number of `season`-unit seasons."""
    return math.lcm(season, step) // step


def _steps_per_year(step: pd.Timedelta) -> int:
    """A year of about 365.25 days in steps of `step` (at least 1)."""
    return max(1, round(pd.Timedelta(days=_YEAR_DAYS) / step))


def _unit_count(offset: pd.DateOffset) -> int:
    """How many of its unit one step of `offset` spans ('2B': 2)."""
    return abs(int(offset.n)) or 1


def _business_days_per_year(count: int) -> int:
    """A year of 260 working days in steps of `count` working days (at least 1)."""
    return max(1, round(260 / count))


def _business_hour_seasons(offset: pd.offsets.BusinessHour) -> tuple[int, int]:
    """`(day, week)`: the fewest steps of `offset` that make whole business days and weeks.

    A business day is the sum of the offset's opening intervals (an interval
    whose end is not after its start runs past midnight), a business week
    that times the working days of its week mask (Monday to Friday unless a
    `CustomBusinessHour` says otherwise). Counted in seconds, so that opening
    hours such as 09:30-17:00 (7.5 hours) are exact.
    """
    day = 0
    for start, end in zip(offset.start, offset.end, strict=True):
        opens = pd.Timedelta(hours=start.hour, minutes=start.minute, seconds=start.second)
        closes = pd.Timedelta(hours=end.hour, minutes=end.minute, seconds=end.second)
        day += int(((closes - opens) % _DAY).total_seconds()) or int(_DAY.total_seconds())
    weekmask = getattr(offset, "weekmask", None) or "Mon Tue Wed Thu Fri"
    days = int(np.busdaycalendar(weekmask=weekmask).weekmask.sum())
    step = _unit_count(offset) * 3600
    return _whole_seasons(day, step), _whole_seasons(day * days, step)


def seasonal_period(freq: str) -> int:
    """The season length in steps for the pandas frequency alias `freq` (module table).

    Raises:
      ValueError: for an unknown alias, or a sub-daily step that does not
        divide a day (say '7min'); pass the period explicitly then.
    """
    offset = parse_frequency(freq)
    count = _unit_count(offset)
    if isinstance(offset, pd.offsets.BusinessHour):  # CustomBusinessHour is one too
        day, week = _business_hour_seasons(offset)
        return day if day > 1 else week
    if isinstance(offset, pd.offsets.BusinessDay):
        return _whole_seasons(5, count) if count < 5 else _business_days_per_year(count)
    if isinstance(offset, pd.offsets.SemiMonthBegin | pd.offsets.SemiMonthEnd):
        return _whole_seasons(24, count) if count < 24 else 1  # half months in a year
    months = _MONTHS_PER_STEP.get(type(offset))
    if months is not None:
        return _whole_seasons(12, months * count) if months * count < 12 else 1
    step = typical_step(freq)
    if step < _DAY:
        per_day = _DAY / step
        if per_day != int(per_day):
            raise ValueError(
                f"freq={freq!r}: a step of {step} does not divide a day, so there is no "
                "default seasonal period; pass one explicitly (e.g. --season-period)"
            )
        return int(per_day)
    fixed = isinstance(offset, pd.offsets.Tick | pd.offsets.Day | pd.offsets.Week)
    if step < _WEEK:
        seconds = step / pd.Timedelta(seconds=1)
        whole = fixed and seconds == int(seconds)
        return _whole_seasons(7 * 86_400, int(seconds)) if whole else 7
    if fixed:
        return _steps_per_year(step)
    if step < pd.Timedelta(days=28):
        return 52
    if step < pd.Timedelta(days=90):
        return 12
    if step < pd.Timedelta(days=365):
        return 4
    return 1


def _require_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _real_history(history: Any) -> np.ndarray:
    """`history` as a `(B, T)` array of real numbers (bool, int or float).

    A complex history would lose its imaginary part in the drift silently, and
    strings or `None` (object arrays) would be copied into the forecast or fail
    deep in NumPy: each is a `TypeError` naming `history`.
    """
    history = np.asarray(history)
    if history.dtype.kind not in "biuf":
        raise TypeError(f"history must hold real numbers, got dtype {history.dtype}")
    if history.ndim != 2:
        raise ValueError(f"history must have shape (B, T), got {history.shape}")
    return history


def _require_finite(values: np.ndarray, columns: np.ndarray, what: str) -> None:
    """Refuses NaN/inf among the history `values` a forecast reads (`columns` their steps).

    A NaN there would give NaN forecasts, silently, and a NaN score wins or
    loses a `min` over baselines arbitrarily.
    """
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values.astype(np.float64))
    if bad.any():
        series, index = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"history holds {int(bad.sum())} NaN/inf values that {what} reads (first: "
            f"series {series}, step {int(columns[index])}); fill the gaps first"
        )


def seasonal_naive(history: Any, horizon: int, period: int) -> np.ndarray:
    """Forecasts `(B, H)` that repeat the last `period` values of `history` `(B, T)`.

    Args:
      history: `(B, T)` past values (real numbers), the last column just before
        the forecast start; the values the forecast copies must be finite.
      horizon: `H`, steps to forecast.
      period: the season length `m`, at most `T`.

    Returns:
      `(B, H)` array, `out[:, h] = history[:, T - m + (h mod m)]`, in the dtype of `history`.

    Raises:
      TypeError: `history` not real numbers, `horizon` or `period` not ints.
      ValueError: `history` not 2-D, `period` longer than it, a copied value
        NaN or inf, or `horizon`/`period` below 1.
    """
    history = _real_history(history)
    horizon = _require_positive_int("horizon", horizon)
    period = _require_positive_int("period", period)
    steps = history.shape[1]
    if period > steps:
        raise ValueError(
            f"the seasonal period ({period}) is longer than the history ({steps} steps); "
            "lengthen the history or choose a shorter period"
        )
    read = steps - period + np.arange(min(horizon, period))
    _require_finite(history[:, read], read, "the seasonal naive forecast")
    columns = steps - period + np.arange(horizon) % period
    return history[:, columns]


def seasonal_naive_with_drift(history: Any, horizon: int, period: int) -> np.ndarray:
    """Seasonal naive plus the average change per season over the history: `(B, T) -> (B, H)`.

    `ŷ[h] = y[T - m + (h mod m)] + (h // m + 1) · d`, with the drift `d` the
    mean of the `T - m` seasonal differences `y[t] - y[t - m]` of the whole
    history, i.e. `(sum of the last m values - sum of the first m) / (T - m)`
    (Hyndman & Athanasopoulos, sections 5.2 and 5.8; fable's
    `SNAIVE(y ~ drift())`, which fits `d` as the mean of `y - lag(y, m)`).
    When `T` is a whole number of seasons this is the change between the
    first and last seasons' means per season. With `T == m` there is no
    seasonal difference and the drift is 0.

    Returns a float64 `(B, H)` array. Raises as `seasonal_naive`, and
    `ValueError` for a NaN or inf anywhere in the history (the drift reads
    every value, so one would make every forecast of its series NaN).
    """
    forecast = seasonal_naive(history, horizon, period).astype(np.float64)
    history = _real_history(history).astype(np.float64)
    steps = history.shape[1]
    _require_finite(history, np.arange(steps), "the drift")
    if steps <= period:
        return forecast
    drift = np.mean(history[:, period:] - history[:, :-period], axis=1)
    ahead = np.arange(horizon) // period + 1
    return forecast + drift[:, None] * ahead[None, :]


_WHOLE_RANK_TOLERANCE = 1e-9


def _quantile_levels(quantiles: Any) -> np.ndarray:
    """`quantiles` as a 1-D float64 array of levels, each in (0, 1), at least one.

    Raises:
      TypeError: not a sequence of numbers (a string, None, nested or ragged
        lists, booleans).
      ValueError: no level, or one outside (0, 1) (NaN included).
    """
    levels = numeric_levels(quantiles)
    if levels.size == 0 or not np.all((levels > 0.0) & (levels < 1.0)):  # NaN fails too
        raise ValueError(f"quantiles must be at least one level in (0, 1), got {levels.tolist()}")
    return levels


def _inverted_cdf_ranks(levels: np.ndarray, count: int) -> np.ndarray:
    """`(Q,)` 0-based positions in `count` sorted values of the inverted-CDF quantiles of `levels`.

    `ceil(q · count) - 1`, a product within 1e-9 of a whole number taken as
    that number (module docstring), kept in `[0, count - 1]`.
    """
    product = np.asarray(levels, dtype=np.float64) * count
    whole = np.rint(product)
    product = np.where(np.abs(product - whole) <= _WHOLE_RANK_TOLERANCE, whole, product)
    return np.clip(np.ceil(product).astype(np.int64) - 1, 0, count - 1)


def empirical_quantiles(history: Any, horizon: int, period: int, quantiles: Any) -> np.ndarray:
    """Forecasts `(B, H, Q)`: the quantiles of the last `period` values of `history`, every step.

    Args:
      history: `(B, T)` past values (real numbers), the last column just before
        the forecast start; the last `period` of them must be finite.
      horizon: `H`, steps to forecast.
      period: `m`, how many of the last history values make the sample (one
        season), at most `T`.
      quantiles: the `Q` levels, each in (0, 1), in the order of the output's
        last axis (unsorted levels give columns in that order).

    Returns:
      float64 `(B, H, Q)`, `out[b, h, j]` the inverted-CDF `quantiles[j]`-quantile
      of `history[b, T - m:]` (module docstring): its `ceil(q · m)`-th
      smallest value, the value that minimises the pinball loss of that level
      over the sample. The same for every `h`.

    Raises:
      TypeError: `history` not real numbers, `horizon` or `period` not ints,
        `quantiles` not a sequence of numbers.
      ValueError: `history` not 2-D, `period` longer than it, a NaN or inf
        among its last `period` values, `horizon`/`period` below 1, or no
        level or one outside (0, 1).
    """
    history = _real_history(history)
    horizon = _require_positive_int("horizon", horizon)
    period = _require_positive_int("period", period)
    levels = _quantile_levels(quantiles)
    steps = history.shape[1]
    if period > steps:
        raise ValueError(
            f"the period ({period}) of the empirical quantiles is longer than the history "
            f"({steps} steps); lengthen the history or choose a shorter period"
        )
    read = np.arange(steps - period, steps)
    sample = history[:, read].astype(np.float64)
    _require_finite(sample, read, "the empirical quantile forecast")
    ranked = np.sort(sample, axis=1)[:, _inverted_cdf_ranks(levels, period)]  # (B, Q)
    return np.repeat(ranked[:, None, :], horizon, axis=1)


def candidate_periods(freq: str, history: int) -> tuple[int, ...]:
    """Seasonal periods worth trying as baselines for `freq`, those that fit in `history`.

    The frequency's own season (`seasonal_period`), the one above it where a
    longer cycle is common (hourly: the day and the week; business hours:
    the business day and week; daily: the week and the year), and 1 (the
    last value). A sub-daily step that does not divide
    a day has no season of its own (`seasonal_period` raises), so only 1 is
    offered: the caller scores its explicitly configured period next to it
    rather than failing the evaluation.
    """
    step = typical_step(freq)  # raises ValueError for an unknown alias
    offset = parse_frequency(freq)
    if isinstance(offset, pd.offsets.BusinessHour):  # the business day and week
        periods = {1, *_business_hour_seasons(offset)}
        return tuple(sorted(p for p in periods if p <= history))
    if step < _DAY and _DAY % step != pd.Timedelta(0):
        return (1,)
    base = seasonal_period(freq)
    longer = []
    if step < _DAY and base * 7 > base:
        longer.append(base * 7)  # the week
    elif _DAY <= step < _WEEK:  # the year
        if isinstance(offset, pd.offsets.BusinessDay):
            longer.append(_business_days_per_year(_unit_count(offset)))
        else:
            longer.append(_steps_per_year(step))
    periods = {1, base, *longer}
    return tuple(sorted(p for p in periods if p <= history))
