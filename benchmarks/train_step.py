"""Train-step benchmark: FP32 and QAT steps of `tft_jax.train.train_step` on named configurations.

One step is what `train_step` runs: the forward with dropout, the quantile
loss, the backward, clipping by global norm and AdamW (`make_optimizer`).
Modes:

* `float`: `TemporalFusionTransformer` at the configuration's dtype (FP32 by
  default, bfloat16 with `--dtype bfloat16`);
* `qat`: `QATTemporalFusionTransformer` from the FP32 weights (`qat.from_fp32`),
  observers calibrated once with `qat.calibrate`, then trained frozen
  (`calibrate=False`, the documented flow);
* `qat-observe`: the same with the observers updated every step
  (`calibrate=True`, PyTorch's default QAT behaviour);
* `float-layered`: the FP32 model with a `dot_general_cls` that is plain
  `lax.dot_general`, which takes the layer-by-layer path of the variable
  selection networks (embeddings computed, one matmul per GRN layer, no
  chunks: the code before the fast path of `tft_jax.folded_selection`).
  Same function and parameters; timed with `float` it gives the
  before/after ratio of that path in one process.

Usage::

    python -m benchmarks.train_step --config seed,electricity --mode float,qat [--json]
    python -m benchmarks.train_step --config electricity --batch-size 1024 --dtype bfloat16
    python -m benchmarks.train_step --config electricity --mode float --fast-compile
    python -m benchmarks.train_step --config electricity --mode float,float-layered
    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python -m benchmarks.train_step --config seed --batch-size 64 --devices 8
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from jax import lax

import qat
import tft_jax.train as train
from benchmarks import common
from tft_jax import TemporalFusionTransformer, TFTConfig
from tft_jax import steps as step_functions
from tft_jax.allocator import relaunch_with_tuned_allocator
from tft_jax.distributed import data_mesh, place_state, shard_batch

MODES = ("float", "qat", "qat-observe", "float-layered")
DTYPES = ("float32", "bfloat16")
_NUM_KEYS = 64


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """A named benchmark configuration: the model's `TFTConfig` and the batch size `B`."""

    name: str
    model: TFTConfig
    batch_size: int


def _electricity(**overrides: Any) -> TFTConfig:
    """The paper's electricity model (hidden 160, 4 heads, T 168, H 24) with 5/10/15 inputs."""
    fields = dict(
        num_static_features=5,
        num_known_features=10,
        num_observed_features=15,
        hidden_dim=160,
        num_heads=4,
        sequence_length=168,
        prediction_horizon=24,
        dropout_rate=0.1,
        variable_hidden_dim=16,
    )
    fields.update(overrides)
    return TFTConfig(**fields)


CONFIGS: dict[str, BenchConfig] = {
    "seed": BenchConfig(
        "seed",
        TFTConfig(
            num_static_features=5,
            num_known_features=10,
            num_observed_features=15,
            hidden_dim=32,
            num_heads=4,
            sequence_length=10,
            prediction_horizon=5,
            dropout_rate=0.1,
        ),
        batch_size=4,
    ),
    "electricity": BenchConfig("electricity", _electricity(), batch_size=64),
    # The cheapest model to compile, for smoke tests of the scripts: no statics,
    # one known and one observed input (no selection GRNs), no dropout.
    "tiny": BenchConfig(
        "tiny",
        TFTConfig(
            num_static_features=0,
            num_known_features=1,
            num_observed_features=1,
            hidden_dim=4,
            num_heads=2,
            sequence_length=3,
            prediction_horizon=2,
            dropout_rate=0.0,
        ),
        batch_size=2,
    ),
    "electricity-paper": BenchConfig(
        "electricity-paper", _electricity(variable_hidden_dim=160), batch_size=64
    ),
    "traffic": BenchConfig("traffic", _electricity(hidden_dim=320), batch_size=128),
    # The shapes of NVIDIA DeepLearningExamples' TFT on Electricity (PyTorch/Forecasting/
    # TFT/configuration.py), the model behind their 10,173 items/s on one A100: hidden
    # 128, 4 heads, T 168, H 24, one static (their categorical id, a real here), three
    # known inputs seen over history and horizon, the target observed. The variable
    # GRNs are hidden wide, as theirs.
    "electricity-nvidia": BenchConfig(
        "electricity-nvidia",
        TFTConfig(
            num_static_features=1,
            num_known_features=3,
            num_observed_features=1,
            hidden_dim=128,
            num_heads=4,
            sequence_length=168,
            prediction_horizon=24,
            dropout_rate=0.1,
            use_known_history=True,
        ),
        batch_size=1024,
    ),
}


def get_config(name: str, dtype: str = "float32", batch_size: int | None = None) -> BenchConfig:
    """The named configuration, optionally with another compute dtype or batch size."""
    if name not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {name!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    base = CONFIGS[name]
    return BenchConfig(
        name,
        dataclasses.replace(base.model, dtype=dtype),
        batch_size or base.batch_size,
    )


def make_batch(config: TFTConfig, batch_size: int, seed: int = 0) -> train.Batch:
    """A float32 `Batch` of standard normal inputs and targets with the configuration's shapes."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32)

    steps, horizon = config.sequence_length, config.prediction_horizon
    return train.Batch(
        static=normal(batch_size, config.num_static_features),
        historical=normal(batch_size, steps, config.num_observed_features),
        future=normal(batch_size, horizon, config.num_known_features),
        known_history=(
            normal(batch_size, steps, config.num_known_features)
            if config.use_known_history
            else None
        ),
        static_categorical=None,
        target=normal(batch_size, horizon),
    )


def parameter_count(params: Any) -> int:
    """The number of scalars in a parameter pytree."""
    return int(sum(math.prod(np.shape(leaf)) for leaf in jax.tree.leaves(params)))


class PlainDotGeneral(nn.Module):
    """A `dot_general_cls` that is `lax.dot_general` itself (the model's layer-by-layer path)."""

    lhs_bounds: tuple[float, float] | None = None

    def __call__(self, lhs: Any, rhs: Any, dimension_numbers: Any) -> Any:
        return lax.dot_general(lhs, rhs, dimension_numbers)


def build_model(mode: str, config: TFTConfig) -> Any:
    """The Flax module a mode trains: the TFT, or the QAT-TFT for the `qat*` modes."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "float":
        return TemporalFusionTransformer(config)
    if mode == "float-layered":
        return TemporalFusionTransformer(config, dot_general_cls=PlainDotGeneral)
    return qat.QATTemporalFusionTransformer(config, qat.QATConfig())


def build_state(mode: str, config: TFTConfig, batch: train.Batch, seed: int = 0) -> tuple[Any, Any]:
    """`(TrainState, calibrate)` ready for `train_step(state, batch, rng, calibrate)`.

    The optimizer is `make_optimizer(1e-3, clip_norm=1.0)`. The `qat` modes
    follow the documented flow from the FP32 state of the same seed:
    `qat.from_fp32`, then the observers see `batch` once (`qat.calibrate`) so
    that every activation is fake-quantized from the first timed step. The
    initial weights are drawn with the `rbg` PRNG: the jitted init then
    compiles in half the time of the default `threefry` one, and the values
    do not change the speed of a step.
    """
    model = build_model(mode, config)
    tx = train.make_optimizer(learning_rate=1e-3, clip_norm=1.0)
    key = jax.random.key(seed, impl="rbg")
    fp32 = train.create_train_state(TemporalFusionTransformer(config), tx, key, batch)
    if mode == "float":
        return fp32, None
    if mode == "float-layered":
        return train.create_train_state(model, tx, key, batch, variables=fp32.variables), None
    inputs = (batch.static, batch.historical, batch.future, batch.known_history)
    variables = qat.from_fp32(fp32.variables, model, *inputs, batch.static_categorical)
    calibrated = qat.calibrate(model, variables, [batch], 1)
    state = train.create_train_state(model, tx, key, batch, variables=calibrated)
    return state, mode == "qat-observe"


def check_devices(devices: int, configs: Sequence[BenchConfig]) -> None:
    """Raises `ValueError` naming `--devices` unless every configuration's batch splits over them.

    Checked on the command line before anything is measured (`_distribute`
    checks again for callers of `bench`).
    """
    if devices > jax.device_count():
        raise ValueError(
            f"--devices {devices} but only {jax.device_count()} are visible; on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={devices}"
        )
    for config in configs:
        if config.batch_size % devices:
            raise ValueError(
                f"--devices {devices} does not divide the batch size {config.batch_size} of "
                f"{config.name!r}; use --batch-size with a multiple of {devices}"
            )


def _distribute(state: Any, batch: train.Batch, devices: int) -> tuple[Any, train.Batch]:
    """Data parallelism over the first `devices` devices: batch split, state replicated.

    The placement `fit` uses (`tft_jax.distributed`, which also rejects a
    batch that does not split evenly); one device keeps the state where it is.
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a positive int, got {devices!r}")
    if devices > jax.device_count():
        raise ValueError(
            f"devices={devices} but only {jax.device_count()} are visible; on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={devices}"
        )
    if devices == 1:
        return state, jax.device_put(batch)
    mesh = data_mesh(devices)
    return place_state(state, mesh), shard_batch(batch, mesh)


class PreparedStep:
    """A compiled train step for one configuration and mode; calling it runs one step.

    Attributes:
      config: the `BenchConfig`; mode: one of `MODES`; devices: data-parallel devices.
      compiler_options: the XLA options of the step (`train_step(compiler_options=...)`).
      compile: the `CompileResult` of the step's executable.
      first_call_s: wall time of the first public `train_step` call after compiling.
      params: the parameter count.

    Raises `RuntimeError` if the first step is skipped (a non-finite loss or
    gradient): a skipped step leaves out the update and would time less work.
    """

    def __init__(
        self,
        config: BenchConfig,
        mode: str,
        devices: int = 1,
        seed: int = 0,
        compiler_options: dict[str, Any] | None = None,
    ) -> None:
        self.config, self.mode, self.devices = config, mode, devices
        self.compiler_options = compiler_options
        batch = make_batch(config.model, config.batch_size, seed)
        state, self.calibrate = build_state(mode, config.model, batch, seed)
        self.params = parameter_count(state.params)
        self.state, self.batch = _distribute(state, batch, devices)
        self._keys = list(jax.random.split(jax.random.key(seed + 1), _NUM_KEYS))
        self._count = 0
        self._flops: common.FlopCount | None = None
        # The very executable that the public `train_step` then runs (JAX reuses
        # it: `first_call_s` shows that no second compile happens).
        self.compile = common.compile_lowering_timed(
            train.lower_train_step,
            self.state,
            self.batch,
            self._keys[0],
            self.calibrate,
            compiler_options=compiler_options,
        )
        start = time.perf_counter()
        metrics = self()
        self.first_call_s = time.perf_counter() - start
        if int(metrics["skipped"]):
            raise RuntimeError(
                f"{config.name} {mode}: the first train step was skipped (loss "
                f"{float(metrics['loss'])}, grad_norm {float(metrics['grad_norm'])}); "
                "timing skipped steps would leave out the update"
            )

    def flop_count(self) -> common.FlopCount:
        """The FLOPs of one step, all devices' shares (`common.count_flops`, computed once).

        Counted on a fresh trace of the step's body with the selection in one
        chunk and every scan iteration counted, so the figure does not depend
        on the CPU's chunking; the timed executable is not touched.
        """
        if self._flops is None:
            body = functools.partial(step_functions._train_step, calibrate=self.calibrate)
            self._flops = common.count_flops(body, self.state, self.batch, self._keys[0])
        return self._flops

    def __call__(self) -> dict[str, Any]:
        key = self._keys[self._count % _NUM_KEYS]
        self._count += 1
        self.state, metrics = train.train_step(
            self.state, self.batch, key, self.calibrate, compiler_options=self.compiler_options
        )
        return jax.block_until_ready(metrics)


def measure(
    prepared: PreparedStep,
    times: common.StepTimes,
    peak: dict[str, Any] | None,
    **extra: Any,
) -> dict[str, Any]:
    """The record of a timed train step."""
    cfg = prepared.config
    median = times.median
    # The step's FLOPs are those of all devices (`count_flops` counts the whole step, every
    # LSTM time step, the selection in one chunk). Its peak fraction compares them with the
    # peak of the devices that ran them: one device's peak times the devices, except for
    # simulated CPU devices (--xla_force_host_platform_device_count), which share the cores
    # one device's matmul already uses, so the machine's peak is the one measured.
    simulated = bool(common.environment().get("simulated_devices"))
    peak_devices = 1 if simulated else prepared.devices
    peak_gflops = peak["matmul_peak_gflops"] * peak_devices if peak else None
    return common.make_record(
        "train_step",
        cfg.name,
        mode=prepared.mode,
        dtype=cfg.model.dtype,
        batch_size=cfg.batch_size,
        devices=prepared.devices,
        compiler_options=prepared.compiler_options,
        params=prepared.params,
        compile_s=prepared.compile.total_s,
        lower_s=prepared.compile.lower_s,
        xla_compile_s=prepared.compile.compile_s,
        first_call_s=prepared.first_call_s,
        **times.summary(),
        samples_per_s=cfg.batch_size / median,
        **prepared.flop_count().fields(median, peak_gflops),
        # None where no peak was measured (a suite run without its peak task).
        **{"matmul_peak_gflops": None, **(peak or {})},
        # How many times `matmul_peak_gflops` the yardstick of `peak_fraction` is.
        peak_devices=peak_devices,
        memory=common.memory_stats(prepared.compile.compiled),
        device_peak_bytes=common.device_peak_bytes(),
        rss_peak_bytes=common.peak_rss_bytes(),
        **extra,
    )


def bench(
    config: BenchConfig,
    mode: str,
    steps: int = common.MIN_TIMED_STEPS,
    warmup: int = common.DEFAULT_WARMUP,
    devices: int = 1,
    peak: dict[str, Any] | None = None,
    compiler_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Compiles and times `steps` train steps of one configuration and mode; returns the record."""
    common.check_step_counts(steps, warmup)
    prepared = PreparedStep(config, mode, devices, compiler_options=compiler_options)
    return measure(prepared, common.time_steps(prepared, steps, warmup), peak)


def bench_modes(
    config: BenchConfig,
    modes: Sequence[str],
    steps: int = common.MIN_TIMED_STEPS,
    warmup: int = common.DEFAULT_WARMUP,
    devices: int = 1,
    peak: dict[str, Any] | None = None,
    steps_per_block: int = 5,
    compiler_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Compiles every mode of one configuration, then times them in alternating blocks.

    Interleaving makes the ratio between modes (QAT/FP32) fair on a shared
    machine. Returns one record per mode, with `ratio_to_float` when `float`
    is among the modes.
    """
    common.check_step_counts(steps, warmup)
    prepared = {
        mode: PreparedStep(config, mode, devices, compiler_options=compiler_options)
        for mode in modes
    }
    times = common.time_in_blocks(prepared, steps, warmup, steps_per_block)
    records = [measure(prepared[mode], times[mode], peak) for mode in modes]
    add_float_ratios(records)
    return records


def add_float_ratios(records: Sequence[dict[str, Any]]) -> None:
    """Adds `ratio_to_float` (step time / the float step of the same configuration) in place."""
    float_median = {
        (r["config"], r["dtype"], r["batch_size"]): r["median_s"]
        for r in records
        if r["mode"] == "float"
    }
    for record in records:
        base = float_median.get((record["config"], record["dtype"], record["batch_size"]))
        record["ratio_to_float"] = record["median_s"] / base if base else None


REQUIRED_FIELDS: dict[str, Any] = {
    "mode": str,
    "dtype": str,
    "batch_size": int,
    "devices": int,
    "compiler_options": (dict, type(None)),
    "params": int,
    "compile_s": float,
    "first_call_s": float,
    "median_s": float,
    "p10_s": float,
    "p90_s": float,
    "steps": int,
    "samples_per_s": float,
    "flops": (float, type(None)),
    "flops_method": str,
    "flops_loops_counted_once": int,
    "gflops_per_s": (float, type(None)),
    "peak_fraction": (float, type(None)),
    "matmul_peak_gflops": (float, type(None)),
    "peak_devices": int,
    "memory": (dict, type(None)),
    "rss_peak_bytes": int,
}

COLUMNS = [
    ("config", "config", ""),
    ("mode", "mode", ""),
    ("dtype", "dtype", ""),
    ("B", "batch_size", ""),
    ("params", "params", ""),
    ("compile s", "compile_s", ".1f"),
    ("median ms", "median_ms", ".2f"),
    ("samples/s", "samples_per_s", ".0f"),
    ("GFLOP/step", "gflop", ".3f"),
    ("GFLOP/s", "gflops_per_s", ".2f"),
    ("% peak", "peak_percent", ".1f"),
    ("vs float", "ratio_to_float", ".2f"),
    ("peak MiB", "peak_mib", ".1f"),
]


def table_view(record: dict[str, Any]) -> dict[str, Any]:
    """Derived display fields (ms, GFLOP, percent, MiB) for the table."""
    memory = record.get("memory") or {}
    return {
        **record,
        "median_ms": record["median_s"] * 1e3,
        "gflop": record["flops"] / 1e9 if record.get("flops") else None,
        "peak_percent": 100 * record["peak_fraction"] if record.get("peak_fraction") else None,
        "peak_mib": memory["peak_bytes"] / 2**20 if memory else None,
    }


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.train_step [--config ...] [--mode ...] [--json]`."""
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--config", default="seed,electricity", help=f"comma-separated subset of {list(CONFIGS)}"
    )
    parser.add_argument(
        "--mode", default="float,qat", help=f"comma-separated subset of {list(MODES)}"
    )
    parser.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="the model's compute dtype"
    )
    parser.add_argument(
        "--batch-size", type=common.positive_int, default=None, help="override the batch size"
    )
    parser.add_argument(
        "--devices",
        type=common.positive_int,
        default=1,
        help="data-parallel devices (simulated CPU devices share the cores: their records' "
        "peak_fraction is of the one machine peak, peak_devices 1)",
    )
    parser.add_argument(
        "--fast-compile",
        action="store_true",
        help="compile the step with tft_jax.train.FAST_COMPILE_OPTIONS",
    )
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        names = common.split_names(args.config, CONFIGS, "--config")
        modes = common.split_names(args.mode, MODES, "--mode")
        configs = [get_config(name, args.dtype, args.batch_size) for name in names]
        check_devices(args.devices, configs)
        common.setup(args)
    # The yardstick of `peak_fraction`: the matmul peak in the dtype the steps compute in.
    peak = common.matmul_peak_gflops(args.dtype)
    records = [
        record
        for config in configs
        for record in bench_modes(
            config,
            modes,
            args.steps,
            args.warmup,
            args.devices,
            peak,
            compiler_options=train.FAST_COMPILE_OPTIONS if args.fast_compile else None,
        )
    ]
    common.emit(
        records,
        COLUMNS,
        args.json,
        args.output,
        title=(
            f"train_step ({peak['matmul_peak_dtype']} matmul peak "
            f"{peak['matmul_peak_gflops']:.1f} GFLOP/s)"
        ),
        view=table_view,
    )
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    common.run_command(main)
