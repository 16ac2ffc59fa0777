"""Validation of long-format tables and their regular time grid per series.

A long-format table has one row per (series, timestamp): a series id column, a
time column, the target and optional static, known-future and observed
columns. `validate_table` rejects tables the rest of the pipeline cannot use,
with a message that names the column or series and the fix;
`to_regular_grid` inserts the missing timestamps of each series, fills the gaps
and flags them.
"""

from __future__ import annotations

import bz2
import codecs
import dataclasses
import datetime
import gzip
import io
import lzma
import numbers
import os
import re
import tarfile
import warnings
import zipfile
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd
from pandas.api import types as ptypes
from pandas.tseries.frequencies import to_offset

from tft_jax.caller_frame import user_stacklevel
from tft_jax.data.listing import first_few
from tft_jax.data.zone_candidates import describe, zones_keeping_time_of_day, zones_with_offsets


def parse_frequency(freq: Any) -> pd.DateOffset:
    """Returns the pandas offset for an offset alias such as 'h', 'D' or '15min'.

    A step of zero or fewer units ('0h', '-1D') is refused: pandas reads it,
    but no grid runs forward in it (a zero step fails deep in `date_range`, a
    negative one puts every timestamp "off the grid").
    """
    if not isinstance(freq, str):
        raise TypeError(f"freq must be a pandas offset alias string such as 'h', got {freq!r}")
    try:
        offset = to_offset(freq)
    except ValueError as error:
        raise ValueError(
            f"unknown frequency freq={freq!r}; use a pandas offset alias such as 'h' (hourly), "
            f"'D' (daily), '15min', 'W' or 'MS' (pandas error: {error})"
        ) from None
    if offset.n <= 0:
        raise ValueError(
            f"freq={freq!r} is a step of {offset.n} units; the frequency must step forward, "
            "e.g. 'h' or '2D'"
        )
    return offset


def typical_step(freq: str) -> pd.Timedelta:
    """Returns the usual duration of one step of `freq` (28 days for 'MS', 7 days for 'W')."""
    grid = pd.date_range("2001-01-01", periods=3, freq=parse_frequency(freq))
    return grid[2] - grid[1]


class TableContentError(ValueError):
    """What a table holds leaves nothing to do: no complete window to score, every target zero.

    Raised above the data layer (by `Forecaster.evaluate` and `backtest`) for
    what the table holds, so that a caller naming the table's file (the
    CLI's `--csv`) knows the error is the table's, not the settings' or a
    model's.
    """


class MissingColumnsError(ValueError):
    """A table lacks columns its spec names; `missing` and their `roles` ("target='sales'").

    `in_index`: what to say of missing columns that are the table's index
    (`index_hint`), '' if none is.
    """

    def __init__(self, message: str, missing: list[str], roles: str, in_index: str = "") -> None:
        super().__init__(message)
        self.missing = missing
        self.roles = roles
        self.in_index = in_index

    def for_fitted_model(self, columns: Sequence[Any]) -> MissingColumnsError:
        """The same error for a table read by a fitted model, whose names cannot change."""
        return MissingColumnsError(
            f"table lacks columns {self.missing} that the model was trained with ({self.roles}); "
            f"it has {list(columns)}{label_type_hint(self.missing, columns)}"
            + (self.in_index if self.in_index else ": add them to the table"),
            self.missing,
            self.roles,
            self.in_index,
        )


def index_hint(frame: pd.DataFrame, missing: Sequence[Any]) -> str:
    """'; ['day'] is the table's index ...': the `missing` columns that are levels of
    `frame`'s index, and how to make them columns again; '' if none is.

    `df.set_index('day')` (or a (store, day) MultiIndex) moves the columns
    out of `frame.columns`: a message listing only the columns leaves the
    user looking for a column that is there.
    """
    levels = [name for name in frame.index.names if name is not None]
    inside = [column for column in missing if column in levels]
    if not inside:
        return ""
    one = len(inside) == 1
    return (
        f"; {inside} {'is' if one else 'are'} in the table's index (its levels: {levels}), not "
        f"among its columns: make {'it a column' if one else 'them columns'} again with "
        "df.reset_index()"
    )


def label_type_hint(missing: Sequence[Any], columns: Sequence[Any]) -> str:
    """A hint when a missing column name is the text of a label that is no text (the int 0).

    A table whose columns are numbered (`pd.read_csv(header=None)`, a NumPy
    array made a DataFrame) has the labels 0, 1, 2: the names '0', '1', '2'
    a config holds (column names are texts) match none of them, and the
    message listing both read alike.
    """
    labels = {str(label): label for label in columns if not isinstance(label, str)}
    twins = [(name, labels[name]) for name in missing if isinstance(name, str) and name in labels]
    if not twins:
        return ""
    name, label = twins[0]
    return (
        f"; its labels are not texts ({name!r} is named, the table has the "
        f"{type(label).__name__} {label!r}): make them texts, e.g. "
        "df.columns = df.columns.astype(str)"
    )


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """Which columns of a long-format table play which role, and how it is sampled.

    Attributes:
      id_col: the series id column; becomes a static categorical input.
      time_col: timestamps (datetimes or strings pandas parses, ISO 8601 with
        offsets included).
      target: the column to forecast.
      static_cols: columns constant within each series (real-valued unless
        categorical: see `categorical_cols`).
      known_cols: columns known in advance (also over the horizon).
      observed_cols: columns known only up to the forecast start.
      freq: pandas offset alias of the sampling frequency, e.g. 'h'.
      timezone: IANA zone (e.g. 'Australia/Melbourne') in which calendar
        features are read, for timezone-aware time columns; None reads them in
        the time column's own zone.
      categorical_cols: static, known or observed columns that are categorical
        (strings, or integer codes); each gets a vocabulary and an embedding.
        Columns holding strings are added by `infer_categorical`.
      time_format: strftime format of the time column (e.g. '%d/%m/%Y');
        None lets pandas infer it.
      dayfirst: read ambiguous dates such as 01/02/2024 as day first.
    """

    id_col: str
    time_col: str
    target: str
    static_cols: tuple[str, ...] = ()
    known_cols: tuple[str, ...] = ()
    observed_cols: tuple[str, ...] = ()
    freq: str = "h"
    timezone: str | None = None
    categorical_cols: tuple[str, ...] = ()
    time_format: str | None = None
    dayfirst: bool = False

    def __post_init__(self) -> None:
        for name in ("static_cols", "known_cols", "observed_cols", "categorical_cols"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TypeError(
                    f"{name} must be a list of column names, got the string {value!r}; "
                    f"write [{value!r}]"
                )
            object.__setattr__(self, name, tuple(value))
        roles: dict[str, list[str]] = {}
        for role, column in self._roles():
            roles.setdefault(column, []).append(role)
        shared = {column: where for column, where in roles.items() if len(where) > 1}
        if shared:
            column, where = next(iter(shared.items()))
            raise ValueError(
                f"column {column!r} is given more than one role ({', '.join(where)}); "
                "give each column one role"
            )
        inputs = {*self.static_cols, *self.known_cols, *self.observed_cols}
        stray = [column for column in self.categorical_cols if column not in inputs]
        if stray:
            raise ValueError(
                f"categorical_cols {stray} are not static, known or observed columns; give "
                "each a role first"
            )
        if not isinstance(self.dayfirst, bool):
            raise TypeError(f"dayfirst must be a bool, got {self.dayfirst!r}")
        parse_frequency(self.freq)
        if self.timezone is not None:
            try:
                pd.Timestamp(0, tz="UTC").tz_convert(self.timezone)
            except Exception as error:
                raise ValueError(
                    f"unknown timezone={self.timezone!r} ({error}); use an IANA name such as "
                    "'Australia/Melbourne', or leave the timezone out to read calendar features "
                    "in the time column's own zone"
                ) from None

    def _roles(self) -> list[tuple[str, str]]:
        return [
            ("id_col", self.id_col),
            ("time_col", self.time_col),
            ("target", self.target),
            *(("static_cols", c) for c in self.static_cols),
            *(("known_cols", c) for c in self.known_cols),
            *(("observed_cols", c) for c in self.observed_cols),
        ]

    @property
    def columns(self) -> tuple[str, ...]:
        """All columns the spec uses, id and time first."""
        return tuple(column for _, column in self._roles())

    @property
    def numeric_columns(self) -> tuple[str, ...]:
        """Columns that must hold numbers: the target and the real-valued inputs."""
        return (self.target, *self.real(self.static_cols), *self.real(self.known_cols),
                *self.real(self.observed_cols))  # fmt: skip

    def real(self, columns: Sequence[str]) -> tuple[str, ...]:
        """The real-valued ones of `columns`, in order."""
        return tuple(column for column in columns if column not in self.categorical_cols)

    def categorical(self, columns: Sequence[str]) -> tuple[str, ...]:
        """The categorical ones of `columns`, in order."""
        return tuple(column for column in columns if column in self.categorical_cols)


# Cell texts read as a missing value (case and surrounding spaces ignored).
MISSING_TEXTS = frozenset({"", "na", "n/a", "nan", "null", "none", "-", "?", "#n/a", "missing"})


# How a CSV file's cells are read: only an empty cell is missing. pandas' own list
# ('NA', 'None', 'null', 'NaN', ...) would empty a category such as the region 'NA' or
# the holiday 'None' before `missing_texts` could tell a column of text from one of
# numbers, so a file and the same table as a DataFrame would read differently.
CSV_MISSING: dict[str, Any] = {"keep_default_na": False, "na_values": [""]}

# The missing-value texts a column of text keeps as categories that are announced: 'NA'
# (North America) and 'None' (no holiday) are everyday categories, not placeholders.
PLACEHOLDER_TEXTS = MISSING_TEXTS - {"na", "none"}

# The `DataFrame.attrs` key under which `read_table` records the CSV a frame was read from.
_READ_FROM = "tft_jax.read_from"

# The `DataFrame.attrs` key under which `read_table` records the header of a CSV that
# repeats a column name: `(path, names as written, labels pandas gave)`.
_HEADER = "tft_jax.header"


@dataclasses.dataclass(frozen=True)
class FileRows:
    """Where the rows of a table read from a CSV file are in that file, for messages.

    Row 0 is on `first_line` (line 1 is the header), assuming one line per
    record: a message's "row 20", a position among the data rows, is line 22
    in an editor.

    Attributes:
      path: the file, as it was given.
      first_line: the file line of row 0.
    """

    path: str
    first_line: int = 2

    def line(self, row: int) -> int:
        """The file line of the table's `row` (0-based among the data rows)."""
        return row + self.first_line


def file_rows(frame: pd.DataFrame) -> FileRows | None:
    """Where `frame`'s rows are in the CSV file `read_table` read it from; None if not so read.

    Only a frame with the rows as read (a 0-based `RangeIndex` of the row count
    read) qualifies: pandas keeps `attrs` through filtering and sorting, after
    which a row is no longer on the line its position says. (A frame reordered
    and then given a new index of the same length is not told apart.)
    """
    read = frame.attrs.get(_READ_FROM)
    if not isinstance(read, tuple) or len(read) != 2 or len(frame) != read[1]:
        return None
    index = frame.index
    if not isinstance(index, pd.RangeIndex) or index.start != 0 or index.step != 1:
        return None
    return FileRows(read[0])


def row_text(row: int, rows: FileRows | None, nested: bool = False) -> str:
    """'row 20', with its file line where the table came from a CSV file.

    'row 20 (line 22 of the file)', or, `nested` in a message's own
    parentheses, 'row 20, line 22 of the file'. The file is not named: the
    caller names it once (the CLI prefixes '--csv PATH: '), or gave it.
    """
    if rows is None:
        return f"row {row}"
    line = f"line {rows.line(row)} of the file"
    return f"row {row}, {line}" if nested else f"row {row} ({line})"


def _numbers_in(values: pd.Series) -> pd.Series:
    """`pd.to_numeric(values, errors="coerce")`, a cell that is no number missing (`isna`).

    Of Arrow texts (`read_csv(dtype_backend="pyarrow")`), pandas returns
    `double[pyarrow]` holding NaN where a text is no number, a value that
    `isna` does not count as missing (only a null is): a column of category
    texts read as numbers. Read as objects, each text is missing or a number,
    as of every other dtype.
    """
    if isinstance(values.dtype, pd.ArrowDtype):
        values = values.astype(object)
    return pd.to_numeric(values, errors="coerce")


def plain_columns(frame: pd.DataFrame, spec: TableSpec) -> pd.DataFrame:
    """`frame` (a copy where changed) with its spec's columns in dtypes the checks read.

    `read_parquet(dtype_backend="pyarrow")` reads a column Arrow stores
    dictionary-encoded (a parquet file's texts, often) as
    `dictionary<values=string, ...>[pyarrow]`, a dtype pandas counts as
    neither text nor category: decoded to its values' Arrow dtype, it is read
    as the same column written plainly. A time column of Arrow dates or
    timestamps, or of categories, is read as its values (`_plain_times`). The
    values are the same; a column the table repeats is left to
    `check_unique_columns` to name.
    """
    changed = {}
    for column in dict.fromkeys(spec.columns):
        values = frame.get(column)
        if not isinstance(values, pd.Series):
            continue
        plain = _plain_times(values) if column == spec.time_col else _decoded(values)
        if plain is not values:
            changed[column] = plain
    return frame.assign(**changed) if changed else frame


def _dictionary_encoded(values: pd.Series) -> bool:
    """Whether `values` is an Arrow dictionary-encoded column (`plain_columns`)."""
    dtype = values.dtype
    return isinstance(dtype, pd.ArrowDtype) and hasattr(dtype.pyarrow_dtype, "value_type")


def _decoded(values: pd.Series) -> pd.Series:
    """An Arrow dictionary-encoded column as its values' Arrow dtype; else `values`."""
    if not _dictionary_encoded(values):
        return values
    return values.astype(pd.ArrowDtype(values.dtype.pyarrow_dtype.value_type))


def missing_texts(
    frame: pd.DataFrame, columns: Sequence[str], categorical: Sequence[str] = ()
) -> tuple[pd.DataFrame, dict]:
    """`frame` with missing-value texts ('n/a', 'null', '-', ...) made NaN in columns of numbers.

    Only a column whose other cells are all numbers is touched: in a column of
    text (a categorical one) such a text is a category like any other. A
    column of `categorical` with no other cells is one of text too: a holiday
    column holding only 'none' over a forecast's few steps, or a region column
    only 'NA' in a table of North American series, holds those categories
    (emptied, it was refused as having no values at all). Returns
    the new frame and `{column: count}` of the cells replaced (only columns
    with any), so the caller can say how many it found.
    """
    counts: dict[str, int] = {}
    frame = frame.copy()
    for column in columns:
        values = frame[column]
        if ptypes.is_numeric_dtype(values) or ptypes.is_bool_dtype(values):
            continue
        # Each distinct cell is read once (ids repeat over millions of rows); a cell is
        # a hit when it equals a distinct cell that is one.
        distinct = values.drop_duplicates()
        text = distinct.astype("string").str.strip().str.lower()
        found = distinct[text.isin(MISSING_TEXTS).fillna(False).to_numpy(dtype=bool)]
        present = values.notna().to_numpy()
        hits = values.isin(found).to_numpy(dtype=bool) & present
        rest = values[~hits & present]
        if column in categorical and rest.empty:
            continue
        if hits.any() and _numbers_in(rest.drop_duplicates()).notna().all():
            frame.loc[hits, column] = np.nan
            counts[column] = int(hits.sum())
    return frame, counts


def check_unique_columns(frame: pd.DataFrame, columns: Sequence[str], what: str = "table") -> None:
    """Raises if any of `columns` labels more than one column of `frame`.

    `frame[name]` of a repeated label is a DataFrame, not a column, which
    breaks every later step with a library error far from the cause (e.g.
    `pd.concat([t, t[["promo"]]], axis=1)`), so it is refused here, by name.
    A CSV file's header is read as written (`_file_header`): pandas renames a
    repeated 'sales' to 'sales.1', and the first of the two was silently used.
    Columns the spec does not need may repeat, as in a DataFrame.
    """
    header = _file_header(frame)
    labels = pd.Series(list(frame.columns) if header is None else header[1], dtype=object)
    counts = labels[labels.isin(list(columns))].value_counts(sort=False)
    repeated = counts[counts > 1]
    if not len(repeated):
        return
    if header is None:
        listed = ", ".join(f"{label!r} ({int(n)} columns)" for label, n in repeated.items())
        raise ValueError(
            f"{what} has repeated column labels among the columns it needs: {listed}; "
            "give each column one label (e.g. df.loc[:, ~df.columns.duplicated()] keeps the "
            "first of each)"
        )
    path, names, read = header
    positions = {
        label: [i for i, name in enumerate(names) if name == label] for label in repeated.index
    }
    listed = ", ".join(
        f"{label!r} ({len(at)} columns: fields "
        f"{', '.join(str(i + 1) for i in at)} of the header, line 1)"
        for label, at in positions.items()
    )
    label, at = next(iter(positions.items()))
    raise ValueError(
        f"{what} {path} has repeated column labels among the columns it needs: {listed}; "
        "give each column one name in the file's header (pandas.read_csv renames the "
        f"repeats, reading the second {label!r} as {read[at[1]]!r}, so the first would be "
        "used without a word)"
    )


def _file_header(frame: pd.DataFrame) -> tuple[str, list[Any], list[Any]] | None:
    """`(path, names, labels)` of a CSV whose header repeats a name, where `frame` is as read.

    `read_table` records the names as the header writes them and the labels
    pandas gave them ('sales', 'sales' read as 'sales', 'sales.1'); only a
    frame whose columns are still those labels qualifies (a renamed or
    selected one is the caller's table).
    """
    header = frame.attrs.get(_HEADER)
    if not isinstance(header, tuple) or len(header) != 3:
        return None
    path, names, read = header
    if tuple(frame.columns) != read:
        return None
    return path, list(names), list(read)


def read_announced(
    table: pd.DataFrame | str | os.PathLike,
    spec: TableSpec,
    encoding: str = "utf-8",
    fitted: Mapping[str, Sequence[Any]] | None = None,
) -> tuple[pd.DataFrame, dict[str, int]]:
    """`read_table`, then `missing_texts` over the spec's columns, announced by a warning.

    `fitted`: `read_table`'s, the fitted values of a preprocessor
    (`Preprocessor.fitted_values`), so a CSV's columns read as at fit.
    Arrow dictionary-encoded columns and Arrow times are read as their values
    (`plain_columns`).

    A missing-value text that an input column of text keeps as a category
    ('n/a' among 'rain', 'sun') is announced too, once for the table
    (`kept_placeholders`): the user may have meant an empty cell.

    Raises:
      ValueError: also for a spec column whose label the table repeats
        (`check_unique_columns`).
    """
    raw = read_table(table, encoding, spec.id_col, fitted, spec.categorical_cols)
    check_unique_columns(raw, spec.columns)
    raw = plain_columns(raw, spec)
    columns = [c for c in spec.columns if c != spec.time_col and c in raw.columns]
    raw, counts = missing_texts(raw, columns, spec.categorical_cols)
    if counts:
        warnings.warn(
            "read cells holding a missing-value text as missing: "
            + ", ".join(f"{count} in {column!r}" for column, count in counts.items()),
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    kept = kept_placeholders(raw, spec, fitted)
    if kept:
        warnings.warn(_kept_placeholders_text(kept), UserWarning, stacklevel=user_stacklevel())
    return raw, counts


def _holds_category_values(values: pd.Series) -> bool:
    """Whether a column not listed in categorical_cols holds categories (`infer_categorical`).

    Of pandas' `category` dtype, unless its categories are fractional numbers;
    else non-empty texts none of which is a number (numbers written with
    separators, '12,5', and percentages, '12%', included: `infer_categorical`
    refuses those).
    """
    if isinstance(values.dtype, pd.CategoricalDtype):
        categories = values.cat.categories
        return not ptypes.is_float_dtype(categories) or bool(
            (categories == np.round(categories)).all()
        )
    present = values.dropna()
    if ptypes.is_numeric_dtype(present) or ptypes.is_bool_dtype(present) or present.empty:
        return False
    return bool(_numbers_in(present.drop_duplicates()).isna().all())


def kept_placeholders(
    frame: pd.DataFrame, spec: TableSpec, fitted: Mapping[str, Sequence[Any]] | None = None
) -> dict[str, dict[Any, int]]:
    """`{column: {text: rows}}` of the placeholders (`PLACEHOLDER_TEXTS`) input columns of
    text hold, after `missing_texts`.

    Such a column's texts are categories, so 'n/a' among 'rain' and 'sun' is a
    category of its own, not an empty cell as it is among numbers. Only static,
    known and observed columns read as categories count (`_holds_category_values`,
    less the numbers written with separators that `infer_categorical` refuses;
    a column mixing numbers and texts is refused by `validate_table`). With
    `fitted` (a fitted preprocessor's), a text its vocabulary holds was
    announced at fit, so it is left out, and only the columns the fitted spec
    reads as categories count (one numeric at fit is refused if it holds texts).
    """
    for_fitted, fitted = fitted is not None, fitted or {}
    kept: dict[str, dict[Any, int]] = {}
    for column in (*spec.static_cols, *spec.known_cols, *spec.observed_cols):
        if column not in frame.columns or column in kept:
            continue
        values = frame[column]
        if ptypes.is_numeric_dtype(values) or ptypes.is_bool_dtype(values):
            continue
        counts = values.value_counts(sort=False)  # each distinct cell read once
        counts = counts[counts > 0]  # a `category` column's unused categories
        text = counts.index.to_series().astype("string").str.strip().str.lower()
        hits = counts[text.isin(PLACEHOLDER_TEXTS).fillna(False).to_numpy(dtype=bool)]
        known = set(fitted.get(column, ()))
        hits = hits[[value not in known for value in hits.index]]
        if len(hits) and (
            column in spec.categorical_cols
            or (
                not for_fitted and _holds_category_values(values) and _written_texts(values) is None
            )
        ):
            kept[column] = {plain_value(value): int(n) for value, n in hits.items()}
    return kept


def _kept_placeholders_text(kept: Mapping[str, Mapping[Any, int]]) -> str:
    """The warning naming each column's placeholders (`kept_placeholders`) and their rows."""

    def rows(count: int) -> str:
        return f"{count} row" if count == 1 else f"{count} rows"

    columns = [
        f"column {column!r} holds "
        + first_few([f"{value!r} in {rows(n)}" for value, n in texts.items()])
        for column, texts in kept.items()
    ]
    each = "" if sum(len(texts) for texts in kept.values()) == 1 else "each "
    return (
        f"{first_few(columns, separator='; ')}, {each}read as a category of its own (a text "
        "column's values are categories); leave those cells empty to mark them missing"
    )


# How numbers written with separators read in a CSV (pandas.read_csv's options for them,
# what to call the separator, a cell's whole text): decimal commas ('12,5', '-,5'),
# thousands separators ('1,234.56'), or both ('1.234,56'). A text '1.234' is a number
# to pandas already and '1,234' fits the first two: both options are then named.
_SEPARATED_NUMBERS: tuple[tuple[str, str, str], ...] = (
    ("decimal=','", "decimal commas", r"[+-]?\d*,\d+"),
    ("thousands=','", "thousands separators", r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?"),
    (
        "decimal=',', thousands='.'",
        "decimal commas and thousands separators",
        r"[+-]?\d{1,3}(?:\.\d{3})+,\d+",
    ),
)

# The share of a column's present cells (missing-value texts aside) that must be numbers
# with separators (or plain numbers) for it to be refused as categorical: a stray typo
# among numbers with decimal commas does not make the column one of categories.
_SEPARATED_SHARE = 0.9


@dataclasses.dataclass(frozen=True)
class SeparatedNumbers:
    """How a column's texts read as numbers written with separators.

    Attributes:
      options: the `pandas.read_csv` options that read them ("decimal=','");
        more than one where the texts fit several ('1,234').
      separators: what the first of them calls the separators, for messages.
      row: the position of the first cell written with a separator.
    """

    options: tuple[str, ...]
    separators: str
    row: int

    def hint(self) -> str:
        """How to read such a file: `pandas.read_csv` with the options, or a copy for the CLI."""
        readings = " or ".join(f"pandas.read_csv(path, {option})" for option in self.options)
        return (
            f"read the CSV with {readings} (for the CLI, write a copy so read, e.g. "
            f"pandas.read_csv(path, {self.options[0]}).to_csv(new_path, index=False))"
        )


def _separated_in(texts: _DistinctTexts, share: float) -> SeparatedNumbers | None:
    """How a column's distinct `texts` read as numbers written with decimal commas or
    thousands separators.

    None unless at least `share` of the present cells (missing-value texts aside)
    are such numbers or plain ones, one at least written with a separator:
    pandas reads '12,5' and '1,234.56' as text, which would otherwise make a
    column of numbers one of categories (a category per row).
    """
    options, separators, written = [], "", np.zeros(len(texts.text), dtype=bool)
    for option, name, pattern in _SEPARATED_NUMBERS:
        fits = texts.fitting(pattern)
        if texts.enough(fits, share):
            options.append(option)
            separators = separators or name
            written |= fits
    if not options:
        return None
    return SeparatedNumbers(tuple(options), separators, texts.first_row(written))


@dataclasses.dataclass(frozen=True)
class _DistinctTexts:
    """A column's distinct cells as stripped texts, each read once (`_written_numbers`).

    Attributes:
      codes: each cell's distinct text (-1 where missing).
      counts: the cells of each distinct text.
      text: the distinct texts, stripped.
      counted: the distinct texts that are not missing-value texts ('n/a').
      plain: the distinct texts that are plain numbers.
    """

    codes: np.ndarray
    counts: np.ndarray
    text: pd.Series
    counted: np.ndarray
    plain: np.ndarray

    @classmethod
    def of(cls, values: pd.Series) -> _DistinctTexts | None:
        """The distinct texts of `values`, or None where no cell is present."""
        codes, distinct = pd.factorize(values)
        present = codes >= 0
        if not present.any():
            return None
        counts = np.bincount(codes[present], minlength=len(distinct))
        text = pd.Series(distinct, dtype=object).astype(str).str.strip()
        counted = ~text.str.lower().isin(MISSING_TEXTS).to_numpy()
        plain = _numbers_in(text).notna().to_numpy()
        return cls(codes, counts, text, counted, plain)

    def fitting(self, pattern: str) -> np.ndarray:
        """The counted distinct texts `pattern` matches in full."""
        return self.text.str.fullmatch(pattern).to_numpy(dtype=bool) & self.counted

    def enough(self, fits: np.ndarray, share: float) -> bool:
        """Whether some cell `fits` and `share` of the counted cells fit or are plain numbers."""
        numbers = self.counts[(fits | self.plain) & self.counted].sum()
        return bool(fits.any()) and numbers >= share * self.counts[self.counted].sum()

    def first_row(self, fits: np.ndarray) -> int:
        """The position of the first cell whose text `fits`."""
        present = self.codes >= 0
        return int(np.flatnonzero(present & fits[np.where(present, self.codes, 0)])[0])


# A number written as a percentage: '12%', '-0.5 %', '12,5%' (a decimal comma).
_PERCENT = r"[+-]?(?:\d+(?:[.,]\d*)?|[.,]\d+)\s*%"


@dataclasses.dataclass(frozen=True)
class Percentages:
    """How a column's texts read as percentages ('12%', '0.5 %').

    Attributes:
      row: the position of the first cell written as a percentage.
      comma: whether some are written with a decimal comma ('12,5%').
    """

    row: int
    comma: bool

    def hint(self, column: str) -> str:
        """How to convert them to numbers (fractions), in pandas, and a copy for the CLI."""
        comma = ".str.replace(',', '.')" if self.comma else ""
        return (
            f"convert them to numbers, e.g. df[{column!r}] = df[{column!r}].str.strip()"
            f".str.rstrip('%'){comma}.astype(float) / 100 (for the CLI, write a copy so "
            "converted, e.g. df.to_csv(new_path, index=False))"
        )


def _percent_in(texts: _DistinctTexts, share: float) -> Percentages | None:
    """How a column's distinct `texts` read as percentages, as `_separated_in` reads
    numbers with separators.

    None unless at least `share` of the present cells (missing-value texts
    aside) are percentages or plain numbers, one at least a percentage:
    pandas reads '12%' as text, which would make a column of numbers one of
    categories (a category per value).
    """
    fits = texts.fitting(_PERCENT)
    if not texts.enough(fits, share):
        return None
    comma = bool(texts.text[fits].str.contains(",", regex=False).any())
    return Percentages(texts.first_row(fits), comma)


def _written_numbers(
    values: pd.Series, share: float = _SEPARATED_SHARE
) -> SeparatedNumbers | Percentages | None:
    """Numbers `values` write as texts pandas reads as no number: with separators
    ('12,5'; `_separated_in`), else as percentages ('12%'; `_percent_in`).

    Each distinct text is read once, for both readings.
    """
    texts = _DistinctTexts.of(values)
    if texts is None:
        return None
    separated = _separated_in(texts, share)
    return separated if separated is not None else _percent_in(texts, share)


def _written_texts(values: pd.Series) -> SeparatedNumbers | Percentages | None:
    """`_written_numbers` of a column of texts (None for `category` dtype): the numbers
    written with separators or as percentages for which `infer_categorical` refuses it."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        return None
    return _written_numbers(values)


def infer_categorical(frame: pd.DataFrame, spec: TableSpec) -> TableSpec:
    """`spec` with every static, known or observed column that holds categories made categorical.

    A column whose non-empty cells are all non-numeric text is categorical; one
    that mixes numbers and text stays numeric (and `validate_table` names the
    text cells). A column of pandas' `category` dtype is categorical too,
    whatever its categories (store types coded 1, 2, 3 were read as one
    real-valued input, type 3 "three times" type 1), unless they are
    fractional numbers, which name no category code.

    Raises:
      ValueError: naming the column and a cell, for a column of text not listed
        in `spec.categorical_cols` whose cells are numbers written with decimal
        commas or thousands separators ('12,5', '1,234.56'; `_separated_in`)
        or percentages ('12%'; `_percent_in`): read as categories, each value
        would be a category of its own.
    """
    found = []
    rows = file_rows(frame)
    for column in (*spec.static_cols, *spec.known_cols, *spec.observed_cols):
        if column in spec.categorical_cols or column not in frame.columns:
            continue
        if not _holds_category_values(frame[column]):
            continue
        # A table without its id column is the table validation's to name first.
        written = _written_texts(frame[column]) if spec.id_col in frame else None
        if written is not None:
            row = written.row
            if isinstance(written, SeparatedNumbers):
                kind, hint = f"numbers written with {written.separators}", written.hint()
            else:
                kind, hint = "percentages", written.hint(column)
            raise ValueError(
                f"column {column!r} holds {kind} (e.g. {frame[column].iloc[row]!r} in "
                f"series {plain_value(frame[spec.id_col].iloc[row])!r} at "
                f"{row_text(row, rows, nested=True)}), which would be read as "
                f"{frame[column].dropna().nunique()} categories; {hint}, or, if it holds "
                "categories, list it in categorical_cols (--categorical-cols)"
            )
        found.append(column)
    if not found:
        return spec
    return dataclasses.replace(spec, categorical_cols=(*spec.categorical_cols, *found))


def _separator(columns: Sequence[Any], candidates: str = ";\t|,") -> str | None:
    """The one of `candidates` a table read as one column looks split by, else None.

    A semicolon- or tab-separated file read as comma-separated has one column
    whose name is the whole header ('store;date;sales'). Named in the error,
    not guessed: reading the file another way than asked would be a repair the
    user did not request.
    """
    if len(columns) != 1 or not isinstance(columns[0], str):
        return None
    counts = {sep: columns[0].count(sep) for sep in candidates}
    sep = max(counts, key=counts.__getitem__)
    return sep if counts[sep] else None


def read_table(
    table: pd.DataFrame | str | os.PathLike,
    encoding: str = "utf-8",
    id_col: str | None = None,
    fitted: Mapping[str, Sequence[Any]] | None = None,
    categorical: Sequence[str] = (),
) -> pd.DataFrame:
    """Returns `table` itself if it is a DataFrame, else reads it as a CSV file.

    With `id_col`, the series ids of a CSV stay the texts the file holds
    where reading them as numbers would change them: ids with leading zeros
    ('001' is store 1 to pandas, so forecasts came back for store 1 and '01'
    and '001' were one series) or texts that are one number ('1.0' and '1').
    Ids that read as numbers unchanged ('101') are numbers, as before. The
    `categorical` columns not in `fitted` (a table read for a fit) follow
    the same rule: codes '01' and '1' were one category.

    `fitted` maps columns to the values a preprocessor was fitted on (the
    series ids, each categorical column's vocabulary: `Preprocessor.
    fitted_values`). A CSV column pandas reads as numbers is read as the
    texts the file holds where those values are all text: a model fitted on
    a DataFrame of codes '1', '007' is given '1', '007' back, not 1 and 7,
    which it knows under no code (every category was unknown). Unless the
    column holds numbers: a text the fit lacks whose integer it holds as
    text ('1.0' where it has '1') keeps the column's numbers, so the
    unknown-value warning names the type mismatch. A DataFrame is never
    changed: its dtypes are the caller's.

    Rows that end with an extra empty field (a delimiter after the last
    field; pandas would make the first field the index and shift every
    column) are read without it, announced by a warning. Rows whose distinct first
    fields the header does not name are row labels (R's `write.table`): the
    index, as pandas reads them. A header that repeats a name is recorded for
    `check_unique_columns` (pandas renames the second 'sales' to 'sales.1').

    Raises:
      ValueError: naming the file, when it is missing, is not valid `encoding`
        text (with the byte and a hint), is not CSV, or lacks `id_col` and looks
        separated by ';', a tab or '|' instead of commas (one column named
        'store;date;sales'; the separator is named, not guessed); when its
        first bytes say it is compressed or a tar archive under a name pandas
        infers no such compression from, an Excel workbook, Parquet, or UTF-16
        text read in another encoding (`_check_file_kind`); when a file whose
        name says it is compressed is damaged or truncated, or an archive holds
        other than one file (`_archive_error`); when a row has a non-empty
        field more than the header names and the first fields repeat (an
        id, not a row label; naming its line).
    """
    if isinstance(table, pd.DataFrame):
        return table
    if not isinstance(table, str | os.PathLike):
        raise TypeError(
            f"table must be a pandas DataFrame or a CSV path, got {type(table).__name__}"
        )
    # pandas reads "~/x.csv" in the home folder: so do the checks and messages before it
    # ("~/x.csv: no such file" was said of a file pandas would have read).
    table = os.path.expanduser(table)
    if not os.path.isfile(table):
        raise ValueError(f"{os.fspath(table)}: no such file")
    _check_file_kind(os.fspath(table), encoding)
    options: dict[str, Any] = dict(CSV_MISSING)
    try:
        with warnings.catch_warnings():
            # pandas' "Columns (2: y) have mixed types" of a large file with a malformed
            # value: `validate_table` names that value, its series and its row.
            warnings.simplefilter("ignore", pd.errors.DtypeWarning)
            frame = pd.read_csv(table, encoding=encoding, **options)
            if not frame.index.equals(pd.RangeIndex(len(frame))) and _ends_in_extra_field(
                os.fspath(table), frame
            ):
                options["index_col"] = False
                # pandas' "Length of header ... loss of data": only empty fields are lost.
                warnings.simplefilter("ignore", pd.errors.ParserWarning)
                frame = pd.read_csv(table, encoding=encoding, **options)
                warnings.warn(
                    f"{os.fspath(table)}: its rows end with an extra empty field (a delimiter "
                    f"after the last of the header's {len(frame.columns)} names, e.g. line 2); "
                    "read without it",
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
        frame.attrs[_READ_FROM] = (os.fspath(table), len(frame))  # for `file_rows`
        _record_header(table, encoding, frame, options)
        # Only a table without its id column: a one-column file may hold such texts.
        sep = None if id_col in (None, *frame.columns) else _separator(frame.columns, ";\t|")
        if sep is not None:
            raise ValueError(
                f"{os.fspath(table)} looks separated by {sep!r}, not commas: its header reads "
                f"as the one column {frame.columns[0]!r}. Write a comma-separated copy, e.g. "
                f"pandas.read_csv(path, sep={sep!r}).to_csv(new_path, index=False) (add "
                "decimal=',' to read_csv if its numbers are written with decimal commas)"
            )
        fitted = fitted or {}
        wanted = _fitted_text_columns(frame, fitted)
        # The id column, and the categorical ones the vocabulary does not decide.
        ruled = [id_col] if id_col is not None else []
        ruled += [c for c in categorical if c not in fitted and c not in ruled]
        ruled = [c for c in ruled if c in frame.columns and ptypes.is_numeric_dtype(frame[c])]
        read = list(dict.fromkeys([*wanted, *ruled]))
        if not read:
            return frame
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pd.errors.ParserWarning)  # as above
            as_text = pd.read_csv(
                table, encoding=encoding, usecols=read, dtype=str, **options
            )  # read once
        texts = _fitted_texts(frame, as_text, fitted, wanted)
        for column in ruled:
            if column not in texts and _numbers_change(frame[column], as_text[column]):
                texts[column] = as_text[column]
        for column, values in texts.items():
            frame[column] = values
        return frame
    except UnicodeDecodeError as error:
        where = _undecodable(os.fspath(table), encoding) or (error.object[error.start], None)
        at = "" if where[1] is None else f" at offset {where[1][0]}, line {where[1][1]}"
        raise ValueError(
            f"{os.fspath(table)} is not {encoding} text (byte {where[0]:#x}{at}); pass its "
            "encoding, e.g. encoding='latin-1' (--encoding latin-1)"
        ) from None
    except LookupError:
        raise ValueError(f"unknown encoding {encoding!r} for {os.fspath(table)}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ValueError(f"{os.fspath(table)} cannot be read as CSV: {error}") from None
    except (EOFError, OSError, ValueError, zlib.error, lzma.LZMAError, zipfile.BadZipFile,
            tarfile.TarError) as error:  # fmt: skip
        message = _archive_error(os.fspath(table), error)
        if message is None:
            raise
        raise ValueError(message) from None


# The compression pandas infers from a file name's ending (`read_csv`'s
# compression='infer'), in its order: a '.tar.gz' is a tar archive, which `tarfile`
# opens compressed with gzip, bzip2 or xz, or not, whatever its ending.
_INFERRED: tuple[tuple[str, str], ...] = (
    (".tar", "tar"),
    (".tar.gz", "tar"),
    (".tar.bz2", "tar"),
    (".tar.xz", "tar"),
    (".gz", "gzip"),
    (".bz2", "bzip2"),
    (".zip", "zip"),
    (".xz", "xz"),
    (".zst", "zstandard"),
)


def _endings(kind: str) -> tuple[str, ...]:
    """The name endings from which pandas infers compression `kind` ('gzip': ('.gz',))."""
    return tuple(ending for ending, inferred in _INFERRED if inferred == kind)


_TAR_ENDINGS = _endings("tar")
# What pandas says of an archive that holds other than one file.
_ARCHIVE_FILES = re.compile(r"^(Multiple|Zero) files found in (ZIP file|TAR archive)")


def _inferred_compression(path: str) -> str | None:
    """The compression pandas infers from `path`'s name ('gzip', 'tar'), or None."""
    name = path.lower()
    return next((kind for ending, kind in _INFERRED if name.endswith(ending)), None)


def _archive_error(path: str, error: Exception) -> str | None:
    """The one-line message for `error`, raised reading the compressed file `path`, or None.

    Decompressing a damaged or truncated file raises what the compression's
    module raises (`EOFError` for a truncated gzip, bzip2 or xz file,
    `gzip.BadGzipFile` for a failed CRC, `zlib.error`, `zipfile.BadZipFile`,
    `tarfile.ReadError`), naming no file; an archive of several files gets
    pandas' "Multiple files found in ZIP file", without the path. Each is said
    with the path and what to do. None for an error of another kind (an
    `OSError` with an errno, such as a permission denied, says it itself),
    or of a file whose name infers no compression, which is then raised as
    it is.
    """
    kind = _inferred_compression(path)
    if kind is None:
        return None
    text = str(error).strip()
    if isinstance(error, ValueError):
        if _ARCHIVE_FILES.match(text) is None:
            return None
        names = _archive_names(path, kind)
        held = "no file" if not names else f"{len(names)} files ({first_few(names)})"
        return (
            f"{path} is a {kind} archive holding {held}; pandas reads an archive holding one "
            "CSV file: extract the CSV to read and pass it (or an archive holding it alone)"
        )
    if isinstance(error, OSError) and error.errno is not None:
        return None
    # tarfile's ReadError lists each compression it tried, a line each: the last is tar's.
    detail = text.splitlines()[-1].strip(" -") if text else type(error).__name__
    if kind == "tar":
        ending = max((e for e in _TAR_ENDINGS if path.lower().endswith(e)), key=len)
        return (
            f"{path} is not a tar archive, or a damaged or truncated one ({detail}): "
            f"download or create it again, or pass the CSV it holds (if it is plain CSV "
            f"text, rename it without {ending!r})"
        )
    return (
        f"{path} is a damaged or truncated {kind} file ({detail}): download or compress it "
        "again, or pass the CSV uncompressed"
    )


def _archive_names(path: str, kind: str) -> list[str]:
    """The names of the files a zip or tar archive holds, as pandas lists them."""
    try:
        if kind == "zip":
            with zipfile.ZipFile(path) as archive:
                return archive.namelist()
        with tarfile.open(path) as archive:
            return archive.getnames()
    except (OSError, EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile, tarfile.TarError):
        return []


def _undecodable(path: str, encoding: str) -> tuple[int, tuple[int, int]] | None:
    """`(byte, (offset, line))` of the first byte of a plain file that is not `encoding` text.

    pandas decodes a file in chunks, and its error's offset counts from the
    chunk's start (a bad byte on line 2 was reported at offset 0). The file is
    decoded here in chunks too (a large file is never held whole), the offset
    counted from the file's start (a byte-order mark included) and the line
    from the text decoded before the byte. None for a compressed file (its
    offsets are not the file's) or one that decodes.
    """
    if _inferred_compression(path) is not None:
        return None
    try:
        decoder = codecs.getincrementaldecoder(encoding)()
        lines, read = 0, 0
        with open(path, "rb") as file:
            while True:
                chunk = file.read(_DECODE_CHUNK)
                state = decoder.getstate()
                try:
                    lines += decoder.decode(chunk, final=not chunk).count("\n")
                except UnicodeDecodeError as error:
                    # The decoder's input ends with `chunk` (a byte-order mark dropped, bytes
                    # of an unfinished character kept from the chunk before).
                    offset = read + len(chunk) - len(error.object) + error.start
                    decoder.setstate(state)
                    before = decoder.decode(chunk[: max(offset - read, 0)])
                    return error.object[error.start], (offset, lines + before.count("\n") + 1)
                read += len(chunk)
                if not chunk:
                    return None
    except (OSError, LookupError):
        return None


# Bytes `_undecodable` decodes at a time.
_DECODE_CHUNK = 1 << 20


def _ends_in_extra_field(path: str, frame: pd.DataFrame) -> bool:
    """Whether a CSV's rows end in an empty field its header does not name; raises for data.

    `frame`: the file as pandas reads rows one field longer than the header,
    the first field the index and the last one the last column. A delimiter
    ending each row (an export writing 'A,2024-01-01,0,99.1,') leaves that
    column empty: True, the file is to be read without it (`index_col=False`).
    Otherwise distinct first fields are row labels (R's `write.table` writes
    a label before each row and none in the header): False, pandas' reading
    stands. A repeated first field (an id, a time) with a value past the
    header is refused, not shifted: the header lacks a name.
    """
    last = frame.iloc[:, -1] if len(frame.columns) else pd.Series(dtype=object)
    given = last.notna().to_numpy()
    if not given.any():
        return True
    if frame.index.is_unique:
        return False
    row = int(np.flatnonzero(given)[0])
    raise ValueError(
        f"{path}: line {row + 2} has {len(frame.columns) + 1} fields, one more than the "
        f"header (line 1) names ({len(frame.columns)}: {first_few(list(map(repr, frame.columns)))}"
        f"), and its last one is not empty ({plain_value(last.iloc[row])!r}): give that field "
        f"a name in the header, or remove it from the rows (its first fields repeat, "
        f"{plain_value(frame.index[frame.index.duplicated()][0])!r} on more than one line: "
        "not row labels)"
    )


def _record_header(
    table: str | os.PathLike, encoding: str, frame: pd.DataFrame, options: Mapping[str, Any]
) -> None:
    """Records in `frame.attrs` the header of a CSV that repeats a name (`_file_header`).

    pandas renames a repeated 'sales' to 'sales.1': the header is read again
    as plain text (its first line alone) where a label looks so renamed.
    """
    if not any(isinstance(c, str) and re.search(r"\.\d+$", c) for c in frame.columns):
        return
    first = pd.read_csv(
        table, encoding=encoding, header=None, nrows=1, dtype=str,
        **{**options, "index_col": False},
    )  # fmt: skip
    if len(first) != 1 or len(first.columns) != len(frame.columns):
        return
    read = list(frame.columns)
    names = [
        name if isinstance(name, str) else label
        for name, label in zip(first.iloc[0], read, strict=True)
    ]
    if names != read:
        frame.attrs[_HEADER] = (os.fspath(table), tuple(names), tuple(read))


# What a file's first bytes say it is, when pandas would read it as text: the kind, and the
# file name endings from which pandas infers that compression (and so decompresses it).
# A tar archive's magic is not at its start: `_is_tar`.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"PK\x03\x04", "zip"),
    (b"PK\x05\x06", "zip"),  # an archive of no file: its end record alone
    (b"BZh", "bzip2"),  # then a digit 1-9 and the block magic: `_is_kind`
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstandard"),
    (b"PAR1", "parquet"),  # and at the file's end: `_is_kind`; no ending pandas infers
)


def _check_file_kind(path: str, encoding: str) -> None:
    """Raises for a file whose first bytes say pandas would read it as other text than it is.

    A compressed file or tar archive whose name lacks the ending from which
    pandas infers it ('sales.csv' holding gzip or tar, 'sales.csv.gz' holding
    a compressed tar archive), a plain file named '.gz', an Excel workbook or
    Parquet file, and UTF-16 text (its byte-order mark) read in another
    encoding: each read as garbled text, or failed with "pass
    encoding='latin-1'", which fixes none of them. A file named '.tar' (or
    '.tar.gz' ...) is left to `tarfile`, which opens one compressed or not
    whatever the ending (and knows old archives without the 'ustar' magic):
    `read_table` names the file when it cannot.
    """
    try:
        with open(path, "rb") as file:
            head = file.read(_TAR_BLOCK)
            file.seek(max(os.fstat(file.fileno()).st_size - 4, 0))
            tail = file.read(4)
    except OSError:
        return  # pandas' own error says why
    name = path.lower()
    if name.endswith(_TAR_ENDINGS):
        return
    if _is_tar(head):
        raise ValueError(
            f"{path} is a tar archive (its header says so), but its name does not end in "
            "'.tar', from which pandas infers that: it would read the archive's bytes as CSV "
            "text; rename it to end in '.tar' (e.g. sales.tar), or extract the CSV from it"
        )
    for magic, kind in _MAGIC:
        if not _is_kind(head, tail, magic, kind):
            continue
        endings = _endings(kind)
        if _is_tar(_decompressed_head(path, kind)):
            ending = next((e for e in _TAR_ENDINGS if e.endswith(endings)), ".tar")
            article = "an" if kind == "xz" else "a"
            raise ValueError(
                f"{path} is {article} {kind}-compressed tar archive, but its name does not end "
                f"in {ending!r}, from which pandas infers that: it would read the archive's "
                f"bytes as CSV text; rename it to end in {ending!r} (e.g. sales{ending}), or "
                "extract the CSV from it"
            )
        if name.endswith(endings):
            return
        if kind == "parquet":
            raise ValueError(
                f"{path} is a Parquet file, not CSV text: pass it as a DataFrame "
                "(pandas.read_parquet(path)), or write a CSV copy, e.g. "
                "pandas.read_parquet(path).to_csv(new_path, index=False)"
            )
        if kind == "zip" and (name.endswith((".xlsx", ".xlsm")) or _is_workbook(path)):
            raise ValueError(
                f"{path} is an Excel workbook, not CSV text: save it as CSV (in Excel: Save "
                "As, 'CSV UTF-8'), or write a copy, e.g. pandas.read_excel(path).to_csv("
                "new_path, index=False)"
            )
        raise ValueError(
            f"{path} is {kind}-compressed (its first bytes are {kind}'s), but its name does "
            f"not end in {endings[0]!r}, from which pandas infers that: rename it to end in "
            f"{endings[0]!r} (e.g. sales.csv{endings[0]}), or decompress it"
        )
    for _, kind in _MAGIC:
        named = next((e for e in _endings(kind) if name.endswith(e)), None)
        if named is not None and head:  # not of that kind: its magic is not at its start
            raise ValueError(
                f"{path} is named {named!r} but is not {kind}-compressed (it begins with "
                f"{head[:4]!r}): if it is plain CSV text, rename it without {named!r}"
            )
    utf16 = head.startswith((b"\xff\xfe", b"\xfe\xff"))
    try:
        codec = codecs.lookup(encoding).name
    except LookupError:
        return  # `read_table` names the unknown encoding
    if utf16 and not codec.startswith(("utf-16", "utf-32")):
        raise ValueError(
            f"{path} is UTF-16 text (it begins with the byte-order mark "
            f"{head[:2].hex(' ').upper()}), not {encoding}: pass encoding='utf-16' "
            "(--encoding utf-16)"
        )


def _is_kind(head: bytes, tail: bytes, magic: bytes, kind: str) -> bool:
    """Whether a file beginning with `head` (10 bytes) and ending with `tail` is of `kind`.

    bzip2's and Parquet's magic are ASCII ('BZh', 'PAR1'), which a CSV header
    may begin with: bzip2 also needs its block size digit and block magic,
    Parquet its magic at the end too.
    """
    if not head.startswith(magic):
        return False
    if kind == "bzip2":
        return head[3:4] in b"123456789" and head[3:4] != b"" and head[4:10] == b"1AY&SY"
    if kind == "parquet":
        return tail == magic
    return True


# A tar archive's header block: its size, and where in it the POSIX and GNU magic lies.
_TAR_BLOCK = 512
_TAR_MAGIC_AT = 257


def _is_tar(block: bytes) -> bool:
    """Whether `block`, the first bytes of a file, is a tar header.

    Its magic at offset 257 ('ustar' then NUL and version '00', POSIX, or two
    spaces and NUL, GNU) and its checksum both: text can hold 'ustar' there
    ('custard').
    """
    magic = block[_TAR_MAGIC_AT : _TAR_MAGIC_AT + 8]
    if magic not in (b"ustar\x0000", b"ustar  \x00"):
        return False
    try:
        tarfile.TarInfo.frombuf(block[:512], "utf-8", "surrogateescape")
    except tarfile.TarError:
        return False
    return True


def _decompressed_head(path: str, kind: str) -> bytes:
    """The first `_TAR_BLOCK` bytes `path` decompresses to, for a compression `tarfile`
    opens (gzip, bzip2, xz); empty for another kind, or where they do not decompress
    (`read_table` names a damaged file when pandas fails to read it)."""
    openers: dict[str, Callable[[str, Literal["rb"]], io.BufferedIOBase]] = {
        "gzip": gzip.open,
        "bzip2": bz2.open,
        "xz": lzma.open,
    }
    opener = openers.get(kind)
    if opener is None:
        return b""
    try:
        with opener(path, "rb") as file:
            return file.read(_TAR_BLOCK)
    except (OSError, EOFError, zlib.error, lzma.LZMAError):
        return b""


def _is_workbook(path: str) -> bool:
    """Whether a zip file is an Excel workbook (.xlsx: it holds 'xl/workbook.xml')."""
    try:
        with zipfile.ZipFile(path) as archive:
            return "xl/workbook.xml" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _fitted_text_columns(frame: pd.DataFrame, fitted: Mapping[str, Sequence[Any]]) -> list[str]:
    """The columns of `frame` pandas read as numbers (or bools) whose fitted values are text."""
    return [
        column
        for column, values in fitted.items()
        if column in frame.columns
        and len(values) > 0
        and all(isinstance(value, str) for value in values)
        and (ptypes.is_numeric_dtype(frame[column]) or ptypes.is_bool_dtype(frame[column]))
    ]


def _fitted_texts(
    frame: pd.DataFrame,
    as_text: pd.DataFrame,
    fitted: Mapping[str, Sequence[Any]],
    wanted: Sequence[str],
) -> dict[str, pd.Series]:
    """`{column: the CSV's texts}` of each `wanted` column to read as text for `fitted`.

    `wanted`: `_fitted_text_columns`; `as_text`: the CSV's columns read as
    text. A column holding numbers stays as pandas read it: one with a text
    the fitted values lack whose number is an integer they hold as text.
    """
    texts = {}
    for column in wanted:
        known = set(fitted[column])
        numbers = frame[column].astype("float64")
        new = as_text[column].notna().to_numpy() & ~as_text[column].isin(known).to_numpy()
        twins = [
            bool(np.isfinite(number)) and number == np.round(number) and str(int(number)) in known
            for number in numbers[new]
        ]
        if not any(twins):
            texts[column] = as_text[column]
    return texts


def _numbers_change(numbers: pd.Series, texts: pd.Series) -> bool:
    """Whether the numbers pandas read from a CSV's id (or categorical) column lose what
    its `texts` say.

    That is when a text has a leading zero ('001', '-07', '0.5' excepted) or two
    different texts are one number ('1', '1.0', '01'); otherwise the numbers
    are the ids.
    """
    given = texts.notna()
    stripped = texts[given].str.strip()
    if stripped.str.match(r"^[+-]?0\d").any():
        return True
    return bool((stripped.groupby(numbers[given]).nunique() > 1).any())


def plain_value(value: Any) -> Any:
    """A series id or category as the table holds it, NumPy scalars as Python ones.

    For messages and JSON: `repr` of an id read from an int64 column is
    `np.int64(7)` under NumPy 2, which names no id the user wrote, and `json`
    cannot write a NumPy scalar.
    """
    return value.item() if isinstance(value, np.generic) else value


def _require_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


# A date written with day and month before the year, in either order, one separator
# twice: '02/01/2024', '2.1.24'.
_TWO_BEFORE_YEAR = r"^\s*(?P<first>\d{1,2})(?P<sep>[/.-])(?P<second>\d{1,2})(?P=sep)\d{2,4}"


def _format_hint(values: pd.Series) -> str:
    """A hint for day-first dates when the texts look like dd/mm/yyyy (or dd.mm.yy, dd-mm-yyyy)."""
    text = values.astype("string")
    matches = text.str.match(_TWO_BEFORE_YEAR).fillna(False)
    if matches.mean() <= 0.5:
        return ""
    pattern = _day_first_format(str(text[matches.to_numpy()].iloc[0]).strip())
    return f"; the times look like day/month/year: {_day_first_fix(pattern)}"


def _day_first_fix(time_format: str) -> str:
    """How to read times day first: the option, and the format of a text such as '02/01/2024'."""
    return f"pass dayfirst=True (--dayfirst) or time_format={time_format!r} (--time-format)"


def _day_first_format(text: str) -> str:
    """The day-first format of a date text such as '02/01/2024' ('%d/%m/%Y') or '2.1.24'."""
    separator = next(character for character in text if character in "/.-")
    year = "%Y" if len(re.split(r"[/.-]", text)[2].split()[0]) == 4 else "%y"
    return separator.join(("%d", "%m", year))


@dataclasses.dataclass(frozen=True)
class _DayMonthTexts:
    """Time texts pandas reads month first that read day first as well ('02/01/2024').

    Attributes:
      example: one whose two readings differ.
      time_format: their day-first format ('%d/%m/%Y').
    """

    example: str
    time_format: str

    def readings(self) -> str:
        """How `example` reads: "'02/01/2024' is 2024-02-01 as read (month first), ..."."""
        with warnings.catch_warnings():  # a reading shown, not one made
            warnings.simplefilter("ignore")
            month_first = pd.to_datetime(self.example, dayfirst=False)
            day_first = pd.to_datetime(self.example, dayfirst=True)
        return (
            f"{self.example!r} is {month_first:%Y-%m-%d} as read (month first), "
            f"{day_first:%Y-%m-%d} day first"
        )

    def hint(self) -> str:
        """A hint for a refusal the times may cause: they may be day/month/year."""
        return (
            f"; if the times are day/month/year ({self.readings()}), "
            f"{_day_first_fix(self.time_format)}"
        )


def _ambiguous_day_month(values: pd.Series, spec: TableSpec) -> _DayMonthTexts | None:
    """Whether a time column's texts read day first as well as month first, as pandas read them.

    That is when every distinct text is written with two numbers before the
    year, each at most 12, not all alike ('02/01/2024'), and neither
    `time_format` nor `dayfirst` says how to read them: pandas read them
    month first, a guess that holds no time off the grid. Only the first text
    is looked at unless it is so written; then each distinct text once.
    """
    if spec.time_format is not None or spec.dayfirst or len(values) == 0:
        return None
    if not ptypes.is_string_dtype(values.dtype) or isinstance(values.dtype, pd.CategoricalDtype):
        return None
    first = values.iloc[0]
    if not isinstance(first, str) or re.match(_TWO_BEFORE_YEAR, first) is None:
        return None
    distinct = values.dropna().drop_duplicates().astype(str)
    parts = distinct.str.extract(_TWO_BEFORE_YEAR)[["first", "second"]]
    if parts.isna().any(axis=None):
        return None
    numbers = parts.astype(int).to_numpy()
    differ = numbers[:, 0] != numbers[:, 1]
    if (numbers > 12).any() or not differ.any():
        return None
    example = distinct.iloc[int(np.flatnonzero(differ)[0])].strip()
    return _DayMonthTexts(example, _day_first_format(example))


def _day_first_times(times: pd.Series) -> pd.Series | None:
    """Naive times read from texts month first, as read day first (day and month swapped).

    None for aware times, or where a swap is no date (a day above 12).
    """
    if times.dt.tz is not None:
        return None
    parts = {
        "year": times.dt.year,
        "month": times.dt.day,
        "day": times.dt.month,
        "hour": times.dt.hour,
        "minute": times.dt.minute,
        "second": times.dt.second,
    }
    try:
        return pd.to_datetime(pd.DataFrame(parts))
    except (ValueError, OverflowError):
        return None


def parse_time_text(value: Any, time_format: str | None, dayfirst: bool) -> pd.Timestamp:
    """One time given by a user (a cut such as `validation_start`), read as the table's times.

    ISO 8601 text ('2024-03-02') is read as such; other text in
    `time_format`, else with `dayfirst` ('02/03/2024' is 2 March with it):
    a plain `pd.Timestamp` read it month first while the table was read day
    first. Raises `ValueError` (pandas') for text it cannot read.
    """
    if not isinstance(value, str):
        return pd.Timestamp(value)
    try:
        return pd.Timestamp(pd.to_datetime(value, format="ISO8601"))
    except (ValueError, TypeError, OverflowError):
        pass
    if time_format is not None:
        try:
            return pd.Timestamp(pd.to_datetime(value, format=time_format))
        except (ValueError, TypeError, OverflowError):
            pass
    return pd.Timestamp(pd.to_datetime(value, dayfirst=dayfirst))


def _mixed_offsets(error: Exception) -> bool:
    """Whether a `pd.to_datetime` error is about texts with several UTC offsets."""
    return "mixed timezones" in str(error).lower()


def _offset_zones(values: pd.Series) -> str:
    """Zones fitting the UTC offsets written in `values` ('+01:00', '+02:00'), as an example."""
    instants, offsets = [], []
    for value in values.dropna().drop_duplicates().iloc[:256]:
        try:
            stamp = pd.Timestamp(value)
        except (ValueError, TypeError, OverflowError):
            continue
        if stamp.tz is not None:
            instants.append(stamp.tz_convert("UTC"))
            offsets.append(stamp.utcoffset())
    zones = zones_with_offsets(pd.DatetimeIndex(instants), offsets) if instants else []
    return f"e.g. {describe(zones)}" if zones else "its IANA name"


def _in_zone(parsed: pd.Series, timezone: str | None, column: str, values: pd.Series) -> pd.Series:
    """Times parsed to UTC from texts with mixed UTC offsets, in `timezone` when given.

    Texts such as '2024-04-06T00:00:00+11:00' and '2024-04-08T00:00:00+10:00'
    (midnights either side of a daylight-saving change) can only be parsed to
    one zone by going through UTC; read back in their own zone they are on the
    daily grid again, as the same times given as tz-aware datetimes are.
    Without `timezone` they stay in UTC, and the calendar features (hour of
    day, day of week) are then UTC's, not the local ones: said in a warning.
    """
    if timezone is not None:
        return parsed.dt.tz_convert(timezone)
    warnings.warn(
        f"{column} holds times with different UTC offsets; they are read in UTC, so hour of "
        "day and day of week are UTC's. If they are local times of one zone (daylight "
        f"saving changes the offset), pass it as timezone= (--timezone), "
        f"{_offset_zones(values)}",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
    return parsed


def _parse_times(
    values: pd.Series,
    column: str,
    ids: pd.Series,
    time_format: str | None = None,
    dayfirst: bool = False,
    timezone: str | None = None,
    *,
    rows: FileRows | None = None,
) -> pd.Series:
    """Parses a time column to datetimes, naming the first bad value if any.

    `rows`: where the rows are in the CSV file they were read from
    (`file_rows`), so that a message names a bad value's file line too.

    Texts with mixed UTC offsets are parsed to UTC and then, with `timezone`
    given, converted to it (`_in_zone`). With `timezone` given, all aware times
    (datetimes, or texts of one offset) are converted to it: the same
    instants, read in the zone the calendar is read in, so a daily or coarser
    grid is that zone's (UTC instants of Berlin midnights are 23:00 in winter
    and 22:00 in summer: off any UTC daily grid).
    """
    parsed = _parse_time_values(values, column, ids, time_format, dayfirst, timezone, rows)
    if timezone is not None and parsed.dt.tz is not None:
        return parsed.dt.tz_convert(timezone)
    return parsed


def _is_aware(value: Any, time_format: str | None, dayfirst: bool) -> bool | None:
    """Whether one time value carries a zone or UTC offset; None if it cannot be read alone."""
    if isinstance(value, datetime.datetime):
        return value.tzinfo is not None
    if isinstance(value, datetime.date | np.datetime64):
        return False
    try:  # fast, and the zone does not depend on the day/month order
        return pd.Timestamp(value).tz is not None
    except (ValueError, TypeError, OverflowError):
        pass
    try:
        return pd.to_datetime(value, format=time_format, dayfirst=dayfirst).tz is not None
    except (ValueError, TypeError, OverflowError):
        return None


def _check_all_aware(
    values: pd.Series,
    column: str,
    ids: pd.Series,
    time_format: str | None,
    dayfirst: bool,
    rows: FileRows | None = None,
) -> None:
    """Raises when times about to be parsed through UTC include some with no zone or offset.

    `pd.to_datetime(..., utc=True)` reads a naive time ('2024-01-01 00:00', a
    naive datetime) as UTC: a guess of its zone. Such a column (e.g.
    `pd.concat` of a naive and an aware table) is refused, naming one time of
    each kind.
    """
    example: dict[bool, Any] = {}
    for value in pd.unique(values.to_numpy(dtype=object)):
        kind = _is_aware(value, time_format, dayfirst)
        if kind is not None:
            example.setdefault(kind, value)
        if len(example) == 2:
            break
    if len(example) < 2:
        return

    def row_of(wanted: Any) -> int:
        for row, value in enumerate(values):
            if type(value) is type(wanted) and value == wanted:
                return row
        return 0  # not reached: `wanted` is one of `values`

    naive, aware = row_of(example[False]), row_of(example[True])
    raise ValueError(
        f"column {column!r} mixes times with no zone or UTC offset, e.g. "
        f"{values.iloc[naive]!r} in series {plain_value(ids.iloc[naive])!r} at "
        f"{row_text(naive, rows)}, with times that have one, e.g. {values.iloc[aware]!r} in "
        f"series {plain_value(ids.iloc[aware])!r} at {row_text(aware, rows)}; "
        "reading the naive ones as UTC would guess their zone: give every time its zone "
        "(tz_localize) or offset, or none"
    )


def _holds_numbers(values: pd.Series) -> bool:
    """Whether a time column holds numbers: of a numeric or bool dtype, or objects all numbers.

    `pd.to_datetime` reads a column of objects that are all ints (1950, 1951)
    as nanoseconds since 1970, silently, where the same ints as int64 are
    refused as numbers.
    """
    if ptypes.is_numeric_dtype(values) or ptypes.is_bool_dtype(values):
        return True
    return values.dtype == object and ptypes.infer_dtype(values, skipna=True) in (
        "integer",
        "floating",
        "mixed-integer-float",
    )


def _holds_integers(values: pd.Series) -> bool:
    """Whether a time column holds integers only (an integer dtype, or objects all ints)."""
    if ptypes.is_integer_dtype(values):
        return True
    return values.dtype == object and ptypes.infer_dtype(values, skipna=True) == "integer"


def _numbers_hint(values: pd.Series, column: str) -> str:
    """How to read a time column of numbers: as years where every one has four digits
    (1950, read with unit='s' as 1970-01-01 00:32:30), else as seconds or as digits such
    as 20240131."""
    if _holds_integers(values):
        numbers = pd.to_numeric(values)
        if bool(((numbers >= 1000) & (numbers <= 9999)).all()):
            return (
                f"they look like years (e.g. {plain_value(numbers.iloc[0])}): give "
                "time_format='%Y' (--time-format), with freq='YS' for one row a year"
            )
    return (
        f"convert it first, e.g. pd.to_datetime(df[{column!r}], unit='s') for seconds since "
        "1970, or give time_format='%Y%m%d' for dates written as digits such as 20240131"
    )


# pandas' warning when it reads each time text on its own (dateutil), having inferred no format.
_ONE_BY_ONE = "Could not infer format"

# Formats tried on texts pandas infers none for, to name one that reads them all.
_TEXT_FORMATS = (
    "%b %Y", "%B %Y", "%b-%Y", "%b-%y", "%b %y", "%Y %b", "%b %d %Y", "%b %d, %Y",
    "%B %d, %Y", "%d %b %Y", "%d %B %Y", "%d-%b-%Y", "%d-%b-%y", "%a %b %d %Y",
)  # fmt: skip

# A quarter written as text: '2020Q1', '2020-Q1', '2020 Q1'.
_QUARTER_TEXT = r"\s*\d{4}[- ]?[Qq][1-4]\s*"


def _to_datetime_inferred(values: pd.Series, **options: Any) -> tuple[pd.Series, bool]:
    """`pd.to_datetime(values, **options)`, and whether pandas read each text on its own.

    pandas' own warning for that ('Could not infer format ... falling back to
    dateutil') is held back, for `_announce_one_by_one` to say once what to
    pass; every other warning is passed on as it came.
    """
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            parsed = pd.to_datetime(values, **options)
    finally:  # pandas' other warnings pass on, also where it raises
        held = [w for w in caught if _is_one_by_one(w)]
        for warning in caught:
            if warning not in held:
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
    return parsed, bool(held)


def _is_one_by_one(warning: warnings.WarningMessage) -> bool:
    """Whether a warning is pandas' for reading each time text on its own (`_ONE_BY_ONE`)."""
    return issubclass(warning.category, UserWarning) and str(warning.message).startswith(
        _ONE_BY_ONE
    )


def _matching_format(values: pd.Series, parsed: pd.Series) -> str | None:
    """One of `_TEXT_FORMATS` that reads each distinct text of `values` as `parsed` has it.

    Each format is tried on the first 20 distinct texts before all of them:
    on a table of many distinct times, most formats fail at once.
    """
    first = ~values.duplicated().to_numpy()
    texts, wanted = values[first].astype(str), pd.DatetimeIndex(parsed[first])
    if wanted.tz is not None:
        return None

    def reads(candidate: str, count: int | None) -> bool:
        read = pd.to_datetime(texts[:count], format=candidate, errors="coerce")
        return bool(read.notna().all()) and pd.DatetimeIndex(read).equals(wanted[:count])

    return next((c for c in _TEXT_FORMATS if reads(c, 20) and reads(c, None)), None)


def _announce_one_by_one(values: pd.Series, parsed: pd.Series, column: str) -> None:
    """Warns that pandas read each time text on its own, with a way to read them in one pass.

    pandas infers no format for texts such as 'Jan 2020' or '2020Q1' and
    reads each with dateutil: slow on a large table, and a text it reads
    otherwise than the rest (a day-first date among month-first ones) is not
    told. Said in the words of this library instead of pandas' generic
    warning: a quarter is converted with `pd.PeriodIndex`, other texts are
    read with a format (named where one of `_TEXT_FORMATS` reads them all).
    """
    example = values.iloc[0]
    if bool(values.astype(str).str.fullmatch(_QUARTER_TEXT).all()):
        way = (
            f"for quarters, convert them once, e.g. df[{column!r}] = "
            f"pd.PeriodIndex(df[{column!r}], freq='Q').to_timestamp() (quarter starts, "
            "freq='QS')"
        )
    else:
        found = _matching_format(values, parsed)
        way = (
            f"pass time_format={found!r} (--time-format), which reads them all"
            if found is not None
            else "pass their format as time_format= (--time-format), e.g. '%b %Y' for 'Jan 2020'"
        )
    warnings.warn(
        f"column {column!r} holds times in no format pandas infers (e.g. {example!r}), so "
        f"each was read on its own (dateutil), slowly on a large table; {way}",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def _plain_times(values: pd.Series) -> pd.Series:
    """A time column of Arrow dates or timestamps, of categories or dictionary-encoded, as
    the plain column of its values; else `values`.

    pandas counts Arrow dates and timestamps (`read_parquet(dtype_backend=
    "pyarrow")`) as datetimes, yet their `.dt` has no `tz` (dates) and they
    merge with no NumPy datetime (a future's times with the history's grid):
    they become NumPy datetimes of the same instants, their zone kept. A
    `category` column is read as its categories' dtype: texts are parsed and
    numbers refused as those of a plain column are (`pd.to_datetime` would
    read integer categories as nanoseconds since 1970).
    """
    values = _decoded(values)
    if isinstance(values.dtype, pd.CategoricalDtype):  # integers with empty cells as objects
        empty = values.isna().to_numpy().any()
        values = values.astype(object if empty else values.cat.categories.dtype)
    if isinstance(values.dtype, pd.ArrowDtype) and ptypes.is_datetime64_any_dtype(values):
        return pd.Series(pd.DatetimeIndex(values), index=values.index, name=values.name)
    return values


def _parse_time_values(
    values: pd.Series,
    column: str,
    ids: pd.Series,
    time_format: str | None,
    dayfirst: bool,
    timezone: str | None,
    rows: FileRows | None = None,
) -> pd.Series:
    """`_parse_times` before aware times are converted to `timezone`."""
    empty = values.isna()
    if empty.any():
        row = int(np.flatnonzero(empty.to_numpy())[0])
        raise ValueError(
            f"column {column!r} has {int(empty.sum())} empty timestamps, the first in series "
            f"{plain_value(ids.iloc[row])!r} at {row_text(row, rows)}; drop or fill those rows"
        )
    values = _plain_times(values)
    if ptypes.is_datetime64_any_dtype(values):
        return values
    if isinstance(values.dtype, pd.PeriodDtype):  # not "unparseable": a period has two ends
        raise ValueError(
            f"column {column!r} holds periods ({values.dtype}), not timestamps; convert it, "
            f"e.g. df[{column!r}] = df[{column!r}].dt.to_timestamp() for period starts "
            "(monthly: freq='MS'), or .dt.to_timestamp(how='end').dt.normalize() for "
            "period ends (freq='ME')"
        )
    if time_format is not None and _holds_integers(values):
        values = values.astype(str)  # digits such as 20240131, read by the format given
    elif _holds_numbers(values):
        raise ValueError(
            f"column {column!r} holds numbers ({values.dtype}), not timestamps; "
            f"{_numbers_hint(values, column)}"
        )
    if time_format is not None:
        try:
            parsed = pd.to_datetime(values, format=time_format, errors="coerce")
        except ValueError as error:
            if not _mixed_offsets(error):
                raise
            _check_all_aware(values, column, ids, time_format, dayfirst, rows)
            parsed = _in_zone(
                pd.to_datetime(values, format=time_format, errors="coerce", utc=True),
                timezone,
                column,
                values,
            )
        bad = parsed.isna().to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"column {column!r} has {int(bad.sum())} times not in time_format="
                f"{time_format!r}, e.g. {values.iloc[row]!r} in series "
                f"{plain_value(ids.iloc[row])!r} at {row_text(row, rows)}"
            )
        return parsed
    if dayfirst:  # ISO 8601 texts are year-month-day: pandas read them year-day-month
        try:
            return pd.to_datetime(values, format="ISO8601")
        except (ValueError, TypeError, OverflowError) as error:
            if _mixed_offsets(error):
                _check_all_aware(values, column, ids, None, False, rows)
                in_utc = pd.to_datetime(values, format="ISO8601", utc=True)
                return _in_zone(in_utc, timezone, column, values)
    try:
        parsed, one_by_one = _to_datetime_inferred(values, dayfirst=dayfirst)
    except (ValueError, TypeError, OverflowError):
        pass
    else:
        if one_by_one:
            _announce_one_by_one(values, parsed, column)
        return parsed
    try:  # strings with mixed UTC offsets
        in_utc, one_by_one = _to_datetime_inferred(values, utc=True, dayfirst=dayfirst)
    except (ValueError, TypeError, OverflowError):
        pass
    else:
        _check_all_aware(values, column, ids, None, dayfirst, rows)
        if one_by_one:
            _announce_one_by_one(values, in_utc, column)
        return _in_zone(in_utc, timezone, column, values)
    hint = _format_hint(values) if not dayfirst else ""
    parsed = pd.to_datetime(values, errors="coerce", format="mixed", utc=True, dayfirst=dayfirst)
    bad = parsed.isna().to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"column {column!r} has {int(bad.sum())} unparseable timestamps, e.g. "
            f"{values.iloc[row]!r} in series {plain_value(ids.iloc[row])!r} at "
            f"{row_text(row, rows)}; fix them or write ISO 8601 times such as "
            f"'2015-01-01T13:00:00Z'{hint}"
        )
    _check_all_aware(values, column, ids, None, dayfirst, rows)
    inferred, _ = _to_datetime_inferred(values, errors="coerce", dayfirst=dayfirst)
    inferred = inferred.isna().to_numpy()
    unread = np.flatnonzero(inferred & values.notna().to_numpy())
    row = int(unread[0]) if unread.size else 0
    raise ValueError(
        f"column {column!r} has times that do not read in the format of its first time "
        f"{values.iloc[0]!r}, e.g. {values.iloc[row]!r} in series "
        f"{plain_value(ids.iloc[row])!r} at {row_text(row, rows)}; write all times in one "
        f"format (ISO 8601 such as '2015-01-01T13:00:00Z'){hint}"
    )


def _stray_bools(values: pd.Series) -> np.ndarray:
    """(R,) bool: the cells of an object column holding a bool (True) among numbers or texts.

    As a float such a cell would silently read 1.0 (or 0.0), a value no one
    wrote. A column of bools alone (with empty cells, hence of objects) is
    one of 0/1 values, read as such.
    """
    if values.dtype != object or ptypes.infer_dtype(values, skipna=True) not in (
        "mixed",
        "mixed-integer",
    ):
        return np.zeros(len(values), dtype=bool)
    bools = np.fromiter(
        (isinstance(v, bool | np.bool_) for v in values), dtype=bool, count=len(values)
    )
    others = values.notna().to_numpy() & ~bools
    return bools if others.any() else np.zeros(len(values), dtype=bool)


def _to_float(
    values: pd.Series,
    column: str,
    ids: pd.Series,
    *,
    rows: FileRows | None = None,
    offer_categorical: bool = True,
    times: pd.Series | None = None,
    announce_booleans: bool = False,
) -> pd.Series:
    """Converts a column to float64, naming the first non-numeric value if any.

    A bool among numbers in a column of objects (`_stray_bools`) is one of
    them. Where the non-numeric texts are numbers written with decimal commas
    or thousands separators ('12,5'), the message says how to read them.
    `rows`: as `_parse_times`'s. `offer_categorical`: whether the message
    offers categorical_cols (an input's, while a model is not yet fitted; a
    target is forecast as a number, and a fitted model's inputs are fixed).
    `times`: the rows' parsed times (aligned with `values`), so that a bad
    value is named with its time, as the other messages of a table name it,
    besides its row; None: the row only.

    A value whose magnitude is beyond float32's range (about 3.4e38) is
    refused, as an infinite one is: the model reads float32, and a fit would
    scale its series by that value (forecasting ~1e298 for a stray 1e300)
    where a forecast from a fitted model refuses it. Booleans (a bool dtype,
    or bools alone among empty cells) are read as 0/1; with
    `announce_booleans` (the target of a fit) that is announced by a warning:
    the quantiles of a yes/no target are forecast as numbers, which may lie
    outside [0, 1]. A boolean input is an ordinary 0/1 input, read silently.
    """

    def place(row: int) -> str:
        """'row 20 (line 22 of the file), time 2021-03-21 00:00:00' of the `row`-th value."""
        where = row_text(row, rows)
        return where if times is None else f"{where}, time {times.iloc[row]}"

    if ptypes.is_datetime64_any_dtype(values) or ptypes.is_timedelta64_dtype(values):
        # `pd.to_numeric` would read them as counts of the dtype's unit (a date as
        # 1.7e15 microseconds, or 1.7e18 nanoseconds), silently.
        dates = ptypes.is_datetime64_any_dtype(values)
        example = (
            f"a calendar feature such as df[{column!r}].dt.dayofweek, or a count of days"
            if dates
            else f"df[{column!r}].dt.days or df[{column!r}].dt.total_seconds()"
        )
        raise ValueError(
            f"column {column!r} holds {'datetimes' if dates else 'time spans'} (dtype "
            f"{values.dtype}), not numbers; convert it to the numbers the model should read "
            f"(e.g. {example})"
        )
    if ptypes.is_complex_dtype(values):
        _refuse_complex(values, column, ids, place(0))
    booleans = ptypes.is_bool_dtype(values) or (
        values.dtype == object and ptypes.infer_dtype(values, skipna=True) == "boolean"
    )
    if booleans and announce_booleans:
        warnings.warn(
            f"the target {column!r} holds booleans: read as 0/1 numbers; quantile forecasts "
            "of a yes/no target may lie outside [0, 1]",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    if ptypes.is_bool_dtype(values) or ptypes.is_numeric_dtype(values):
        numbers = values.astype("float64")
    else:
        numbers = _numbers_in(values)
        if ptypes.is_complex_dtype(numbers):  # objects among which a complex number
            row = int(np.flatnonzero([isinstance(v, complex | np.complexfloating)
                                      for v in values])[0])  # fmt: skip
            _refuse_complex(values, column, ids, place(row), row)
        numbers = numbers.astype("float64")
        bad = (numbers.isna() & values.notna()).to_numpy()
        bad = bad | _stray_bools(values)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            written = _written_numbers(values[bad], share=0.0)
            hint = ""
            if written is not None:
                at = int(np.flatnonzero(bad)[written.row])
                if isinstance(written, SeparatedNumbers):
                    kind = f"a number written with {written.separators}: {written.hint()}"
                else:
                    kind = f"a percentage: {written.hint(column)}"
                hint = (
                    f"; {values.iloc[at]!r} (series {plain_value(ids.iloc[at])!r}, "
                    f"{row_text(at, rows, nested=True)}) is {kind}"
                )
            categories = (
                ", or, for an input, list it in categorical_cols (--categorical-cols)"
                if offer_categorical
                else ""
            )
            raise ValueError(
                f"column {column!r} has {int(bad.sum())} non-numeric values, e.g. "
                f"{values.iloc[row]!r} in series {plain_value(ids.iloc[row])!r} at "
                f"{place(row)}; convert them to numbers (leave a cell empty to mark a "
                f"missing value){categories}{hint}"
            )
    infinite = np.isinf(numbers.to_numpy())
    if infinite.any():
        row = int(np.flatnonzero(infinite)[0])
        raise ValueError(
            f"column {column!r} has {int(infinite.sum())} infinite values, the first in series "
            f"{plain_value(ids.iloc[row])!r} at {place(row)}; replace them with numbers "
            "or leave them empty"
        )
    with np.errstate(invalid="ignore"):  # NaN, a missing value, is within range
        beyond = np.abs(numbers.to_numpy()) > _FLOAT32_MAX
    if beyond.any():
        row = int(np.flatnonzero(beyond)[0])
        # A power of ten that brings the largest magnitude within float32 (to 1-10).
        power = int(np.floor(np.log10(np.nanmax(np.abs(numbers.to_numpy())))))
        raise ValueError(
            f"column {column!r} has {int(beyond.sum())} values beyond float32 (largest "
            f"{_FLOAT32_MAX:.3g}), the first {numbers.iloc[row]:.6g} in series "
            f"{plain_value(ids.iloc[row])!r} at {place(row)}; model inputs must be finite in "
            "float32: correct them or leave them empty (a placeholder for a missing value?), "
            f"or rescale the column (e.g. divide it by 1e{power})"
        )
    return numbers


# The largest magnitude the model reads (its inputs are float32).
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _refuse_complex(
    values: pd.Series, column: str, ids: pd.Series, where: str, row: int = 0
) -> None:
    """Raises `TypeError` for a column of complex numbers, naming its first one.

    Cast to float64, NumPy drops the imaginary part with only a
    `ComplexWarning`: the model would read numbers no one wrote.
    """
    raise TypeError(
        f"column {column!r} holds complex numbers (dtype {values.dtype}), e.g. "
        f"{plain_value(values.iloc[row])!r} in series {plain_value(ids.iloc[row])!r} at "
        f"{where}; the model reads real numbers: convert them to the real numbers it should "
        f"read, e.g. df[{column!r}] = np.abs(df[{column!r}]) for the magnitude or "
        f"np.real(df[{column!r}]) for the real part"
    )


def _first_change(
    frame: pd.DataFrame, spec: TableSpec, column: str, series: Any, rows: FileRows | None
) -> str:
    """Where `column` of `series` first changes, in time order: the first value and its time,
    then the first other value, its time and row ("'big' at 2020-01-01 00:00:00, then
    'small' from 2020-02-03 00:00:00 (row 33)").

    `frame`: as `_check_statics` is given it, its index the rows' positions in the table.
    """
    group = frame.loc[frame[spec.id_col] == series, [spec.time_col, column]]
    group = group.sort_values(spec.time_col, kind="stable")
    values = group[column]
    first = values.iloc[0]
    changed = int(np.flatnonzero((values != first).to_numpy())[0])
    row = int(group.index[changed])
    return (
        f"{plain_value(first)!r} at {group[spec.time_col].iloc[0]}, then "
        f"{plain_value(values.iloc[changed])!r} from {group[spec.time_col].iloc[changed]} "
        f"({row_text(row, rows, nested=True)})"
    )


def _check_statics(frame: pd.DataFrame, spec: TableSpec, rows: FileRows | None = None) -> None:
    """Raises for a static column empty in a row or varying within a series (`rows`: as
    `_parse_times`'s)."""
    for column in spec.static_cols:
        empty = frame[column].isna().to_numpy()
        if empty.any():
            row = int(np.flatnonzero(empty)[0])
            raise ValueError(
                f"static column {column!r} is empty for series "
                f"{plain_value(frame[spec.id_col].iloc[row])!r} "
                f"({row_text(row, rows, nested=True)}); give every series a value"
            )
        counts = frame.groupby(spec.id_col, sort=False)[column].nunique()
        varying = counts[counts > 1]
        if len(varying):
            series = varying.index[0]
            change = _first_change(frame, spec, column, series, rows)
            raise ValueError(
                f"static column {column!r} takes {int(varying.iloc[0])} different values within "
                f"series {plain_value(series)!r}; it is {change}; a static must be constant per "
                f"series: give each series one value (e.g. its first: df[{column!r}] = "
                f"df.groupby({spec.id_col!r})[{column!r}].transform('first')), or move it to "
                "known_cols or observed_cols"
            )


def filled_inputs(spec: TableSpec, fill_categoricals: bool) -> list[str]:
    """The known and observed columns whose empty cells `to_regular_grid` fills.

    The real ones, and the categorical ones only with `fill_categoricals`
    (else an empty categorical cell is a value of its own, coded unknown).
    """
    inputs = [*spec.known_cols, *spec.observed_cols]
    if fill_categoricals:
        return inputs
    return [column for column in inputs if column not in spec.categorical_cols]


def _check_not_all_empty(frame: pd.DataFrame, spec: TableSpec, fill_categoricals: bool) -> None:
    # The series numbered once (in table order, as groupby's keys), not once per column.
    codes, ids = pd.factorize(frame[spec.id_col])
    for column in (spec.target, *filled_inputs(spec, fill_categoricals)):
        present = frame[column].notna().groupby(codes, sort=False).any().to_numpy()
        if not present.all():
            series = ids[np.flatnonzero(~present)[0]]
            raise ValueError(
                f"column {column!r} has no values at all for series {plain_value(series)!r}; "
                "drop that series or supply values"
            )


def first_duplicate(frame: pd.DataFrame, spec: TableSpec) -> tuple[int, int] | None:
    """`(row, count)`: the first row repeating an (id, time) pair and how many rows do; or None."""
    duplicated = frame.duplicated([spec.id_col, spec.time_col], keep=False).to_numpy()
    if not duplicated.any():
        return None
    return int(np.flatnonzero(duplicated)[0]), int(duplicated.sum())


def _check_duplicates(frame: pd.DataFrame, spec: TableSpec) -> None:
    """Raises naming a repeated (id, time) pair.

    Naive sub-daily times repeat one hour a year where they are local times
    of a zone with daylight saving (clocks go back): then the message says
    how to read them as that zone's instants instead of only "aggregate".
    """
    found = first_duplicate(frame, spec)
    if found is not None:
        row, count = found
        time = spec.time_col
        local = (
            f"; if the times are local times of a zone with daylight saving, the hour "
            f"repeated when clocks go back is two rows: localize them, e.g. df[{time!r}] = "
            f"df[{time!r}].dt.tz_localize('Europe/Berlin', ambiguous='infer') (rows in time "
            "order), and pass that zone as timezone="
            if frame[time].dt.tz is None and typical_step(spec.freq) < pd.Timedelta(days=1)
            else ""
        )
        raise ValueError(
            f"{count} rows repeat a ({spec.id_col!r}, {time!r}) pair, "
            f"e.g. series {plain_value(frame[spec.id_col].iloc[row])!r} at "
            f"{frame[time].iloc[row]}; "
            f"aggregate them (e.g. df.groupby([{spec.id_col!r}, {time!r}]).mean()) "
            f"or drop the duplicates{local}"
        )


def time_grid(
    start: pd.Timestamp,
    end: pd.Timestamp | None = None,
    *,
    periods: int | None = None,
    freq: Any,
) -> pd.DatetimeIndex:
    """`pd.date_range(start, end, periods, freq)` that keeps the local days a clock change cuts.

    Calendar steps (a day, a week, a month) of an aware `start` run in local
    wall time, and pandas raises where one lands on a time a clock change
    skips (midnight on 2024-09-08 in America/Santiago) or repeats (midnight
    on 2024-11-03 in America/Havana). Such a step is the first valid instant
    after the skipped time, or the first of the repeated one: what
    `tz_localize(zone, nonexistent="shift_forward", ambiguous=True)` makes of
    those local days, and how a table of them holds them.
    """
    offset = freq if isinstance(freq, pd.offsets.BaseOffset) else parse_frequency(freq)
    try:
        grid = pd.date_range(start, end, periods=periods, freq=offset)
        # Without its `freq`: appending aware ranges that carry one, pandas steps
        # past the last time of each, and raises where that lands on a skipped midnight.
        return pd.DatetimeIndex(grid, freq=None)
    except ValueError:
        zone = pd.Timestamp(start).tz
        if zone is None:
            raise
    wall = pd.Timestamp(start).tz_localize(None)
    wall_end = None if end is None else pd.Timestamp(end).tz_convert(zone).tz_localize(None)
    local = pd.date_range(wall, wall_end, periods=periods, freq=offset)
    return local.tz_localize(
        zone, nonexistent="shift_forward", ambiguous=np.ones(len(local), dtype=bool)
    )


def step_after(time: pd.Timestamp, freq: Any) -> pd.Timestamp:
    """The grid time one step of `freq` after `time`, in `time`'s zone, as `time_grid` steps."""
    return time_grid(time, periods=2, freq=freq)[-1]


def series_grid(times: pd.Series | pd.DatetimeIndex, freq: str) -> pd.DatetimeIndex:
    """Returns the regular grid of `freq` from the first to the last of sorted `times`."""
    return time_grid(times[0], times[-1], freq=freq)


def _zone_hint(times: pd.DatetimeIndex, spec: TableSpec) -> str:
    """A hint to read the times in their local zone when they are aware, in a fixed offset.

    Local days, weeks or months of a zone with daylight saving are not on a
    grid of UTC (or of any fixed offset): the same instants must be read in
    their zone. At fit that is `timezone=`; at predict (which has no such
    argument) it is converting the column, so both are said. With the times
    already in a zone whose offset changes over them, the hint does not apply.
    """
    if times.tz is None or len(times) == 0:
        return ""
    year = times[0].year
    winter, summer = (pd.Timestamp(f"{year}-{month}-15", tz=times.tz) for month in (1, 7))
    if winter.utcoffset() != summer.utcoffset():
        return ""
    column = spec.time_col
    # Local times of daily or coarser data keep one clock time; sub-daily data has none.
    whole_days = typical_step(spec.freq) >= pd.Timedelta(days=1)
    zones = zones_keeping_time_of_day(times) if whole_days else []
    zone = repr(zones[0]) if zones else "ZONE"
    named = f" (zones where they fall at one clock time: {describe(zones)})" if zones else ""
    return (
        f"; if they are local times of a zone with daylight saving (they are given in "
        f"{times.tz}, of one UTC offset all year){named}, read them in that zone: when "
        f"fitting, pass it as timezone= (--timezone), or convert the column, e.g. "
        f"df[{column!r}] = df[{column!r}].dt.tz_convert({zone})"
    )


def _utc_grid_hint(times: pd.DatetimeIndex, spec: TableSpec) -> str:
    """A hint when `timezone=` moved times that are on the `freq` grid in UTC off it.

    Daily data stamped at UTC midnights (a database's dates) read in a zone
    with daylight saving lands at 01:00 in winter and 02:00 in summer in
    Berlin: no daily grid of that zone holds both, so the refusal names the
    zone as its cause instead of leaving only "resample".
    """
    if spec.timezone is None or times.tz is None or len(times) == 0:
        return ""
    in_utc = times.tz_convert("UTC")
    if not in_utc.isin(series_grid(in_utc, spec.freq)).all():
        return ""
    return (
        f"; in UTC these times are on the freq={spec.freq!r} grid, read in timezone="
        f"{spec.timezone!r} they are not: pass timezone=None to read them in UTC, or, if "
        f"they stand for local dates, give them as that zone's times, e.g. "
        f"df[{spec.time_col!r}] = df[{spec.time_col!r}].dt.tz_localize(None)"
        f".dt.tz_localize({spec.timezone!r})"
    )


def _inferred_alias(times: pd.DatetimeIndex) -> str | None:
    """pandas' `infer_freq` of `times` as an alias ('MS', '30min'), or None when it reads none.

    Where pandas has the `future.infer_freq_returns_offset` option (its string
    result is deprecated there, a warning at every call) the offset is asked
    for and its alias returned; older pandas return the alias itself.
    """
    try:
        if _pandas_knows(_INFER_FREQ_OFFSET_OPTION):
            with pd.option_context(_INFER_FREQ_OFFSET_OPTION, True):
                found = pd.infer_freq(times)
        else:
            found = pd.infer_freq(times)
    except (TypeError, ValueError):
        return None
    if found is None:
        return None
    return found if isinstance(found, str) else found.freqstr


_INFER_FREQ_OFFSET_OPTION = "future.infer_freq_returns_offset"


def _pandas_knows(option: str) -> bool:
    """Whether this pandas has the option `option`."""
    try:
        pd.get_option(option)
    except pd.errors.OptionError:
        return False
    return True


def _recorded_alias(times: pd.DatetimeIndex, freq: str) -> str | None:
    """The frequency pandas reads in `times` (sorted) when it is not `freq`, else None."""
    if len(times) < 3:
        return None
    alias = _inferred_alias(times)
    if alias is None or to_offset(alias) == parse_frequency(freq):
        return None
    return alias


def _recorded_hint(alias: str | None) -> str:
    """A hint naming the frequency pandas reads in a series' times (`_recorded_alias`).

    Month-end data given freq='MS' is off that grid at every time; saying
    'ME' spares a guess. Empty when pandas reads none (gaps, irregular times).
    """
    return "" if alias is None else f"; its times look recorded at freq={alias!r}"


def recorded_frequency_hint(clean: pd.DataFrame, spec: TableSpec, series: Sequence[Any]) -> str:
    """A hint for the warning of filled target steps: the frequency the times of `series`
    look recorded at, when it is not `freq`; empty otherwise.

    Business-day data (Monday to Friday) given freq='D' is on the daily grid,
    so nothing refuses it: its weekends are filled and its forecast steps
    fall on weekends. The fill is announced; this names the frequency that
    needs none (pandas' `infer_freq` of each of the first 100 of `series`,
    the most common answer other than `freq`).
    `clean`: `validate_table`'s, sorted by id and time.
    """
    wanted = list(series)[:100]  # enough to name it, in a warning of every fit with gaps
    found = []
    some = clean[clean[spec.id_col].isin(wanted)]
    for _, times in some.groupby(spec.id_col, sort=False)[spec.time_col]:
        alias = _recorded_alias(pd.DatetimeIndex(times), spec.freq)  # None under 3 times
        if alias is not None:
            found.append(alias)
    if not found:
        return ""
    alias = str(pd.Series(found).mode().iloc[0])
    return (
        f"; the times of {found.count(alias)} of the series with filled steps look recorded at "
        f"freq={alias!r} (pandas' infer_freq): if that is their frequency, pass "
        f"freq={alias!r} (--freq {alias}); with freq={spec.freq!r} the filled steps are times "
        f"a {alias!r} grid skips, and forecast steps fall on such times too"
    )


def _period_hint(times: pd.DatetimeIndex, spec: TableSpec) -> str:
    """A hint for times off a grid of month, quarter or year starts (or ends), one a period.

    Monthly data stamped on the 15th is off the freq='MS' grid at every time;
    if each time stands for its month, it moves to the month's start (or, for
    'ME', 'QE' and 'YE', its last day). Given only where the times fall in
    distinct periods (daily data would merge), for the default anchors.
    """
    offset = parse_frequency(spec.freq)
    if offset.n != 1:
        return ""
    kind = type(offset)
    if kind in (pd.offsets.MonthBegin, pd.offsets.MonthEnd):
        period, end = "M", kind is pd.offsets.MonthEnd
    elif kind is pd.offsets.QuarterBegin and offset.startingMonth % 3 == 1:
        period, end = "Q", False
    elif kind is pd.offsets.QuarterEnd and offset.startingMonth % 3 == 0:
        period, end = "Q", True
    elif kind is pd.offsets.YearBegin and offset.month == 1:
        period, end = "Y", False
    elif kind is pd.offsets.YearEnd and offset.month == 12:
        period, end = "Y", True
    else:
        return ""
    naive = times.tz_localize(None) if times.tz is not None else times
    if naive.to_period(period).has_duplicates:
        return ""
    column = spec.time_col
    local = ".dt.tz_localize(None)" if times.tz is not None else ""
    zone = f".dt.tz_localize({str(times.tz)!r})" if times.tz is not None else ""
    stamp = ".dt.to_timestamp(how='end').dt.normalize()" if end else ".dt.to_timestamp()"
    name = {"M": "month", "Q": "quarter", "Y": "year"}[period]
    return (
        f"; if each time stands for its {name}, move it to the {name}'s "
        f"{'last day' if end else 'start'}: df[{column!r}] = df[{column!r}]{local}"
        f".dt.to_period({period!r}){stamp}{zone}"
    )


def _anchor_hint(first: pd.Timestamp, freq: str, recorded: str | None = None) -> str:
    """A hint when `freq`'s steps are anchored (e.g. weeks ending Sunday) and `first` is not.

    None where the times look recorded at a finer frequency `recorded` (daily
    data given freq='W'): their first day names no anchor to pass.
    """
    offset = parse_frequency(freq)
    if offset.is_on_offset(first):
        return ""
    if recorded is not None and typical_step(recorded) < typical_step(freq):
        return ""
    hint = f"; {freq!r} steps fall on {offset.freqstr} dates and {first} is not one"
    if isinstance(offset, pd.offsets.Week) and offset.weekday is not None:
        anchored = f"W-{first:%a}".upper()
        hint += f": for weeks recorded on {first.day_name()}s pass freq={anchored!r}"
    return hint


@dataclasses.dataclass(frozen=True)
class _SteppedSeries:
    """The series of a table sorted by (id, time) whose grids are `first + k * step`.

    Attributes:
      ids: (S,) the series ids, in table order (an Index: its items are Python scalars,
        as groupby's keys are).
      first: (S,) int the first time of each series, in units of the time column.
      length: (S,) int the grid length of each series.
      units: units of the time column in one step.
      on_grid: whether every row is on its series' grid.
    """

    ids: pd.Index
    first: np.ndarray
    length: np.ndarray
    units: int
    on_grid: bool


def _fixed_step(spec: TableSpec, zone: Any) -> pd.Timedelta | None:
    """The absolute duration of one `freq` step where every grid is `first + k * step`, else None.

    A `Tick` ('h', '15min') steps in absolute time, naive or aware (pandas
    steps aware times in UTC); a day ('D', a calendar offset in pandas 3)
    does so for naive times and zones of one UTC offset, not across a clock change.
    """
    offset = parse_frequency(spec.freq)
    if isinstance(offset, pd.offsets.Tick):
        return pd.Timedelta(offset)
    if isinstance(offset, pd.offsets.Day) and (zone is None or _fixed_offset_zone(zone)):
        return pd.Timedelta(days=offset.n)
    return None


def _fixed_offset_zone(zone: Any) -> bool:
    """Whether `zone` is UTC or a fixed UTC offset (no daylight saving, no history)."""
    return isinstance(zone, datetime.timezone) or str(zone) in ("UTC", "Etc/UTC")


def _sorted_series(frame: pd.DataFrame, spec: TableSpec) -> tuple[pd.Index, np.ndarray] | None:
    """`(ids, start)` of `frame` sorted by (id, time): the ids in table order (an Index: its
    items are Python scalars, as groupby's keys are) and (S + 1,) the first row of each
    series and the row count; None when the rows are not so sorted."""
    times = pd.DatetimeIndex(frame[spec.time_col])
    codes, ids = pd.factorize(frame[spec.id_col])
    ticks = times.asi8
    same = codes[1:] == codes[:-1]
    if (codes[1:] < codes[:-1]).any() or (ticks[1:][same] <= ticks[:-1][same]).any():
        return None  # not sorted by (id, time): the per-series path handles it as it did
    return ids, np.searchsorted(codes, np.arange(len(ids) + 1))


def _stepped_series(frame: pd.DataFrame, spec: TableSpec) -> _SteppedSeries | None:
    """The grids of `frame` (sorted by id, time) as whole-number steps, or None where unsure.

    For a fixed step (`_fixed_step`: 'h', '15min', 'D' of naive or UTC
    times) that is a whole number of units of the time column, the grid
    `series_grid` builds is `first + k * step` (in UTC for aware times): it is
    counted for all series at once instead of one `date_range` and `isin` per
    series. Else None, and the callers build the grids another way.
    """
    times = frame[spec.time_col]
    if len(frame) == 0:
        return None
    step = _fixed_step(spec, times.dt.tz)
    if step is None:
        return None
    unit = times.dt.unit
    units, remainder = divmod(step.value, pd.Timedelta(1, unit).value)
    if remainder or units < 1:
        return None
    found = _sorted_series(frame, spec)
    if found is None:
        return None
    ids, start = found
    ticks = pd.DatetimeIndex(times).asi8
    first = ticks[start[:-1]]
    on_grid = not ((ticks - np.repeat(first, np.diff(start))) % units).any()
    length = (ticks[start[1:] - 1] - first) // units + 1
    return _SteppedSeries(ids, first, length, int(units), bool(on_grid))


@dataclasses.dataclass(frozen=True)
class _UnionGrid:
    """The grids of the series of a table sorted by (id, time), as slices of one grid.

    Attributes:
      ids: (S,) the series ids, in table order.
      grid: the grid of `freq` from the earliest first time to the latest last one.
      first: (S,) int the position in `grid` of each series' first time (-1: unknown).
      length: (S,) int each series' grid length (valid where `known`).
      known: (S,) bool the series whose grid is `grid[first : first + length]` for
        sure, with every row of it on that grid.
    """

    ids: pd.Index
    grid: pd.DatetimeIndex
    first: np.ndarray
    length: np.ndarray
    known: np.ndarray


def _union_grid(frame: pd.DataFrame, spec: TableSpec) -> _UnionGrid | None:
    """The grids of `frame` (sorted by id, time) as slices of one grid, or None where unsure.

    For calendar frequencies ('MS', 'W-SUN', 'B') and days of a zone with
    daylight saving, one `time_grid` over the span of the table replaces one
    per series. `date_range` builds each grid by stepping from its first time,
    so a series whose first time is a time of the union grid has the union
    grid's times from there to its last time as its own. Where `time_grid`
    shifted local times a clock change skips or repeats, the union grid is
    trusted only from times it did not shift, ending at one it holds. Series
    it does not settle (`known` False: off the union grid, a step of several
    periods started elsewhere) are left to the per-series path.
    """
    if len(frame) == 0:
        return None
    found = _sorted_series(frame, spec)
    if found is None:
        return None
    ids, start = found
    times = pd.DatetimeIndex(frame[spec.time_col])
    firsts, lasts = times[start[:-1]], times[start[1:] - 1]
    earliest, latest = firsts.min(), lasts.max()
    try:
        # A grid far longer than the table (a tiny step over a long span) is left to the
        # per-series path (and to `_fixed_step_grid_rows`'s refusal of it).
        if (latest - earliest) / typical_step(spec.freq) > 4 * len(frame) + 10_000:
            return None
        offset = parse_frequency(spec.freq)
        try:
            grid = pd.DatetimeIndex(pd.date_range(earliest, latest, freq=offset), freq=None)
            trusted = np.ones(len(grid), dtype=bool)
        except ValueError:  # `time_grid`'s fallback, each local time it shifted untrusted
            zone = earliest.tz
            if zone is None:
                return None
            wall = pd.date_range(
                earliest.tz_localize(None), latest.tz_convert(zone).tz_localize(None), freq=offset
            )
            grid = time_grid(earliest, latest, freq=offset)
            trusted = np.asarray(grid.tz_convert(zone).tz_localize(None) == wall)
    except (ValueError, OverflowError, pd.errors.OutOfBoundsDatetime):
        return None
    if len(grid) == 0 or not grid.is_monotonic_increasing or grid.has_duplicates:
        return None
    unit = times.unit
    try:
        stamps = grid.as_unit(unit)
    except (ValueError, pd.errors.OutOfBoundsDatetime):
        return None
    if not (stamps.as_unit(grid.unit).asi8 == grid.asi8).all():
        return None
    ticks, grid_ticks = times.asi8, stamps.asi8
    position = np.searchsorted(grid_ticks, ticks)
    inside = position < len(grid_ticks)
    hit = np.zeros(len(ticks), dtype=bool)
    hit[inside] = grid_ticks[position[inside]] == ticks[inside]
    counts = np.diff(start)
    on_grid = np.add.reduceat(hit, start[:-1]) == counts if len(counts) else hit[:0]
    first, last = position[start[:-1]], position[start[1:] - 1]
    ends_held = hit[start[:-1]] & hit[start[1:] - 1]
    safe = np.zeros(len(first), dtype=bool)
    safe[ends_held] = trusted[first[ends_held]] & trusted[last[ends_held]]
    known = on_grid & safe
    length = np.where(known, last - first + 1, 0)
    return _UnionGrid(ids, grid, np.where(known, first, -1), length, known)


def _check_series_on_grid(series: Any, times: pd.DatetimeIndex, spec: TableSpec) -> int:
    """Raises for timestamps of one series off its `freq` grid; returns its grid length."""
    grid = series_grid(times, spec.freq)
    off_grid = ~times.isin(grid)
    if off_grid.any():
        start = grid[0] if len(grid) else times[0]
        recorded = _recorded_alias(times, spec.freq)
        raise ValueError(
            f"series {plain_value(series)!r} has {int(off_grid.sum())} timestamps off the freq="
            f"{spec.freq!r} grid that starts at {start}, e.g. {times[off_grid][0]}; "
            "resample the table to that frequency first (e.g. df.set_index(time)"
            f".groupby(id).resample({spec.freq!r}).mean()) or pass the frequency the data "
            f"is recorded at{_recorded_hint(recorded)}"
            f"{_anchor_hint(times[0], spec.freq, recorded)}{_period_hint(times, spec)}"
            f"{_zone_hint(times, spec)}{_utc_grid_hint(times, spec)}"
        )
    return len(grid)


def _check_on_grid(frame: pd.DataFrame, spec: TableSpec) -> dict[Any, int]:
    """Raises for timestamps off the `freq` grid; returns each series' grid length."""
    stepped = _stepped_series(frame, spec)
    if stepped is not None and stepped.on_grid:  # else the loop names the first series off it
        return dict(zip(stepped.ids, stepped.length.tolist(), strict=True))
    union = _union_grid(frame, spec) if stepped is None else None
    if union is not None:
        # The series the union grid settles are on their grids; the others, checked one by
        # one in table order, raise for the first series off its grid as the loop does.
        lengths = dict(zip(union.ids, union.length.tolist(), strict=True))
        if not union.known.all():
            unknown = set(union.ids[~union.known])
            for series, group in frame.groupby(spec.id_col, sort=False):
                if series in unknown:
                    times = pd.DatetimeIndex(group[spec.time_col])
                    lengths[series] = _check_series_on_grid(series, times, spec)
        return lengths
    lengths = {}
    for series, group in frame.groupby(spec.id_col, sort=False):
        times = pd.DatetimeIndex(group[spec.time_col])
        lengths[series] = _check_series_on_grid(series, times, spec)
    return lengths


def _short_series_text(short: dict[Any, int]) -> str:
    return first_few([f"{series!r} ({length} steps)" for series, length in short.items()])


def _categorical_values(
    values: pd.Series, column: str, ids: pd.Series, *, rows: FileRows | None = None
) -> pd.Series:
    """A categorical column as Python ints (integer codes) or strings, NaN kept.

    A pandas `category` column with numeric (or bool) categories is read by
    its values, as integer codes: the same codes in an int64 column (e.g. read
    back from a CSV at predict time) must map to the same vocabulary entries,
    not to texts '0', '1' that no int matches. Integer codes are read
    exactly (a float64 would merge 64-bit codes past 2**53, e.g. hashed SKUs).
    `rows`: as `_parse_times`'s.
    """
    exact = ptypes.is_integer_dtype(values) or ptypes.is_bool_dtype(values)
    if isinstance(values.dtype, pd.CategoricalDtype):
        categories = values.cat.categories
        if ptypes.is_integer_dtype(categories) or ptypes.is_bool_dtype(categories):
            exact = True
        elif ptypes.is_numeric_dtype(categories):
            values = values.astype("float64")
    present = values.notna().to_numpy()
    if exact:
        return _each_distinct(values, present, int)
    if ptypes.is_numeric_dtype(values):
        numbers = values.astype("float64")
        fractional = present & (numbers.to_numpy() != np.round(numbers.to_numpy()))
        if fractional.any():
            row = int(np.flatnonzero(fractional)[0])
            raise ValueError(
                f"categorical column {column!r} has non-integer codes, e.g. "
                f"{float(numbers.iloc[row])!r} in series {plain_value(ids.iloc[row])!r} at "
                f"{row_text(row, rows)}"
            )
        return _each_distinct(numbers, present, int)
    return _each_distinct(values, present, str)


def _each_distinct(values: pd.Series, present: np.ndarray, convert: type) -> pd.Series:
    """(R,) object Series of `convert(v)` for each value `v` of `values`, None where not `present`.

    Converted once per distinct value (a category repeats over millions of
    rows) where equal values convert alike: ints and texts, floats to int,
    and the categories of a `category` column (the same objects in each
    cell). Else (an object column mixing 1 and 1.0, which compare equal but
    read '1' and '1.0'; 0.0 and -0.0 as text) each value is converted on its
    own.
    """
    if isinstance(values.dtype, pd.CategoricalDtype):  # each category converted once
        group, distinct = values.cat.codes.to_numpy(), values.cat.categories
    else:
        kind = ptypes.infer_dtype(values, skipna=True)
        alike = ("integer", "string", "empty", *(("floating",) if convert is int else ()))
        if kind not in alike:
            return pd.Series(
                [convert(v) if ok else None for v, ok in zip(values, present, strict=True)],
                index=values.index,
                dtype=object,
            )
        group, distinct = pd.factorize(values)
    converted = np.empty(len(distinct) + 1, dtype=object)  # the last: None, for missing cells
    converted[: len(distinct)] = [convert(v) for v in distinct]
    group = np.where(present & (group >= 0), group, len(distinct))
    return pd.Series(converted[group], index=values.index, dtype=object)


def _check_id_types(ids: pd.Series, column: str) -> None:
    """Raises when two ids differ only in type, e.g. 7 and '7' (a column of objects).

    Concatenating a table read from CSV (ids as numbers) with one of ids as
    text leaves such a column: each twin would silently be a series of its
    own, each with part of the rows.
    """
    if ids.dtype != object:
        return
    seen: dict[str, Any] = {}
    for value in pd.unique(ids):
        twin = seen.setdefault(str(value), value)
        if type(twin) is not type(value):
            raise ValueError(
                f"id column {column!r} holds {twin!r} ({type(twin).__name__}) and {value!r} "
                f"({type(value).__name__}): the same id as different types, which would be two "
                f"series; give the column one type, e.g. df[{column!r}].astype(str)"
            )


def _warn_id_twins(ids: pd.Series, column: str) -> None:
    """Warns when text ids differ only by surrounding spaces or letter case ('A', 'A ', 'a').

    Each is a series of its own, each with part of the rows: an export that
    pads a CHAR column ('A ' for 20 of store A's rows) or a system that
    changed case made two series of one. It may be deliberate (case-sensitive
    codes), so it is announced, not refused, naming the first few groups of
    twins with their rows and the fix. Only the distinct ids are read.
    """
    if not (ptypes.is_string_dtype(ids.dtype) or isinstance(ids.dtype, pd.CategoricalDtype)):
        return
    codes, distinct = pd.factorize(ids)
    distinct = pd.Series(np.asarray(distinct, dtype=object), dtype=object)
    texts = distinct[[isinstance(value, str) for value in distinct]]
    stripped = texts.str.strip()
    key = stripped.str.casefold()
    twins = key.duplicated(keep=False).to_numpy()
    if not twins.any():
        return
    rows = np.bincount(codes[codes >= 0], minlength=len(distinct))
    texts, stripped, key = texts[twins], stripped[twins], key[twins]
    spaces = bool((texts != stripped).any())
    cases = bool((stripped.groupby(key.to_numpy(), sort=False).nunique() > 1).any())

    def rows_of(position: int) -> str:
        count = int(rows[position])
        return f"{count} row" if count == 1 else f"{count} rows"

    groups = [
        " and ".join(f"{value!r} ({rows_of(position)})" for position, value in group.items())
        for _, group in texts.groupby(key.to_numpy(), sort=False)
    ]
    kind = " or ".join(
        name for name, found in (("surrounding spaces", spaces), ("letter case", cases)) if found
    )
    fix = [
        f"strip the spaces (df[{column!r}] = df[{column!r}].str.strip())" if spaces else "",
        f"write them in one case (e.g. df[{column!r}] = df[{column!r}].str.upper())"
        if cases
        else "",
    ]
    warnings.warn(
        f"id column {column!r} holds {'a group' if len(groups) == 1 else f'{len(groups)} groups'}"
        f" of ids that differ only by {kind}, "
        f"each id read as a series of its own: {first_few(groups, separator='; ')}; if each "
        f"group is one series, {' and '.join(f for f in fix if f)} before fitting (for the "
        "CLI, write a copy so cleaned)",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def _category_ids(ids: pd.Series) -> pd.Series:
    """A `category` id column read as its values: its text categories sorted, none unused;
    other categories (numbers) as a column of their dtype.

    The series are sorted by id (`validate_table`), and a category column
    sorts by its categories' order ('south', 'north', 'east' as given):
    the same ids as texts trained another model and listed the rows in
    another order. Text ids stay categories (`ids_as_categories`), in the
    order of their values; numbers are read as a plain column of them is.
    """
    categories = ids.cat.categories
    if not ptypes.is_string_dtype(categories):  # numbers (or times): a column of them
        return ids.astype(categories.dtype)
    ids = ids.cat.remove_unused_categories()
    if ids.cat.categories.is_monotonic_increasing:
        return ids
    return ids.cat.reorder_categories(ids.cat.categories.sort_values())


def _id_values(ids: pd.Series, column: str) -> pd.Series:
    """The ids as texts or numbers, the kinds a saved run can list; unsigned ints as int64.

    An id of another kind (a timestamp, a tuple) trained but could not be
    saved (JSON) or loaded again. Unsigned integer ids would turn into
    floats where the future rows (int64) join them: ids above 2^53 then merge.
    Ids of a `category` column are read as its values (`_category_ids`), and
    Arrow dictionary-encoded ids decoded (`_decoded`).
    """
    ids = _decoded(ids)
    if isinstance(ids.dtype, pd.CategoricalDtype):
        ids = _category_ids(ids)
    if ptypes.is_unsigned_integer_dtype(ids.dtype):
        if len(ids) and int(ids.max()) > np.iinfo(np.int64).max:
            raise ValueError(
                f"id column {column!r} holds unsigned ids above 2^63 - 1 (e.g. {int(ids.max())}): "
                f"give them as text, e.g. df[{column!r}].astype(str)"
            )
        return ids.astype(np.int64)
    if ids.dtype == object or isinstance(ids.dtype, pd.CategoricalDtype):
        values = pd.unique(ids.to_numpy(dtype=object))
        odd = [v for v in values if not isinstance(v, str | numbers.Real)]
    else:
        odd = (
            []
            if ptypes.is_numeric_dtype(ids.dtype) or ptypes.is_string_dtype(ids.dtype)
            else [ids.iloc[0]]
        )
    if odd:
        raise TypeError(
            f"id column {column!r} holds {type(odd[0]).__name__} ids (e.g. {odd[0]!r}): series "
            f"ids must be texts or numbers (a saved run lists them in JSON); convert them, e.g. "
            f"df[{column!r}].astype(str)"
        )
    return ids


def validate_table(
    frame: pd.DataFrame,
    spec: TableSpec,
    history: int,
    horizon: int,
    min_length: int | None = None,
    drop_short: bool = False,
    reason: str | None = None,
    fitted: bool = False,
    fill_categoricals: bool = False,
) -> pd.DataFrame:
    """Checks a long-format table and returns a clean copy sorted by (id, time).

    The copy holds only the spec's columns; times are parsed (timezone-aware
    where the source is), numeric columns are float64 and categorical ones
    hold ints or strings, with NaN/None marking a missing value.

    Series shorter than `min_length` steps (default `history + horizon`, what
    a training window needs; forecasting from the end of the data needs
    `history`) are all named in one error, or with `drop_short` left out
    with a `UserWarning` naming them (an error only when none remain);
    `reason` says in those messages why `min_length` is needed. `fitted`:
    the table is read for a fitted model, whose categorical columns are fixed
    (a message offers no others). Unless `fitted`, text ids that differ only
    by surrounding spaces or letter case ('A', 'A ') are announced by a
    warning (`_warn_id_twins`). Times read month first from texts that read
    day first as well ('02/01/2024') make a density or grid refusal say so
    (`_ambiguous_day_month`). Without `fill_categoricals` (`to_regular_grid`'s),
    a categorical known or observed column may be empty throughout a series:
    empty is then a value of its own (a store that never had an event).

    Raises:
      ValueError: naming the column or series and the fix, for: missing
        columns, an empty table, empty ids, ids equal as text but of two types
        (7 and '7'), unparseable or empty times, times with a zone or UTC
        offset mixed with naive ones, non-numeric or infinite values or ones
        beyond float32 (`_to_float`; a boolean target is announced), statics
        that vary within a series or are empty, a column with no value at all
        in a series (a categorical one only with `fill_categoricals`),
        duplicate (id, time) rows, a fixed sub-daily `freq` much finer than
        the table's steps (`check_density`, checked before any grid is
        built), timestamps off the `freq` grid, or short series.
        A row a message names is its position among the table's rows, with
        its file line where `read_table` read the table from a CSV file
        (`file_rows`).
    """
    _require_positive_int("history", history)
    _require_positive_int("horizon", horizon)
    missing = [column for column in spec.columns if column not in frame.columns]
    if missing:
        # As keywords (`target='sales'`), which the CLI shows as its flags.
        roles = ", ".join(f"{role}={col!r}" for role, col in spec._roles() if col in missing)
        sep = _separator(frame.columns)
        reading = f"pandas.read_csv(path, sep={sep!r}) (and decimal=',' for decimal commas)"
        hint = "" if sep is None else f"; it looks separated by {sep!r}: read it with {reading}"
        hint += label_type_hint(missing, frame.columns)
        in_index = index_hint(frame, missing)
        raise MissingColumnsError(
            f"table lacks columns {missing} ({roles}); it has {list(frame.columns)}{hint}"
            + (in_index if in_index else ". Rename the columns or pass the right names"),
            missing,
            roles,
            in_index,
        )
    check_unique_columns(frame, spec.columns)
    if len(frame) == 0:
        raise ValueError("table has no rows")
    rows = file_rows(frame)  # before the rows are reordered
    clean = frame.loc[:, list(spec.columns)].reset_index(drop=True)
    clean.attrs.pop(_READ_FROM, None)  # sorted below: its rows are no longer the file's
    clean.attrs.pop(_HEADER, None)
    ids = clean[spec.id_col]
    if ids.isna().any():
        row = int(np.flatnonzero(ids.isna().to_numpy())[0])
        raise ValueError(
            f"id column {spec.id_col!r} is empty at {row_text(row, rows)}; give every row a "
            "series id"
        )
    clean[spec.id_col] = ids = _id_values(ids, spec.id_col)
    _check_id_types(ids, spec.id_col)  # of the values of a category column too
    if not fitted:  # a fitted model's ids were announced at fit
        _warn_id_twins(ids, spec.id_col)
    day_month = _ambiguous_day_month(clean[spec.time_col], spec)
    clean[spec.time_col] = _parse_times(
        clean[spec.time_col],
        spec.time_col,
        ids,
        spec.time_format,
        spec.dayfirst,
        spec.timezone,
        rows=rows,
    )
    for column in spec.numeric_columns:
        clean[column] = _to_float(
            clean[column], column, ids, rows=rows,
            offer_categorical=not fitted and column != spec.target, times=clean[spec.time_col],
            announce_booleans=not fitted and column == spec.target,
        )  # fmt: skip
    for column in spec.categorical_cols:
        clean[column] = _categorical_values(clean[column], column, ids, rows=rows)
    aware = clean[spec.time_col].dt.tz is not None
    if spec.timezone is not None and not aware:
        raise ValueError(
            f"timezone={spec.timezone!r} needs timezone-aware times, but column "
            f"{spec.time_col!r} has none; pass timezone=None (calendar read as given) or "
            "times with a UTC offset"
        )
    _check_statics(clean, spec, rows)
    _check_not_all_empty(clean, spec, fill_categoricals)
    _check_duplicates(clean, spec)
    clean = clean.sort_values([spec.id_col, spec.time_col], kind="stable").reset_index(drop=True)
    grid_rows = _fixed_step_grid_rows(clean, spec)
    if grid_rows is None and day_month is not None:  # `check_density` knows no texts
        grid_rows = _spanned_grid_rows(clean, spec)
    if grid_rows is not None:  # before the grids are built (a too fine freq: billions of rows)
        _check_density_rows(clean, grid_rows, spec, day_month)
    try:
        lengths = _check_on_grid(clean, spec)
    except ValueError as error:
        if day_month is None:
            raise
        raise ValueError(f"{error}{day_month.hint()}") from None
    need = reason or (
        "a window needs history + horizon" if min_length is None else "forecasting needs history"
    )
    if min_length is None:
        fix = "drop them or shorten history/horizon"
    elif reason is None:  # forecasting with a fitted model, whose history is fixed
        fix = f"give each of them at least {min_length} steps of history, or drop them"
    else:
        fix = f"drop them or lower {reason.split('=')[0]}"
    min_length = history + horizon if min_length is None else min_length
    short = {series: length for series, length in lengths.items() if length < min_length}
    if short and (not drop_short or len(short) == len(lengths)):
        every = (
            f"every series ({len(short)}) is"
            if len(short) == len(lengths)
            else (f"{len(short)} series are")
        )
        raise ValueError(
            f"{every} shorter than {min_length} steps of freq={spec.freq!r} "
            f"({need}): {_short_series_text(short)}; {fix}"
        )
    if short:
        warnings.warn(
            f"left out {len(short)} of {len(lengths)} series shorter than {min_length} steps "
            f"({need}): {_short_series_text(short)}",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
        clean = clean[~clean[spec.id_col].isin(list(short))].reset_index(drop=True)
    return clean


def inferred_step(clean: pd.DataFrame, spec: TableSpec) -> str:
    """The frequency the table looks recorded at, as a pandas alias ('30min', 'MS', 'W-MON').

    pandas' `infer_freq` of the series with three or more times (the most
    common answer among the first 100 it reads): only it names calendar
    frequencies, whose steps differ in length (months of 28 to 31 days would
    read '744h', a step that puts every month off the grid). Else the most
    common step between consecutive times of a series.
    """
    found = []
    for _, times in clean.groupby(spec.id_col, sort=False)[spec.time_col]:
        if len(times) < 3:
            continue
        alias = _inferred_alias(pd.DatetimeIndex(times))
        if alias:
            found.append(alias)
        if len(found) == 100:  # enough to name it, in an error path
            break
    if found:
        return str(pd.Series(found).mode().iloc[0])
    steps = clean.groupby(spec.id_col, sort=False)[spec.time_col].diff().dropna()
    if steps.empty:
        return "unknown"
    common = steps.mode().iloc[0]
    try:
        return to_offset(common).freqstr
    except ValueError:
        return str(common)


def check_density(clean: pd.DataFrame, grid: pd.DataFrame, spec: TableSpec) -> None:
    """Raises on a frequency mismatch: the table's usual step is several `freq` steps.

    That is, the most common step between consecutive times of a series is at
    least two steps of `freq` and the grid is at least a third rows the table
    lacks (`--freq 15min` on half-hourly data leaves half of it empty).
    """
    _check_density_rows(clean, len(grid), spec)


def _check_density_rows(
    clean: pd.DataFrame, grid_rows: int, spec: TableSpec, day_month: _DayMonthTexts | None = None
) -> None:
    """`check_density` for a grid of `grid_rows` rows.

    `day_month`: the time texts read day first as well (`_ambiguous_day_month`).
    Daily dates written day first ('02/01/2024') and read month first look
    recorded every month: the message then says to read them day first, not
    to pass that frequency, where so read they fill the grid.
    """
    inserted = _empty_share(clean, grid_rows, spec)
    if inserted is None:
        return
    advice = "pass that frequency"
    if day_month is not None:
        advice = _day_first_advice(clean, spec, day_month)
    raise ValueError(
        f"freq={spec.freq!r} leaves {100 * inserted:.0f}% of the time grid without a row "
        f"of the table: it looks recorded every {inferred_step(clean, spec)} (pandas' "
        f"infer_freq of its series, else the most common step between its times); {advice}"
    )


def _empty_share(frame: pd.DataFrame, grid_rows: int, spec: TableSpec) -> float | None:
    """The share of a grid of `grid_rows` rows that `frame` (sorted by id, time) leaves
    empty, where its most common step is two or more steps of `freq` and that share is a
    third or more; else None."""
    inserted = 1.0 - len(frame) / max(grid_rows, 1)
    steps = frame.groupby(spec.id_col, sort=False)[spec.time_col].diff().dropna()
    if steps.empty:
        return None
    if steps.mode().iloc[0] >= 2 * typical_step(spec.freq) and inserted >= 1 / 3:
        return inserted
    return None


def _spanned_grid_rows(frame: pd.DataFrame, spec: TableSpec) -> int:
    """About the rows the grids of `frame`'s series will have: each span over the usual step.

    Exact for fixed steps; for calendar ones (months of 28 to 31 days) close
    enough to tell a grid the table fills from one it leaves mostly empty.
    """
    times = frame.groupby(spec.id_col, sort=False)[spec.time_col]
    spans = (times.max() - times.min()) / typical_step(spec.freq)
    return int(np.round(spans.to_numpy(dtype=float)).sum()) + len(spans)


def _day_first_advice(clean: pd.DataFrame, spec: TableSpec, day_month: _DayMonthTexts) -> str:
    """What a density refusal advises for times read from texts that read day first too.

    Where the times read day first fill the `freq` grid (more than two thirds
    of it, which `check_density` does not refuse), that reading is named as
    the fix (another frequency would build a model on wrong dates); else
    passing that frequency, or day first if the dates are so written.
    """
    swapped = _day_first_times(clean[spec.time_col])
    if swapped is not None:
        frame = pd.DataFrame(
            {spec.id_col: clean[spec.id_col].to_numpy(), spec.time_col: swapped.to_numpy()}
        )
        if len(frame) / max(_spanned_grid_rows(frame, spec), 1) > 2 / 3:
            return (
                f"but its times are texts with day and month both 12 or less, which read day "
                f"first fill the grid ({day_month.readings()}): if they are day/month/year, "
                f"{_day_first_fix(day_month.time_format)}, not that frequency"
            )
    return f"pass that frequency{day_month.hint()}"


def _fixed_step_grid_rows(frame: pd.DataFrame, spec: TableSpec) -> int | None:
    """Rows the grids of `frame`'s series will have for a fixed sub-daily `freq`, not built.

    For 'h', '15min', 'ms' and other fixed steps shorter than a day the count
    is the span of each series over the step; None for other frequencies
    (their grids grow by at most a few hundred rows a year). A mistaken
    sub-daily `freq` ('ms', milliseconds, for month starts; 'min' for hourly
    data) would otherwise build grids of billions of rows, failing with a
    MemoryError, before `check_density` could name the frequency to pass.
    """
    offset = parse_frequency(spec.freq)
    if not isinstance(offset, pd.offsets.Tick):
        return None
    times = frame.groupby(spec.id_col, sort=False)[spec.time_col]
    spans = times.max() - times.min()
    return int((spans // pd.Timedelta(offset)).sum()) + len(spans)


def check_missing_fraction_limit(value: Any) -> None:
    """Raises unless `max_missing_fraction` is a number in [0, 1] (not a bool, not NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"max_missing_fraction must be a number in [0, 1], got {value!r}")


def check_missing_fraction(
    grid: pd.DataFrame, spec: TableSpec, missing_col: str, limit: float
) -> None:
    """Raises naming the series (the first few, and how many) whose filled target steps
    exceed the fraction `limit`."""
    fractions = grid.groupby(spec.id_col, sort=True)[missing_col].mean()
    sparse = fractions[fractions > limit]
    if len(sparse):
        listed = first_few([f"{series!r} ({100 * value:.0f}%)" for series, value in sparse.items()])
        raise ValueError(
            f"{len(sparse)} series have more than {100 * limit:.0f}% of their target missing "
            f"on the freq={spec.freq!r} grid: {listed}; drop them, fill them, or raise "
            "max_missing_fraction (--max-missing-fraction)"
        )


@dataclasses.dataclass(frozen=True)
class EmptyCells:
    """The empty cells of one input column of a validated table, which gridding fills.

    Attributes:
      cells: empty cells in the rows the table gave.
      leading: those before a series' first value (known columns: back-filled
        from later values; observed ones: left empty, see `to_regular_grid`).
      series: the ids of the series with any, in table order.
    """

    cells: int
    leading: int
    series: tuple[Any, ...]


def empty_input_cells(clean: pd.DataFrame, spec: TableSpec) -> dict[str, EmptyCells]:
    """Per known or observed column with empty cells in `clean`, what `to_regular_grid` fills.

    Rows the grid inserts are not counted here: they are counted (and
    announced) as filled target steps.
    """
    found = {}
    for column in (*spec.known_cols, *spec.observed_cols):
        empty = clean[column].isna()
        if not empty.any():
            continue
        seen = (~empty).groupby(clean[spec.id_col], sort=False).cummax()
        series = clean.loc[empty.to_numpy(), spec.id_col].drop_duplicates()
        found[column] = EmptyCells(
            cells=int(empty.sum()),
            leading=int((~seen).sum()),
            series=tuple(series),
        )
    return found


def announce_empty_inputs(
    found: dict[str, EmptyCells],
    num_series: int,
    where: str = "",
    coded: Collection[str] = (),
) -> None:
    """A `UserWarning` listing, per column of `found`, the cells filled and the series holding them.

    `where` (e.g. ' in the history') follows 'inputs' in the message. The
    columns of `coded` (categorical ones that `to_regular_grid` leaves
    empty) are listed in a warning of their own: their empty cells are coded
    as unknown, not filled. Silent when `found` is empty.
    """
    unfilled = {column: empty for column, empty in found.items() if column in coded}
    found = {column: empty for column, empty in found.items() if column not in coded}

    def describe(column: str, empty: EmptyCells) -> str:
        names = first_few([repr(series) for series in empty.series])
        # Leading cells are filled otherwise (back, or with the mean): said of filled ones.
        leading = f", {empty.leading} of them leading" if empty.leading and column in found else ""
        return (
            f"{column!r} {empty.cells} cells in {len(empty.series)} of {num_series} series "
            f"({names}){leading}"
        )

    if unfilled:
        warnings.warn(
            f"coded {sum(e.cells for e in unfilled.values())} empty cells of categorical "
            f"inputs{where} as a category of their own, the one values unseen in training "
            "share (not filled: an empty cell, e.g. a day without an event, is a value; fill "
            "them before to give them another): "
            + "; ".join(describe(column, empty) for column, empty in unfilled.items()),
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    if found:
        warnings.warn(
            f"filled {sum(e.cells for e in found.values())} empty cells of known/observed "
            f"inputs{where} (forward fill within each series; cells before a series' first value "
            "are back-filled from its later values in known columns, and in observed ones, whose "
            "later values are the future, set to the training mean, or to unknown if "
            "categorical): "
            + "; ".join(describe(column, empty) for column, empty in found.items()),
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def to_regular_grid(
    clean: pd.DataFrame, spec: TableSpec, missing_col: str, fill_categoricals: bool = False
) -> pd.DataFrame:
    """Puts every series of a validated table on its regular time grid.

    Each series keeps its own first and last timestamp; timestamps missing in
    between are inserted. Gaps are filled so no row is dropped: the target
    and the real observed and known columns forward-fill within the series;
    statics are constant. The categorical known and observed columns are
    filled so only with `fill_categoricals`: else their empty cells (and
    those of inserted rows) stay empty, which `Preprocessor.encode` codes as
    unknown (an event column empty on ordinary days, filled, would read every
    day as an event). Cells before a series' first value are back-filled
    from its later values in known columns only: in the target and observed
    columns that later value is the future of the steps it would fill (a window whose
    history is those steps would hold the target of its own horizon), so they
    stay empty (NaN) and `Preprocessor.transform` gives them the scaler's
    location (0 as a model input). It announces nothing: callers count the
    filled cells first (`empty_input_cells`, and `missing_col` for the
    target) and warn. `missing_col` is 1.0 where the target was filled
    (inserted row or empty target) and 0.0 where it was observed.

    Args:
      clean: the output of `validate_table` (sorted by id, time).
      spec: the table spec.
      missing_col: name of the indicator column to add.
      fill_categoricals: fill the categorical columns as the real ones
        (`Preprocessor.fills_empty_categoricals`: runs saved by tft-jax 0.2.0.dev2
        and earlier did).

    Returns:
      A DataFrame sorted by (id, time), with the spec's columns and `missing_col`.

    Raises:
      ValueError: a series of `clean` not sorted by time (its grid would be empty).
    """
    stepped = _stepped_series(clean, spec)
    union = _union_grid(clean, spec) if stepped is None else None
    if stepped is not None and stepped.on_grid:
        # All grids at once (`first + k * step`), not one `date_range` per series; the
        # ids in table order are those `_stepped_series` factorized.
        series = stepped.ids.to_numpy()
        lengths = stepped.length
        ticks = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        ticks *= stepped.units
        ticks += np.repeat(stepped.first, lengths)
        column = clean[spec.time_col]
        zone = column.dt.tz
        times = pd.DatetimeIndex(ticks.view(f"M8[{column.dt.unit}]"))
        if zone is not None:
            times = times.tz_localize("UTC").tz_convert(zone)
        del ticks
    elif union is not None and union.known.all():
        # Each series' grid a slice of the one union grid (see `_union_grid`).
        series = union.ids.to_numpy()
        lengths = union.length
        starts = np.cumsum(lengths) - lengths
        positions = np.arange(int(lengths.sum())) - np.repeat(starts - union.first, lengths)
        times = union.grid.take(positions)
    else:
        series = clean[spec.id_col].drop_duplicates().to_numpy()
        grids = []
        for name, group in clean.groupby(spec.id_col, sort=False):
            stamps = pd.DatetimeIndex(group[spec.time_col])
            if not stamps.is_monotonic_increasing:  # else its grid would be empty, silently
                later = int(np.flatnonzero(np.diff(stamps.asi8) < 0)[0])
                raise ValueError(
                    f"to_regular_grid: clean must be sorted by time within each series, as "
                    f"validate_table returns it; series {plain_value(name)!r} has "
                    f"{stamps[later + 1]} after {stamps[later]}"
                )
            grids.append(series_grid(stamps, spec.freq))
        lengths = np.array([len(grid) for grid in grids])
        times = grids[0].append(grids[1:])
    index = pd.MultiIndex.from_arrays(
        [np.repeat(series, lengths), times], names=[spec.id_col, spec.time_col]
    )
    grid = clean.set_index([spec.id_col, spec.time_col]).reindex(index).reset_index()
    grid[missing_col] = grid[spec.target].isna().astype("float64")
    # The series number of each row: grouping by it is grouping by the id column
    # (rows of a series contiguous, in table order), without hashing the ids again.
    codes = np.repeat(np.arange(len(series)), lengths)
    by_series = grid.groupby(codes, sort=False)
    inputs = filled_inputs(spec, fill_categoricals)
    filled = [spec.target, *inputs]
    grid[filled] = by_series[filled].ffill()
    known = [column for column in spec.known_cols if column in inputs]
    if known:  # known in advance: a later value is no leak
        grid[known] = grid.groupby(codes, sort=False)[known].bfill()
    for column in spec.static_cols:
        grid[column] = by_series[column].transform("first")
    return grid


def ids_as_categories(table: pd.DataFrame, id_col: str) -> pd.DataFrame:
    """`table` (a copy where changed) with its text ids as a categorical column.

    A long history is grouped by series many times over (validated, gridded,
    checked, transformed): categories are hashed once, where text ids were
    hashed by every grouping. The values, and every message naming them, are
    the same; the caller's table is not changed.
    """
    ids = table.get(id_col)
    if ids is None or isinstance(ids.dtype, pd.CategoricalDtype):
        return table
    # Texts only (an object column is looked into): ids of mixed types ('7' and 7) are
    # refused by `validate_table`, which reads each id's type.
    if not pd.api.types.is_string_dtype(ids):
        return table
    return table.assign(**{id_col: ids.astype("category")})
