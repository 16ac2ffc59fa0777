"""Optimizer benchmark: the FP32 train step with the flat-vector optimizer vs optax's per-leaf one.

`flat` is `make_optimizer` (`tft_jax.flat_optimizer.flat_adamw`: clip and
AdamW on one vector of all scalars); `tree` is the same math as optax's
per-leaf chain, `optax.chain(optax.clip_by_global_norm(1.0),
optax.adamw(1e-3, mask=decay_model_params_only))`, built here (it is what
`make_optimizer` returned before). Both train the same initial weights of the
same configuration in one process. Per optimizer: the number of fused
kernels of the compiled step (`fused_computation`s in `compiled.as_text()`),
the CPU seconds of `.compile()` (`time.process_time`, all compile threads of
this process, less sensitive to other processes than wall time) and its
wall seconds, then step times measured in alternating blocks. The `flat`
record carries its ratios to `tree`.

Usage::

    python -m benchmarks.optimizer --config seed,electricity [--json]
    python -m benchmarks.optimizer --config seed --optimizer flat,tree   # the other compile order
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

import jax
import optax

import tft_jax.train as train
from benchmarks import common
from benchmarks import train_step as train_bench
from tft_jax import TemporalFusionTransformer
from tft_jax.allocator import relaunch_with_tuned_allocator

OPTIMIZERS = ("tree", "flat")
LEARNING_RATE, CLIP_NORM = 1e-3, 1.0
_NUM_KEYS = 16


def build_optimizer(kind: str) -> train.Optimizer:
    """`make_optimizer(1e-3, clip_norm=1.0)` (`flat`), or optax's per-leaf chain (`tree`)."""
    if kind == "flat":
        return train.make_optimizer(LEARNING_RATE, clip_norm=CLIP_NORM)
    if kind != "tree":
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {kind!r}")
    chain = optax.chain(
        optax.clip_by_global_norm(CLIP_NORM),
        optax.adamw(LEARNING_RATE, weight_decay=0.0, mask=train.decay_model_params_only),
    )
    optimizer = train.Optimizer(chain.init, chain.update)
    optimizer.clip_norm = CLIP_NORM
    return optimizer


def count_fusions(hlo_text: str) -> int:
    """The number of fused computations (one compiled kernel each) in an HLO module's text."""
    return len(re.findall(r"^%?fused_computation\S* ", hlo_text, re.MULTILINE))


class OptimizerStep:
    """The FP32 train step of one configuration with one optimizer, compiled and timed to compile.

    Attributes:
      kind: `tree` or `flat`; fusions: fused kernels of the compiled step;
      compile_cpu_s / compile_wall_s: `.compile()` in CPU and wall seconds;
      lower_s: tracing and lowering; first_call_s: the first `train_step` call.
    """

    def __init__(self, config: train_bench.BenchConfig, kind: str, seed: int = 0) -> None:
        self.config, self.kind = config, kind
        self.batch = jax.device_put(train_bench.make_batch(config.model, config.batch_size, seed))
        model = TemporalFusionTransformer(config.model)
        key = jax.random.key(seed, impl="rbg")
        self.state = train.create_train_state(model, build_optimizer(kind), key, self.batch)
        self.params = train_bench.parameter_count(self.state.params)
        self.leaves = len(jax.tree.leaves(self.state.params))
        self._keys = list(jax.random.split(jax.random.key(seed + 1), _NUM_KEYS))
        self._count = 0
        started = time.perf_counter()
        lowered = train.lower_train_step(self.state, self.batch, self._keys[0])
        self.lower_s = time.perf_counter() - started
        cpu, wall = time.process_time(), time.perf_counter()
        compiled = lowered.compile()
        self.compile_cpu_s = time.process_time() - cpu
        self.compile_wall_s = time.perf_counter() - wall
        self.fusions = count_fusions(compiled.as_text())
        started = time.perf_counter()
        metrics = self()
        self.first_call_s = time.perf_counter() - started
        if int(metrics["skipped"]):
            raise RuntimeError(f"{config.name} {kind}: the first train step was skipped")

    def __call__(self) -> dict[str, Any]:
        key = self._keys[self._count % _NUM_KEYS]
        self._count += 1
        self.state, metrics = train.train_step(self.state, self.batch, key)
        return jax.block_until_ready(metrics)


def bench(
    config: train_bench.BenchConfig,
    kinds: Sequence[str] = OPTIMIZERS,
    steps: int = common.MIN_TIMED_STEPS,
    warmup: int = common.DEFAULT_WARMUP,
    steps_per_block: int = 5,
) -> list[dict[str, Any]]:
    """Compiles the step with each optimizer (in `kinds` order), then times them alternately."""
    common.check_step_counts(steps, warmup)
    prepared = {kind: OptimizerStep(config, kind) for kind in kinds}
    times = common.time_in_blocks(prepared, steps, warmup, steps_per_block)
    records = []
    for kind, step in prepared.items():
        records.append(
            common.make_record(
                "optimizer",
                config.name,
                optimizer=kind,
                batch_size=config.batch_size,
                params=step.params,
                leaves=step.leaves,
                fusions=step.fusions,
                compile_cpu_s=step.compile_cpu_s,
                compile_wall_s=step.compile_wall_s,
                lower_s=step.lower_s,
                first_call_s=step.first_call_s,
                compile_order=list(kinds).index(kind),
                **times[kind].summary(),
            )
        )
    add_ratios(records)
    return records


def add_ratios(records: Sequence[dict[str, Any]]) -> None:
    """Adds `*_ratio` fields (this optimizer / `tree`, same configuration) in place."""
    tree = {r["config"]: r for r in records if r["optimizer"] == "tree"}
    for record in records:
        base = tree.get(record["config"])
        for field in ("fusions", "compile_cpu_s", "compile_wall_s", "median_s"):
            ratio = record[field] / base[field] if base and base[field] else None
            record[f"{field.removesuffix('_s')}_ratio"] = ratio


REQUIRED_FIELDS: dict[str, Any] = {
    "optimizer": str,
    "params": int,
    "leaves": int,
    "fusions": int,
    "compile_cpu_s": float,
    "compile_wall_s": float,
    "median_s": float,
    "steps": int,
}

COLUMNS = [
    ("config", "config", ""),
    ("optimizer", "optimizer", ""),
    ("leaves", "leaves", ""),
    ("fusions", "fusions", ""),
    ("compile CPU s", "compile_cpu_s", ".1f"),
    ("compile wall s", "compile_wall_s", ".1f"),
    ("median ms", "median_ms", ".2f"),
    ("fusions /tree", "fusions_ratio", ".2f"),
    ("CPU s /tree", "compile_cpu_ratio", ".2f"),
    ("step /tree", "median_ratio", ".2f"),
    ("load 1m", "load_average_1m", ".1f"),
]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.optimizer [--config ...] [--optimizer ...] [--json]`."""
    parser = common.base_parser(__doc__.splitlines()[0])
    configs = list(train_bench.CONFIGS)
    parser.add_argument(
        "--config", default="seed,electricity", help=f"comma-separated subset of {configs}"
    )
    parser.add_argument(
        "--optimizer",
        default=",".join(OPTIMIZERS),
        help=f"subset of {list(OPTIMIZERS)}, in compile order",
    )
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        names = common.split_names(args.config, train_bench.CONFIGS, "--config")
        kinds = common.split_names(args.optimizer, OPTIMIZERS, "--optimizer")
        common.setup(args)
    records = [
        record
        for name in names
        for record in bench(train_bench.get_config(name), kinds, args.steps, args.warmup)
    ]
    common.emit(
        records,
        COLUMNS,
        args.json,
        args.output,
        title="train step: flat-vector optimizer vs optax's per-leaf chain",
        view=lambda record: {**record, "median_ms": record["median_s"] * 1e3},
    )
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    common.run_command(main)
