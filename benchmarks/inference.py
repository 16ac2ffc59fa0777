"""Inference benchmark: batch-1 latency and batch-256 throughput, FP32 against int8.

`float`: the jitted deterministic `TemporalFusionTransformer.apply`.
`int8`: the jitted `qat.int8_apply` of the same weights after
`QATTemporalFusionTransformer` calibration (`qat.calibrate` on one batch) and
`qat.convert`: every dense layer an `int8 x int8 -> int32` contraction.
The weights are freshly initialised; speed does not depend on their values.
Both kinds are compiled first, called once untimed, then timed in alternating turns.

Usage::

    python -m benchmarks.inference --config seed,electricity --batch-sizes 1,256 [--json]
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax

import qat
from benchmarks import common
from benchmarks import train_step as steps_bench
from qat.model import tree_bytes
from tft_jax import TemporalFusionTransformer
from tft_jax.allocator import relaunch_with_tuned_allocator

KINDS = ("float", "int8")


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A jitted forward, its arguments and the bytes of the weights it reads."""

    forward: Any
    args: tuple[Any, ...]
    weight_bytes: int


def _inputs(batch: Any) -> tuple[Any, Any, Any, Any]:
    """`(static, historical, future, known_history)`: the last is None without known history."""
    return (batch.static, batch.historical, batch.future, batch.known_history)


def prepare(config: steps_bench.BenchConfig, kind: str, seed: int = 0) -> Prepared:
    """The forward of one kind at the configuration's shapes, with initialised weights.

    The weights (and, for `int8`, the calibrated QAT variables) are those of
    the train-step benchmark's `build_state`, so the two scripts share code
    and, at equal shapes, compiled executables.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    host_batch = steps_bench.make_batch(config.model, config.batch_size, seed)
    mode = "float" if kind == "float" else "qat"
    state, _ = steps_bench.build_state(mode, config.model, host_batch, seed)
    variables = state.variables
    inputs = _inputs(jax.device_put(host_batch))
    if kind == "float":
        model = TemporalFusionTransformer(config.model)
        forward = jax.jit(functools.partial(model.apply, deterministic=True))
        return Prepared(forward, (variables, *inputs), tree_bytes(variables["params"]))
    qat_model = steps_bench.build_model("qat", config.model)
    int8_variables = qat.convert(variables, dtype=config.model.dtype)
    forward = jax.jit(functools.partial(qat.int8_apply, qat_model))
    return Prepared(forward, (int8_variables, *inputs), tree_bytes(int8_variables))


def bench(
    config: steps_bench.BenchConfig,
    kinds: Sequence[str] = KINDS,
    steps: int = common.MIN_TIMED_STEPS,
    warmup: int = common.DEFAULT_WARMUP,
) -> list[dict[str, Any]]:
    """Compiles the forward of every kind, then times them in alternating turns (fair ratios)."""
    common.check_step_counts(steps, warmup)
    prepared = {kind: prepare(config, kind) for kind in kinds}
    compiled = {kind: common.compile_timed(p.forward, *p.args) for kind, p in prepared.items()}
    calls = {
        kind: lambda p=p: jax.block_until_ready(p.forward(*p.args)) for kind, p in prepared.items()
    }
    common.first_calls(calls)
    times = common.time_alternating(
        calls,
        blocks=steps,
        steps_per_block=1,
        warmup=warmup,
    )
    return [_record(config, kind, prepared[kind], compiled[kind], times[kind]) for kind in kinds]


def _record(
    config: steps_bench.BenchConfig,
    kind: str,
    prepared: Prepared,
    compiled: common.CompileResult,
    times: common.StepTimes,
) -> dict[str, Any]:
    """The record of one timed kind."""
    # Counted on a fresh trace (the selection in one chunk, every LSTM step): not the
    # executable's cost analysis, which counts a loop body once.
    flop_count = common.count_flops(prepared.forward, *prepared.args)
    return common.make_record(
        "inference",
        f"{config.name}-B{config.batch_size}-{kind}",
        model_config=config.name,
        kind=kind,
        dtype=config.model.dtype,
        batch_size=config.batch_size,
        compile_s=compiled.total_s,
        **times.summary(),
        latency_ms=times.median * 1e3,
        samples_per_s=config.batch_size / times.median,
        weight_bytes=prepared.weight_bytes,
        **flop_count.fields(times.median, None),
        memory=common.memory_stats(compiled.compiled),
    )


def add_int8_speedups(records: Sequence[dict[str, Any]]) -> None:
    """Adds `speedup_vs_float` (float median / int8 median) to the int8 records in place."""
    float_median = {
        (r["model_config"], r["batch_size"]): r["median_s"] for r in records if r["kind"] == "float"
    }
    for record in records:
        base = float_median.get((record["model_config"], record["batch_size"]))
        record["speedup_vs_float"] = (
            base / record["median_s"] if base and record["kind"] == "int8" else None
        )


def run(
    configs: Sequence[str],
    batch_sizes: Sequence[int],
    kinds: Sequence[str],
    steps: int,
    warmup: int,
    dtype: str = "float32",
) -> list[dict[str, Any]]:
    """One record per configuration, batch size and kind."""
    records = []
    for name in configs:
        for batch_size in batch_sizes:
            config = steps_bench.get_config(name, dtype, batch_size)
            measured = bench(config, kinds, steps, warmup)
            # Each int8 run against the float run timed with it, never another's.
            add_int8_speedups(measured)
            records.extend(measured)
    return records


REQUIRED_FIELDS: dict[str, Any] = {
    "model_config": str,
    "kind": str,
    "batch_size": int,
    "compile_s": float,
    "median_s": float,
    "steps": int,
    "latency_ms": float,
    "samples_per_s": float,
    "weight_bytes": int,
    "flops": (float, type(None)),
    "flops_method": str,
    "flops_loops_counted_once": int,
}

COLUMNS = [
    ("config", "model_config", ""),
    ("B", "batch_size", ""),
    ("kind", "kind", ""),
    ("compile s", "compile_s", ".1f"),
    ("latency ms", "latency_ms", ".3f"),
    ("samples/s", "samples_per_s", ".0f"),
    ("weights KiB", "weight_kib", ".0f"),
    ("int8 speedup", "speedup_vs_float", ".2f"),
]


def table_view(record: dict[str, Any]) -> dict[str, Any]:
    """KiB for the table."""
    return {**record, "weight_kib": record["weight_bytes"] / 1024}


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.inference [--config ...] [--batch-sizes ...]`."""
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        default="seed,electricity",
        help=f"comma-separated subset of {list(steps_bench.CONFIGS)}",
    )
    parser.add_argument("--batch-sizes", default="1,256", help="batch sizes (comma-separated)")
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"comma-separated subset of {list(KINDS)}"
    )
    parser.add_argument(
        "--dtype", default="float32", choices=steps_bench.DTYPES, help="the model's compute dtype"
    )
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        configs = common.split_names(args.config, steps_bench.CONFIGS, "--config")
        kinds = common.split_names(args.kinds, KINDS, "--kinds")
        batch_sizes = common.split_positive_ints(args.batch_sizes, "--batch-sizes")
        common.setup(args)
    records = run(configs, batch_sizes, kinds, args.steps, args.warmup, args.dtype)
    common.emit(
        records,
        COLUMNS,
        args.json,
        args.output,
        title="inference (deterministic forward)",
        view=table_view,
    )
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    common.run_command(main)
