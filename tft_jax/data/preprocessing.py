"""The fitted map from a gridded long-format table to model inputs, reusable on new tables.

`Preprocessor.fit` learns, on the training period of a table, everything the
model inputs depend on besides the table itself: the series vocabulary (the
id column as a static categorical input), the per-series target scaler, the
standardisation of the observed and known columns, and the origin and unit
of the `time_index` input. `transform` applies exactly that map to any table
of the same spec: the training table (training, evaluation) or a new one
(more recent history, other series), which is how a saved model forecasts
without its training data.

Categorical inputs (the id column, and every column of
`spec.categorical_cols`) are coded by a vocabulary fitted on the training
period: its sorted values get codes `0 .. n-1` and code `n` is reserved for
"unknown", a value the training period did not have. A series the vocabulary
does not know gets the unknown id code and a target scaler fitted on its own
observed values in the new table: all of them for a history one forecasts
from, but only those before the first scored step when the table is also
scored (`transform`'s `new_series_cuts`), so that its scaler does not know the
level and spread of the period it is judged on; unknown values are announced
with a `UserWarning`. The missing-target flag is an input only when the training
period has a filled target step (an all-zero flag carries no information).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tft_jax.caller_frame import user_stacklevel
from tft_jax.data.calendar import TIME_INDEX, calendar_feature_names, calendar_features, steps_since
from tft_jax.data.listing import first_few
from tft_jax.data.scaling import (
    TARGET_SCALERS,
    TARGET_TRANSFORMS,
    FeatureScaler,
    TargetScaler,
    announce_constant_series,
    announce_extreme_values,
    announce_spread_fallbacks,
    check_domain,
    extreme_series,
    forward_transform,
    target_statistics,
)
from tft_jax.data.tables import TableSpec, plain_value
from tft_jax.data.windows import Panel


def missing_column(spec: TableSpec) -> str:
    """Name of the missing-target indicator for `spec`: `<target>_missing`."""
    return f"{spec.target}_missing"


def _zone_name(stamp: pd.Timestamp) -> str | None:
    """The name of `stamp`'s time zone ('Europe/Berlin'), or None if naive or nameless.

    An ISO text keeps only the offset in force at `stamp` ('+02:00'), not the
    zone: read back with that fixed offset, days counted across a
    daylight-saving change land an hour off their midnights (`steps_since`),
    so `Preprocessor.time_zone` keeps the name.
    """
    if stamp.tz is None:
        return None
    name = getattr(stamp.tz, "key", None) or getattr(stamp.tz, "zone", None) or str(stamp.tz)
    try:
        stamp.tz_convert(name)
    except Exception:  # pandas cannot read this zone back by name: the offset is kept
        return None
    return name


def _codes(vocabulary: Sequence[Any], values: Sequence[Any]) -> np.ndarray:
    """(R,) int32 position of each value in `vocabulary`; `len(vocabulary)` if absent."""
    position = {value: code for code, value in enumerate(vocabulary)}
    unknown = len(vocabulary)
    return np.array([position.get(plain_value(v), unknown) for v in values], dtype=np.int32)


def _near_text(value: Any) -> str:
    """`value`'s text without surrounding spaces, an integer as its digits: 1, '001', 1.0 -> '1'."""
    text = str(plain_value(value)).strip()
    try:
        number = float(text)
    except ValueError:
        return text
    return str(int(number)) if np.isfinite(number) and number == np.round(number) else text


_NAMED = 10  # unseen categories a warning names (and locates), then "and N more"


def table_name(name: str, table: Any = None) -> str:
    """`name` ('the history'), with the file it was read from when `table` is a path."""
    if isinstance(table, str | os.PathLike):
        return f"{name} (file {os.fspath(table)!r})"
    return name


class NewSeriesWithoutTargetError(ValueError):
    """A series not in the training data has no observed target to fit its scaler on.

    `series` is its id and `cut` the time before which its target was looked
    for (None: anywhere in the table), so that a caller that placed the cut (a
    backtest's first cutoff) can say what to change.
    """

    def __init__(self, message: str, series: Any, cut: pd.Timestamp | None) -> None:
        super().__init__(message)
        self.series = series
        self.cut = cut


@dataclasses.dataclass(frozen=True, eq=False)
class RowSources:
    """Which table each row of a grid given to `Preprocessor.transform` came from.

    For the warning naming categories not seen in training, so that it says
    where each lies, as the other messages of a table do. `name`: the table
    the rows came from ('the table', 'the history', with its file when read
    from one, see `table_name`). `future`: (R,) bool over the grid's rows, those
    appended from the future table (called `future_name`); their observed
    columns hold the history's last values, carried over and never read, so
    no table gave them and they are neither counted nor named. None: no row
    is a future one.
    """

    name: str = "the table"
    future: np.ndarray | None = None
    future_name: str = "the future table"

    def tables(self, rows: int, observed: bool = False) -> np.ndarray:
        """(rows,) object array: each row's table name, None where no table gave the value."""
        names = np.full(rows, self.name, dtype=object)
        if self.future is not None:
            names[np.asarray(self.future, dtype=bool)] = None if observed else self.future_name
        return names


@dataclasses.dataclass(frozen=True, eq=False)
class ValuePlaces:
    """Where the values given to `Preprocessor.encode` lie, for its warning to name them.

    `at(i)`: the place of the `i`-th value ("series 'A' at 2024-11-05 19:00:00+01:00").
    `tables`: (R,) the table each value came from (`RowSources.tables`); None
    for a value no table gave, which is neither counted nor named. `unit`:
    what one value stands for ('row'; 'series' for a static column, coded
    once per series).
    """

    at: Callable[[int], str]
    tables: np.ndarray
    unit: str = "row"

    def describe(self, value: str, positions: np.ndarray) -> str:
        """Where `value` (a repr) lies: "'x' in 3 rows of the history, the first for series ..."."""
        names = self.tables[positions]
        parts = []
        for name in pd.unique(names[pd.notna(names)]):
            mine = positions[names == name]
            count = len(mine)
            unit = self.unit if count == 1 or self.unit == "series" else f"{self.unit}s"
            first = "the first " if count > 1 else ""
            parts.append(f"{count} {unit} of {name}, {first}for {self.at(int(mine[0]))}")
        return f"{value} in {' and in '.join(parts)}" if parts else ""

    def counted(self, positions: np.ndarray) -> int:
        """How many of `positions` a table gave."""
        return int(pd.notna(self.tables[positions]).sum())


def type_hint(given: Sequence[Any], known: Sequence[Any], column: str, where: str) -> str:
    """A hint when values of `given` are values of `known` (those `where`) but for their form.

    An id column read as text where the training one held numbers (`'1'` vs
    `1`, or the reverse) makes every series new; the message naming them then
    says why. So do ids that lost their leading zeros (`pd.read_csv` reads
    '001' as 1) or gained surrounding spaces ('s0 '): each is named with the
    training value it stands for and how to read it as such. Empty when no
    value is such a twin.
    """
    as_text = {str(plain_value(value)): value for value in known}
    for value in given:
        twin = as_text.get(str(plain_value(value)))
        if twin is not None and twin != value:
            kind = type(plain_value(twin)).__name__
            return (
                f"; {value!r} ({type(plain_value(value)).__name__}) is {twin!r} ({kind}) {where}: "
                f"give column {column!r} the same type, e.g. df[{column!r}].astype({kind})"
            )
    near = {_near_text(value): value for value in known}
    for value in given:
        twin = near.get(_near_text(value))
        if twin is None or twin == value:
            continue
        shown = f"; {plain_value(value)!r} is {plain_value(twin)!r} {where}"
        if str(plain_value(value)).strip() == str(plain_value(twin)).strip():
            return (
                f"{shown} but for surrounding spaces: strip them, e.g. "
                f"df[{column!r}] = df[{column!r}].str.strip()"
            )
        if isinstance(plain_value(twin), str) and not isinstance(plain_value(value), str):
            return (
                f"{shown} as a number: did the CSV lose leading zeros? read it with "
                f"pandas.read_csv(path, dtype={{{column!r}: str}})"
            )
        return f"{shown} as a number: write column {column!r} as {where} (the same texts)"
    return ""


def _float32_inputs(
    values: np.ndarray,
    names: Sequence[str],
    grid: pd.DataFrame,
    rows: np.ndarray,
    where: Callable[[int], str],
) -> np.ndarray:
    """`values` (R, F), model inputs named `names`, as float32; refused where not finite there.

    A value beyond float32's range (about 3.4e38) after scaling would enter
    the model as inf: NaN forecasts, or a training run whose every step is
    skipped. A table's own values beyond it are refused when it is validated
    (`tables.validate_table`); one within it may still be scaled beyond it (a
    spike on a robust scale, which its median and quartiles ignore, or a
    series scaled by a fitted model's scale far below its own). It is refused
    here, naming the column, where it is
    (`where(r)`, e.g. series and time, for row `r`) and the value the table
    gave (`grid`'s row `rows[r]`).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        cast = values.astype(np.float32)
    bad = ~np.isfinite(cast)
    if not bad.any():
        return cast
    row, column = (int(i) for i in np.argwhere(bad)[0])
    name = names[column]
    given = f" holds {float(grid[name].iloc[rows[row]]):.6g}," if name in grid.columns else ""
    raise ValueError(
        f"column {name!r}{given} which is {values[row, column]:.4g} as a model input "
        f"({where(row)}; {int(bad[:, column].sum())} such values): beyond float32 "
        f"(largest {float(np.finfo(np.float32).max):.3g}); model inputs must be finite in "
        "float32, so rescale the column (e.g. divide it by 1e6)"
    )


@dataclasses.dataclass(frozen=True, eq=False)
class Transformed:
    """A table as model inputs: the panel, a readable frame and the panel's target scaler.

    Attributes:
      panel: the `Panel`; its series codes number the table's own series
        (sorted ids -> 0 .. m-1).
      frame: the grid, rows in panel order: id, time, the target in its own
        units (NaN where missing), the missing indicator, `series_code` and
        the known inputs under their names.
      target_scaler: per panel series code, the target scaler in force.
      series_ids: the original id of each panel series code.
    """

    panel: Panel
    frame: pd.DataFrame
    target_scaler: TargetScaler
    series_ids: tuple[Any, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Preprocessor:
    """What turns a gridded table into model inputs, fitted on a training period.

    Attributes:
      spec: the table spec.
      series_ids: the training series, sorted; a series' vocabulary code is
        its position, and `len(series_ids)` is the reserved unknown code.
      origin: the earliest time of the training table (`time_index` 0).
      train_steps: steps from `origin` to the validation start (`time_index` 1).
      target_scaler: per vocabulary code, fitted on the training period.
      feature_scaler: standardisation of the real observed then known columns.
      static_scaler: standardisation of the real static columns, fitted on one
        row per training series (a store's area in m^2 would otherwise enter
        the static embedding in the tens of thousands); None for a run saved
        before statics were scaled, whose model was trained on them raw.
      vocabularies: the sorted training values of each categorical column.
      missing_flag: whether `<target>_missing` is an observed input.
      time_zone: the training time column's zone by name (None: naive, or a
        run saved before it was kept). Without `spec.timezone`, calendar
        inputs of aware times are read in it, so a table of the same instants
        in another zone (UTC from a database) gets the inputs the model was
        trained on, not its days shifted; `origin` is read back in it.
      statics: `{series id: its static values}` of each training series, in
        the order of `spec.static_cols` (floats for real columns, texts or
        ints for categorical ones), so that a trained series given other
        statics later is announced (`transform`); None for a run saved
        before they were kept (nothing is then compared).
      fills_empty_categoricals: whether the empty cells of categorical known
        and observed columns are filled as the real ones' (`to_regular_grid`'s
        `fill_categoricals`): True for runs saved by tft-jax 0.2.0.dev2 and
        earlier (run folder format 3 and earlier); a fit now leaves them empty,
        coded as unknown, so an event column empty on ordinary days keeps its
        meaning (filled, every day read as the last event).
    """

    spec: TableSpec
    series_ids: tuple[Any, ...]
    origin: pd.Timestamp
    train_steps: float
    target_scaler: TargetScaler
    feature_scaler: FeatureScaler
    vocabularies: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    missing_flag: bool = True
    time_zone: str | None = None
    static_scaler: FeatureScaler | None = None
    statics: dict[Any, tuple[Any, ...]] | None = None
    fills_empty_categoricals: bool = False

    @property
    def missing_col(self) -> str:
        """Name of the missing-target indicator input."""
        return missing_column(self.spec)

    @property
    def fitted_values(self) -> dict[str, tuple[Any, ...]]:
        """`{column: its training values}`: the series ids, then each categorical vocabulary.

        What `read_table` needs to read a CSV's columns as the fit read them
        (codes '007' as text where the model was fitted on text).
        """
        return {self.spec.id_col: self.series_ids, **self.vocabularies}

    @property
    def known_feature_names(self) -> tuple[str, ...]:
        """(K,) the known inputs: calendar features, `time_index`, then real `known_cols`."""
        real = self.spec.real(self.spec.known_cols)
        return (*calendar_feature_names(self.spec.freq), TIME_INDEX, *real)

    @property
    def observed_feature_names(self) -> tuple[str, ...]:
        """(U,) the observed inputs: the scaled target, real `observed_cols`, the missing flag."""
        flag = (self.missing_col,) if self.missing_flag else ()
        return (self.spec.target, *self.spec.real(self.spec.observed_cols), *flag)

    @property
    def static_feature_names(self) -> tuple[str, ...]:
        """(S,) the real-valued statics."""
        return self.spec.real(self.spec.static_cols)

    @property
    def static_categorical_names(self) -> tuple[str, ...]:
        """(C,) the categorical statics: the id column, then categorical `static_cols`."""
        return (self.spec.id_col, *self.spec.categorical(self.spec.static_cols))

    @property
    def known_categorical_names(self) -> tuple[str, ...]:
        """The categorical known inputs."""
        return self.spec.categorical(self.spec.known_cols)

    @property
    def observed_categorical_names(self) -> tuple[str, ...]:
        """The categorical observed inputs."""
        return self.spec.categorical(self.spec.observed_cols)

    def _cardinalities(self, names: Sequence[str]) -> tuple[int, ...]:
        return tuple(len(self.vocabularies[name]) + 1 for name in names)

    @property
    def static_categorical_cardinalities(self) -> tuple[int, ...]:
        """Categories of each categorical static (its training values plus unknown)."""
        statics = self._cardinalities(self.static_categorical_names[1:])
        return (len(self.series_ids) + 1, *statics)

    @property
    def known_categorical_cardinalities(self) -> tuple[int, ...]:
        """Categories of each categorical known input (its training values plus unknown)."""
        return self._cardinalities(self.known_categorical_names)

    @property
    def observed_categorical_cardinalities(self) -> tuple[int, ...]:
        """Categories of each categorical observed input (its training values plus unknown)."""
        return self._cardinalities(self.observed_categorical_names)

    @classmethod
    def fit(
        cls,
        grid: pd.DataFrame,
        spec: TableSpec,
        validation_start: pd.Timestamp,
        scaler: str,
        target_transform: str = "none",
        fills_empty_categoricals: bool = False,
    ) -> Preprocessor:
        """Fits on the rows of `grid` (from `to_regular_grid`) before `validation_start`.

        `fills_empty_categoricals`: the `fill_categoricals` the grid was made with.
        """
        times = pd.DatetimeIndex(grid[spec.time_col])
        train_rows = np.asarray(times < validation_start)
        codes, series_ids = pd.factorize(grid[spec.id_col], sort=True)
        observed = grid[missing_column(spec)].to_numpy(np.float64) == 0.0
        target = grid[spec.target].to_numpy(np.float64)
        # Every row, named by series and time (the scaler's own check sees the training
        # rows, without their times).
        names = [plain_value(series) for series in series_ids]
        check_domain(np.where(observed, target, np.nan), codes, target_transform, names, times)
        target_scaler = TargetScaler.fit(
            np.where(observed, target, np.nan)[train_rows],
            codes[train_rows],
            len(series_ids),
            scaler,
            series_names=list(series_ids),
            transform=target_transform,
            times=times[train_rows],
        )
        user = [*spec.real(spec.observed_cols), *spec.real(spec.known_cols)]
        user_values = grid.loc[train_rows, user].to_numpy(np.float64)
        # An observed column whose first value comes after the training period (a sensor
        # added later) has nothing there: leading cells are never back-filled from the future.
        empty = [
            column
            for column, values in zip(user, user_values.T, strict=True)
            if np.isnan(values).all()
        ]
        if empty:
            raise ValueError(
                f"columns {empty} have no value before validation_start {validation_start} (the "
                "training period), so their scalers cannot be fitted there; move the validation "
                "start later or leave those columns out"
            )
        feature_scaler = FeatureScaler.fit(user_values)
        statics = list(spec.real(spec.static_cols))
        _, first_train_rows = np.unique(codes[train_rows], return_index=True)
        static_scaler = FeatureScaler.fit(
            grid.loc[train_rows, statics].to_numpy(np.float64)[first_train_rows]
        )
        _, first_rows = np.unique(codes, return_index=True)  # in code order: series_ids'
        trained_statics = _static_values(grid, spec, first_rows)
        origin = times.min()
        train_steps = float(steps_since(pd.DatetimeIndex([validation_start]), origin, spec.freq)[0])
        # The distinct values first (first occurrences, as a set keeps them), then the set.
        vocabularies = {
            column: tuple(
                sorted({plain_value(v) for v in pd.unique(grid.loc[train_rows, column].dropna())})
            )
            for column in spec.categorical_cols
        }
        return cls(
            spec=spec,
            series_ids=tuple(plain_value(value) for value in series_ids),
            origin=origin,
            train_steps=max(train_steps, 1.0),
            target_scaler=target_scaler,
            feature_scaler=feature_scaler,
            vocabularies=vocabularies,
            missing_flag=bool((~observed[train_rows]).any()),
            time_zone=_zone_name(origin),
            static_scaler=static_scaler,
            statics={
                plain_value(series): values
                for series, values in zip(series_ids, trained_statics, strict=True)
            },
            fills_empty_categoricals=fills_empty_categoricals,
        )

    def announce_changed_statics(
        self, ids: Sequence[Any], given: Sequence[tuple[Any, ...]]
    ) -> None:
        """Warns naming the trained series among `ids` whose statics `given` are not their own.

        `given`: each series' static values in the order of `spec.static_cols`.
        A series is embedded by its statics: given others (a store moved to
        another region, a corrected area), its forecasts change, which an
        unseen category announces but a known one did not. Real values count
        as changed beyond a relative 1e-6 (float32 rounding is no change).
        """
        if not self.statics or not self.spec.static_cols:
            return
        changes = []
        for series, values in zip(ids, given, strict=True):
            trained = self.statics.get(plain_value(series))
            if trained is None:
                continue
            for column, before, now in zip(self.spec.static_cols, trained, values, strict=True):
                if column in self.spec.categorical_cols:
                    changed = plain_value(now) != before
                else:
                    changed = not np.isclose(float(now), before, rtol=1e-6, atol=0.0)
                if changed:
                    changes.append(
                        f"series {plain_value(series)!r} column {column!r}: trained "
                        f"{before!r}, given {plain_value(now)!r}"
                    )
        if changes:
            warnings.warn(
                f"{len(changes)} static values of trained series differ from those they were "
                f"trained with, and their forecasts follow the new ones: "
                f"{first_few(changes, separator='; ')}",
                UserWarning,
                stacklevel=user_stacklevel(),
            )

    def check_time_zone(self, times: pd.Series | pd.DatetimeIndex, what: str = "table") -> None:
        """Raises unless `times` are naive exactly when the training times were.

        The model's `time_index` counts steps from the training table's first
        time (`origin`), which cannot be measured between a naive and an aware
        time; guessing the zone would be a silent repair, so a table of the
        other kind is refused with both sides named.
        """
        given = pd.DatetimeIndex(times).tz
        trained = self.origin.tz
        if (given is None) == (trained is None):
            return
        column = self.spec.time_col
        if trained is None:
            raise ValueError(
                f"{what} column {column!r} is timezone-aware (zone {given}) but the model was "
                "trained on naive times (no zone); give naive times, e.g. "
                f"df[{column!r}] = df[{column!r}].dt.tz_localize(None) (after tz_convert to "
                "the zone the training times were recorded in)"
            )
        zone = self.spec.timezone or str(trained)
        raise ValueError(
            f"{what} column {column!r} holds naive times (no zone) but the model was trained on "
            f"timezone-aware times (zone {zone}); give times with a UTC offset, e.g. "
            f"df[{column!r}] = pd.to_datetime(df[{column!r}]).dt.tz_localize({zone!r})"
        )

    def encode(
        self, column: str, values: pd.Series, places: ValuePlaces | None = None
    ) -> np.ndarray:
        """(R,) int32 codes of a categorical column; values not in its vocabulary are unknown.

        The warning naming the unknown values shows them with their type
        (`'1'` vs `1`) and says when one is a training value as text only
        (`type_hint`): a column read as text where training had numbers
        makes every value unknown, and printed alike the two looked the same.
        With `places`, it also says where each lies: how many rows of each
        table hold it and the first one's series and time (a typo in the
        forecast period's known values changes the forecast, and must be
        found), and, for more than one value, how many rows hold them in all.
        A row `places` gives no table (a value carried over, see `RowSources`)
        is neither counted nor named.
        An empty value (the cells of an observed column before its series'
        first value, which gridding leaves empty) is coded unknown without a
        word: it was announced with the filled cells.
        """
        vocabulary = self.vocabularies[column]
        unseen: dict[str, Any] = {}
        # Per unseen value (its repr): the groups (distinct values) or positions holding it.
        holding: dict[str, list[int]] = {}
        if pd.api.types.infer_dtype(values, skipna=True) in ("integer", "string", "empty"):
            # Equal values are alike here (no 1 beside 1.0): each distinct one is looked
            # up once, in the order of first occurrence, and empty cells are unknown.
            group, distinct = pd.factorize(values)
            known = np.append(_codes(vocabulary, distinct), len(vocabulary)).astype(np.int32)
            codes = known[np.where(group >= 0, group, len(distinct))]
            for index, (value, code) in enumerate(zip(distinct, known[:-1], strict=True)):
                if code == len(vocabulary):
                    key = repr(plain_value(value))
                    unseen.setdefault(key, plain_value(value))
                    holding.setdefault(key, []).append(index)
            unknown = (codes == len(vocabulary)) & (group >= 0)

            def positions(key: str) -> np.ndarray:
                return np.flatnonzero(np.isin(group, holding[key]))
        else:
            codes = _codes(vocabulary, values)
            for index, (value, code) in enumerate(zip(values, codes, strict=True)):
                if code == len(vocabulary) and not pd.isna(value):  # empty: announced as filled
                    key = repr(plain_value(value))
                    unseen.setdefault(key, plain_value(value))
                    holding.setdefault(key, []).append(index)
            unknown = (codes == len(vocabulary)) & values.notna().to_numpy()

            def positions(key: str) -> np.ndarray:
                return np.asarray(holding[key], dtype=np.int64)

        if unseen:
            hint = type_hint(list(unseen.values()), vocabulary, column, "in training")
            named = sorted(unseen)
            located = ""
            if places is not None:
                texts = [places.describe(key, positions(key)) for key in named[:_NAMED]]
                texts = [text for text in texts if text]
                in_all = ""
                if texts and len(named) > 1:
                    count = places.counted(np.flatnonzero(unknown))
                    unit = places.unit if places.unit == "series" else f"{places.unit}s"
                    in_all = f"{count} {unit} in all: "
                located = f" ({in_all}{'; '.join(texts)})" if texts else ""
            warnings.warn(
                f"categorical column {column!r} has values not seen in training, coded as "
                f"unknown: [{first_few(named, limit=_NAMED)}]{located}{hint}",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        return codes

    def vocabulary_codes(self, ids: Sequence[Any]) -> np.ndarray:
        """(m,) int32 vocabulary code of each id; unknown ids get `len(series_ids)`."""
        return _codes(self.series_ids, ids)

    def _panel_target_scaler(
        self,
        vocabulary: np.ndarray,
        ids: Sequence[Any],
        target: np.ndarray,
        codes: np.ndarray,
        times: pd.DatetimeIndex,
        new_series_cuts: Sequence[pd.Timestamp] = (),
    ) -> TargetScaler:
        """The target scaler of each panel series: the fitted one, or one fitted here if new.

        A new series is fitted on its observed `target` values before the
        first of `new_series_cuts` under which it has any (all its values when
        there are no cuts), and refused when it has none before the last cut.
        """
        unknown = vocabulary == len(self.series_ids)
        known = np.where(unknown, 0, vocabulary)
        loc = self.target_scaler.loc[known].copy()
        scale = self.target_scaler.scale[known].copy()
        if unknown.any():
            names = [ids[code] for code in np.flatnonzero(unknown).tolist()]
            fallbacks, constants, cuts_used, extremes = [], [], [], []
            # `codes` are sorted (`transform`): a series' rows are one slice.
            bounds = np.searchsorted(codes, np.arange(len(ids) + 1))
            present = ~np.isnan(target)
            before = [np.asarray(times < cut) for cut in new_series_cuts]
            for code in np.flatnonzero(unknown).tolist():
                rows = slice(bounds[code], bounds[code + 1])
                used = present[rows]
                for cut, earlier in zip(new_series_cuts, before, strict=True):
                    used = present[rows] & earlier[rows]
                    if used.any():
                        cuts_used.append(f"{ids[code]!r} before {cut}")
                        break
                values = target[rows][used]
                if values.size == 0:
                    last = f" before {new_series_cuts[-1]}" if len(new_series_cuts) else ""
                    raise NewSeriesWithoutTargetError(
                        f"series {ids[code]!r} is new and has no observed target{last} to "
                        "scale it by",
                        ids[code],
                        new_series_cuts[-1] if len(new_series_cuts) else None,
                    )
                transform, method = self.target_scaler.target_transform, self.target_scaler.method
                values = forward_transform(values, transform)
                loc[code], scale[code], fallback, constant = target_statistics(values, method)
                if fallback:
                    fallbacks.append(ids[code])
                if constant:
                    constants.append(ids[code])
                    continue
                found = extreme_series(ids[code], values, float(scale[code]), method, transform)
                if found is not None:
                    first, extreme = found
                    place = f"at {times[rows][used][first]}"
                    extremes.append(extreme._replace(place=place))
            source = (
                "history before the first split start under which it has observed values ("
                + first_few(cuts_used)
                + ")"
                if len(new_series_cuts)
                else "history given here"
            )
            hint = type_hint(names, self.series_ids, self.spec.id_col, "in the training data")
            listed = first_few([repr(name) for name in names])
            warnings.warn(
                f"series [{listed}] were not in the training data: their id embedding is the "
                "untrained 'unknown' entry and their target scaler is fitted on the "
                f"{source}{hint}",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
            announce_spread_fallbacks(fallbacks, f"the {source}")
            announce_constant_series(constants, f"the {source}")
            announce_extreme_values(extremes, self.target_scaler.method, f"the {source}")
        return TargetScaler(
            loc=loc,
            scale=scale,
            method=self.target_scaler.method,
            target_transform=self.target_scaler.target_transform,
        )

    def transform(
        self,
        grid: pd.DataFrame,
        new_series_cuts: Sequence[pd.Timestamp] = (),
        sources: RowSources | None = None,
    ) -> Transformed:
        """Model inputs of a gridded table of this spec (see `Transformed`).

        `grid` is sorted by (id, time), as `to_regular_grid` returns it; the
        target may be NaN on rows flagged missing (e.g. future rows). Its times
        must be naive or aware as the training table's were (`check_time_zone`).

        `new_series_cuts` (ordered times) limits what the target scaler of a
        series not in `series_ids` is fitted on, for a table that is scored:
        its observed target before the first cut under which it has one (the
        validation start, then the start of the scored period), so the scaler
        knows nothing of the steps it is scored on. Empty (the default) fits
        it on all the table's observed target, right for a history.

        `sources`: which table each row of `grid` came from (`RowSources`; in
        `grid`'s order), named by the warning of categories not seen in
        training beside each one's series and time; None: all rows are 'the
        table's.

        Raises:
          ValueError: a new series has no observed target (before the last cut), or
            a value is beyond float32 as a model input (`_float32_inputs`).
        """
        spec = self.spec
        self.check_time_zone(grid[spec.time_col])
        codes, ids = pd.factorize(grid[spec.id_col], sort=True)
        sources = RowSources() if sources is None else sources
        if (codes[1:] < codes[:-1]).any():
            order = np.argsort(codes, kind="stable")
            grid, codes = grid.iloc[order], codes[order]
            if sources.future is not None:
                future = np.asarray(sources.future, dtype=bool)[order]
                sources = dataclasses.replace(sources, future=future)
        # else already in series order (`to_regular_grid`'s): no copy of the whole grid
        grid = grid.reset_index(drop=True)
        codes = codes.astype(np.int32)
        ids = tuple(plain_value(value) for value in ids)
        times = pd.DatetimeIndex(grid[spec.time_col])
        missing = grid[self.missing_col].to_numpy(np.float64)
        raw_target = np.where(missing > 0, np.nan, grid[spec.target].to_numpy(np.float64))
        vocabulary = self.vocabulary_codes(ids)
        check_domain(
            raw_target, codes, self.target_scaler.target_transform, ids, times, fitted=True
        )
        target_scaler = self._panel_target_scaler(
            vocabulary, ids, raw_target, codes, times, new_series_cuts
        )
        # Empty (NaN) on rows before a series' first observed value (never back-filled
        # from the future, see `to_regular_grid`) and on appended future rows: there the
        # input is the scaler's location, 0.
        filled_target = grid[spec.target].to_numpy(np.float64)
        empty_target = np.isnan(filled_target)
        scaled_target = target_scaler.transform(np.where(empty_target, 0.0, filled_target), codes)
        scaled_target[empty_target] = 0.0
        real_observed = spec.real(spec.observed_cols)
        user = [*real_observed, *spec.real(spec.known_cols)]
        scaled_user = self.feature_scaler.transform(grid[user].to_numpy(np.float64))
        observed_user = np.nan_to_num(scaled_user[:, : len(real_observed)], nan=0.0)
        known_user = scaled_user[:, len(real_observed) :]
        time_index = steps_since(times, self.origin, spec.freq) / self.train_steps
        calendar = calendar_features(times, spec.freq, spec.timezone or self.time_zone)
        known = np.concatenate([calendar, time_index[:, None], known_user], axis=1)
        flag = [missing[:, None]] if self.missing_flag else []
        observed = np.concatenate([scaled_target[:, None], observed_user, *flag], axis=1)
        num_series = len(ids)
        first_rows = np.searchsorted(codes, np.arange(num_series))

        every_row = np.arange(len(grid))

        def at(row: int) -> str:
            return f"series {ids[codes[row]]!r} at {times[row]}"

        def categorical(names: Sequence[str], observed: bool = False) -> np.ndarray:
            if not names:
                return np.zeros((len(grid), 0), np.int32)
            places = ValuePlaces(at=at, tables=sources.tables(len(grid), observed))
            return np.stack([self.encode(name, grid[name], places) for name in names], axis=1)

        def static_categorical_codes(names: Sequence[str]) -> np.ndarray:
            # Coded once per series, at its first row (a history row).
            if not names:
                return np.zeros((num_series, 0), np.int32)
            places = ValuePlaces(
                at=lambda code: f"series {ids[code]!r}",
                tables=sources.tables(len(grid))[first_rows],
                unit="series",
            )
            columns = [self.encode(name, grid[name].iloc[first_rows], places) for name in names]
            return np.stack(columns, axis=1)

        static_categorical = np.concatenate(
            [vocabulary[:, None], static_categorical_codes(self.static_categorical_names[1:])],
            axis=1,
        )

        observed = _float32_inputs(observed, self.observed_feature_names, grid, every_row, at)
        known = _float32_inputs(known, self.known_feature_names, grid, every_row, at)
        self.announce_changed_statics(ids, _static_values(grid, spec, first_rows))
        static = grid[list(self.static_feature_names)].to_numpy(np.float64)[first_rows]
        if self.static_scaler is not None:
            static = self.static_scaler.transform(static)
        static = _float32_inputs(
            static,
            self.static_feature_names,
            grid,
            first_rows,
            lambda code: f"series {ids[code]!r}",
        )
        panel = Panel(
            series_code=codes,
            times=times,
            observed=observed,
            known=known,
            target=observed[:, 0].copy(),
            target_mask=(1.0 - missing).astype(np.float32),
            static=static,
            series_start=first_rows.astype(np.int64),
            series_length=np.bincount(codes, minlength=num_series).astype(np.int64),
            static_categorical=static_categorical.astype(np.int32),
            known_categorical=categorical(self.known_categorical_names),
            observed_categorical=categorical(self.observed_categorical_names, observed=True),
        )
        frame = grid[[spec.id_col, spec.time_col]].copy()
        frame[spec.target] = raw_target
        frame[self.missing_col] = missing
        frame["series_code"] = codes
        frame[list(self.known_feature_names)] = panel.known
        return Transformed(panel=panel, frame=frame, target_scaler=target_scaler, series_ids=ids)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict from which `from_json` rebuilds this preprocessor exactly."""
        return {
            "spec": dataclasses.asdict(self.spec),
            "series_ids": list(self.series_ids),
            "origin": self.origin.isoformat(),
            "train_steps": self.train_steps,
            "target_scaler": {
                "method": self.target_scaler.method,
                "transform": self.target_scaler.target_transform,
                "loc": self.target_scaler.loc.tolist(),
                "scale": self.target_scaler.scale.tolist(),
            },
            "feature_scaler": {
                "loc": self.feature_scaler.loc.tolist(),
                "scale": self.feature_scaler.scale.tolist(),
                # The training range `predict` compares future known values with.
                **(
                    {"low": None, "high": None}
                    if self.feature_scaler.low is None or self.feature_scaler.high is None
                    else {
                        "low": self.feature_scaler.low.tolist(),
                        "high": self.feature_scaler.high.tolist(),
                    }
                ),
            },
            "vocabularies": {name: list(values) for name, values in self.vocabularies.items()},
            "missing_flag": self.missing_flag,
            "time_zone": self.time_zone,
            "static_scaler": (
                None
                if self.static_scaler is None
                else {
                    "loc": self.static_scaler.loc.tolist(),
                    "scale": self.static_scaler.scale.tolist(),
                }
            ),
            "statics": (
                None
                if self.statics is None
                else [[series, *values] for series, values in self.statics.items()]
            ),
            "fills_empty_categoricals": self.fills_empty_categoricals,
        }

    @classmethod
    def from_json(
        cls, data: dict[str, Any], complete: bool = False, format_version: int | None = None
    ) -> Preprocessor:
        """The preprocessor `to_json` described, refused unless it is one `fit` could make.

        A hand-edited or damaged description would otherwise load and fail deep
        inside `transform`, or forecast with another model without a word: a
        scaler list shorter or longer than the series, a non-finite or
        non-positive scale, a vocabulary with a value twice (codes shifted), a
        flag given as text, an origin that is not an ISO text (`'01/02/2024'`
        is read month first) or a zone that is not the origin's. Unknown keys
        are refused, as in the other sections of config.json (a mistyped
        `transform` would otherwise be ignored); `vocabularies`,
        `missing_flag`, `time_zone`, `static_scaler` and the scaler's
        `transform` and `statics` may be absent (runs saved before they were kept),
        unless `complete` (a run folder of format version 2 or later, whose
        `to_json` wrote every key: null for a part the run has not). A key
        added later (`_PREPROCESSOR_ADDED`, by the run folder format version
        that added it) may be absent from a folder of an earlier
        `format_version` (or with none given), and takes its old meaning.

        Raises:
          ValueError, TypeError: naming the key (`preprocessor.<key>`), what it
            must be and what it holds.
        """

        def check_keys(data: Any, where: str, required: set[str], optional: set[str]) -> None:
            if complete:
                required, optional = required | optional, set()
            _check_keys(data, where, required, optional)

        added = {
            key
            for key, version in _PREPROCESSOR_ADDED.items()
            if format_version is not None and format_version >= version
        }
        if complete:  # every key its version wrote; those added later absent or not
            required = _PREPROCESSOR_KEYS | _PREPROCESSOR_OPTIONAL | added
            optional = set(_PREPROCESSOR_ADDED) - added
        else:
            required, optional = (
                _PREPROCESSOR_KEYS,
                _PREPROCESSOR_OPTIONAL | set(_PREPROCESSOR_ADDED),
            )
        _check_keys(data, "preprocessor", required, optional)
        fills = data.get("fills_empty_categoricals", True)
        if not isinstance(fills, bool):
            raise TypeError(
                f"preprocessor.fills_empty_categoricals must be true or false, got {fills!r}"
            )
        target, features = data["target_scaler"], data["feature_scaler"]
        check_keys(target, "preprocessor.target_scaler", _TARGET_SCALER_KEYS, {"transform"})
        check_keys(features, "preprocessor.feature_scaler", {"loc", "scale"}, {"low", "high"})
        if not isinstance(data["spec"], dict):
            raise TypeError(f"preprocessor.spec must be an object, got {data['spec']!r}")
        spec = TableSpec(**data["spec"])
        series_ids = _json_values(data["series_ids"], "preprocessor.series_ids")
        if not series_ids:
            raise ValueError("preprocessor.series_ids is empty; a fitted run has a series")
        method, transform = target["method"], target.get("transform", "none")
        for key, value, allowed in (("method", method, TARGET_SCALERS),
                                    ("transform", transform, TARGET_TRANSFORMS)):  # fmt: skip
            if value not in allowed:
                raise ValueError(
                    f"preprocessor.target_scaler.{key} must be one of {allowed}, got {value!r}"
                )
        scaled = f"one per series of preprocessor.series_ids ({len(series_ids)})"
        user = len(spec.real(spec.observed_cols)) + len(spec.real(spec.known_cols))
        columns = f"one per real observed then known column of preprocessor.spec ({user})"
        vocabularies = data.get("vocabularies", {})
        categorical = sorted(spec.categorical_cols)
        if not isinstance(vocabularies, dict) or sorted(vocabularies) != categorical:
            raise ValueError(
                f"preprocessor.vocabularies must have one list per column of "
                f"preprocessor.spec.categorical_cols {list(spec.categorical_cols)}, got "
                f"{vocabularies!r:.200}"
            )
        missing_flag = data.get("missing_flag", True)
        if not isinstance(missing_flag, bool):
            raise TypeError(
                f"preprocessor.missing_flag must be true or false, got {missing_flag!r}"
            )
        train_steps = data["train_steps"]
        if (
            isinstance(train_steps, bool)
            or not isinstance(train_steps, int | float)
            or not 1.0 <= train_steps < float("inf")
        ):
            raise ValueError(
                f"preprocessor.train_steps must be a number >= 1 (steps from the origin to "
                f"the validation start), got {train_steps!r}"
            )
        zone = data.get("time_zone")
        static_scaler = None
        if data.get("static_scaler") is not None:
            statics = data["static_scaler"]
            _check_keys(statics, "preprocessor.static_scaler", {"loc", "scale"}, set())
            count = len(spec.real(spec.static_cols))
            per = f"one per real static column of preprocessor.spec ({count})"
            static_scaler = FeatureScaler(
                loc=_numbers(statics["loc"], "preprocessor.static_scaler.loc", count, per),
                scale=_numbers(
                    statics["scale"], "preprocessor.static_scaler.scale", count, per, positive=True
                ),
            )
        statics = data.get("statics")
        statics = None if statics is None else _statics(statics, spec, series_ids)
        return cls(
            spec=spec,
            series_ids=series_ids,
            origin=_origin(data["origin"], zone),
            train_steps=float(train_steps),
            target_scaler=TargetScaler(
                loc=_numbers(
                    target["loc"], "preprocessor.target_scaler.loc", len(series_ids), scaled
                ),
                scale=_numbers(
                    target["scale"],
                    "preprocessor.target_scaler.scale",
                    len(series_ids),
                    scaled,
                    positive=True,
                ),
                method=method,
                target_transform=transform,
            ),
            feature_scaler=FeatureScaler(
                loc=_numbers(features["loc"], "preprocessor.feature_scaler.loc", user, columns),
                scale=_numbers(
                    features["scale"],
                    "preprocessor.feature_scaler.scale",
                    user,
                    columns,
                    positive=True,
                ),
                # Runs saved before the ranges were recorded: their future values go unchecked.
                **{
                    bound: _numbers(
                        features[bound], f"preprocessor.feature_scaler.{bound}", user, columns
                    )
                    for bound in ("low", "high")
                    if features.get(bound) is not None
                },
            ),
            vocabularies={
                name: _json_values(values, f"preprocessor.vocabularies.{name}")
                for name, values in vocabularies.items()
            },
            missing_flag=missing_flag,
            time_zone=zone,
            static_scaler=static_scaler,
            statics=statics,
            fills_empty_categoricals=fills,
        )


_PREPROCESSOR_KEYS = {"spec", "series_ids", "origin", "train_steps", "target_scaler",
                      "feature_scaler"}  # fmt: skip
# Absent from runs saved before they were kept: `from_json` takes their old meaning.
_PREPROCESSOR_OPTIONAL = {"vocabularies", "missing_flag", "time_zone", "static_scaler",
                          "statics"}  # fmt: skip
# Keys added since, by the run folder format version that added them (`from_json`).
_PREPROCESSOR_ADDED = {"fills_empty_categoricals": 4}
_TARGET_SCALER_KEYS = {"method", "loc", "scale"}


def _static_values(grid: pd.DataFrame, spec: TableSpec, rows: np.ndarray) -> list[tuple[Any, ...]]:
    """The static values of `grid`'s `rows` (one per series), as `Preprocessor.statics` keeps them.

    Floats for real columns, the ids' kinds (texts, ints) for categorical ones.
    """
    columns = []
    for column in spec.static_cols:
        values = grid[column].iloc[rows]
        if column in spec.categorical_cols:
            columns.append([plain_value(value) for value in values])
        else:
            columns.append([float(value) for value in values])
    return list(zip(*columns, strict=True)) if columns else [() for _ in rows]


def _statics(rows: Any, spec: TableSpec, series_ids: Sequence[Any]) -> dict[Any, tuple[Any, ...]]:
    """`Preprocessor.statics` from its JSON rows `[series id, one value per static column]`.

    Not every series need be listed (one added to a run by hand has no
    statics: nothing is compared for it), but each listed must be a training
    series, listed once, with a finite number per real static column and a
    text or number per categorical one.
    """
    where = "preprocessor.statics"
    columns = list(spec.static_cols)
    shape = f"[series id, one value per column of preprocessor.spec.static_cols {columns}]"
    if not isinstance(rows, list):
        raise TypeError(f"{where} must be a list of {shape}, got {rows!r:.80}")
    known, statics = set(series_ids), {}
    for row in rows:
        if not isinstance(row, list) or len(row) != 1 + len(spec.static_cols):
            raise ValueError(f"{where} rows must be {shape}, got {row!r:.80}")
        series, *values = row
        if not isinstance(series, str | int | float) or series not in known or series in statics:
            raise ValueError(f"{where} lists {series!r}, not a series of preprocessor.series_ids "
                             "or listed twice")  # fmt: skip
        for column, value in zip(spec.static_cols, values, strict=True):
            real = column not in spec.categorical_cols
            plain = not isinstance(value, bool) and isinstance(value, str | int | float)
            if not plain or (real and (isinstance(value, str) or not np.isfinite(value))):
                kind = "a finite number" if real else "a text or number"
                raise ValueError(
                    f"{where}: {column!r} of series {series!r} must be {kind}, got {value!r}"
                )
        statics[series] = tuple(
            value if column in spec.categorical_cols else float(value)
            for column, value in zip(spec.static_cols, values, strict=True)
        )
    return statics


def _check_keys(data: Any, where: str, required: set[str], optional: set[str]) -> None:
    """Raises unless `data` is a dict with the keys `required`, some of `optional`, no other.

    An unknown key is refused as the data, model and training sections refuse
    theirs: a mistyped key would otherwise be ignored and its default used.
    """
    if not isinstance(data, dict):
        raise TypeError(f"{where} must be an object, got {data!r:.80}")
    missing = sorted(required - set(data))
    if missing:
        raise ValueError(f"{where} lacks the keys {missing}")
    unknown = sorted(set(data) - required - optional)
    if unknown:
        raise ValueError(
            f"{where} has the unknown keys {unknown}; its keys are {sorted(required | optional)}"
        )


def _json_values(values: Any, where: str) -> tuple[Any, ...]:
    """`values`, a list of distinct texts or numbers (series ids, a vocabulary), as a tuple.

    A code is a position in the list, so a value listed twice would shift the
    codes of the values after it, and a list or null is no category.
    """
    if not isinstance(values, list):
        raise TypeError(f"{where} must be a list of texts or numbers, got {values!r:.80}")
    odd = [value for value in values if not isinstance(value, str | int | float)]
    if odd:
        raise TypeError(f"{where} must hold texts or numbers only, got {odd[0]!r}")
    seen: set[Any] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{where} lists {value!r} more than once; each value has one code")
        seen.add(value)
    return tuple(values)


def _numbers(values: Any, where: str, length: int, what: str, positive: bool = False) -> np.ndarray:
    """(length,) float64 of `values`, a list of finite numbers (`positive`: > 0) `what` lists.

    A null (NaN), a text or a scaler list of another length would otherwise
    load and give NaN forecasts, another series' scale or an index error at
    the first forecast.
    """
    if not isinstance(values, list) or any(
        isinstance(value, bool) or not isinstance(value, int | float) for value in values
    ):
        raise TypeError(f"{where} must be a list of numbers, got {values!r:.80}")
    if len(values) != length:
        raise ValueError(f"{where} has {len(values)} entries, it must have {what}")
    array = np.asarray(values, np.float64).reshape(length)
    bad = ~np.isfinite(array) | ((array <= 0.0) if positive else False)
    if bad.any():
        kind = "positive and finite" if positive else "finite"
        raise ValueError(f"{where} must be {kind}, got {values[int(np.argmax(bad))]!r}")
    return array


def _origin(text: Any, zone: Any) -> pd.Timestamp:
    """The origin from its ISO text, in `zone` (its name) when aware.

    Only an ISO 8601 text is read (a text such as '01/02/2024' is read month
    first, a number as nanoseconds since 1970: another origin without a word).
    `to_json` writes the origin in `zone`, so its offset is the zone's at that
    time; one that is not was edited (calendar inputs read in another zone).
    """
    try:
        datetime.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ValueError(
            f"preprocessor.origin must be an ISO 8601 time such as '2024-01-01T00:00:00', "
            f"got {text!r}"
        ) from None
    origin = pd.Timestamp(text)  # ISO text: the offset of then, not the zone
    if zone is None:
        return origin
    if not isinstance(zone, str) or origin.tz is None:
        raise ValueError(
            f"preprocessor.time_zone is {zone!r} but preprocessor.origin {text!r} has no "
            "UTC offset; time_zone must be null for naive times, an IANA name for aware ones"
        )
    try:
        named = origin.tz_convert(zone)
    except Exception as error:
        raise ValueError(
            f"preprocessor.time_zone {zone!r} is not a time zone pandas knows; use an IANA "
            f"name such as 'Australia/Melbourne' ({error!r})"
        ) from None
    if named.utcoffset() != origin.utcoffset():
        raise ValueError(
            f"preprocessor.origin {text!r} is not a time of preprocessor.time_zone {zone!r} "
            f"(its offset then is {named.strftime('%z')}); was one of them edited?"
        )
    return named
