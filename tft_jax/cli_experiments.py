"""`tft-jax experiment clipping`: QAT at an aggressive learning rate, with and without clipping.

The experiment itself is `tft_jax.experiments.clipping_experiment`; this
module reads its flags, runs it on the chosen table and writes
`clipping.json` and `clipping.png`. `clipping.json` is strict JSON with the
non-finite floats as the strings `"nan"`, `"inf"` and `"-inf"` (a diverged
run's loss or gradient norm: null would not tell NaN from inf); null is a
value that does not exist (a summary over no finite run).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import warnings
from typing import Any

import numpy as np

from tft_jax import plots
from tft_jax.cli_parser import UsageError, check_output_folder, forecaster_config
from tft_jax.config import TFTConfig
from tft_jax.data import load_pedestrian, prepare_dataset, read_table
from tft_jax.experiments import ClippingSettings, clipping_experiment
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


def _clipping_settings(args: argparse.Namespace) -> ClippingSettings:
    """The experiment's settings from the flags; a `UsageError` naming the flag if invalid.

    An `--eval-every` above `--steps` records one point per run, after its
    last step: it is recorded as `--steps`, the interval that took effect,
    with a warning (a repair is said, as `train` says its own).
    """
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
        message = re.sub(
            r"ClippingSettings\.(\w+)",
            lambda match: _SETTING_FLAGS.get(match.group(1), match.group(0)),
            str(error),
        )
        raise UsageError(message) from None
    if args.eval_every > args.steps:
        warnings.warn(
            f"--eval-every {args.eval_every} is more than --steps {args.steps}: each run "
            f"records one point, after its last step (--eval-every {args.steps})",
            UserWarning,
            stacklevel=2,
        )
    return settings


def _non_finite_as_strings(value: Any) -> Any:
    """`value` with each NaN, inf and -inf float, nested in dicts and lists, as a string.

    The strings are "nan", "inf" and "-inf": `write_json` would write all
    three as null, and a NaN (no data, or a NaN loss) is not an overflow.
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
