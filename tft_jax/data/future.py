"""Inputs for forecasting the `H` steps after the end of each series' data.

`future_windows` puts a table of history on its regular grid, appends the
next `H` steps of every series with the known columns taken from a table of
those steps (`future`), runs the fitted `Preprocessor` over both, and returns
one window per series whose forecast starts one step after the series' last
time. `future` must hold exactly those steps: a series or time missing, an
extra or repeated time, a missing known column or an empty cell of a real
column is an error naming the series, the time and the column (an empty
categorical cell is coded unknown, as in the history, unless the run was
saved when they were filled: `Preprocessor.fills_empty_categoricals`).
Columns holding values that the model does not read from it (the target,
observed and static columns, read from the history, and any other) are
announced, and so is a future given to a model with no known columns, which
reads nothing of it (`announce_unused_columns`).

A known value far from what the model was trained on (beyond a column's
training range by more than its width, or any other value of a column that
was constant in training) is used as given and announced, one warning per
column naming the first few series, times and values
(`announce_unseen_known_values`).

The history goes through the checks of training data (`prepare_dataset`):
what gridding fills is announced, and a series whose window would be mostly
filled target steps is refused (`future_windows`).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import pandas as pd

from tft_jax.caller_frame import user_stacklevel
from tft_jax.data.listing import first_few
from tft_jax.data.preprocessing import (
    Preprocessor,
    RowSources,
    Transformed,
    table_name,
    type_hint,
)
from tft_jax.data.tables import (
    EmptyCells,
    MissingColumnsError,
    TableSpec,
    _categorical_values,
    _parse_times,
    _to_float,
    announce_empty_inputs,
    check_density,
    check_missing_fraction_limit,
    check_unique_columns,
    empty_input_cells,
    file_rows,
    first_duplicate,
    ids_as_categories,
    index_hint,
    missing_texts,
    parse_frequency,
    plain_columns,
    plain_value,
    read_announced,
    recorded_frequency_hint,
    row_text,
    time_grid,
    to_regular_grid,
    validate_table,
)
from tft_jax.data.windows import WindowSet
from tft_jax.data.zones import frame_in_zone, in_training_zone, panel_in_zone, zone_to_give_back


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
    return time_grid(last, periods=horizon + 1, freq=freq)[1:]


@dataclasses.dataclass(frozen=True, eq=False)
class _Steps:
    """The forecast steps of every series: `future_steps` of each one's last time.

    Attributes:
      series: (N,) the series, sorted (the index of the history's last times).
      times: (N * horizon,) the steps of the first series, then of the second, ...
      horizon: steps per series.
    """

    series: pd.Index
    times: pd.DatetimeIndex
    horizon: int

    def rows(self, id_col: str, time_col: str) -> pd.DataFrame:
        """One row `(id, time)` per step, series by series."""
        return pd.DataFrame({id_col: self.series.repeat(self.horizon), time_col: self.times})

    def span(self, series: Any) -> tuple[pd.Timestamp, pd.Timestamp]:
        """The first and last step of `series`."""
        start = self.series.get_loc(series) * self.horizon
        return self.times[start], self.times[start + self.horizon - 1]


def forecast_steps(last: pd.Series, freq: str, horizon: int) -> _Steps:
    """`future_steps` of every series of `last` (`{id: last time}`), for all at once.

    A fixed step ('h', '15min', and 'D' for naive times) is the same duration
    after every time: the steps after the first distinct last time, moved to
    each other one. Calendar steps ('MS', 'W-SUN', 'B', and days of aware
    times, 23 or 25 hours at a daylight-saving change) are built once per
    distinct last time, which is few in practice (series end together).
    """
    ends = pd.DatetimeIndex(last.array)
    codes, distinct = pd.factorize(ends)
    first = future_steps(distinct[0], freq, horizon)
    offset = parse_frequency(freq)
    fixed = isinstance(offset, pd.offsets.Tick) or (
        isinstance(offset, pd.offsets.Day) and ends.tz is None
    )
    if fixed:
        times = ends.repeat(horizon) + np.tile(first - distinct[0], len(ends))
        times = pd.DatetimeIndex(times, freq=None).as_unit(first.unit)
    else:
        grids = first.append([future_steps(end, freq, horizon) for end in distinct[1:]])
        positions = codes[:, None] * horizon + np.arange(horizon)
        times = pd.DatetimeIndex(grids.take(positions.ravel()), freq=None)
    return _Steps(series=last.index, times=times, horizon=horizon)


def _indicator_name(columns: list[str]) -> str:
    """A name for `DataFrame.merge`'s indicator column that none of `columns` has.

    pandas refuses an indicator named like a column, and `'_merge'`, its
    default, is a name a user's known column may have.
    """
    name = "_merge"
    while name in columns:
        name = f"_{name}"
    return name


def _zone_fix(spec: TableSpec, zone: Any) -> str:
    """How to give the future's times the history's zone `zone` (None: naive), as code.

    Read as the table's times are (its `time_format`, `dayfirst`), then
    localized in `zone`, or, for a naive history, made naive (their wall times).
    """
    column = spec.time_col
    options = "" if spec.time_format is None else f", format={spec.time_format!r}"
    options += ", dayfirst=True" if spec.dayfirst else ""
    read = f"pd.to_datetime(future[{column!r}]{options})"
    if zone is not None:
        return (
            f"; give them that zone, e.g. future[{column!r}] = {read}.dt.tz_localize({str(zone)!r})"
        )
    return (
        f"; give naive times, e.g. future[{column!r}] = {read}.dt.tz_localize(None) (after "
        "tz_convert to the zone the history's times were recorded in)"
    )


def announce_unused_columns(future: pd.DataFrame, spec: TableSpec) -> None:
    """Warns of the columns of `future` holding values that the forecast does not read.

    The model reads the id, time and known columns of `future`; the target
    and observed columns are read from the history only (they are not known
    ahead), static columns from the history, and any other column not at
    all. Columns that are empty throughout (a table's future rows whose
    target is not observed yet) are left unsaid. A model with no known
    columns reads nothing of `future`: that is said, whatever it holds.
    One warning, naming the columns.
    """
    known = list(spec.known_cols)
    read = {spec.id_col, spec.time_col, *known}
    filled = [
        column
        for column in dict.fromkeys(future.columns)
        if column not in read and future[column].notna().to_numpy().any()
    ]
    ahead = {spec.target, *spec.observed_cols}
    unread = [column for column in filled if column in ahead]
    unused = [column for column in filled if column not in ahead]
    parts = []
    if unread:
        parts.append(
            f"the columns {unread}, which the model reads from the history only (the target "
            "and observed columns are not known ahead): their future values are not used"
        )
    if unused:
        static = [column for column in unused if column in spec.static_cols]
        reads = []
        if known:
            reads.append(f"it reads only {[spec.id_col, spec.time_col, *known]} of this table")
        if static:
            reads.append(f"the static columns {static} come from the history")
        parts.append(
            f"the columns {unused}, which the model does not read"
            + (f" ({'; '.join(reads)})" if reads else "")
            + ": they are not used"
        )
    nothing = "the model uses no known columns, so the forecast reads the history only"
    if parts:
        message = "future holds " + "; and ".join(parts)
        if not known:
            message += f"; {nothing}: the table adds nothing, leave it out"
    elif not known:
        message = f"future adds nothing: {nothing}; leave it out"
    else:
        return
    warnings.warn(message, UserWarning, stacklevel=user_stacklevel())


def _future_table(
    future: pd.DataFrame | None,
    preprocessor: Preprocessor,
    expected: _Steps,
    zone: Any,
) -> pd.DataFrame:
    """The known columns of every expected (series, time), checked; `(id, time, known...)`.

    Times are read as the history's are (the spec's `time_format`, `dayfirst`
    and `timezone`); `zone` is the history's time zone (None: naive), and
    aware future times in another zone are compared as the same instants.
    Texts whose UTC offsets differ (a daylight-saving change within the
    horizon) are read in `timezone`, else in `zone`, without `_parse_times`'s
    warning that calendar inputs would be read in UTC: they are read in the
    history's zone.
    """
    spec = preprocessor.spec
    known = list(spec.known_cols)
    rows = expected.rows(spec.id_col, spec.time_col)
    if future is None:
        if known:
            raise ValueError(
                f"future is required: the model uses the known columns {known}, so give their "
                f"values for the {expected.horizon} steps after each series' last time"
            )
        return rows
    if not isinstance(future, pd.DataFrame):
        raise TypeError(f"future must be a pandas DataFrame, got {type(future).__name__}")
    needed = [spec.id_col, spec.time_col, *known]
    absent = [column for column in needed if column not in future.columns]
    if absent:
        raise ValueError(
            f"future lacks the columns {absent}; it needs {needed} (it has "
            f"{list(future.columns)}){index_hint(future, absent)}"
        )
    check_unique_columns(future, needed, "future")
    announce_unused_columns(future, spec)
    # 'n/a' in a column of numbers is an empty cell, as in the history, so it is
    # refused below as one, not as a text that is no number; 'none' throughout a
    # categorical column is that category, as in the history.
    lines = file_rows(future)
    # Arrow times and dictionary-encoded columns are read as their values, as the history's.
    needed_columns = plain_columns(future[needed], spec).reset_index(drop=True)
    table, _ = missing_texts(needed_columns, known, spec.categorical_cols)
    ids = table[spec.id_col]
    empty_ids = ids.isna().to_numpy()
    if empty_ids.any():  # else named as a series 'nan' that the history lacks
        raise ValueError(
            f"future column {spec.id_col!r} is empty at "
            f"{row_text(int(np.flatnonzero(empty_ids)[0]), lines)} "
            f"({int(empty_ids.sum())} empty ids); give every row a series id"
        )
    # Texts with offsets changing at a daylight-saving change are read in the
    # history's zone, into which the future's times are converted below anyway.
    try:  # the plain column name: its messages' `df[column]` hints must name a real column
        table[spec.time_col] = _parse_times(
            table[spec.time_col], spec.time_col, ids,
            spec.time_format, spec.dayfirst, spec.timezone or zone, rows=lines,
        )  # fmt: skip
    except ValueError as error:
        raise ValueError(f"future table: {error}") from None
    times = pd.DatetimeIndex(table[spec.time_col])
    if (times.tz is not None) != (zone is not None):
        raise ValueError(
            f"future column {spec.time_col!r} must be timezone-"
            f"{'aware' if zone is not None else 'naive'} like the history's "
            f"(the history's zone: {zone}; future's: {times.tz}){_zone_fix(spec, zone)}"
        )
    if zone is not None:
        table[spec.time_col] = times.tz_convert(zone)
    # The times are the history's (zone) before the values are read, so that a bad
    # value is named at the time the other messages of the future table name.
    try:
        for column in known:
            if column in spec.categorical_cols:
                table[column] = _categorical_values(table[column], column, ids, rows=lines)
            else:  # the model's categorical columns are fixed: none is offered
                table[column] = _to_float(
                    table[column], column, ids, rows=lines, offer_categorical=False,
                    times=table[spec.time_col],
                )  # fmt: skip
    except ValueError as error:
        raise ValueError(f"future table: {error}") from None
    duplicate = first_duplicate(table, spec)
    if duplicate is not None:
        row, count = duplicate
        raise ValueError(
            f"future repeats series {plain_value(ids.iloc[row])!r} at "
            f"{table[spec.time_col].iloc[row]} "
            f"({count} duplicated rows); give each (series, time) once"
        )
    # Plain values: an int64 id reads `7` in the messages, not `np.int64(7)`.
    unknown = sorted({plain_value(value) for value in set(ids) - set(expected.series)}, key=str)
    if unknown:
        hint = type_hint(unknown, list(expected.series), spec.id_col, "in the history")
        raise ValueError(
            f"future has series [{first_few([repr(value) for value in unknown])}] that the "
            f"history does not; every series in future needs its history{hint}"
        )
    flag = _indicator_name(needed)
    merged = rows.merge(table, on=[spec.id_col, spec.time_col], how="left", indicator=flag)
    absent_rows = merged[flag] != "both"
    extra = table.merge(rows, on=[spec.id_col, spec.time_col], how="left", indicator=flag)
    extra_rows = (extra[flag] != "both").to_numpy()
    outside = ""
    if extra_rows.any():
        row = int(np.flatnonzero(extra_rows)[0])
        series = extra[spec.id_col].iloc[row]
        first, last = expected.span(series)
        outside = (
            f"{int(extra_rows.sum())} rows outside the forecast steps, e.g. series "
            f"{plain_value(series)!r} at {extra[spec.time_col].iloc[row]}; its steps are "
            f"{first} .. {last}"
        )
    if absent_rows.any():
        # A time off the grid or shifted (a typo, another zone) is both a missing step
        # and a row outside the steps: said together, the row given is named too.
        row = int(np.flatnonzero(absent_rows.to_numpy())[0])
        raise ValueError(
            f"future has no row for series {plain_value(merged[spec.id_col].iloc[row])!r} at "
            f"{merged[spec.time_col].iloc[row]} ({int(absent_rows.sum())} missing); it must "
            "hold every one of the H steps after each series' last time"
            + (f"; it has {outside}" if outside else "")
        )
    if outside:
        raise ValueError(f"future has {outside}")
    merged = merged.drop(columns=flag)
    coded = {}  # categorical known columns' empty cells, coded unknown as in the history
    for column in known:
        empty = merged[column].isna().to_numpy()
        if (
            empty.any()
            and column in spec.categorical_cols
            and not preprocessor.fills_empty_categoricals
        ):
            coded[column] = EmptyCells(
                cells=int(empty.sum()),
                leading=0,
                series=tuple(merged.loc[empty, spec.id_col].drop_duplicates()),
            )
        elif empty.any():
            row = int(np.flatnonzero(empty)[0])
            raise ValueError(
                f"future column {column!r} is empty for series "
                f"{plain_value(merged[spec.id_col].iloc[row])!r} "
                f"at {merged[spec.time_col].iloc[row]} ({int(empty.sum())} empty cells); known "
                "inputs need a value at every forecast step"
            )
    announce_empty_inputs(coded, merged[spec.id_col].nunique(), " in future", coded)
    return merged


def announce_unseen_known_values(ahead: pd.DataFrame, preprocessor: Preprocessor) -> None:
    """Warns of the real known values of `ahead` far from the column's training values.

    `ahead`: the forecast steps, `(id, time, known...)` (`_future_table`).
    Far is `FeatureScaler.far_outside`: any other value of a column that was
    constant in training (centred and left unscaled, so the model learnt no
    effect of it), or one beyond the training range by more than its width
    (the model extrapolates). One warning per column, naming the first few
    series, times and values, the training range, and what to do. Silent for
    a preprocessor saved without training ranges (nothing to compare).
    """
    spec = preprocessor.spec
    scaler = preprocessor.feature_scaler
    known = list(spec.real(spec.known_cols))
    constant = scaler.constant
    if not known or constant is None or scaler.low is None or scaler.high is None:
        return
    offset = len(spec.real(spec.observed_cols))  # the scaler's observed columns come first
    columns = np.arange(offset, offset + len(known))
    far = scaler.far_outside(ahead[known].to_numpy(np.float64), columns)
    if far is None:
        return
    for index, (column, position) in enumerate(zip(known, columns, strict=True)):
        rows = np.flatnonzero(far[:, index])
        if not rows.size:
            continue
        low, high = float(scaler.low[position]), float(scaler.high[position])
        found = ahead.iloc[rows]
        listed = first_few(
            [
                f"series {plain_value(series)!r} at {time}: {value:.6g}"
                for series, time, value in zip(
                    found[spec.id_col], found[spec.time_col], found[column], strict=True
                )
            ],
            separator="; ",
        )
        count = f"{rows.size} value{'s' * (rows.size > 1)} in {found[spec.id_col].nunique()} series"
        if constant[position]:
            message = (
                f"future known column {column!r} was constant at {low:.6g} in the training "
                f"period, but future gives it other values ({count}): {listed}; a constant "
                "input is centred and left unscaled, so the model learnt no effect of it and "
                f"forecasts reading another value rest on nothing it was trained on. Give "
                f"{low:.6g} there, or retrain on a period in which {column!r} varies"
            )
        else:
            message = (
                f"future known column {column!r} holds {count} far outside its training range "
                f"[{low:.6g}, {high:.6g}] (beyond it by more than its width {high - low:.6g}): "
                f"{listed}; the model extrapolates there and its forecasts can be anything. "
                "Check those values (units, a typo), or retrain on data that covers them"
            )
        warnings.warn(message, UserWarning, stacklevel=user_stacklevel())


def _series_blocks(grid: pd.DataFrame, id_col: str) -> tuple[pd.Index, np.ndarray, np.ndarray]:
    """The series of `grid` (sorted) and its rows series by series: `(ids, order, ends)`.

    `grid.iloc[order]` holds the rows of `ids[0]` (in their order in `grid`),
    then of `ids[1]`, ...; those of `ids[k]` end before row `ends[k]` of it.
    """
    grouped = grid.groupby(id_col, sort=True)
    codes = grouped.ngroup().to_numpy()
    ids = grouped.size().index
    order = np.argsort(codes, kind="stable")
    ends = np.cumsum(np.bincount(codes, minlength=len(ids)))
    return ids, order, ends


def trailing_empty_targets(
    grid: pd.DataFrame, spec: TableSpec, missing_col: str
) -> dict[Any, tuple[int, pd.Timestamp]]:
    """Series whose grid ends in filled target steps: `{id: (steps, last observed time)}`.

    Such a history (typically future rows appended with an empty target) is
    forecast from after its last row, not after its last observed target.
    """
    ids, order, ends = _series_blocks(grid, spec.id_col)
    observed = grid[missing_col].to_numpy()[order] == 0.0
    # The last observed row of each series (validate_table: every series has a target).
    positions = np.where(observed, np.arange(len(order)), -1)
    starts = np.concatenate([[0], ends[:-1]])
    last_observed = np.maximum.reduceat(positions, starts)
    steps = ends - 1 - last_observed
    trailing = np.flatnonzero(steps)
    times = grid[spec.time_col].iloc[order[last_observed[trailing]]]
    return {
        series: (int(count), time)
        for series, count, time in zip(ids[trailing].tolist(), steps[trailing], times, strict=True)
    }


def recent_filled(grid: pd.DataFrame, spec: TableSpec, missing_col: str, history: int) -> pd.Series:
    """Per series (sorted), the filled target steps among its last `history` grid steps."""
    ids, order, ends = _series_blocks(grid, spec.id_col)
    flags = grid[missing_col].to_numpy()[order]
    counts = np.concatenate([[0.0], np.cumsum(flags)])
    starts = np.concatenate([[0], ends[:-1]])
    if history > 0:  # `iloc[-history:]`; `iloc[-0:]` is every row
        starts = np.maximum(starts, ends - history)
    filled = (counts[ends] - counts[starts]).astype(np.int64)
    return pd.Series(filled, index=ids, name=missing_col)


def _check_recent_missing(
    recent: pd.Series,
    trailing: dict[Any, tuple[int, pd.Timestamp]],
    history: int,
    limit: float,
) -> None:
    """Raises naming the first few series whose last `history` steps are over `limit` filled."""
    sparse = recent[recent > limit * history]
    if not len(sparse):
        return
    listed = first_few([f"{series!r} ({int(n)} of {history})" for series, n in sparse.items()])
    ends = [series for series in sparse.index if series in trailing]
    hint = (
        f"; {first_few([repr(s) for s in ends])} end in rows with an empty target: drop those "
        "rows (the forecast starts after a table's last row)"
        if ends
        else ""
    )
    raise ValueError(
        f"{len(sparse)} series have more than {100 * limit:.0f}% of the last {history} target "
        f"steps the forecast reads missing (filled): {listed}{hint}; give more recent "
        f"observed values, or raise the limit ({RAISE_MISSING_LIMIT})"
    )


# How a Python user raises the limit of filled history steps; the command line says its own way.
RAISE_MISSING_LIMIT = (
    "max_missing_fraction, which a Forecaster takes from its DataConfig when it is made"
)


def _announce_history(
    recent: pd.Series,
    total: pd.Series,
    trailing: dict[Any, tuple[int, pd.Timestamp]],
    history: int,
    flagged: bool,
    freq: str,
    recorded: str = "",
) -> None:
    """Warns of filled target steps in the history and of histories ending in empty targets.

    `recorded`: `recorded_frequency_hint`'s text, ending the warning of filled steps.
    """
    filled = total[total > 0]
    if len(filled):
        report = first_few(
            [
                f"{series!r} {int(n)} ({int(last)} in the last {history} steps)"
                for series, n, last in zip(
                    filled.index, filled, recent.reindex(filled.index), strict=True
                )
            ]
        )
        reading = (
            "flagged as missing to the model" if flagged
            else "the model has no missing flag and reads them as observed"
        )  # fmt: skip
        warnings.warn(
            f"filled {int(filled.sum())} missing target steps of the history (forward fill, "
            "those before a series' first observed target its scaler's location; "
            f"{reading}) in {len(filled)} of {len(total)} series: {report}{recorded}",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    if trailing:
        offset = parse_frequency(freq)
        report = first_few(
            [
                f"{series!r} {steps} rows after its last observed target at {last} (forecast "
                f"from {last + (steps + 1) * offset})"
                for series, (steps, last) in trailing.items()
            ]
        )
        warnings.warn(
            f"the history of {len(trailing)} series ends in rows with an empty target: "
            f"{report}; the forecast starts after those rows, which are filled (forward fill); "
            "drop them to forecast from the step after the last observed target",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def future_windows(
    preprocessor: Preprocessor,
    table: pd.DataFrame | str,
    future: pd.DataFrame | None,
    history: int,
    horizon: int,
    normalized: bool = False,
    encoding: str = "utf-8",
    max_missing_fraction: float = 0.5,
) -> FutureWindows:
    """One window per series of `table` forecasting its next `horizon` steps (module docstring).

    `normalized` scales each window by its own history (`WindowSet.normalized`).

    A CSV path is read with the preprocessor's fitted values (`read_table`'s
    `fitted`): ids and categories fitted as text ('007', '1') are read as the
    texts the file holds, not as the numbers 7 and 1 no code stands for.

    The history is checked and gridded as `prepare_dataset` does it, with
    the repairs said out loud: a `freq` finer than the data is an error
    (`check_density`); filled target steps (gaps and empty cells, counted per
    series, with how many fall in the last `history` steps) and filled empty
    cells of known and observed columns (categorical ones coded unknown) are
    announced with a `UserWarning`; so are series whose whole forecast lies
    before the table's last time;
    a series whose table ends in rows with an empty target (e.g. future rows
    appended to the history) is announced with its last observed time, since
    its forecast starts after those rows, not after that time.

    A series is refused when more than `max_missing_fraction` of its last
    `history` grid steps (the steps the forecast window reads; the rows at the
    end with an empty target included) have a filled target. The default 0.5
    is `prepare_dataset`'s (and `DataConfig.max_missing_fraction`'s) default:
    the `Preprocessor` does not carry the value the model was trained with, so
    a caller that knows it passes it here.

    Raises:
      ValueError: for a bad history table (as `validate_table`, with each
        series needing `history` steps), times naive where the training ones
        were aware or the reverse, a `freq` finer than the history, a series
        too sparse over its last `history` steps, or a bad `future` table.
    """
    check_missing_fraction_limit(max_missing_fraction)
    spec = preprocessor.spec
    missing_col = preprocessor.missing_col
    raw, _ = read_announced(table, spec, encoding, preprocessor.fitted_values)
    raw = ids_as_categories(raw, spec.id_col)
    reading = in_training_zone(spec, preprocessor, raw.get(spec.time_col))
    try:
        clean = validate_table(
            raw, reading, history, horizon, min_length=history, fitted=True,
            fill_categoricals=preprocessor.fills_empty_categoricals,
        )  # fmt: skip
    except MissingColumnsError as error:
        raise error.for_fitted_model(raw.columns) from None
    preprocessor.check_time_zone(clean[spec.time_col], "history")
    empty_inputs = empty_input_cells(clean, spec)
    fills = preprocessor.fills_empty_categoricals
    grid = to_regular_grid(clean, spec, missing_col, fill_categoricals=fills)
    check_density(clean, grid, spec)
    trailing = trailing_empty_targets(grid, spec, missing_col)
    recent = recent_filled(grid, spec, missing_col, history)
    _check_recent_missing(recent, trailing, history, max_missing_fraction)
    coded = () if fills else spec.categorical_cols
    announce_empty_inputs(empty_inputs, len(recent), " in the history", coded)
    by_series = grid.groupby(spec.id_col, sort=True)  # its codes are counted once
    total = by_series[missing_col].sum()
    recorded = recorded_frequency_hint(clean, spec, total[total > 0].index)
    _announce_history(
        recent, total, trailing, history, preprocessor.missing_flag, spec.freq, recorded
    )
    last = by_series[spec.time_col].max()
    expected = forecast_steps(last, spec.freq, horizon)
    _announce_ended_series(last, expected)
    zone = pd.DatetimeIndex(grid[spec.time_col]).tz
    ahead = _future_table(future, preprocessor, expected, zone)
    announce_unseen_known_values(ahead, preprocessor)
    statics = by_series[list(spec.static_cols)].first()
    for column in spec.static_cols:
        ahead[column] = ahead[spec.id_col].map(statics[column])
    ahead[spec.target] = np.nan
    latest = by_series[list(spec.observed_cols)].last()
    for column in spec.observed_cols:  # never read: observed inputs enter only over the history
        ahead[column] = ahead[spec.id_col].map(latest[column])
    ahead[missing_col] = 1.0
    combined = pd.concat([grid, ahead[grid.columns]], ignore_index=True)
    combined = combined.sort_values([spec.id_col, spec.time_col], kind="stable")
    # The rows after the history's came from the future table: named so by a warning.
    sources = RowSources(
        table_name("the history", table), future=combined.index.to_numpy() >= len(grid)
    )
    transformed = preprocessor.transform(combined.reset_index(drop=True), sources=sources)
    panel = transformed.panel
    starts = panel.series_start + panel.series_length - horizon
    windows = WindowSet(
        panel=panel, starts=starts, history=history, horizon=horizon, normalized=normalized
    )
    last_times = pd.DatetimeIndex(last.loc[list(transformed.series_ids)].array, freq=None)
    result = FutureWindows(windows=windows, transformed=transformed, last_times=last_times)
    zone_back = zone_to_give_back(spec, reading, raw[spec.time_col])
    return result if zone_back is None else _times_in_zone(result, zone_back, spec.time_col)


def _announce_ended_series(last: pd.Series, expected: _Steps) -> None:
    """Warns naming the series whose forecast ends before the table's last time.

    Each series is forecast from its own last time, so one that stopped
    early (a discontinued product, a sensor taken down) is forecast over a
    past period the other series already cover, in the same frame as theirs;
    `backtest` names such series, and so does this.
    """
    horizon = expected.horizon
    ends = expected.times[horizon - 1 :: horizon]
    latest = last.max()
    ended = np.asarray(ends < latest)
    if not ended.any():
        return
    named = first_few(
        [f"{plain_value(series)!r} (ends {end})" for series, end in last[ended].items()]
    )
    warnings.warn(
        f"{int(ended.sum())} of {len(last)} series end so long before the table's last time "
        f"{latest} that their whole forecast (the {horizon} steps after each one's own last "
        f"time) lies before it: {named}; drop the series that ended, or give their recent "
        "history",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def _times_in_zone(result: FutureWindows, zone: Any, time_col: str) -> FutureWindows:
    """`result` with its times (the same instants) in `zone`: a forecast keeps its given zone."""
    transformed = result.transformed
    panel = panel_in_zone(transformed.panel, zone)
    frame = frame_in_zone(transformed.frame, time_col, zone)
    transformed = dataclasses.replace(transformed, panel=panel, frame=frame)
    windows = dataclasses.replace(result.windows, panel=panel)
    return FutureWindows(windows, transformed, result.last_times.tz_convert(zone))
