"""The whole benchmark set on the first GPU/TPU within a time budget, written as JSON lines.

One command measures an accelerator machine::

    python -m benchmarks.accelerator --out results/accelerator.jsonl

Tasks, most important first (each starts only while the budget, 300 s by
default, lasts; the final `suite` record names any that were skipped): the
float32 and bfloat16 matmul peaks; the `electricity` train step at batch 1024
in bfloat16 (the figure to hold against NVIDIA's 10,173 items/s on one A100
for their TFT on Electricity); `electricity-nvidia` (their model's shapes:
hidden 128, 8 input variables instead of our 30 at hidden 160) at batch 1024
in bfloat16; `electricity` at batch 1024 in float32, and with QAT in bfloat16
(timed in alternating blocks with a float twin, the QAT/FP32 ratio's
denominator); `electricity` at its paper batch 64; `TemporalSelfAttention`
forward+backward for T = 64..4096, default against flash path in bfloat16
(each record's `kernel` says whether cuDNN's fused kernel ran; the flash
path asks for it where it applies, and a `flash` path without it is
announced on stderr);
inference at batch 1 and 256, FP32 and int8; `fake_quantize` throughput and
the QAT/FP32 step ratio; `traffic` in bfloat16 if time remains. Attention
runs one task per length and inference one per batch size, so a run cut
short keeps the records of those that finished; `--only` takes task names
or a part's name (`attention`, `inference`, `train_step`, ...).

The records at batch 1024 of `electricity` and `electricity-nvidia` carry
`reference_items_per_s`, `ratio_to_reference` and `reference_shape_differences`
(how our model's shapes differ from NVIDIA's; empty when they match). A task
that fails is named in the `suite` record's `tasks_failed` and the others run;
the command then exits with status 1.

Refuses to run on a CPU backend unless `--allow-cpu` (used by the tests with
`--quick`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import jax

from benchmarks import attention, common, cpu, fake_quant, inference
from benchmarks import train_step as steps_bench
from tft_jax.allocator import relaunch_with_tuned_allocator

DEFAULT_OUTPUT = "accelerator-results.jsonl"
DEFAULT_BUDGET_S = 300.0
HEADLINE_BATCH = 1024
REFERENCE_ITEMS_PER_S = 10173.0  # NVIDIA DeepLearningExamples TFT, one A100 (TF32), Electricity
# The shapes of the model behind that figure (PyTorch/Forecasting/TFT/configuration.py,
# ElectricityConfig): static, known and history variables, the latter the known
# inputs and the target.
REFERENCE_SHAPES: dict[str, int] = {
    "batch_size": 1024,
    "hidden_dim": 128,
    "num_heads": 4,
    "sequence_length": 168,
    "prediction_horizon": 24,
    "static_variables": 1,
    "known_variables": 3,
    "history_variables": 4,
}
REFERENCE_CONFIGS = ("electricity", "electricity-nvidia")


def model_shapes(config: steps_bench.BenchConfig) -> dict[str, int]:
    """The shapes of `REFERENCE_SHAPES` for one of our configurations (categoricals counted)."""
    model = config.model
    known = model.num_known_features + len(model.known_categorical_cardinalities)
    observed = model.num_observed_features + len(model.observed_categorical_cardinalities)
    return {
        "batch_size": config.batch_size,
        "hidden_dim": model.hidden_dim,
        "num_heads": model.num_heads,
        "sequence_length": model.sequence_length,
        "prediction_horizon": model.prediction_horizon,
        "static_variables": model.num_static_features + len(model.static_categorical_cardinalities),
        "known_variables": known,
        "history_variables": observed + (known if model.use_known_history else 0),
    }


def reference_fields(config: steps_bench.BenchConfig, samples_per_s: float) -> dict[str, Any]:
    """NVIDIA's figure, our ratio to it, and each shape in which the two models differ."""
    ours = model_shapes(config)
    return {
        "reference_items_per_s": REFERENCE_ITEMS_PER_S,
        "ratio_to_reference": samples_per_s / REFERENCE_ITEMS_PER_S,
        "reference_shape_differences": [
            f"{key} {ours[key]} vs {value}"
            for key, value in REFERENCE_SHAPES.items()
            if ours[key] != value
        ],
    }


def tasks(steps: int, warmup: int, quick: bool = False) -> list[common.Task]:
    """The accelerator set as suite tasks; `quick` runs tiny stand-ins of each (for tests)."""
    peak: dict[str, Any] = {}
    bf16_peak: dict[str, Any] = {}
    # QAT records with the float twins they were timed against, for the step ratios.
    ratio_pairs: list[dict[str, Any]] = []
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
        bench_config = steps_bench.get_config(config, dtype, batch_size)
        if mode == "float":
            record = steps_bench.bench(bench_config, mode, steps, warmup, peak=step_peak)
            steps_bench.add_float_ratios([record])
        else:
            # The ratio to float comes from a float twin timed in alternating blocks
            # with this step, in this process (JAX reuses the headline's executable).
            twin, record = steps_bench.bench_modes(
                bench_config, ("float", mode), steps, warmup, peak=step_peak
            )
            record["float_median_s"] = twin["median_s"]
            ratio_pairs.extend([twin, record])
        if config in REFERENCE_CONFIGS and batch_size == HEADLINE_BATCH and mode == "float":
            record.update(reference_fields(bench_config, record["samples_per_s"]))
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
        return throughput + fake_quant.step_ratios(ratio_pairs)

    return [
        common.Task("matmul-peak", "peak", measure_peak),
        train_task(name, "float", "bfloat16", big_batch),
        *([] if quick else [train_task("electricity-nvidia", "float", "bfloat16", HEADLINE_BATCH)]),
        train_task(name, "float", "float32", big_batch),
        train_task(name, "qat", "bfloat16", big_batch),
        train_task(name, "float", "float32", None),
        # One task per length and per batch size: a run cut short keeps what finished.
        *(
            common.Task(
                f"attention-T{length}",
                "attention",
                functools.partial(
                    attention.run,
                    [length],
                    attention.PATHS,
                    steps,
                    warmup,
                    batch_size=2 if quick else 8,
                    hidden_dim=64 if quick else 128,
                    num_heads=4,
                    dtype="bfloat16",
                ),
            )
            for length in lengths
        ),
        *(
            common.Task(
                f"inference-B{batch_size}",
                "inference",
                functools.partial(
                    inference.run, [name], [batch_size], inference.KINDS, steps, warmup
                ),
            )
            for batch_size in (1, 8 if quick else 256)
        ),
        common.Task("fake_quant", "fake_quant", quantization),
        # Its tiny stand-in would be the headline task again: a second record of the
        # same program, its compile a hit in JAX's in-memory cache.
        *([] if quick else [train_task("traffic", "float", "bfloat16", big_batch)]),
    ]


def select_tasks(tasks: Sequence[common.Task], only: str) -> list[common.Task]:
    """The tasks `--only` names, by task name or part; `ValueError` listing both otherwise."""
    allowed = [task.name for task in tasks]
    allowed += sorted({task.part for task in tasks} - set(allowed))
    names = common.split_names(only, allowed, "--only")
    return [task for task in tasks if task.name in names or task.part in names]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.accelerator [--out FILE] [--budget 300]`."""
    always = "the JSON lines file every record is appended to: always written, even without "
    parser = common.base_parser(
        __doc__.splitlines()[0], output_help=always + "this option (same as --out)"
    )
    # --out is this script's name for the shared --output: both set the same file.
    parser.add_argument("--out", dest="output", help=always + "this option (same as --output)")
    parser.set_defaults(output=DEFAULT_OUTPUT)
    parser.add_argument(
        "--budget",
        type=common.positive_seconds,
        default=DEFAULT_BUDGET_S,
        help="seconds in which tasks may start (the running one finishes after it)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny configurations (tests)")
    parser.add_argument("--allow-cpu", action="store_true", help="run on a CPU backend too")
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated task names or parts (peak, train_step, attention, inference, "
        "fake_quant) to run",
    )
    args = parser.parse_args(argv)
    # The flags first (a usage error, exit 2), then the backend: a typo is
    # named as such on any machine.
    selected = tasks(args.steps, args.warmup, args.quick)
    with common.usage_errors(parser):
        if args.only is not None:
            selected = select_tasks(selected, args.only)
        common.check_path_given(args.output, "--out")
        if os.path.isdir(args.output):
            raise ValueError(f"--out must name a file, got the directory {args.output!r}")
    # Checked before anything is created or measured.
    backend = jax.default_backend()
    if backend == "cpu" and not args.allow_cpu:
        raise SystemExit(
            "benchmarks.accelerator found no GPU/TPU (backend 'cpu'); "
            "use `python -m benchmarks.cpu`, or --allow-cpu"
        )
    with common.usage_errors(parser):
        # The output's directory is made last, so that `setup` can check the path.
        directory = os.path.dirname(os.path.abspath(args.output))
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            raise ValueError(f"--out: cannot create {directory!r} ({error})") from None
        common.setup(args)
    report = common.suite_reporter(cpu.VIEWS, args.json, args.output)
    records = common.run_suite(
        "accelerator", selected, budget_s=args.budget, report=report, keep_going=True
    )
    if not args.json:
        print(f"\nwrote {len(records)} records to {args.output}")
    failed = [failure["task"] for failure in records[-1]["tasks_failed"]]
    if failed:
        raise SystemExit(
            f"benchmarks.accelerator: {len(failed)} task(s) failed ({', '.join(failed)}; "
            f"tracebacks above); the other tasks' records are in {args.output}"
        )
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    common.run_command(main)
