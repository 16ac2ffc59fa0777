"""`prepare_dataset`: a long-format table to train/validation/test windows for the TFT.

Inputs per window (the order of the feature names below is the order of the
last axis of each array):

- static: the real-valued `static_cols` standardised over the training
  series (one value per series); static categorical: the series id as an
  integer code (sorted ids -> 0 .. n-1).
- observed (U): the target scaled per series, the `observed_cols`
  standardised, and the missing indicator `<target>_missing` (1 = the target
  at that step was filled).
- known (K): the calendar sin/cos pairs (`calendar.py`), `time_index` (steps
  since the earliest timestamp of the table divided by the number of steps in
  the training period, so 0..1 over training), then the `known_cols`
  standardised.

Scalers are fitted on the training period only (rows before the validation
start; observed target values only). The split is by time: a window belongs
to the period containing all of its forecast steps (windows straddling a cut
are not used); its history may reach back into earlier periods. Train
targets therefore all precede the validation start and validation targets
the test start. By default windows whose horizon contains a filled target
are left out of every split (they would teach and score made-up values);
their timestamps stay in the grid, flagged. `require_observed_target=False`
keeps them, but those whose every forecast step is filled: their filled
steps carry `target_mask` 0, which the training loss and the scores
(`tft_jax.evaluation.observed_steps`) leave out.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import numbers
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from tft_jax.caller_frame import user_stacklevel
from tft_jax.data.calendar import TIME_INDEX, calendar_feature_names
from tft_jax.data.listing import first_few
from tft_jax.data.preprocessing import Preprocessor, RowSources, missing_column, table_name
from tft_jax.data.scaling import FeatureScaler, TargetScaler
from tft_jax.data.tables import (
    MissingColumnsError,
    TableSpec,
    announce_empty_inputs,
    check_density,
    check_missing_fraction,
    check_missing_fraction_limit,
    empty_input_cells,
    ids_as_categories,
    infer_categorical,
    parse_frequency,
    parse_time_text,
    plain_value,
    read_announced,
    recorded_frequency_hint,
    step_after,
    time_grid,
    to_regular_grid,
    validate_table,
)
from tft_jax.data.windows import (
    Panel,
    WindowSet,
    filled_horizon_steps,
    window_starts,
    windows_in_period,
)
from tft_jax.data.zones import frame_in_zone, in_training_zone, panel_in_zone, zone_to_give_back

SPLITS = ("train", "validation", "test")
# The option that keeps the windows whose horizon holds a filled target, as a caller of
# `prepare_dataset` passes it; messages name it so (`keep_option_named` changes the name for
# a caller that sets it otherwise: the `Forecaster`'s `DataConfig`, the CLI's flag).
KEEP_FILLED_HORIZONS = "prepare_dataset's require_observed_target=False"
_KEEP_OPTION: contextvars.ContextVar[str] = contextvars.ContextVar(
    "keep_option", default=KEEP_FILLED_HORIZONS
)


@contextlib.contextmanager
def keep_option_named(name: str) -> Iterator[None]:
    """Within it, `prepare_dataset`'s messages name the option that keeps windows whose
    horizon holds a filled target as `name` (the caller's own setting, e.g.
    'DataConfig.require_observed_target=False') instead of `KEEP_FILLED_HORIZONS`.

    A context variable: other threads and tasks are not affected.
    """
    token = _KEEP_OPTION.set(name)
    try:
        yield
    finally:
        _KEEP_OPTION.reset(token)


@dataclasses.dataclass(frozen=True, eq=False)
class PreparedDataset:
    """A table turned into windows for the TFT, with what is needed to build and read the model.

    Attributes:
      spec: the table spec.
      history: T.
      horizon: H.
      series_ids: original id of each series code.
      static_feature_names: (S,) names of the real-valued statics.
      static_categorical_names: (C,) names of the categorical statics (the id column).
      static_categorical_cardinalities: (C,) number of categories of each.
      known_feature_names: (K,) names of the known inputs.
      observed_feature_names: (U,) names of the observed inputs.
      target_scaler: the per-series target scaler (fitted on training).
      feature_scaler: standardisation of `observed_cols` then `known_cols`.
      validation_start: first time of the validation period.
      test_start: first time of the test period.
      train, validation, test: the windows of each period.
      frame: the regular grid as a DataFrame, rows in panel order: id, time,
        the target in its own units (NaN where missing), the missing
        indicator, `series_code` and the known inputs under their names.
      preprocessor: the fitted map from a table to model inputs (reusable on
        new tables of the same spec, see `preprocessing`).
      missing_texts: per column, the cells read as missing because they held
        a missing-value text such as 'n/a' (`tables.MISSING_TEXTS`).
      require_observed_target: whether windows whose horizon holds a filled
        target were left out (`prepare_dataset`'s argument).
      scored: `prepare_dataset`'s `scored`: the part of the table whose
        targets the scalers of series new to `preprocessor` do not know.
    """

    spec: TableSpec
    history: int
    horizon: int
    series_ids: tuple[Any, ...]
    static_feature_names: tuple[str, ...]
    static_categorical_names: tuple[str, ...]
    static_categorical_cardinalities: tuple[int, ...]
    known_feature_names: tuple[str, ...]
    observed_feature_names: tuple[str, ...]
    target_scaler: TargetScaler
    feature_scaler: FeatureScaler
    validation_start: pd.Timestamp
    test_start: pd.Timestamp
    train: WindowSet
    validation: WindowSet
    test: WindowSet
    frame: pd.DataFrame
    preprocessor: Preprocessor
    missing_texts: dict[str, int] = dataclasses.field(default_factory=dict)
    require_observed_target: bool = True
    scored: str | int | None = None

    def __repr__(self) -> str:
        """One line: the series, windows and inputs, not the arrays and the frame (a
        notebook cell showing a dataset of a few series printed a thousand lines)."""

        def named(names: Sequence[str]) -> str:
            return f"[{first_few([repr(name) for name in names])}]"

        return (
            f"PreparedDataset({len(self.series_ids)} series, history {self.history}, horizon "
            f"{self.horizon}; windows train {len(self.train)}, validation "
            f"{len(self.validation)}, test {len(self.test)}; validation from "
            f"{self.validation_start}, test from {self.test_start}; statics "
            f"{named(self.static_feature_names)}, categorical statics "
            f"{named(self.static_categorical_names)}, known {named(self.known_feature_names)}, "
            f"observed {named(self.observed_feature_names)})"
        )

    @property
    def new_series(self) -> tuple[Any, ...]:
        """The ids of the series `preprocessor` was not fitted on (scaled from this table)."""
        known = set(self.preprocessor.series_ids)
        return tuple(series for series in self.series_ids if series not in known)

    @property
    def panel(self) -> Panel:
        """The panel all splits index into."""
        return self.train.panel

    @property
    def num_series(self) -> int:
        """Number of series."""
        return len(self.series_ids)

    @property
    def num_static_features(self) -> int:
        """S, the real-valued statics."""
        return len(self.static_feature_names)

    @property
    def num_known_features(self) -> int:
        """K, the known inputs."""
        return len(self.known_feature_names)

    @property
    def num_observed_features(self) -> int:
        """U, the observed inputs (scaled target included)."""
        return len(self.observed_feature_names)

    @property
    def static_weight_names(self) -> tuple[str, ...]:
        """Labels for the model's `static_weights` (S + C): real statics, then categorical."""
        return self.static_feature_names + self.static_categorical_names

    @property
    def known_categorical_names(self) -> tuple[str, ...]:
        """(Kc,) the categorical known inputs (`future_categorical`'s columns)."""
        return self.preprocessor.known_categorical_names

    @property
    def observed_categorical_names(self) -> tuple[str, ...]:
        """(Uc,) the categorical observed inputs (`observed_categorical`'s columns)."""
        return self.preprocessor.observed_categorical_names

    @property
    def future_weight_names(self) -> tuple[str, ...]:
        """Labels for `future_weights` (K + Kc): the known reals, then the known categoricals."""
        return self.known_feature_names + self.known_categorical_names

    @property
    def observed_weight_names(self) -> tuple[str, ...]:
        """Labels for `history_weights` (U + Uc) without known history: reals, then categoricals."""
        return self.observed_feature_names + self.observed_categorical_names

    @property
    def history_weight_names(self) -> tuple[str, ...]:
        """Labels for `history_weights` (U + Uc + K + Kc) when known inputs join the history.

        The observed reals, the observed categoricals, the known reals, the
        known categoricals (the model's order).
        """
        return self.observed_weight_names + self.future_weight_names

    def history_weight_names_for(self, count: int) -> tuple[str, ...]:
        """Labels for `count` history weights, with or without the known inputs.

        `history_weight_names` when the known inputs joined the history
        (`TFTConfig.use_known_history`, as their number tells), else
        `observed_weight_names`.
        """
        if count == len(self.history_weight_names):
            return self.history_weight_names
        return self.observed_weight_names

    def split(self, name: str) -> WindowSet:
        """The windows of split `name` ('train', 'validation' or 'test')."""
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        return getattr(self, name)

    def tft_config_kwargs(self) -> dict[str, Any]:
        """The data-determined `TFTConfig` fields: `TFTConfig(**ds.tft_config_kwargs(), ...)`.

        `use_known_history` is True since every window carries `known_history`
        (the known inputs over the history, as in the paper).
        """
        return {
            "num_static_features": self.num_static_features,
            "num_known_features": self.num_known_features,
            "num_observed_features": self.num_observed_features,
            "sequence_length": self.history,
            "prediction_horizon": self.horizon,
            "static_categorical_cardinalities": self.static_categorical_cardinalities,
            "use_known_history": True,
            **{
                name: value
                for name, value in (
                    ("known_categorical_cardinalities",
                     self.preprocessor.known_categorical_cardinalities),
                    ("observed_categorical_cardinalities",
                     self.preprocessor.observed_categorical_cardinalities),
                )
                if value
            },
        }  # fmt: skip

    def inverse_transform(self, values: npt.ArrayLike, series_code: npt.ArrayLike) -> np.ndarray:
        """Scaled values (B, ...), e.g. quantile forecasts (B, H, Q), in the target's units.

        `values` may be the model's output (a JAX array) and `series_code` a
        batch's codes (B,): both are read as NumPy arrays.
        """
        return self.target_scaler.inverse_transform(values, series_code)

    def summary(self) -> dict[str, Any]:
        """Counts for a report: grid rows, inserted/filled target steps per series, windows.

        Also whether the windows are normalized (`WindowSet.normalized`): a
        saved run records what its model was trained on.
        """
        missing = self.frame.groupby(self.spec.id_col, sort=True)[self.missing_col].sum()
        return {
            "series": self.num_series,
            "rows": len(self.frame),
            "filled_target_steps": {str(k): int(v) for k, v in missing.items()},
            "validation_start": str(self.validation_start),
            "test_start": str(self.test_start),
            "windows": {name: len(self.split(name)) for name in SPLITS},
            "window_normalization": self.train.normalized,
            "missing_texts": dict(self.missing_texts),
            "require_observed_target": self.require_observed_target,
            # Forecast steps without an observed target over each split's windows: left out
            # of the loss and the scores (0 where such windows were left out).
            "masked_target_steps": {
                name: int(_filled_horizon_steps(self.split(name)).sum()) for name in SPLITS
            },
        }

    @property
    def missing_col(self) -> str:
        """Name of the missing indicator input."""
        return missing_column(self.spec)

    def _periods(self) -> list[tuple[pd.Timestamp, pd.Timestamp]]:
        """The `[begin, end)` times of the training, validation and test periods."""
        end = step_after(self.panel.times.max(), self.spec.freq)
        bounds = (self.panel.times.min(), self.validation_start, self.test_start, end)
        return list(itertools.pairwise(bounds))

    def _windows_kept_with_masks(self) -> int:
        """How many windows `require_observed_target=False` keeps that the default leaves out.

        Those whose horizon holds a filled target step and an observed one,
        over all periods, before any stride.
        """
        panel, horizon = self.panel, self.horizon
        every = [windows_in_period(panel, self.history, horizon, *p) for p in self._periods()]
        filled = filled_horizon_steps(panel, np.concatenate(every), horizon)
        return int(np.count_nonzero((filled > 0) & (filled < horizon)))

    def missing_report(self) -> pd.DataFrame:
        """Per series: grid rows, filled target steps (and their share), windows kept and left out.

        Windows left out are those whose horizon holds a filled target (they
        would teach and score made-up values), counted over all splits before
        any stride (`train_stride`/`eval_stride` thin out the windows kept,
        which leaves none out for a filled target). With
        `require_observed_target=False` only the windows whose every forecast
        step is filled are left out (nothing to train on or score):
        `windows_masked` counts the windows kept whose horizon holds a filled
        target, and `masked_steps` those steps over them (each filled step
        once per window it lies in), left out of the loss and the scores.
        """
        panel = self.panel
        frame = self.frame
        filled = frame.groupby("series_code", sort=True)[self.missing_col].sum()
        periods = self._periods()
        every = np.concatenate(
            [windows_in_period(panel, self.history, self.horizon, *period) for period in periods]
        )
        eligible = np.concatenate(
            [
                window_starts(panel, self.history, self.horizon, *period,
                              require_observed_target=self.require_observed_target)
                for period in periods
            ]
        )  # fmt: skip
        kept = np.concatenate([self.split(name).starts for name in SPLITS])
        masked = np.concatenate([_filled_horizon_steps(self.split(name)) for name in SPLITS])
        codes = np.arange(self.num_series)
        return pd.DataFrame(
            {
                self.spec.id_col: list(self.series_ids),
                "rows": panel.series_length,
                "filled_target_steps": filled.reindex(codes, fill_value=0).to_numpy(int),
                "filled_fraction": filled.reindex(codes, fill_value=0).to_numpy()
                / panel.series_length,
                "windows": np.bincount(panel.series_code[kept], minlength=self.num_series),
                "windows_left_out": np.bincount(panel.series_code[every], minlength=self.num_series)
                - np.bincount(panel.series_code[eligible], minlength=self.num_series),
                "windows_masked": np.bincount(
                    panel.series_code[kept[masked > 0]], minlength=self.num_series
                ),
                "masked_steps": np.bincount(
                    panel.series_code[kept], weights=masked, minlength=self.num_series
                ).astype(np.int64),
            }
        )


def _filled_horizon_steps(windows: WindowSet) -> np.ndarray:
    """(N,) int64: how many forecast steps of each window have a filled target (`target_mask` 0)."""
    return filled_horizon_steps(windows.panel, windows.starts, windows.horizon)


def _to_timestamp(value: Any, name: str, tz: Any, spec: TableSpec) -> pd.Timestamp:
    """A cut time, read as the table's times are (`parse_time_text`) and in their zone."""
    timezone = spec.timezone
    try:
        stamp = parse_time_text(value, spec.time_format, spec.dayfirst)
    except (ValueError, TypeError, OverflowError) as error:
        raise ValueError(f"{name}={value!r} is not a timestamp ({error})") from None
    if tz is not None and stamp.tz is None:
        zone = timezone or tz
        try:
            return stamp.tz_localize(zone)
        except ValueError as error:  # a local time skipped or repeated at a DST change
            raise ValueError(
                f"{name}={value!r} is no single time in {zone} ({error}); give a time that "
                "exists once there, or one with its UTC offset (ISO text ending in e.g. '+02:00')"
            ) from None
    if tz is None and stamp.tz is not None:
        raise ValueError(
            f"{name}={value!r} carries a timezone but the time column has none; "
            "pass a naive timestamp"
        )
    return stamp


def _dataset_in_zone(dataset: PreparedDataset, zone: Any) -> PreparedDataset:
    """`dataset` with its times (the same instants) in `zone`: results keep the table's zone."""
    panel = panel_in_zone(dataset.train.panel, zone)
    return dataclasses.replace(
        dataset,
        validation_start=dataset.validation_start.tz_convert(zone),
        test_start=dataset.test_start.tz_convert(zone),
        train=dataclasses.replace(dataset.train, panel=panel),
        validation=dataclasses.replace(dataset.validation, panel=panel),
        test=dataclasses.replace(dataset.test, panel=panel),
        frame=frame_in_zone(dataset.frame, dataset.spec.time_col, zone),
    )


def _check_fraction(name: str, value: float) -> None:
    # Any real number (a NumPy float32 from a config too), but not a bool.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number in [0, 1), got {type(value).__name__} {value!r}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")


def split_times(
    times: pd.DatetimeIndex,
    end: pd.Timestamp,
    validation_fraction: float,
    test_fraction: float,
) -> tuple[pd.Timestamp, pd.Timestamp]:
    """Cut times splitting the span `[times.min(), end)` by fractions, snapped to `times`.

    Each cut is the first of `times` at or after its fractional position, or
    `end` if none is.
    """
    _check_fraction("validation_fraction", validation_fraction)
    _check_fraction("test_fraction", test_fraction)
    if validation_fraction + test_fraction >= 1.0:
        raise ValueError(
            "validation_fraction + test_fraction must be < 1, got "
            f"{validation_fraction} + {test_fraction}"
        )
    unique = pd.DatetimeIndex(times.unique()).sort_values()
    span = end - unique[0]

    def snap(fraction: float) -> pd.Timestamp:
        position = unique.searchsorted(unique[0] + span * fraction)
        return unique[position] if position < len(unique) else end

    return snap(1.0 - validation_fraction - test_fraction), snap(1.0 - test_fraction)


def _windows(
    panel: Panel,
    history: int,
    horizon: int,
    periods: dict[str, tuple[pd.Timestamp, pd.Timestamp]],
    strides: dict[str, int],
    require_observed_target: bool,
) -> dict[str, WindowSet]:
    return {
        name: WindowSet(
            panel=panel,
            starts=window_starts(
                panel, history, horizon, begin, end, strides[name], require_observed_target
            ),
            history=history,
            horizon=horizon,
        )
        for name, (begin, end) in periods.items()
    }


def _check_windows(
    windows: dict[str, WindowSet],
    periods: dict[str, tuple[pd.Timestamp, pd.Timestamp]],
    horizon: int,
    wanted: dict[str, bool],
    require_observed_target: bool,
    split_by: str | None = None,
) -> None:
    """Raises if a period that was asked for (`wanted`) has no window.

    `require_observed_target`: the setting the windows were chosen with; with
    False, a period whose windows all have no observed step says so.

    `split_by` says how a fitted model's settings split the table (its
    fractions or cuts): the caller of evaluation cannot widen the period,
    so the message gives its length against what a window needs instead.

    When the period has windows that were all left out for a filled target
    step in their horizon, the message says so: the warning counting the
    filled steps comes only after a successful preparation, and "widen the
    period" alone hides the cause (e.g. business-day data given freq='D',
    whose weekends are filled rows). See `_filled_windows_hint`.
    """
    for name, window_set in windows.items():
        begin, end = periods[name]
        if len(window_set) or not wanted[name]:
            continue
        every = windows_in_period(window_set.panel, window_set.history, horizon, begin, end)
        if len(every) and not require_observed_target:
            # Windows are kept with their filled steps masked, so each of these has a filled
            # target at every forecast step: nothing to train on, validate on or score.
            raise ValueError(
                f"the {name} period [{begin}, {end}) holds {len(every)} windows, but no "
                "forecast step of theirs has an observed target (each is missing in the table "
                "and filled), so they give nothing to train on, validate on or score: check "
                "that freq is the frequency the data is recorded at and that the table holds "
                "the period's targets"
            )
        filled = _filled_windows_hint(
            len(every),
            int(np.sum(filled_horizon_steps(window_set.panel, every, horizon) < horizon)),
            scoring=split_by is not None,
        )
        if split_by is not None:
            times = window_set.panel.times
            steps = len(times[(times >= begin) & (times < end)].unique())
            raise ValueError(
                f"the {name} period [{begin}, {end}) of this table holds no complete window: "
                f"it spans {steps} steps of the grid, and a window needs {horizon} horizon "
                f"steps inside it with an observed target and {window_set.history} history "
                f"steps before; the model splits a table by its data settings ({split_by}), "
                f"so give a table whose {name} period is long enough{filled}"
            )
        raise ValueError(
            f"the {name} period [{begin}, {end}) holds no complete window (a window needs "
            f"history steps before it and {horizon} horizon steps inside it with an observed "
            "target); widen that period (validation_fraction/test_fraction, or "
            f"validation_start/test_start) or shorten history/horizon{filled}"
        )


def _filled_windows_hint(count: int, observable: int, scoring: bool) -> str:
    """The end of `_check_windows`' message when `count` windows were left out for a filled target.

    Empty when there were none. `observable`: how many of them have an
    observed target at some forecast step; only those would train or score
    if kept, so the option that keeps them (`require_observed_target`, named
    as the caller sets it: `keep_option_named`) is named only when there are
    some. `scoring`: a fitted model reads the table to score it
    (`Forecaster.evaluate`, `backtest`, `tft-jax evaluate`).
    """
    if count == 0:
        return ""
    filled = (
        f"; its {count} windows all have a filled target step (a row missing from the table "
        "on the freq grid, or an empty target) in their horizon"
    )
    check = "check that freq is the frequency the data is recorded at"
    if observable == 0:
        return (
            f"{filled}, and none an observed one, so there is no observed target to score a "
            f"forecast against or to train on: {check} and that the table holds the period's "
            "targets"
        )
    if scoring:
        return (
            f"{filled}, which has no actual to score a forecast against; {observable} of them "
            f"have observed steps, which {_KEEP_OPTION.get()} scores alone ({check})"
        )
    return (
        f"{filled} and were left out: {check}, or pass {_KEEP_OPTION.get()} to keep the "
        f"{observable} of them with an observed step (their filled steps then left out of the "
        "loss and the scores)"
    )


# The spec fields a fitted preprocessor fixes (the model's inputs and their grid).
_PREPROCESSOR_SPEC_FIELDS = (
    "id_col", "time_col", "target", "static_cols", "known_cols", "observed_cols", "freq",
    "timezone",
)  # fmt: skip


def _check_preprocessor_target(
    preprocessor: Preprocessor, scaler: str | None, target_transform: str | None
) -> None:
    """Raises naming `scaler`/`target_transform` when given other than `preprocessor`'s.

    The preprocessor's target scaler decides both: another value given with it
    would be ignored, and the user would read targets scaled another way than asked.
    """
    fitted = preprocessor.target_scaler
    differ = [
        f"{name}={given!r} (the preprocessor's: {expected!r})"
        for name, given, expected in (
            ("scaler", scaler, fitted.method),
            ("target_transform", target_transform, fitted.target_transform),
        )
        if given is not None and given != expected
    ]
    if differ:
        raise ValueError(
            f"the preprocessor was fitted with another target scaling: {'; '.join(differ)}; "
            "leave them out (None) to use the preprocessor's, or preprocessor=None to fit one "
            "on this table"
        )


def _check_preprocessor_spec(spec: TableSpec, fitted: TableSpec) -> None:
    """Raises naming each field of `spec` that differs from the preprocessor's `fitted` one."""
    differ = []
    for name in _PREPROCESSOR_SPEC_FIELDS:
        given, expected = getattr(spec, name), getattr(fitted, name)
        if name == "freq":
            same = parse_frequency(given) == parse_frequency(expected)
        else:
            same = given == expected
        if not same:
            differ.append(f"{name}={given!r} (the preprocessor's: {expected!r})")
    if differ:
        raise ValueError(
            f"the preprocessor was fitted with another table spec: {'; '.join(differ)}; pass "
            "the spec it was fitted with, or preprocessor=None to fit one on this table"
        )


def _is_count(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and bool(value >= 1)


def _check_options(options: dict[str, Any]) -> None:
    """Raises naming the `prepare_dataset` option that is of the wrong kind."""
    for name in ("train_stride", "eval_stride"):
        if not _is_count(options[name]):
            raise ValueError(f"{name} must be an int >= 1, got {options[name]!r}")
    value = options["min_series_length"]
    if value is not None and not _is_count(value):
        raise ValueError(f"min_series_length must be None or an int >= 1, got {value!r}")
    for name in ("require_observed_target", "window_normalization"):
        if not isinstance(options[name], bool | np.bool_):
            raise TypeError(f"{name} must be a bool, got {options[name]!r}")


def _new_series_cuts(
    scored: str | int | None,
    times: pd.DatetimeIndex,
    periods: dict[str, tuple[pd.Timestamp, pd.Timestamp]],
    freq: str,
) -> tuple[pd.Timestamp, ...]:
    """The `new_series_cuts` of `Preprocessor.transform` for `scored` (see `prepare_dataset`).

    An int counts `freq` steps back from the last time on the grid from the
    first time, as `Forecaster.backtest` places its cutoffs: counted over the
    times some series has, a stretch no series covers was skipped and the cut
    fell before the first cutoff (a new series with target only between the
    two was refused).
    """
    if scored is None:
        return ()
    if isinstance(scored, str):
        return (periods["validation"][0], periods[scored][0])
    grid_times = time_grid(times.min(), times.max(), freq=freq)
    return (grid_times[max(len(grid_times) - int(scored), 0)],)


def _series_without_training_target(
    grid: pd.DataFrame, spec: TableSpec, missing_col: str, cut_validation: pd.Timestamp
) -> list[Any]:
    """The series of `grid` with no observed target before `cut_validation`, in id order.

    Empty when every series lacks one: nothing would be left to train on, and
    the target scaler names the first such series (`TargetScaler.fit`).
    """
    observed = (grid[missing_col].to_numpy() == 0.0) & (
        pd.DatetimeIndex(grid[spec.time_col]) < cut_validation
    )
    has_target = pd.Series(observed).groupby(grid[spec.id_col].to_numpy(), sort=True).any()
    if has_target.all() or not has_target.any():
        return []
    return [plain_value(series) for series in has_target.index[~has_target.to_numpy()]]


def prepare_dataset(
    table: pd.DataFrame | str | os.PathLike,
    *,
    id_col: str,
    time_col: str,
    target: str,
    freq: str,
    history: int,
    horizon: int,
    static_cols: Sequence[str] = (),
    known_cols: Sequence[str] = (),
    observed_cols: Sequence[str] = (),
    timezone: str | None = None,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
    validation_start: Any = None,
    test_start: Any = None,
    scaler: str | None = None,
    train_stride: int = 1,
    eval_stride: int = 1,
    require_observed_target: bool = True,
    preprocessor: Preprocessor | None = None,
    categorical_cols: Sequence[str] = (),
    time_format: str | None = None,
    dayfirst: bool = False,
    encoding: str = "utf-8",
    max_missing_fraction: float = 0.5,
    min_series_length: int | None = None,
    target_transform: str | None = None,
    window_normalization: bool = False,
    scored: str | int | None = None,
) -> PreparedDataset:
    """Validates a long-format table and turns it into TFT windows (see the module docstring).

    Args:
      table: a DataFrame or a CSV path, one row per (series, time).
      id_col, time_col, target, static_cols, known_cols, observed_cols, freq,
        timezone: the column roles and sampling (see `TableSpec`).
      history: T, steps of history per window.
      horizon: H, steps forecast per window.
      validation_fraction, test_fraction: shares of the table's time span
        (earliest to latest timestamp) given to validation and test, at the end.
      validation_start, test_start: explicit cut times instead of the
        fractions (naive ones read in `timezone`, else the time column's zone).
      scaler: target scaler method, one of `scaling.TARGET_SCALERS` (None:
        'standard', or with `preprocessor` its own).
      train_stride, eval_stride: keep every n-th window per series in
        training / in validation and test.
      require_observed_target: leave out windows whose horizon has a filled target
        (False: only those whose every forecast step is filled).
      preprocessor: a fitted `Preprocessor` of this spec to apply instead of
        fitting one on this table's training period: how a trained model is
        evaluated on a new table. The column roles, `freq` and `timezone`
        given must be the ones it was fitted with, as must `scaler` and
        `target_transform` when given. Without `timezone`, aware times are
        read in the fitted table's zone (`zones.in_training_zone`), naive
        cuts too, and a datetime column's own zone is given back.
      categorical_cols: integer-coded inputs to treat as categorical (inputs
        holding text are categorical without being listed).
      time_format, dayfirst: how to read the time column (see `TableSpec`).
      encoding: text encoding of a CSV path.
      max_missing_fraction: refuse a series whose filled target steps exceed
        this share of its grid.
      min_series_length: leave out series shorter than this many steps (and
        always those shorter than `history + horizon`), with a warning. A
        series with no observed target before the validation start (one that
        begins after it) is left out too, with a warning, when fitting: its
        target scaler is fitted on the training period. A fitted model
        forecasts such a series as a new one, scaled on its own history.
      target_transform: 'none' or 'log1p' (before the per-series scaler; None:
        'none', or with `preprocessor` its own).
      window_normalization: also scale each window's target by its own
        history (see `WindowSet.normalized`): for series whose level moves.
        Off here, so that this function gives the windows as the scalers
        alone make them; `DataConfig` (the `Forecaster`, the CLI) turns it on
        by default, and its `prepare_options()` passes its setting.
      scored: with `preprocessor`, the part of the table that will be scored,
        which bounds what the target scaler of a series the preprocessor does
        not know is fitted on (`Preprocessor.transform`), so that it does not
        know the scored steps: a split name ('train', 'validation', 'test')
        fits it on the series' observed target before `validation_start` (as
        the trained series' scalers were fitted on the training period), or,
        when there is none, before the start of that split; an int k before
        the k-th last time of the grid (the first cutoff of a backtest over
        the last k steps). None (the default) fits it on all of the table,
        right for a history forecast from.

    Cells holding a missing-value text ('n/a', 'null', '-', ...) are read as
    missing, and filled target steps are announced with a `UserWarning`
    (`PreparedDataset.missing_report` has the numbers per series), as are
    empty cells of known and observed columns (the real ones forward-filled
    within their series, leading ones back-filled in known columns; the
    categorical ones coded unknown, the code unseen values share, unless
    `preprocessor` was saved when they were filled; counted per column).
    Target and observed cells before a series' first value are never
    back-filled (that copies the target of a window's horizon into its
    history): they enter the model as 0, the scaler's location, flagged.

    Returns:
      The `PreparedDataset`.

    Raises:
      ValueError: for a bad table (see `validate_table`), bad cuts, no series
        with a training target, a period without any window, a bad `scored`,
        or, with `preprocessor`, a spec other than its own (column roles,
        `freq`, `timezone`), times naive where the training ones were
        aware or the reverse, or a new series with no observed target before
        the cut `scored` sets.
    """
    spec = TableSpec(
        id_col=id_col,
        time_col=time_col,
        target=target,
        static_cols=tuple(static_cols),
        known_cols=tuple(known_cols),
        observed_cols=tuple(observed_cols),
        freq=freq,
        timezone=timezone,
        categorical_cols=tuple(categorical_cols),
        time_format=time_format,
        dayfirst=dayfirst,
    )
    _check_options(
        {
            "train_stride": train_stride,
            "eval_stride": eval_stride,
            "min_series_length": min_series_length,
            "require_observed_target": require_observed_target,
            "window_normalization": window_normalization,
        }
    )
    if preprocessor is not None:
        _check_preprocessor_spec(spec, preprocessor.spec)
        _check_preprocessor_target(preprocessor, scaler, target_transform)
    check_missing_fraction_limit(max_missing_fraction)
    if scored is not None and scored not in SPLITS and not _is_count(scored):
        raise ValueError(f"scored must be None, one of {SPLITS} or an int >= 1, got {scored!r}")
    missing_col = missing_column(spec)
    calendar_names = calendar_feature_names(freq)
    generated = {missing_col, TIME_INDEX, "series_code", *calendar_names}
    clash = generated.intersection(spec.columns)
    if clash:
        raise ValueError(
            f"column names {sorted(clash)} are reserved for generated inputs; rename them"
        )
    # A fitted table is read as at fit: its spec names the categorical columns
    # inferred then, whose texts ('NA', 'none') are categories, not empty cells, and
    # a CSV's ids and categories fitted as text ('007') stay text.
    read_spec = preprocessor.spec if preprocessor is not None else spec
    fitted_values = preprocessor.fitted_values if preprocessor is not None else None
    raw, texts = read_announced(table, read_spec, encoding, fitted_values)
    raw = ids_as_categories(raw, read_spec.id_col)
    spec = preprocessor.spec if preprocessor is not None else infer_categorical(raw, spec)
    if min_series_length is not None and min_series_length > history + horizon:
        minimum, reason = min_series_length, f"min_series_length={min_series_length}"
    else:
        minimum, reason = None, None  # what a window needs: history + horizon
    # A fitted model reads aware times in its training zone, so that the same
    # instants given in another zone (UTC) land on its grid (`zones`).
    reading = (
        spec
        if preprocessor is None
        else in_training_zone(spec, preprocessor, raw.get(spec.time_col))
    )
    # A fit leaves the empty cells of categorical inputs empty (coded unknown); a fitted
    # model reads a table as its run did (runs saved by 0.2.0.dev2 and earlier filled them).
    fills = preprocessor is not None and preprocessor.fills_empty_categoricals
    try:
        clean = validate_table(
            raw, reading, history, horizon, min_length=minimum, drop_short=True, reason=reason,
            fitted=preprocessor is not None, fill_categoricals=fills,
        )  # fmt: skip
    except MissingColumnsError as error:
        if preprocessor is None:
            raise
        raise error.for_fitted_model(raw.columns) from None
    if preprocessor is not None:
        preprocessor.check_time_zone(clean[spec.time_col])
    empty_inputs = empty_input_cells(clean, spec)
    grid = to_regular_grid(clean, spec, missing_col, fill_categoricals=fills)
    check_density(clean, grid, spec)
    if preprocessor is None:
        check_missing_fraction(grid, spec, missing_col, max_missing_fraction)
    times = pd.DatetimeIndex(grid[spec.time_col])
    end = step_after(times.max(), freq)

    if validation_start is None and test_start is None:
        cut_validation, cut_test = split_times(times, end, validation_fraction, test_fraction)
    elif validation_start is None or test_start is None:
        raise ValueError("pass both validation_start and test_start, or neither (use fractions)")
    else:
        cut_validation = _to_timestamp(validation_start, "validation_start", times.tz, spec)
        cut_test = _to_timestamp(test_start, "test_start", times.tz, spec)
    fitted = preprocessor is not None
    if fitted and not cut_validation <= cut_test:
        raise ValueError(
            f"cuts must satisfy validation_start {cut_validation} <= test_start {cut_test}"
        )
    # A fitted model's table may begin after the validation start or end before
    # the test start: its periods are clipped to it, and only the period scored
    # must hold windows (`_check_windows` below).
    if not fitted and not times.min() < cut_validation <= cut_test <= end:
        raise ValueError(
            f"cuts must satisfy first time {times.min()} < validation_start {cut_validation} "
            f"<= test_start {cut_test} <= the end of the data {end} (last time + one step)"
        )
    if preprocessor is None:
        late = _series_without_training_target(grid, spec, missing_col, cut_validation)
        if late:
            keep = ~grid[spec.id_col].isin(late).to_numpy()
            grid = grid[keep].reset_index(drop=True)
            clean = clean[~clean[spec.id_col].isin(late)].reset_index(drop=True)
            empty_inputs = empty_input_cells(clean, spec)
            warnings.warn(
                f"left out {len(late)} of {len(late) + clean[spec.id_col].nunique()} series "
                f"with no observed target before validation_start {cut_validation} (the "
                f"training period, which a series' target scaler is fitted on): "
                f"{first_few([repr(series) for series in late])}; a fitted model forecasts them "
                "as new series, scaled on their own history",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        preprocessor = Preprocessor.fit(
            grid,
            spec,
            cut_validation,
            "standard" if scaler is None else scaler,
            "none" if target_transform is None else target_transform,
            fills_empty_categoricals=fills,
        )
    periods = {
        "train": (times.min(), cut_validation),
        "validation": (cut_validation, cut_test),
        "test": (cut_test, end),
    }
    transformed = preprocessor.transform(
        grid,
        _new_series_cuts(scored, times, periods, freq),
        RowSources(table_name("the table", table)),
    )
    panel = transformed.panel
    strides = {"train": train_stride, "validation": eval_stride, "test": eval_stride}
    windows = _windows(panel, history, horizon, periods, strides, require_observed_target)
    windows = {
        name: dataclasses.replace(window_set, normalized=bool(window_normalization))
        for name, window_set in windows.items()
    }
    if validation_start is None:
        wanted = {"validation": validation_fraction > 0, "test": test_fraction > 0}
    else:
        wanted = {name: begin < end for name, (begin, end) in periods.items()}
    if fitted:  # a fitted model reads the table: only what is scored needs windows
        required = {name: name == scored for name in periods} if scored else wanted
        how = (
            f"validation_fraction={validation_fraction}, test_fraction={test_fraction}"
            if validation_start is None
            else f"validation_start={cut_validation}, test_start={cut_test}"
        )
        required = {**required, "train": scored == "train"}
        _check_windows(windows, periods, horizon, required, require_observed_target, how)
    else:
        _check_windows(
            windows, periods, horizon, {**wanted, "train": True}, require_observed_target
        )

    dataset = PreparedDataset(
        spec=spec,
        history=history,
        horizon=horizon,
        series_ids=transformed.series_ids,
        static_feature_names=preprocessor.static_feature_names,
        static_categorical_names=preprocessor.static_categorical_names,
        static_categorical_cardinalities=preprocessor.static_categorical_cardinalities,
        known_feature_names=preprocessor.known_feature_names,
        observed_feature_names=preprocessor.observed_feature_names,
        target_scaler=transformed.target_scaler,
        feature_scaler=preprocessor.feature_scaler,
        validation_start=cut_validation,
        test_start=cut_test,
        train=windows["train"],
        validation=windows["validation"],
        test=windows["test"],
        frame=transformed.frame,
        preprocessor=preprocessor,
        missing_texts=texts,
        require_observed_target=bool(require_observed_target),
        scored=scored,
    )
    zone_back = zone_to_give_back(spec, reading, raw[spec.time_col])
    if zone_back is not None:
        dataset = _dataset_in_zone(dataset, zone_back)
    announce_empty_inputs(
        empty_inputs, clean[spec.id_col].nunique(), coded=() if fills else spec.categorical_cols
    )
    filled = grid.groupby(spec.id_col, sort=True)[missing_col].sum()
    if filled.sum():
        report = first_few([f"{series!r} {int(n)}" for series, n in filled[filled > 0].items()])
        counts = dataset.missing_report()
        if require_observed_target:  # each filled step leaves out up to H windows: counted
            left = int(counts["windows_left_out"].sum())
            keepable = dataset._windows_kept_with_masks()
            kept = (
                f"{_KEEP_OPTION.get()} keeps the {keepable} of them with an observed step, "
                "leaving the filled steps out of the loss and the scores"
                if keepable
                else "none has an observed step"
            )
            horizons = f"the {left} windows whose horizon holds one are left out ({kept})"
        else:
            horizons = (
                f"the {int(counts['windows_masked'].sum())} windows whose horizon holds one are "
                f"kept, their {int(counts['masked_steps'].sum())} filled forecast steps masked "
                "(target_mask 0: left out of the loss and the scores)"
            )
            blank = int(counts["windows_left_out"].sum())
            if blank:
                horizons += (
                    f", and the {blank} windows whose every forecast step is one are left out "
                    "(nothing to train on or score)"
                )
        flagged = (
            "flagged as missing to the model"
            if dataset.preprocessor.missing_flag
            else "the model has no missing flag and reads them as observed"
        )
        recorded = recorded_frequency_hint(clean, spec, filled[filled > 0].index)
        warnings.warn(
            f"filled {int(filled.sum())} missing target steps (forward fill, those before a "
            f"series' first observed target its scaler's location; {flagged}) in "
            f"{int((filled > 0).sum())} of {len(filled)} series: {report}; {horizons} "
            f"(PreparedDataset.missing_report()){recorded}",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    return dataset
