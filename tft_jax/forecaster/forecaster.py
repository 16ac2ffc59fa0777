"""`Forecaster`: fit, evaluate, backtest, save, load and forecast the future of a long table.

The one pipeline that the CLI, the demo and the README use (as
neuralforecast's `NeuralForecast` owns fit/predict/save/load there): data
preparation (`tft_jax.data`), the model (`TemporalFusionTransformer`),
training (`tft_jax.train`), quantization (`qat`) and evaluation
(`tft_jax.evaluation`) stay separate; this class only wires them.

Quantile forecasts are returned in increasing order at every step (sorted
across levels): a sorted set of quantiles never has a larger total pinball
loss than the unsorted one (rearrangement, Chernozhukov et al. 2010), and
crossing quantiles are not a forecast anyone can use.
"""

from __future__ import annotations

import codecs
import contextlib
import copy
import dataclasses
import json
import numbers
import os
import pathlib
import shutil
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias

import jax
import numpy as np
import pandas as pd

import qat
from tft_jax.baselines import candidate_periods, seasonal_period
from tft_jax.caller_frame import user_stacklevel
from tft_jax.checkpoint import TrainingCheckpointer
from tft_jax.checkpoint import digest as tree_digest
from tft_jax.config import TFTConfig
from tft_jax.data import PreparedDataset, WindowSet, prepare_dataset, window_starts
from tft_jax.data.dataset import SPLITS, keep_option_named
from tft_jax.data.future import future_windows
from tft_jax.data.listing import first_few
from tft_jax.data.preprocessing import NewSeriesWithoutTargetError, Preprocessor
from tft_jax.data.tables import (
    TableContentError,
    parse_frequency,
    plain_value,
    step_after,
    time_grid,
)
from tft_jax.data.windows import filled_history_steps
from tft_jax.distributed import (
    barrier,
    check_local_devices_agree,
    check_settings_agree,
    is_primary,
    local_rows,
)
from tft_jax.evaluation import (
    Predictions,
    actuals,
    baseline_metrics,
    best_of,
    comparisons,
    mean_quantile_loss,
    monotone,
    observed_steps,
    predict_windows,
    seasonal_naive_forecast,
    to_original_units,
    window_scorer,
)
from tft_jax.folder_lock import folder_locked
from tft_jax.forecaster import run_folder
from tft_jax.forecaster.config import (
    SECTIONS,
    DataConfig,
    ForecasterConfig,
    ModelConfig,
    QATTrainingConfig,
    TrainingConfig,
    another_class_hint,
    quantile_name,
)
from tft_jax.forecaster.interpretation import interpretation_tables
from tft_jax.forecaster.negative_forecasts import (
    NegativeForecasts,
    announce_negative_forecasts,
    count_negative,
    forecast_place,
)
from tft_jax.forecaster.predictors import MODEL_NAMES, Predictor, make_predictor, qat_model_for
from tft_jax.forecaster.process_agreement import fit_settings
from tft_jax.forecaster.training import announce, train_fp32, train_qat, validation_batches
from tft_jax.losses import ZeroTargetError
from tft_jax.model import TemporalFusionTransformer
from tft_jax.paths import expanded

Table: TypeAlias = pd.DataFrame | str | os.PathLike


def _check_zero_target_cutoffs(cutoffs: list[pd.Timestamp], count: int, horizon: int) -> None:
    """Warns of `backtest` cutoffs whose targets are all zero; raises when all `count` are.

    q-risk divides by the sum of the targets' absolute values, so it is
    undefined at such a cutoff: its rows say NaN rather than the whole
    backtest failing for one cutoff, unless no cutoff can be scored.
    """
    if not cutoffs:
        return
    listed = ", ".join(str(cutoff) for cutoff in cutoffs)
    if len(cutoffs) == count:
        raise TableContentError(
            f"backtest: every target over the {horizon} steps after each cutoff ({listed}) is "
            "zero, so q-risk is undefined at all of them; choose other cutoffs with n_windows "
            "and step"
        )
    warnings.warn(
        f"backtest: every target over the {horizon} steps after the cutoff(s) {listed} is "
        "zero, so q-risk is undefined there: their p50_q_risk and p90_q_risk are NaN (the "
        "mean_quantile_loss is scored; best_baseline, chosen by q-risk, is NaN)",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def check_global_batch(
    batch_size: int, devices: int | None = None, processes: int | None = None
) -> None:
    """Raises unless the global batch splits evenly over every device of every process.

    `devices` and `processes` default to what JAX sees.
    """
    devices = jax.device_count() if devices is None else devices
    processes = jax.process_count() if processes is None else processes
    if batch_size % devices:
        where = f" of {processes} processes" if processes > 1 else ""
        raise ValueError(
            f"TrainingConfig.batch_size ({batch_size}) is the global batch and must be divisible "
            f"by the {devices} devices{where}; use a multiple of {devices}"
        )


@dataclasses.dataclass
class _Fitted:
    """What fitting learned: the preprocessing, the model config and the trained variables."""

    preprocessor: Preprocessor
    tft_config: TFTConfig
    season_period: int
    variables: dict[str, Any]
    history: dict[str, Any]
    summary: dict[str, Any]
    # `run_folder.versions()` where the model was trained (kept through save and load);
    # None for a folder whose config.json holds none.
    versions: dict[str, Any] | None = None
    # The settings it was fitted (or loaded) with, as `_settings_record` writes them.
    settings: dict[str, Any] | None = None


# `qat.QATConfig` fields that configure stand-alone observers only: the QAT TFT's layout
# is fixed (weights per-channel symmetric, activations per-tensor affine, moving average).
QAT_LAYOUT_FIELDS = ("symmetric", "per_channel", "channel_axis", "observer")

BATCH_STREAM_FILE = run_folder.BATCH_STREAM_FILE

# The settings a resume may change: how long training goes on (a finished or budgeted run
# extended, as `tft_jax.train.fit` allows; a patience for a run cut short), and what is
# read only after training (the prediction batch, the seasonal naive baseline, clipping
# forecasts at 0). Every other field changes what is trained or the data it sees, and a
# resume with it is refused.
RESUMABLE_FIELDS = {
    "data": ("season_period", "nonnegative"),
    "model": (),
    "training": ("epochs", "max_steps", "time_budget", "patience", "eval_batch_size"),
    "qat": ("steps", "time_budget"),
}


# The settings a fitted forecaster may change before it forecasts, evaluates or saves: those
# a resume may change, and how it reads and screens new tables. Every other one made the
# model it holds (its windows, scale, size, levels or integer bits): a forecast with
# another value read the model's inputs otherwise without a word (another window
# normalization moved forecasts by 10%), and `save` wrote a folder that `load` refuses.
# `require_observed_target` chooses the training windows, so a resume may not change it
# (the run would go on over other windows), but it changes nothing the model reads: for
# a fitted model it only chooses which windows of a table `evaluate` and `backtest` score
# (with False, also those whose horizon holds a filled target, on their observed steps),
# as `max_missing_fraction` screens them. What the model was trained with stays in
# `summary['dataset']`.
FITTED_USE_FIELDS = {
    **RESUMABLE_FIELDS,
    "data": (
        *RESUMABLE_FIELDS["data"],
        "encoding",
        "dayfirst",
        "time_format",
        "max_missing_fraction",
        "min_series_length",
        "require_observed_target",
    ),
}

# How the `Forecaster`'s user keeps the windows whose horizon holds a filled target, as the
# data layer's messages name it for it (`keep_option_named`).
KEEP_FILLED_SETTING = "DataConfig.require_observed_target=False"


def _prepared(table: Table, **options: Any) -> PreparedDataset:
    """`prepare_dataset(table, **options)`, whose errors and warnings name the setting that
    keeps windows with a filled target as the `Forecaster`'s user sets it (`DataConfig`)."""
    with keep_option_named(KEEP_FILLED_SETTING):
        return prepare_dataset(table, **options)


def _settings_record(settings: ForecasterConfig) -> dict[str, Any]:
    """`settings.to_json()` as it reads back from JSON (tuples as lists)."""
    return json.loads(json.dumps(run_folder.json_ready(settings.to_json())))


def _changed_settings(
    written: dict[str, Any],
    settings: ForecasterConfig,
    free: dict[str, tuple[str, ...]] = RESUMABLE_FIELDS,
    qat_may_be_added: bool = True,
) -> list[str]:
    """`'Section.field OLD then, NEW now'` for each field a resume may not change (fields
    outside `free`, by section).

    A field missing from `written` (recorded before the field existed) counts
    as its default. The QAT section may be added where `qat_may_be_added`
    (a resume: the QAT phase has not started when the recorded run had none;
    not a fitted model, which has no QAT form to go with it), never removed.
    """
    current = _settings_record(settings)
    changed = []
    if written.get("qat") is not None and current.get("qat") is None:
        changed.append("ForecasterConfig.qat QAT settings then, None now")
    if not qat_may_be_added and written.get("qat") is None and current.get("qat") is not None:
        changed.append("ForecasterConfig.qat None then, QAT settings now")
    for section, kind in SECTIONS.items():
        old, new = written.get(section), current.get(section)
        if old is None or new is None:
            continue
        for field in dataclasses.fields(kind):
            if field.name in free[section]:
                continue
            then, now = old.get(field.name, _settings_record_value(field.default)), new[field.name]
            if not _same_setting(field.name, then, now):
                changed.append(
                    f"{kind.__name__}.{field.name} {_shown(then)} then, {_shown(now)} now"
                )
    return changed


def _same_setting(name: str, then: Any, now: Any) -> bool:
    """Whether two recorded values of the field `name` mean the same ('D' and '1D',
    '2024-03-01' and '2024-03-01 00:00:00', 'utf-8' and 'UTF8', 'UTC' and 'utc')."""
    if then == now:
        return True
    if name == "encoding":  # None: UTF-8, as `DataConfig` reads it (records written before)
        then, now = then or "utf-8", now or "utf-8"
    if not isinstance(then, str) or not isinstance(now, str):
        return False
    spelled: dict[str, Callable[[str], Any]] = {
        "freq": pd.tseries.frequencies.to_offset,
        "validation_start": pd.Timestamp,
        "test_start": pd.Timestamp,
        "encoding": lambda value: codecs.lookup(value).name,
        "timezone": str.lower,  # IANA names differ by more than case
    }
    meaning = spelled.get(name)
    if meaning is None:
        return False
    try:
        return bool(meaning(then) == meaning(now))
    except (ValueError, TypeError, LookupError):  # a spelling that means nothing: differs
        return False


def _settings_record_value(value: Any) -> Any:
    """A field default as it reads back from JSON; MISSING stays (it equals no value)."""
    if value is dataclasses.MISSING:
        return value
    return json.loads(json.dumps(run_folder.json_ready(value)))


def _shown(value: Any) -> str:
    """A recorded value as the message shows it: lists as tuples, like the config."""
    if value is dataclasses.MISSING:
        return "(not recorded)"
    return repr(tuple(value)) if isinstance(value, list) else repr(value)


# The key of the training windows' digest (`WindowSet.digest`) in the batch-stream record.
DIGEST_KEY = "train_windows_sha256"


def _check_batch_stream(
    checkpoints: pathlib.Path,
    resume: bool,
    batch_size: int,
    dataset: PreparedDataset,
    settings: ForecasterConfig | None = None,
) -> None:
    """Refuses to resume checkpoints written with other settings or other training windows.

    A checkpoint records how many batches of its epoch were drawn, not how
    they were made: resumed with another `batch_size` (or a table giving
    another number of training windows) the run would read other windows
    than the one it continues, without a word. Windows of other values, as
    many, are announced (their digest, `DIGEST_KEY`). With `settings` (as
    `Forecaster.fit` passes them) the record also holds every setting, and a
    resume that changes one outside `RESUMABLE_FIELDS` (a learning rate, a
    hidden size, quantiles, history, columns, scaler, seed...) is refused naming each
    `Section.field` with its old and new value: it would mix another run into
    the one it continues, or stop deep in orbax on a shape. Raising `epochs`,
    `max_steps`, a `time_budget` or QAT `steps` extends a run (as `patience`
    may, for a run cut short before it stopped early), and
    `eval_batch_size`, `season_period` and `nonnegative` are read only after
    training: those may change, and the record then holds the new values.

    A fresh run, or a resume over a record without a saved step (nothing to
    go on from), records its stream and settings (process 0), except over an
    earlier run's checkpoints: training refuses to start over them, and their
    record must survive for the resume that follows. Checkpoints written
    before the settings were recorded resume with a warning that they cannot
    be checked (and unchecked altogether without a record).
    """
    path = checkpoints / BATCH_STREAM_FILE
    stream: dict[str, Any] = {"batch_size": int(batch_size), "train_windows": len(dataset.train)}
    # Another table's windows, as many: their values tell. Announced, not refused: the values
    # are computed (scaled, calendar features), and another machine's or library version's
    # last bit would tell the same table apart. A record without it resumes unchecked.
    digest = dataset.train.digest()
    # A record without a saved step (a run killed before its first checkpoint) binds
    # nothing: the resume starts from step 0, and the record is written anew.
    holds = _holds_checkpoints(checkpoints)  # opens each phase's checkpoints: once
    if resume and holds and path.is_file():
        written = run_folder.read_json(path)
        if settings is not None:
            if not isinstance(written.get("settings"), dict):
                warnings.warn(
                    f"resume: {path} was written before runs recorded their settings; the "
                    "settings of this resume cannot be checked against those the checkpoints "
                    "were trained with",
                    stacklevel=user_stacklevel(),
                )
            elif changed := _changed_settings(written["settings"], settings):
                raise ValueError(
                    f"resume: the checkpoints in {checkpoints} were trained with other "
                    f"settings ({'; '.join(changed)}); resume with the settings they were "
                    "written with, or start over"
                )
        differ = [
            f"{key} {written.get(key)} then, {value} now"
            for key, value in stream.items()
            if written.get(key) != value
        ]
        if not differ and written.get(DIGEST_KEY, digest) != digest:
            warnings.warn(
                f"resume: the training windows hold other values than those the checkpoints in "
                f"{checkpoints} were trained on ({DIGEST_KEY} {written[DIGEST_KEY]} then, "
                f"{digest} now): another table with as many windows, or the same one read on "
                "another machine or library version; the run goes on with this table's",
                stacklevel=user_stacklevel(),
            )
        if differ:
            raise ValueError(
                f"resume: the checkpoints in {checkpoints} were trained on another stream of "
                f"batches ({'; '.join(differ)}); resume with the batch size and table they "
                "were written with, or start over"
            )
        if settings is not None and "settings" in written and is_primary():
            # The fields a resume may change (a raised max_steps, QAT added) are kept.
            run_folder.write_json(path, {**written, "settings": _settings_record(settings)})
        return
    if settings is not None and resume and is_primary() and holds:
        warnings.warn(
            f"resume: {checkpoints} holds no {BATCH_STREAM_FILE} (written before runs "
            "recorded their settings); the settings and batch size of this resume cannot be "
            "checked against those the checkpoints were trained with",
            stacklevel=user_stacklevel(),
        )
        return
    if is_primary() and not holds:
        stream[DIGEST_KEY] = digest
        if settings is not None:
            stream["settings"] = _settings_record(settings)
        run_folder.write_json(path, stream)


def _holds_checkpoints(checkpoints: pathlib.Path) -> bool:
    """Whether a training phase's folder under `checkpoints` holds a saved step."""
    return any(_phase_holds_checkpoints(checkpoints / phase) for phase in ("fp32", "qat"))


def _phase_holds_checkpoints(folder: pathlib.Path) -> bool:
    """Whether the checkpoint folder of one training phase holds a saved step."""
    if not folder.is_dir():
        return False
    with TrainingCheckpointer(folder, create=False) as checkpointer:
        return bool(checkpointer.steps() or checkpointer.steps("best"))


def _newest_step(folder: pathlib.Path) -> int:
    """The newest latest step saved in a phase's checkpoint folder (a resume's start), or 0."""
    if not folder.is_dir():
        return 0
    with TrainingCheckpointer(folder, create=False) as checkpointer:
        return max(checkpointer.steps(), default=0)


# The record, next to the QAT checkpoints, of the FP32 model they were fine-tuned from:
# its step and the digest of its variables (`tft_jax.checkpoint.digest`, over their
# layout and bytes). A finished FP32 phase resumed gives back its best checkpoint's bytes,
# on any machine, so the digest tells whether QAT would start from the same model.
QAT_SOURCE_FILE = "fp32_source.json"
FP32_DIGEST_KEY = "fp32_variables_sha256"


def _check_qat_source(
    checkpoints: pathlib.Path,
    resume: bool,
    fp32_variables: dict[str, Any],
    fp32_steps: int,
    resumed_from: int,
    quiet: bool,
) -> None:
    """Replaces QAT checkpoints fine-tuned from another FP32 model than `fp32_variables`.

    QAT fine-tunes the best FP32 variables; resumed, its checkpoints go on
    from their own state, whatever FP32 model this run hands it. When the
    FP32 phase trained on (a raised `max_steps`, `epochs` or time budget) to
    a new best state, those checkpoints hold a fine-tuning of the earlier FP32
    model: the QAT and int8 models would come out as before, stale. So the QAT
    checkpoints record the FP32 model they started from (`QAT_SOURCE_FILE`:
    its step `fp32_steps` and `FP32_DIGEST_KEY`), and a resume whose FP32
    model differs deletes them, with a warning, and QAT starts again from
    step 0 (calibration, schedule and all) from this FP32 model. One that
    trained on without a lower validation loss keeps its best state, and the
    QAT checkpoints go on. QAT checkpoints written before the record are
    replaced when the FP32 phase trained in this call (from `resumed_from`
    to `fp32_steps`), and kept otherwise.

    The record is written (process 0) whenever QAT starts without a saved
    step, except without `resume`: `fit` then refuses a folder holding an
    earlier run's checkpoints, and their record stays.
    """
    folder = checkpoints / "qat"
    path = folder / QAT_SOURCE_FILE
    source = {"fp32_steps_trained": int(fp32_steps), FP32_DIGEST_KEY: tree_digest(fp32_variables)}
    held = _phase_holds_checkpoints(folder)
    written = None
    if resume and held and path.is_file():
        try:
            written = run_folder.read_json(path)
        except run_folder.RunFolderError:  # damaged: as if unrecorded
            written = None
        if not isinstance(written, dict) or FP32_DIGEST_KEY not in written:
            written = None
    # Every process has read the record before process 0 replaces it.
    barrier("tft-jax qat source read")
    if held and not resume:
        return  # `fit` refuses to start over an earlier run's checkpoints
    reason = None
    if held and written is not None:
        then = written.get("fp32_steps_trained")
        if written[FP32_DIGEST_KEY] == source[FP32_DIGEST_KEY]:
            if then == fp32_steps:
                return
            # Recorded at this step below, so that a later resume does not say it again.
            if then is not None:
                announce(
                    quiet,
                    f"QAT: the FP32 model trained on from step {then} to {fp32_steps} without "
                    "a lower validation loss: its best state is the one the QAT checkpoints "
                    "were fine-tuned from, and QAT goes on from them",
                )
        elif then is not None and then != fp32_steps:
            reason = f"the FP32 model trained on from step {then} to {fp32_steps}"
        else:
            reason = (
                f"the FP32 model (step {fp32_steps}) is not the one the QAT checkpoints in "
                f"{folder} were fine-tuned from ({FP32_DIGEST_KEY} "
                f"{written[FP32_DIGEST_KEY]} then, {source[FP32_DIGEST_KEY]} now)"
            )
    elif held:
        if fp32_steps <= resumed_from:
            return  # the FP32 model they were fine-tuned from, as far as can be told
        reason = (
            f"the FP32 model trained on from step {resumed_from} to {fp32_steps}, and the QAT "
            f"checkpoints in {folder} do not record which FP32 model they were fine-tuned "
            f"from (written before runs recorded it, in {QAT_SOURCE_FILE})"
        )
    if is_primary():
        if reason is not None:
            # A repair of the user's run: a warning, shown even when quiet.
            warnings.warn(
                f"resume: {reason}: QAT starts again from it; its checkpoints of the earlier "
                f"FP32 model in {folder} are replaced",
                stacklevel=user_stacklevel(),
            )
            # Renamed first: a run killed while deleting leaves no half of a folder behind.
            aside = folder.with_name(run_folder.REPLACED_QAT_FOLDER)
            if aside.exists():
                shutil.rmtree(aside)
            folder.rename(aside)
            shutil.rmtree(aside)
        run_folder.write_json(path, source)
    barrier("tft-jax qat source written")


def _scored_steps(dataset: PreparedDataset, windows: WindowSet) -> np.ndarray | None:
    """The `(N, H)` mask of the forecast steps of `windows` to score (`observed_steps`) when
    `dataset` keeps windows whose horizon holds a filled target (prepared with
    `require_observed_target=False`); None otherwise, where every step has an observed
    target (`actuals` refuses one without)."""
    return None if dataset.require_observed_target else observed_steps(windows)


def _split_windows(dataset: PreparedDataset, split: str, where: str) -> WindowSet:
    """The windows of `split`; `TableContentError` naming `where` when it holds none."""
    windows = dataset.split(split)
    if not len(windows):
        raise TableContentError(
            f"{where}: the {split} split of the table holds no complete window "
            f"({dataset.history} steps of history and {dataset.horizon} steps with an "
            f"observed target); split={split!r} needs a nonzero DataConfig "
            "validation_fraction/test_fraction (or validation_start/test_start) leaving "
            "room for a window"
        )
    return windows


def _common_grid(dataset: PreparedDataset, freq: str, zone: str | None) -> pd.DatetimeIndex:
    """The times of `freq` from the first to the last time of `dataset`: the backtest's steps.

    Aware times are stepped in `zone`, the training table's (a day there is
    23 or 25 hours of UTC across a daylight-saving change), and the grid is
    given in the dataset's own zone.

    Steps are counted on this grid, not over the times some series has: with
    no series over a stretch of it, those would skip the stretch and put
    cutoffs further than `step` steps apart. A series whose times lie off it
    (recorded at another offset, e.g. every day at noon where the others are
    at midnight) never has a cutoff in common with the others, and would
    double the count of times: refused naming it.
    """
    panel = dataset.panel
    times = pd.DatetimeIndex(panel.times)
    local = times if times.tz is None or zone is None else times.tz_convert(zone)
    grid = time_grid(local.min(), local.max(), freq=freq)
    if times.tz is not None:
        grid = grid.tz_convert(times.tz)
    off = ~times.isin(grid)
    if off.any():
        row = int(np.flatnonzero(off)[0])
        series = dataset.series_ids[int(panel.series_code[row])]
        raise ValueError(
            f"backtest: series {series!r} is recorded at {times[row]}, off the freq={freq!r} "
            f"grid from {grid[0]} that the other series' times lie on "
            f"({int(off.sum())} times off it); cutoffs are times common to the series, so "
            "backtest series recorded at other offsets separately"
        )
    return grid


def _check_finite_interpretation(tables: dict[str, pd.DataFrame], model: str, split: str) -> None:
    """Raises when a weight in `tables` is NaN or inf, naming the table and the variable.

    A diverged model (NaN parameters) gave tables of NaN weights without a
    word, where `evaluate` and `predict` refuse its non-finite forecasts.
    """
    for group in ("static", "history", "future"):
        weights = tables[group]["weight"].to_numpy()
        bad = ~np.isfinite(weights)
        if bad.any():
            first = tables[group]["variable"].iloc[int(np.flatnonzero(bad)[0])]
            raise ValueError(
                f"interpretation: the {model} model's {group} selection weights on the {split} "
                f"split are not finite ({int(bad.sum())} of {bad.size}, the first {first!r}: "
                f"{weights[bad][0]}); its parameters or inputs are not finite (a diverged "
                "training run?)"
            )
    attention = tables["attention"].to_numpy()
    bad = ~np.isfinite(attention)
    if bad.any():
        step, position = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"interpretation: the {model} model's attention on the {split} split is not "
            f"finite ({int(bad.sum())} of {bad.size} weights, the first at horizon {step + 1}, "
            f"position {int(tables['attention'].columns[position])}); its parameters or "
            "inputs are not finite (a diverged training run?)"
        )


def _announce_negative_targets(frame: pd.DataFrame, spec: Any, nonnegative: bool) -> None:
    """Warns when `DataConfig.nonnegative` will clip the forecasts of a table with negative targets.

    The clip is for quantities that cannot be negative; negative targets say
    the data are not such a quantity (or hold an error), and the forecasts of
    their series would come back as 0 without a word.
    """
    if not nonnegative:
        return
    negative = (frame[spec.target] < 0).to_numpy()
    if not negative.any():
        return
    rows = frame.loc[negative]
    first = rows.iloc[0]
    warnings.warn(
        f"DataConfig.nonnegative=True clips forecasts at 0, but the table holds "
        f"{int(negative.sum())} negative targets in {rows[spec.id_col].nunique()} series (e.g. "
        f"series {plain_value(first[spec.id_col])!r}: {first[spec.target]} at "
        f"{first[spec.time_col]}): their "
        "forecasts are clipped, and scored against negative actuals; set nonnegative=False "
        "for a quantity that can be negative",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def _check_new_series_scaled_for(dataset: PreparedDataset, scored: str | None) -> None:
    """Raises unless the scalers of `dataset`'s new series were fitted without `scored`'s targets.

    A series the model never saw is scaled by its own target before the
    scored period (`prepare_dataset`'s `scored`). A dataset prepared for
    another split (or for none) may have scaled it by the very targets
    scored now: that leaked them into the inputs, without a word.
    """
    new = dataset.new_series
    if scored is None or dataset.scored == scored or not new:
        return
    shown = ", ".join(repr(series) for series in new[:3]) + (" ..." if len(new) > 3 else "")
    raise ValueError(
        f"the PreparedDataset was prepared with scored={dataset.scored!r}, but the {scored} "
        f"split is scored: the scalers of its {len(new)} new series ({shown}) may know that "
        f"split's targets; pass the table, or prepare it with Forecaster.prepare(table, "
        f"{scored!r})"
    )


def _model_test_start(summary: dict[str, Any]) -> pd.Timestamp | None:
    """The first time of the model's test period as `fit` recorded it; None where unrecorded.

    `PreparedDataset.summary` records it as text under `summary['dataset']`,
    which survives save and load. A run folder written before it was
    recorded has none (nor has a summary edited without it): then nothing
    is checked against it.
    """
    recorded = summary.get("dataset")
    text = recorded.get("test_start") if isinstance(recorded, dict) else None
    if not isinstance(text, str):
        return None
    try:
        stamp = pd.Timestamp(text)
    except (ValueError, TypeError, OverflowError):
        return None
    return None if pd.isna(stamp) else stamp


def _in_sample_windows(
    dataset: PreparedDataset, starts: np.ndarray, test_start: pd.Timestamp
) -> np.ndarray:
    """(N,) bool: the windows at `starts` of a series the model was trained on that forecast a
    time before `test_start`, the model's test start: their targets lie in its training or
    validation period.

    `starts` index each window's first forecast step, its earliest. A new
    series (`dataset.new_series`) is out of sample at any time. Naive times and
    an aware `test_start` (or the other way round) have no instant in common
    to compare: nothing is flagged then (`Preprocessor.check_time_zone`
    refuses such tables before).
    """
    times = dataset.panel.times[starts]
    if (times.tz is None) != (test_start.tz is None):
        return np.zeros(len(starts), dtype=bool)
    new = set(dataset.new_series)
    is_trained = np.array([series not in new for series in dataset.series_ids], dtype=bool)
    return is_trained[dataset.panel.series_code[starts]] & np.asarray(times < test_start)


def _announce_in_sample(
    where: str,
    scope: str,
    in_sample: int,
    scored: int,
    test_start: pd.Timestamp,
    remedy: str,
) -> None:
    """Warns that `in_sample` of the `scored` windows of `scope` are scored on targets the
    model was fitted or selected on (before its test start `test_start`); `remedy` says how not.

    Such scores are in-sample, optimistic about forecasts of data the model
    has not seen. Not refused: an in-sample score can be what is wanted, and
    the numbers are not changed.
    """
    warnings.warn(
        f"{where}: {scope} forecast steps before the model's test start {test_start} for "
        f"series it was trained on: {in_sample} of the {scored} windows scored there forecast "
        "targets of its training or validation period, which it was fitted or selected on, so "
        f"their scores are in-sample (optimistic); {remedy}",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def _announce_in_sample_cutoffs(
    in_sample: dict[pd.Timestamp, int],
    scored_at: dict[pd.Timestamp, int],
    count: int,
    fitting: int,
    step: int,
    test_start: pd.Timestamp,
) -> None:
    """Warns once of the `backtest` cutoffs with windows scored in-sample.

    `in_sample` counts them by cutoff, out of the windows `scored_at` it;
    `fitting` of the `count` cutoffs, `step` steps apart, lie at or after
    the model's test start `test_start`: the n_windows that keeps a backtest
    of this table out of sample.
    """
    keep = (
        f"with step={step}, n_windows={fitting} keeps every cutoff at or after it"
        if fitting
        else f"with step={step}, no cutoff of this table lies at or after it"
    )
    _announce_in_sample(
        "backtest",
        f"{len(in_sample)} of the {count} cutoffs "
        f"({first_few([str(cutoff) for cutoff in in_sample], limit=3)})",
        sum(in_sample.values()),
        sum(scored_at.values()),
        test_start,
        "for out-of-sample scores backtest a table that extends past the training data, or "
        f"use fewer or later cutoffs ({keep})",
    )


def _unscored_series(
    dataset: PreparedDataset, starts: np.ndarray, cutoff: pd.Timestamp, history: int, horizon: int
) -> dict[Any, str]:
    """Why each series of `dataset` without a window among `starts` (those forecasting
    from `cutoff`) is not scored there, by series id: too little data before the cutoff,
    data ending before its horizon does, or a missing target in that horizon (with
    `require_observed_target=False`, every target of it)."""
    panel = dataset.panel
    scored = set(panel.series_code[starts].tolist())
    reasons = {}
    for code, (first, length) in enumerate(
        zip(panel.series_start, panel.series_length, strict=True)
    ):
        if code in scored:
            continue
        times = panel.times[first : first + length]
        before = int(np.searchsorted(times, cutoff))  # its rows before the cutoff
        after = times[before : before + horizon]
        if times[-1] < cutoff:
            reason = f"its data ends at {times[-1]}, before it"
        elif before < history:
            reason = f"{before} of the {history} steps of history before it"
        elif after[0] != cutoff:
            reason = f"it has no row at the cutoff (its next is at {after[0]})"
        elif after.size < horizon:
            reason = f"its data ends at {times[-1]}, within the {horizon} steps from it"
        else:
            mask = panel.target_mask[first + before : first + before + horizon]
            reason = (
                f"its target at {after[int(np.argmin(mask))]} is missing"
                if mask.any()
                else f"its target is missing at all {horizon} steps from it"
            )
        reasons[dataset.series_ids[code]] = reason
    return reasons


def _announce_unscored_series(
    unscored: dict[pd.Timestamp, dict[Any, str]], skipped: list[pd.Timestamp]
) -> None:
    """Warns once naming, by cutoff, the series `backtest` could not score there (their
    reasons), and the cutoffs `skipped`, where it scored none: each cutoff's scores
    average the series scored there, so two cutoffs' scores may describe other series."""
    if not unscored and not skipped:
        return
    parts = []
    for cutoff, reasons in unscored.items():
        named = first_few([f"{series!r} ({reason})" for series, reason in reasons.items()], 3)
        parts.append(f"at {cutoff}: {named}")
    empty = [str(cutoff) for cutoff in skipped]
    none_scored = (
        f"; the cutoffs {first_few(empty, 3)} score no series and have no rows" if empty else ""
    )
    warnings.warn(
        f"backtest: not every series is scored at every cutoff, so each cutoff's scores "
        f"average other series (its `windows`): {first_few(parts, 5, '; ')}{none_scored}",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


class Forecaster:
    """A TFT forecasting pipeline for long-format tables (one row per series and time).

    Example::

        f = Forecaster(DataConfig(id_col="store", time_col="day", target="sales",
                                  freq="D", known_cols=("promo",), history=28, horizon=7),
                       qat=QATTrainingConfig())
        f.fit(df)                                   # FP32 training, QAT, int8 conversion
        f.save("runs/sales"); f = Forecaster.load("runs/sales")
        fc = f.predict(df, future=promos, model="int8")   # the 7 days after each series' end

    Args:
      data: the column roles, sampling, windows and split.
      model: the model size and quantile levels.
      training: FP32 training.
      qat: QAT fine-tuning and int8 conversion after FP32 training; None skips it.
    """

    def __init__(
        self,
        data: DataConfig,
        model: ModelConfig | None = None,
        training: TrainingConfig | None = None,
        qat: QATTrainingConfig | None = None,
    ) -> None:
        if not isinstance(data, DataConfig):
            raise TypeError(
                f"Forecaster: data must be a DataConfig, got {type(data).__name__}"
                f"{another_class_hint(data, DataConfig)}"
            )
        self.config = ForecasterConfig(
            data=data,
            model=ModelConfig() if model is None else model,
            training=TrainingConfig() if training is None else training,
            qat=qat,
        )
        self.dataset: PreparedDataset | None = None
        self._fitted: _Fitted | None = None
        self._predictors: dict[str, Predictor] = {}

    @classmethod
    def from_config(cls, config: ForecasterConfig) -> Forecaster:
        """A forecaster with the settings of `config`."""
        return cls(config.data, config.model, config.training, config.qat)

    def __getstate__(self) -> dict[str, Any]:
        """What `pickle` and `copy` keep: everything but the compiled predictors.

        They are closures over jitted programs, which pickle cannot store (a
        forecaster that had predicted once could not be pickled); the copy
        builds its own on its first forecast.
        """
        return {**self.__dict__, "_predictors": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restores a pickled forecaster (one pickled before `config` was a property
        holds it under that name)."""
        if "config" in state:
            state["_config"] = state.pop("config")
        self.__dict__.update(state)

    @property
    def config(self) -> ForecasterConfig:
        """The settings. They may be set anew (to `fit` with others); a fitted forecaster
        forecasts, evaluates and saves only with those its model was fitted with, but for
        the prediction batch, how it reads new tables and which of their windows it scores,
        and the training lengths (`FITTED_USE_FIELDS`)."""
        return self._config

    @config.setter
    def config(self, settings: ForecasterConfig) -> None:
        if not isinstance(settings, ForecasterConfig):
            raise TypeError(
                f"Forecaster.config must be a ForecasterConfig, got {type(settings).__name__}"
                f"{another_class_hint(settings, ForecasterConfig)}"
            )
        self._config = settings

    def __repr__(self) -> str:
        """One line a notebook shows: the table's roles, the windows, the model's size and
        levels, QAT, and what is fitted."""
        settings = self.config
        data, model = settings.data, settings.model
        fitted = self._fitted
        quantized = "no QAT" if settings.qat is None else f"QAT {settings.qat.bits} bits"
        state = "not fitted" if fitted is None else f"fitted: {', '.join(fitted.variables)}"
        return (
            f"<Forecaster of {data.target!r} by {data.id_col!r} at {data.time_col!r} "
            f"(freq {data.freq!r}), history {data.history}, horizon {data.horizon}; "
            f"hidden_dim {model.hidden_dim}, quantiles {tuple(model.quantiles)}; {quantized}; "
            f"{state}>"
        )

    # ------------------------------------------------------------------ state

    @property
    def is_fitted(self) -> bool:
        """Whether the forecaster has been fitted (or loaded)."""
        return self._fitted is not None

    def _require_fitted(self) -> _Fitted:
        if self._fitted is None:
            raise RuntimeError("this Forecaster is not fitted; call fit(df) or Forecaster.load")
        return self._fitted

    def _fitted_as_configured(self) -> _Fitted:
        """The fitted model, once `config` is known to hold the settings it was fitted with
        (but those of `FITTED_USE_FIELDS`): `config` is an attribute a notebook may set
        after `fit` to fit again."""
        fitted = self._require_fitted()
        # No QAT section added either: `save` would write that the model was QAT-trained.
        changed = (
            [] if fitted.settings is None
            else _changed_settings(
                fitted.settings, self.config, FITTED_USE_FIELDS, qat_may_be_added=False
            )
        )  # fmt: skip
        if changed:
            raise ValueError(
                "Forecaster.config holds other settings than its model was fitted with "
                f"({'; '.join(changed)}); call fit to train a model with them, or set "
                "config back"
            )
        return fitted

    @property
    def models(self) -> tuple[str, ...]:
        """The trained forms: ('fp32',) or ('fp32', 'qat', 'int8')."""
        return tuple(self._require_fitted().variables)

    @property
    def tft_config(self) -> TFTConfig:
        """The fitted model's `TFTConfig`."""
        return self._require_fitted().tft_config

    @property
    def preprocessor(self) -> Preprocessor:
        """The fitted map from tables to model inputs."""
        return self._require_fitted().preprocessor

    @property
    def variables(self) -> dict[str, Any]:
        """The trained variables of each model form, by name: a copy whose containers may
        be edited (the arrays are JAX arrays, immutable) without changing the forecaster."""
        return jax.tree.map(lambda leaf: leaf, self._require_fitted().variables)

    @property
    def history(self) -> dict[str, Any]:
        """Training and validation losses per evaluation, by phase ('fp32', 'qat'): a copy."""
        return copy.deepcopy(self._require_fitted().history)

    @property
    def summary(self) -> dict[str, Any]:
        """Step counts, timings and sizes recorded by `fit`: a copy."""
        return copy.deepcopy(self._require_fitted().summary)

    @property
    def season_period(self) -> int:
        """The seasonal naive baseline's period in steps."""
        return self._require_fitted().season_period

    def _check_model(self, model: str) -> str:
        if model not in MODEL_NAMES:
            raise ValueError(f"model must be one of {MODEL_NAMES}, got {model!r}")
        if model not in self.models:
            raise ValueError(
                f"model={model!r} was not trained: this forecaster has {self.models} "
                "(train with qat=QATTrainingConfig() for 'qat' and 'int8')"
            )
        return model

    def _model_names(self, models: Sequence[str] | None) -> tuple[str, ...]:
        """The trained forms `models` names (None: all).

        A bare string is refused, not iterated letter by letter.
        """
        if models is None:
            return self.models
        if isinstance(models, str):
            raise TypeError(
                f"models must be a list of model names such as [{models!r}], got the string "
                f"{models!r}"
            )
        if not isinstance(models, Iterable):  # else "'int' object is not iterable"
            raise TypeError(
                f"models must be a list of model names from {MODEL_NAMES} or None, got "
                f"{type(models).__name__} {models!r}"
            )
        return tuple(self._check_model(m) for m in models)

    def postprocess(self, forecast: np.ndarray) -> np.ndarray:
        """Quantile forecasts `(..., Q)` in original units as returned: sorted across levels,
        and clipped at 0 with `DataConfig.nonnegative`."""
        forecast = monotone(forecast)
        return np.maximum(forecast, 0.0) if self.config.data.nonnegative else forecast

    def predictor(self, model: str) -> Predictor:
        """The jitted `Batch -> TFTOutput` of one trained form (compiled on first use)."""
        model = self._check_model(model)
        if model not in self._predictors:
            fitted = self._fitted_as_configured()
            self._predictors[model] = make_predictor(
                model, fitted.tft_config, fitted.variables[model], self.config.integer_bits
            )
        return self._predictors[model]

    def _batch_size(self, batch_size: int | np.integer | None, where: str) -> int:
        """`batch_size` checked (an int >= 1), or the training eval batch size for None."""
        if batch_size is None:
            return self.config.training.eval_batch_size
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, numbers.Integral)
            or batch_size < 1
        ):
            raise ValueError(f"{where}: batch_size must be an int >= 1, got {batch_size!r}")
        return int(batch_size)  # a NumPy integer too, as the configs take

    # ------------------------------------------------------------------ data

    def prepare(self, table: Table | PreparedDataset, scored: str | None = None) -> PreparedDataset:
        """`table` as windows split by the data settings, with the fitted preprocessing.

        `scored`, the split that will be scored, keeps the target scaler of a
        series the model never saw from knowing that split: it is fitted on
        the series' target before the validation start (or, without any,
        before the split's start; see `prepare_dataset`). None fits it on all
        of `table`. A `PreparedDataset` is returned as it is, once it is known
        to be prepared as the model reads its inputs (`_check_prepared`).
        """
        if scored is not None and scored not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {scored!r}")
        fitted = self._fitted_as_configured()
        if isinstance(table, PreparedDataset):
            self._check_prepared(table, fitted.preprocessor)
            _check_new_series_scaled_for(table, scored)
            return table
        dataset = _prepared(
            table,
            **self.config.data.prepare_options(),
            preprocessor=fitted.preprocessor,
            scored=scored,
        )
        _announce_negative_targets(dataset.frame, dataset.spec, self.config.data.nonnegative)
        return dataset

    def _check_prepared(self, dataset: PreparedDataset, preprocessor: Preprocessor) -> None:
        """Raises unless `dataset` holds the windows the fitted model reads.

        A dataset prepared with another preprocessor (one `prepare_dataset`
        fitted on its own table, say) feeds the model inputs scaled
        otherwise, and one with other window normalization feeds it windows
        on another scale: either was scored without a word, on wrong
        forecasts. Other window lengths failed deep in the model's shape check.
        """
        data = self.config.data
        differ = [
            f"{name} {value} (the model's: {wanted})"
            for name, value, wanted in (
                ("history", dataset.history, data.history),
                ("horizon", dataset.horizon, data.horizon),
                ("window_normalization", dataset.test.normalized, data.window_normalization),
            )
            if value != wanted
        ]
        if dataset.preprocessor is not preprocessor:
            given, fitted = (
                json.dumps(run_folder.json_ready(p.to_json()), sort_keys=True)
                for p in (dataset.preprocessor, preprocessor)
            )
            if given != fitted:
                differ.append("another preprocessor than the fitted one (other scalers or codes)")
        if differ:
            raise ValueError(
                f"the PreparedDataset was prepared otherwise than this forecaster's model reads "
                f"its inputs: {'; '.join(differ)}; pass the table, or prepare it with "
                "Forecaster.prepare(table, split)"
            )

    def _season_period(self, dataset: PreparedDataset) -> int:
        data = self.config.data
        period = data.season_period or seasonal_period(data.freq)
        if period > dataset.history:
            raise ValueError(
                f"the seasonal naive period ({period} steps) exceeds DataConfig.history "
                f"({dataset.history}); lengthen it or set a shorter DataConfig.season_period"
            )
        return period

    # ------------------------------------------------------------------ fit

    def fit(
        self,
        table: Table,
        *,
        checkpoint_dir: str | os.PathLike | None = None,
        resume: bool = False,
        quiet: bool = False,
        before_training: Callable[[], None] | None = None,
    ) -> Forecaster:
        """Trains the FP32 TFT on `table` (then QAT and int8 with `qat` settings).

        Args:
          table: a long-format DataFrame or CSV path with the columns of `data`.
          checkpoint_dir: where training checkpoints go (`fp32/`, `qat/`); None keeps none.
            A leading `~` is the home folder, as for `save` and `load`.
          resume: continue from the newest checkpoint in `checkpoint_dir`. The
            settings must be those the checkpoints recorded when their run
            started, except `epochs`, `max_steps`, the time budgets,
            `patience`, QAT `steps` (to extend a run), a QAT section added, and `eval_batch_size`,
            `season_period` and `nonnegative` (read after training only): any
            other difference raises `ValueError` naming each `Config.field`
            with its old and new value (`RESUMABLE_FIELDS`). Checkpoints from
            before settings were recorded resume with a warning. When the FP32
            phase trains on to another best state, the QAT checkpoints (of the
            earlier FP32 model) are replaced, with a warning, and QAT starts
            again from the new one (`_check_qat_source`).
          quiet: no progress bars.
          before_training: called once `table` has passed every check (columns,
            splits, windows, the seasonal period) and just before training
            starts, before any checkpoint is written: where the CLI's
            `--overwrite` deletes the earlier run, so that a refused table
            leaves it in place.

        In a multi-process run (`tft_jax.distributed.initialize_multihost`)
        every process calls `fit` with the same table; each reads its own rows
        of every global batch. `fit` first checks, in every process, that all
        have the same number of local devices (`check_local_devices_agree`)
        and were given the same `fit_settings` (every config field, the
        table's content, `resume`, whether `checkpoint_dir` is given, the
        versions): a difference raises `ValueError` naming each differing
        setting, this process's value and the processes that differ, where
        it used to train silently on a mix of two tables or end in JAX or
        gloo errors. A single process gathers nothing.

        Returns:
          self, fitted.
        """
        started = time.perf_counter()
        settings = self.config
        if jax.process_count() > 1:  # before anything whose shapes depend on the settings
            check_local_devices_agree("fit")
            check_settings_agree(
                fit_settings(settings, table, checkpoint_dir, resume),
                "fit",
                "every process must call Forecaster.fit with the same settings, table, "
                "resume and checkpoint_dir (given or not), with the same versions of tft_jax "
                "and JAX",
            )
        check_global_batch(settings.training.batch_size)
        dataset = _prepared(table, **settings.data.prepare_options())
        _announce_negative_targets(dataset.frame, dataset.spec, settings.data.nonnegative)
        period = self._season_period(dataset)
        tft_config = TFTConfig(
            **dataset.tft_config_kwargs(),
            hidden_dim=settings.model.hidden_dim,
            num_heads=settings.model.num_heads,
            dropout_rate=settings.model.dropout_rate,
            variable_hidden_dim=settings.model.variable_hidden_dim,
            compact_selection=settings.model.compact_selection,
            quantiles=settings.model.quantiles,
        )
        rows = local_rows(settings.training.batch_size)
        val_batches = validation_batches(dataset, settings.training)
        # Expanded once, here: orbax expands a leading "~" itself, and the batch-stream and
        # QAT-source records, the resume checks and the deletion of stale QAT checkpoints
        # went to a folder literally named "~" instead, so a resume was checked against none.
        checkpoints = None if checkpoint_dir is None else expanded(checkpoint_dir)
        timing = {"data": time.perf_counter() - started}
        if before_training is not None:
            before_training()
        # The checkpoints' folder is this process's to write until training ends: another
        # process training into it would interleave its checkpoints with these.
        writing = (
            contextlib.nullcontext()
            if checkpoints is None
            else folder_locked(checkpoints, "fit: checkpoint_dir ", enabled=is_primary())
        )
        with writing:
            if checkpoints is not None:
                _check_batch_stream(
                    checkpoints, resume, settings.training.batch_size, dataset, settings
                )
            # Where the FP32 phase goes on from: whether it trained in this call tells whether
            # QAT checkpoints that do not record their FP32 model may be kept.
            resumed_from = (
                _newest_step(checkpoints / "fp32") if checkpoints is not None and resume else 0
            )
            phase = time.perf_counter()
            fp32 = train_fp32(
                TemporalFusionTransformer(tft_config),
                dataset,
                settings.training,
                val_batches,
                checkpoints,
                resume,
                quiet,
                rows,
            )
            timing["fp32_training"] = time.perf_counter() - phase
            variables = {"fp32": fp32.variables}
            history = {"fp32": fp32.history}
            summary: dict[str, Any] = {"fp32": fp32.settings, "dataset": dataset.summary()}
            if settings.qat is not None:
                phase = time.perf_counter()
                # The model the predictors build (calibration takes its batch count as an
                # argument): the QAT forward that validated it then serves its forecasts.
                qat_model = qat_model_for(tft_config, settings.qat.bits)
                if checkpoints is not None:
                    _check_qat_source(
                        checkpoints,
                        resume,
                        fp32.variables,
                        fp32.settings["steps_trained"],
                        resumed_from,
                        quiet,
                    )
                tuned = train_qat(
                    qat_model,
                    fp32.variables,
                    dataset,
                    settings.training,
                    settings.qat,
                    val_batches,
                    checkpoints,
                    resume,
                    quiet,
                    rows,
                )
                variables["qat"] = tuned.variables
                converting = time.perf_counter()
                variables["int8"] = jax.block_until_ready(
                    qat.convert(tuned.variables, bits=settings.qat.bits)
                )
                announce(
                    quiet,
                    f"int8: converted the QAT model in {time.perf_counter() - converting:.1f}s",
                )
                history["qat"] = tuned.history
                summary["qat"] = {
                    **tuned.settings,
                    # The fields the TFT's QAT model reads: its layout is fixed (below), so
                    # `symmetric`, `per_channel`, `channel_axis` and `observer` would misstate it.
                    "qat_config": {
                        **{
                            key: value
                            for key, value in dataclasses.asdict(qat_model.qat_config).items()
                            if key not in QAT_LAYOUT_FIELDS
                        },
                        "calibration_batches": settings.qat.calibration_batches,
                    },
                    "layout": "weights per-channel symmetric, activations per-tensor affine "
                    "(moving-average observers)",
                    "size": qat.model_size(variables["qat"], variables["int8"]),
                }
                timing["qat_training"] = time.perf_counter() - phase
        summary["seconds"] = timing
        self.dataset = dataset
        self._fitted = _Fitted(
            preprocessor=dataset.preprocessor,
            tft_config=tft_config,
            season_period=period,
            variables=variables,
            history=history,
            summary=summary,
            versions=run_folder.versions(),
            settings=_settings_record(settings),
        )
        self._predictors = {}
        return self

    # ------------------------------------------------------------------ predict

    def predict(
        self,
        table: Table,
        future: pd.DataFrame | None = None,
        model: str = "fp32",
        batch_size: int | np.integer | None = None,
    ) -> pd.DataFrame:
        """Quantile forecasts of the `H` steps after each series' last time in `table`.

        Args:
          table: history in long format with the columns of `data` (new data
            is fine: more recent history, other series of the same spec);
            each series needs at least `history` steps.
          future: the id, time and every known column for exactly the `H`
            steps after each series' last time (calendar inputs are
            generated); not needed without known columns.
          model: 'fp32', 'qat' or 'int8'.
          batch_size: series per batch (default the training eval batch size),
            the last batch padded: one compiled forward per model serves
            every call, the one `fit`, `evaluate` and `backtest` run at the
            default, and a series' forecast does not depend on how many
            others are forecast with it. A smaller one computes fewer rows
            for few series (lower latency per call) at the cost of its own
            compile.

        The history gets the checks of training data: gaps and empty cells are
        forward-filled (empty categorical cells coded unknown) and announced,
        a series whose last `history` steps are more than
        `data.max_missing_fraction` filled is refused, and series whose whole
        forecast lies before the table's last time are named. Forecasts below 0
        of a table whose target is never below 0 (a count) are announced with a
        `UserWarning`, counted by quantile level, unless `data.nonnegative`
        clips them (`tft_jax.forecaster.negative_forecasts`).

        Returns:
          A long DataFrame: the id and time columns, then one column per
          quantile level (`q0.1`, `q0.5`, ...), in the target's units, rows
          ordered by series (in sorted id order, not the table's) then time.
        """
        batch_size = self._batch_size(batch_size, "predict")
        fitted = self._fitted_as_configured()
        predict = self.predictor(model)
        data = self.config.data
        ahead = future_windows(
            fitted.preprocessor, table, future, data.history, data.horizon,
            normalized=data.window_normalization, encoding=data.encoding,
            max_missing_fraction=data.max_missing_fraction,
        )  # fmt: skip
        _announce_negative_targets(
            ahead.transformed.frame, fitted.preprocessor.spec, data.nonnegative
        )
        windows = ahead.windows
        predictions = predict_windows(predict, windows, batch_size)
        series_ids = ahead.transformed.series_ids
        place = forecast_place(series_ids, windows)

        def where(index: tuple[int, ...]) -> str:  # names an overflowing forecast
            level = fitted.tft_config.quantiles[index[2]] if len(index) > 2 else None
            return f"the forecast of {place(index[0], index[1])}" + (
                f" (quantile {level})" if level is not None else ""
            )

        forecast = self.postprocess(
            ahead.transformed.target_scaler.inverse_transform(
                windows.denormalize(predictions.quantiles), windows.series_code, where
            )
        )
        spec = fitted.preprocessor.spec
        self._announce_negative_forecasts(
            ahead.transformed.frame[spec.target].to_numpy(),
            {model: count_negative(forecast, place)},
            "predict",
        )
        horizon = data.horizon
        rows = (windows.starts[:, None] + np.arange(horizon)).reshape(-1)
        # An Index infers the ids' dtype (int64 ids stay int64, not object), so that the
        # forecasts merge and compare with the user's tables as their ids do.
        ids = pd.Index(list(ahead.transformed.series_ids)).repeat(horizon)
        result = pd.DataFrame({spec.id_col: ids, spec.time_col: windows.panel.times[rows]})
        for index, level in enumerate(fitted.tft_config.quantiles):
            result[quantile_name(level)] = forecast[..., index].reshape(-1)
        return result

    # ------------------------------------------------------------------ evaluate

    def predictions(
        self, dataset: PreparedDataset, windows: WindowSet, models: Sequence[str] | None = None
    ) -> dict[str, Predictions]:
        """Each model's `Predictions` over `windows` of `dataset` (model-scale quantiles)."""
        self._fitted_as_configured()  # a predictor compiled before is returned unchecked
        names = self._model_names(models)
        batch_size = self.config.training.eval_batch_size
        return {name: predict_windows(self.predictor(name), windows, batch_size) for name in names}

    def _forecasts(
        self, dataset: PreparedDataset, windows: WindowSet, predictions: dict[str, Predictions]
    ) -> dict[str, np.ndarray]:
        """Each model's `(N, H, Q)` forecasts over `windows` in original units, as returned
        (`postprocess`): those `_metrics` scores."""
        return {
            name: self.postprocess(to_original_units(dataset, windows, prediction.quantiles))
            for name, prediction in predictions.items()
        }

    def _announce_negative_forecasts(
        self, targets: np.ndarray, found: dict[str, NegativeForecasts], scope: str
    ) -> None:
        """Warns of forecasts in `found` below 0 when no value of `targets` (the target of
        the table forecast) is, unless `DataConfig.nonnegative` (`negative_forecasts`)."""
        announce_negative_forecasts(
            self.config.data, targets, found, self.tft_config.quantiles, scope
        )

    def _metrics(
        self,
        dataset: PreparedDataset,
        windows: WindowSet,
        forecasts: dict[str, np.ndarray],
        seconds: dict[str, float] | None = None,
    ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """`(models, baselines)`: metrics of the models' `forecasts` (`_forecasts`; with
        `seasonal_naive` and `best_baseline`, the baseline of lowest P50 q-risk) and of every
        baseline."""
        quantiles = self.tft_config.quantiles
        observed = _scored_steps(dataset, windows)
        score = window_scorer(dataset, windows, quantiles, observed)
        periods = (*candidate_periods(self.config.data.freq, dataset.history), self.season_period)
        baselines = baseline_metrics(
            dataset, windows, quantiles, periods, self.config.data.nonnegative, observed
        )
        best = best_of(baselines)
        models = {
            "seasonal_naive": baselines[f"seasonal_naive_{self.season_period}"],
            "best_baseline": {**baselines[best], "name": best},
        }
        for name, forecast in forecasts.items():
            try:
                models[name] = score(forecast)
            except ValueError as error:  # a non-finite forecast: say whose
                raise ValueError(f"the {name} model's forecasts: {error}") from error
            if seconds is not None:
                models[name]["seconds"] = seconds[name]
        return models, baselines

    def _sparse_histories(self, dataset: PreparedDataset, starts: np.ndarray) -> np.ndarray:
        """(N,) bool: windows whose history has more filled target steps than `predict` takes.

        `predict` refuses a series whose last `history` steps are more than
        `DataConfig.max_missing_fraction` filled; scoring such windows would
        grade forecasts the model is never asked for.
        """
        limit = self.config.data.max_missing_fraction
        # As predict compares: filled steps against the fraction of the history.
        return (
            filled_history_steps(dataset.panel, starts, dataset.history) > limit * dataset.history
        )

    def _sparse_text(self, dataset: PreparedDataset, whose: str = "its") -> str:
        """What `_sparse_histories` leaves out, in words (`whose`: 'its' or 'their')."""
        return (
            f"more than {100 * self.config.data.max_missing_fraction:g}% of {whose} "
            f"{dataset.history} history steps filled (missing target steps; "
            "DataConfig.max_missing_fraction)"
        )

    def _announce_left_out(
        self, where: str, dataset: PreparedDataset, starts: np.ndarray, left_out: np.ndarray
    ) -> None:
        """Warns of the windows `left_out` of `where`, counted by series."""
        codes, counts = np.unique(dataset.panel.series_code[starts[left_out]], return_counts=True)
        listed = ", ".join(
            f"{dataset.series_ids[code]!r} {count}"
            for code, count in zip(codes, counts, strict=True)
        )
        warnings.warn(
            f"{where}: left out of the scores {int(left_out.sum())} of {starts.size} windows "
            f"with {self._sparse_text(dataset, 'their')}, the histories predict refuses: {listed}",
            stacklevel=user_stacklevel(),
        )

    def _announce_in_sample_test(self, dataset: PreparedDataset, starts: np.ndarray) -> None:
        """Warns when test windows scored at `starts` lie before the model's own test start.

        The test split of another table is cut by the fractions applied to
        that table: one ending earlier than the training table puts it in the
        model's training or validation period, whose targets it was fitted or
        selected on.
        """
        test_start = _model_test_start(self._require_fitted().summary)  # read, not copied
        if test_start is None:
            return
        in_sample = _in_sample_windows(dataset, starts, test_start)
        if not in_sample.any():
            return
        _announce_in_sample(
            "evaluate",
            f"the test split of this table (from {dataset.test_start}, cut from this table) "
            "has windows that",
            int(in_sample.sum()),
            starts.size,
            test_start,
            "for out-of-sample scores evaluate a table that extends past the training data "
            "by at least a test split, or backtest it with cutoffs at or after the model's "
            "test start",
        )

    def evaluation(
        self,
        table: Table | PreparedDataset,
        split: str = "test",
        models: Sequence[str] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Predictions]]:
        """`(metrics, predictions)` of every model on `split` of `table` (see `evaluate`).

        The predictions cover every window of the split, in its order; the
        metrics leave out (and announce) those whose history `predict` would
        refuse (more than `DataConfig.max_missing_fraction` filled).
        """
        return self._evaluation(table, split, models)

    def _evaluation(
        self, table: Table | PreparedDataset, split: str, models: Sequence[str] | None
    ) -> tuple[dict[str, Any], dict[str, Predictions]]:
        """`evaluation`, called by it and by `evaluate` alike (their warnings name the caller's
        line one frame up)."""
        dataset = self.prepare(table, split)
        # Said here: the predictions would fail with "no windows to evaluate".
        windows = _split_windows(dataset, split, "evaluate")
        left_out = self._sparse_histories(dataset, windows.starts)
        if left_out.all():
            raise TableContentError(
                f"evaluate: every one of the {len(windows)} windows of the {split} split has "
                f"{self._sparse_text(dataset)}, the histories predict refuses; nothing is left "
                "to score"
            )
        if left_out.any():
            where = f"evaluate: the {split} split"
            self._announce_left_out(where, dataset, windows.starts, left_out)
        if split == "test":  # 'train' and 'validation' are the model's own by name
            self._announce_in_sample_test(dataset, windows.starts[~left_out])
        names = self._model_names(models)
        predictions, seconds = {}, {}
        for name in names:  # every window: the forecasts are the split's, the metrics the kept's
            started = time.perf_counter()
            predictions.update(self.predictions(dataset, windows, [name]))
            seconds[name] = time.perf_counter() - started
        scored = dataclasses.replace(windows, starts=windows.starts[~left_out])
        observed = _scored_steps(dataset, scored)  # each window has an observed step
        kept = {
            name: dataclasses.replace(prediction, quantiles=prediction.quantiles[~left_out])
            for name, prediction in predictions.items()
        }
        forecasts = self._forecasts(dataset, scored, kept)
        try:
            models_metrics, baselines = self._metrics(dataset, scored, forecasts, seconds)
        except ZeroTargetError:
            raise TableContentError(
                f"evaluate: every target of the {split} split ({len(scored)} windows) is zero, "
                "so q-risk is undefined there; evaluate another split or table"
            ) from None
        place = forecast_place(dataset.series_ids, scored)
        self._announce_negative_forecasts(
            dataset.frame[dataset.spec.target].to_numpy(),
            {name: count_negative(forecast, place) for name, forecast in forecasts.items()},
            f"evaluate: the {split} split",
        )
        metrics = {
            "split": split,
            "windows": len(scored),
            # Forecast steps of those windows without an observed target, left out of every
            # score (windows kept with require_observed_target=False; else 0).
            "masked_steps": 0 if observed is None else int((~observed).sum()),
            "horizon": dataset.horizon,
            "history": dataset.history,
            "units": f"{dataset.spec.target} (original units)",
            "seasonal_naive_period": self.season_period,
            "models": models_metrics,
            "baselines": baselines,
            "comparison": comparisons(models_metrics),
        }
        return metrics, predictions

    def evaluate(
        self,
        table: Table | PreparedDataset,
        split: str = "test",
        models: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Metrics of the seasonal naive baseline and every model on `split` of `table`.

        `table` is split as in training (the data settings' fractions or cut
        times); metrics are in the target's units (`tft_jax.evaluation`):
        P50/P90 q-risk, q-risk per level, mean quantile loss, and the relative
        changes fp32 vs seasonal naive and qat/int8 vs fp32. A series not in
        the training data is scaled by its target before the validation start
        (before `split`'s start if it has none there), never by the scored
        steps; a `PreparedDataset` is used as it was prepared
        (`prepare(table, split)` does this), and refused with a `ValueError`
        when prepared with another preprocessor, window length or window
        normalization than the model reads. Windows whose history is more than
        `DataConfig.max_missing_fraction` filled, those `predict` refuses, are
        left out of the metrics with a warning. With
        `DataConfig.require_observed_target=False` the split keeps the windows
        whose horizon holds a target missing in the table (filled): every
        model and baseline is scored on the same observed steps only, and
        `masked_steps` counts the forecast steps left out (0 otherwise).

        The test split of another table is that table's: where it holds
        windows of series the model was trained on that forecast steps before
        the model's own test start (a table ending earlier than the training
        table), a `UserWarning` says how many: they are scored on targets the
        model was fitted or selected on, in-sample. 'train' and 'validation'
        are in-sample by name, and not announced. Scored forecasts below 0 of a
        table whose target is never below 0 are announced in one `UserWarning`
        naming each model's count by level, as `predict` does.
        """
        return self._evaluation(table, split, models)[0]

    def interpretation(
        self,
        table: Table | PreparedDataset,
        split: str = "test",
        model: str = "fp32",
        batch_size: int | None = None,
    ) -> dict[str, pd.DataFrame]:
        """The model's variable importances and attention on `split` of `table`, as tables.

        `table` is prepared and split as in `evaluate` (a `PreparedDataset`
        is used as it was prepared); every window of the split is run
        through `model` and its interpretability outputs are averaged.

        Args:
          table: a long-format DataFrame or CSV path, or a `PreparedDataset`.
          split: 'train', 'validation' or 'test'.
          model: 'fp32', 'qat' or 'int8' (one this forecaster trained).
          batch_size: windows per batch (default the training eval batch size).

        Returns:
          A dict of DataFrames (`tft_jax.forecaster.interpretation.interpretation_tables`):

          - `static`, `history`, `future`: the variable selection weights, one
            row per variable with columns `variable` and `weight`, in the
            model's order (not sorted; `.sort_values("weight")` sorts them).
            Static weights are averaged over windows; history and future
            weights over windows and steps. Each group sums to 1.
          - `attention`: the attention of each horizon step (rows, index
            `horizon` 1..H) over the window's positions (columns, `position`):
            lags -T..-1, then the forecast steps 0..H-1, averaged over windows
            and heads. Rows sum to 1; a step puts no weight on later steps.

        Raises:
          ValueError: for a `split` or `model` not among the names above (or
            a model not trained), a `batch_size` below 1, or weights that are
            not finite (a diverged model: its forecasts are not finite either).
          TableContentError: when the split holds no complete window.
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        model = self._check_model(model)
        batch_size = self._batch_size(batch_size, "interpretation")
        dataset = self.prepare(table, split)
        windows = _split_windows(dataset, split, "interpretation")
        predictions = predict_windows(self.predictor(model), windows, batch_size)
        tables = interpretation_tables(
            predictions,
            dataset.static_weight_names,
            dataset.history_weight_names_for(len(predictions.history_weights)),
            dataset.future_weight_names,
            dataset.history,
        )
        _check_finite_interpretation(tables, model, split)
        return tables

    def backtest(
        self,
        table: Table,
        n_windows: int | np.integer = 3,
        step: int | np.integer | None = None,
        models: Sequence[str] | None = None,
    ) -> pd.DataFrame:
        """Rolling-origin evaluation over `n_windows` cutoffs, without retraining.

        The last cutoff forecasts the final `H` steps of `table`; each earlier
        one starts `step` steps (default `H`) of `freq` before the next, counted
        on the grid from the table's first time (a series recorded off it, at
        another offset, is refused naming it). At each cutoff
        every series with `history` steps before it and an observed target
        over the next `H` steps (with `DataConfig.require_observed_target=False`,
        at least one there: the others are left out of its scores) is
        forecast once, unless more than `DataConfig.max_missing_fraction` of
        that history is filled (as
        `predict` refuses it: left out, announced). A series not scored at a
        cutoff (too short a history before it, data ending within its horizon,
        a missing target there) is named with its reason in one `UserWarning`,
        since each cutoff's scores average the series scored there (`windows`);
        a cutoff that scores no series has no rows. A series not in the
        training data is scaled by its target before the first cutoff (a
        ValueError names it if it has none), never by the steps it is scored on.

        The model is not retrained, so a cutoff before the model's test start
        (recorded by `fit` in `summary['dataset']`) scores the series it was
        trained on over its training or validation period, in-sample: one
        `UserWarning` names such cutoffs, counts their windows and says which
        `n_windows` keeps the cutoffs at or after the test start. The scores
        are left as they are; a new series is out of sample at any cutoff.
        Forecasts below 0 of a table whose target is never below 0 are counted
        over every cutoff and announced once, as `predict` does.

        Returns:
          A DataFrame, one row per (cutoff, model), the seasonal naive baseline
          included: `cutoff` (the first forecast step), `model`, `baseline`
          (for the `best_baseline` rows, the baseline chosen at that cutoff,
          e.g. 'drift_7'; NaN for the others), `windows`, `p50_q_risk`,
          `p90_q_risk`, `mean_quantile_loss`; with
          `DataConfig.require_observed_target=False` also `masked_steps`, the
          forecast steps of the cutoff's windows whose target is missing in
          the table, left out of its scores.

          A cutoff whose targets over the next `H` steps are all zero has no
          q-risk (it divides by their absolute sum): its rows are kept with
          `p50_q_risk` and `p90_q_risk` NaN, the mean quantile loss still
          scored (NaN for `best_baseline`, whose choice needs a q-risk), and a
          `UserWarning` names the cutoff, so that the other cutoffs are still
          scored. Aggregate with `skipna` (pandas' default) or drop them.

        Raises:
          TableContentError: every scored cutoff's targets are all zero, or no
            cutoff has a window to score (with a history `predict` takes).
          ValueError: bad `n_windows`/`step`, too short a table, a new
            series without a target before the first cutoff.
        """
        for name, value in (("n_windows", n_windows), ("step", step)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
            ):
                raise ValueError(f"backtest: {name} must be an int >= 1, got {value!r}")
        data = self.config.data
        n_windows = int(n_windows)  # a NumPy integer too, as the configs take
        step = data.horizon if step is None else int(step)
        options = {**data.prepare_options(), "validation_fraction": 0.0, "test_fraction": 0.0}
        options.update(validation_start=None, test_start=None)
        scored = data.horizon + (n_windows - 1) * step  # the grid steps from the first cutoff
        try:
            dataset = _prepared(table, **options, preprocessor=self.preprocessor, scored=scored)
        except NewSeriesWithoutTargetError as error:
            raise ValueError(
                f"backtest: series {error.series!r} is not in the training data and has no "
                f"observed target before the first cutoff {error.cut} to scale it by (a new "
                "series is scaled by its history before the first cutoff, never by the steps "
                "it is scored on); lower n_windows or step so that the first cutoff comes "
                "after some of its targets, or leave it out of the table"
            ) from None
        _announce_negative_targets(dataset.frame, dataset.spec, data.nonnegative)
        panel = dataset.panel
        zone = self.preprocessor.time_zone
        grid_times = _common_grid(dataset, data.freq, zone)
        last_start = len(grid_times) - data.horizon
        # Checked before the cutoffs are listed: a list of n_windows positions was built
        # first, so an n_windows of 10**9 ran for minutes and out of memory before this error.
        if last_start - (n_windows - 1) * step < data.history:
            raise ValueError(
                f"backtest: {n_windows} cutoffs {step} steps apart need "
                f"{data.history + scored} steps of data ({data.history} of history before the "
                f"first cutoff, {scored} from it), the table spans {len(grid_times)} "
                f"({grid_times[0]} .. {grid_times[-1]}); lower n_windows or step"
            )
        positions = [last_start - k * step for k in range(n_windows)][::-1]
        offset = parse_frequency(data.freq)
        records = []
        zero_cutoffs: list[pd.Timestamp] = []
        test_start = _model_test_start(self._require_fitted().summary)  # read, not copied
        in_sample: dict[pd.Timestamp, int] = {}  # cutoff -> its windows scored in-sample
        scored_at: dict[pd.Timestamp, int] = {}
        # Series not scored at a cutoff, by cutoff, with why: each cutoff averages its own.
        unscored: dict[pd.Timestamp, dict[Any, str]] = {}
        skipped: list[pd.Timestamp] = []  # cutoffs that score no series
        negative: dict[str, NegativeForecasts] = {}  # forecasts below 0, over the cutoffs
        for position in positions:
            cutoff = grid_times[position]
            last = grid_times[position + data.horizon - 1]
            end = (
                step_after(last, offset)
                if last.tz is None or zone is None
                else step_after(last.tz_convert(zone), offset).tz_convert(last.tz)
            )
            starts = window_starts(
                panel, data.history, data.horizon, cutoff, end,
                require_observed_target=dataset.require_observed_target,
            )  # fmt: skip
            starts = starts[panel.times[starts] == cutoff]
            reasons = _unscored_series(dataset, starts, cutoff, data.history, data.horizon)
            if reasons:
                unscored[cutoff] = reasons
            left_out = self._sparse_histories(dataset, starts)
            if left_out.any():
                self._announce_left_out(f"backtest: the cutoff {cutoff}", dataset, starts, left_out)
                starts = starts[~left_out]
            if starts.size == 0:  # named below; the other cutoffs are scored
                skipped.append(cutoff)
                continue
            if test_start is not None:
                flagged = _in_sample_windows(dataset, starts, test_start)
                if flagged.any():
                    in_sample[cutoff], scored_at[cutoff] = int(flagged.sum()), int(starts.size)
            windows = WindowSet(
                panel, starts, data.history, data.horizon, normalized=data.window_normalization
            )
            forecasts = self._forecasts(
                dataset, windows, self.predictions(dataset, windows, models)
            )
            try:
                metrics, _ = self._metrics(dataset, windows, forecasts)
            except ZeroTargetError:
                zero_cutoffs.append(cutoff)
                metrics = self._zero_target_metrics(dataset, windows, forecasts)
            place = forecast_place(dataset.series_ids, windows)
            for name, forecast in forecasts.items():
                found = count_negative(forecast, place)
                negative[name] = negative[name] + found if name in negative else found
            observed = _scored_steps(dataset, windows)
            masked = {} if observed is None else {"masked_steps": int((~observed).sum())}
            for name, row in metrics.items():
                records.append(
                    {
                        "cutoff": cutoff,
                        "model": name,
                        "baseline": row.get("name"),
                        "windows": int(starts.size),
                        "p50_q_risk": row["p50_q_risk"],
                        "p90_q_risk": row["p90_q_risk"],
                        "mean_quantile_loss": row["mean_quantile_loss"],
                        **masked,
                    }
                )
        if in_sample and test_start is not None:
            fitting = sum(1 for position in positions if grid_times[position] >= test_start)
            _announce_in_sample_cutoffs(
                in_sample, scored_at, len(positions), fitting, step, test_start
            )
        if not records:
            last = grid_times[positions[-1]]
            why = first_few([f"{k!r} ({v})" for k, v in unscored.get(last, {}).items()], 3)
            needed = "an observed target" if data.require_observed_target else "one observed"
            raise TableContentError(
                f"backtest: no cutoff scores a series: no series has {data.history} steps of "
                f"history before a cutoff (at most {100 * data.max_missing_fraction:g}% of "
                f"them filled) and {needed} target over the {data.horizon} steps after it "
                f"(at the last cutoff {last}: "
                f"{why or 'every window has a history predict refuses'}); choose other "
                "cutoffs with n_windows and step"
            )
        _announce_unscored_series(unscored, skipped)
        _check_zero_target_cutoffs(zero_cutoffs, len(positions) - len(skipped), data.horizon)
        scored_cutoffs = len(positions) - len(skipped)
        self._announce_negative_forecasts(
            dataset.frame[dataset.spec.target].to_numpy(),
            negative,
            f"backtest ({scored_cutoffs} cutoff{'s' if scored_cutoffs != 1 else ''})",
        )
        return pd.DataFrame.from_records(records)

    def _zero_target_metrics(
        self, dataset: PreparedDataset, windows: WindowSet, forecasts: dict[str, np.ndarray]
    ) -> dict[str, dict[str, Any]]:
        """`backtest`'s metrics at a cutoff whose targets are all zero, where q-risk is undefined.

        The same models as `_metrics` gives (`seasonal_naive`, `best_baseline`
        and the trained ones), their q-risks NaN; the mean quantile loss (which
        divides by no target) is still scored, except for `best_baseline`,
        whose choice by P50 q-risk is undefined (NaN, no `name`).
        """
        quantiles = self.tft_config.quantiles
        observed = _scored_steps(dataset, windows)
        actual = actuals(dataset, windows, observed)
        naive = seasonal_naive_forecast(dataset, windows, self.season_period)
        if self.config.data.nonnegative:
            naive = np.maximum(naive, 0.0)  # as `baseline_metrics` clips the baselines
        scored: dict[str, np.ndarray | None] = {
            "seasonal_naive": naive,
            "best_baseline": None,
            **forecasts,
        }
        return {
            name: {
                "p50_q_risk": float("nan"),
                "p90_q_risk": float("nan"),
                "mean_quantile_loss": (
                    float("nan")
                    if forecast is None
                    else mean_quantile_loss(forecast, actual, quantiles, observed)
                ),
            }
            for name, forecast in scored.items()
        }

    # ------------------------------------------------------------------ save / load

    def save(self, path: str | os.PathLike, extra: dict[str, Any] | None = None) -> pathlib.Path:
        """Writes a self-contained run folder (`run_folder`); loading needs no training data.

        `extra` adds sections to config.json (the CLI records its arguments there): JSON
        values (finite numbers), under names other than the run's own sections. config.json
        records the SHA-256 of each model file (`models_sha256`), which `load` checks. A
        folder holding an earlier run is written over: every file is written to a
        temporary sibling first and replaces the earlier one only once all are written
        (`run_folder.write_run_files`), so a write that fails raises
        `run_folder.RunFolderWriteError` (an `OSError`) naming the file and leaves the
        earlier run loadable; the model files of forms this forecaster lacks are deleted
        last. The results `tft-jax` wrote there for the earlier model (metrics, forecasts,
        plots, checkpoints) are left as they are, with a `run_folder.EarlierResultsWarning`
        naming them when this is another model (not the one loaded from there, or saved
        there before): they describe that one.

        The folder is locked for the write (`tft_jax.folder_lock`, by process 0 of a
        multi-host run): a save while another process writes it (a save, a `tft-jax
        train`) raises `FolderLockedError` naming that process and writes nothing.
        """
        fitted = self._fitted_as_configured()
        root = expanded(path)  # "~/runs/x" is the user's, as in a shell
        # Refused before anything is written: pathlib's NotADirectoryError named no cause.
        existing = next(p for p in (root, *root.parents) if p.exists() or p == p.parent)
        if existing.exists() and not existing.is_dir():
            raise ValueError(
                f"save: {existing} is a file, not a folder; give the path of a run folder "
                "(made where absent)"
            )
        model_files = {
            name: run_folder.variables_bytes(variables)
            for name, variables in fitted.variables.items()
        }
        history = run_folder.history_bytes(fitted.history)
        config = {
            "format": run_folder.FORMAT,
            "format_version": run_folder.FORMAT_VERSION,
            **self.config.to_json(),
            "tft_config": dataclasses.asdict(fitted.tft_config),
            "preprocessor": fitted.preprocessor.to_json(),
            "season_period": fitted.season_period,
            "models": list(fitted.variables),
            run_folder.DIGESTS_KEY: {
                name: run_folder.sha256_hex(data) for name, data in model_files.items()
            },
            run_folder.HISTORY_DIGEST_KEY: run_folder.sha256_hex(history),
            "summary": fitted.summary,
            # Where the model was trained: its numbers depend on it, not on where it is saved.
            "versions": fitted.versions or run_folder.versions(),
            # Which tft-jax wrote this file: what an older one names when it refuses it.
            run_folder.SAVED_BY_KEY: run_folder.saved_by(),
        }
        if extra is not None and not isinstance(extra, dict):
            raise TypeError(f"save: extra must be a dict of sections, got {type(extra).__name__}")
        # An extra section named like one of the run's would replace it: the folder would
        # load with other settings or weights of another shape, or not at all.
        clash = sorted(set(extra or {}) & set(config))
        if clash:
            raise ValueError(
                f"save: extra sections {clash} are sections of the run's own config.json "
                f"({list(config)}); give them other names"
            )
        try:  # refused before anything is written
            json.dumps(run_folder.json_ready(extra), allow_nan=False)
        except (TypeError, ValueError) as error:
            raise TypeError(f"save: extra must hold JSON values: {error}") from None
        run_folder.check_finite_extra(extra)  # null in config.json: another value
        # The config.json last: `write_run_files` replaces it first. Model files of forms
        # this forecaster lacks are another run's: deleted once the config.json is new.
        files = {run_folder.model_path(root, name): data for name, data in model_files.items()}
        files[root / run_folder.HISTORY_FILE] = history
        files[root / run_folder.CONFIG_FILE] = run_folder.json_text(
            {**config, **(extra or {})}
        ).encode()
        stale = [
            run_folder.model_path(root, name) for name in MODEL_NAMES if name not in model_files
        ]
        with folder_locked(root, "save: ", enabled=is_primary()):
            # Results beside a model saved there before describe it: named below, unless
            # this is that very model (loaded from the folder, or saved twice).
            earlier = (
                run_folder.earlier_results(root)
                if (root / run_folder.CONFIG_FILE).is_file()
                and not run_folder.holds_models(root, model_files)
                else []
            )
            run_folder.write_run_files(root, files, stale)
        if earlier:
            warnings.warn(
                f"save: {root} also holds {', '.join(earlier)} of the model saved there "
                "before; they describe that model, not this one, and are left as they are "
                "(delete them, or save into a new folder)",
                run_folder.EarlierResultsWarning,
                stacklevel=user_stacklevel(),
            )
        return root

    @classmethod
    def load(cls, path: str | os.PathLike) -> Forecaster:
        """The forecaster `save` wrote into `path` (a leading `~` is the home folder).

        Takes no lock: a load that overlaps another process's save finds files of two
        runs, which the digests config.json records refuse (`RunFolderError` saying
        that the folder may be being saved: load again).
        """
        root = expanded(path)
        run_folder.check_not_a_file(root, "Forecaster.load:")
        if not root.is_dir():
            raise run_folder.RunFolderError(f"{root} is not a folder (Forecaster.load)")
        config_file = root / run_folder.CONFIG_FILE
        config = run_folder.read_json(config_file)
        if not isinstance(config, dict):
            raise run_folder.RunFolderError(
                f"{config_file} is damaged: it holds a JSON {type(config).__name__}, not an object"
            )
        version = run_folder.check_format(config, root)
        try:
            # A field deleted from a section would take its default without a word; one
            # that runs saved before it existed lack takes the value they were trained with.
            run_folder.check_complete(config, version)
            config = run_folder.complete_sections(
                config, {**SECTIONS, "tft_config": TFTConfig}, version
            )
            forecaster = cls.from_config(ForecasterConfig.from_json(config))
            tft_fields: dict[str, Any] = {
                key: tuple(value) if isinstance(value, list) else value
                for key, value in config["tft_config"].items()
            }
            tft_config = TFTConfig(**tft_fields)
            preprocessor = Preprocessor.from_json(
                config["preprocessor"],
                complete=version >= run_folder.COMPLETE_FROM_VERSION,
                format_version=version,
            )
            season_period = config["season_period"]
            # int() would truncate 7.9 to 7 and accept -1.
            if isinstance(season_period, bool) or not isinstance(season_period, int):
                raise ValueError(f"season_period must be an int >= 1, got {season_period!r}")
            if season_period < 1:
                raise ValueError(f"season_period must be an int >= 1, got {season_period!r}")
            names = run_folder.check_models(config, ("qat", "int8"), MODEL_NAMES)
            digests = run_folder.recorded_digests(config, names)  # None: saved before them
            summary = config.get("summary", {})
            if not isinstance(summary, dict):
                raise TypeError(f"summary must be an object, got {type(summary).__name__}")
            run_folder.check_tft_config(tft_config, forecaster.config)
            run_folder.check_preprocessor(preprocessor, tft_config, forecaster.config)
            run_folder.check_trained_windows(summary, forecaster.config)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise run_folder.RunFolderError(f"{config_file} is damaged: {error!r}") from None
        variables = {}
        expected = run_folder.model_param_shapes(tft_config)  # every form shares them
        bits = forecaster.config.integer_bits
        for name in names:
            path = run_folder.model_path(root, name)
            data = run_folder.read_model_bytes(path)
            variables[name] = run_folder.restore_variables(path, data)
            run_folder.check_params(variables[name], expected, path)
            run_folder.check_form(variables[name], name, tft_config, bits, path)
            # After the checks above, which say more of a file edited on purpose.
            if digests is not None:
                run_folder.check_model_digest(path, data, name, digests[name])
        # Checked against config.json's digest where recorded: another run's (a save
        # overlapping this load) loaded with this run's model otherwise.
        history = run_folder.read_history(root, config)
        forecaster._fitted = _Fitted(
            preprocessor=preprocessor,
            tft_config=tft_config,
            season_period=season_period,
            variables=variables,
            history=history,
            summary=summary,
            versions=versions if isinstance(versions := config.get("versions"), dict) else None,
            settings=_settings_record(forecaster.config),
        )
        return forecaster
