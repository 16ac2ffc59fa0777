"""The CPU benchmark set that `make bench` runs: train steps, quantization, attention, inference.

Tasks, in order: the float32 matmul peak; FP32 and QAT train steps of `seed`
and `electricity`; `fake_quantize` throughput and the QAT/FP32 step ratio
(from the same train-step records, no second compile); `TemporalSelfAttention`
forward+backward for T = 64..1024, default and flash paths; inference at
batch 1 and 256, FP32 and int8. The larger configurations
(`electricity-paper`, `traffic`) and T up to 4096 are in the individual
scripts. The pytorch-forecasting comparison is `make bench-peers`.

Usage::

    python -m benchmarks.cpu [--json] [--output results.jsonl] [--quick]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks import attention, common, fake_quant, inference
from benchmarks import train_step as steps_bench
from tft_jax.allocator import relaunch_with_tuned_allocator

VIEWS = {
    "matmul_peak": common.PartView(
        "matmul peak (best of 8 square matmuls)",
        [
            ("dtype", "matmul_peak_dtype", ""),
            ("n", "matmul_peak_size", ""),
            ("GFLOP/s", "matmul_peak_gflops", ".1f"),
        ],
    ),
    "train_step": common.PartView(
        "train_step (FP32 and QAT)", steps_bench.COLUMNS, steps_bench.table_view
    ),
    "fake_quant": common.PartView("fake quantization", fake_quant.COLUMNS, fake_quant.table_view),
    "qat_step_ratio": common.PartView(
        "QAT / FP32 train step", fake_quant.COLUMNS, fake_quant.table_view
    ),
    "attention": common.PartView(
        "TemporalSelfAttention forward+backward", attention.COLUMNS, attention.table_view
    ),
    "inference": common.PartView("inference", inference.COLUMNS, inference.table_view),
}


def tasks(steps: int, warmup: int, quick: bool = False) -> list[common.Task]:
    """The CPU set as suite tasks; `quick` shrinks it to the smallest configurations."""
    configs = ["tiny"] if quick else ["seed", "electricity"]
    lengths = [16, 32] if quick else [64, 128, 256, 512, 1024]
    sizes = [2**10] if quick else list(fake_quant.DEFAULT_SIZES)
    batch_sizes = [1] if quick else [1, 256]
    peak: dict[str, Any] = {}
    train_records: list[dict[str, Any]] = []

    def measure_peak() -> list[dict[str, Any]]:
        peak.update(common.matmul_peak_gflops())
        return [common.make_record("matmul_peak", "float32", **peak)]

    def train(name: str) -> list[dict[str, Any]]:
        records = steps_bench.bench_modes(
            steps_bench.get_config(name), ("float", "qat"), steps, warmup, peak=peak
        )
        train_records.extend(records)
        return records

    def quantization() -> list[dict[str, Any]]:
        throughput = [
            fake_quant.bench_throughput(size, direction, steps, warmup)
            for size in sizes
            for direction in fake_quant.DIRECTIONS
        ]
        return throughput + fake_quant.step_ratios(train_records)

    return [
        common.Task("matmul-peak", "peak", measure_peak),
        *(
            common.Task(f"train_step-{name}", "train_step", lambda name=name: train(name))
            for name in configs
        ),
        common.Task("fake_quant", "fake_quant", quantization),
        common.Task(
            "attention",
            "attention",
            lambda: attention.run(lengths, attention.PATHS, steps, warmup),
        ),
        *(
            common.Task(
                f"inference-{name}",
                "inference",
                lambda name=name: inference.run(
                    [name], batch_sizes, inference.KINDS, steps, warmup
                ),
            )
            for name in configs
        ),
    ]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.cpu [--json] [--output FILE] [--quick] [--only ...]`."""
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smallest configurations only")
    parser.add_argument("--only", default=None, help="comma-separated task names to run")
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        common.setup(args)
        selected = tasks(args.steps, args.warmup, args.quick)
        if args.only is not None:
            names = common.split_names(args.only, [task.name for task in selected], "--only")
            selected = [task for task in selected if task.name in names]
    report = common.suite_reporter(VIEWS, args.json, args.output)
    return common.run_suite("cpu", selected, report=report)


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    common.run_command(main)
