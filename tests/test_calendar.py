"""`tft_jax.data.calendar`: calendar features equal Python's `datetime` read in each zone,
and `steps_since` counts elapsed steps from an origin."""

from __future__ import annotations

import math
import zoneinfo

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import calendar_features, steps_since


def reference_calendar(times: pd.DatetimeIndex, zone: str | None, cycles: tuple[str, ...]):
    """Sin/cos of hour of day, day of week and day of year from `datetime`, in float64."""
    rows = []
    for stamp in times:
        moment = stamp.to_pydatetime()
        if zone is not None:
            moment = moment.astimezone(zoneinfo.ZoneInfo(zone))
        year = moment.year
        days = 366 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 365
        phases = {
            "hour": (moment.hour + moment.minute / 60 + moment.second / 3600) / 24,
            "week": moment.weekday() / 7,
            "year": (moment.timetuple().tm_yday - 1) / days,
        }
        row = []
        for cycle in cycles:
            row += [math.sin(2 * math.pi * phases[cycle]), math.cos(2 * math.pi * phases[cycle])]
        rows.append(row)
    return np.array(rows).reshape(len(times), 2 * len(cycles))


ALL = ("hour", "week", "year")


@pytest.mark.parametrize(
    ("freq", "start", "zone", "periods", "cycles"),
    [
        ("h", "2024-03-30 20:00", "Europe/Berlin", 60, ALL),  # spring forward
        ("h", "2024-10-26 20:00", "Europe/Berlin", 60, ALL),  # fall back
        ("30min", "2023-04-01 12:00", "Australia/Melbourne", 40, ALL),
        ("D", "2024-02-26", "Europe/Berlin", 10, ("week", "year")),  # leap day
        ("D", "1900-02-26", None, 10, ("week", "year")),  # no leap year
        ("D", "2000-02-26", None, 10, ("week", "year")),  # leap year by 400
        ("B", "2024-12-25", None, 10, ("week", "year")),
        ("W-MON", "2024-12-02", None, 10, ("year",)),
        ("MS", "2023-11-01", "America/New_York", 10, ("year",)),
        ("ME", "2023-11-30", None, 10, ("year",)),
        ("QS", "2023-10-01", None, 6, ("year",)),
        ("YS", "2023-01-01", None, 3, ()),
    ],
)
def test_calendar_features_equal_python_datetime_in_every_zone(freq, start, zone, periods, cycles):
    times = pd.date_range(start, periods=periods, freq=freq, tz=zone)
    expected = reference_calendar(times, zone, cycles)
    np.testing.assert_allclose(calendar_features(times, freq, zone), expected, atol=1e-12)
    if zone is not None:  # the same instants given in UTC, read in the zone
        utc = times.tz_convert("UTC")
        np.testing.assert_allclose(calendar_features(utc, freq, zone), expected, atol=1e-12)


def test_naive_days_count_elapsed_time_so_a_noon_series_is_half_a_step_off_midnight():
    # The docstring: fixed-length frequencies divide the elapsed time. pandas 3 made `Day`
    # a calendar offset, and naive days were counted as grid points (rounded up: 1, 2, 3).
    noon = pd.date_range("2021-01-01 12:00", periods=3, freq="D")
    origin = pd.Timestamp("2021-01-01")
    np.testing.assert_allclose(steps_since(noon, origin, "D"), [0.5, 1.5, 2.5])
    np.testing.assert_allclose(steps_since(noon, origin, "2D"), [0.25, 0.75, 1.25])


def test_steps_since_reads_a_text_origin_and_names_one_that_is_no_timestamp():
    hours = pd.date_range("2021-01-01", periods=3, freq="h")
    np.testing.assert_allclose(steps_since(hours, "2021-01-01 01:00", "h"), [-1.0, 0.0, 1.0])
    for origin in (None, "soon"):
        with pytest.raises(ValueError, match=r"origin=.* is not a timestamp"):
            steps_since(hours, origin, "h")
