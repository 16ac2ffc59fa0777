"""The fitted map from a gridded long-format table to model inputs, reusable on new tables.

`Preprocessor.fit` learns, on the training period of a table, everything the
model inputs depend on besides the table itself: the series vocabulary (the
id column as a static categorical input), the per-series target scaler, the
standardisation of the observed and known columns, and the origin and unit
of the `time_index` input. `transform` applies exactly that map to any table
of the same spec: the training table (training, evaluation) or a new one
(more recent history, other series), which is how a saved model forecasts
without its training data.

A series the vocabulary does not know gets the reserved code
`len(series_ids)` (its id embedding is the "unknown" entry, never trained)
and a target scaler fitted on its own observed values in the new table;
both are announced with a `UserWarning`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from tft_jax.data.calendar import TIME_INDEX, calendar_feature_names, calendar_features, steps_since
from tft_jax.data.scaling import FeatureScaler, TargetScaler, _location_scale
from tft_jax.data.tables import TableSpec
from tft_jax.data.windows import Panel


def missing_column(spec: TableSpec) -> str:
    """Name of the missing-target indicator for `spec`: `<target>_missing`."""
    return f"{spec.target}_missing"


def _json_value(value: Any) -> Any:
    """A series id as a JSON value (NumPy scalars to Python ones)."""
    return value.item() if isinstance(value, np.generic) else value


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
      feature_scaler: standardisation of `observed_cols` then `known_cols`.
    """

    spec: TableSpec
    series_ids: tuple[Any, ...]
    origin: pd.Timestamp
    train_steps: float
    target_scaler: TargetScaler
    feature_scaler: FeatureScaler

    @property
    def missing_col(self) -> str:
        """Name of the missing-target indicator input."""
        return missing_column(self.spec)

    @property
    def known_feature_names(self) -> tuple[str, ...]:
        """(K,) the known inputs: calendar features, `time_index`, then `known_cols`."""
        return (*calendar_feature_names(self.spec.freq), TIME_INDEX, *self.spec.known_cols)

    @property
    def observed_feature_names(self) -> tuple[str, ...]:
        """(U,) the observed inputs: the scaled target, `observed_cols`, the missing flag."""
        return (self.spec.target, *self.spec.observed_cols, self.missing_col)

    @property
    def static_categorical_cardinalities(self) -> tuple[int, ...]:
        """The id column's categories: the training series plus the reserved unknown code."""
        return (len(self.series_ids) + 1,)

    @classmethod
    def fit(
        cls, grid: pd.DataFrame, spec: TableSpec, validation_start: pd.Timestamp, scaler: str
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
        )
        user = [*spec.observed_cols, *spec.known_cols]
        feature_scaler = FeatureScaler.fit(grid.loc[train_rows, user].to_numpy(np.float64))
        origin = times.min()
        train_steps = float(steps_since(pd.DatetimeIndex([validation_start]), origin, spec.freq)[0])
        return cls(
            spec=spec,
            series_ids=tuple(_json_value(value) for value in series_ids),
            origin=origin,
            train_steps=max(train_steps, 1.0),
            target_scaler=target_scaler,
            feature_scaler=feature_scaler,
        )

    def vocabulary_codes(self, ids: Sequence[Any]) -> np.ndarray:
        """(m,) int32 vocabulary code of each id; unknown ids get `len(series_ids)`."""
        position = {value: code for code, value in enumerate(self.series_ids)}
        unknown = len(self.series_ids)
        return np.array([position.get(_json_value(i), unknown) for i in ids], dtype=np.int32)

    def _panel_target_scaler(
        self, vocabulary: np.ndarray, ids: Sequence[Any], target: np.ndarray, codes: np.ndarray
    ) -> TargetScaler:
        """The target scaler of each panel series: the fitted one, or one fitted here if new."""
        unknown = vocabulary == len(self.series_ids)
        known = np.where(unknown, 0, vocabulary)
        loc = self.target_scaler.loc[known].copy()
        scale = self.target_scaler.scale[known].copy()
        if unknown.any():
            names = [ids[code] for code in np.flatnonzero(unknown)]
            warnings.warn(
                f"series {names} were not in the training data: their id embedding is the "
                "untrained 'unknown' entry and their target scaler is fitted on the "
                "history given here",
                UserWarning,
                stacklevel=3,
            )
            for code in np.flatnonzero(unknown):
                values = target[(codes == code) & ~np.isnan(target)]
                if values.size == 0:
                    raise ValueError(
                        f"series {ids[code]!r} is new and has no observed target to scale it by"
                    )
                loc[code], scale[code] = _location_scale(values, self.target_scaler.method)
        return TargetScaler(loc=loc, scale=scale, method=self.target_scaler.method)

    def transform(self, grid: pd.DataFrame) -> Transformed:
        """Model inputs of a gridded table of this spec (see `Transformed`).

        `grid` is sorted by (id, time), as `to_regular_grid` returns it; the
        target may be NaN on rows flagged missing (e.g. future rows).
        """
        spec = self.spec
        codes, ids = pd.factorize(grid[spec.id_col], sort=True)
        order = np.argsort(codes, kind="stable")
        grid = grid.iloc[order].reset_index(drop=True)
        codes = codes[order].astype(np.int32)
        ids = tuple(_json_value(value) for value in ids)
        times = pd.DatetimeIndex(grid[spec.time_col])
        missing = grid[self.missing_col].to_numpy(np.float64)
        raw_target = np.where(missing > 0, np.nan, grid[spec.target].to_numpy(np.float64))
        vocabulary = self.vocabulary_codes(ids)
        target_scaler = self._panel_target_scaler(vocabulary, ids, raw_target, codes)
        filled_target = grid[spec.target].to_numpy(np.float64)
        scaled_target = target_scaler.transform(np.nan_to_num(filled_target), codes)
        user = [*spec.observed_cols, *spec.known_cols]
        scaled_user = self.feature_scaler.transform(grid[user].to_numpy(np.float64))
        observed_user = scaled_user[:, : len(spec.observed_cols)]
        known_user = scaled_user[:, len(spec.observed_cols) :]
        time_index = steps_since(times, self.origin, spec.freq) / self.train_steps
        known = np.concatenate(
            [calendar_features(times, spec.freq, spec.timezone), time_index[:, None], known_user],
            axis=1,
        )
        observed = np.concatenate(
            [scaled_target[:, None], observed_user, missing[:, None]], axis=1
        )
        num_series = len(ids)
        first_rows = np.searchsorted(codes, np.arange(num_series))
        panel = Panel(
            series_code=codes,
            times=times,
            observed=observed.astype(np.float32),
            known=known.astype(np.float32),
            target=scaled_target.astype(np.float32),
            target_mask=(1.0 - missing).astype(np.float32),
            static=grid[list(spec.static_cols)].to_numpy(np.float32)[first_rows],
            series_start=first_rows.astype(np.int64),
            series_length=np.bincount(codes, minlength=num_series).astype(np.int64),
            static_categorical=vocabulary[:, None],
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
                "loc": self.target_scaler.loc.tolist(),
                "scale": self.target_scaler.scale.tolist(),
            },
            "feature_scaler": {
                "loc": self.feature_scaler.loc.tolist(),
                "scale": self.feature_scaler.scale.tolist(),
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Preprocessor:
        """The preprocessor `to_json` described."""
        target, features = data["target_scaler"], data["feature_scaler"]
        return cls(
            spec=TableSpec(**data["spec"]),
            series_ids=tuple(data["series_ids"]),
            origin=pd.Timestamp(data["origin"]),
            train_steps=float(data["train_steps"]),
            target_scaler=TargetScaler(
                loc=np.asarray(target["loc"], np.float64),
                scale=np.asarray(target["scale"], np.float64),
                method=target["method"],
            ),
            feature_scaler=FeatureScaler(
                loc=np.asarray(features["loc"], np.float64).reshape(-1),
                scale=np.asarray(features["scale"], np.float64).reshape(-1),
            ),
        )
