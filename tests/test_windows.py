"""`tft_jax.data.windows`: the window starts of each split equal a brute-force enumeration
and strided starts every stride-th window of each series; bad histories, horizons and
bounds are refused by name."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import window_starts
from tft_jax.data.windows import Panel, batch_indices, filled_history_steps

from .prepared_tables import HISTORY, HORIZON, quiet_prepare


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
            # Kept: every forecast step observed, or (not observed_only) one at least.
            and (
                observed[i : i + HORIZON].all()
                if observed_only
                else observed[i : i + HORIZON].any()
            )
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


@pytest.mark.parametrize("history", [1, 2, 4, 6])
def test_filled_history_steps_counts_the_filled_targets_of_each_windows_history(history):
    # Reference: a brute-force count of target_mask == 0 over rows start - history .. start - 1.
    panel = small_panel()
    begin, end = panel.times.min(), panel.times.max() + pd.Timedelta("1h")
    starts = window_starts(panel, history, 1, begin, end, require_observed_target=False)
    want = [int((panel.target_mask[start - history : start] == 0).sum()) for start in starts]
    got = filled_history_steps(panel, starts, history)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int64 and got.max() >= 1


def test_window_stats_are_the_mean_and_floored_std_of_the_observed_history_only():
    # Reference, in float64 from the raw table: the target scaled by the series' mean and
    # population std over its observed training values; per window the mean and
    # sqrt(var + 0.05**2) of its observed history steps, and where every history step is
    # filled the (forward-filled) last observed value with a scale of 0.05.
    rng = np.random.default_rng(7)
    times = pd.date_range("2024-01-01", periods=40, freq="D")
    table = pd.concat(
        [pd.DataFrame({"id": s, "time": times, "y": rng.normal(10.0 * (k + 1), 3.0, 40)})
         for k, s in enumerate(["a", "b"])],
        ignore_index=True,
    )  # fmt: skip
    blank = np.zeros(len(table), bool)
    blank[[9, 12, 13, 40 + 5, 40 + 30]] = True  # partly filled histories
    blank[18:24] = True  # 6 steps in a row: some histories of 4 are all filled
    table.loc[blank, "y"] = np.nan
    cut_validation, cut_test = times[26], times[33]
    data = quiet_prepare(
        table, freq="D", history=HISTORY, horizon=HORIZON, validation_start=cut_validation,
        test_start=cut_test, require_observed_target=False, max_missing_fraction=1.0,
        window_normalization=True, scaler="standard",
    )  # fmt: skip
    seen_all_filled = seen_partly_filled = False
    for name in ("train", "validation", "test"):
        windows = data.split(name)
        loc, scale = windows.window_stats()
        for i, (code, start) in enumerate(
            zip(windows.series_code, windows.forecast_start, strict=True)
        ):
            rows = table[table["id"] == data.series_ids[code]].set_index("time")["y"]
            train = rows[rows.index < cut_validation].dropna().to_numpy(np.float64)
            scaled = (rows - train.mean()) / train.std()
            past = scaled[(scaled.index < start) & (scaled.index >= start - HISTORY * times.freq)]
            observed = past.dropna().to_numpy()
            if observed.size:
                want = observed.mean(), np.sqrt(observed.var() + 0.05**2)
                seen_partly_filled |= 0 < observed.size < HISTORY
            else:
                want = scaled[scaled.index < start].dropna().iloc[-1], 0.05
                seen_all_filled = True
            np.testing.assert_allclose([loc[i], scale[i]], want, rtol=1e-5, atol=1e-6)
    assert seen_all_filled and seen_partly_filled


def test_window_normalization_over_one_history_step_is_refused_by_name():
    # One step has no spread: every window's history target read 0 at the floor scale.
    table = ragged_table("D", 0)
    message = r"history must be >= 2 with window_normalization=True, got 1"
    with pytest.raises(ValueError, match=message):
        quiet_prepare(table, freq="D", history=1, horizon=HORIZON, window_normalization=True)
    data = quiet_prepare(table, freq="D", history=1, horizon=HORIZON)
    assert data.train.history == 1 and not data.train.normalized
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(data.train, normalized=True)


def test_a_prepared_dataset_and_its_windows_show_their_sizes_not_their_arrays():
    data = quiet_prepare(ragged_table("D", 0), freq="D", history=HISTORY, horizon=HORIZON)
    shown = repr(data)
    assert shown.startswith(f"PreparedDataset(3 series, history {HISTORY}, horizon {HORIZON}; ")
    assert f"windows train {len(data.train)}, validation {len(data.validation)}, " in shown
    assert len(shown) < 400 and "\n" not in shown
    assert repr(data.train) == (
        f"WindowSet({len(data.train)} windows over a panel of {len(data.train.panel)} rows, "
        f"history {HISTORY}, horizon {HORIZON})"
    )
    panel = data.train.panel
    assert repr(panel) == (
        f"Panel(3 series, {len(panel)} rows, {panel.observed.shape[1]} observed and "
        f"{panel.known.shape[1]} known inputs)"
    )


def test_batch_indices_without_shuffling_are_consecutive_slices_and_drop_only_a_short_last():
    # Enumerated: batches of `size` from 0 up; with drop_last the final batch goes only
    # when it is short, so a count divisible by the size keeps every batch.
    for count in range(10):
        for size in range(1, 5):
            for drop_last in (False, True):
                starts = range(0, count, size)
                want = [list(range(s, min(s + size, count))) for s in starts]
                if drop_last and want and len(want[-1]) < size:
                    want = want[:-1]
                got = batch_indices(count, size, shuffle=False, drop_last=drop_last)
                assert [b.tolist() for b in got] == want, (count, size, drop_last)
