"""What enters at the table boundary, at fit (`prepare_dataset`) and at predict (`future_windows`):
repairs are announced, tables that cannot be read as the model was trained are refused by name."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.future import future_windows
from tft_jax.data.preprocessing import Preprocessor

HISTORY, HORIZON = 6, 3
SPEC = dict(id_col="id", time_col="time", target="y", freq="h", history=HISTORY, horizon=HORIZON)
INPUTS = dict(known_cols=["promo"], observed_cols=["temp"])


def hourly(n: int = 60, start: str = "2021-03-01", seed: int = 0) -> pd.DataFrame:
    """Series 'a' and 'b', `n` hours each, with a known 'promo' and an observed 'temp'."""
    rng = np.random.default_rng(seed)
    times = pd.date_range(start, periods=n, freq="h")
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "id": series,
                    "time": times,
                    "y": 10.0 + rng.normal(size=n),
                    "promo": (rng.random(n) < 0.3).astype(float),
                    "temp": rng.normal(size=n),
                }
            )
            for series in "ab"
        ],
        ignore_index=True,
    )


def future_for(history: pd.DataFrame, value: float = 0.0) -> pd.DataFrame:
    """The `promo` of the HORIZON hours after each series' last time in `history`."""
    last = history.groupby("id")["time"].max()
    return pd.DataFrame(
        [(series, time, value) for series, end in last.items()
         for time in pd.date_range(end, periods=HORIZON + 1, freq="h")[1:]],
        columns=["id", "time", "promo"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def preprocessor():
    return prepare_dataset(hourly(), **SPEC, **INPUTS).preprocessor


def forecast_inputs(preprocessor, history, future=None, **options):
    future = future_for(history) if future is None else future
    return future_windows(preprocessor, history, future, HISTORY, HORIZON, **options)


def user_warnings(call):
    """`(result, [message, ...])` of the UserWarnings `call()` emits."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


# ----------------------------------------------------------------- predict-time history


def test_a_clean_history_is_forecast_without_a_warning(preprocessor):
    history = hourly(30, start="2021-04-01")
    ahead, messages = user_warnings(lambda: forecast_inputs(preprocessor, history))
    assert messages == []
    assert list(ahead.last_times) == [history["time"].max()] * 2


def test_filled_history_target_steps_are_announced_per_series(preprocessor):
    history = hourly(30, start="2021-04-01")
    history = history.drop(index=[25, 26])  # 'a' loses two of its last six hours
    history.loc[history.index[-20], "y"] = np.nan  # 'b' an empty cell, early
    ahead, messages = user_warnings(lambda: forecast_inputs(preprocessor, history))
    filled = [m for m in messages if m.startswith("filled 3 missing target steps of the history")]
    assert len(filled) == 1
    per_series = "'a' 2 (2 in the last 6 steps), 'b' 1 (0 in the last 6 steps)"
    assert f"in 2 of 2 series: {per_series}" in filled[0]
    # The repair itself is kept: the two inserted hours are in the window, flagged.
    mask = ahead.windows.panel.target_mask[ahead.windows.starts[0] - HISTORY :
                                           ahead.windows.starts[0]]  # fmt: skip
    np.testing.assert_array_equal(mask, [1, 0, 0, 1, 1, 1])  # rows 24..29 of a


def test_a_history_ending_in_empty_targets_says_where_the_forecast_starts(preprocessor):
    history = hourly(30, start="2021-04-01")
    appended = history.groupby("id").tail(2).index  # the user's "future" rows, target left empty
    history.loc[appended, "y"] = np.nan
    ahead, messages = user_warnings(lambda: forecast_inputs(preprocessor, history))
    ends = [m for m in messages if "ends in rows with an empty target" in m]
    assert len(ends) == 1
    assert (
        "'a' 2 rows after its last observed target at 2021-04-02 03:00:00 "
        "(forecast from 2021-04-02 06:00:00)" in ends[0]
    )
    assert "'b' 2 rows after" in ends[0]
    assert "the forecast starts after those rows" in ends[0]
    assert list(ahead.last_times) == [pd.Timestamp("2021-04-02 05:00")] * 2


def test_a_history_mostly_filled_over_its_window_is_refused_by_name(preprocessor):
    history = hourly(30, start="2021-04-01")
    late = (history["id"] == "b") & (history["time"] >= "2021-04-02 01:00")  # last 5 of 'b'
    history.loc[late, "y"] = np.nan
    with pytest.raises(
        ValueError,
        match=r"1 series have more than 50% of the last 6 target steps .* missing \(filled\): "
        r"'b' \(5 of 6\); 'b' end in rows with an empty target",
    ):
        forecast_inputs(preprocessor, history)
    # Three of six is not more than half: forecast, announced.
    history.loc[late & (history["time"] < "2021-04-02 03:00"), "y"] = 1.0
    _, messages = user_warnings(lambda: forecast_inputs(preprocessor, history))
    assert any("'b' 3 (3 in the last 6 steps)" in m for m in messages)
    # A caller holding a looser limit passes it.
    history.loc[late, "y"] = np.nan
    with (
        pytest.warns(UserWarning, match=r"^filled 5 missing target steps of the history .* in "
                     r"1 of 2 series: 'b' 5 \(5 in the last 6 steps\)$"),
        pytest.warns(UserWarning, match=r"'b' 5 rows after its last observed target"),
    ):  # fmt: skip
        forecast_inputs(preprocessor, history, max_missing_fraction=0.9)
    with pytest.raises(ValueError, match=r"max_missing_fraction must be a number in \[0, 1\]"):
        forecast_inputs(preprocessor, history, max_missing_fraction=1.5)


def test_a_history_recorded_coarser_than_freq_is_refused(preprocessor):
    history = hourly(90, start="2021-04-01")
    history = history[history["time"].dt.hour % 3 == 0]
    with pytest.raises(ValueError, match=r"freq='h' leaves 6\d% .* every 3h"):
        forecast_inputs(preprocessor, history)


# ----------------------------------------------------------------- empty input cells


def with_empty_inputs(table: pd.DataFrame) -> pd.DataFrame:
    """'promo' empty in a's first 2 rows and one later cell; 'temp' empty in b's row 40."""
    table = table.copy()
    a = table.index[table["id"] == "a"]
    b = table.index[table["id"] == "b"]
    table.loc[[a[0], a[1], a[10]], "promo"] = np.nan
    table.loc[b[40], "temp"] = np.nan
    return table


def test_empty_known_and_observed_cells_are_filled_and_announced_at_fit():
    table = with_empty_inputs(hourly())
    dataset, messages = user_warnings(lambda: prepare_dataset(table, **SPEC, **INPUTS))
    filled = [m for m in messages if "empty cells of known/observed inputs" in m]
    assert len(filled) == 1
    assert filled[0].startswith("filled 4 empty cells")
    assert "'promo' 3 cells in 1 of 2 series ('a'), 2 of them leading" in filled[0]
    assert "'temp' 1 cells in 1 of 2 series ('b')" in filled[0]
    assert "back-filled from its later values" in filled[0]
    # The fill is kept: a's leading promo is its first value, the later gap its previous one.
    promo = dataset.frame.loc[dataset.frame["id"] == "a", "promo"].to_numpy()
    np.testing.assert_array_equal(promo[:2], promo[[2, 2]])
    assert promo[10] == promo[9]


def test_empty_categorical_input_cells_are_announced_too():
    table = hourly().assign(holiday=lambda t: np.where(t.index % 7 == 0, "yes", "no"))
    table["holiday"] = table["holiday"].astype(object)
    table.loc[[3, 4], "holiday"] = None
    _, messages = user_warnings(lambda: prepare_dataset(table, **SPEC, known_cols=["holiday"]))
    assert any("'holiday' 2 cells in 1 of 2 series ('a')" in m for m in messages)


def test_empty_input_cells_of_a_predict_history_are_announced(preprocessor):
    history = with_empty_inputs(hourly(50, start="2021-04-01"))
    _, messages = user_warnings(lambda: forecast_inputs(preprocessor, history))
    filled = [m for m in messages if "empty cells of known/observed inputs in the history" in m]
    assert len(filled) == 1
    assert "'promo' 3 cells in 1 of 2 series ('a'), 2 of them leading" in filled[0]


# ----------------------------------------------------------------- new series in a scored table

CUTS = dict(validation_start="2021-04-02 00:00", test_start="2021-04-02 06:00")


def with_new_series(first_hour: int = 0, jump: float = 50.0) -> pd.DataFrame:
    """`hourly(60)` from 2021-04-01 plus 'c' (a copy of 'a' from `first_hour`) whose level
    jumps by `jump` from the test start (`CUTS`) on."""
    table = hourly(60, start="2021-04-01", seed=1)
    new = table[table["id"] == "a"].iloc[first_hour:].assign(id="c")
    new.loc[new["time"] >= CUTS["test_start"], "y"] += jump
    return pd.concat([table, new], ignore_index=True)


def new_series_scaler(preprocessor, table, **options) -> tuple[float, float]:
    """`(loc, scale)` of series 'c' in `table` prepared with the trained `preprocessor`."""
    data, _ = user_warnings(
        lambda: prepare_dataset(table, **SPEC, **INPUTS, preprocessor=preprocessor, **options)
    )
    code = data.series_ids.index("c")
    return data.target_scaler.loc[code], data.target_scaler.scale[code]


def moments(table: pd.DataFrame, before: str) -> tuple[float, float]:
    values = table.loc[(table["id"] == "c") & (table["time"] < before), "y"]
    return float(values.mean()), float(values.std(ddof=0))


def test_a_new_series_of_a_scored_table_is_scaled_by_its_target_before_the_validation_start(
    preprocessor,
):
    table = with_new_series()
    fitted = moments(table, CUTS["validation_start"])
    for split in ("validation", "test"):
        got = new_series_scaler(preprocessor, table, **CUTS, scored=split)
        np.testing.assert_allclose(got, fitted, rtol=1e-9)
    # A history (scored=None, the default) is scaled by all of it, the jump included.
    everything = moments(table, "2100-01-01")
    np.testing.assert_allclose(new_series_scaler(preprocessor, table, **CUTS), everything)
    assert everything[1] > 20 * fitted[1]
    # A backtest over the last k grid steps: before the k-th last time.
    last = moments(table, "2021-04-03 00:00")  # hour 48 of 60
    np.testing.assert_allclose(new_series_scaler(preprocessor, table, **CUTS, scored=12), last)


def test_a_new_series_starting_after_the_validation_start_falls_back_to_the_split_start(
    preprocessor,
):
    table = with_new_series(first_hour=26)  # 2021-04-02 02:00, after the validation start
    got = new_series_scaler(preprocessor, table, **CUTS, scored="test")
    np.testing.assert_allclose(got, moments(table, CUTS["test_start"]), rtol=1e-9)
    # The warning names the cut used, not the validation start (where 'c' has no history).
    with pytest.warns(UserWarning, match=r"under which it has observed values \('c' before "
                      r"2021-04-02 06:00:00\)"):  # fmt: skip
        prepare_dataset(table, **SPEC, **INPUTS, preprocessor=preprocessor, **CUTS, scored="test")
    with pytest.raises(
        ValueError,
        match=r"series 'c' is new and has no observed target before 2021-04-02 00:00:00",
    ):
        new_series_scaler(preprocessor, table, **CUTS, scored="validation")
    for bad in ("future", 0, True):
        with pytest.raises(ValueError, match=r"scored must be None, one of .* got"):
            new_series_scaler(preprocessor, table, **CUTS, scored=bad)


# ----------------------------------------------------------------- time zones and formats


def test_a_table_of_the_other_time_zone_kind_is_refused_naming_both():
    naive = prepare_dataset(hourly(), **SPEC).preprocessor
    aware_table = hourly().assign(time=lambda t: t["time"].dt.tz_localize("UTC"))
    aware = prepare_dataset(aware_table, **SPEC).preprocessor
    history = hourly(30, start="2021-04-01")
    with pytest.raises(
        ValueError,
        match=r"history column 'time' is timezone-aware \(zone UTC\) but the model was "
        r"trained on naive times",
    ):
        future_windows(naive, history.assign(time=history["time"].dt.tz_localize("UTC")),
                       None, HISTORY, HORIZON)  # fmt: skip
    with pytest.raises(
        ValueError,
        match=r"history column 'time' holds naive times \(no zone\) but the model was trained "
        r"on timezone-aware times \(zone UTC\)",
    ):
        future_windows(aware, history, None, HISTORY, HORIZON)
    with pytest.raises(ValueError, match=r"table column 'time' holds naive times .*\(zone UTC\)"):
        prepare_dataset(hourly(), **SPEC, preprocessor=aware)


def daily(n: int = 60, start: str = "2021-01-15") -> pd.DataFrame:
    """`hourly`'s columns on `n` days from `start`."""
    table = hourly(n)
    table["time"] = np.tile(pd.date_range(start, periods=n, freq="D"), 2)
    return table


def test_aware_times_in_another_zone_are_the_same_instants():
    spec = dict(SPEC, freq="D")
    utc = daily().assign(time=lambda t: t["time"].dt.tz_localize("UTC"))
    fitted = prepare_dataset(utc, **spec).preprocessor
    history = utc[utc["time"] >= "2021-02-20"]
    tokyo = history.assign(time=history["time"].dt.tz_convert("Asia/Tokyo"))
    same = future_windows(fitted, history, None, HISTORY, HORIZON).windows.panel
    moved = future_windows(fitted, tokyo, None, HISTORY, HORIZON).windows.panel
    names = list(fitted.known_feature_names)
    index = names.index("time_index")
    np.testing.assert_allclose(moved.known[:, index], same.known[:, index])
    assert same.known[-1, index] > same.known[0, index]


def test_calendar_inputs_of_the_same_instants_in_another_zone_are_the_trained_ones():
    # Trained on Berlin midnights; the same history in UTC is 23:00 the day before.
    # Read in UTC, day of week and of year would be a day early: weekly patterns shift.
    berlin = daily().assign(time=lambda t: t["time"].dt.tz_localize("Europe/Berlin"))
    fitted = prepare_dataset(berlin, **dict(SPEC, freq="D")).preprocessor
    assert fitted.time_zone == "Europe/Berlin"
    in_utc = berlin.assign(time=berlin["time"].dt.tz_convert("UTC"))
    for preprocessor in (fitted, Preprocessor.from_json(json.loads(json.dumps(fitted.to_json())))):
        expected = future_windows(preprocessor, berlin, None, HISTORY, HORIZON).windows.panel
        got = future_windows(preprocessor, in_utc, None, HISTORY, HORIZON).windows.panel
        np.testing.assert_allclose(got.known, expected.known, atol=1e-6)
    assert str(got.times.tz) == "UTC"  # the forecast keeps the zone it was given


def test_a_day_first_future_is_read_as_the_history_is():
    spec = dict(SPEC, freq="D", known_cols=["promo"])
    table = daily(60, start="2021-01-15")
    history = table[table["time"] < "2021-03-01"]  # the forecast starts on 1 March
    future = pd.DataFrame(
        [(s, d, 1.0) for s in "ab" for d in pd.date_range("2021-03-01", periods=HORIZON)],
        columns=["id", "time", "promo"],
    )  # 01/03, 02/03, 03/03: month-first these would be 3 January, 3 February, 3 March
    as_text = {"time": lambda t: t["time"].dt.strftime("%d/%m/%Y")}
    for option in ({"time_format": "%d/%m/%Y"}, {"dayfirst": True}):
        fitted = prepare_dataset(table.assign(**as_text), **spec, **option).preprocessor
        ahead = future_windows(fitted, history.assign(**as_text), future.assign(**as_text),
                               HISTORY, HORIZON)  # fmt: skip
        panel, starts = ahead.windows.panel, ahead.windows.starts
        assert list(panel.times[starts]) == [pd.Timestamp("2021-03-01")] * 2, option
        assert list(panel.times[starts + HORIZON - 1]) == [pd.Timestamp("2021-03-03")] * 2


def melbourne_daily(n: int = 120) -> pd.DataFrame:
    """Daily midnights in Melbourne across the April 2021 daylight-saving change."""
    rng = np.random.default_rng(1)
    days = pd.date_range("2021-02-01", periods=n, freq="D", tz="Australia/Melbourne")
    return pd.concat(
        [pd.DataFrame({"id": s, "time": days, "y": rng.normal(size=n)}) for s in "ab"],
        ignore_index=True,
    )


def test_iso_texts_with_offsets_changing_at_dst_read_as_the_zone_given():
    aware = melbourne_daily()
    texts = aware.assign(time=aware["time"].map(lambda t: t.isoformat()))
    assert {t[-6:] for t in texts["time"]} == {"+11:00", "+10:00"}
    spec = dict(SPEC, freq="D", timezone="Australia/Melbourne")
    expected = prepare_dataset(aware, **spec)
    got = prepare_dataset(texts, **spec)
    assert got.summary()["windows"] == expected.summary()["windows"]
    np.testing.assert_array_equal(got.panel.known, expected.panel.known)
    assert str(got.frame["time"].dt.tz) == "Australia/Melbourne"
    # Without the zone the texts are read in UTC (announced), and their local midnights
    # then fall off the daily grid (refused); both name the zone to pass.
    with (
        pytest.warns(UserWarning, match=r"^time holds times with different UTC offsets; they are "
                     r"read in UTC.* pass it as timezone= \(--timezone\), e.g. 'Australia/ACT'"),
        pytest.raises(ValueError, match=r"off the freq='D' grid .*'Australia/ACT'.* pass it as "
                      r"timezone="),
    ):  # fmt: skip
        prepare_dataset(texts, **dict(SPEC, freq="D"))


def test_a_saved_preprocessor_counts_days_across_dst_as_the_fitted_one():
    # Fitted in Melbourne's summer (+11:00); the history runs past the April change
    # (+10:00). Read back with the offset alone, the origin's days would sit an hour
    # off the later midnights and every time_index a day late.
    fitted = prepare_dataset(melbourne_daily(), **dict(SPEC, freq="D")).preprocessor
    loaded = Preprocessor.from_json(json.loads(json.dumps(fitted.to_json())))
    assert str(loaded.origin.tz) == "Australia/Melbourne"
    history = melbourne_daily()
    index = list(fitted.known_feature_names).index("time_index")
    expected = future_windows(fitted, history, None, HISTORY, HORIZON).windows.panel.known
    got = future_windows(loaded, history, None, HISTORY, HORIZON).windows.panel.known
    np.testing.assert_array_equal(got[:, index], expected[:, index])


def test_iso_texts_with_changing_offsets_and_no_zone_are_read_in_utc_with_a_warning():
    local = pd.date_range("2021-04-03", periods=48, freq="h", tz="Australia/Melbourne")
    texts = pd.concat(
        [pd.DataFrame({"id": s, "time": [t.isoformat() for t in local], "y": 1.0 + np.arange(48)})
         for s in "ab"],
        ignore_index=True,
    )  # fmt: skip
    assert {t[-6:] for t in texts["time"]} == {"+11:00", "+10:00"}  # the April DST change
    with pytest.warns(UserWarning, match=r"time holds times with different UTC offsets; they are "
                      r"read in UTC.*pass it as timezone="):  # fmt: skip
        in_utc = prepare_dataset(texts, **dict(SPEC, history=3, horizon=2))
    assert str(in_utc.frame["time"].dt.tz) == "UTC"
    assert in_utc.frame["time"].iloc[0] == local[0].tz_convert("UTC")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        local_run = prepare_dataset(texts, **dict(SPEC, history=3, horizon=2,
                                                  timezone="Australia/Melbourne"))  # fmt: skip
    assert local_run.frame["time"].iloc[0].hour == 0  # local midnight, not 13:00 UTC


def test_weeks_recorded_on_mondays_with_freq_w_name_the_anchor_to_pass():
    mondays = pd.date_range("2022-01-03", periods=30, freq="W-MON")
    table = pd.DataFrame({"id": "a", "time": mondays, "y": np.arange(30.0)})
    options = dict(id_col="id", time_col="time", target="y", history=4, horizon=2)
    message = (
        r"grid that starts at 2022-01-09 .*'W' steps fall on W-SUN dates "
        r".*for weeks recorded on Mondays pass freq='W-MON'"
    )
    with pytest.raises(ValueError, match=message):
        prepare_dataset(table, freq="W", **options)
    assert len(prepare_dataset(table, freq="W-MON", **options).train) > 0


# ----------------------------------------------------------------- repeated column labels


def test_repeated_column_labels_are_refused_by_name(preprocessor):
    table = hourly()
    doubled = pd.concat([table, table[["promo"]]], axis=1)
    message = r"table has repeated column labels .*: 'promo' \(2 columns\)"
    with pytest.raises(ValueError, match=message):
        prepare_dataset(doubled, **SPEC, **INPUTS)
    history = hourly(30, start="2021-04-01")
    with pytest.raises(ValueError, match=message):
        forecast_inputs(preprocessor, pd.concat([history, history[["promo"]]], axis=1),
                        future_for(history))  # fmt: skip
    future = future_for(history)
    with pytest.raises(ValueError, match=r"future has repeated column labels .*'promo'"):
        forecast_inputs(preprocessor, history, pd.concat([future, future[["promo"]]], axis=1))
    # A repeated label the spec does not use is not in the way.
    note = table[["y"]].rename(columns={"y": "note"})
    extra = pd.concat([table, note, note], axis=1)
    prepare_dataset(extra, **SPEC, **INPUTS)


# ----------------------------------------------------------------- missing-value texts in future


def test_a_missing_value_text_in_a_future_known_column_is_an_empty_cell(preprocessor):
    history = hourly(30, start="2021-04-01")
    future = future_for(history).astype({"promo": object})
    future.loc[4, "promo"] = "n/a"
    series, time = future.loc[4, "id"], future.loc[4, "time"]
    message = rf"future column 'promo' is empty for series '{series}' at {time} \(1 empty cells\)"
    with pytest.raises(ValueError, match=message):
        forecast_inputs(preprocessor, history, future)
    # With the cell given, the column's numbers held as text read as the numbers.
    future.loc[4, "promo"] = "1"
    as_text = forecast_inputs(preprocessor, history, future.astype({"promo": str}))
    as_numbers = forecast_inputs(preprocessor, history, future.astype({"promo": float}))
    np.testing.assert_array_equal(as_text.windows.panel.known, as_numbers.windows.panel.known)


# ----------------------------------------------------------------- column names and DST in future


def test_a_known_column_named_like_the_merge_indicator_is_forecast():
    # pandas' merge indicator is '_merge' by default: a known column of that
    # name made the future check fail with pandas' "Cannot use name of an
    # existing column for indicator column".
    table = hourly().rename(columns={"promo": "_merge"})
    fitted = prepare_dataset(table, **SPEC, known_cols=["_merge"]).preprocessor
    history = hourly(30, start="2021-04-01").rename(columns={"promo": "_merge"})
    future = future_for(history, value=1.0).rename(columns={"promo": "_merge"})
    ahead = future_windows(fitted, history, future, HISTORY, HORIZON)
    assert list(ahead.last_times) == [history["time"].max()] * 2
    with pytest.raises(ValueError, match=r"future has no row for series 'a' at"):
        future_windows(fitted, history, future.iloc[1:], HISTORY, HORIZON)


def test_future_texts_with_offsets_changing_at_dst_are_read_in_the_history_zone():
    # The horizon crosses Berlin's spring change: the future's ISO texts carry +01:00
    # then +02:00. They are read in the history's zone, so the warning that calendar
    # inputs would be read in UTC (true of a table, not of a future) is not given.
    berlin = hourly().assign(time=lambda t: t["time"].dt.tz_localize("Europe/Berlin"))
    fitted = prepare_dataset(berlin, **SPEC, known_cols=["promo"]).preprocessor
    times = pd.date_range("2021-03-27", periods=25, freq="h", tz="Europe/Berlin")
    history = pd.concat(
        [pd.DataFrame({"id": s, "time": times, "y": 1.0 + np.arange(25.0), "promo": 0.0})
         for s in "ab"],
        ignore_index=True,
    )  # fmt: skip
    future = future_for(history)
    texts = future.assign(time=future["time"].map(lambda t: t.isoformat()))
    assert {t[-6:] for t in texts["time"]} == {"+01:00", "+02:00"}
    ahead, messages = user_warnings(lambda: future_windows(fitted, history, texts, HISTORY,
                                                           HORIZON))  # fmt: skip
    assert messages == []
    expected = future_windows(fitted, history, future, HISTORY, HORIZON).windows.panel
    np.testing.assert_array_equal(ahead.windows.panel.known, expected.known)
    assert str(ahead.windows.panel.times.tz) == "Europe/Berlin"


# ----------------------------------------------------------------- values beyond float32


def spike(values: pd.Series) -> pd.Series:
    """`values` squeezed to 1% of their spread about 10, the first one 3e38 (in float32).

    On a robust scale (median and quartiles) the spike stays ~3e40: beyond float32.
    """
    squeezed = 10 + 0.01 * (values - 10)
    return squeezed.mask(np.arange(len(values)) == 0, 3e38)


def test_a_target_scaled_beyond_float32_is_refused_by_column_and_series():
    # Within float32 as given, the spike is ~2e40 on its series' robust scale: the model
    # read inf and forecast NaN, or training skipped every step.
    table = hourly().assign(size=lambda t: np.where(t["id"] == "a", 1.0, 2.0))
    table["y"] = spike(table["y"])
    with pytest.raises(ValueError, match=r"column 'y' holds .* as a model input \(series 'a' "
                       r"at 2021-03-01 00:00:00.*beyond float32 .*rescale the column"):  # fmt: skip
        prepare_dataset(table, **SPEC, scaler="robust")


@pytest.mark.parametrize(
    ("column", "options", "where"),
    [("temp", INPUTS, "series 'a' at row 0, time 2021-03-01 00:00:00"),
     ("size", {"static_cols": ["size"]}, "series 'a' at row 0, time 2021-03-01 00:00:00")],
)  # fmt: skip
def test_inputs_beyond_float32_as_given_are_refused_by_column_and_series(column, options, where):
    # An input varying by 1e-14 of a 1e200 level counted as constant (scale 1): ~1e186 in
    # the model. Beyond float32 as given, it is refused before any scaling.
    table = hourly().assign(size=lambda t: np.where(t["id"] == "a", 1.0, 2.0))
    table[column] = 1e200 + 1e186 * table[column]
    with pytest.raises(ValueError, match=rf"column '{column}' has \d+ values beyond float32 "
                       rf".*the first 1e\+200 in {where}"):  # fmt: skip
        prepare_dataset(table, **SPEC, **options)


def test_a_new_series_beyond_float32_is_refused_at_predict():
    fitted = prepare_dataset(hourly(), **SPEC, **INPUTS, scaler="robust").preprocessor
    history = hourly(30, start="2021-04-01").replace({"id": {"b": "new"}})
    new = history["id"] == "new"
    history.loc[new, "y"] = spike(history.loc[new, "y"])  # robust: its own scale ignores it
    # A new series is announced before its values are checked.
    with (
        pytest.warns(UserWarning, match=r"^series \['new'\] were not in the training data: their "
                     r"id embedding is the untrained 'unknown' entry"),
        pytest.raises(ValueError, match=r"column 'y' holds .*\(series 'new' at 2021-04-01 "
                      r"00:00:00; \d+ such values\): beyond float32"),
    ):  # fmt: skip
        forecast_inputs(fitted, history)


def test_a_new_series_constant_at_a_huge_level_is_scaled_by_it():
    # 1e37 varying by 1e-14 of it counts as constant: scaled by its level it is ~1 in the
    # model, and announced.
    fitted = prepare_dataset(hourly(), **SPEC, **INPUTS).preprocessor
    history = hourly(30, start="2021-04-01").replace({"id": {"b": "new"}})
    new = history["id"] == "new"
    history.loc[new, "y"] = 1e37 + 1e23 * history.loc[new, "y"]
    ahead, messages = user_warnings(lambda: forecast_inputs(fitted, history))
    assert any(message.startswith("1 series are constant in") for message in messages), messages
    target = ahead.windows.panel.target[ahead.windows.panel.series_code == 1]
    assert np.all(np.abs(target) < 10), target


# ----------------------------------------------------------------- ids of another type


def test_ids_of_another_type_than_the_training_ones_are_named_with_the_cast_to_make():
    # Trained on integer store ids; a history whose ids are the same numbers as text
    # (a CSV column with one non-numeric id, a str cast) makes every series new: said.
    table = hourly().assign(id=lambda t: t["id"].map({"a": 1, "b": 2}))
    fitted = prepare_dataset(table, **SPEC).preprocessor
    history = hourly(30, start="2021-04-01").assign(id=lambda t: t["id"].map({"a": 1, "b": 2}))
    as_text = history.astype({"id": str})
    with pytest.warns(UserWarning, match=r"series \['1', '2'\] were not in the training data.*"
                      r"'1' \(str\) is 1 \(int\) in the training data: give column 'id' the same "
                      r"type, e.g. df\['id'\].astype\(int\)"):  # fmt: skip
        future_windows(fitted, as_text, None, HISTORY, HORIZON)
    known = prepare_dataset(table, **SPEC, known_cols=["promo"]).preprocessor
    future = future_for(history)
    with pytest.raises(ValueError, match=r"future has series \['1', '2'\] that the history does "
                       r"not.*'1' \(str\) is 1 \(int\) in the history"):  # fmt: skip
        future_windows(known, history, future.astype({"id": str}), HISTORY, HORIZON)
    _, messages = user_warnings(lambda: future_windows(known, history, future, HISTORY, HORIZON))
    assert messages == []


# ----------------------------------------------------------------- naive and aware times mixed


def test_naive_times_mixed_with_aware_ones_are_refused_not_read_as_utc(preprocessor):
    # pd.concat of a naive and an aware table leaves a column of both; reading the
    # naive times as UTC (what pd.to_datetime(utc=True) does) would guess their zone.
    naive = hourly()
    aware = naive.assign(time=naive["time"].dt.tz_localize("Europe/Berlin"))
    mixed = pd.concat([naive[naive["id"] == "a"], aware[aware["id"] == "b"]], ignore_index=True)
    assert mixed["time"].dtype == object
    with pytest.raises(ValueError, match=r"column 'time' mixes times with no zone or UTC offset, "
                       r"e\.g\. Timestamp\('2021-03-01 00:00:00'\) in series 'a' at row 0, with "
                       r"times that have one.*in series 'b' at row 60"):  # fmt: skip
        prepare_dataset(mixed, **SPEC)
    texts = naive.assign(time=naive["time"].astype(str))
    texts.loc[5, "time"] = "2021-03-01 05:00:00+00:00"
    with pytest.raises(ValueError, match=r"mixes times with no zone or UTC offset.*"
                       r"'2021-03-01 05:00:00\+00:00' in series 'a' at row 5"):  # fmt: skip
        prepare_dataset(texts, **SPEC)
    history = hourly(30, start="2021-04-01")
    future = future_for(history).astype({"time": object})
    future.loc[0, "time"] = pd.Timestamp(future.loc[0, "time"]).tz_localize("UTC")
    with pytest.raises(ValueError, match=r"future table: column 'time' mixes times with no zone"):
        forecast_inputs(preprocessor, history, future)


def test_a_new_intermittent_series_at_predict_announces_its_robust_scale():
    # The robust scale of a mostly-zero series falls back to the mean absolute deviation
    # from the median: announced at fit (TargetScaler.fit), and so for a new series too.
    fitted = prepare_dataset(hourly(), **SPEC, scaler="robust").preprocessor
    history = hourly(30, start="2021-04-01")
    spikes = np.where(np.arange(30) % 10 == 0, 5.0, 0.0)  # interquartile range 0
    new = history[history["id"] == "a"].assign(id="new", y=spikes)
    table = pd.concat([history, new], ignore_index=True)
    result, messages = user_warnings(lambda: future_windows(fitted, table, None, HISTORY, HORIZON))
    robust = "scaler='robust': 1 series have an interquartile range of 0 in the history given here"
    assert any(robust in message and "'new'" in message for message in messages), messages
    code = result.transformed.series_ids.index("new")
    assert result.transformed.target_scaler.loc[code] == 0.0  # the median
    assert result.transformed.target_scaler.scale[code] == np.mean(np.abs(spikes))
