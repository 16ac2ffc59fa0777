"""`tft_jax.data.future` at scale: the forecast steps, the filled steps of each series' end and
the messages naming series are counted for all series at once, the same as one series at a
time, and a message about thousands of series names the first few and counts the rest."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tft_jax.data.future import (
    forecast_steps,
    future_steps,
    future_windows,
    recent_filled,
    trailing_empty_targets,
)
from tft_jax.data.tables import TableSpec, time_grid

from .prepared_tables import quiet_prepare

SPEC = TableSpec(id_col="id", time_col="time", target="y")


# The per-series versions these functions replaced: one date_range, one group at a time.
def steps_one_by_one(last: pd.Series, freq: str, horizon: int) -> pd.DataFrame:
    return pd.concat(
        [
            pd.DataFrame({"id": series, "time": future_steps(time, freq, horizon)})
            for series, time in last.items()
        ],
        ignore_index=True,
    )


def trailing_one_by_one(grid: pd.DataFrame) -> dict[Any, tuple[int, pd.Timestamp]]:
    found = {}
    for series, group in grid.groupby("id", sort=True):
        observed = np.flatnonzero(group["missing"].to_numpy() == 0.0)
        steps = len(group) - 1 - int(observed[-1])
        if steps:
            found[series] = (steps, group["time"].iloc[int(observed[-1])])
    return found


def recent_one_by_one(grid: pd.DataFrame, history: int) -> pd.Series:
    return grid.groupby("id", sort=True)["missing"].apply(
        lambda flags: int(flags.iloc[-history:].sum())
    )


def last_times(freq: str, zone: str | None, start: str, ids: list[Any]) -> pd.Series:
    """A last time per series, on the grid of `freq`, several series ending together."""
    grid = time_grid(pd.Timestamp(start, tz=zone), periods=12, freq=freq)
    picks = np.random.default_rng(0).integers(0, len(grid), len(ids))
    picks[: len(ids) // 2] = 5  # half of them end at the same time
    last = pd.Series(grid[picks], index=pd.Index(ids, name="id"), name="time")
    return last.sort_index()


@pytest.mark.parametrize(
    ("freq", "zone", "start"),
    [
        ("h", "Europe/Berlin", "2021-03-28 00:00"),  # clocks go forward at 02:00
        ("h", "Europe/Berlin", "2021-10-31 00:00"),  # and back at 03:00
        ("D", "Europe/Berlin", "2021-03-25"),  # a calendar day of 23 hours
        ("D", None, "2021-03-25"),
        ("15min", None, "2021-03-25 23:00"),
        ("MS", None, "2020-11-01"),
        ("MS", "Europe/Berlin", "2020-11-01"),
        ("B", None, "2021-03-25"),
        ("W-SUN", None, "2021-03-07"),
        ("D", "America/Santiago", "2024-09-03"),  # midnight 2024-09-08 does not exist
    ],
)
@pytest.mark.parametrize("ids", [[f"s{k}" for k in range(9, -1, -1)], list(range(10, 0, -1))])
def test_forecast_steps_are_the_future_steps_of_each_series(freq, zone, start, ids):
    last = last_times(freq, zone, start, ids)
    steps = forecast_steps(last, freq, 4)
    expected = steps_one_by_one(last, freq, 4)
    pd.testing.assert_frame_equal(steps.rows("id", "time"), expected, check_exact=True)
    assert steps.times.freq is None
    series = last.index[3]
    both = expected[expected["id"] == series]["time"]
    assert steps.span(series) == (both.iloc[0], both.iloc[-1])


def filled_grid(seed: int, zone: str | None = None) -> pd.DataFrame:
    """Series of 1 to 12 grid steps, targets filled at random and at the end of some."""
    rng = np.random.default_rng(seed)
    parts = []
    for series in rng.permutation(40):
        length = int(rng.integers(1, 13))
        missing = (rng.random(length) < 0.3).astype(float)
        if rng.random() < 0.4:
            missing[-int(rng.integers(1, length + 1)) :] = 1.0
        missing[int(rng.integers(0, length))] = 0.0  # every series has an observed target
        times = pd.date_range("2021-03-27 20:00", periods=length, freq="h", tz=zone)
        parts.append(pd.DataFrame({"id": f"s{series}", "time": times, "missing": missing}))
    return pd.concat(parts, ignore_index=True)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("zone", [None, "Europe/Berlin"])
def test_the_filled_end_of_each_series_is_counted_as_one_by_one(seed, zone):
    grid = filled_grid(seed, zone)
    trailing = trailing_empty_targets(grid, SPEC, "missing")
    assert trailing == trailing_one_by_one(grid)
    assert trailing and [type(key) for key in trailing] == [str] * len(trailing)
    for history in (1, 4, 20):
        pd.testing.assert_series_equal(
            recent_filled(grid, SPEC, "missing", history), recent_one_by_one(grid, history)
        )


def test_series_whose_rows_interleave_are_counted_as_one_by_one():
    grid = filled_grid(5).sample(frac=1.0, random_state=0)
    grid = grid.sort_values("time", kind="stable").reset_index(drop=True)
    assert trailing_empty_targets(grid, SPEC, "missing") == trailing_one_by_one(grid)
    pd.testing.assert_series_equal(
        recent_filled(grid, SPEC, "missing", 3), recent_one_by_one(grid, 3)
    )


# --- messages about many series ------------------------------------------------------------

MANY = 5000
LONGEST = 3000  # characters: a message of thousands of series stays short


@pytest.fixture(scope="module")
def preprocessor():
    times = pd.date_range("2021-01-01", periods=30, freq="D")
    table = pd.DataFrame(
        {"id": np.repeat(["a", "b"], 30), "time": np.tile(times, 2), "y": np.arange(60.0)}
    )
    return quiet_prepare(table, freq="D", history=4, horizon=2).preprocessor


def many_series(length: int = 8) -> pd.DataFrame:
    """`MANY` daily series of `length` steps, ending a day apart by pairs."""
    ids = np.repeat([f"n{k:05d}" for k in range(MANY)], length)
    shift = np.repeat(np.arange(MANY) % 2, length).astype("timedelta64[D]")
    times = np.tile(pd.date_range("2021-02-01", periods=length, freq="D"), MANY) + shift
    return pd.DataFrame({"id": ids, "time": times, "y": 1.0 + np.arange(MANY * length) % 7})


# The model reads no known columns: a future table is announced as adding nothing.
NOTHING = "future adds nothing"


def future_of(history: pd.DataFrame, horizon: int = 2) -> pd.DataFrame:
    last = history.groupby("id")["time"].max()
    ids = np.repeat(last.index.to_numpy(), horizon)
    times = np.repeat(last.to_numpy(), horizon) + np.tile(
        np.arange(1, horizon + 1).astype("timedelta64[D]"), len(last)
    )
    return pd.DataFrame({"id": ids, "time": times})


def test_warnings_about_thousands_of_filled_series_name_the_first_few(preprocessor):
    history = many_series()
    empty = history.groupby("id").cumcount().to_numpy()
    history.loc[empty == 2, "y"] = np.nan  # a filled step in every series
    history.loc[empty == 7, "y"] = np.nan  # and a last row with an empty target
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = future_windows(preprocessor, history, future_of(history), 4, 2)
    assert len(result.transformed.series_ids) == MANY
    said = [str(w.message) for w in caught]
    filled = [text for text in said if text.startswith("filled ")]
    ends = [text for text in said if "ends in rows with an empty target" in text]
    assert len(filled) == len(ends) == 1
    for text in (*filled, *ends):
        assert len(text) < LONGEST, text[:300]
        assert f"and {MANY - 5} more" in text
    head = f"in {MANY} of {MANY} series: 'n00000' 2 (1 in the last 4 steps), 'n00001' 2"
    assert head in filled[0]
    assert ends[0].startswith(
        f"the history of {MANY} series ends in rows with an empty target: 'n00000' 1 rows after "
        "its last observed target at 2021-02-07 00:00:00 (forecast from 2021-02-09 00:00:00), "
        "'n00001' 1 rows"
    )


def test_errors_about_thousands_of_series_name_the_first_few(preprocessor):
    history = many_series()
    position = history.groupby("id").cumcount().to_numpy()
    sparse = history.assign(y=history["y"].mask(position >= 5))
    with pytest.raises(ValueError) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        future_windows(preprocessor, sparse, future_of(sparse), 4, 2)
    message = str(caught.value)
    assert len(message) < LONGEST, message[:300]
    assert message.startswith(
        f"{MANY} series have more than 50% of the last 4 target steps the forecast reads "
        f"missing (filled): 'n00000' (3 of 4), 'n00001' (3 of 4), "
    )
    assert f"'n00004' (3 of 4) and {MANY - 5} more; 'n00000', 'n00001', " in message
    assert f"'n00004' and {MANY - 5} more end in rows with an empty target" in message

    future = future_of(history)
    strangers = future.assign(id="x" + future["id"])
    with pytest.raises(ValueError) as caught, pytest.warns(UserWarning, match=NOTHING):
        future_windows(preprocessor, history, pd.concat([future, strangers]), 4, 2)
    message = str(caught.value)
    assert len(message) < LONGEST, message[:300]
    assert message.startswith(
        "future has series ['xn00000', 'xn00001', 'xn00002', 'xn00003', 'xn00004' and "
        f"{MANY - 5} more] that the history does not"
    )


def test_a_few_unknown_series_are_listed_as_before(preprocessor):
    history = many_series()
    future = future_of(history)
    strangers = future.iloc[:4].assign(id=["z", "z", 7, 7])
    with (
        pytest.raises(ValueError, match=r"future has series \[7, 'z'\] that the history does"),
        pytest.warns(UserWarning, match=NOTHING),
    ):
        future_windows(preprocessor, history, pd.concat([future, strangers]), 4, 2)
