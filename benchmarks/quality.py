"""Forecast quality with default settings on public tables: backtests against strong baselines.

    python -m benchmarks.quality [--tables pedestrian aus_retail ...] [--variants ...]
                                 [--set training.time_budget=180] [--output out.jsonl]

For each table (`benchmarks.tables`) and settings variant, a `Forecaster`
with the default model, training and QAT settings (plus the variant's and
`--set` overrides) is fitted, scored on the validation split (the numbers a
default may be chosen by), and backtested over the last `--cutoffs`
rolling origins of the table, `H` steps apart, without retraining (the test
numbers: never used to choose). Only cutoffs whose forecast steps all lie in
the test split are scored: an earlier one would score targets the model was
trained or selected on, so fewer are used where the test split is shorter
than `--cutoffs` horizons (tourism's 11 quarters hold 2 cutoffs of 4), and
the record says how many (`backtest.cutoffs`, of `cutoffs_requested`). Each
record holds P50/P90 q-risk of the best baseline (seasonal naive,
seasonal naive with drift and the empirical quantiles at the frequency's
periods), FP32 and int8, and the training time.

Each record is printed as one JSON line (the records are nested, so there is
no table), with the fields every benchmark's record carries
(`schema_version`, `benchmark` "quality", `config` "TABLE:VARIANT",
`load_average_1m`, `env`); `--output FILE` also appends the lines to a file,
as in the other benchmarks. `--json FILE`, the earlier spelling of `--output FILE`, still
works; a bare `--json` changes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

from benchmarks.common import (
    HelpFormatter,
    check_distinct,
    check_output_path,
    make_record,
    positive_int,
    run_command,
    usage_errors,
)
from benchmarks.tables import TABLES, without_categoricals
from tft_jax.allocator import relaunch_with_tuned_allocator
from tft_jax.data import PreparedDataset
from tft_jax.data.tables import time_grid
from tft_jax.forecaster import (
    DataConfig,
    Forecaster,
    ForecasterConfig,
    ModelConfig,
    QATTrainingConfig,
    TrainingConfig,
)

# Settings variants compared on the validation split: name -> {section.field: value}.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "window_normalization": {"data.window_normalization": True},
    "series_scaler_only": {"data.window_normalization": False},
    "no_categoricals": {},  # the table without its categorical inputs
}
# The sections of `ForecasterConfig` that `--set` may override.
SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "training": TrainingConfig,
    "qat": QATTrainingConfig,
}


def configured(
    table_name: str, variant: str, overrides: dict[str, Any], qat: bool = True
) -> ForecasterConfig:
    """The settings of one run: the table's data settings, defaults elsewhere, then overrides."""
    table = TABLES[table_name]
    data = without_categoricals(table) if variant == "no_categoricals" else table.data
    config = ForecasterConfig(data=data, qat=QATTrainingConfig() if qat else None)
    clash = sorted(set(VARIANTS[variant]) & set(overrides))
    if clash:  # the override would silently undo what the variant measures
        raise ValueError(f"{', '.join(clash)} is what the variant {variant!r} sets")
    for key, value in {**VARIANTS[variant], **overrides}.items():
        section, field = key.split(".")
        if getattr(config, section) is None:
            raise ValueError(f"{key} has no effect with --no-qat")
        config = dataclasses.replace(
            config, **{section: dataclasses.replace(getattr(config, section), **{field: value})}
        )
    return config


def cutoffs_in_test_split(dataset: PreparedDataset, freq: str, requested: int) -> int:
    """How many of the last `requested` backtest cutoffs, `H` steps apart, lie in the test split.

    `Forecaster.backtest` counts its cutoffs back from the table's last time
    on the `freq` grid (the last forecasts the final `H` steps) and never
    retrains: a cutoff before `dataset.test_start` forecasts targets of the
    training or validation period, which the model was fitted or selected
    on. `dataset` is the one the model was fitted on, from the table
    backtested.
    """
    times = dataset.panel.times
    grid = time_grid(times.min(), times.max(), freq=freq)
    last = len(grid) - dataset.horizon
    positions = (last - k * dataset.horizon for k in range(requested))
    return sum(
        1 for position in positions if position >= 0 and grid[position] >= dataset.test_start
    )


def _scores(metrics: dict[str, Any], model: str) -> dict[str, float]:
    row = metrics["models"][model]
    return {"p50": row["p50_q_risk"], "p90": row["p90_q_risk"]}


def run(
    table_name: str, variant: str, overrides: dict[str, Any], cutoffs: int, qat: bool = True
) -> dict[str, Any]:
    """Fits, validates and backtests one (table, variant); returns a JSON-ready record.

    The record is `common.make_record`'s (schema version, machine, load) with
    the fields of `measure`.
    """
    fields = measure(table_name, variant, overrides, cutoffs, qat)
    return make_record("quality", f"{table_name}:{variant}", **fields)


def measure(
    table_name: str, variant: str, overrides: dict[str, Any], cutoffs: int, qat: bool = True
) -> dict[str, Any]:
    """The fields of `run`'s record: the fit, the validation scores, the backtest."""
    config = configured(table_name, variant, overrides, qat)
    frame = TABLES[table_name].load()
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # data notes, reported by the CLI
        forecaster = Forecaster.from_config(config).fit(frame, quiet=True)
        fitted = time.perf_counter() - started
        validation = forecaster.evaluate(forecaster.dataset, "validation")
        dataset = forecaster.dataset
        used = cutoffs_in_test_split(dataset, config.data.freq, cutoffs)
        if not used:
            raise ValueError(
                f"{table_name}: no backtest cutoff lies in the test split (from "
                f"{dataset.test_start}): it holds fewer than the {dataset.horizon} steps of a "
                "horizon; raise data.test_fraction with --set"
            )
        backtest = forecaster.backtest(frame, n_windows=used)
    scored_before = backtest["cutoff"] < dataset.test_start
    if scored_before.any():  # counted otherwise than backtest takes them: not test numbers
        raise RuntimeError(
            f"{table_name}: the backtest cutoff {backtest['cutoff'][scored_before].iloc[0]} "
            f"lies before the test start {dataset.test_start}"
        )
    by_model = backtest.groupby("model")[["p50_q_risk", "p90_q_risk"]].mean()
    best = validation["models"]["best_baseline"]["name"]
    return {
        "table": table_name,
        "variant": variant,
        "overrides": overrides,
        "fit_seconds": fitted,
        "fp32_steps_planned": forecaster.summary["fp32"]["total_steps"],
        "fp32_stop_reason": forecaster.summary["fp32"].get("stop_reason"),
        "fp32_best_step": min(
            zip(
                forecaster.history["fp32"]["val_loss"],
                forecaster.history["fp32"]["step"],
                strict=True,
            ),
            default=(None, None),
        )[1],
        "validation": {
            "best_baseline": {"name": best, **_scores(validation, "best_baseline")},
            **{name: _scores(validation, name) for name in forecaster.models},
        },
        "backtest": {
            "cutoffs": used,
            "cutoffs_requested": cutoffs,
            "series_windows": int(backtest["windows"].iloc[0]),
            **{
                name: {"p50": float(row["p50_q_risk"]), "p90": float(row["p90_q_risk"])}
                for name, row in by_model.iterrows()
            },
        },
    }


def finite_or_none(value: Any) -> Any:
    """`value` with every NaN or infinite float (the q-risk of a NaN forecast) as None.

    Python's `json.dumps` would write them as `NaN`/`Infinity`, which strict
    JSON readers (`jq`, browsers, most languages) reject.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(item) for item in value]
    return value


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """`--set SECTION.FIELD=VALUE` items as `{section.field: value}` (values read as JSON).

    Raises `ValueError` naming the item unless it has that form and names a
    field of a `ForecasterConfig` section, so that a typo stops the command
    before any table is fitted (not with a traceback from `configured`); a
    field set twice is refused too (the last value would win unseen).
    """
    check_distinct([item.partition("=")[0] for item in items], "--set", " ".join(items))
    overrides = {}
    for item in items:
        key, equals, value = item.partition("=")
        section, dot, field = key.partition(".")
        if not (equals and dot and section in SECTIONS):
            raise ValueError(
                f"--set takes SECTION.FIELD=VALUE with SECTION one of {list(SECTIONS)}, "
                f"got {item!r}"
            )
        if field not in {f.name for f in dataclasses.fields(SECTIONS[section])}:
            raise ValueError(f"--set {item!r}: {section} has no field {field!r}")
        overrides[key] = _value(value)
    return overrides


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quality", description=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument(
        "--tables",
        nargs="+",
        default=list(TABLES),
        choices=list(TABLES),
        help="public tables to fit (benchmarks.tables)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["default"],
        choices=list(VARIANTS),
        help="settings variants, each fitted on every table",
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help=f"settings overrides (values read as JSON), SECTION one of {list(SECTIONS)}",
    )
    parser.add_argument(
        "--cutoffs",
        type=positive_int,
        default=3,
        help="backtest origins, at most: those whose steps lie in the test split",
    )
    parser.add_argument("--output", help="also append the JSON lines to this file")
    parser.add_argument(
        "--json",
        nargs="?",
        const=True,
        metavar="FILE",
        help="the lines printed are JSON already; --json FILE is the earlier spelling of "
        "--output FILE",
    )
    parser.add_argument("--no-qat", action="store_true", help="FP32 only (quicker studies)")
    args = parser.parse_args(argv)
    with usage_errors(parser):
        # A run twice fits the same model twice and prints two records of it.
        check_distinct(args.tables, "--tables", " ".join(args.tables))
        check_distinct(args.variants, "--variants", " ".join(args.variants))
        overrides = parse_overrides(args.set)
        output, option = args.output, "--output"
        if isinstance(args.json, str):
            if args.output is not None:
                raise ValueError(
                    f"--json {args.json} and --output {args.output} both name the output file: "
                    "give it once, as --output"
                )
            output, option = args.json, "--json"
        check_output_path(output, option)  # written after the first fit: checked now
        for table in args.tables:  # each run's settings, before any table is fitted
            for variant in args.variants:
                try:
                    configured(table, variant, overrides, qat=not args.no_qat)
                except (TypeError, ValueError) as error:
                    raise ValueError(f"--set {' '.join(args.set)}: {error}") from None
    for table in args.tables:
        for variant in args.variants:
            record = run(table, variant, overrides, args.cutoffs, qat=not args.no_qat)
            line = json.dumps(finite_or_none(record), allow_nan=False)
            print(line, flush=True)
            if output:
                with open(output, "a", encoding="utf-8") as out:
                    out.write(line + "\n")
    return 0


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    sys.exit(run_command(main))
