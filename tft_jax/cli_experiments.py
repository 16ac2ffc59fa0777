"""`tft-jax experiment clipping`: QAT at an aggressive learning rate, with and without clipping.

The experiment itself is `tft_jax.experiments.clipping_experiment`; this
module reads its flags, runs it on the chosen table and writes
`clipping.json` and `clipping.png`, replacing (and saying so) those of an
earlier experiment in the same `--out`. `clipping.json` is strict JSON with the
non-finite floats as the strings `"nan"`, `"inf"` and `"-inf"` (a diverged
run's loss or gradient norm: null would not tell NaN from inf); null is a
value that does not exist (a summary over no finite run).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import re
import warnings
from typing import Any

import numpy as np

from tft_jax import plots
from tft_jax.caller_frame import user_stacklevel
from tft_jax.cli_parser import (
    UsageError,
    check_batch_flags,
    check_output_folder,
    flag_message,
    forecaster_config,
    given_flags,
)
from tft_jax.config import TFTConfig
from tft_jax.data import PreparedDataset, load_pedestrian, prepare_dataset, read_table
from tft_jax.experiments import ClippingSettings, check_splits, clipping_experiment
from tft_jax.folder_lock import folder_locked
from tft_jax.forecaster.config import ForecasterConfig
from tft_jax.forecaster.predictors import qat_model_for
from tft_jax.forecaster.run_folder import write_json

# The flag that sets each `ClippingSettings` field, for its error messages.
_SETTING_FLAGS = {
    "learning_rate": "--lr",
    "clip_norm": "--clip-norm",
    "seeds": "--seeds",
    "steps": "--steps",
    "batch_size": "--batch-size",
    "eval_every": "--eval-every",
    "calibrate_steps": "--calibration-steps",
    "explode_factor": "--explode-factor",
    "validation_windows": "--val-windows",
}

# The most runs per arm `--seeds` asks for: each trains a model from scratch (minutes), and
# the seeds are listed before the experiment starts (3e9 of them filled the memory).
MAX_SEEDS = 10_000

# What the experiment writes in `--out`.
OUTPUT_FILES = ("clipping.json", "clipping.png")


def _setting_flags(message: str) -> str:
    """`message` with each `ClippingSettings.field` replaced by the flag that sets it."""
    return re.sub(
        r"ClippingSettings\.(\w+)",
        lambda match: _SETTING_FLAGS.get(match.group(1), match.group(0)),
        message,
    )


def _clipping_settings(args: argparse.Namespace) -> ClippingSettings:
    """The experiment's settings from the flags; a `UsageError` naming the flag if invalid.

    An `--eval-every` above `--steps` records one point per run, after its
    last step: it is recorded as `--steps`, the interval that took effect,
    with a warning (a repair is said, as `train` says its own), which says
    whether the interval was the user's or the default.
    """
    check_batch_flags(args)  # a default --val-windows is not the user's doing
    # Before listing the seeds: `tuple(range(3_000_000_000))` fills the memory.
    if args.seeds > MAX_SEEDS:
        raise UsageError(
            f"--seeds must be at most {MAX_SEEDS} (runs per arm, each training a model from "
            f"scratch), got {args.seeds}"
        )
    try:
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
    except ValueError as error:
        raise UsageError(_setting_flags(str(error))) from None
    if args.eval_every > args.steps:
        given = (
            f"--eval-every {args.eval_every} is"
            if "--eval-every" in given_flags(args)
            else f"the default --eval-every {args.eval_every} is"
        )
        warnings.warn(
            f"{given} more than --steps {args.steps}: each run records one point, after its "
            f"last step (--eval-every {args.steps})",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    return settings


def _check_outputs(out: pathlib.Path) -> None:
    """Raises `UsageError` if a file the experiment writes in `out` is a folder.

    Found after training, the write failed naming its temporary file.
    """
    for name in OUTPUT_FILES:
        path = pathlib.Path(out) / name
        if path.is_dir():
            raise UsageError(
                f"--out {out}: {path} is a folder, not a file; the experiment writes "
                f"{' and '.join(OUTPUT_FILES)} there: remove it or choose another --out"
            )


def _announce_replaced(out: pathlib.Path) -> None:
    """Says which results of an earlier experiment in `out` this one replaces.

    As `tft-jax demo` says it replaces an earlier demo run: the folder is
    the experiment's own (its default, runs/clipping, is reused by every
    run of it), so the results are replaced rather than refused.
    """
    earlier = [name for name in OUTPUT_FILES if (pathlib.Path(out) / name).is_file()]
    if earlier:
        print(
            f"tft-jax experiment clipping: replacing the earlier results in {out} "
            f"({', '.join(earlier)})",
            flush=True,
        )


def _make_out(out: pathlib.Path) -> None:
    """Creates `out` before the runs (minutes), so that one it cannot be fails at once.

    A path the checks cannot foresee (one in /proc, say) was found only when
    writing the results, with an error naming no flag.
    """
    try:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        failed = "it" if error.filename is None else error.filename
        raise UsageError(
            f"--out {out}: creating {failed} failed: {error.strerror or error}"
        ) from None


def _non_finite_as_strings(value: Any) -> Any:
    """`value` with each NaN, inf and -inf float, nested in dicts and lists, as a string.

    The strings are "nan", "inf" and "-inf": `write_json` would write all
    three as null, and a NaN (no data, or a NaN loss) is not an overflow.
    `tft_jax.experiments` (`NON_FINITE_STRINGS`) and `plots` read them back.
    """
    if isinstance(value, dict):
        return {key: _non_finite_as_strings(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_non_finite_as_strings(item) for item in value]
    if isinstance(value, float | np.floating) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def command_experiment(args: argparse.Namespace) -> int:
    check_output_folder(args.out, "--out")  # before minutes of training
    _check_outputs(args.out)
    experiment = _clipping_settings(args)  # before reading the table
    settings = forecaster_config(args, qat=False)
    encoding = settings.data.encoding
    table = (
        load_pedestrian()
        if args.csv is None
        else read_table(
            args.csv, encoding, settings.data.id_col, None, settings.data.categorical_cols
        )
    )
    dataset = prepare_dataset(table, **settings.data.prepare_options())
    try:  # before building the model: an empty split is a flag's doing
        check_splits(dataset.train, dataset.validation, experiment)
    except ValueError as error:
        raise UsageError(flag_message(_setting_flags(str(error)), vars(args))) from None
    # One process writes the folder: another experiment into it would mix the two.
    with folder_locked(args.out, "--out "):
        return _clipping_runs(args, settings, dataset, experiment)


def _clipping_runs(
    args: argparse.Namespace,
    settings: ForecasterConfig,
    dataset: PreparedDataset,
    experiment: ClippingSettings,
) -> int:
    """`command_experiment` once its flags, table and `--out` are checked (and locked):
    trains the paired runs and writes their summary and plot into `--out`."""
    _make_out(args.out)
    _announce_replaced(args.out)  # the flags and table are good: the runs start now
    model = settings.model
    tft_config = TFTConfig(
        **dataset.tft_config_kwargs(),
        hidden_dim=model.hidden_dim,
        num_heads=model.num_heads,
        dropout_rate=model.dropout_rate,
        variable_hidden_dim=model.variable_hidden_dim,
        compact_selection=model.compact_selection,
        quantiles=model.quantiles,
    )

    def report(run: dict[str, Any]) -> None:
        if not args.quiet:
            print(
                f"  {'clip' if run['clip'] else 'no clip':<8} seed {run['seed']}: final val "
                f"loss {run['final_val_loss']:.4f}, diverged {run['diverged']}, grad norm > clip "
                f"in {100 * run['clipped_fraction']:.0f}% of steps, skipped "
                f"{run['skipped_total']}, {run['seconds']:.0f} s",
                flush=True,
            )

    result = clipping_experiment(
        qat_model_for(tft_config, args.qat_bits),
        dataset.train,
        dataset.validation,
        experiment,
        on_run=report,
    )
    result["data"] = dataclasses.asdict(settings.data)
    result["model"] = dataclasses.asdict(tft_config)
    result["qat_bits"] = args.qat_bits
    write_json(args.out / "clipping.json", _non_finite_as_strings(result))
    figure = plots.plot_clipping_experiment(args.out / "clipping.png", result)
    for arm, summary in result["summary"].items():
        values = [summary[f"final_val_loss_{k}"] for k in ("median", "min", "max")]
        shown = ["n/a" if v is None else f"{v:.4f}" for v in values]
        print(
            f"{arm}: {summary['diverged']}/{summary['runs']} diverged, final val loss median "
            f"{shown[0]} (min {shown[1]}, max {shown[2]})"
        )
    print(f"result: {args.out / 'clipping.json'}\nplot:   {figure}")
    return 0
