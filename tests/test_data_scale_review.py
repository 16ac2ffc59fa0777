"""Review of the data path at scale: the fast paths give what the straightforward code gave.

Each function that was rewritten to scale (one pass over the rows instead of
one per series, each distinct cell read once instead of every row) is compared
with a plain reference written the straightforward way on a small table with
the awkward cases: series out of order, empty cells, ids of mixed types,
values equal but written differently (1 and 1.0, 0.0 and -0.0). The
benchmark script `benchmarks.data_pipeline` runs once at its smallest size.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from benchmarks import common, data_pipeline
from tft_jax.data import prepare_dataset
from tft_jax.data.preprocessing import Preprocessor
from tft_jax.data.scaling import TargetScaler, _location_scale_checked
from tft_jax.data.tables import (
    MISSING_TEXTS,
    TableSpec,
    _categorical_values,
    _check_on_grid,
    missing_texts,
    plain_value,
    series_grid,
    to_regular_grid,
    validate_table,
)
from tft_jax.data.windows import Panel, window_starts

# ---------------------------------------------------------------------------
# The target scaler, per series


@pytest.mark.parametrize("method", ["standard", "robust", "mean_abs"])
def test_target_scaler_of_shuffled_rows_is_each_series_own_statistics(method):
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 5, 400)  # rows of the series interleaved, not sorted
    values = rng.gamma(2.0, 10.0, 400) * (codes + 1)
    values[rng.random(400) < 0.1] = np.nan
    values[codes == 3] = np.round(values[codes == 3] / 50.0)  # many ties: robust's fallback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = TargetScaler.fit(values, codes, 5, method)
    for code in range(5):
        mine = values[(codes == code) & ~np.isnan(values)]  # in row order
        loc, scale, _ = _location_scale_checked(mine, method)
        assert fitted.loc[code] == loc and fitted.scale[code] == scale
    if method == "standard":  # and an independent float64 reference
        mine = values[(codes == 2) & ~np.isnan(values)]
        np.testing.assert_allclose(
            [fitted.loc[2], fitted.scale[2]], [mine.mean(), mine.std()], rtol=1e-12
        )


def test_target_scaler_names_a_series_without_values_among_unsorted_codes():
    codes = np.array([2, 0, 2, 0])
    with pytest.raises(ValueError, match="series 'b' has no observed target"):
        TargetScaler.fit(np.array([1.0, 2.0, 3.0, 4.0]), codes, 3, series_names=["a", "b", "c"])


def test_new_series_scalers_are_fitted_on_their_rows_before_the_cut():
    rng = np.random.default_rng(1)
    times = pd.date_range("2024-01-01", periods=40, freq="D")
    table = pd.concat(
        [
            pd.DataFrame({"id": series, "time": times, "y": rng.normal(10 * k, k + 1, 40)})
            for k, series in enumerate(["a", "b", "c", "d"])
        ],
        ignore_index=True,
    )
    table.loc[(table["id"] == "d") & (table["time"] < times[25]), "y"] = np.nan  # none early
    train = table[table["id"].isin(["a", "b"])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = prepare_dataset(
            train, id_col="id", time_col="time", target="y", freq="D", history=5,
            horizon=2, max_missing_fraction=1.0,
        ).preprocessor  # fmt: skip
        grid = table.assign(y_missing=table["y"].isna().astype(float))
        grid["y"] = grid.groupby("id")["y"].ffill()
        cuts = (times[20], times[30])
        scaler = fitted.transform(grid, cuts).target_scaler
    for code, series in enumerate(["a", "b", "c", "d"]):
        if series in ("a", "b"):
            assert scaler.loc[code] == fitted.target_scaler.loc[code]
            continue
        rows = (table["id"] == series).to_numpy() & table["y"].notna().to_numpy()
        for cut in cuts:  # the first cut under which the series has a value
            values = table["y"].to_numpy()[rows & (table["time"] < cut).to_numpy()]
            if values.size:
                break
        loc, scale, _ = _location_scale_checked(values, "standard")
        assert scaler.loc[code] == loc and scaler.scale[code] == scale
    assert scaler.loc[3] == np.mean(table.loc[(table["id"] == "d") & (table["time"] >= times[25])
                                              & (table["time"] < times[30]), "y"])  # fmt: skip


# ---------------------------------------------------------------------------
# Window starts with a stride


def strided_reference(panel: Panel, candidates: np.ndarray, stride: int) -> np.ndarray:
    """Every `stride`-th candidate of each series, from its first: one mask per series."""
    code = panel.series_code
    keep = np.zeros(candidates.shape[0], dtype=bool)
    for series in np.unique(code[candidates]):
        (positions,) = np.nonzero(code[candidates] == series)
        keep[positions[::stride]] = True
    return candidates[keep]


def small_panel() -> Panel:
    """Three series of 23, 9 and 31 rows; a few filled target steps."""
    lengths = np.array([23, 9, 31])
    rows = int(lengths.sum())
    code = np.repeat(np.arange(3), lengths).astype(np.int32)
    times = pd.DatetimeIndex(
        np.concatenate([pd.date_range("2024-01-01", periods=n, freq="h") for n in lengths])
    )
    mask = np.ones(rows, np.float32)
    mask[[5, 40, 41, 60]] = 0.0
    return Panel(
        series_code=code, times=times, observed=np.zeros((rows, 1), np.float32),
        known=np.zeros((rows, 0), np.float32), target=np.zeros(rows, np.float32),
        target_mask=mask, static=np.zeros((3, 0), np.float32),
        series_start=np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64),
        series_length=lengths.astype(np.int64),
    )  # fmt: skip


@pytest.mark.parametrize("stride", [2, 3, 5, 50])
def test_strided_window_starts_are_every_strideth_window_of_each_series(stride):
    panel = small_panel()
    begin, end = pd.Timestamp("2024-01-01 03:00"), pd.Timestamp("2024-01-02 05:00")
    every = window_starts(panel, 4, 2, begin, end)
    assert np.unique(panel.series_code[every]).size == 3
    strided = window_starts(panel, 4, 2, begin, end, stride)
    np.testing.assert_array_equal(strided, strided_reference(panel, every, stride))
    empty = window_starts(panel, 4, 2, end, end + pd.Timedelta("1h"), stride)
    assert empty.shape == (0,) and empty.dtype == np.int64


# ---------------------------------------------------------------------------
# Text cells: missing-value texts, categorical values, vocabularies and codes


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


def encode_reference(vocabulary, values: pd.Series) -> tuple[np.ndarray, dict]:
    """Codes and the unseen values (`repr -> value`) of each cell looked up alone."""
    position = {value: code for code, value in enumerate(vocabulary)}
    codes = np.array(
        [position.get(plain_value(v), len(vocabulary)) for v in values], dtype=np.int32
    )
    unseen = {}
    for value, code in zip(values, codes, strict=True):
        if code == len(vocabulary) and not pd.isna(value):
            unseen.setdefault(repr(plain_value(value)), plain_value(value))
    return codes, unseen


@pytest.mark.parametrize(
    "values",
    [
        pd.Series(["a", "zz", None, "b", "a", "zz", np.str_("q")], dtype=object),
        pd.Series([1, 4, None, 2, np.int64(4), 1], dtype=object),
        pd.Series([1, 1.0, "1", 3, None], dtype=object),
        pd.Series(["b", pd.NA, "c"], dtype="string"),
        pd.Series([None, None], dtype=object),
    ],
)
def test_encode_codes_and_warning_are_each_cell_looked_up_alone(values):
    vocabulary = ("a", "b") if values.map(type).eq(str).any() else (1, 2)
    preprocessor = Preprocessor(
        spec=None, series_ids=("s",), origin=pd.Timestamp("2024-01-01"), train_steps=1.0,
        target_scaler=None, feature_scaler=None, vocabularies={"c": vocabulary},
    )  # fmt: skip
    want_codes, unseen = encode_reference(vocabulary, values)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        codes = preprocessor.encode("c", values)
    np.testing.assert_array_equal(codes, want_codes)
    assert codes.dtype == np.int32
    messages = [str(w.message) for w in caught]
    if unseen:
        (message,) = messages
        assert f"[{', '.join(sorted(unseen))}]" in message
    else:
        assert messages == []


def test_vocabularies_are_the_sorted_distinct_training_values():
    times = pd.date_range("2024-01-01", periods=30, freq="D")
    table = pd.concat(
        [
            pd.DataFrame({"id": s, "time": times, "y": np.arange(30.0) + k,
                          "promo": np.where(np.arange(30) % (k + 2) == 0, "on", "off"),
                          "code": (np.arange(30) + k) % 4})
            for k, s in enumerate(["a", "b"])
        ],
        ignore_index=True,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = prepare_dataset(
            table, id_col="id", time_col="time", target="y", freq="D", history=4, horizon=2,
            known_cols=["promo", "code"], categorical_cols=["code"],
        )  # fmt: skip
    train = table[table["time"] < dataset.validation_start]
    vocabularies = dataset.preprocessor.vocabularies
    assert vocabularies == {"code": (0, 1, 2, 3), "promo": ("off", "on")}
    assert vocabularies["code"] == tuple(sorted(set(train["code"].tolist())))
    assert all(type(v) is int for v in vocabularies["code"])


# ---------------------------------------------------------------------------
# The benchmark script


def test_data_pipeline_benchmark_writes_one_record_per_stage(capsys):
    records = data_pipeline.main(["--size", "tiny", "--json", "--batches", "2"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines == records
    assert [r["stage"] for r in records] == [*data_pipeline.STAGES, data_pipeline.TOTAL]
    tiny = data_pipeline.SIZES["tiny"]
    table = data_pipeline.make_table(tiny.series, tiny.rows, tiny.freq)
    for record in records:
        common.validate_record(record, data_pipeline.REQUIRED_FIELDS)
        assert record["benchmark"] == "data_pipeline" and record["config"] == "tiny:6x200"
        assert record["table_rows"] == len(table) and record["median_s"] > 0
    assert all(r["peak_bytes"] > 0 for r in records[:-1]) and records[-1]["peak_bytes"] is None


def test_data_pipeline_benchmark_refuses_rows_shorter_than_a_window(capsys):
    with pytest.raises(SystemExit):
        data_pipeline.main(["--size", "tiny", "--rows", "10"])
    assert "--rows" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# The regular grid


def grid_reference(clean: pd.DataFrame, spec: TableSpec, missing_col: str) -> pd.DataFrame:
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
    filled = [spec.target, *spec.known_cols, *spec.observed_cols]
    grid[filled] = grid.groupby(spec.id_col, sort=False)[filled].ffill()
    if spec.known_cols:
        known = list(spec.known_cols)
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
    pd.testing.assert_frame_equal(
        to_regular_grid(clean, spec, "y_missing"), grid_reference(clean, spec, "y_missing")
    )
    # Not sorted by time: every grid was empty, silently; now refused, naming the series.
    unsorted = clean.iloc[::-1].reset_index(drop=True)
    last = unsorted.iloc[0]
    with pytest.raises(ValueError, match=rf"series {plain_value(last['id'])!r} has .* after "):
        to_regular_grid(unsorted, spec, "y_missing")


def test_a_time_off_the_grid_is_named_in_its_series():
    table = gappy_table("h", ["a", "b"])
    table.loc[table.index[-2], "time"] += pd.Timedelta("30min")
    spec = TableSpec(id_col="id", time_col="time", target="y", freq="h")
    with pytest.raises(ValueError, match=r"series 'b' has 1 timestamps off the freq='h' grid"):
        validate_table(table, spec, 2, 1)


def test_transform_of_a_grid_out_of_series_order_is_that_of_the_sorted_grid():
    times = pd.date_range("2024-01-01", periods=20, freq="D")
    table = pd.concat(
        [pd.DataFrame({"id": s, "time": times, "y": np.arange(20.0) * (k + 1)})
         for k, s in enumerate(["b", "a", "c"])],
        ignore_index=True,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = prepare_dataset(
            table, id_col="id", time_col="time", target="y", freq="D", history=4, horizon=2
        )
    grid = table.assign(y_missing=0.0)
    in_order = dataset.preprocessor.transform(grid.sort_values(["id", "time"], kind="stable"))
    shuffled = dataset.preprocessor.transform(grid)  # series 'b' first
    pd.testing.assert_frame_equal(shuffled.frame, in_order.frame)
    for name in ("series_code", "observed", "known", "target", "series_start"):
        np.testing.assert_array_equal(getattr(shuffled.panel, name), getattr(in_order.panel, name))
    assert shuffled.series_ids == ("a", "b", "c")


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
