"""The ways forward the data layer's messages name: the frequency the times look recorded at,
the time format or conversion that reads them, where a static changes, how to make labels or
zones match. Each suggested line of code is run here on the table it was suggested for.

References: the times the tables were built from (`pd.date_range`, `pd.bdate_range`).
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.tables import MissingColumnsError
from tft_jax.forecaster import DataConfig

from .prepared_tables import HISTORY, HORIZON, forecast_inputs, prepare

NAMES = {"id_col": "id", "time_col": "time", "target": "y", "freq": "D"}


def table_of(times: pd.DatetimeIndex | pd.Index, ids: str = "ab") -> pd.DataFrame:
    """A long table of `ids`, each with the column 'time' holding `times` and a target."""
    return pd.concat(
        [
            pd.DataFrame(
                {"id": series, "time": times, "y": np.sin(np.arange(len(times))) + 10.0 * k}
            )
            for k, series in enumerate(ids)
        ],
        ignore_index=True,
    )


def user_warnings(run: Any) -> tuple[Any, list[str]]:
    """`run()` and the messages of the user warnings it gave (each one, repeats included)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run()
    return result, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def suggested(message: str, target: str) -> str:
    """The right-hand side of the line `target = ...` a message suggests, up to its end."""
    found = re.search(re.escape(target) + r" = (.+?)(?:;|$|\. | \(after)", message)
    assert found is not None, message
    return found.group(1)


# ----------------------------------------------- business days given freq='D' (filled steps)


def test_business_days_given_daily_freq_are_filled_and_the_warning_names_freq_b():
    days = pd.bdate_range("2024-01-01", "2024-03-29")  # Monday to Friday, ending on a Friday
    table = table_of(days)
    weekend_days = len(pd.date_range(days[0], days[-1], freq="D")) - len(days)
    with pytest.warns(
        UserWarning,
        match=rf"^filled {2 * weekend_days} missing target steps .* 'a' {weekend_days}, 'b' "
        rf"{weekend_days}; .*; the times of 2 of the series with filled steps look recorded at "
        r"freq='B' \(pandas' infer_freq\): if that is their frequency, pass freq='B' "
        r"\(--freq B\); with freq='D' the filled steps are times a 'B' grid skips",
    ):
        daily = prepare(table, "D")
    # The forecast from that history: the fill is announced there too, with the same hint.
    _, messages = forecast_inputs(daily.preprocessor, table, None)
    filled = [m for m in messages if m.startswith("filled")]
    assert len(filled) == 1 and "of the history" in filled[0]
    assert "look recorded at freq='B'" in filled[0]
    # The frequency named is one the table prepares with, nothing filled.
    _, messages = user_warnings(lambda: prepare(table, "B"))
    assert not [m for m in messages if m.startswith("filled")]


def test_a_gap_in_daily_data_is_announced_without_naming_another_frequency():
    times = pd.date_range("2024-01-01", periods=60, freq="D").delete([20, 21])
    with pytest.warns(UserWarning, match=r"^filled 4 missing target steps") as caught:
        prepare(table_of(times), "D")
    assert not any("look recorded at" in str(w.message) for w in caught)


# ----------------------------------------------------------------- years as numbers


@pytest.mark.parametrize("dtype", ["int64", "int32", object])
def test_year_numbers_are_refused_naming_time_format_y_which_reads_them(dtype):
    years = pd.date_range("1950", periods=30, freq="YS")
    table = table_of(years).assign(time=lambda t: t["time"].dt.year.astype(dtype))
    # unit='s' read 1950 as 1970-01-01 00:32:30; an object column of ints was read as
    # nanoseconds since 1970 without a word.
    with pytest.raises(
        ValueError,
        match=r"column 'time' holds numbers \(\w+\), not timestamps; they look like years "
        r"\(e.g. 1950\): give time_format='%Y' \(--time-format\), with freq='YS'",
    ) as caught:
        prepare(table, "YS")
    assert "unit='s'" not in str(caught.value)
    dataset = prepare(table, "YS", time_format="%Y")
    assert pd.DatetimeIndex(dataset.frame["time"].unique()).equals(years)


def test_numbers_that_are_not_years_keep_the_seconds_and_digits_hints():
    table = table_of(pd.date_range("2024-01-01", periods=30, freq="D"))
    table["time"] = np.tile(np.arange(30), 2)
    with pytest.raises(ValueError, match=r"unit='s'\) for seconds since 1970.*'%Y%m%d'"):
        prepare(table, "D")


# ----------------------------------------------------------------- statics that change


def test_a_static_that_changes_is_named_with_its_values_and_the_time_of_the_change():
    times = pd.date_range("2024-01-01", periods=30, freq="D")
    table = table_of(times).assign(s=lambda t: np.where(t["id"] == "a", "big", "small"))
    table.loc[(table["id"] == "a") & (table["time"] >= times[17]), "s"] = "huge"
    table = table.iloc[::-1].reset_index(drop=True)  # the change is found in time order
    row = int(np.flatnonzero((table["s"] == "huge") & (table["time"] == times[17]))[0])
    with pytest.raises(
        ValueError,
        match=rf"static column 's' takes 2 different values within series 'a'; it is 'big' at "
        rf"2024-01-01 00:00:00, then 'huge' from 2024-01-18 00:00:00 \(row {row}\); .* "
        r"df\['s'\] = df.groupby\('id'\)\['s'\].transform\('first'\)",
    ):
        prepare(table, static_cols=["s"])


# ----------------------------------------------------- a naive future for an aware history


def test_a_naive_future_for_an_aware_history_is_told_the_line_that_localizes_it():
    zone = "America/New_York"
    times = pd.date_range("2024-10-01", periods=40, freq="D", tz=zone)
    history = table_of(times).assign(k=lambda t: np.arange(len(t)) % 2 * 1.0)
    dataset = prepare(history, known_cols=["k"])
    steps = pd.date_range(times[-1], periods=HORIZON + 1, freq="D")[1:]
    future = pd.DataFrame(
        [(s, t.strftime("%Y-%m-%d"), 1.0) for s in "ab" for t in steps], columns=["id", "time", "k"]
    )
    with pytest.raises(
        ValueError,
        match=r"future column 'time' must be timezone-aware like the history's .*; give them "
        r"that zone, e.g. future\['time'\] = pd.to_datetime\(future\['time'\]\)"
        r".dt.tz_localize\('America/New_York'\)",
    ) as caught:
        forecast_inputs(dataset.preprocessor, history, future)
    line = suggested(str(caught.value), "future['time']")
    future["time"] = eval(line, {"pd": pd, "future": future})  # the line as suggested
    result, _ = forecast_inputs(dataset.preprocessor, history, future)
    assert (result.last_times == times[-1]).all()


def test_an_aware_future_for_a_naive_history_is_told_the_line_that_makes_it_naive():
    times = pd.date_range("2024-10-01", periods=40, freq="D")
    history = table_of(times).assign(k=lambda t: np.arange(len(t)) % 2 * 1.0)
    dataset = prepare(history, known_cols=["k"])
    steps = pd.date_range(times[-1], periods=HORIZON + 1, freq="D", tz="UTC")[1:]
    future = pd.DataFrame([(s, t, 1.0) for s in "ab" for t in steps], columns=["id", "time", "k"])
    with pytest.raises(ValueError, match=r"must be timezone-naive like the history's") as caught:
        forecast_inputs(dataset.preprocessor, history, future)
    line = suggested(str(caught.value), "future['time']")
    assert line == "pd.to_datetime(future['time']).dt.tz_localize(None)"
    future["time"] = eval(line, {"pd": pd, "future": future})
    result, _ = forecast_inputs(dataset.preprocessor, history, future)
    assert (result.last_times == times[-1]).all()


# ----------------------------------------------------------------- numbered column labels


def test_names_given_as_text_for_numbered_labels_are_told_to_make_the_labels_text():
    table = table_of(pd.date_range("2024-01-01", periods=30, freq="D"))
    df = table.set_axis([0, 1, 2], axis=1)
    names = {"id_col": "0", "time_col": "1", "target": "2"}
    with pytest.raises(
        MissingColumnsError,
        match=r"table lacks columns \['0', '1', '2'\] .*; it has \[0, 1, 2\]; its labels are not "
        r"texts \('0' is named, the table has the int 0\): make them texts, e.g. "
        r"df.columns = df.columns.astype\(str\)",
    ) as caught:
        prepare_dataset(df, **names, freq="D", history=HISTORY, horizon=HORIZON)
    line = suggested(str(caught.value), "df.columns")
    df.columns = eval(line, {"df": df})  # the line as suggested
    assert len(prepare_dataset(df, **names, freq="D", history=HISTORY, horizon=HORIZON).train)
    # Labels that are texts already: no such hint.
    with pytest.raises(MissingColumnsError) as caught:
        prepare(table.rename(columns={"y": "sales"}))
    assert "astype(str)" not in str(caught.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"id_col": 0}, r"DataConfig.id_col must be a non-empty string, got 0; .* pass id_col='0'"),
        ({"static_cols": [3]}, r"DataConfig.static_cols must hold column names, got 3; .* pass "
         r"static_cols=\['3'\]"),
    ],
)  # fmt: skip
def test_a_data_config_given_column_numbers_says_how_to_name_numbered_columns(options, message):
    with pytest.raises(TypeError, match=message) as caught:
        DataConfig(**{**NAMES, **options})
    assert "df.columns = df.columns.astype(str)" in str(caught.value)
    with pytest.raises(TypeError) as caught:  # a frequency is no column: no such hint
        DataConfig(**{**NAMES, "freq": 1})
    assert "astype(str)" not in str(caught.value)


# ------------------------------------------------ time texts pandas infers no format for


def test_month_texts_are_announced_once_in_our_words_with_the_format_that_reads_them():
    months = pd.date_range("2020-01-01", periods=30, freq="MS")
    table = table_of(months.strftime("%b %Y"))
    dataset, messages = user_warnings(lambda: prepare(table, "MS"))
    assert not [m for m in messages if "Could not infer format" in m]  # pandas' own, held back
    ours = [m for m in messages if "no format pandas infers" in m]
    assert ours == [
        "column 'time' holds times in no format pandas infers (e.g. 'Jan 2020'), so each was "
        "read on its own (dateutil), slowly on a large table; pass time_format='%b %Y' "
        "(--time-format), which reads them all"
    ]
    assert pd.DatetimeIndex(dataset.frame["time"].unique()).equals(months)
    # The format named reads them alike, and nothing is announced.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = prepare(table, "MS", time_format="%b %Y")
    assert again.frame["time"].equals(dataset.frame["time"])


def test_quarter_texts_are_announced_with_the_conversion_that_reads_them():
    quarters = pd.date_range("2015-01-01", periods=30, freq="QS")
    table = table_of(quarters.to_period("Q").astype(str))
    assert table["time"].iloc[0] == "2015Q1"
    _, messages = user_warnings(lambda: prepare(table, "QS"))
    assert not [m for m in messages if "Could not infer format" in m]
    (ours,) = [m for m in messages if "no format pandas infers" in m]
    assert "e.g. '2015Q1'" in ours
    line = suggested(ours, "df['time']")
    assert line == "pd.PeriodIndex(df['time'], freq='Q').to_timestamp() (quarter starts, freq='QS')"
    df = table.copy()
    df["time"] = eval(line.split(" (")[0], {"pd": pd, "df": df})  # the line as suggested
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset = prepare(df, "QS")
    assert pd.DatetimeIndex(dataset.frame["time"].unique()).equals(quarters)


# ----------------------------------------------------------------- complex numbers


@pytest.mark.parametrize("where", ["target", "known"])
def test_complex_numbers_are_refused_by_column_not_cut_to_their_real_part(where):
    table = table_of(pd.date_range("2024-01-01", periods=30, freq="D"))
    column = "y" if where == "target" else "k"
    options = {} if where == "target" else {"known_cols": ["k"]}
    table[column] = (table["y"] + 1j) if where == "target" else np.ones(len(table)) + 2j
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy's ComplexWarning was the only word
        with pytest.raises(
            TypeError,
            match=rf"column '{column}' holds complex numbers \(dtype complex128\), e.g. .* in "
            r"series 'a' at row 0, time 2024-01-01 00:00:00; the model reads real numbers",
        ):
            prepare(table, **options)


def test_a_complex_number_among_numbers_of_an_object_column_is_named_where_it_is():
    table = table_of(pd.date_range("2024-01-01", periods=30, freq="D"))
    table["y"] = table["y"].astype(object)
    table.loc[33, "y"] = 3 + 4j
    with pytest.raises(
        TypeError,
        match=r"column 'y' holds complex numbers \(dtype object\), e.g. \(3\+4j\) in series 'b' "
        r"at row 33, time 2024-01-04 00:00:00",
    ):
        prepare(table)


# ------------------------------------------------------- weekly grids and finer data


def test_daily_data_given_weekly_freq_names_days_without_a_weekday_anchor():
    table = table_of(pd.date_range("2020-01-01", periods=60, freq="D"))  # from a Wednesday
    with pytest.raises(ValueError, match=r"off the freq='W' grid .*recorded at freq='D'") as caught:
        prepare(table, "W")
    assert "W-WED" not in str(caught.value) and "weeks recorded on" not in str(caught.value)


def test_weeks_on_another_weekday_still_name_the_anchor_to_pass():
    table = table_of(pd.date_range("2020-01-01", periods=30, freq="W-WED"))
    with pytest.raises(ValueError, match=r"for weeks recorded on Wednesdays pass freq='W-WED'"):
        prepare(table, "W")


# ------------------------------------------- monthly data stamped inside its periods


@pytest.mark.parametrize(
    ("freq", "step", "shift", "conversion"),
    [
        ("MS", "MS", pd.Timedelta(days=14), ".dt.to_period('M').dt.to_timestamp()"),
        ("QS", "QS", pd.Timedelta(days=40), ".dt.to_period('Q').dt.to_timestamp()"),
        ("YS", "YS", pd.Timedelta(days=100), ".dt.to_period('Y').dt.to_timestamp()"),
        ("ME", "ME", -pd.Timedelta(days=10),
         ".dt.to_period('M').dt.to_timestamp(how='end').dt.normalize()"),
    ],
)  # fmt: skip
def test_times_inside_their_periods_are_told_the_line_that_moves_them_onto_the_grid(
    freq, step, shift, conversion
):
    grid = pd.date_range("2001-01-01" if freq != "ME" else "2001-01-31", periods=30, freq=step)
    table = table_of(grid + shift)
    with pytest.raises(ValueError, match=rf"off the freq='{freq}' grid") as caught:
        prepare(table, freq)
    line = suggested(str(caught.value), "df['time']")
    assert line == f"df['time']{conversion}"
    df = table.copy()
    df["time"] = eval(line, {"df": df})  # the line as suggested
    dataset = prepare(df, freq)
    assert pd.DatetimeIndex(dataset.frame["time"].unique()).equals(grid)


def test_an_aware_table_is_told_to_move_its_times_in_its_own_zone():
    grid = pd.date_range("2020-01-01", periods=30, freq="MS", tz="Europe/Berlin")
    table = table_of(grid + pd.Timedelta(days=14))
    with pytest.raises(ValueError, match=r"off the freq='MS' grid") as caught:
        prepare(table, "MS")
    line = suggested(str(caught.value), "df['time']")
    df = table.copy()
    df["time"] = eval(line, {"df": df})
    assert pd.DatetimeIndex(prepare(df, "MS").frame["time"].unique()).equals(grid)


def test_two_times_in_one_month_are_not_told_to_move_to_its_start():
    # The 1st and the 15th of each month: moved to the month's start they would collide.
    starts = pd.date_range("2020-01-01", periods=20, freq="MS")
    times = starts.append(starts + pd.Timedelta(days=14)).sort_values()
    with pytest.raises(ValueError, match=r"off the freq='MS' grid") as caught:
        prepare(table_of(times), "MS")
    assert "to_period" not in str(caught.value)
