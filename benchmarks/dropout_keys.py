"""Dropout-key benchmark: the FP32 train step with inline Threefry draws vs JAX's rolled loops.

`train_step` re-types its dropout key with
`tft_jax.inline_threefry.inline_threefry_key`: on CPU, draws of at least
`INLINE_MIN_SIZE` values are then straight-line kernels instead of JAX's
rolled Threefry loop, with the same bits. `builtin` compiles the same step
with `INLINE_MIN_SIZE` above every draw (every draw is JAX's own); `inline`
with the library's value (each record's `inline_min_size` is the threshold
its step was traced with). Both executables train copies of the same state in
one process. Per variant: `while` loops, fused kernels and copies in the
compiled step, `.compile()` CPU and wall seconds, the first step's loss (equal
when the masks are), then step times in alternating blocks. The `inline`
record carries its ratios to `builtin`, unless both lower to the very same
program (no dropout: the `tiny` configuration, `dropout_rate` 0): then it says
`same_program: true`, its ratios are null and a note on stderr says why.

Usage::

    python -m benchmarks.dropout_keys --config seed,electricity [--json]
    python -m benchmarks.dropout_keys --config electricity --variant inline,builtin  # other order
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax

import tft_jax.train as train
from benchmarks import common
from benchmarks import train_step as train_bench
from tft_jax import inline_threefry
from tft_jax.allocator import relaunch_with_tuned_allocator

VARIANTS = ("builtin", "inline")
# `builtin`'s threshold: above every draw, so that each is JAX's own rolled loop.
BUILTIN_MIN_SIZE = 2**32
_NUM_KEYS = 16


def count_instructions(hlo_text: str, opcode: str) -> int:
    """How many `opcode` instructions an HLO module's text holds."""
    return len(re.findall(rf" {opcode}\(", hlo_text))


class DropoutKeyStep:
    """The FP32 train step of one configuration, compiled for one variant of the dropout draws.

    Attributes:
      variant: `builtin` or `inline`; inline_min_size: the `INLINE_MIN_SIZE`
      the step was traced with (2**32 for `builtin`); whiles, fusions, copies:
      instructions of the compiled step; compile_cpu_s / compile_wall_s:
      `.compile()`; lower_s: tracing and lowering; first_loss: the loss of the
      first step; program_sha256: `common.program_digest` of the lowered step.
    """

    def __init__(
        self, config: train_bench.BenchConfig, variant: str, state: Any, batch: Any
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.config, self.variant, self.batch = config, variant, batch
        self.state = train.copy_state(state)  # each variant donates its own buffers
        self._keys = list(jax.random.split(jax.random.key(1), _NUM_KEYS))
        self._count = 0
        threshold = inline_threefry.INLINE_MIN_SIZE
        self.inline_min_size = threshold if variant == "inline" else BUILTIN_MIN_SIZE
        inline_threefry.INLINE_MIN_SIZE = self.inline_min_size
        try:
            jax.clear_caches()  # trace again: the threshold is read while tracing
            started = time.perf_counter()
            lowered = train.lower_train_step(self.state, batch, self._keys[0])
            self.lower_s = time.perf_counter() - started
        finally:
            inline_threefry.INLINE_MIN_SIZE = threshold
        self.program_sha256 = common.program_digest(lowered)
        cpu, wall = time.process_time(), time.perf_counter()
        self.compiled = lowered.compile()
        self.compile_cpu_s = time.process_time() - cpu
        self.compile_wall_s = time.perf_counter() - wall
        text = self.compiled.as_text()
        self.whiles = count_instructions(text, "while")
        self.fusions = count_instructions(text, "fusion")
        self.copies = count_instructions(text, "copy")
        metrics = self()
        if int(metrics["skipped"]):
            raise RuntimeError(f"{config.name} {variant}: the first train step was skipped")
        self.first_loss = float(metrics["loss"])

    def __call__(self) -> dict[str, Any]:
        key = self._keys[self._count % _NUM_KEYS]
        self._count += 1
        self.state, metrics = self.compiled(self.state, self.batch, key)
        return jax.block_until_ready(metrics)


def bench(
    config: train_bench.BenchConfig,
    variants: Sequence[str] = VARIANTS,
    steps: int = common.MIN_TIMED_STEPS,
    warmup: int = common.DEFAULT_WARMUP,
    steps_per_block: int = 5,
) -> list[dict[str, Any]]:
    """Compiles the step for each variant (in `variants` order), then times them alternately."""
    common.check_step_counts(steps, warmup)
    batch = jax.device_put(train_bench.make_batch(config.model, config.batch_size))
    state, _ = train_bench.build_state("float", config.model, batch)
    prepared = {variant: DropoutKeyStep(config, variant, state, batch) for variant in variants}
    times = common.time_in_blocks(prepared, steps, warmup, steps_per_block)
    records = [
        common.make_record(
            "dropout_keys",
            config.name,
            variant=variant,
            batch_size=config.batch_size,
            inline_min_size=step.inline_min_size,
            whiles=step.whiles,
            fusions=step.fusions,
            copies=step.copies,
            compile_cpu_s=step.compile_cpu_s,
            compile_wall_s=step.compile_wall_s,
            lower_s=step.lower_s,
            first_loss=step.first_loss,
            compile_order=list(variants).index(variant),
            program_sha256=step.program_sha256,
            **times[variant].summary(),
        )
        for variant, step in prepared.items()
    ]
    add_ratios(records)
    for record in records:
        if record["same_program"] and record["variant"] != "builtin":
            print(
                f"benchmarks.dropout_keys: {record['config']}: variant {record['variant']!r} "
                "lowers to the same program as 'builtin' (the step draws no dropout mask: "
                "dropout_rate 0, or no draw reaches INLINE_MIN_SIZE); its ratios are left "
                "out (null): they would time noise",
                file=sys.stderr,
                flush=True,
            )
    return records


def add_ratios(records: Sequence[dict[str, Any]]) -> None:
    """Adds `same_program` and `*_ratio` fields (this variant / `builtin`) in place.

    `same_program`: `common.mark_same_programs` against `builtin`, per
    configuration; a variant with the same program as `builtin` gets no
    ratios (None).
    """
    common.mark_same_programs(records, "builtin", lambda r: r["config"])
    builtin = {r["config"]: r for r in records if r["variant"] == "builtin"}
    for record in records:
        base = builtin.get(record["config"])
        duplicate = record["same_program"] and record is not base
        for field in ("fusions", "compile_cpu_s", "compile_wall_s", "median_s"):
            ratio = record[field] / base[field] if base and base[field] and not duplicate else None
            record[f"{field.removesuffix('_s')}_ratio"] = ratio
        record["loss_difference"] = abs(record["first_loss"] - base["first_loss"]) if base else None


REQUIRED_FIELDS: dict[str, Any] = {
    "variant": str,
    "inline_min_size": int,
    "whiles": int,
    "fusions": int,
    "copies": int,
    "compile_cpu_s": float,
    "compile_wall_s": float,
    "first_loss": float,
    "program_sha256": str,
    "same_program": (bool, type(None)),
    "median_s": float,
    "steps": int,
}

COLUMNS = [
    ("config", "config", ""),
    ("variant", "variant", ""),
    ("whiles", "whiles", ""),
    ("fusions", "fusions", ""),
    ("copies", "copies", ""),
    ("compile CPU s", "compile_cpu_s", ".1f"),
    ("compile wall s", "compile_wall_s", ".1f"),
    ("median ms", "median_ms", ".2f"),
    ("CPU s /builtin", "compile_cpu_ratio", ".2f"),
    ("wall s /builtin", "compile_wall_ratio", ".2f"),
    ("step /builtin", "median_ratio", ".2f"),
    ("|loss diff|", "loss_difference", ".1e"),
    ("load 1m", "load_average_1m", ".1f"),
]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.dropout_keys [--config ...] [--variant ...] [--json]`."""
    parser = common.base_parser(__doc__.splitlines()[0])
    configs = list(train_bench.CONFIGS)
    parser.add_argument(
        "--config", default="seed,electricity", help=f"comma-separated subset of {configs}"
    )
    parser.add_argument(
        "--variant",
        default=",".join(VARIANTS),
        help=f"subset of {list(VARIANTS)}, in compile order",
    )
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        names = common.split_names(args.config, train_bench.CONFIGS, "--config")
        variants = common.split_names(args.variant, VARIANTS, "--variant")
        common.setup(args)
    records = [
        record
        for name in names
        for record in bench(train_bench.get_config(name), variants, args.steps, args.warmup)
    ]
    common.emit(
        records,
        COLUMNS,
        args.json,
        args.output,
        title="train step: dropout draws inline (inline_threefry) vs JAX's rolled Threefry loops",
        view=lambda record: {**record, "median_ms": record["median_s"] * 1e3},
    )
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    common.run_command(main)
