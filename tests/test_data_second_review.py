"""Second review of the data path: windows, grids, calendar and the future table against
independent pandas / NumPy / `datetime` computations, and the messages of bad inputs."""

from __future__ import annotations

import math
import warnings
import zoneinfo

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import (
    TableSpec,
    calendar_features,
    prepare_dataset,
    steps_since,
    to_regular_grid,
    validate_table,
    window_starts,
)
from tft_jax.data.future import future_windows

HISTORY, HORIZON = 4, 2


def quiet_prepare(table: pd.DataFrame, **options):
    """`prepare_dataset` with its announcements (filled steps) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return prepare_dataset(table, id_col="id", time_col="time", target="y", **options)


def ragged_table(freq: str, seed: int) -> pd.DataFrame:
    """Three series of `freq` with other start times, lengths and a few missing rows."""
    rng = np.random.default_rng(seed)
    offset = pd.tseries.frequencies.to_offset(freq)
    base = offset.rollforward(pd.Timestamp("2020-01-06"))
    parts = []
    for series in range(3):
        length = int(rng.integers(18, 40))
        times = pd.date_range(base + int(rng.integers(0, 8)) * offset, periods=length, freq=freq)
        keep = np.ones(length, dtype=bool)
        keep[rng.choice(np.arange(1, length - 1), size=2, replace=False)] = False
        values = 5.0 + rng.normal(size=length)
        parts.append(pd.DataFrame({"id": f"s{series}", "time": times, "y": values})[keep])
    return pd.concat(parts, ignore_index=True)


def brute_force_starts(table, freq, begin, end, stride, observed_only):
    """Per series, the first forecast time of every window whose horizon lies in [begin, end)."""
    found = {}
    for series, rows in table.groupby("id", sort=True):
        grid = pd.date_range(rows["time"].min(), rows["time"].max(), freq=freq)
        observed = grid.isin(pd.DatetimeIndex(rows["time"]))
        starts = [
            grid[i]
            for i in range(HISTORY, len(grid) - HORIZON + 1)
            if grid[i] >= begin
            and grid[i + HORIZON - 1] < end
            and (not observed_only or observed[i : i + HORIZON].all())
        ]
        if starts[::stride]:
            found[series] = starts[::stride]
    return found


@pytest.mark.parametrize(
    ("freq", "seed", "stride", "observed_only"),
    [("h", 0, 1, True), ("D", 1, 2, False), ("W-WED", 2, 1, True), ("MS", 3, 3, True),
     ("B", 4, 1, False), ("QS", 5, 2, False)],
)  # fmt: skip
def test_each_split_holds_exactly_the_windows_a_brute_force_enumeration_finds(
    freq, seed, stride, observed_only
):
    table = ragged_table(freq, seed)
    times = pd.DatetimeIndex(table["time"]).sort_values()
    cut_validation, cut_test = times[len(times) // 2], times[3 * len(times) // 4]
    data = quiet_prepare(
        table, freq=freq, history=HISTORY, horizon=HORIZON, validation_start=cut_validation,
        test_start=cut_test, train_stride=stride, eval_stride=stride,
        require_observed_target=observed_only, max_missing_fraction=1.0,
    )  # fmt: skip
    end = times.max() + pd.tseries.frequencies.to_offset(freq)
    bounds = {"train": (times.min(), cut_validation), "validation": (cut_validation, cut_test),
              "test": (cut_test, end)}  # fmt: skip
    for name, (begin, stop) in bounds.items():
        windows = data.split(name)
        found: dict[str, list[pd.Timestamp]] = {}
        for code, start in zip(windows.series_code, windows.forecast_start, strict=True):
            found.setdefault(data.series_ids[code], []).append(start)
        assert found == brute_force_starts(table, freq, begin, stop, stride, observed_only), name


def test_window_starts_refuses_a_history_or_horizon_below_one_or_not_an_int():
    table = ragged_table("h", 0)
    panel = quiet_prepare(table, freq="h", history=HISTORY, horizon=HORIZON).panel
    begin, end = panel.times.min(), panel.times.max() + pd.Timedelta(hours=1)
    # A horizon of 0 took the row before each start as its last forecast step.
    for history, horizon, error, name in [
        (HISTORY, 0, ValueError, "horizon"),
        (0, HORIZON, ValueError, "history"),
        (-2, HORIZON, ValueError, "history"),
        (float(HISTORY), HORIZON, TypeError, "history"),
        (HISTORY, True, TypeError, "horizon"),
    ]:
        with pytest.raises(error, match=name):
            window_starts(panel, history, horizon, begin, end)


def test_window_starts_names_a_bound_naive_where_the_times_are_aware():
    table = ragged_table("h", 0)
    table["time"] = table["time"].dt.tz_localize("UTC")
    panel = quiet_prepare(table, freq="h", history=HISTORY, horizon=HORIZON).panel
    end = panel.times.max() + pd.Timedelta(hours=1)
    with pytest.raises(ValueError, match=r"begin=.* is naive .* in zone UTC"):
        window_starts(panel, HISTORY, HORIZON, pd.Timestamp("2020-01-06"), end)
    # A text is compared as pandas compares it: in the times' zone.
    as_text = window_starts(panel, HISTORY, HORIZON, "2020-01-06 05:00", end)
    as_stamp = window_starts(panel, HISTORY, HORIZON, pd.Timestamp("2020-01-06 05:00Z"), end)
    np.testing.assert_array_equal(as_text, as_stamp)


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
    grid = to_regular_grid(validate_table(table, spec, 2, 1), spec, "missing")
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


def test_utc_dates_read_in_a_daylight_saving_zone_name_the_zone_as_the_cause():
    table = pd.DataFrame(
        {"id": "a", "time": pd.date_range("2024-03-01", periods=60, freq="D", tz="UTC"),
         "y": np.arange(60.0)}
    )  # fmt: skip
    options = dict(freq="D", history=HISTORY, horizon=HORIZON, timezone="Europe/Berlin")
    with pytest.raises(ValueError, match=r"in UTC these times are on the freq='D' grid") as caught:
        quiet_prepare(table, **options)
    assert "tz_localize(None).dt.tz_localize('Europe/Berlin')" in str(caught.value)
    # The fix the message gives reads them as Berlin's dates.
    table["time"] = table["time"].dt.tz_localize(None).dt.tz_localize("Europe/Berlin")
    data = quiet_prepare(table, **options)
    assert list(data.panel.times.hour.unique()) == [0]


# ----------------------------------------------------------------------- the future table


def history_table(length: int = 40, start: str = "2021-03-01") -> pd.DataFrame:
    rng = np.random.default_rng(0)
    times = pd.date_range(start, periods=length, freq="h")
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "id": series,
                    "time": times,
                    "y": 10.0 + rng.normal(size=length),
                    "promo": rng.random(length),
                    "holiday": rng.choice(["none", "xmas"], length),
                }
            )
            for series in (1, 2)
        ],
        ignore_index=True,
    )


@pytest.fixture(scope="module")
def preprocessor():
    data = quiet_prepare(
        history_table(), freq="h", history=HISTORY, horizon=HORIZON,
        known_cols=["promo", "holiday"],
    )  # fmt: skip
    return data.preprocessor


def future_of(history: pd.DataFrame) -> pd.DataFrame:
    last = history.groupby("id")["time"].max()
    rows = [
        (series, time, 0.5, "none")
        for series, end in last.items()
        for time in pd.date_range(end, periods=HORIZON + 1, freq="h")[1:]
    ]
    return pd.DataFrame(rows, columns=["id", "time", "promo", "holiday"])


def forecast_inputs(preprocessor, history, future):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = future_windows(preprocessor, history, future, HISTORY, HORIZON)
    return result, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_a_future_time_off_the_grid_is_named_with_the_step_it_misses(preprocessor):
    history = history_table(12, "2021-04-01")
    future = future_of(history)
    future.loc[0, "time"] += pd.Timedelta(minutes=30)
    with pytest.raises(ValueError) as caught:
        forecast_inputs(preprocessor, history, future)
    message = str(caught.value)
    assert "no row for series 1 at 2021-04-01 12:00:00" in message
    assert "1 rows outside the forecast steps, e.g. series 1 at 2021-04-01 12:30:00" in message


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f: f.assign(time=f["time"] + pd.Timedelta(hours=1)),
         r"no row for series 1 at 2021-04-01 12:00:00 \(2 missing\).*2 rows outside"),
        (lambda f: f.drop(index=[1]), r"no row for series 1 at 2021-04-01 13:00:00 \(1 missing\)"),
        (lambda f: f.assign(promo=f["promo"].mask(f.index == 2)),
         r"future column 'promo' is empty for series 2 at 2021-04-01 12:00:00"),
        (lambda f: f.assign(holiday=f["holiday"].mask(f.index == 0)),
         r"future column 'holiday' is empty for series 1"),
        (lambda f: f.assign(promo=f["promo"].astype(object).mask(f.index == 0, "lots")),
         r"'lots' in series 1 at row 0"),
        (lambda f: pd.concat([f, f.iloc[[1]]]), r"future repeats series 1 at 2021-04-01 13:00"),
        (lambda f: f.drop(columns=["holiday"]), r"future lacks the columns \['holiday'\]"),
        (lambda f: f.assign(id=f["id"].astype(str)), r"'1' \(str\) is 1 \(int\) in the history"),
    ],
)  # fmt: skip
def test_a_bad_future_table_is_refused_naming_series_time_and_column(preprocessor, edit, message):
    history = history_table(12, "2021-04-01")
    with pytest.raises(ValueError, match=message):
        forecast_inputs(preprocessor, history, edit(future_of(history)))


def test_an_unseen_future_category_is_coded_unknown_and_announced(preprocessor):
    history = history_table(12, "2021-04-01")
    future = future_of(history)
    future.loc[future["id"] == 2, "holiday"] = "easter"
    future["extra"] = 1.0  # columns the model does not read are left aside
    ahead, messages = forecast_inputs(preprocessor, history, future)
    assert any("'holiday'" in m and "['easter']" in m for m in messages)
    codes = ahead.windows.take(np.arange(2))["future_categorical"][:, :, 0]
    unknown = len(preprocessor.vocabularies["holiday"])
    series_two = list(ahead.transformed.series_ids).index(2)
    assert (codes[series_two] == unknown).all()
    assert (codes[1 - series_two] == preprocessor.vocabularies["holiday"].index("none")).all()


def test_a_categorical_column_holding_only_a_missing_looking_category_keeps_that_category(
    preprocessor,
):
    # 'none' is a holiday category of training; a recent history and a future with no
    # holiday hold only 'none', which was read as empty cells: both were refused.
    history = history_table(12, "2021-04-01").assign(holiday="none")
    future = future_of(history)
    assert set(future["holiday"]) == {"none"}
    ahead, messages = forecast_inputs(preprocessor, history, future)
    assert messages == []
    arrays = ahead.windows.take(np.arange(2))
    none = preprocessor.vocabularies["holiday"].index("none")
    assert (arrays["future_categorical"] == none).all()
    assert (arrays["known_categorical_history"] == none).all()


def regions_table() -> tuple[pd.DataFrame, dict]:
    """Hourly series 'a' and 'c' of region 'NA' (North America), 'b' of 'EU', and the
    options that read 'region' as a static column."""
    times = pd.date_range("2021-01-01", periods=30, freq="h")
    table = pd.concat(
        [pd.DataFrame({"id": series, "time": times, "y": np.sin(np.arange(30.0)) + k,
                       "region": region})
         for k, (series, region) in enumerate((("a", "NA"), ("b", "EU"), ("c", "NA")))],
        ignore_index=True,
    )  # fmt: skip
    return table, dict(freq="h", history=HISTORY, horizon=HORIZON, static_cols=["region"])


def test_a_static_category_spelled_like_a_missing_value_is_read_as_itself():
    table, options = regions_table()
    fitted = quiet_prepare(table, **options).preprocessor
    assert fitted.vocabularies["region"] == ("EU", "NA")
    # Forecasting the North American series only: every region cell is 'NA'.
    only_na = table[table["id"] != "b"]
    ahead, messages = forecast_inputs(fitted, only_na, None)
    assert messages == []
    region = ahead.windows.take(np.arange(2))["static_categorical"][:, 1]
    assert (region == fitted.vocabularies["region"].index("NA")).all()


def test_a_scored_table_is_read_with_the_fitted_spec_so_an_inferred_category_stays():
    # 'region' was inferred categorical at fit (the user's spec does not list it); a
    # scored table holding only the 'NA' region was read with the user's spec,
    # its cells emptied as missing, and the table refused.
    table, options = regions_table()
    fitted = quiet_prepare(table, **options).preprocessor
    assert "region" not in options.get("categorical_cols", ())
    scored = quiet_prepare(table[table["id"] != "b"], preprocessor=fitted, **options)
    codes = scored.split("train").arrays()["static_categorical"][:, 1]
    assert len(codes) and (codes == fitted.vocabularies["region"].index("NA")).all()
