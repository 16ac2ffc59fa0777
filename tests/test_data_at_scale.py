"""Tables of many series: the grids built for all series at once equal the per-series ones,
the target scaler fitted at once equals the per-series fit, and messages stay bounded."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import tables
from tft_jax.data.scaling import TARGET_SCALERS, TargetScaler, target_statistics

FREQS = ("h", "D", "2D", "MS", "ME", "W-SUN", "B", "2MS", "QS")
ZONES = (None, "UTC", "Europe/Berlin", "America/New_York", "America/Santiago")


def _table(freq: str, zone: str | None, seed: int, off_grid: bool = False) -> pd.DataFrame:
    """Series of mixed starts, ends and gaps on their `freq` grids (one off it if `off_grid`)."""
    rng = np.random.default_rng(seed)
    frames = []
    for number in range(30):
        start = pd.Timestamp("2023-01-01") + pd.Timedelta(days=int(rng.integers(0, 400)))
        if zone is not None:
            start = start.tz_localize(zone, nonexistent="shift_forward", ambiguous=True)
        times = tables.time_grid(start, periods=int(rng.integers(1, 30)), freq=freq)
        keep = rng.random(len(times)) > 0.3
        keep[[0, -1]] = True
        times = times[keep]
        if off_grid and number == 20 and len(times) > 2:
            times = times.insert(1, times[0] + pd.Timedelta(minutes=7))
        frames.append(
            pd.DataFrame({"id": f"s{number:03d}", "time": times, "y": rng.random(len(times))})
        )
    return pd.concat(frames, ignore_index=True)


def _grid(frame: pd.DataFrame, spec: tables.TableSpec):
    try:
        lengths = tables._check_on_grid(frame, spec)
    except ValueError as error:
        return str(error)
    return lengths, tables.to_regular_grid(frame, spec, "m")


@pytest.mark.parametrize("freq", FREQS)
def test_grids_at_once_equal_per_series(freq, monkeypatch):
    for zone, off_grid, unit in itertools.product(ZONES, (False, True), ("ns", "s")):
        frame = _table(freq, zone, seed=len(freq), off_grid=off_grid)
        frame["time"] = frame["time"].dt.as_unit(unit)
        spec = tables.TableSpec(id_col="id", time_col="time", target="y", freq=freq)
        fast = _grid(frame, spec)
        with monkeypatch.context() as patch:
            patch.setattr(tables, "_stepped_series", lambda *_: None)
            patch.setattr(tables, "_union_grid", lambda *_: None)
            reference = _grid(frame, spec)
        if isinstance(reference, str) or isinstance(fast, str):
            assert fast == reference, (zone, off_grid, unit)
            continue
        assert fast[0] == reference[0]
        pd.testing.assert_frame_equal(fast[1], reference[1])


@pytest.mark.parametrize(
    ("freq", "zone"),
    [
        ("D", "Europe/Berlin"),
        ("h", "Europe/Berlin"),
        ("D", "America/New_York"),
        ("h", "America/New_York"),
        ("D", "America/Santiago"),
    ],
)
def test_grids_across_clock_changes_equal_per_series(freq, zone, monkeypatch):
    """Series starting and ending around the spring and autumn clock changes, at
    midnight and at 02:30 (a time the spring change skips)."""
    frames = []
    for number, (day, hour) in enumerate(
        itertools.product(
            pd.date_range("2024-03-05", "2024-04-10", freq="3D").append(
                pd.date_range("2024-10-20", "2024-11-10", freq="2D")
            ),
            (0, 2.5),
        )
    ):
        start = (day + pd.Timedelta(hours=hour)).tz_localize(
            zone, nonexistent="shift_forward", ambiguous=True
        )
        times = tables.time_grid(start, periods=20 + number % 7, freq=freq)
        frames.append(
            pd.DataFrame({"id": number, "time": times[::2] if number % 3 else times, "y": 1.0})
        )
    frame = pd.concat(frames, ignore_index=True)
    spec = tables.TableSpec(id_col="id", time_col="time", target="y", freq=freq)
    fast = _grid(frame, spec)
    monkeypatch.setattr(tables, "_stepped_series", lambda *_: None)
    monkeypatch.setattr(tables, "_union_grid", lambda *_: None)
    reference = _grid(frame, spec)
    if isinstance(reference, str) or isinstance(fast, str):
        assert fast == reference
    else:
        assert fast[0] == reference[0]
        pd.testing.assert_frame_equal(fast[1], reference[1])


@pytest.mark.parametrize("method", TARGET_SCALERS)
def test_target_scaler_at_once_equals_per_series(method):
    rng = np.random.default_rng(3)
    num_series = 300
    sizes = rng.integers(1, 40, num_series)
    codes = np.repeat(np.arange(num_series), sizes)
    values = rng.normal(
        rng.uniform(-1e3, 1e3, num_series)[codes], rng.uniform(0.01, 50, num_series)[codes]
    )
    values[rng.random(len(values)) < 0.1] = np.nan
    values[codes == 5] = 7.0  # constant
    values[codes == 6] = np.where(np.arange((codes == 6).sum()) % 9, 0.0, 3.0)  # IQR 0
    values[codes == 7] *= 1e250  # huge
    values[codes == 8] = 3.0 + 1e-14 * np.arange((codes == 8).sum())  # nearly constant
    order = rng.permutation(len(values))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = TargetScaler.fit(values[order], codes[order], num_series, method)
    for code in range(num_series):
        series = values[codes == code]
        series = series[~np.isnan(series)]
        if series.size == 0:
            continue
        expected = target_statistics(series, method)
        np.testing.assert_allclose(fitted.loc[code], expected.loc, rtol=1e-12, atol=0)
        np.testing.assert_allclose(fitted.scale[code], expected.scale, rtol=1e-12, atol=0)


def test_target_scaler_names_the_series_without_values():
    with pytest.raises(ValueError, match="series 'b' has no observed target"):
        TargetScaler.fit(
            np.array([1.0, 2.0, np.nan]), np.array([0, 0, 1]), 2, series_names=["a", "b"]
        )


def test_many_series_messages_stay_bounded():
    many = {f"s{number:05d}": 3 for number in range(5000)}
    text = tables._short_series_text(many)
    assert text.startswith("'s00000' (3 steps), 's00001' (3 steps)")
    assert text.endswith(" and 4995 more") and len(text) < 200
    grid = pd.DataFrame({"id": np.repeat(list(many), 2), "m": np.tile([1.0, 0.0], 5000)})
    spec = tables.TableSpec(id_col="id", time_col="time", target="y", freq="D")
    with pytest.raises(ValueError) as raised:
        tables.check_missing_fraction(grid, spec, "m", 0.2)
    message = str(raised.value)
    assert message.startswith("5000 series have more than 20% of their target missing")
    assert "'s00000' (50%), 's00001' (50%)" in message and "and 4995 more" in message
    assert len(message) < 500


def test_read_table_keeps_pandas_mixed_types_warning_out(tmp_path):
    path = tmp_path / "big.csv"
    rows = 300_000
    frame = pd.DataFrame({"id": "a", "time": "2020-01-01", "y": np.arange(rows).astype(str)})
    frame.loc[rows - 10, "y"] = "12.3.4"
    frame.to_csv(path, index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read = tables.read_table(path)
    assert len(read) == rows


def test_filled_target_steps_warning_stays_bounded():
    from tft_jax.data import prepare_dataset

    count, steps = 2000, 40
    frame = pd.DataFrame(
        {
            "id": np.repeat([f"s{number:04d}" for number in range(count)], steps),
            "time": np.tile(pd.date_range("2024-01-01", periods=steps, freq="D"), count),
            "y": np.tile(np.arange(steps, dtype=float), count),
        }
    )
    frame = frame[np.tile(np.arange(steps) != 5, count)]  # one gap per series
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare_dataset(
            frame, id_col="id", time_col="time", target="y", freq="D", history=3, horizon=2
        )
    (filled,) = [str(w.message) for w in caught if str(w.message).startswith("filled ")]
    assert f"in {count} of {count} series: 's0000' 1, 's0001' 1, " in filled
    assert f"and {count - 5} more;" in filled and len(filled) < 1500
