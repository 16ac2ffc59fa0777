"""Calendar known inputs generated from timestamps, and the relative time index.

Each calendar cycle is encoded as a sin/cos pair of its phase, so the last
hour of a day sits next to the first:

- hour of day: phase `2π · (hour + minute/60 + second/3600) / 24`;
- day of week: phase `2π · dayofweek / 7` (Monday = 0);
- day of year: phase `2π · (dayofyear - 1) / days_in_year` (365, or 366 in
  leap years; 1 January = 0).

Only the cycles a frequency can resolve are generated: a step shorter than a
day gets all three; a step of at least a day but under a week (daily,
business-daily) gets day of week and day of year; a step of a week up to under
a year (weekly, monthly, quarterly) gets day of year; yearly and longer get
none. A step's length is its usual duration (`typical_step`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tft_jax.data.tables import parse_frequency, time_grid, typical_step

HOUR_OF_DAY = ("hour_of_day_sin", "hour_of_day_cos")
DAY_OF_WEEK = ("day_of_week_sin", "day_of_week_cos")
DAY_OF_YEAR = ("day_of_year_sin", "day_of_year_cos")
TIME_INDEX = "time_index"


def _cycles(freq: str) -> tuple[str, ...]:
    step = typical_step(freq)
    if step < pd.Timedelta(days=1):
        return ("hour", "week", "year")
    if step < pd.Timedelta(days=7):
        return ("week", "year")
    if step < pd.Timedelta(days=364):
        return ("year",)
    return ()


def calendar_feature_names(freq: str) -> tuple[str, ...]:
    """Names of the calendar features `calendar_features` generates for `freq`, in order."""
    names = {"hour": HOUR_OF_DAY, "week": DAY_OF_WEEK, "year": DAY_OF_YEAR}
    return tuple(name for cycle in _cycles(freq) for name in names[cycle])


def _local(times: pd.DatetimeIndex, timezone: str | None) -> pd.DatetimeIndex:
    if timezone is None:
        return times
    if times.tz is None:
        raise ValueError(
            f"timezone={timezone!r} needs timezone-aware times, got naive ones; "
            "pass timezone=None or localize the times"
        )
    return times.tz_convert(timezone)


def _phases(times: pd.DatetimeIndex, cycle: str) -> np.ndarray:
    if cycle == "hour":
        hours = times.hour + times.minute / 60.0 + times.second / 3600.0
        return np.asarray(hours, dtype=np.float64) / 24.0
    if cycle == "week":
        return np.asarray(times.day_of_week, dtype=np.float64) / 7.0
    days_in_year = np.where(times.is_leap_year, 366.0, 365.0)
    return (np.asarray(times.day_of_year, dtype=np.float64) - 1.0) / days_in_year


def calendar_features(
    times: pd.DatetimeIndex, freq: str, timezone: str | None = None
) -> np.ndarray:
    """Sin/cos calendar features of `times`, read in `timezone` (see the module docstring).

    Args:
      times: (R,) timestamps.
      freq: the sampling frequency; selects the cycles.
      timezone: IANA zone to convert timezone-aware `times` to first; None
        reads them as they are.

    Returns:
      (R, F) float64, columns named by `calendar_feature_names(freq)`.
    """
    local = _local(pd.DatetimeIndex(times), timezone)
    columns = []
    for cycle in _cycles(freq):
        angle = 2.0 * np.pi * _phases(local, cycle)
        columns += [np.sin(angle), np.cos(angle)]
    if not columns:
        return np.zeros((len(local), 0))
    return np.stack(columns, axis=-1)


def _fixed_step(offset: pd.DateOffset, aware: bool) -> pd.Timedelta | None:
    """The duration of one step of `offset`, or None where steps differ in length."""
    # A day of aware times is a calendar day (the grid's local midnights): 23 or
    # 25 hours across a daylight-saving change, though pandas gives it 24 hours.
    if aware and isinstance(offset, pd.offsets.Day):
        return None
    # pandas 3 made `Day` a calendar offset that `pd.Timedelta` refuses; a naive day
    # is still 24 hours, so a series at noon counts half steps from a midnight origin.
    if isinstance(offset, pd.offsets.Day):
        return pd.Timedelta(days=offset.n)
    try:
        return pd.Timedelta(offset)
    except ValueError:
        return None


def steps_since(times: pd.DatetimeIndex, origin: pd.Timestamp, freq: str) -> np.ndarray:
    """Signed number of `freq` steps from `origin` to each of `times`, as (R,) float64.

    Fixed-length frequencies ('h', '15min') divide the elapsed time by the
    step; calendar frequencies ('W', 'MS', 'B', and 'D' or '2D' for aware
    times, whose days are calendar days of 23 or 25 hours at a daylight-saving
    change) count grid points from `origin`. Aware `times` in another zone
    than `origin` are the same instants read in `origin`'s zone; naive against
    aware is refused (it has no answer).

    Raises:
      ValueError: when `origin` is no timestamp (a text is read as one), or
        exactly one of `times` and `origin` is timezone-aware.
    """
    times = pd.DatetimeIndex(times)
    given = origin
    try:
        origin = pd.Timestamp(given)
    except (TypeError, ValueError) as error:
        raise ValueError(f"origin={given!r} is not a timestamp ({error})") from None
    if origin is pd.NaT:
        raise ValueError(f"origin={given!r} is not a timestamp")
    if (times.tz is None) != (origin.tz is None):
        raise ValueError(
            f"times are {'naive' if times.tz is None else f'timezone-aware ({times.tz})'} but "
            f"the origin {origin} is {'naive' if origin.tz is None else 'timezone-aware'}; "
            "steps between them are undefined"
        )
    if times.tz is not None:
        times = times.tz_convert(origin.tz)
    offset = parse_frequency(freq)
    step = _fixed_step(offset, aware=times.tz is not None)
    if step is None:
        if len(times) == 0:
            return np.zeros(0)
        # The grid spans the times on both sides of `origin`, so times before it
        # count negative steps as a fixed-length frequency's do (a table that
        # starts before the training one), instead of all reading 0.
        grid = time_grid(min(times.min(), origin), max(times.max(), origin), freq=offset)
        return (grid.searchsorted(times) - grid.searchsorted(origin)).astype(np.float64)
    return np.asarray((times - origin) / step, dtype=np.float64)
