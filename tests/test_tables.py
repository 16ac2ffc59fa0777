"""`tft_jax.data.tables`: reading and validating a long table, and its regular grid.

The fast paths (one pass over the rows, each distinct cell read once) equal plain
references written the straightforward way on small tables with the awkward cases:
series out of order, empty cells, ids of mixed types, values equal but written
differently (1 and 1.0, 0.0 and -0.0). Errors name series as written, and time columns
of periods, digits or repeated local hours are refused with the conversion to use.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data.tables import (
    MISSING_TEXTS,
    MissingColumnsError,
    TableSpec,
    _categorical_values,
    _check_on_grid,
    ids_as_categories,
    missing_texts,
    plain_value,
    read_table,
    series_grid,
    to_regular_grid,
    typical_step,
    validate_table,
)

from .prepared_tables import HISTORY, HORIZON, daily_pair, prepare


def missing_texts_reference(frame: pd.DataFrame, columns, categorical=()):
    """`missing_texts` reading every cell on its own."""
    counts = {}
    frame = frame.copy()
    for column in columns:
        values = frame[column]
        if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            continue
        present = values.notna().to_numpy()
        hits = np.array(
            [
                ok and str(v).strip().lower() in MISSING_TEXTS
                for v, ok in zip(values, present, strict=True)
            ],
            dtype=bool,
        )
        rest = values[~hits & present]
        if column in categorical and rest.empty:
            continue
        if hits.any() and pd.to_numeric(rest, errors="coerce").notna().all():
            frame.loc[hits, column] = np.nan
            counts[column] = int(hits.sum())
    return frame, counts


def text_table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "reading": ["1.5", " N/A ", "2", "n/a", None, "-", "3e2", "2"],
            "shop": ["007", "NA", "7", "na", "007", None, "x", "NA"],
            "only": ["none", "None", None, "none", "none", "none", "none", "none"],
            "mixed": [1, "?", 1.0, "null", True, 2, "2", None],
            "typed": pd.array(["4", "NaN", "5", pd.NA, "4", " -", "6", "4"], dtype="string"),
            "kind": pd.Categorical(["1", "n/a", "2", "1", None, "2", "1", "n/a"]),
            "count": np.arange(8.0),
        }
    )


def test_missing_texts_reads_each_cell_as_the_cell_by_cell_reference():
    table = text_table()
    columns = list(table.columns)
    got, counts = missing_texts(table, columns, ["only", "shop"])
    want, want_counts = missing_texts_reference(table, columns, ["only", "shop"])
    pd.testing.assert_frame_equal(got, want)
    assert counts == want_counts and set(counts) == {"reading", "mixed", "typed", "kind"}


def categorical_reference(values: pd.Series) -> list:
    """`_categorical_values` converting every cell on its own."""
    present = values.notna().to_numpy()
    if isinstance(values.dtype, pd.CategoricalDtype) and pd.api.types.is_numeric_dtype(
        values.cat.categories
    ):
        values = values.astype("float64")
    if pd.api.types.is_bool_dtype(values) or pd.api.types.is_numeric_dtype(values):
        return [
            int(v) if ok else None for v, ok in zip(values.astype("float64"), present, strict=True)
        ]
    return [str(v) if ok else None for v, ok in zip(values, present, strict=True)]


@pytest.mark.parametrize(
    "values",
    [
        pd.Series([3.0, np.nan, 1.0, 3.0, -0.0, 0.0, 2.0**60]),
        pd.Series([3, 1, 3, 7], dtype="int64"),
        pd.Series([True, False, True]),
        pd.Series(["b", None, "a", np.str_("b"), np.nan, "a"], dtype=object),
        pd.Series([1, 1.0, "1", None, 1], dtype=object),  # equal, written differently
        pd.Series([0.0, -0.0, None, 2.5], dtype=object),  # 0.0 == -0.0, text '0.0', '-0.0'
        pd.Series([5, np.int64(5), 12, None], dtype=object),
        pd.Series(["x", pd.NA, "y", "x"], dtype="string"),
        pd.Series(pd.Categorical(["lo", "hi", None, "lo"])),
        pd.Series(pd.Categorical(["01", "1", None, "01"], categories=["1", "unused", "01"])),
        pd.Series(pd.Categorical([2, 1, None, 2])),
        pd.Series([None, np.nan], dtype=object),
    ],
)
def test_categorical_values_are_each_cell_converted_alone(values):
    got = _categorical_values(values, "c", pd.Series(["s"] * len(values)))
    want = categorical_reference(values)
    assert list(got) == want
    assert [type(v) for v in got] == [type(v) for v in want]
    assert got.dtype == object and got.index.equals(values.index)


def grid_reference(
    clean: pd.DataFrame, spec: TableSpec, missing_col: str, fill_categoricals: bool
) -> pd.DataFrame:
    """`to_regular_grid` with one `date_range` per series and groups by the id column."""
    grids = [
        series_grid(pd.DatetimeIndex(group[spec.time_col]), spec.freq)
        for _, group in clean.groupby(spec.id_col, sort=False)
    ]
    series = clean[spec.id_col].drop_duplicates().to_numpy()
    index = pd.MultiIndex.from_arrays(
        [np.repeat(series, [len(grid) for grid in grids]), grids[0].append(grids[1:])],
        names=[spec.id_col, spec.time_col],
    )
    grid = clean.set_index([spec.id_col, spec.time_col]).reindex(index).reset_index()
    grid[missing_col] = grid[spec.target].isna().astype("float64")
    inputs = [*spec.known_cols, *spec.observed_cols]
    if not fill_categoricals:
        inputs = [column for column in inputs if column not in spec.categorical_cols]
    filled = [spec.target, *inputs]
    grid[filled] = grid.groupby(spec.id_col, sort=False)[filled].ffill()
    known = [column for column in spec.known_cols if column in inputs]
    if known:
        grid[known] = grid.groupby(spec.id_col, sort=False)[known].bfill()
    for column in spec.static_cols:
        grid[column] = grid.groupby(spec.id_col, sort=False)[column].transform("first")
    return grid


def gappy_table(freq: str, ids, tz=None, unit: str = "us", periods: int = 14) -> pd.DataFrame:
    """Series of `ids` starting at different times, rows dropped, empty cells, a text static."""
    rng = np.random.default_rng(2)
    parts = []
    for k, series in enumerate(ids):
        times = pd.date_range("2024-03-28", periods=periods, freq=freq, tz=tz, unit=unit)[k:]
        n = len(times)
        part = pd.DataFrame(
            {"id": series, "time": times, "y": rng.normal(size=n), "k": rng.normal(size=n),
             "o": rng.normal(size=n), "s": f"type{k % 2}",
             "c": np.where(np.arange(n) % 3 == 0, "a", "b").astype(object)}
        )  # fmt: skip
        part.loc[[2, 3], ["y", "k", "o", "c"]] = [np.nan, np.nan, np.nan, None]
        if k == 1:  # leading empty cells: known ones back-filled, observed ones left empty
            part.loc[0, ["k", "o"]] = np.nan
        parts.append(part.drop(index=[5, 6 + k % 2]))
    return pd.concat(parts, ignore_index=True)


GRID_CASES = {
    "hourly text ids": ("h", ["b", "a", "c"], None, "us"),
    "daily int ids": ("D", [30, 7, 12], None, "us"),
    "15min in seconds": ("15min", ["x", "y"], None, "s"),
    "hourly aware": ("h", ["a", "b"], "Europe/Berlin", "us"),  # across a DST change
    "daily aware": ("D", ["a", "b"], "Europe/Berlin", "us"),
    "month starts": ("MS", ["a", "b"], None, "us"),
}


@pytest.mark.parametrize("case", list(GRID_CASES))
def test_regular_grid_is_the_per_series_date_range_reference(case):
    freq, ids, tz, unit = GRID_CASES[case]
    spec = TableSpec(id_col="id", time_col="time", target="y", freq=freq, static_cols=("s",),
                     known_cols=("k", "c"), observed_cols=("o",),
                     categorical_cols=("c", "s"))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clean = validate_table(gappy_table(freq, ids, tz, unit), spec, 2, 1)
    lengths = _check_on_grid(clean, spec)
    want = {
        series: len(series_grid(pd.DatetimeIndex(group["time"]), freq))
        for series, group in clean.groupby("id", sort=False)
    }
    assert list(lengths.items()) == list(want.items())
    assert [type(s) for s in lengths] == [type(s) for s in want]  # 7, not np.int64(7)
    for fill in (False, True):
        pd.testing.assert_frame_equal(
            to_regular_grid(clean, spec, "y_missing", fill_categoricals=fill),
            grid_reference(clean, spec, "y_missing", fill),
        )
    assert to_regular_grid(clean, spec, "y_missing")["c"].isna().sum() > 0  # left empty
    # Not sorted by time: every grid was empty, silently; now refused, naming the series.
    unsorted = clean.iloc[::-1].reset_index(drop=True)
    last = unsorted.iloc[0]
    with pytest.raises(ValueError, match=rf"series {plain_value(last['id'])!r} has .* after "):
        to_regular_grid(unsorted, spec, "y_missing")


def test_the_regular_grid_equals_a_pandas_reindex_with_fills_and_flags():
    spec = TableSpec(
        id_col="id", time_col="time", target="y", static_cols=("s",), known_cols=("k", "c"),
        observed_cols=("o",), freq="D", categorical_cols=("c",),
    )  # fmt: skip
    rng = np.random.default_rng(0)
    parts = []
    for series, start, length in (("a", "2024-02-25", 12), ("b", "2024-02-27", 9)):
        keep = rng.random(length) > 0.3
        keep[[0, -1]] = True
        part = pd.DataFrame(
            {
                "id": series,
                "time": pd.date_range(start, periods=length, freq="D"),
                "y": rng.normal(size=length),
                "s": 1.0 if series == "a" else 2.0,
                "k": rng.normal(size=length),
                "c": rng.choice(["p", "q"], length),
                "o": rng.normal(size=length),
            }
        )[keep]
        part.loc[part.index[:2], "k"] = np.nan  # leading empty known cells: back-filled
        part.loc[part.index[1], "y"] = np.nan  # an empty target cell: filled and flagged
        part.loc[part.index[2], "c"] = None
        parts.append(part)
    table = pd.concat(parts).sample(frac=1.0, random_state=1)
    # Categoricals filled as the real columns (runs saved before 0.2.0.dev3).
    grid = to_regular_grid(validate_table(table, spec, 2, 1), spec, "missing", True)
    expected = []
    for series, rows in table.groupby("id"):
        rows = rows.set_index("time").sort_index()
        full = rows.reindex(pd.date_range(rows.index.min(), rows.index.max(), freq="D"))
        full["missing"] = full["y"].isna().astype(float)
        for column in ("y", "k", "c", "o"):
            full[column] = full[column].ffill().bfill()
        full["s"], full["id"] = rows["s"].iloc[0], series
        expected.append(full.rename_axis("time").reset_index())
    expected = pd.concat(expected, ignore_index=True)[grid.columns]
    pd.testing.assert_frame_equal(grid, expected, check_dtype=False)


def test_a_time_off_the_grid_is_named_in_its_series():
    table = gappy_table("h", ["a", "b"])
    table.loc[table.index[-2], "time"] += pd.Timedelta("30min")
    spec = TableSpec(id_col="id", time_col="time", target="y", freq="h")
    with pytest.raises(ValueError, match=r"series 'b' has 1 timestamps off the freq='h' grid"):
        validate_table(table, spec, 2, 1)


@pytest.mark.parametrize("ids", [["b", "c", "a"], [20, 30, 10]])
def test_a_series_with_an_empty_column_is_named_among_others(ids):
    table = gappy_table("h", ids)
    table.loc[table["id"] == ids[1], "k"] = np.nan
    spec = TableSpec(id_col="id", time_col="time", target="y", freq="h", known_cols=("k",))
    with pytest.raises(
        ValueError, match=rf"column 'k' has no values at all for series {ids[1]!r};"
    ):
        validate_table(table, spec, 2, 1)


def test_a_time_off_the_grid_names_a_nullable_integer_series_plainly():
    # The series was shown by its bare repr: `np.int64(7)` for an Int64 id column.
    table = pd.DataFrame(
        {
            "id": pd.array([7, 7, 7, 8, 8, 8], dtype="Int64"),
            "time": pd.to_datetime(["2024-01-01 00:00", "2024-01-01 01:00", "2024-01-01 02:30"] * 2)
            + pd.to_timedelta([0, 0, 0, 0, 0, -30], unit="min"),
            "y": np.arange(6.0),
        }
    )
    spec = TableSpec(id_col="id", time_col="time", target="y", freq="h")
    with pytest.raises(ValueError, match=r"^series 7 has 1 timestamps off the freq='h' grid"):
        validate_table(table, spec, 1, 1)


def integer_id_table() -> pd.DataFrame:
    times = pd.date_range("2021-01-01", periods=12, freq="h")
    return pd.concat(
        [pd.DataFrame({"id": series, "time": times, "y": np.arange(12.0), "s": 1.0})
         for series in (7, 8)],
        ignore_index=True,
    )  # fmt: skip


def _text_target(table: pd.DataFrame) -> pd.DataFrame:
    table["y"] = table["y"].astype(object)
    table.loc[3, "y"] = "x"
    return table


def _infinite_target(table: pd.DataFrame) -> pd.DataFrame:
    table.loc[3, "y"] = np.inf
    return table


def _bad_time(table: pd.DataFrame) -> pd.DataFrame:
    table["time"] = table["time"].astype(object)
    table.loc[3, "time"] = "soon"
    return table


def _varying_static(table: pd.DataFrame) -> pd.DataFrame:
    table.loc[3, "s"] = 2.0
    return table


def _duplicate_row(table: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([table, table.iloc[[3]]], ignore_index=True)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_text_target, r"'x' in series 7 at row 3"),
        (_infinite_target, r"infinite values, the first in series 7 at row 3"),
        (_bad_time, r"'soon' in series 7 at row 3"),
        (_varying_static, r"within series 7;"),
        (_duplicate_row, r"repeat a \('id', 'time'\) pair, e.g. series 7 at 2021-01-01 03:00"),
    ],
)
def test_table_errors_name_integer_ids_as_written_not_as_numpy_scalars(edit, message):
    spec = TableSpec(id_col="id", time_col="time", target="y", static_cols=("s",), freq="h")
    with pytest.raises(ValueError, match=message) as caught:
        validate_table(edit(integer_id_table()), spec, HISTORY, HORIZON)
    assert "np.int64" not in str(caught.value)


def test_a_period_time_column_is_refused_with_the_conversion_to_use():
    table = daily_pair().assign(time=lambda t: t["time"].dt.to_period("D"))
    with pytest.raises(
        ValueError, match=r"column 'time' holds periods \(period\[D\]\).*to_timestamp"
    ):
        prepare(table)


def test_dates_written_as_digits_are_read_by_the_time_format_given():
    days = pd.date_range("2024-01-25", periods=20, freq="D")
    table = pd.DataFrame({"id": "a", "time": days, "y": np.arange(20.0)})
    digits = table.assign(time=days.strftime("%Y%m%d").astype(np.int64))  # as read_csv reads them
    assert digits["time"].iloc[0] == 20240125
    expected = prepare(table).train.panel.times
    got = prepare(digits, time_format="%Y%m%d").train.panel.times
    assert got.equals(expected)
    # Without a format the numbers are refused, with both readings offered (unit='s'
    # alone made 20240125 into 1970-08-23).
    with pytest.raises(ValueError, match=r"holds numbers \(int64\).*time_format='%Y%m%d'"):
        prepare(digits)


def test_naive_local_times_repeating_the_dst_hour_are_told_how_to_localize():
    # Berlin's clocks went back at 03:00 on 2024-10-27: naive local times hold 02:00 twice.
    local = pd.date_range("2024-10-26 20:00", periods=12, freq="h", tz="Europe/Berlin")
    table = pd.DataFrame({"id": "a", "time": local.tz_localize(None), "y": np.arange(12.0)})
    with pytest.raises(
        ValueError, match=r"2 rows repeat .* at 2024-10-27 02:00:00.*ambiguous='infer'"
    ):
        prepare(table, "h")
    # The advice works: localized, the table is prepared with every hour once.
    table["time"] = table["time"].dt.tz_localize("Europe/Berlin", ambiguous="infer")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset = prepare(
            table, "h", timezone="Europe/Berlin", validation_fraction=0.0, test_fraction=0.0
        )
    assert len(dataset.frame) == 12


def test_a_dataframe_read_with_the_wrong_separator_is_named_in_the_missing_columns_error():
    frame = pd.DataFrame({"store;date;sales": ["a;2024-01-01;1.0"]})
    with pytest.raises(ValueError, match=r"looks separated by ';'.*sep=';'"):
        validate_table(frame, TableSpec("store", "date", "sales"), history=2, horizon=1)


def test_a_one_column_csv_with_the_id_column_or_no_id_column_is_read_as_it_is(tmp_path):
    # Only a table that lacks its id column is taken for a wrongly separated one.
    csv = tmp_path / "notes.csv"
    csv.write_text("note;text\nsee;below\n")
    assert list(read_table(csv).columns) == ["note;text"]
    assert list(read_table(csv, id_col="note;text").columns) == ["note;text"]


def _written_with(numbers: np.ndarray, option: str) -> list[str]:
    """`numbers` as a spreadsheet in another locale writes them for the read_csv `option`."""
    if option == "decimal=','":
        return [f"{v:.1f}".replace(".", ",") for v in numbers]
    if option == "thousands=','":
        return [f"{v:,.2f}" for v in numbers]
    return [f"{v:,.2f}".replace(",", " ").replace(".", ",").replace(" ", ".") for v in numbers]


@pytest.mark.parametrize("option", ["decimal=','", "thousands=','", "decimal=',', thousands='.'"])
def test_an_input_of_numbers_written_with_separators_is_refused_with_the_read_that_parses_it(
    tmp_path, option
):
    # Texts '12,5' or '1,234.56' are no numbers to pandas: the column was taken for one of
    # categories, a category per row.
    table = daily_pair()
    numbers = np.round(np.random.default_rng(0).uniform(1000, 5000, len(table)), 1)
    table["o"] = _written_with(numbers, option)
    table.loc[5, "o"] = "n/a"  # a missing-value text does not hide the numbers
    path = tmp_path / "table.csv"
    table.to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"column 'o' holds numbers written with") as caught:
        prepare(str(path), observed_cols=("o",))
    message = str(caught.value)
    assert f"e.g. {table['o'].iloc[0]!r} in series 'a' at row 0" in message
    assert "categorical_cols" in message
    # The reading the message names gives the numbers back (pandas, not this code, parses).
    named = message.split("pandas.read_csv(path, ")[1].split(")")[0]
    assert named == option
    kwargs = dict(item.split("=") for item in named.split(", "))
    read = pd.read_csv(path, **{key: value.strip("'") for key, value in kwargs.items()})
    present = np.arange(len(table)) != 5
    np.testing.assert_allclose(read["o"].to_numpy(dtype=float)[present], numbers[present])
    # Listed as categorical, the column is the user's: read as categories (a category
    # per row, so the later splits' are unseen), its 'n/a' one of them, announced.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = prepare(str(path), observed_cols=("o",), categorical_cols=("o",))
    messages = [str(warning.message) for warning in caught]
    assert any("categorical column 'o' has values not seen" in m for m in messages), messages
    assert any("column 'o' holds 'n/a' in 1 row, read as a category" in m for m in messages)
    assert dataset.spec.categorical_cols == ("o",)


def test_numbers_with_separators_in_a_table_without_its_id_column_name_the_missing_column():
    # The refusal read the id column to name the series: a KeyError 'id' replaced the
    # missing-columns error.
    table = daily_pair().drop(columns="id").assign(o=["1,5", "2,5"] * (len(daily_pair()) // 2))
    with pytest.raises(MissingColumnsError, match=r"lacks columns \['id'\]"):
        prepare(table, observed_cols=("o",))


def test_a_target_of_decimal_comma_texts_is_refused_with_the_decimal_hint():
    table = daily_pair().astype({"y": object})
    table.loc[4, "y"] = " 12,5 "
    with pytest.raises(
        ValueError,
        match=r"'y' has 1 non-numeric values, e.g. ' 12,5 ' in series 'a' at row 4, time "
        r"2024-01-05 00:00:00;.*"
        r"decimal commas: read the CSV with pandas.read_csv\(path, decimal=','\)",
    ):
        prepare(table)


@pytest.mark.parametrize("unit", ["us", "ns"])
def test_an_input_column_of_datetimes_is_refused_not_read_as_counts_of_its_unit(unit):
    # A known column of dates became a real input of 1.7e15 (us) or 1.7e18 (ns), silently.
    table = daily_pair()
    table = table.assign(k=table["time"].astype(f"datetime64[{unit}]"))
    with pytest.raises(
        ValueError, match=rf"column 'k' holds datetimes \(dtype datetime64\[{unit}\]\), not numbers"
    ):
        prepare(table, known_cols=("k",))
    spans = table.assign(k=table["time"] - table["time"].min())
    with pytest.raises(ValueError, match=r"holds time spans .*df\['k'\].dt.days"):
        prepare(spans, known_cols=("k",))
    tz = table.assign(k=table["time"].dt.tz_localize("UTC"))
    with pytest.raises(ValueError, match=r"column 'k' holds datetimes \(dtype datetime64\[.*UTC\]"):
        prepare(tz, static_cols=(), known_cols=("k",))


def test_a_stray_bool_among_target_numbers_is_refused_but_a_column_of_bools_is_read():
    # True among numbers (an object column) was read as 1.0, a value no one wrote.
    table = daily_pair().astype({"y": object})
    table.loc[33, "y"] = True
    with pytest.raises(ValueError, match=r"'y' has 1 non-numeric values, e.g. True in series 'b'"):
        prepare(table)
    # A 0/1 column of bools with empty cells (hence of objects) holds numbers.
    flags = pd.Series([v % 3 == 0 for v in range(60)], dtype=object)
    flags[7] = None
    table = daily_pair().assign(k=flags)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the filled cell is announced
        dataset = prepare(table, known_cols=("k",))
    assert "k" not in dataset.spec.categorical_cols


def test_text_ids_become_categories_for_the_groupings_and_other_ids_stay_as_given():
    table = pd.DataFrame({"id": ["b", "a", "b"], "y": [1.0, 2.0, 3.0]})
    coded = ids_as_categories(table, "id")
    assert isinstance(coded["id"].dtype, pd.CategoricalDtype)
    assert coded["id"].tolist() == ["b", "a", "b"]
    assert table["id"].dtype != coded["id"].dtype  # the caller's table is not changed
    mixed = pd.DataFrame({"id": pd.Series(["7", 7], dtype=object), "y": [1.0, 2.0]})
    numbers = pd.DataFrame({"id": [7, 8], "y": [1.0, 2.0]})
    for kept in (mixed, numbers):  # mixed types are validate_table's to refuse
        assert ids_as_categories(kept, "id") is kept
    assert ids_as_categories(table, "store") is table  # no such column: the check names it


@pytest.mark.parametrize(
    ("freq", "days"),
    [
        ("h", 1 / 24),
        ("D", 1),
        ("W", 7),
        ("MS", 28),  # the docstring's example: February 2001's 28 days
        ("QS", 91),  # April to July 2001: 30 + 31 + 30
        ("YS", 365),
    ],
)
def test_typical_step_is_the_usual_length_of_one_step(freq, days):
    assert typical_step(freq) == pd.Timedelta(days=days)
