"""The whole benchmark set on the first GPU/TPU within a time budget, written as JSON lines.

One command measures an accelerator machine::

    python -m benchmarks.accelerator --out results/accelerator.jsonl

Tasks, most important first (each starts only while the budget, 300 s by
default, lasts; the final `suite` record names any that were skipped): the
float32 and bfloat16 matmul peaks; the `electricity` train step at batch 1024
in bfloat16 (the figure to hold against NVIDIA's 10,173 items/s on one A100
for their TFT on Electricity), in float32 and with QAT; `electricity` at its
paper batch 64; `TemporalSelfAttention` forward+backward for T = 64..4096,
default against flash path in bfloat16 (each record's `kernel` says whether
cuDNN's fused kernel ran: `jax.nn.dot_product_attention` uses XLA's unless
asked for cuDNN, and a `flash` path without it is announced on stderr);
inference at batch 1 and 256, FP32 and int8; `fake_quantize` throughput and
the QAT/FP32 step ratio; `traffic` in bfloat16 if time remains.

Refuses to run on a CPU backend unless `--allow-cpu` (used by the tests with
`--quick`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax

from benchmarks import attention, common, cpu, fake_quant, inference
from benchmarks import train_step as steps_bench
from tft_jax.allocator import relaunch_with_tuned_allocator

DEFAULT_BUDGET_S = 300.0
HEADLINE_BATCH = 1024
REFERENCE_ITEMS_PER_S = 10173.0  # NVIDIA DeepLearningExamples TFT, one A100 (TF32), Electricity


def tasks(steps: int, warmup: int, quick: bool = False) -> list[common.Task]:
    """The accelerator set as suite tasks; `quick` runs tiny stand-ins of each (for tests)."""
    peak: dict[str, Any] = {}
    bf16_peak: dict[str, Any] = {}
    train_records: list[dict[str, Any]] = []
    name = "tiny" if quick else "electricity"
    big_batch = 8 if quick else HEADLINE_BATCH
    lengths = [16, 32] if quick else list(attention.DEFAULT_LENGTHS)
    sizes = [2**10] if quick else [2**20, 2**24, 2**26]

    def measure_peak() -> list[dict[str, Any]]:
        peak.update(common.matmul_peak_gflops("float32", size=256 if quick else None))
        bf16 = common.matmul_peak_gflops("bfloat16", size=256 if quick else None)
        peak["matmul_peak_bf16_gflops"] = bf16["matmul_peak_gflops"]
        bf16_peak.update(peak, **bf16)
        return [
            common.make_record("matmul_peak", "float32", **peak),
            common.make_record("matmul_peak", "bfloat16", **bf16),
        ]

    def train(config: str, mode: str, dtype: str, batch_size: int | None) -> list[dict[str, Any]]:
        # A bfloat16 step's peak_fraction is of the bfloat16 matmul peak, not the float32 one.
        step_peak = bf16_peak if dtype == "bfloat16" else peak
        record = steps_bench.bench(
            steps_bench.get_config(config, dtype, batch_size), mode, steps, warmup, peak=step_peak
        )
        if config == "electricity" and batch_size == HEADLINE_BATCH:
            record["reference_items_per_s"] = REFERENCE_ITEMS_PER_S
            record["ratio_to_reference"] = record["samples_per_s"] / REFERENCE_ITEMS_PER_S
        train_records.append(record)
        steps_bench.add_float_ratios(train_records)
        return [record]

    def train_task(config: str, mode: str, dtype: str, batch_size: int | None) -> common.Task:
        label = f"train_step-{config}-{mode}-{dtype}-B{batch_size or 'default'}"
        return common.Task(label, "train_step", lambda: train(config, mode, dtype, batch_size))

    def quantization() -> list[dict[str, Any]]:
        throughput = [
            fake_quant.bench_throughput(size, direction, steps, warmup)
            for size in sizes
            for direction in fake_quant.DIRECTIONS
        ]
        return throughput + fake_quant.step_ratios(train_records)

    return [
        common.Task("matmul-peak", "peak", measure_peak),
        train_task(name, "float", "bfloat16", big_batch),
        train_task(name, "float", "float32", big_batch),
        train_task(name, "qat", "bfloat16", big_batch),
        train_task(name, "float", "float32", None),
        common.Task(
            "attention",
            "attention",
            lambda: attention.run(
                lengths,
                attention.PATHS,
                steps,
                warmup,
                batch_size=2 if quick else 8,
                hidden_dim=64 if quick else 128,
                num_heads=4,
                dtype="bfloat16",
            ),
        ),
        common.Task(
            "inference",
            "inference",
            lambda: inference.run([name], [1, 8 if quick else 256], inference.KINDS, steps, warmup),
        ),
        common.Task("fake_quant", "fake_quant", quantization),
        train_task("tiny" if quick else "traffic", "float", "bfloat16", big_batch),
    ]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.accelerator [--out FILE] [--budget 300]`."""
    parser = common.base_parser(__doc__.splitlines()[0])
    # --out is this script's name for the shared --output: both set the same file.
    parser.add_argument(
        "--out", dest="output", help="JSON lines file to append to (same as --output)"
    )
    parser.set_defaults(output="accelerator-results.jsonl")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds")
    parser.add_argument("--quick", action="store_true", help="tiny configurations (tests)")
    parser.add_argument("--allow-cpu", action="store_true", help="run on a CPU backend too")
    parser.add_argument("--only", default=None, help="comma-separated task names to run")
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        if not args.budget > 0:  # NaN too
            raise ValueError(f"--budget must be positive, got {args.budget}")
        # The output's directory is made first, so that `setup` can check the path.
        directory = os.path.dirname(os.path.abspath(args.output))
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            raise ValueError(f"--out: cannot create {directory!r} ({error})") from None
        common.setup(args)
    backend = jax.default_backend()
    if backend == "cpu" and not args.allow_cpu:
        raise SystemExit(
            "benchmarks.accelerator found no GPU/TPU (backend 'cpu'); "
            "use `python -m benchmarks.cpu`, or --allow-cpu"
        )
    selected = tasks(args.steps, args.warmup, args.quick)
    if args.only:
        with common.usage_errors(parser):
            names = common.split_names(args.only, [task.name for task in selected], "--only")
        selected = [task for task in selected if task.name in names]
    report = common.suite_reporter(cpu.VIEWS, args.json, args.output)
    records = common.run_suite("accelerator", selected, budget_s=args.budget, report=report)
    if not args.json:
        print(f"\nwrote {len(records)} records to {args.output}")
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    main()
