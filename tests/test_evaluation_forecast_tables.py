"""Forecast tables and forecasts in the target's units: `forecast_frame` refuses id or time
columns named like a column it adds and levels sharing a column name, a value returned
to original units beyond float64 is refused naming where it is, and `write_forecasts`
keeps times of a fraction of a second and writes whole files or none."""

from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.atomic_files import temporary_sibling
from tft_jax.data import PreparedDataset
from tft_jax.data.scaling import TargetScaler
from tft_jax.evaluation import forecast_frame, to_original_units, write_forecasts

from . import evaluation_tables
from .evaluation_tables import HORIZON, QUANTILES, make_table


def prepare(table: pd.DataFrame, id_col: str = "shop", time_col: str = "day", **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the filled gap of series 'b'
        return evaluation_tables.prepare(table, id_col, time_col, **options)


@pytest.fixture(scope="module")
def log1p_dataset() -> PreparedDataset:
    return prepare(make_table(), target_transform="log1p")


# ----------------------------------------------------------------- forecast table columns


@pytest.mark.parametrize(
    "role, name", [("id", "horizon"), ("id", "p50"), ("time", "actual"), ("time", "forecast_start")]
)
def test_forecast_frame_refuses_an_id_or_time_column_named_as_a_column_it_adds(role, name):
    # The ids (or times) were replaced by 1..H, the actuals, the medians or the window
    # starts without a word: a Python user's table had a 'horizon' id column of zeros.
    columns = {"id_col": "shop", "time_col": "day"}
    table = make_table().rename(columns={columns[f"{role}_col"]: name})
    dataset = prepare(table, **{**columns, f"{role}_col": name})
    windows = dataset.test
    forecast = np.zeros((len(windows), HORIZON, len(QUANTILES)))
    with pytest.raises(ValueError, match=rf"the {role} column '{name}' has the name of a column"):
        forecast_frame(dataset, windows, forecast, QUANTILES)


def test_forecast_frame_refuses_two_levels_of_one_column_name(log1p_dataset):
    # 0.5 and 0.5000001 are both 'p50': the table kept the second level's values only.
    windows = log1p_dataset.test
    forecast = np.zeros((len(windows), HORIZON, 2))
    with pytest.raises(ValueError, match=r"share the forecast column name\(s\) \['p50'\]"):
        forecast_frame(log1p_dataset, windows, forecast, (0.5, 0.5000001))


# ----------------------------------------------------------------- forecasts beyond float64


def test_a_log1p_forecast_beyond_float64_is_refused_naming_series_and_time(log1p_dataset):
    # expm1 of a value above ~709.78 log1p units overflowed to inf with only NumPy's
    # RuntimeWarning; the q-risk became inf, which metrics.json writes as null.
    dataset, windows = log1p_dataset, log1p_dataset.test
    scaler = dataset.target_scaler
    window, step = len(windows) - 1, 2
    code = int(windows.series_code[window])
    quantiles = np.zeros((len(windows), HORIZON, len(QUANTILES)))
    log_value = 700.0  # finite in float64: returned, exactly expm1
    quantiles[window, step, 2] = (log_value - scaler.loc[code]) / scaler.scale[code]
    back = to_original_units(dataset, windows, quantiles)
    assert back[window, step, 2] == pytest.approx(np.expm1(log_value), rel=1e-12)
    assert np.all(np.isfinite(back))
    quantiles[window, step, 2] = (720.0 - scaler.loc[code]) / scaler.scale[code]
    series = dataset.series_ids[code]
    time = windows.forecast_times(window)[step]
    with pytest.raises(
        ValueError,
        match=rf"forecast of series '{series}' at {time}, quantile index 2 is .* 720 in log1p "
        r"units, whose expm1 is beyond float64",
    ):
        to_original_units(dataset, windows, quantiles)


def test_an_affine_inverse_beyond_float64_is_refused_and_nan_passes():
    scaler = TargetScaler(loc=np.zeros(2), scale=np.array([1.0, 1e300]), method="standard")
    codes = np.array([0, 1])
    with pytest.raises(ValueError, match=r"series code 1 at \(1, 0\) is 1e\+10 .* beyond float64"):
        scaler.inverse_transform(np.array([[1e10], [1e10]]), codes)
    back = scaler.inverse_transform(np.array([[np.nan], [1e5]]), codes)
    assert np.isnan(back[0, 0]) and back[1, 0] == pytest.approx(1e305, rel=1e-12)


# ----------------------------------------------------------------- writing forecast tables


def test_aware_times_in_an_hour_a_clock_change_repeats_are_written(tmp_path):
    # The check for fractions of a second floored aware times in local clock time, and
    # raised on 02:00 of 2024-10-27 in Berlin ("Cannot infer dst time").
    times = pd.Series(pd.date_range("2024-10-27", periods=6, freq="h", tz="Europe/Berlin"))
    path = tmp_path / "forecasts.csv"
    write_forecasts(pd.DataFrame({"shop": "a", "day": times}), path)
    back = pd.to_datetime(pd.read_csv(path)["day"], utc=True)
    assert back.equals(times.dt.tz_convert("UTC"))
    # ISO 8601's extended offset, as the times' isoformat writes it (strftime's %z wrote +0200).
    lines = path.read_text().splitlines()
    assert lines[3:5] == ["a,2024-10-27T02:00:00+02:00", "a,2024-10-27T02:00:00+01:00"]


def test_forecast_times_of_a_fraction_of_a_second_are_written_in_full(tmp_path):
    # The format cut times to the second: the 5 steps of a 100 ms series read back as one.
    times = pd.date_range("2024-01-01 00:00:20", periods=5, freq="100ms")
    table = pd.DataFrame(
        {"shop": "a", "forecast_start": times[0], "day": times, "horizon": range(1, 6)}
    )
    path = tmp_path / "forecasts.csv"
    write_forecasts(table, path)
    back = pd.read_csv(path, parse_dates=["forecast_start", "day"])
    pd.testing.assert_series_equal(back["day"], table["day"], check_dtype=False)
    assert back["day"].nunique() == 5
    # Whole seconds stay in the short form.
    write_forecasts(table.assign(day=table["day"].dt.floor("s")), path)
    assert "2024-01-01T00:00:20," in path.read_text()


def test_a_forecast_table_cut_short_leaves_the_earlier_file_and_names_the_output(
    tmp_path, monkeypatch
):
    # Written in place, a full disk left a truncated CSV (a row cut in half) where the
    # complete one was, and pandas' error named no file.
    path = tmp_path / "forecasts.csv"
    path.write_text("the earlier forecasts\n")

    def fail_midway(self, target, **kwargs):
        pathlib.Path(target).write_text("model,shop,day\nfp32,a,2024-0")
        raise OSError(27, "File too large")

    monkeypatch.setattr(pd.DataFrame, "to_csv", fail_midway)
    with pytest.raises(OSError, match="File too large") as raised:
        write_forecasts(pd.DataFrame({"shop": ["a"]}), path)
    assert raised.value.filename == str(temporary_sibling(path))
    assert path.read_text() == "the earlier forecasts\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forecasts.csv"]
