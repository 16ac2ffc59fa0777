"""Seasonal naive forecasts (with and without fable's drift) against hand computations and
loop references, their default periods, and the histories they refuse."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tft_jax.baselines import (
    _business_hour_seasons,
    candidate_periods,
    seasonal_naive,
    seasonal_naive_with_drift,
    seasonal_period,
)


def test_seasonal_naive_repeats_the_last_season_hand_computed():
    history = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]])
    forecast = seasonal_naive(history, horizon=7, period=3)
    np.testing.assert_array_equal(forecast, [[4, 5, 6, 4, 5, 6, 4], [40, 50, 60, 40, 50, 60, 40]])


def test_seasonal_naive_with_period_one_is_the_last_value():
    forecast = seasonal_naive(np.array([[3.0, 1.0, 7.0]]), horizon=4, period=1)
    np.testing.assert_array_equal(forecast, [[7, 7, 7, 7]])


def test_seasonal_naive_with_period_equal_to_history_replays_it():
    history = np.arange(5.0)[None]
    np.testing.assert_array_equal(seasonal_naive(history, 6, 5), [[0, 1, 2, 3, 4, 0]])


def _reference(history: np.ndarray, horizon: int, period: int) -> np.ndarray:
    """y[t + h] = y[t + h - k m] with k the fewest whole seasons that reach the history."""
    steps = history.shape[1]
    out = np.empty((history.shape[0], horizon), history.dtype)
    for h in range(horizon):
        k = 1
        while h - k * period >= 0:
            k += 1
        out[:, h] = history[:, steps + h - k * period]
    return out


@given(
    history=hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 3), st.integers(1, 12)),
        elements=st.floats(-1e3, 1e3),
    ),
    horizon=st.integers(1, 30),
    data=st.data(),
)
def test_seasonal_naive_matches_a_loop_reference(history, horizon, data):
    period = data.draw(st.integers(1, history.shape[1]))
    np.testing.assert_array_equal(
        seasonal_naive(history, horizon, period), _reference(history, horizon, period)
    )


def test_seasonal_naive_rejects_a_period_longer_than_the_history():
    with pytest.raises(ValueError, match=r"seasonal period \(24\) is longer than the history"):
        seasonal_naive(np.zeros((2, 12)), horizon=4, period=24)


@pytest.mark.parametrize(
    ("history", "horizon", "period", "error", "match"),
    [
        (np.zeros(5), 2, 1, ValueError, r"shape \(B, T\)"),
        (np.zeros((1, 5)), 0, 1, ValueError, "horizon must be >= 1"),
        (np.zeros((1, 5)), 2, 0, ValueError, "period must be >= 1"),
        (np.zeros((1, 5)), 2, 1.5, TypeError, "period must be an int"),
    ],
)
def test_seasonal_naive_bad_arguments_name_the_argument(history, horizon, period, error, match):
    with pytest.raises(error, match=match):
        seasonal_naive(history, horizon, period)


@pytest.mark.parametrize(
    ("freq", "period"),
    [
        ("h", 24),
        ("30min", 48),
        ("15min", 96),
        ("D", 7),
        ("B", 5),
        ("W", 52),
        ("MS", 12),
        ("ME", 12),
        ("QS", 4),
        ("YS", 1),
    ],
)
def test_seasonal_period_follows_the_documented_table(freq, period):
    assert seasonal_period(freq) == period


@pytest.mark.parametrize(
    ("freq", "period"),
    [
        ("2MS", 6),
        ("6MS", 2),
        ("2QS", 2),
        ("2YS", 1),
        ("2W", 26),
        ("14D", 26),
        ("10D", 37),
        ("2D", 7),
        ("3D", 7),
        ("36h", 14),
        ("2B", 5),
        ("5B", 52),  # a working week per step: a year of 260 working days, as 'W' has 52
        ("10B", 26),
        ("SMS", 24),
    ],
)
def test_a_multiple_of_a_unit_counts_its_season_in_that_unit(freq, period):
    # '2MS' steps two months: a year is 6 steps, not 12 (which would be two years).
    assert seasonal_period(freq) == period


@pytest.mark.parametrize("freq", ["2MS", "5MS", "2QS", "2D", "3D", "36h", "2B", "3B", "2SMS"])
def test_the_period_of_a_multiple_spans_whole_seasons_on_the_calendar(freq):
    # Independent of the unit arithmetic: step through pandas' own calendar.
    period = seasonal_period(freq)
    start = pd.Timestamp("2021-01-04")  # a Monday, the first of a half month too
    grid = pd.date_range(start, periods=period + 1, freq=freq)
    first, last = grid[0], grid[-1]
    if freq.endswith(("MS", "QS", "SMS")):  # a year: same day of the year
        assert (last.month, last.day) == (first.month, first.day) and last.year > first.year
    elif freq.endswith("B"):  # a working week: same weekday
        assert last.day_of_week == first.day_of_week and last > first
    else:  # a week: same weekday and time
        assert (last - first) % pd.Timedelta(days=7) == pd.Timedelta(0) and last > first


def test_the_yearly_candidate_of_a_daily_multiple_is_a_year_of_its_steps():
    assert candidate_periods("D", 400) == (1, 7, 365)
    assert candidate_periods("B", 300) == (1, 5, 260)
    assert candidate_periods("2D", 400) == (1, 7, 183)  # 366 days, not 730
    assert candidate_periods("3B", 100) == (1, 5, 87)


def test_seasonal_period_of_a_step_not_dividing_a_day_asks_for_one():
    with pytest.raises(ValueError, match="does not divide a day"):
        seasonal_period("7min")


def test_seasonal_period_of_an_unknown_frequency_is_rejected():
    with pytest.raises(ValueError, match="unknown frequency"):
        seasonal_period("fortnightly")


def test_candidate_periods_of_a_step_not_dividing_a_day_offer_the_last_value():
    # A '7min' run trains with an explicit season period; its evaluation adds
    # that period to these candidates and must not fail for want of a default.
    assert candidate_periods("7min", 500) == (1,)
    assert candidate_periods("h", 200) == (1, 24, 168)
    with pytest.raises(ValueError, match="unknown frequency"):
        candidate_periods("fortnightly", 500)


# ----------------------------------------------------------------- drift and refused histories


def fable_drift(history: np.ndarray, horizon: int, period: int) -> np.ndarray:
    """fable's `SNAIVE(y ~ drift())` point forecast, written as loops (one series)."""
    steps = len(history)
    differences = [history[t] - history[t - period] for t in range(period, steps)]
    drift = sum(differences) / len(differences)
    out = []
    for h in range(1, horizon + 1):  # 1-based as in fpp3
        seasons = (h - 1) // period + 1
        out.append(history[steps + h - period * seasons - 1] + seasons * drift)
    return np.array(out)


@pytest.mark.parametrize("steps, period", [(30, 7), (31, 7), (28, 7), (10, 7), (9, 1)])
def test_seasonal_naive_with_drift_is_fables_mean_seasonal_difference(steps, period):
    # The drift was estimated from the T // m whole seasons at the end only: for
    # T = 30, m = 7 the first 2 values were dropped (forecast 150.6 vs 148.9).
    rng = np.random.default_rng(steps)
    history = np.abs(np.cumsum(rng.normal(1.0, 3.0, size=(3, steps)), axis=1)) ** 1.2
    got = seasonal_naive_with_drift(history, 16, period)
    expected = np.stack([fable_drift(row, 16, period) for row in history])
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_drift_at_a_history_shorter_than_two_seasons_is_the_mean_seasonal_difference() -> None:
    history = np.array([[1.0, 4.0, 2.0, 7.0, 3.0]])  # T = 5, m = 3: two seasonal differences
    period = 3
    differences = [history[0, t] - history[0, t - period] for t in range(period, 5)]
    drift = np.mean(differences)  # (7 - 1 + 3 - 4) / 2 = 2.5
    want = [history[0, 2 + h % period] + (h // period + 1) * drift for h in range(7)]
    np.testing.assert_allclose(seasonal_naive_with_drift(history, 7, period)[0], want)


def test_drift_refuses_a_nan_anywhere_in_the_history() -> None:
    # The first step is not copied, but the drift reads it: every forecast was NaN.
    history = np.array([[np.nan, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match=r"NaN/inf .* drift .*series 0, step 0"):
        seasonal_naive_with_drift(history, 2, 2)


def test_seasonal_naive_refuses_nan_only_where_it_copies() -> None:
    history = np.array([[np.nan, 1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(seasonal_naive(history, 3, 2), [[2.0, 3.0, 2.0]])
    history[0, 3] = np.inf
    with pytest.raises(ValueError, match=r"NaN/inf .*series 0, step 3"):
        seasonal_naive(history, 3, 2)


@pytest.mark.parametrize(
    "history",
    [np.array([[1 + 1j, 2 + 0j]]), np.array([["a", "b"]]), np.array([[1.0, None]], dtype=object)],
    ids=["complex", "strings", "object"],
)
@pytest.mark.parametrize("baseline", [seasonal_naive, seasonal_naive_with_drift])
def test_baselines_refuse_a_history_that_is_not_real_numbers(history, baseline) -> None:
    # Complex lost its imaginary part in the drift, strings and None were copied or
    # failed deep in NumPy.
    with pytest.raises(TypeError, match="history must hold real numbers"):
        baseline(history, 2, 1)


@pytest.mark.parametrize(
    ("freq", "day", "week"),
    [("bh", 8, 40), ("cbh", 8, 40), ("2bh", 4, 20), ("3bh", 8, 40), ("8bh", 1, 5)],
)
def test_business_hours_count_the_opening_hours_of_a_day_and_week(freq, day, week):
    # 'bh' was taken as hourly: a period of 24 (three business days) and a week of 168.
    # Closed form on 09:00-17:00, Monday to Friday: a day of 8 hours, a week of 40;
    # n-hour steps take lcm(8, n) / n and lcm(40, n) / n steps.
    assert seasonal_period(freq) == (day if day > 1 else week)
    assert candidate_periods(freq, 1000) == tuple(sorted({1, day, week}))
    assert candidate_periods(freq, 10) == tuple(sorted(p for p in {1, day, week} if p <= 10))


@pytest.mark.parametrize(
    "offset",
    [
        pd.offsets.BusinessHour(),
        pd.offsets.BusinessHour(n=3),
        pd.offsets.BusinessHour(start="09:30"),  # 7.5 hours a day
        pd.offsets.BusinessHour(start=["08:00", "13:00"], end=["12:00", "17:30"]),
        pd.offsets.BusinessHour(start="22:00", end="06:00"),  # overnight
        pd.offsets.CustomBusinessHour(weekmask="Mon Tue Wed Thu Fri Sat"),
        pd.offsets.CustomBusinessHour(n=2, start="10:00", end="15:00", weekmask="1111000"),
    ],
    ids=["default", "3h", "half_hour", "split", "overnight", "six_days", "custom"],
)
def test_business_hour_seasons_span_whole_days_and_weeks_on_pandas_calendar(offset):
    # Independent of the arithmetic: step through pandas' own business-hour grid.
    day, week = _business_hour_seasons(offset)
    start = offset.rollforward(pd.Timestamp("2024-01-01 00:00"))  # a Monday's opening
    grid = pd.date_range(start, periods=week + 1, freq=offset)
    time_of_day = grid - grid.normalize()
    # The first later step at the start's time of the day (and weekday) is the season.
    same_time = np.flatnonzero(time_of_day[1:] == time_of_day[0]) + 1
    assert same_time[0] == day
    same_week = [i for i in same_time if grid[i].day_of_week == grid[0].day_of_week]
    assert same_week[0] == week
