"""Aware times in another zone than the training one (`data.zones`), at scoring and at
forecast, and UTC dates read in a zone with daylight saving.

The reference is the same table in the training zone: the arrays must be equal
and the times the same instants, given back in the table's own zone.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.future import future_steps, future_windows
from tft_jax.data.tables import step_after

from .prepared_tables import quiet_prepare

HISTORY, HORIZON = 4, 2


def prepare(table: pd.DataFrame, **options: Any) -> Any:
    """`prepare_dataset` with this file's columns ('id', 'time', 'y'), daily steps."""
    return prepare_dataset(
        table, id_col="id", time_col="time", target="y", freq="D", history=HISTORY,
        horizon=HORIZON, **options,
    )  # fmt: skip


def berlin_days() -> pd.DataFrame:
    """Two daily series of Berlin midnights spanning the March daylight-saving change."""
    days = pd.date_range("2024-03-01", "2024-04-20", freq="D", tz="Europe/Berlin")
    steps = np.arange(len(days), dtype=np.float64)
    return pd.concat(
        [
            pd.DataFrame({"id": series, "time": days, "y": np.sin(steps / 3.0) + offset})
            for offset, series in enumerate(("a", "b"))
        ],
        ignore_index=True,
    )


def test_a_utc_table_is_evaluated_on_the_training_zones_days_and_keeps_its_zone():
    # Evaluating or backtesting a fitted model reads the table through
    # `prepare_dataset(preprocessor=...)`. The same instants in UTC are 23:00 in
    # winter and 22:00 in summer: the table was refused as off the daily grid.
    table = berlin_days()
    fitted = prepare(table).preprocessor
    cuts = {"validation_start": "2024-04-01", "test_start": "2024-04-10"}
    local = prepare(table, preprocessor=fitted, **cuts)
    utc = prepare(
        table.assign(time=table["time"].dt.tz_convert("UTC")), preprocessor=fitted, **cuts
    )
    assert str(utc.train.panel.times.tz) == "UTC"
    assert utc.train.panel.times.tz_convert("Europe/Berlin").equals(local.train.panel.times)
    for period in ("train", "validation", "test"):
        given, expected = getattr(utc, period), getattr(local, period)
        assert given.panel is utc.train.panel
        np.testing.assert_array_equal(given.starts, expected.starts, err_msg=period)
        for name, array in expected.arrays().items():
            np.testing.assert_array_equal(given.arrays()[name], array, err_msg=f"{period} {name}")
    # Naive cuts are read in the training zone, whose days the grid steps by.
    assert utc.validation_start == pd.Timestamp("2024-04-01", tz="Europe/Berlin")
    assert str(utc.validation_start.tz) == "UTC"
    assert str(utc.frame["time"].dt.tz) == "UTC"
    pd.testing.assert_series_equal(
        utc.frame["time"].dt.tz_convert("Europe/Berlin"), local.frame["time"]
    )


def test_texts_with_utc_offsets_are_read_in_the_training_zone():
    # Offsets name no zone to give back: the times come back in the training zone.
    table = berlin_days()
    fitted = prepare(table).preprocessor
    texts = table.assign(time=table["time"].dt.tz_convert("UTC").map(pd.Timestamp.isoformat))
    assert texts["time"].iloc[0] == "2024-02-29T23:00:00+00:00"
    local = prepare(table, preprocessor=fitted)
    given = prepare(texts, preprocessor=fitted)
    assert given.train.panel.times.equals(local.train.panel.times)
    for name, array in local.train.arrays().items():
        np.testing.assert_array_equal(given.train.arrays()[name], array, err_msg=name)


def test_a_naive_table_for_an_aware_model_is_still_refused():
    table = berlin_days()
    fitted = prepare(table).preprocessor
    naive = table.assign(time=table["time"].dt.tz_localize(None))
    with pytest.raises(ValueError, match=r"holds naive times \(no zone\) but the model was"):
        prepare(naive, preprocessor=fitted)


def test_the_offsets_warning_names_zones_whose_offsets_the_texts_have():
    # It named 'Australia/Melbourne' whatever the data; reading in a zone it names
    # now puts the Berlin midnights back on the daily grid.
    table = berlin_days()
    texts = table.assign(time=table["time"].map(pd.Timestamp.isoformat))
    assert {text[-6:] for text in texts["time"]} == {"+01:00", "+02:00"}
    offsets = pytest.warns(UserWarning, match=r"pass it as timezone= \(--timezone\), e\.g\. ")
    with offsets as caught, pytest.raises(ValueError, match="off the freq='D' grid"):
        prepare(texts)
    message = str(caught[0].message)
    named = re.findall(r"'([A-Za-z_]+/[A-Za-z_]+)'", message.split("e.g.")[1])
    assert len(named) == 3 and "Australia/Melbourne" not in named
    for zone in named:
        dataset = prepare(texts, timezone=zone)
        assert dataset.train.panel.times.tz_convert("Europe/Berlin").equals(
            prepare(table).train.panel.times
        )


def test_the_off_grid_hint_names_zones_in_which_the_days_fall_at_midnight():
    table = berlin_days()
    utc = table.assign(time=table["time"].dt.tz_convert("UTC"))
    with pytest.raises(ValueError, match=r"zones where they fall at one clock time: ") as caught:
        prepare(utc)
    zone = re.search(r"dt\.tz_convert\('([^']+)'\)", str(caught.value)).group(1)
    local = prepare(utc.assign(time=utc["time"].dt.tz_convert(zone)))
    assert local.train.panel.times.hour.unique().tolist() == [0]


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


def test_a_utc_history_is_forecast_on_the_training_zones_days_across_a_dst_change():
    # Trained on Berlin midnights (no `timezone`): the same instants in UTC are 23:00 in
    # winter and 22:00 in summer, off any UTC daily grid. The README promises such a
    # history is forecast exactly as in the training zone; it was refused as off the grid
    # (spanning the change) or stepped in 24-hour UTC days (the 7 steps crossing it).
    days = pd.date_range("2024-03-01", "2024-04-12", freq="D", tz="Europe/Berlin")
    table = pd.DataFrame({"id": "a", "time": days, "y": np.sin(np.arange(len(days)) / 3.0)})
    dataset = prepare(table)
    for end in ("2024-03-29", "2024-04-06"):  # horizon crossing the change; history spanning it
        berlin = table[table["time"] < pd.Timestamp(end, tz="Europe/Berlin")]
        utc = berlin.assign(time=berlin["time"].dt.tz_convert("UTC"))
        local = future_windows(dataset.preprocessor, berlin, None, HISTORY, HORIZON)
        given = future_windows(dataset.preprocessor, utc, None, HISTORY, HORIZON)
        assert str(given.last_times.tz) == "UTC"  # the forecast keeps the zone it was given
        assert given.last_times.tz_convert("Europe/Berlin").equals(local.last_times)
        times = given.windows.panel.times
        assert times.tz_convert("Europe/Berlin").equals(local.windows.panel.times)
        for name, array in local.windows.arrays().items():
            np.testing.assert_array_equal(given.windows.arrays()[name], array, err_msg=name)


def test_local_days_that_a_clock_change_starts_after_midnight_are_a_daily_grid():
    # In America/Santiago midnight of 2024-09-08 does not exist (the day starts at 01:00);
    # in America/Havana midnight of 2024-11-03 happens twice. pandas' calendar grid
    # raised "nonexistent time ... Try using the 'nonexistent' argument".
    days = pd.date_range("2024-08-01", "2024-10-15", freq="D")
    local = days.tz_localize("America/Santiago", nonexistent="shift_forward")
    table = pd.DataFrame({"id": "a", "time": local, "y": np.arange(len(days), dtype=float)})
    dataset = prepare(table, validation_fraction=0.1, test_fraction=0.1)
    assert len(dataset.frame) == len(days) and not dataset.frame["y"].isna().any()
    # The forecast steps after the change: its day at 01:00, the next ones at midnight.
    steps = future_steps(pd.Timestamp("2024-09-06", tz="America/Santiago"), "D", 4)
    assert [str(t) for t in steps] == [
        "2024-09-07 00:00:00-04:00", "2024-09-08 01:00:00-03:00",
        "2024-09-09 00:00:00-03:00", "2024-09-10 00:00:00-03:00",
    ]  # fmt: skip
    # A repeated midnight is its first occurrence.
    repeated = future_steps(pd.Timestamp("2024-11-02", tz="America/Havana"), "D", 2)
    assert [str(t) for t in repeated] == ["2024-11-03 00:00:00-04:00", "2024-11-04 00:00:00-05:00"]


@pytest.mark.parametrize(
    ("zone", "last", "localize"),
    [
        ("America/Santiago", "2024-09-07", {"nonexistent": "shift_forward"}),
        ("America/Havana", "2024-11-02", {"ambiguous": True}),
    ],
)
def test_a_table_ending_the_day_before_a_midnight_clock_change_is_prepared(zone, last, localize):
    # The step after the last day was computed as `last + offset`, which pandas refuses on
    # a skipped ('... is a nonexistent time') or repeated ('Cannot infer dst time') midnight:
    # prepare_dataset, PreparedDataset.missing_report and Forecaster.backtest all failed.
    days = pd.date_range("2024-07-01", last, freq="D").tz_localize(zone, **localize)
    table = pd.DataFrame({"id": "a", "time": days, "y": np.arange(len(days), dtype=float)})
    dataset = prepare(table, validation_fraction=0.1, test_fraction=0.1)
    assert len(dataset.frame) == len(days)
    report = dataset.missing_report()
    assert report["filled_target_steps"].sum() == 0 and report["windows"].sum() > 0
    # Two series ending that day: appending their grids, pandas stepped past the last day.
    later = days[days >= pd.Timestamp("2024-07-20", tz=zone)]
    b = pd.DataFrame({"id": "b", "time": later, "y": np.arange(len(later), dtype=float)})
    table = pd.concat([table, b])
    assert len(prepare(table, validation_fraction=0.1, test_fraction=0.1).frame) == len(table)
    after = step_after(days[-1], "D")
    assert after == future_steps(days[-1], "D", 1)[0]
    assert after.tz_localize(None).normalize() == pd.Timestamp(last) + pd.Timedelta(days=1)


def test_texts_at_another_offset_than_a_fixed_offset_training_zone_are_announced():
    # Fitted on winter texts ('+01:00'), the model's zone is the offset UTC+01:00; summer
    # texts of the same midnights ('+02:00') became 23:00 the day before, without a word.
    iso = pd.Timestamp.isoformat
    days = berlin_days()
    winter = days[days["time"] < pd.Timestamp("2024-03-25", tz="Europe/Berlin")]
    assert {text[-6:] for text in winter["time"].map(iso)} == {"+01:00"}
    fitted = prepare(winter.assign(time=winter["time"].map(iso))).preprocessor
    assert fitted.time_zone == "UTC+01:00"
    summer = pd.DataFrame(
        {
            "id": "a",
            "time": pd.date_range("2024-07-01", periods=12, freq="D", tz="Europe/Berlin").map(iso),
            "y": np.arange(12.0),
        }
    )
    off = r"'2024-07-01T00:00:00\+02:00', which is 2024-06-30 23:00:00\+01:00 in the model's zone"
    with pytest.warns(UserWarning, match=off):
        future_windows(fitted, summer, None, HISTORY, HORIZON)
    # The training days' instants written in UTC ('...T23:00:00Z') land on them: no warning.
    utc = summer.assign(
        time=pd.date_range("2024-02-01", periods=12, freq="D", tz="UTC+01:00")
        .tz_convert("UTC")
        .map(lambda stamp: stamp.strftime("%Y-%m-%dT%H:%M:%SZ"))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        future_windows(fitted, utc, None, HISTORY, HORIZON)


def test_hourly_texts_of_another_local_offset_than_a_fixed_offset_training_zone_are_announced():
    # Fitted on winter texts ('+01:00'), an hourly model reads hours on the fixed clock
    # UTC+01:00; summer texts ('+02:00') are the right instants, but their 09:00 is 08:00
    # there, so the hour-of-day inputs moved by an hour without a word.
    iso = pd.Timestamp.isoformat
    winter = pd.date_range("2024-01-01", periods=60, freq="h", tz="Europe/Berlin")
    table = pd.DataFrame({"id": "a", "time": winter.map(iso), "y": np.sin(np.arange(60.0))})
    fitted = prepare_dataset(
        table, id_col="id", time_col="time", target="y", freq="h", history=HISTORY,
        horizon=HORIZON,
    ).preprocessor  # fmt: skip
    assert fitted.time_zone == "UTC+01:00"
    summer = pd.date_range("2024-07-01", periods=12, freq="h", tz="Europe/Berlin")
    history = pd.DataFrame({"id": "a", "time": summer.map(iso), "y": np.arange(12.0)})
    message = (
        r"'2024-07-01T00:00:00\+02:00', at UTC offset \+02:00, while the model's zone is the "
        r"fixed offset UTC\+01:00 of its training texts \(12 such times\)"
    )
    with pytest.warns(UserWarning, match=message):
        future_windows(fitted, history, None, HISTORY, HORIZON)
    # The same instants in UTC ('Z', '+00:00') or at the training offset name no other clock.
    for written in (
        summer.tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%SZ"),
        summer.tz_convert("UTC").map(iso),
        summer.tz_convert("UTC+01:00").map(iso),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            future_windows(fitted, history.assign(time=list(written)), None, HISTORY, HORIZON)
    # Fitted on texts across the March change (mixed offsets), the model's zone is UTC:
    # its own table's '+01:00' and '+02:00' texts are read as in training.
    spring = pd.date_range("2024-03-29", periods=60, freq="h", tz="Europe/Berlin")
    mixed = pd.DataFrame({"id": "a", "time": spring.map(iso), "y": np.sin(np.arange(60.0))})
    with pytest.warns(UserWarning, match="different UTC offsets; they are read in UTC"):
        utc_model = prepare_dataset(
            mixed, id_col="id", time_col="time", target="y", freq="h", history=HISTORY,
            horizon=HORIZON,
        ).preprocessor  # fmt: skip
    assert str(utc_model.time_zone) == "UTC"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        future_windows(utc_model, mixed, None, HISTORY, HORIZON)
