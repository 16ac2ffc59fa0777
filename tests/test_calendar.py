"""`tft_jax.data.calendar`: calendar features equal Python's `datetime` read in each zone,
and `steps_since` counts elapsed steps from an origin."""

from __future__ import annotations

import math
import zoneinfo

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import calendar_features, steps_since
from tft_jax.data.calendar import calendar_feature_names


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
        ("45s", "2024-03-31 00:55:00", "Europe/Berlin", 30, ALL),  # seconds count in the hour
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


@pytest.mark.parametrize(
    ("freq", "cycles"),
    [("7D", ("year",)), ("363D", ("year",)), ("52W", ()), ("364D", ()), ("YS", ())],
)
def test_a_step_of_52_weeks_is_a_year_and_gets_no_calendar_cycle(freq, cycles):
    # The module docstring: a week up to under a year gets day of year; the 364 days of
    # '52W' step onto the same day of the year give or take one, so they count as a year.
    names = {"year": ["day_of_year_sin", "day_of_year_cos"]}
    want = tuple(name for cycle in cycles for name in names[cycle])
    assert calendar_feature_names(freq) == want
    times = pd.date_range("2020-01-06", periods=3, freq=freq)
    assert calendar_features(times, freq).shape == (3, 2 * len(cycles))


@pytest.mark.parametrize("first", ["2023-10-01", "2024-03-01"])  # both sides of, and after
def test_steps_since_counts_calendar_months_as_grid_points_from_the_origin(first):
    times = pd.date_range(first, periods=5, freq="MS")
    origin = pd.Timestamp("2024-01-01")
    want = [(stamp.year - origin.year) * 12 + stamp.month - origin.month for stamp in times]
    np.testing.assert_array_equal(steps_since(times, origin, "MS"), want)


@pytest.mark.parametrize("given_in", ["Europe/Berlin", "UTC"])
@pytest.mark.parametrize("first", ["2024-03-28", "2024-10-24"])  # spring forward, fall back
def test_steps_since_counts_aware_days_as_local_calendar_days_across_daylight_saving(
    first, given_in
):
    # A day of aware times is a calendar day of 23 or 25 hours at a change; times given
    # in another zone than the origin are the same instants read in the origin's zone.
    zone = zoneinfo.ZoneInfo("Europe/Berlin")
    local = pd.date_range(first, periods=7, freq="D", tz="Europe/Berlin")
    origin = local[1]
    start = origin.to_pydatetime().astimezone(zone).date()
    want = [(stamp.to_pydatetime().astimezone(zone).date() - start).days for stamp in local]
    got = steps_since(local.tz_convert(given_in), origin, "D")
    np.testing.assert_array_equal(got, want)
