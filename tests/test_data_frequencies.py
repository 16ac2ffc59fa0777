"""The frequency `freq` against the one a table is recorded at: a frequency far finer than
the table is refused before any grid is built, and errors name the frequency to pass."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset

SPEC = dict(id_col="id", time_col="time", target="y", history=4, horizon=2)


def recorded(
    freq: str, periods: int, start: str, ids: tuple[str, ...] = ("a", "b")
) -> pd.DataFrame:
    """A long table of `ids`, each `periods` times of `freq` from `start`, target 0, 1, 2, ..."""
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "id": series,
                    "time": pd.date_range(start, periods=periods, freq=freq),
                    "y": np.arange(periods, dtype=np.float64) + 10.0 * k,
                }
            )
            for k, series in enumerate(ids)
        ],
        ignore_index=True,
    )


@pytest.mark.parametrize(
    ("recorded_at", "start", "freq"),
    [("MS", "2020-01-01", "us"), ("D", "2020-01-01", "ns")],
    ids=["month-starts-as-microseconds", "days-as-nanoseconds"],
)
def test_a_sub_daily_freq_far_finer_than_the_table_is_refused_before_any_grid_is_built(
    recorded_at, start, freq
):
    # 36 months in microseconds are ~1e14 grid rows per series: building the grid
    # first failed with a MemoryError naming nothing; the density check now runs
    # on the grid's row count, before any grid exists.
    table = recorded(recorded_at, 36, start)
    with pytest.raises(
        ValueError, match=rf"freq='{freq}' leaves 100% .* recorded every {recorded_at}\b"
    ):
        prepare_dataset(table, **SPEC, freq=freq)


def test_a_fine_fixed_freq_is_refused_with_the_numbers_the_grid_would_give():
    # 'min' on hourly data: 59 of every 60 grid rows would be inserted. The
    # count before building equals the built grid's (independent reference:
    # pandas' date_range per series).
    table = recorded("h", 30, "2021-03-27", ids=("a", "b", "c"))
    grid_rows = sum(
        len(pd.date_range(group["time"].min(), group["time"].max(), freq="min"))
        for _, group in table.groupby("id")
    )
    share = round(100 * (1 - len(table) / grid_rows))
    with pytest.raises(ValueError, match=rf"freq='min' leaves {share}% .* every h\b"):
        prepare_dataset(table, **SPEC, freq="min")


@pytest.mark.parametrize(
    ("recorded_at", "start", "freq", "named"),
    [
        ("MS", "2020-01-01", "D", "MS"),
        ("ME", "2020-01-31", "D", "ME"),
        ("W-MON", "2020-01-06", "D", "W-MON"),
        ("B", "2021-01-04", "h", "B"),
    ],
)
def test_a_too_fine_freq_names_the_calendar_frequency_the_table_is_recorded_at(
    recorded_at, start, freq, named
):
    # The most common step of monthly data is 31 days ('744h'): passing that
    # puts every month off the grid. pandas' own infer_freq names 'MS'.
    table = recorded(recorded_at, 40, start)
    with warnings.catch_warnings():  # newer pandas deprecate infer_freq's string result
        warnings.simplefilter("ignore")
        found = pd.infer_freq(pd.DatetimeIndex(table["time"][:40]))
    assert getattr(found, "freqstr", found) == named
    with pytest.raises(ValueError, match=rf"looks recorded every {named} ") as error:
        prepare_dataset(table, **SPEC, freq=freq)
    assert "744h" not in str(error.value)
    # The frequency named is one the table prepares with.
    dataset = prepare_dataset(table, **SPEC, freq=named)
    assert len(dataset.frame) == len(table)


@pytest.mark.parametrize(
    ("recorded_at", "start", "freq"),
    [("ME", "2020-01-31", "MS"), ("MS", "2020-01-01", "ME"), ("ME", "2020-01-31", "BME")],
)
def test_times_off_the_grid_name_the_frequency_pandas_reads_in_them(recorded_at, start, freq):
    table = recorded(recorded_at, 30, start)
    with warnings.catch_warnings():  # newer pandas deprecate infer_freq's string result
        warnings.simplefilter("ignore")
        inferred = pd.infer_freq(pd.DatetimeIndex(table["time"][:30]))
    inferred = getattr(inferred, "freqstr", inferred)
    with pytest.raises(ValueError, match=rf"off the freq='{freq}' grid .* recorded at freq="
                       rf"'{inferred}'"):  # fmt: skip
        prepare_dataset(table, **SPEC, freq=freq)
    assert len(prepare_dataset(table, **SPEC, freq=inferred).frame) == len(table)
