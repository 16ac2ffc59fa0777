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
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tft_jax.data.calendar import TIME_INDEX, calendar_feature_names, calendar_features, steps_since
from tft_jax.data.scaling import (
    FeatureScaler,
    TargetScaler,
    _location_scale,
    check_domain,
    forward_transform,
)
from tft_jax.data.tables import TableSpec
from tft_jax.data.windows import Panel


def missing_column(spec: TableSpec) -> str:
    """Name of the missing-target indicator for `spec`: `<target>_missing`."""
    return f"{spec.target}_missing"


def _json_value(value: Any) -> Any:
    """A series id as a JSON value (NumPy scalars to Python ones)."""
    return value.item() if isinstance(value, np.generic) else value


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
    return np.array([position.get(_json_value(v), unknown) for v in values], dtype=np.int32)


def type_hint(given: Sequence[Any], known: Sequence[Any], column: str, where: str) -> str:
    """A hint when values of `given` equal values of `known` (those `where`) as text only.

    An id column read as text where the training one held numbers (`'1'` vs
    `1`, or the reverse) makes every series new; the message naming them then
    says why. Empty when no value is such a twin.
    """
    as_text = {str(_json_value(value)): value for value in known}
    for value in given:
        twin = as_text.get(str(_json_value(value)))
        if twin is not None and twin != value:
            kind = type(_json_value(twin)).__name__
            return (
                f"; {value!r} ({type(_json_value(value)).__name__}) is {twin!r} ({kind}) {where}: "
                f"give column {column!r} the same type, e.g. df[{column!r}].astype({kind})"
            )
    return ""


def _float32_inputs(
    values: np.ndarray,
    names: Sequence[str],
    grid: pd.DataFrame,
    rows: np.ndarray,
    where: Callable[[int], str],
) -> np.ndarray:
    """`values` (R, F), model inputs named `names`, as float32; refused where not finite there.

    A value beyond float32's range (about 3.4e38 after scaling, or a column
    whose scaler could not be fitted because its squares overflow float64)
    would enter the model as inf: NaN forecasts, or a training run whose every
    step is skipped. It is refused here, naming the column, where it is
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
      vocabularies: the sorted training values of each categorical column.
      missing_flag: whether `<target>_missing` is an observed input.
      time_zone: the training time column's zone by name (None: naive, or a
        run saved before it was kept). Without `spec.timezone`, calendar
        inputs of aware times are read in it, so a table of the same instants
        in another zone (UTC from a database) gets the inputs the model was
        trained on, not its days shifted; `origin` is read back in it.
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

    @property
    def missing_col(self) -> str:
        """Name of the missing-target indicator input."""
        return missing_column(self.spec)

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
    ) -> Preprocessor:
        """Fits on the rows of `grid` (from `to_regular_grid`) before `validation_start`."""
        times = pd.DatetimeIndex(grid[spec.time_col])
        train_rows = np.asarray(times < validation_start)
        codes, series_ids = pd.factorize(grid[spec.id_col], sort=True)
        observed = grid[missing_column(spec)].to_numpy(np.float64) == 0.0
        target = grid[spec.target].to_numpy(np.float64)
        target_scaler = TargetScaler.fit(
            np.where(observed, target, np.nan)[train_rows],
            codes[train_rows],
            len(series_ids),
            scaler,
            series_names=list(series_ids),
            transform=target_transform,
        )
        user = [*spec.real(spec.observed_cols), *spec.real(spec.known_cols)]
        feature_scaler = FeatureScaler.fit(grid.loc[train_rows, user].to_numpy(np.float64))
        origin = times.min()
        train_steps = float(steps_since(pd.DatetimeIndex([validation_start]), origin, spec.freq)[0])
        vocabularies = {
            column: tuple(sorted({_json_value(v) for v in grid.loc[train_rows, column].dropna()}))
            for column in spec.categorical_cols
        }
        return cls(
            spec=spec,
            series_ids=tuple(_json_value(value) for value in series_ids),
            origin=origin,
            train_steps=max(train_steps, 1.0),
            target_scaler=target_scaler,
            feature_scaler=feature_scaler,
            vocabularies=vocabularies,
            missing_flag=bool((~observed[train_rows]).any()),
            time_zone=_zone_name(origin),
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

    def encode(self, column: str, values: pd.Series) -> np.ndarray:
        """(R,) int32 codes of a categorical column; values not in its vocabulary are unknown."""
        vocabulary = self.vocabularies[column]
        codes = _codes(vocabulary, values)
        unseen = sorted({str(_json_value(v)) for v, c in zip(values, codes, strict=True)
                         if c == len(vocabulary)})  # fmt: skip
        if unseen:
            warnings.warn(
                f"categorical column {column!r} has values not seen in training, coded as "
                f"unknown: {unseen[:10]}{' ...' if len(unseen) > 10 else ''}",
                UserWarning,
                stacklevel=4,
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
            names = [ids[code] for code in np.flatnonzero(unknown)]
            source = (
                f"history before {new_series_cuts[0]} (the first scored step)"
                if len(new_series_cuts)
                else "history given here"
            )
            hint = type_hint(names, self.series_ids, self.spec.id_col, "in the training data")
            warnings.warn(
                f"series {names} were not in the training data: their id embedding is the "
                "untrained 'unknown' entry and their target scaler is fitted on the "
                f"{source}{hint}",
                UserWarning,
                stacklevel=3,
            )
            for code in np.flatnonzero(unknown):
                rows = (codes == code) & ~np.isnan(target)
                values = target[rows]
                for cut in new_series_cuts:
                    values = target[rows & np.asarray(times < cut)]
                    if values.size:
                        break
                if values.size == 0:
                    before = f" before {new_series_cuts[-1]}" if len(new_series_cuts) else ""
                    raise ValueError(
                        f"series {ids[code]!r} is new and has no observed target{before} to "
                        "scale it by"
                    )
                values = forward_transform(values, self.target_scaler.target_transform)
                loc[code], scale[code] = _location_scale(values, self.target_scaler.method)
        return TargetScaler(
            loc=loc,
            scale=scale,
            method=self.target_scaler.method,
            target_transform=self.target_scaler.target_transform,
        )

    def transform(
        self, grid: pd.DataFrame, new_series_cuts: Sequence[pd.Timestamp] = ()
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

        Raises:
          ValueError: a new series has no observed target (before the last cut), or
            a value is beyond float32 as a model input (`_float32_inputs`).
        """
        spec = self.spec
        self.check_time_zone(grid[spec.time_col])
        codes, ids = pd.factorize(grid[spec.id_col], sort=True)
        order = np.argsort(codes, kind="stable")
        grid = grid.iloc[order].reset_index(drop=True)
        codes = codes[order].astype(np.int32)
        ids = tuple(_json_value(value) for value in ids)
        times = pd.DatetimeIndex(grid[spec.time_col])
        missing = grid[self.missing_col].to_numpy(np.float64)
        raw_target = np.where(missing > 0, np.nan, grid[spec.target].to_numpy(np.float64))
        vocabulary = self.vocabulary_codes(ids)
        check_domain(raw_target, codes, self.target_scaler.target_transform, ids)
        target_scaler = self._panel_target_scaler(
            vocabulary, ids, raw_target, codes, times, new_series_cuts
        )
        filled_target = grid[spec.target].to_numpy(np.float64)
        scaled_target = target_scaler.transform(np.nan_to_num(filled_target), codes)
        real_observed = spec.real(spec.observed_cols)
        user = [*real_observed, *spec.real(spec.known_cols)]
        scaled_user = self.feature_scaler.transform(grid[user].to_numpy(np.float64))
        observed_user = scaled_user[:, : len(real_observed)]
        known_user = scaled_user[:, len(real_observed) :]
        time_index = steps_since(times, self.origin, spec.freq) / self.train_steps
        calendar = calendar_features(times, spec.freq, spec.timezone or self.time_zone)
        known = np.concatenate([calendar, time_index[:, None], known_user], axis=1)
        flag = [missing[:, None]] if self.missing_flag else []
        observed = np.concatenate([scaled_target[:, None], observed_user, *flag], axis=1)
        num_series = len(ids)
        first_rows = np.searchsorted(codes, np.arange(num_series))

        def categorical(names: Sequence[str], rows: Any = slice(None)) -> np.ndarray:
            columns = [self.encode(name, grid[name].iloc[rows]) for name in names]
            length = len(grid) if isinstance(rows, slice) else len(rows)
            return np.stack(columns, axis=1) if columns else np.zeros((length, 0), np.int32)

        static_categorical = np.concatenate(
            [vocabulary[:, None], categorical(self.static_categorical_names[1:], first_rows)],
            axis=1,
        )
        every_row = np.arange(len(grid))

        def at(row: int) -> str:
            return f"series {ids[codes[row]]!r} at {times[row]}"

        observed = _float32_inputs(observed, self.observed_feature_names, grid, every_row, at)
        known = _float32_inputs(known, self.known_feature_names, grid, every_row, at)
        static = _float32_inputs(
            grid[list(self.static_feature_names)].to_numpy(np.float64)[first_rows],
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
            observed_categorical=categorical(self.observed_categorical_names),
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
            },
            "vocabularies": {name: list(values) for name, values in self.vocabularies.items()},
            "missing_flag": self.missing_flag,
            "time_zone": self.time_zone,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Preprocessor:
        """The preprocessor `to_json` described."""
        target, features = data["target_scaler"], data["feature_scaler"]
        origin = pd.Timestamp(data["origin"])  # ISO text: the offset of then, not the zone
        zone = data.get("time_zone")
        if zone is not None:
            origin = origin.tz_convert(zone)
        return cls(
            spec=TableSpec(**data["spec"]),
            series_ids=tuple(data["series_ids"]),
            origin=origin,
            train_steps=float(data["train_steps"]),
            target_scaler=TargetScaler(
                loc=np.asarray(target["loc"], np.float64),
                scale=np.asarray(target["scale"], np.float64),
                method=target["method"],
                target_transform=target.get("transform", "none"),
            ),
            feature_scaler=FeatureScaler(
                loc=np.asarray(features["loc"], np.float64).reshape(-1),
                scale=np.asarray(features["scale"], np.float64).reshape(-1),
            ),
            vocabularies={
                name: tuple(values) for name, values in data.get("vocabularies", {}).items()
            },
            missing_flag=bool(data.get("missing_flag", True)),
            time_zone=zone,
        )
