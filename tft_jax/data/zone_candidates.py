"""The IANA zones that given times could be local to, for hints in error messages.

Times written with UTC offsets (`+01:00` in winter, `+02:00` in summer) name
an offset, not a zone, and are read in UTC; a hint that names the zone to
read them in is only useful if it names zones that fit the data, found here.
"""

from __future__ import annotations

import functools
import zoneinfo
from collections.abc import Sequence

import numpy as np
import pandas as pd

# Regions listed first in a hint: where most users' zones are.
_REGIONS = ("Europe", "America", "Asia", "Australia", "Africa", "Pacific", "Atlantic", "Indian")
_SAMPLE = 256


@functools.cache
def _zones() -> tuple[str, ...]:
    """Region/City zone names, by region as `_REGIONS` orders them, then by name."""
    names = [name for name in zoneinfo.available_timezones() if name.split("/")[0] in _REGIONS]
    return tuple(sorted(names, key=lambda name: (_REGIONS.index(name.split("/")[0]), name)))


def _sample(instants: pd.DatetimeIndex) -> pd.DatetimeIndex:
    """At most `_SAMPLE` distinct instants spread over `instants`, in UTC."""
    unique = pd.DatetimeIndex(instants.unique()).sort_values().tz_convert("UTC")
    if len(unique) <= _SAMPLE:
        return unique
    return unique[np.linspace(0, len(unique) - 1, _SAMPLE).round().astype(int)]


def _offsets(instants: pd.DatetimeIndex, zone: str) -> np.ndarray:
    """The UTC offset of `zone` at each instant, as nanoseconds."""
    local = instants.tz_convert(zone).tz_localize(None)
    return (local - instants.tz_localize(None)).asi8


def zones_with_offsets(instants: pd.DatetimeIndex, offsets: Sequence[pd.Timedelta]) -> list[str]:
    """The zones whose UTC offset at each of `instants` (aware) is the one given for it."""
    wanted = pd.TimedeltaIndex(offsets).asi8
    utc = pd.DatetimeIndex(instants).tz_convert("UTC")
    return [zone for zone in _zones() if np.array_equal(_offsets(utc, zone), wanted)]


def zones_keeping_time_of_day(instants: pd.DatetimeIndex) -> list[str]:
    """The zones with daylight saving in which all of `instants` (aware) share one clock time.

    Daily or coarser data stamped at local midnights falls at two clock times
    in UTC (or any fixed offset) once daylight saving starts. Zones where
    that one time is midnight come first.
    """
    sample = _sample(pd.DatetimeIndex(instants))
    found = []
    for zone in _zones():
        offsets = _offsets(sample, zone)
        if offsets.min() == offsets.max():
            continue  # no change of offset over the data: no help
        clock = sample.tz_convert(zone).tz_localize(None)
        times_of_day = set((clock - clock.normalize()).asi8)
        if len(times_of_day) == 1:
            found.append((times_of_day != {0}, zone))
    return [zone for _, zone in sorted(found, key=lambda item: item[0])]


def describe(zones: list[str], limit: int = 3) -> str:
    """`'Europe/Amsterdam', 'Europe/Andorra' or 'Europe/Belgrade'`: the first `limit`."""
    shown = [repr(zone) for zone in zones[:limit]]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
