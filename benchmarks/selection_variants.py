"""Chunked variable selection benchmark: the train step as the library runs it vs earlier layouts.

The variable selection networks run over chunks of rows
(`tft_jax.chunked_selection`). Two choices there are measured against the
alternative they replaced, each variant compiled in one process and trained
from copies of the same state:

* `default`: the library as it is;
* `recompute`: every chunk intermediate recomputed in the backward pass
  (`CHUNK_REMAT_POLICY = None`) instead of keeping the outputs of the
  unbatched contractions;
* `materialized` (`--mode qat` only): the quantized prescaler's
  `(rows, V, width)` embeddings computed whole before the chunks, as the
  calibrating path does, instead of multiplied out inside each chunk.

The same function in every variant: equal first losses. Per variant: fused
kernels of the compiled step, `.compile()` CPU and wall seconds, XLA's
temporary bytes, the first loss, then step times in alternating blocks and
the ratios to `default`. A variant whose lowered step is the very program of
`default` (`recompute` whenever the selection runs in one chunk: off CPU, and
small configurations such as `seed` or `tiny` on CPU; or without a selection
GRN, as in `tiny`) says `same_program: true`
and gets no ratios (null), with a note on stderr: its timing is noise.

Usage::

    python -m benchmarks.selection_variants --config electricity --mode qat [--json]
    python -m benchmarks.selection_variants --config electricity --mode float \\
        --variant recompute,default  # compile order
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any
from unittest import mock

import jax

import tft_jax.chunked_selection as chunked_selection
import tft_jax.embeddings as embeddings
import tft_jax.train as train
from benchmarks import common
from benchmarks import train_step as train_bench
from benchmarks.dropout_keys import count_instructions
from tft_jax.allocator import relaunch_with_tuned_allocator

VARIANTS = ("default", "recompute", "materialized")
MODES = ("float", "qat")
_NUM_KEYS = 16


@contextlib.contextmanager
def variant_patch(variant: str) -> Iterator[None]:
    """The library's module constants as `variant` had them, while tracing."""
    if variant == "default":
        yield
    elif variant == "recompute":
        with mock.patch.object(chunked_selection, "CHUNK_REMAT_POLICY", None):
            yield
    elif variant == "materialized":
        with mock.patch.object(embeddings, "supports_operand_quantizers", lambda _: False):
            yield
    else:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


class VariantStep:
    """The train step of one configuration and mode, compiled for one variant.

    Attributes:
      fusions: fused kernels of the compiled step; temp_mib: XLA's temporary
      bytes; compile_cpu_s / compile_wall_s: `.compile()`; first_loss: the
      loss of the first step; program_sha256: `common.program_digest` of the
      lowered step.
    """

    def __init__(self, variant: str, state: Any, batch: Any, calibrate: bool | None) -> None:
        self.batch = batch
        self.state = train.copy_state(state)  # each variant donates its own buffers
        self._keys = list(jax.random.split(jax.random.key(1), _NUM_KEYS))
        self._count = 0
        with variant_patch(variant):
            jax.clear_caches()  # trace again: the constants are read while tracing
            lowered = train.lower_train_step(self.state, batch, self._keys[0], calibrate)
        self.program_sha256 = common.program_digest(lowered)
        cpu, wall = time.process_time(), time.perf_counter()
        self.compiled = lowered.compile()
        self.compile_cpu_s = time.process_time() - cpu
        self.compile_wall_s = time.perf_counter() - wall
        self.fusions = count_instructions(self.compiled.as_text(), "fusion")
        memory = self.compiled.memory_analysis()
        self.temp_mib = memory.temp_size_in_bytes / 2**20 if memory is not None else None
        metrics = self()
        if int(metrics["skipped"]):
            raise RuntimeError(f"{variant}: the first train step was skipped")
        self.first_loss = float(metrics["loss"])

    def __call__(self) -> dict[str, Any]:
        key = self._keys[self._count % _NUM_KEYS]
        self._count += 1
        self.state, metrics = self.compiled(self.state, self.batch, key)
        return jax.block_until_ready(metrics)


def bench(
    config: train_bench.BenchConfig,
    mode: str,
    variants: Sequence[str],
    steps: int = common.MIN_TIMED_STEPS,
    warmup: int = common.DEFAULT_WARMUP,
    steps_per_block: int = 5,
) -> list[dict[str, Any]]:
    """Compiles the step for each variant (in `variants` order), then times them alternately."""
    common.check_step_counts(steps, warmup)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "qat" and "materialized" in variants:
        raise ValueError("variant 'materialized' needs --mode qat (the FP32 model folds instead)")
    batch = jax.device_put(train_bench.make_batch(config.model, config.batch_size))
    state, calibrate = train_bench.build_state(mode, config.model, batch)
    prepared = {variant: VariantStep(variant, state, batch, calibrate) for variant in variants}
    times = common.time_in_blocks(prepared, steps, warmup, steps_per_block)
    records = [
        common.make_record(
            "selection_variants",
            config.name,
            mode=mode,
            variant=variant,
            batch_size=config.batch_size,
            fusions=step.fusions,
            temp_mib=step.temp_mib,
            compile_cpu_s=step.compile_cpu_s,
            compile_wall_s=step.compile_wall_s,
            first_loss=step.first_loss,
            compile_order=list(variants).index(variant),
            program_sha256=step.program_sha256,
            **times[variant].summary(),
        )
        for variant, step in prepared.items()
    ]
    add_ratios(records)
    for record in records:
        if record["same_program"] and record["variant"] != "default":
            print(same_program_note(record), file=sys.stderr, flush=True)
    return records


def same_program_note(record: dict[str, Any]) -> str:
    """The stderr line for a variant that lowers to the very program of `default`."""
    why = {
        "recompute": (
            "CHUNK_REMAT_POLICY changes the program only with more than one chunk of rows "
            "and a selection GRN to keep the layers of: this step runs the selection in one "
            "chunk (every step off CPU, small configurations on CPU) or has no selection GRN"
        ),
    }.get(record["variant"], "the variant changes nothing this step traces")
    return (
        f"benchmarks.selection_variants: {record['config']} {record['mode']}: variant "
        f"{record['variant']!r} lowers to the same program as 'default' ({why}); "
        "its ratios are left out (null): they would time noise"
    )


def add_ratios(records: Sequence[dict[str, Any]]) -> None:
    """Adds `same_program` and `*_ratio` fields (this variant / `default`) in place.

    `same_program`: `common.mark_same_programs` against `default`, per
    configuration and mode; a variant with the same program as `default` gets
    no ratios (None).
    """
    common.mark_same_programs(records, "default", lambda r: (r["config"], r["mode"]))
    default = {(r["config"], r["mode"]): r for r in records if r["variant"] == "default"}
    for record in records:
        base = default.get((record["config"], record["mode"]))
        duplicate = record["same_program"] and record is not base
        for field in ("compile_cpu_s", "median_s"):
            ratio = record[field] / base[field] if base and base[field] and not duplicate else None
            record[f"{field.removesuffix('_s')}_ratio"] = ratio
        record["loss_difference"] = abs(record["first_loss"] - base["first_loss"]) if base else None


REQUIRED_FIELDS: dict[str, Any] = {
    "mode": str,
    "variant": str,
    "fusions": int,
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
    ("mode", "mode", ""),
    ("variant", "variant", ""),
    ("fusions", "fusions", ""),
    ("temp MiB", "temp_mib", ".1f"),
    ("compile CPU s", "compile_cpu_s", ".1f"),
    ("median ms", "median_ms", ".2f"),
    ("fastest ms", "min_ms", ".2f"),
    ("step /default", "median_ratio", ".3f"),
    ("|loss diff|", "loss_difference", ".1e"),
    ("load 1m", "load_average_1m", ".1f"),
]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.selection_variants [--config] [--mode] [--variant]`."""
    parser = common.base_parser(__doc__.splitlines()[0])
    configs = list(train_bench.CONFIGS)
    parser.add_argument(
        "--config", default="electricity", help=f"comma-separated subset of {configs}"
    )
    parser.add_argument("--mode", default="qat", choices=MODES, help="the train step's mode")
    parser.add_argument(
        "--variant",
        help=f"subset of {list(VARIANTS)}, in compile order (default: all the mode allows)",
    )
    args = parser.parse_args(argv)
    allowed = VARIANTS if args.mode == "qat" else VARIANTS[:2]
    with common.usage_errors(parser):
        names = common.split_names(args.config, train_bench.CONFIGS, "--config")
        variants = common.split_names(args.variant or ",".join(allowed), VARIANTS, "--variant")
        if args.mode != "qat" and "materialized" in variants:
            raise ValueError("--variant materialized needs --mode qat (the FP32 model folds)")
        common.setup(args)
    records = [
        record
        for name in names
        for record in bench(
            train_bench.get_config(name), args.mode, variants, args.steps, args.warmup
        )
    ]
    common.emit(
        records,
        COLUMNS,
        args.json,
        args.output,
        title="train step: chunked variable selection, the library vs earlier layouts",
        view=lambda record: {
            **record,
            "median_ms": record["median_s"] * 1e3,
            "min_ms": record["min_s"] * 1e3,
        },
    )
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    common.run_command(main)
