"""Fake-quantization benchmark: `qat.fake_quantize` throughput and the QAT/FP32 train-step ratio.

Throughput: the jitted forward and forward+backward of `fake_quantize` on
float32 arrays of several sizes (int8 affine grid), against an elementwise
scale `x * c` (forward) and its gradient masked by `x` (forward+backward: it
reads `x` and `g` as the straight-through gradient does), with the same memory
traffic. Forward+backward returns both the forward's output and the gradient
(`(y, dx)`, as a training step needs both), so the forward's rounding and clamp
are in the timed program. Fake quantization is memory-bound, so the ratio to
that baseline is its overhead. Step ratio: the median QAT train step over the
median FP32 train step of the same configuration (`benchmarks.train_step`,
modes `qat` and `float`, timed in alternating blocks in one process),
target <= 1.15 (`TARGET_RATIO`, issue 16).

Usage::

    python -m benchmarks.fake_quant --sizes 65536,1048576,16777216 --ratio-config seed [--json]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

import qat
from benchmarks import common
from benchmarks import train_step as steps_bench
from tft_jax.allocator import relaunch_with_tuned_allocator

DIRECTIONS = ("forward", "forward+backward")
DEFAULT_SIZES = (2**16, 2**20, 2**24)
TARGET_RATIO = 1.15  # QAT/FP32 step time, issue 16 (BENCHMARKS.md, Targets)
_QMIN, _QMAX = 0, 255


def _functions(direction: str) -> tuple[Any, Any]:
    """`(fake quantization, baseline)` jitted for one direction, each of `(x, g)`.

    `forward` returns `y`; `forward+backward` returns `(y, dx)`, the forward's
    output and the gradient for the cotangent `g`: returning the gradient
    alone let XLA drop the forward (the straight-through gradient does not
    read `y`), so the program had no rounding and no clamp in it.
    """

    def quantized(x: Any) -> Any:
        return qat.fake_quantize(x, 0.05, 128.0, _QMIN, _QMAX)

    @jax.custom_vjp
    def baseline(x: Any) -> Any:
        return x * 1.0001

    def baseline_forward(x: Any) -> tuple[Any, Any]:
        return baseline(x), x

    def baseline_backward(x: Any, g: Any) -> tuple[Any]:
        # Reads x as the straight-through mask does (a plain `g * c` would not: XLA
        # drops x from that gradient, and the baseline would move a third less memory).
        return (jnp.where(jnp.isnan(x), 0.0, g * 1.0001),)

    baseline.defvjp(baseline_forward, baseline_backward)

    if direction == "forward":
        return jax.jit(lambda x, g: quantized(x)), jax.jit(lambda x, g: baseline(x))
    if direction == "forward+backward":

        def vjp_of(fn: Any) -> Any:
            def forward_backward(x: Any, g: Any) -> tuple[Any, Any]:
                y, pullback = jax.vjp(fn, x)
                return y, pullback(g)[0]

            return jax.jit(forward_backward)

        return vjp_of(quantized), vjp_of(baseline)
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def bench_throughput(
    size: int,
    direction: str,
    steps: int = common.MIN_TIMED_STEPS,
    warmup: int = common.DEFAULT_WARMUP,
) -> dict[str, Any]:
    """Times `fake_quantize` and its baseline on `size` float32 elements; returns the record."""
    common.check_step_counts(steps, warmup)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive int, got {size!r}")
    x = jax.random.normal(jax.random.key(0), (size,), jnp.float32)
    g = jnp.ones_like(x)
    quantized, baseline = _functions(direction)
    compiled = common.compile_timed(quantized, x, g)
    common.compile_timed(baseline, x, g)
    calls = {
        "fake_quant": lambda: jax.block_until_ready(quantized(x, g)),
        "baseline": lambda: jax.block_until_ready(baseline(x, g)),
    }
    common.first_calls(calls)
    times = common.time_alternating(
        calls,
        blocks=steps,
        steps_per_block=1,
        warmup=warmup,
    )
    median, base = times["fake_quant"].median, times["baseline"].median
    # The least traffic: forward, one read of x and one write of y; forward+backward,
    # reads of x and g, writes of y and of the gradient (XLA's two kernels both read x,
    # the quantizer's and the baseline's alike).
    touched = size * 4 * (2 if direction == "forward" else 4)
    return common.make_record(
        "fake_quant",
        f"n{size}-{direction}",
        elements=size,
        direction=direction,
        compile_s=compiled.total_s,
        **times["fake_quant"].summary(),
        elements_per_s=size / median,
        gbytes_per_s=touched / median / 1e9,
        baseline_median_s=base,
        ratio_to_baseline=median / base,
    )


def step_ratios(train_records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """QAT/FP32 step-time ratio records from `benchmarks.train_step` records of one run."""
    by_key = {(r["config"], r["dtype"], r["batch_size"], r["mode"]): r for r in train_records}
    ratios = []
    for (config, dtype, batch_size, mode), record in by_key.items():
        base = by_key.get((config, dtype, batch_size, "float"))
        if mode == "float" or base is None:
            continue
        ratio = record["median_s"] / base["median_s"]
        ratios.append(
            common.make_record(
                "qat_step_ratio",
                config,
                mode=mode,
                dtype=dtype,
                batch_size=batch_size,
                float_median_s=base["median_s"],
                qat_median_s=record["median_s"],
                ratio=ratio,
                target_ratio=TARGET_RATIO,
                meets_target=ratio <= TARGET_RATIO,
            )
        )
    return ratios


def run(
    sizes: Sequence[int],
    ratio_configs: Sequence[str],
    steps: int,
    warmup: int,
    peak: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Throughput records for every size and direction, then the QAT/FP32 step ratios."""
    records = [
        bench_throughput(size, direction, steps, warmup)
        for size in sizes
        for direction in DIRECTIONS
    ]
    train_records = [
        record
        for name in ratio_configs
        for record in steps_bench.bench_modes(
            steps_bench.get_config(name), ("float", "qat"), steps, warmup, peak=peak
        )
    ]
    return records + step_ratios(train_records)


THROUGHPUT_FIELDS: dict[str, Any] = {
    "elements": int,
    "direction": str,
    "median_s": float,
    "steps": int,
    "elements_per_s": float,
    "gbytes_per_s": float,
    "baseline_median_s": float,
    "ratio_to_baseline": float,
}
RATIO_FIELDS: dict[str, Any] = {
    "mode": str,
    "float_median_s": float,
    "qat_median_s": float,
    "ratio": float,
    "meets_target": bool,
}

COLUMNS = [
    ("benchmark", "benchmark", ""),
    ("config", "config", ""),
    ("median ms", "median_ms", ".3f"),
    ("Gelem/s", "gelem_per_s", ".2f"),
    ("GB/s", "gbytes_per_s", ".2f"),
    ("vs x*c", "ratio_to_baseline", ".2f"),
    ("QAT/FP32", "ratio", ".2f"),
]


def table_view(record: dict[str, Any]) -> dict[str, Any]:
    """Milliseconds and Gelements/s for the table."""
    median = record.get("median_s", record.get("qat_median_s"))
    rate = record.get("elements_per_s")
    return {**record, "median_ms": median * 1e3, "gelem_per_s": rate / 1e9 if rate else None}


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.fake_quant [--sizes ...] [--ratio-config ...]`."""
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        help="float32 element counts of the throughput arrays (comma-separated)",
    )
    parser.add_argument(
        "--ratio-config",
        default="seed",
        help="configurations for the QAT/FP32 step ratio (comma-separated, 'none' to skip)",
    )
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        sizes = common.split_positive_ints(args.sizes, "--sizes")
        configs = (
            []
            if args.ratio_config == "none"
            else common.split_names(args.ratio_config, steps_bench.CONFIGS, "--ratio-config")
        )
        common.setup(args)
    peak = common.matmul_peak_gflops() if configs else None
    records = run(sizes, configs, args.steps, args.warmup, peak)
    common.emit(
        records, COLUMNS, args.json, args.output, title="fake quantization", view=table_view
    )
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    common.run_command(main)
