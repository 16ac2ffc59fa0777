"""The `tft-jax` command-line options: each flag named once, bound to a config field.

A flag's default and the range its help states come from the config
dataclass field it sets (`tft_jax.forecaster.config`), so argparse, the
`Forecaster`, `config.json` and the README cannot disagree. Errors that a
config raises name its field (`ModelConfig.hidden_dim`); `flag_message`
rewrites them with the flag (`--hidden-dim`).

A size or count flag (`--hidden-dim`, `--batch-size`, `--train-stride`, ...)
takes at most `MAX_COUNT` (2**31 - 1, the largest int32): larger values
only ever failed later, as an `OverflowError` deep inside NumPy or JAX.
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import math
import os
import pathlib
import re
import warnings
from collections.abc import Callable, Container, Sequence
from typing import Any

from tft_jax.caller_frame import user_stacklevel
from tft_jax.data import TARGET_SCALERS
from tft_jax.data.dataset import SPLITS
from tft_jax.data.scaling import TARGET_TRANSFORMS
from tft_jax.distributed import MultihostArgumentError, check_multihost_arguments
from tft_jax.experiments import ClippingSettings
from tft_jax.forecaster.config import (
    DEMO,
    MAX_SEED,
    SECTIONS,
    DataConfig,
    ForecasterConfig,
    ModelConfig,
    QATTrainingConfig,
    TrainingConfig,
    field_default,
)
from tft_jax.forecaster.predictors import MODEL_NAMES
from tft_jax.paths import expanded
from tft_jax.plots import MAX_FAN_SERIES


class UsageError(ValueError):
    """A command-line argument that cannot be used; printed without a traceback."""


def _bounded(
    kind: Callable[[str], Any],
    low: float,
    inclusive: bool,
    what: str,
    high: float | None = None,
    too_high: str | None = None,
) -> Callable[[str], Any]:
    """An argparse type: `kind(text)`, finite, >= `low` (> without `inclusive`), <= `high`.

    `too_high`: how a value above `high` is refused ('at most ...'), else as `what`.
    """

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        # NaN compares False with every bound: refused by name, as is inf.
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        if high is not None and value > high and too_high is not None:
            raise argparse.ArgumentTypeError(f"expected {too_high}, got {text}")
        if value < low or (not inclusive and value == low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value

    return parse


# The largest size or count a flag takes: an int32, as JAX shapes and NumPy indices need.
MAX_COUNT = 2**31 - 1
_AT_MOST_COUNT = f"an integer at most {MAX_COUNT} (2**31 - 1)"
positive_int = _bounded(int, 1, True, "an integer >= 1", MAX_COUNT, _AT_MOST_COUNT)
non_negative_int = _bounded(int, 0, True, "an integer >= 0", MAX_COUNT, _AT_MOST_COUNT)
any_positive_int = _bounded(int, 1, True, "an integer >= 1")  # a flag bounded after parsing
positive_float = _bounded(float, 0.0, False, "a finite number > 0")
non_negative_float = _bounded(float, 0.0, True, "a finite number >= 0")
seed_value = _bounded(int, 0, True, f"an integer in 0..{MAX_SEED} (2**32 - 3)", MAX_SEED)


def fraction(text: str) -> float:
    try:
        value = non_negative_float(text)
    except argparse.ArgumentTypeError:
        value = math.nan
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text}")
    return value


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """Seconds from `90s`, `3m`, `1.5h` or a plain number of seconds (> 0)."""
    match = _DURATION.fullmatch(text.strip().lower())
    seconds = 0.0 if match is None else float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0.0:
        raise argparse.ArgumentTypeError(
            f"expected a duration > 0 such as 90s, 3m, 1h or seconds, got {text!r}"
        )
    return seconds


def optional_duration(text: str) -> float | None:
    """`duration(text)`, or None for `none` (no limit)."""
    return None if text.strip().lower() == "none" else duration(text)


def fraction_or_one(text: str) -> float:
    try:
        value = non_negative_float(text)
    except argparse.ArgumentTypeError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text}")
    return value


def clip_norm_value(text: str) -> float | None:
    return None if text.strip().lower() == "none" else positive_float(text)


def encoding_name(text: str) -> str:
    """A `--encoding` Python knows ('utf-8', 'latin-1', ...), refused here by the flag's name.

    Unchecked, an unknown one is found only when the CSV is read, and that
    error names the CSV's flag (`--csv`), not `--encoding`.
    """
    try:
        codecs.lookup(text)
    except LookupError:
        raise argparse.ArgumentTypeError(
            f"unknown text encoding {text!r}; e.g. utf-8, latin-1, cp1252"
        ) from None
    return text


def compile_cache_value(text: str) -> str:
    """A `--compile-cache` folder (a leading `~` expanded, as `path_argument`) or 'none'.

    An empty path (the current folder) is refused.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder or 'none', got an empty path")
    if text.strip().lower() == "none":
        return text
    return str(path_argument(text))


def _check_parents(path: pathlib.Path, label: str) -> None:
    """Raises `UsageError` unless the nearest existing folder above `path` is writable."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{label} {path}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise UsageError(f"{label} {path}: cannot write in {parent} (permission denied)")
            return


def path_argument(text: str) -> pathlib.Path:
    """The argparse `type` of every path flag: a leading `~` is the home folder (`expanded`).

    The shell leaves a `~` unexpanded after `=` (`--out=~/run`) or in quotes;
    kept as typed, some components read it as the home folder (pandas, orbax)
    and others as a folder named `~` in the current one, so one run was split
    between the two. Expanded once, here, every component sees one path. An
    empty text (which `pathlib` reads as '.') is refused.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty one")
    return expanded(text)


def file_path_argument(example: str) -> Callable[[str], pathlib.Path]:
    """The argparse `type` of a flag naming one file to write: `path_argument`, no folder.

    A trailing separator (`--out results/`) names a folder; `pathlib` dropped
    it, and the command wrote a file named `results`. The refusal gives a
    file name in that folder (`example`, e.g. 'forecasts.csv').
    """

    def file_path(text: str) -> pathlib.Path:
        path = path_argument(text)
        if text.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)):
            raise argparse.ArgumentTypeError(
                f"{text!r} ends with {text[-1]!r}, so it names a folder, but this is the "
                f"file to write: give the file's name, e.g. {text}{example}"
            )
        return path

    file_path.__wrapped__ = path_argument  # type: ignore[attr-defined]  # a path_argument too
    return file_path


# Name endings that say a format other than the plain text written: read by
# them (pandas infers compression, and parquet readers), a file misleads.
_OTHER_FORMATS = {
    ".gz": "gzip-compressed", ".bz2": "bzip2-compressed", ".zip": "zip-compressed",
    ".xz": "xz-compressed", ".zst": "zstd-compressed", ".tar": "a tar archive",
    ".parquet": "Parquet", ".pq": "Parquet", ".feather": "Feather", ".arrow": "Arrow",
    ".xlsx": "an Excel workbook", ".xls": "an Excel workbook", ".pkl": "a pickle",
    ".pickle": "a pickle", ".h5": "HDF5", ".hdf5": "HDF5", ".npy": "NumPy",
    ".npz": "NumPy", ".csv": "CSV", ".tsv": "tab-separated", ".json": "JSON",
    ".jsonl": "JSON lines", ".png": "a PNG image",
}  # fmt: skip


def check_output_suffix(path: pathlib.Path, label: str, written: str) -> None:
    """Refuses or announces a file name `label` gives whose ending is not `written`'s.

    `written`: the ending of what is written, '.csv' (CSV text) or '.json'.
    An ending of another format (`.parquet`, `.csv.gz`: the text is written
    uncompressed) is refused, as a reader would take the file for that
    format; any other ending (`.txt`) is announced; no ending is fine.
    """
    path = pathlib.Path(path)
    suffix = path.suffix.lower()
    if not suffix or suffix == written:
        return
    what = _OTHER_FORMATS[written]
    plain = path.name[: len(path.name) - len(suffix)]
    if suffix in _OTHER_FORMATS:
        fix = plain if plain.lower().endswith(written) else f"{plain}{written}"
        raise UsageError(
            f"{label} {path}: a {suffix} name says {_OTHER_FORMATS[suffix]}, but the "
            f"command writes plain {what} text; give it a {written} name, e.g. "
            f"{path.with_name(fix)}"
        )
    warnings.warn(
        f"{label} {path}: written as {what} text, which its {suffix} name does not say "
        f"(a {written} name does)",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def describe_verb(flags: Sequence[str]) -> str:
    """'describes' after one flag, 'describe' after several: "--dayfirst describes a table"."""
    return "describes" if len(flags) == 1 else "describe"


def check_output_folder(path: pathlib.Path, label: str) -> None:
    """Raises `UsageError` (naming `label`, e.g. '--out') unless `path` can be a folder to write."""
    path = pathlib.Path(path)
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{label} {path}: is a file, not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{label} {path}: cannot write in it (permission denied)")
        return
    _check_parents(path, label)


def check_input_file(path: pathlib.Path, label: str) -> None:
    """Raises `UsageError` (naming `label`) unless `path` is a file that exists."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise UsageError(f"{label} {path}: is a folder, not a file")
    if not path.is_file():
        raise UsageError(f"{label} {path}: no such file")


def check_output_file(path: pathlib.Path, label: str) -> None:
    """Raises `UsageError` (naming `label`) unless `path` can be written as a file."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise UsageError(f"{label} {path}: is a folder, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{label} {path}: cannot write it (permission denied)")
    _check_parents(path, label)


GIVEN = "given_flags"


class _Store(argparse.Action):
    """argparse's `store`, noting the flag in `namespace.given_flags` (see `given_flags`)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given = getattr(namespace, GIVEN, ())
        if self.nargs in ("*", "+") and self.option_strings[0] in given:
            # "Last one wins" would drop the first list (columns, quantiles) without a word.
            parser.error(
                f"{self.option_strings[0]} given twice: list all its values after one "
                f"{self.option_strings[0]}"
            )
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, (*given, self.option_strings[0]))


def given_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags of `add_options` given on the command line (a default equal value included),
    each once, in order."""
    return tuple(dict.fromkeys(getattr(args, GIVEN, ())))


def column_list(values: Sequence[str] | None) -> tuple[str, ...]:
    """Column names given as separate words and/or comma-separated lists."""
    if not values:
        return ()
    return tuple(name.strip() for value in values for name in value.split(",") if name.strip())


@dataclasses.dataclass(frozen=True)
class Option:
    """One flag bound to `section.field` of the settings."""

    flag: str
    section: str
    field: str
    help: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def default(self, overrides: dict[str, Any]) -> Any:
        if self.flag in overrides:
            return overrides[self.flag]
        field = SECTIONS[self.section].__dataclass_fields__[self.field]
        return (
            None
            if field.default is dataclasses.MISSING
            else field_default(SECTIONS[self.section], self.field)
        )


def _columns(help_text: str) -> dict[str, Any]:
    return {"nargs": "*", "default": None, "metavar": "COL", "help": help_text}


DATA_OPTIONS = (
    Option("--id-col", "data", "id_col", "series id column (required with --csv)"),
    Option("--time-col", "data", "time_col", "time column (required with --csv)"),
    Option("--target", "data", "target", "column to forecast (required with --csv)"),
    Option("--static-cols", "data", "static_cols",
           "columns constant per series (numbers real-valued, text categorical)",
           {"nargs": "*", "metavar": "COL"}),
    Option("--known-cols", "data", "known_cols",
           "columns known in advance (calendar inputs are generated)",
           {"nargs": "*", "metavar": "COL"}),
    Option("--observed-cols", "data", "observed_cols",
           "columns known only up to the forecast start", {"nargs": "*", "metavar": "COL"}),
    Option("--freq", "data", "freq",
           "pandas frequency alias, e.g. h, D, 15min, W, MS (required with --csv)"),
    Option("--timezone", "data", "timezone", "IANA zone calendar inputs are read in"),
    Option("--history", "data", "history",
           "history length T in steps (>= 2 with window normalization)", {"type": positive_int}),
    Option("--horizon", "data", "horizon", "forecast horizon H in steps", {"type": positive_int}),
    Option("--validation-fraction", "data", "validation_fraction",
           "share of the time span for validation", {"type": fraction}),
    Option("--test-fraction", "data", "test_fraction",
           "share of the time span for testing, at the end", {"type": fraction}),
    Option("--validation-start", "data", "validation_start",
           "first time of the validation period (with --test-start, instead of the fractions)",
           {"metavar": "TIMESTAMP"}),
    Option("--test-start", "data", "test_start",
           "first time of the test period (with --validation-start)", {"metavar": "TIMESTAMP"}),
    Option("--scaler", "data", "scaler", "per-series target scaling",
           {"choices": TARGET_SCALERS}),
    Option("--target-transform", "data", "target_transform",
           "transform of the target before scaling (log1p: counts, multiplicative growth)",
           {"choices": TARGET_TRANSFORMS}),
    Option("--window-normalization", "data", "window_normalization",
           "also scale each window by its own history (series whose level moves); "
           "--no-window-normalization: the per-series scaler alone",
           {"action": argparse.BooleanOptionalAction}),
    Option("--nonnegative", "data", "nonnegative",
           "clip forecasts at 0 (counts, quantities that cannot be negative)",
           {"action": "store_true"}),
    Option("--require-observed-target", "data", "require_observed_target",
           "leave out every window whose forecast horizon holds a missing (filled) target; "
           "--no-require-observed-target: keep those with an observed step, the filled steps left "
           "out of the loss and of every score", {"action": argparse.BooleanOptionalAction}),
    Option("--train-stride", "data", "train_stride", "keep every n-th training window per series",
           {"type": positive_int}),
    Option("--categorical-cols", "data", "categorical_cols",
           "integer-coded inputs that are categorical (inputs holding text are categorical)",
           {"nargs": "*", "metavar": "COL"}),
    Option("--time-format", "data", "time_format",
           "strftime format of the time column, e.g. %%d/%%m/%%Y (default: inferred)"),
    Option("--dayfirst", "data", "dayfirst", "read dates such as 01/02/2024 as day first",
           {"action": "store_true"}),
    Option("--encoding", "data", "encoding", "text encoding of the CSV files",
           {"type": encoding_name}),
    Option("--max-missing-fraction", "data", "max_missing_fraction",
           "refuse a series whose missing target steps exceed this share of its grid",
           {"type": fraction_or_one}),
    Option("--min-series-length", "data", "min_series_length",
           "leave out series shorter than this (always: shorter than history + horizon)",
           {"type": positive_int}),
    Option("--season-period", "data", "season_period",
           "seasonal naive period in steps (default from --freq: 24 hourly, 7 daily, "
           "5 business-daily, 52 weekly, 12 monthly, 4 quarterly)", {"type": positive_int}),
)  # fmt: skip
MODEL_OPTIONS = (
    Option("--hidden-dim", "model", "hidden_dim", "model width D (>= 3)", {"type": positive_int}),
    Option("--heads", "model", "num_heads", "attention heads, dividing --hidden-dim",
           {"type": positive_int}),
    Option("--dropout", "model", "dropout_rate", "dropout", {"type": fraction}),
    Option("--variable-hidden-dim", "model", "variable_hidden_dim",
           "width of each input variable's GRN (default: --hidden-dim)", {"type": positive_int}),
    Option("--compact-selection", "model", "compact_selection",
           "selection GRNs of width min(--hidden-dim, variables), as pytorch-forecasting",
           {"action": "store_true"}),
    Option("--quantiles", "model", "quantiles",
           "quantile levels, must include 0.5 and 0.9", {"type": float, "nargs": "+"}),
)  # fmt: skip
TRAINING_OPTIONS = (
    Option("--epochs", "training", "epochs", "passes over the training windows",
           {"type": positive_int}),
    Option("--max-steps", "training", "max_steps", "stop after this many steps",
           {"type": positive_int}),
    Option("--time-budget", "training", "time_budget",
           "stop FP32 training after this long (90s, 3m, 1h or seconds; 'none': no limit), "
           "compilation included; the learning-rate schedule is fitted to it, and the final "
           "evaluation and checkpoint follow",
           {"type": optional_duration, "metavar": "DURATION"}),
    Option("--batch-size", "training", "batch_size", "global batch", {"type": positive_int}),
    Option("--lr", "training", "learning_rate",
           "peak learning rate of the warmup + cosine schedule", {"type": positive_float}),
    Option("--warmup-steps", "training", "warmup_steps",
           "linear warmup steps (default: 5%% of the steps, at most 200)",
           {"type": non_negative_int}),
    Option("--clip-norm", "training", "clip_norm",
           "clip_by_global_norm threshold; 'none' disables", {"type": clip_norm_value}),
    Option("--weight-decay", "training", "weight_decay", "AdamW weight decay",
           {"type": non_negative_float}),
    Option("--patience", "training", "patience",
           "early stopping: evaluations without improvement (default: none)",
           {"type": positive_int}),
    Option("--eval-every", "training", "eval_every",
           "steps between validation evaluations (default: once per epoch)",
           {"type": positive_int}),
    Option("--val-windows", "training", "validation_windows",
           "validation windows per evaluation, evenly spaced", {"type": positive_int}),
    Option("--seed", "training", "seed", "random seed", {"type": seed_value}),
)  # fmt: skip
QAT_OPTIONS = (
    Option("--qat-steps", "qat", "steps", "QAT fine-tuning steps", {"type": positive_int}),
    Option("--qat-time-budget", "qat", "time_budget",
           "stop QAT fine-tuning after this long (90s, 3m, 1h or seconds; 'none': no limit), "
           "compilation included; its schedule is fitted to it",
           {"type": optional_duration, "metavar": "DURATION"}),
    Option("--qat-lr", "qat", "learning_rate", "peak QAT learning rate", {"type": positive_float}),
    Option("--qat-calibration-batches", "qat", "calibration_batches",
           "training batches the activation observers see before QAT", {"type": positive_int}),
    Option("--qat-observer-steps", "qat", "observer_steps",
           "first QAT steps during which the observers keep updating (0: frozen after "
           "calibration)", {"type": non_negative_int}),
    Option("--qat-bits", "qat", "bits", "integer width",
           {"type": int, "choices": range(2, 9), "metavar": "{2..8}"}),
)  # fmt: skip
EVAL_BATCH = Option(
    "--eval-batch-size",
    "training",
    "eval_batch_size",
    "windows per batch when predicting, and when validating in one process where it divides "
    "over the devices (else validation uses --batch-size)",
    {"type": positive_int},
)
ALL_OPTIONS = (*DATA_OPTIONS, *MODEL_OPTIONS, *TRAINING_OPTIONS, *QAT_OPTIONS, EVAL_BATCH)


def add_options(
    group: Any, options: Sequence[Option], overrides: dict[str, Any] | None = None
) -> None:
    """Adds `options` to an argparse group, defaults from the config fields (or `overrides`)."""
    overrides = overrides or {}
    for option in options:
        default = option.default(overrides)
        kwargs = dict(option.kwargs)
        text = option.help
        if overrides.get(option.flag) is not None:  # stated below, instead of the config's
            text = re.sub(r"\s*\(default[^)]*\)", "", text)
        if kwargs.get("action") is argparse.BooleanOptionalAction:
            # argparse (3.11+) does not state it: which of the two forms is the default.
            text = f"{text} (default {option.flag if default else '--no-' + option.flag[2:]})"
        elif kwargs.get("action") != "store_true" and default not in (None, ()):
            shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
            text = f"{text} (default {shown})"
        if kwargs.get("nargs") in ("*", "+") and isinstance(default, tuple):
            default = list(default)
        kwargs.setdefault("action", _Store)  # `given_flags` tells a flag from its default
        group.add_argument(option.flag, default=default, help=text, **kwargs)


def section_values(args: argparse.Namespace, section: str) -> dict[str, Any]:
    """The fields of `section` that flags of `args` set."""
    values = {}
    for option in ALL_OPTIONS:
        if option.section == section and hasattr(args, option.dest):
            value = getattr(args, option.dest)
            if option.field in ("static_cols", "known_cols", "observed_cols", "categorical_cols"):
                value = column_list(value)
            elif isinstance(value, list):
                value = tuple(value)
            values[option.field] = value
    return values


_FIELD = re.compile(r"\b(DataConfig|ModelConfig|TrainingConfig|QATTrainingConfig)\.(\w+)")
_OWNER = {cls.__name__: section for section, cls in SECTIONS.items()}
_OWNER_PREFIX = re.compile(r"^(DataConfig|ModelConfig|TrainingConfig|QATTrainingConfig): ")


def _data_keyword(match: re.Match[str], available: Container[str] | None) -> str:
    """`validation_start` or `freq=` of a data-layer message as its flag, else unchanged.

    Only flags whose destination is in `available` (None: every flag).
    """
    name, equals = match.group(1), match.group(2)
    for option in ALL_OPTIONS:
        if option.section != "data" or option.field != name or not ("_" in name or equals):
            continue
        if available is None or option.dest in available:
            return option.flag + (" " if equals else "")
    return match.group(0)


# A data-layer keyword: a snake_case name, or any name followed by '=' (e.g. `freq='D'`).
_KEYWORD = re.compile(r"(?<![\w.\-\[\'\"])([a-z]+(?:_[a-z]+)*)(=?)(?![\w(\]])")


# A data-layer keyword with its value and the flag that says the same, in brackets:
# "dayfirst=True (--dayfirst)", "time_format='%d/%m/%Y' (--time-format)".
_PAIR = re.compile(r"\b([a-z]+(?:_[a-z]+)*)=('[^']*'|[^\s,;()]+) \((--[\w-]+)([^()]*)\)")


def _flag_of_pair(match: re.Match[str], available: Container[str] | None) -> str:
    """The command-line half of a `keyword=value (--flag ...)` pair, said once.

    `(--encoding latin-1)` is the whole flag; a bare `(--time-format)` takes
    the keyword's value, and `dayfirst=True (--dayfirst)` (a switch) is the flag
    alone. A pair whose flag the command lacks, or that is not the keyword's,
    stays as it is.
    """
    name, value, flag, rest = match.groups()
    for option in ALL_OPTIONS:
        if option.section != "data" or option.field != name or option.flag != flag:
            continue
        if available is not None and option.dest not in available:
            break
        if rest.strip():
            return flag + rest
        if option.kwargs.get("action") in ("store_true", argparse.BooleanOptionalAction):
            return flag if value == "True" else match.group(0)
        return f"{flag} {value}"
    return match.group(0)


# A switch setting with its value: `DataConfig.nonnegative=True`, `set nonnegative=False`.
_SWITCH = re.compile(
    r"\b(set )?(?:(?:DataConfig|ModelConfig|TrainingConfig|QATTrainingConfig)\.)?"
    r"([a-z]+(?:_[a-z]+)*)=(True|False)\b"
)


def _flag_of_switch(match: re.Match[str], available: Container[str] | None) -> str:
    """A switch setting as the command line says it.

    `field=True` is the flag; `field=False` is `--no-FLAG` for a flag that has one,
    and 'set field=False' of a plain switch is 'leave out FLAG'. Any other stays.
    """
    setting, name, value = match.groups()
    for option in ALL_OPTIONS:
        action = option.kwargs.get("action")
        if option.field != name or action not in ("store_true", argparse.BooleanOptionalAction):
            continue
        if available is not None and option.dest not in available:
            break
        if value == "True":
            return (setting or "") + option.flag
        if action is argparse.BooleanOptionalAction:
            return (setting or "") + "--no-" + option.flag[2:]
        if setting:
            return f"leave out {option.flag}"
        break
    return match.group(0)


# Library advice in words, and the flag that follows it: 'lower the batch size'.
_ADVICE = (
    ("lower the batch size", "batch_size", "lower --batch-size"),
    ("raise the validation fraction", "validation_fraction", "raise --validation-fraction"),
    ("shorten history/horizon", "history", "shorten --history/--horizon"),
)


def flag_message(message: str, available: Container[str] | None = None) -> str:
    """A config or data error with each `Config.field`, and each data-layer keyword
    (`validation_start`, `freq=`), replaced by the flag that sets it; a
    keyword given with its flag (`dayfirst=True (--dayfirst)`) is said once.

    `available`: the destinations of the running command's flags (`vars(args)`);
    a keyword whose flag the command lacks stays as it is.
    """

    def flag(match: re.Match[str]) -> str:
        section, field = _OWNER[match.group(1)], match.group(2)
        for option in ALL_OPTIONS:
            if option.section == section and option.field == field:
                return option.flag
        return match.group(0)

    # 'DataConfig: give both ...' names a class a command-line user never wrote.
    message = _OWNER_PREFIX.sub("", message).replace("ForecasterConfig.qat", "--qat")
    message = _PAIR.sub(lambda m: _flag_of_pair(m, available), message)
    message = _SWITCH.sub(lambda m: _flag_of_switch(m, available), message)
    for words, dest, flagged in _ADVICE:
        if available is None or dest in available:
            message = message.replace(words, flagged)
    flagged = _KEYWORD.sub(lambda m: _data_keyword(m, available), _FIELD.sub(flag, message))
    return re.sub(r"(--[\w-]+)\s+\(\1\)", r"\1", flagged)  # 'timezone= (--timezone)'


def forecaster_config(args: argparse.Namespace, qat: bool) -> ForecasterConfig:
    """The settings the parsed arguments describe; the bundled data without `--csv`."""
    check_batch_flags(args)  # flags that contradict each other: before any file is looked at
    check_time_flags(args)
    data_values = section_values(args, "data")
    table_flags = ("id_col", "time_col", "target", "freq")
    if getattr(args, "csv", None) is None:
        # By the flag (`--encoding utf-8` too) or the value (`--dayfirst`, a `store_true`
        # that `given_flags` does not record): each would be dropped without a word.
        flags = given_flags(args)
        given = [
            option.flag
            for option in DATA_OPTIONS
            if option.field
            in ("id_col", "time_col", "target", "freq", "static_cols", "known_cols",
                "observed_cols", "timezone", "categorical_cols", "time_format", "dayfirst",
                "encoding")
            and (option.flag in flags or data_values.get(option.field) != option.default({}))
        ]  # fmt: skip
        if given:
            raise UsageError(
                f"{', '.join(given)} {describe_verb(given)} a table but no --csv was given; "
                "pass --csv PATH (without --csv the bundled pedestrian data is used)"
            )
        for name in (
            *table_flags,
            "static_cols",
            "known_cols",
            "observed_cols",
            "timezone",
            "categorical_cols",
            "time_format",
            "dayfirst",
            "encoding",
        ):
            data_values.pop(name)
        make_data: Callable[..., DataConfig] = DataConfig.pedestrian
    else:
        missing = [
            option.flag
            for option in DATA_OPTIONS
            if option.field in table_flags and not data_values.get(option.field)
        ]
        empty = [flag for flag in missing if flag in given_flags(args)]
        if empty:
            raise UsageError(f"{empty[0]}: expected a value, got an empty one")
        if missing:
            raise UsageError(f"--csv needs {', '.join(missing)} as well")
        check_input_file(args.csv, "--csv")
        make_data = DataConfig
    try:
        config = ForecasterConfig(
            data=make_data(**data_values),
            model=ModelConfig(**section_values(args, "model")),
            training=TrainingConfig(**section_values(args, "training")),
            qat=QATTrainingConfig(**section_values(args, "qat")) if qat else None,
        )
    except (ValueError, TypeError) as error:
        raise UsageError(flag_message(str(error), vars(args))) from None
    check_split_flags(config.data, given_flags(args))
    return config


def check_batch_flags(args: argparse.Namespace) -> None:
    """Raises `UsageError` naming `--batch-size` when it exceeds a default `--val-windows`.

    Validation runs in whole batches, so the validation windows must fill one;
    the config's error names both settings, and blamed the `--val-windows`
    the user never gave for the `--batch-size` they did.
    """
    batch, windows = getattr(args, "batch_size", None), getattr(args, "val_windows", None)
    if batch is None or windows is None or "--val-windows" in given_flags(args):
        return
    if batch > windows:
        raise UsageError(
            f"--batch-size {batch} is more than the --val-windows {windows} (the default): "
            f"validation runs in whole batches; lower --batch-size to at most {windows}, "
            f"or raise --val-windows to at least {batch}"
        )


def check_time_flags(args: argparse.Namespace) -> None:
    """Raises `UsageError` for `--dayfirst` given with `--time-format`.

    A format reads each date as it says, so `--dayfirst` would be ignored
    without a word (as `check_split_flags` refuses fractions the cut times replace).
    """
    if getattr(args, "time_format", None) is not None and getattr(args, "dayfirst", None):
        raise UsageError(
            f"--dayfirst and --time-format {args.time_format!r} contradict each other: the "
            "format says where the day is, and --dayfirst would be ignored; pass one or the other"
        )


def check_split_flags(data: DataConfig, given: Container[str]) -> None:
    """Raises `UsageError` for a split fraction given together with the cut times.

    The cut times replace the fractions, so a `--validation-fraction` or
    `--test-fraction` given with them would be ignored without a word (as a
    `--qat-*` flag without `--qat` would: `check_train_flags`).
    """
    if data.validation_start is None:
        return
    fractions = [flag for flag in ("--validation-fraction", "--test-fraction") if flag in given]
    if fractions:
        raise UsageError(
            f"{', '.join(fractions)} and --validation-start/--test-start contradict each "
            "other: the cut times replace the fractions; pass one or the other"
        )


def check_train_flags(args: argparse.Namespace) -> None:
    """Raises `UsageError` for contradictory `tft-jax train` flags (before any work)."""
    if args.resume and args.overwrite:
        raise UsageError(
            "--resume and --overwrite contradict each other: --resume continues the run in "
            "--out, --overwrite deletes its checkpoints to start over; pass one of them"
        )
    if not args.qat:
        qat_flags = {option.flag for option in QAT_OPTIONS}
        given = [flag for flag in given_flags(args) if flag in qat_flags]
        if given:
            raise UsageError(
                f"{', '.join(given)} given without --qat, which they configure; pass --qat "
                "to fine-tune with QAT, or drop them"
            )


DEFAULT_CACHE = expanded(os.environ.get("XDG_CACHE_HOME", "~/.cache"))
DEFAULT_COMPILE_CACHE = DEFAULT_CACHE / "tft-jax" / "jax"
CLIPPING_DEFAULTS = {
    "--history": 48,
    "--horizon": 24,
    "--hidden-dim": 16,
    "--heads": 2,
    "--variable-hidden-dim": 8,
}


def demo_argv() -> list[str]:
    """The `tft-jax train` arguments of the demo (`tft_jax.forecaster.DEMO`)."""
    argv = ["--qat"]
    sections = dataclasses.asdict(DEMO)
    for option in (*DATA_OPTIONS, *MODEL_OPTIONS, *TRAINING_OPTIONS, *QAT_OPTIONS):
        value = sections[option.section][option.field]
        if option.field in ("id_col", "time_col", "target", "freq", "timezone"):
            continue  # the bundled table is the default data
        if value == option.default({}) or value == ():
            continue
        if value is None:  # a limit the demo turns off ('none': see optional_duration)
            argv.append(f"{option.flag}=none")
            continue
        if option.kwargs.get("action") is argparse.BooleanOptionalAction:
            argv.append(option.flag if value else f"--no-{option.flag[2:]}")
            continue
        if option.kwargs.get("action") == "store_true":  # on: its default is off
            argv.append(option.flag)
            continue
        argv += (
            [option.flag, *map(str, value)]
            if isinstance(value, tuple)
            else [f"{option.flag}={value}"]
        )
    return argv


RUN_EVAL_BATCH = dataclasses.replace(
    EVAL_BATCH, help="windows per batch when predicting (default: the run's --eval-batch-size)"
)


def _runtime(
    parser: argparse.ArgumentParser, reads_run: bool = False, predicts: bool = True
) -> None:
    """`--quiet`, `--compile-cache`, and `--eval-batch-size` for a command that predicts."""
    group = parser.add_argument_group("runtime")
    group.add_argument("--quiet", action="store_true", help="no progress bars")
    group.add_argument(
        "--compile-cache",
        type=compile_cache_value,
        default=str(DEFAULT_COMPILE_CACHE),
        help=f"persistent XLA compilation cache, or 'none' (default {DEFAULT_COMPILE_CACHE})",
    )
    if reads_run:
        add_options(group, [RUN_EVAL_BATCH], {RUN_EVAL_BATCH.flag: None})
    elif predicts:
        add_options(group, [EVAL_BATCH])


READING_FIELDS = ("encoding", "dayfirst", "time_format")


def _reading(parser: argparse.ArgumentParser) -> None:
    """`--encoding`, `--dayfirst`, `--time-format` of the CSVs a run-reading command is given."""
    group = parser.add_argument_group(
        "reading the given CSV files", "default: as the run read its training table"
    )
    group.add_argument(
        "--encoding",
        type=encoding_name,
        default=None,
        help="text encoding of the CSV files (default: the run's)",
    )
    group.add_argument(
        "--dayfirst",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read dates such as 01/02/2024 as day first (default: the run's)",
    )
    group.add_argument(
        "--time-format",
        default=None,
        help="strftime format of the time column, e.g. %%d/%%m/%%Y (default: the run's)",
    )


def _run_argument(parser: argparse.ArgumentParser, table_help: str) -> None:
    parser.add_argument("--run", type=path_argument, required=True, help="a `tft-jax train` folder")
    parser.add_argument("--csv", type=path_argument, help=table_help)


def _model_choice(parser: argparse.ArgumentParser, default_help: str) -> None:
    parser.add_argument("--model", choices=MODEL_NAMES, help=default_help)


def build_parser() -> argparse.ArgumentParser:
    """The `tft-jax` argument parser."""
    parser = argparse.ArgumentParser(
        prog="tft-jax",
        description="Temporal Fusion Transformer in JAX: train, quantize, evaluate, forecast.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser(
        "train",
        help="train the TFT (and with --qat quantize it)",
        description="Train the FP32 TFT, optionally fine-tune with QAT and convert to int8; "
        "evaluate on the test split and plot.",
    )
    data = train.add_argument_group(
        "data", "a long-format table (default: the bundled Melbourne pedestrian counts)"
    )
    data.add_argument("--csv", type=path_argument, help="long-format CSV, one row per series/time")
    add_options(data, DATA_OPTIONS)
    add_options(train.add_argument_group("model"), MODEL_OPTIONS)
    group = train.add_argument_group("training")
    add_options(group, TRAINING_OPTIONS)
    group.add_argument(
        "--out",
        type=path_argument,
        default=pathlib.Path("runs/latest"),
        help="output folder (default runs/latest)",
    )
    group.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest intact checkpoint",
    )
    group.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the files of an earlier run in --out (its checkpoints, models, "
        "plots, config, history, metrics and forecasts; other files stay) once the table "
        "has passed its checks, just before training starts",
    )
    group = train.add_argument_group("quantization-aware training")
    group.add_argument(
        "--qat",
        action="store_true",
        help="after FP32 training: QAT fine-tuning, then int8 conversion",
    )
    add_options(group, QAT_OPTIONS)
    _runtime(train)
    group = train.add_argument_group(
        "distributed",
        "one process per host, all three flags together (jax.distributed.initialize); "
        "--batch-size is the global batch, divisible by the total device count",
    )
    group.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0")
    group.add_argument("--num-processes", type=positive_int, metavar="N", help="processes")
    group.add_argument("--process-id", type=non_negative_int, metavar="I", help="0..N-1")

    predict = commands.add_parser(
        "predict",
        help="forecast the steps after the end of a table",
        description="Quantile forecasts of the H steps after each series' last time in --csv "
        "(columns: id, time, q<level>, in the target's units).",
    )
    predict.add_argument(
        "--run", type=path_argument, required=True, help="a `tft-jax train` folder"
    )
    predict.add_argument("--csv", type=path_argument, required=True, help="history, long format")
    predict.add_argument(
        "--future-csv",
        type=path_argument,
        help="known columns for the H steps after each series' end",
    )
    predict.add_argument(
        "--out",
        type=file_path_argument("forecasts.csv"),
        required=True,
        help="forecasts CSV to write",
    )
    _model_choice(predict, "default: int8 when the run has it, else fp32")
    _reading(predict)
    _runtime(predict, reads_run=True)

    where_plots = (
        " (into RUN/plots for the run's table and test split, RUN/plots/<split> for another "
        "split, RUN/plots/<split>_<CSV name> for a --csv table the run was not trained on)"
    )
    for name, text, more in (
        ("evaluate", "recompute the metrics of a run (any split), or score another table", ""),
        ("forecast", "write a CSV of the forecasts of a split's windows, with actuals", ""),
        ("plot", "redraw a run's plots, and the forecast after the end of the table", where_plots),
    ):
        sub = commands.add_parser(name, help=text, description=text + more)
        _run_argument(sub, "the table (default: the one the run was trained on)")
        sub.add_argument("--split", choices=SPLITS, default="test", help="default test")
        _reading(sub)
        _runtime(sub, reads_run=True)
        if name == "evaluate":
            sub.add_argument(
                "--output",
                type=file_path_argument("metrics.json"),
                help="metrics JSON (default RUN/metrics.json for the test split, "
                "RUN/metrics_<split>.json for another; RUN/metrics_<split>_<CSV name>.json "
                "for a --csv table the run was not trained on)",
            )
        if name == "forecast":
            _model_choice(sub, "default: int8 when the run has it, else fp32")
            sub.add_argument(
                "--output",
                type=file_path_argument("forecasts.csv"),
                help="CSV path (default RUN/forecasts_<model>_<split>.csv; "
                "RUN/forecasts_<model>_<split>_<CSV name>.csv for a --csv table the run was "
                "not trained on)",
            )
        if name == "plot":
            _model_choice(sub, "model whose attention, weights and future are drawn (default fp32)")
            sub.add_argument(
                "--future-csv",
                type=path_argument,
                help="known columns after the table's end (models with known columns)",
            )
            sub.add_argument(
                "--series",
                nargs="+",
                metavar="ID",
                help=f"series of the fan and future charts (default: the first {MAX_FAN_SERIES})",
            )

    demo = commands.add_parser(
        "demo",
        help="the whole pipeline on the pedestrian data",
        description="Train, QAT fine-tune, convert to int8, evaluate and plot on the bundled "
        "pedestrian counts with settings that run in minutes on two CPU cores.",
    )
    demo.add_argument(
        "--out",
        type=path_argument,
        default=pathlib.Path("runs/demo"),
        help="output folder (default runs/demo)",
    )
    _runtime(demo)

    experiment = commands.add_parser("experiment", help="experiments")
    kinds = experiment.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    clipping = kinds.add_parser(
        "clipping",
        help="QAT at an aggressive learning rate with and without gradient clipping",
        description="QAT training from scratch at an aggressive constant learning rate, with "
        "clip_by_global_norm and without, over several seeds: loss curves, diverged runs, "
        "final validation loss.",
    )
    data = clipping.add_argument_group("data")
    data.add_argument("--csv", type=path_argument, help="long-format CSV, one row per series/time")
    # It scores no forecast: a seasonal naive period or clipping at 0 would do nothing.
    unused = ("--season-period", "--nonnegative")
    add_options(
        data, [option for option in DATA_OPTIONS if option.flag not in unused], CLIPPING_DEFAULTS
    )
    add_options(clipping.add_argument_group("model"), MODEL_OPTIONS, CLIPPING_DEFAULTS)
    add_options(clipping, [option for option in QAT_OPTIONS if option.flag == "--qat-bits"])
    defaults = ClippingSettings()
    for flag, kind, value, text in (
        # Bounded by `cli_experiments.MAX_SEEDS`, which its refusal names.
        ("--seeds", any_positive_int, len(defaults.seeds), "runs per arm, seeds 0..N-1"),
        ("--steps", positive_int, defaults.steps, "training steps per run"),
        ("--lr", positive_float, defaults.learning_rate, "constant learning rate"),
        ("--clip-norm", positive_float, defaults.clip_norm, "threshold of the clipped arm"),
        ("--batch-size", positive_int, defaults.batch_size, "batch size"),
        ("--eval-every", positive_int, defaults.eval_every, "steps between recorded points"),
        ("--calibration-steps", non_negative_int, None, "steps observers update (default all)"),
        (
            "--explode-factor",
            positive_float,
            defaults.explode_factor,
            "divergence: a training or validation loss above this times its value before training",
        ),
        ("--val-windows", positive_int, defaults.validation_windows, "validation windows"),
    ):
        shown = "" if value is None else f" (default {value})"
        clipping.add_argument(flag, type=kind, default=value, help=text + shown, action=_Store)
    clipping.add_argument(
        "--out",
        type=path_argument,
        default=pathlib.Path("runs/clipping"),
        help="output folder (default runs/clipping); the clipping.json and clipping.png of an "
        "earlier experiment there are replaced, as the experiment says when it starts",
    )
    # Its validation batches are its --batch-size: an --eval-batch-size would do nothing.
    _runtime(clipping, predicts=False)
    return parser


def multihost_arguments(args: argparse.Namespace) -> tuple[str, int, int] | None:
    """`(coordinator, num_processes, process_id)` of a multi-host run, None for one process."""
    flags: dict[str, Any] = {  # the parsed values; None where not given
        "coordinator": getattr(args, "coordinator", None),
        "num_processes": getattr(args, "num_processes", None),
        "process_id": getattr(args, "process_id", None),
    }
    given = [_flag(name) for name, value in flags.items() if value is not None]
    if not given:
        return None
    missing = [_flag(name) for name, value in flags.items() if value is None]
    if missing:
        raise UsageError(
            f"{', '.join(given)} without {', '.join(missing)}: a multi-host run needs "
            "--coordinator, --num-processes and --process-id together"
        )
    coordinator, processes, index = flags.values()
    try:
        check_multihost_arguments(coordinator, processes, index)
    except MultihostArgumentError as error:
        raise UsageError(f"{_flag(error.argument)} {error.detail}") from None
    return coordinator, processes, index


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
