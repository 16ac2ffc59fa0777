"""Inputs for forecasting the `H` steps after the end of each series' data.

`future_windows` puts a table of history on its regular grid, appends the
next `H` steps of every series with the known columns taken from a table of
those steps (`future`), runs the fitted `Preprocessor` over both, and returns
one window per series whose forecast starts one step after the series' last
time. `future` must hold exactly those steps: a series or time missing, an
extra or repeated time, a missing known column or an empty cell is an error
naming the series, the time and the column.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from tft_jax.data.preprocessing import Preprocessor, Transformed
from tft_jax.data.tables import (
    _categorical_values,
    _parse_times,
    _to_float,
    first_duplicate,
    parse_frequency,
    read_announced,
    to_regular_grid,
    validate_table,
)
from tft_jax.data.windows import WindowSet


@dataclasses.dataclass(frozen=True, eq=False)
class FutureWindows:
    """One window per series forecasting the steps after its last time.

    Attributes:
      windows: the `WindowSet`, one window per series, in `transformed` series order.
      transformed: the history plus the appended future rows as model inputs.
      last_times: (N,) the last time of each series in the history.
    """

    windows: WindowSet
    transformed: Transformed
    last_times: pd.DatetimeIndex


def future_steps(last: pd.Timestamp, freq: str, horizon: int) -> pd.DatetimeIndex:
    """The `horizon` grid times of `freq` after `last`."""
    return pd.date_range(last, periods=horizon + 1, freq=parse_frequency(freq))[1:]


def _future_table(
    future: pd.DataFrame | None,
    preprocessor: Preprocessor,
    expected: dict[object, pd.DatetimeIndex],
    aware: bool,
) -> pd.DataFrame:
    """The known columns of every expected (series, time), checked; `(id, time, known...)`."""
    spec = preprocessor.spec
    known = list(spec.known_cols)
    rows = pd.concat(
        [
            pd.DataFrame({spec.id_col: series, spec.time_col: times})
            for series, times in expected.items()
        ],
        ignore_index=True,
    )
    if future is None:
        if known:
            raise ValueError(
                f"future is required: the model uses the known columns {known}, so give their "
                f"values for the {len(next(iter(expected.values())))} steps after each series' "
                "last time"
            )
        return rows
    if not isinstance(future, pd.DataFrame):
        raise TypeError(f"future must be a pandas DataFrame, got {type(future).__name__}")
    needed = [spec.id_col, spec.time_col, *known]
    absent = [column for column in needed if column not in future.columns]
    if absent:
        raise ValueError(
            f"future lacks the columns {absent}; it needs {needed} (it has {list(future.columns)})"
        )
    table = future[needed].reset_index(drop=True).copy()
    ids = table[spec.id_col]
    table[spec.time_col] = _parse_times(table[spec.time_col], f"future {spec.time_col}", ids)
    times = pd.DatetimeIndex(table[spec.time_col])
    if (times.tz is not None) != aware:
        raise ValueError(
            f"future column {spec.time_col!r} must be timezone-{'aware' if aware else 'naive'} "
            "like the history's"
        )
    for column in known:
        convert = _categorical_values if column in spec.categorical_cols else _to_float
        table[column] = convert(table[column], f"future {column}", ids)
    duplicate = first_duplicate(table, spec)
    if duplicate is not None:
        row, count = duplicate
        raise ValueError(
            f"future repeats series {ids.iloc[row]!r} at {table[spec.time_col].iloc[row]} "
            f"({count} duplicated rows); give each (series, time) once"
        )
    unknown = sorted(set(ids) - set(expected), key=str)
    if unknown:
        raise ValueError(
            f"future has series {unknown} that the history does not; every series in future "
            "needs its history"
        )
    merged = rows.merge(table, on=[spec.id_col, spec.time_col], how="left", indicator=True)
    absent_rows = merged["_merge"] != "both"
    if absent_rows.any():
        row = int(np.flatnonzero(absent_rows.to_numpy())[0])
        raise ValueError(
            f"future has no row for series {merged[spec.id_col].iloc[row]!r} at "
            f"{merged[spec.time_col].iloc[row]} ({int(absent_rows.sum())} missing); it must "
            "hold every one of the H steps after each series' last time"
        )
    extra = table.merge(rows, on=[spec.id_col, spec.time_col], how="left", indicator=True)
    extra_rows = (extra["_merge"] != "both").to_numpy()
    if extra_rows.any():
        row = int(np.flatnonzero(extra_rows)[0])
        series = extra[spec.id_col].iloc[row]
        raise ValueError(
            f"future has {int(extra_rows.sum())} rows outside the forecast steps, e.g. series "
            f"{series!r} at {extra[spec.time_col].iloc[row]}; its steps are "
            f"{expected[series][0]} .. {expected[series][-1]}"
        )
    merged = merged.drop(columns="_merge")
    for column in known:
        empty = merged[column].isna().to_numpy()
        if empty.any():
            row = int(np.flatnonzero(empty)[0])
            raise ValueError(
                f"future column {column!r} is empty for series {merged[spec.id_col].iloc[row]!r} "
                f"at {merged[spec.time_col].iloc[row]} ({int(empty.sum())} empty cells); known "
                "inputs need a value at every forecast step"
            )
    return merged


def future_windows(
    preprocessor: Preprocessor,
    table: pd.DataFrame | str,
    future: pd.DataFrame | None,
    history: int,
    horizon: int,
    normalized: bool = False,
    encoding: str = "utf-8",
) -> FutureWindows:
    """One window per series of `table` forecasting its next `horizon` steps (module docstring).

    `normalized` scales each window by its own history (`WindowSet.normalized`).

    Raises:
      ValueError: for a bad history table (as `validate_table`, with each
        series needing `history` steps) or a bad `future` table.
    """
    spec = preprocessor.spec
    raw, _ = read_announced(table, spec, encoding)
    clean = validate_table(raw, spec, history, horizon, min_length=history)
    grid = to_regular_grid(clean, spec, preprocessor.missing_col)
    last = grid.groupby(spec.id_col, sort=True)[spec.time_col].max()
    expected = {series: future_steps(time, spec.freq, horizon) for series, time in last.items()}
    aware = pd.DatetimeIndex(grid[spec.time_col]).tz is not None
    ahead = _future_table(future, preprocessor, expected, aware)
    statics = grid.groupby(spec.id_col, sort=True)[list(spec.static_cols)].first()
    for column in spec.static_cols:
        ahead[column] = ahead[spec.id_col].map(statics[column])
    ahead[spec.target] = np.nan
    latest = grid.groupby(spec.id_col, sort=True)[list(spec.observed_cols)].last()
    for column in spec.observed_cols:  # never read: observed inputs enter only over the history
        ahead[column] = ahead[spec.id_col].map(latest[column])
    ahead[preprocessor.missing_col] = 1.0
    combined = pd.concat([grid, ahead[grid.columns]], ignore_index=True)
    combined = combined.sort_values([spec.id_col, spec.time_col], kind="stable")
    transformed = preprocessor.transform(combined.reset_index(drop=True))
    panel = transformed.panel
    starts = panel.series_start + panel.series_length - horizon
    windows = WindowSet(
        panel=panel, starts=starts, history=history, horizon=horizon, normalized=normalized
    )
    last_times = pd.DatetimeIndex([last[series] for series in transformed.series_ids])
    return FutureWindows(windows=windows, transformed=transformed, last_times=last_times)
