"""Timing helpers shared by the benchmarks: compile time, step medians, FLOPs, memory, JSON.

Every benchmark measures the public functions users call, the same way:

* compile time: wall time of `jitted.lower(...)` (trace and lowering) and of
  `.compile()` (XLA), with the persistent compilation cache switched off;
* step time: `warmup` untimed calls, then the median (and p10/p90) over
  `steps` calls (`MIN_TIMED_STEPS` by default; fewer are allowed for a quick
  look, and each record says how many were timed), each ended by
  `jax.block_until_ready`;
* FLOPs: XLA's cost analysis of the lowered program with every loop iteration
  counted and the variable selection in one chunk (`count_flops`);
* the float32 matmul peak of this machine, measured in the same process, so
  achieved GFLOP/s can be read as a fraction of it;
* memory: XLA's memory analysis of the executable (argument + output - alias +
  temp bytes), the device's peak bytes where the runtime reports them, and the
  process's peak resident set.

Each result is a flat dict (a "record") printed as a table row or, with
`--json`, as one JSON line that carries the machine, the date and the versions.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import re
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tft_jax.data.listing import repeated

SCHEMA_VERSION = 1
MIN_TIMED_STEPS = 20
DEFAULT_WARMUP = 3
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "torch", "pytorch-forecasting")

# Keys every record carries, with their types (checked by `validate_record`).
RECORD_KEYS: dict[str, type | tuple[type, ...]] = {
    "schema_version": int,
    "benchmark": str,
    "config": str,
    "load_average_1m": float,
    "env": dict,
}
ENV_KEYS: dict[str, type | tuple[type, ...]] = {
    "date_utc": str,
    "python": str,
    "platform": str,
    "cpu_model": str,
    "logical_cpus": int,
    "backend": str,
    "device_kind": str,
    "device_count": int,
    "versions": dict,
}


# ---------------------------------------------------------------------------
# Set-up


def disable_compilation_cache() -> None:
    """Switches JAX's persistent compilation cache off, so that compile times are real."""
    jax.config.update("jax_enable_compilation_cache", False)


def check_step_counts(steps: int, warmup: int, minimum: int = 1) -> None:
    """Raises `ValueError` unless `steps >= minimum` and `warmup >= 0` (both ints)."""
    for name, value, low in (("steps", steps, minimum), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")


# ---------------------------------------------------------------------------
# Timing


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """Wall-clock seconds of individual timed calls (after warm-up).

    `warmup` is the number of untimed calls before them; `steps_per_block`
    the calls of one function in a row when several were timed in turns
    (None when it was timed alone).
    """

    seconds: tuple[float, ...]
    warmup: int | None = None
    steps_per_block: int | None = None

    @property
    def median(self) -> float:
        return float(statistics.median(self.seconds))

    def percentile(self, q: float) -> float:
        """The `q`-th percentile (0..100) of the call times."""
        return float(np.percentile(np.asarray(self.seconds), q))

    def summary(self, prefix: str = "") -> dict[str, float | int]:
        """`{prefix}median_s`, `p10_s`, `p90_s`, `min_s`, the number of timed steps, and
        `warmup` and `steps_per_block` where they are known."""
        summary: dict[str, float | int] = {
            f"{prefix}median_s": self.median,
            f"{prefix}p10_s": self.percentile(10),
            f"{prefix}p90_s": self.percentile(90),
            f"{prefix}min_s": float(min(self.seconds)),
            f"{prefix}steps": len(self.seconds),
        }
        if self.warmup is not None:
            summary[f"{prefix}warmup"] = self.warmup
        if self.steps_per_block is not None:
            summary[f"{prefix}steps_per_block"] = self.steps_per_block
        return summary


def first_calls(steps: Mapping[str, Callable[[], Any]]) -> None:
    """Calls each step once, untimed, whatever `warmup` the timing is given.

    The first call of an executable compiled ahead of time pays one-off costs
    (loading it, the first dispatch, allocations) that later calls do not;
    with `--warmup 0` it would otherwise be one of the timed calls. The train
    steps make this call when they are built (`train_step.PreparedStep`).
    """
    for step in steps.values():
        step()


def time_steps(step: Callable[[], Any], steps: int, warmup: int = DEFAULT_WARMUP) -> StepTimes:
    """Calls `step()` `warmup` times untimed, then `steps` times, each timed on its own.

    `step` must block until its work is done (end it with `jax.block_until_ready`,
    or synchronise the peer framework).
    """
    check_step_counts(steps, warmup)
    for _ in range(warmup):
        step()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return StepTimes(tuple(seconds), warmup=warmup)


def time_alternating(
    steps: Mapping[str, Callable[[], Any]],
    blocks: int,
    steps_per_block: int,
    warmup: int = DEFAULT_WARMUP,
    total_steps: int | None = None,
) -> dict[str, StepTimes]:
    """Times several step functions in turns: `blocks` rounds of `steps_per_block` calls each.

    Interleaving spreads the load of a shared machine evenly over the
    contenders, so their ratio is fair even when absolute times drift. Each
    function is warmed up `warmup` times first; every timed call is recorded.
    `total_steps` (at most `blocks * steps_per_block`) times exactly that many
    calls of each function: the last round is cut short.
    """
    check_step_counts(blocks, warmup)
    check_step_counts(steps_per_block, 0)
    total = blocks * steps_per_block if total_steps is None else total_steps
    check_step_counts(total, 0)
    if total > blocks * steps_per_block:
        raise ValueError(
            f"total_steps={total} is more than blocks * steps_per_block = "
            f"{blocks} * {steps_per_block}"
        )
    for step in steps.values():
        for _ in range(warmup):
            step()
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for block in range(blocks):
        calls = min(steps_per_block, total - block * steps_per_block)
        for name, step in steps.items():
            for _ in range(calls):
                start = time.perf_counter()
                step()
                seconds[name].append(time.perf_counter() - start)
    return {
        name: StepTimes(tuple(values), warmup=warmup, steps_per_block=steps_per_block)
        for name, values in seconds.items()
    }


def block_size(count: int, steps_per_block: int) -> int:
    """The calls per block `time_in_blocks` uses for `count` calls of each function.

    At most `steps_per_block`, and at most half of `count`, so that any two
    or more calls of each alternate at least twice (`count=3` in blocks of 5
    would otherwise time all of one function, then all of the next).
    """
    check_step_counts(count, 0)
    check_step_counts(steps_per_block, 0)
    return max(1, min(steps_per_block, count // 2))


def time_in_blocks(
    steps: Mapping[str, Callable[[], Any]], count: int, warmup: int, steps_per_block: int
) -> dict[str, StepTimes]:
    """`time_alternating` of exactly `count` calls of each, in blocks of `block_size(...)` calls.

    Each result's `steps_per_block` is the block size actually used.
    """
    block = block_size(count, steps_per_block)
    return time_alternating(steps, -(-count // block), block, warmup, total_steps=count)


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """A compiled executable and how long it took to get it."""

    compiled: Any
    lower_s: float
    compile_s: float

    @property
    def total_s(self) -> float:
        """Trace + lowering + XLA compilation, the cost of a first call."""
        return self.lower_s + self.compile_s


def compile_timed(jitted: Any, *args: Any, **kwargs: Any) -> CompileResult:
    """Lowers and compiles `jitted` (a `jax.jit` function) for these arguments, timed.

    JAX keeps the executable, so the next call of `jitted` with arguments of
    the same shapes runs it without compiling again.
    """
    return compile_lowering_timed(jitted.lower, *args, **kwargs)


def compile_lowering_timed(lower: Callable[..., Any], *args: Any, **kwargs: Any) -> CompileResult:
    """Calls `lower(*args, **kwargs)` (returning a `jax.stages.Lowered`) and compiles it, timed.

    For public ahead-of-time entry points such as `tft_jax.train.lower_train_step`.
    """
    start = time.perf_counter()
    lowered = lower(*args, **kwargs)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    return CompileResult(compiled, lowered_at - start, done - lowered_at)


# ---------------------------------------------------------------------------
# FLOPs and memory


def _first_analysis(analysis: Any) -> Mapping[str, Any] | None:
    """Cost analysis is a dict in current JAX and a one-element list in older releases."""
    if isinstance(analysis, Sequence) and not isinstance(analysis, str | bytes):
        analysis = analysis[0] if analysis else None
    return analysis if isinstance(analysis, Mapping) else None


def cost_flops(compiled: Any) -> float | None:
    """XLA's FLOP count of one call of a compiled (or lowered) program (None if absent).

    XLA counts each loop body once: a `lax.scan` over `T` steps contributes
    the FLOPs of a single step. A sharded executable reports one device's
    share. The benchmarks report `count_flops` instead, which counts every
    iteration; this is XLA's raw figure.
    """
    try:
        analysis = _first_analysis(compiled.cost_analysis())
    except Exception:  # some backends do not implement cost analysis
        return None
    if not analysis or "flops" not in analysis:
        return None
    flops = float(analysis["flops"])
    return flops if flops > 0 else None


# How `count_flops` counts, recorded with every FLOP figure (`flops_method`).
FLOPS_METHOD = "lowered; selection in one chunk; scan bodies x trip count"


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """The FLOPs of one call of a function, every loop iteration counted (`count_flops`).

    `flops`: XLA's cost analysis of the lowered (unoptimized) program, each
    `lax.scan` body counted once per iteration (XLA alone counts it once);
    `xla_flops`: XLA's own count of that lowering (loop bodies once);
    `loops_counted_once`: loops whose trip count is not known from the
    program (`lax.while_loop`, a loop inside one branch of a `lax.cond`),
    whose bodies `flops` still counts once: while it is not 0, `flops` is a
    lower bound.
    """

    flops: float | None
    xla_flops: float | None
    loops_counted_once: int = 0

    def fields(self, median_s: float, peak_gflops: float | None) -> dict[str, Any]:
        """A record's FLOP fields for a step of `median_s`: `throughput_fields`' (`flops`,
        `gflops_per_s`, `peak_fraction`), `flops_method` and `flops_loops_counted_once`."""
        return {
            **throughput_fields(self.flops, median_s, peak_gflops),
            "flops_method": FLOPS_METHOD,
            "flops_loops_counted_once": self.loops_counted_once,
        }


@contextlib.contextmanager
def one_selection_chunk() -> Iterator[None]:
    """Traces inside run the variable selection networks over all rows at once.

    On CPU `tft_jax.chunked_selection` runs them over chunks of rows under
    `lax.scan` + `jax.checkpoint` (`default_chunk_rows`); rows are
    independent, so one chunk computes the same function without the
    rematerialized forward and the padding rows of the chunked loop: the
    model's own FLOPs, whatever the chunking. Only for the FLOP-counting
    trace: never trace a timed function inside, and never a `jax.jit`
    function (its trace cache would keep the one-chunk program for later
    calls; `count_flops` traces a fresh wrapper).
    """
    from tft_jax import chunked_selection

    chunked = chunked_selection.chunked_rows

    def whole(
        body: Callable[..., Any],
        row_inputs: tuple[Any, ...],
        row_axes: tuple[int, ...],
        num_rows: int,
        chunk_rows: int,
    ) -> tuple[Any, ...]:
        return chunked(body, row_inputs, row_axes, num_rows, max(num_rows, 1))

    chunked_selection.chunked_rows = whole
    try:
        yield
    finally:
        chunked_selection.chunked_rows = chunked


def _sub_jaxprs(params: Mapping[str, Any]) -> Iterator[Any]:
    """The jaxprs among an equation's parameters (open `Jaxpr`s)."""
    from jax.extend import core as jex

    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            if isinstance(item, jex.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jex.Jaxpr):
                yield item


def _outer_loops(jaxpr: Any, in_branch: bool = False) -> Iterator[tuple[Any, bool]]:
    """The `scan` and `while` equations of `jaxpr` that no other loop contains.

    Calls (`pjit`, `checkpoint`, custom derivatives) run their jaxpr once and
    are looked into; `in_branch` says whether a loop lies in a `cond` branch.
    """
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in ("scan", "while"):
            yield eqn, in_branch
            continue
        for sub in _sub_jaxprs(eqn.params):
            yield from _outer_loops(sub, in_branch or name == "cond")


def _copies_counted(length: int, unroll: int) -> int:
    """How many copies of a scan body its lowering holds, as XLA counts them.

    JAX lowers a scan of `length` unrolled `unroll` times as a while loop
    of `length // unroll` trips over `unroll` copies plus the remainder's
    copies outside it; one trip (or `unroll=0`) is fully unrolled
    (`jax._src.lax.control_flow.loops._scan_impl`).
    """
    if unroll == 0:
        return length
    trips, remainder = divmod(length, unroll)
    if unroll != 1 and trips == 1 and remainder == 0:
        return length
    return (unroll if trips else 0) + remainder


def _lowered_flops(closed: Any) -> float:
    from jax.extend import core as jex

    shapes = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    lowered = jax.jit(jex.jaxpr_as_fun(closed)).lower(*shapes)
    analysis = _first_analysis(lowered.cost_analysis()) or {}
    return max(float(analysis.get("flops", 0.0)), 0.0)


def _jaxpr_flops(closed: Any) -> tuple[float, float, int]:
    """`(XLA's count, every iteration counted, loops counted once)` of a closed jaxpr.

    XLA's count holds each scan body `_copies_counted` times; the body runs
    `length` times, each time costing its own corrected count.
    """
    from jax.extend import core as jex

    xla = _lowered_flops(closed)
    total, once = xla, 0
    for eqn, in_branch in _outer_loops(closed.jaxpr):
        if eqn.primitive.name != "scan" or in_branch:
            once += 1
            continue
        body = eqn.params["jaxpr"]
        body = body if isinstance(body, jex.ClosedJaxpr) else jex.ClosedJaxpr(body, ())
        body_xla, body_total, body_once = _jaxpr_flops(body)
        length = int(eqn.params["length"])
        total += length * body_total - _copies_counted(length, int(eqn.params["unroll"])) * body_xla
        once += body_once
    return xla, total, once


def count_flops(function: Callable[..., Any], *args: Any) -> FlopCount:
    """The FLOPs of one call `function(*args)`, every loop iteration counted.

    `function` is traced afresh (a `jax.jit` function is unwrapped: its
    trace cache is left alone, so the timed executable stays the program
    it was) with the variable selection networks in one chunk
    (`one_selection_chunk`), so the count does not depend on the chunking;
    the jaxpr is lowered and XLA's cost analysis of it is corrected for
    every `lax.scan` (the LSTM's recurrence, its transpose in the backward
    pass): each body counted `length` times, not once. The count is of the
    whole computation (all devices' shares of a sharded one). Static
    arguments go into `function` (a `functools.partial`), not `args`.
    """
    from jax.extend import core as jex

    if hasattr(function, "lower"):  # a `jax.jit` function: trace what it wraps
        function = getattr(function, "__wrapped__", function)
    with one_selection_chunk():
        closed = jax.make_jaxpr(lambda *a: function(*a))(*args)
    if not isinstance(closed, jex.ClosedJaxpr):  # pragma: no cover - make_jaxpr always closes
        raise TypeError(f"make_jaxpr gave {type(closed).__name__}")
    try:
        xla, total, once = _jaxpr_flops(closed)
    except Exception:  # some backends do not implement cost analysis
        return FlopCount(None, None, 0)
    return FlopCount(total if total > 0 else None, xla if xla > 0 else None, once)


def program_digest(lowered: Any) -> str:
    """The SHA-256 of a `jax.stages.Lowered`'s StableHLO text, debug info left out.

    Debug info: source locations, and the module's name (the traced
    function's). Equal digests: the very same program, whatever the Python
    that traced it. A benchmark comparing variants that lower to one program
    times noise, not a difference: it reports no ratio for them (`same_program`).
    """
    text = re.sub(r"^module @\S+", "module", lowered.as_text(debug_info=False), count=1)
    lines = [line for line in text.splitlines() if not line.startswith("#loc")]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def mark_same_programs(
    records: Sequence[dict[str, Any]], baseline: str, key: Callable[[Mapping[str, Any]], Any]
) -> None:
    """Sets each record's `same_program` against the `baseline` variant's, in place.

    Records are compared within `key` (e.g. the configuration). A variant's
    `same_program`: its `program_sha256` is the baseline's; the baseline's
    own: some other variant's is; None without a baseline record. A variant
    with the same program as its baseline gets no ratios: timing one program
    twice measures noise, not the variant.
    """
    bases = {key(r): r for r in records if r["variant"] == baseline}
    for record in records:
        base = bases.get(key(record))
        if base is None:
            record["same_program"] = None
        elif record is base:
            record["same_program"] = any(
                r is not base
                and key(r) == key(base)
                and r["program_sha256"] == base["program_sha256"]
                for r in records
            )
        else:
            record["same_program"] = record["program_sha256"] == base["program_sha256"]


def memory_stats(compiled: Any) -> dict[str, int] | None:
    """Bytes of a compiled executable's buffers from XLA's memory analysis (None if absent).

    `peak_bytes` is `argument + output - alias + temp`: what the executable
    needs on the device at once (donated arguments alias outputs).
    """
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # some backends do not implement memory analysis
        return None
    if analysis is None:
        return None
    fields = {
        "argument_bytes": int(analysis.argument_size_in_bytes),
        "output_bytes": int(analysis.output_size_in_bytes),
        "alias_bytes": int(analysis.alias_size_in_bytes),
        "temp_bytes": int(analysis.temp_size_in_bytes),
    }
    fields["peak_bytes"] = (
        fields["argument_bytes"]
        + fields["output_bytes"]
        - fields["alias_bytes"]
        + fields["temp_bytes"]
    )
    return fields


def peak_rss_bytes() -> int:
    """The peak resident set size of this process so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def device_peak_bytes(device: Any = None) -> int | None:
    """The device allocator's peak bytes in use since the process started (GPU/TPU).

    None where the device reports nothing (CPU). JAX offers no reset of this
    peak: in a suite, a record's value also covers every earlier task.
    """
    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # the CPU client raises or returns None depending on the release
        return None
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return int(stats["peak_bytes_in_use"])


def matmul_peak_gflops(dtype: str = "float32", size: int | None = None, repeats: int = 8) -> dict:
    """This machine's matmul peak: the best GFLOP/s of a jitted square matmul, measured now.

    `size` defaults to 1024 on CPU and 8192 on accelerators. The best of
    `repeats` timed calls stands for the peak (contention only slows calls down).
    Returns `{"matmul_peak_gflops", "matmul_peak_dtype", "matmul_peak_size"}`.
    """
    check_step_counts(repeats, 0)
    accelerator = jax.default_backend() != "cpu"
    size = size or (8192 if accelerator else 1024)
    keys = jax.random.split(jax.random.key(0))
    a = jax.random.normal(keys[0], (size, size), jnp.dtype(dtype))
    b = jax.random.normal(keys[1], (size, size), jnp.dtype(dtype))
    matmul = jax.jit(jnp.matmul)
    times = time_steps(lambda: matmul(a, b).block_until_ready(), repeats, warmup=2)
    return {
        "matmul_peak_gflops": 2.0 * size**3 / min(times.seconds) / 1e9,
        "matmul_peak_dtype": jnp.dtype(dtype).name,
        "matmul_peak_size": size,
    }


def throughput_fields(
    flops: float | None, median_s: float, peak_gflops: float | None
) -> dict[str, float | None]:
    """Achieved GFLOP/s of a step and its fraction of the measured matmul peak."""
    achieved = flops / median_s / 1e9 if flops else None
    fraction = achieved / peak_gflops if achieved and peak_gflops else None
    return {"flops": flops, "gflops_per_s": achieved, "peak_fraction": fraction}


# ---------------------------------------------------------------------------
# Records and output


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def environment() -> dict[str, Any]:
    """The machine, the date and the package versions, recorded with every result."""
    devices = jax.devices()
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count() or 0,
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        # Several CPU devices in one process exist only through
        # --xla_force_host_platform_device_count: they share the same cores.
        "simulated_devices": jax.default_backend() == "cpu" and len(jax.local_devices()) > 1,
        "versions": {name: _version(name) for name in _PACKAGES},
        # The malloc tunables the process started with (see tft_jax.allocator).
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "ld_preload": os.environ.get("LD_PRELOAD"),
    }


def make_record(benchmark: str, config: str, **fields: Any) -> dict[str, Any]:
    """A result: the benchmark's name, its configuration, the fields, the load and the machine.

    The date is the record's own (`environment` is read once per process).
    """
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {
        "schema_version": SCHEMA_VERSION,
        "benchmark": benchmark,
        "config": config,
        **fields,
        "load_average_1m": float(os.getloadavg()[0]),
        "env": {**environment(), "date_utc": now},
    }


def validate_record(record: Mapping[str, Any], required: Mapping[str, Any] = ()) -> None:
    """Raises `ValueError` naming the key when a record misses a field or has the wrong type.

    `required` maps benchmark-specific keys to a type or a tuple of types
    (`type(None)` allowed for fields some backends cannot measure).
    """
    for expected in (RECORD_KEYS, dict(required)):
        for key, types in expected.items():
            if key not in record:
                raise ValueError(f"record of {record.get('benchmark')!r} lacks {key!r}")
            value = record[key]
            allowed = types if isinstance(types, tuple) else (types,)
            if float in allowed and isinstance(value, int) and not isinstance(value, bool):
                continue
            if not isinstance(value, allowed):
                raise ValueError(
                    f"record field {key!r} must be {allowed}, got {type(value).__name__} {value!r}"
                )
    for key, types in ENV_KEYS.items():
        if not isinstance(record["env"].get(key), types):
            raise ValueError(f"record env field {key!r} must be {types}, got {record['env']}")
    json.dumps(record, allow_nan=False)


def _format_value(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and spec:
        return format(value, spec)
    return str(value)


def format_table(
    records: Iterable[Mapping[str, Any]], columns: Sequence[tuple[str, str, str]]
) -> str:
    """A plain text table; `columns` are `(header, record key, format spec)`."""
    rows = [[header for header, _, _ in columns]]
    rows += [[_format_value(r.get(key), spec) for _, key, spec in columns] for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def emit(
    records: Sequence[Mapping[str, Any]],
    columns: Sequence[tuple[str, str, str]],
    as_json: bool,
    output: str | None = None,
    title: str | None = None,
    view: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
) -> None:
    """Prints `records` as JSON lines or as a table; with `output`, appends the JSON lines there.

    `view` maps a record to the row the table shows (derived display fields).
    The records are printed before they are appended to `output`, so that a
    file that cannot be written loses no measurement (`setup` checks the path
    before anything is measured).
    """
    lines = [json.dumps(record, allow_nan=False) for record in records]
    if as_json:
        print("\n".join(lines), flush=True)
    else:
        if title:
            print(title)
        rows = [view(record) for record in records] if view else records
        print(format_table(rows, columns), flush=True)
    if output:
        with open(output, "a", encoding="utf-8") as handle:
            handle.writelines(line + "\n" for line in lines)


def _int_at_least(text: str, minimum: int) -> int:
    """`int(text)`, or `argparse.ArgumentTypeError` (which argparse reports with the flag)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be an int >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse `type`: an int >= 1, refused at parse time with the flag's name."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse `type`: an int >= 0, refused at parse time with the flag's name."""
    return _int_at_least(text, 0)


def positive_seconds(text: str) -> float:
    """An argparse `type`: a finite number of seconds > 0, else a usage error naming the flag.

    `inf` (and `nan`) would end up in a record, which strict JSON
    (`allow_nan=False`) cannot hold: the run would fail writing its summary,
    after the measurements, instead of being refused before them.
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


@contextlib.contextmanager
def usage_errors(parser: argparse.ArgumentParser) -> Iterator[None]:
    """Turns a `ValueError` of the checks on parsed flags into `parser.error` (usage, exit 2).

    The checks (`split_names`, `split_positive_ints`, `setup`) name the flag in their
    message; a command line with a bad value should end with that one line, not
    a traceback. Wrap only those checks: errors of the measurement itself keep
    their traceback.
    """
    try:
        yield
    except ValueError as error:
        parser.error(str(error))


# The flags that set how much a benchmark allocates, named when it runs out of memory.
SIZE_FLAGS = (
    "--config", "--ratio-config", "--batch-size", "--batch-sizes", "--size", "--sizes",
    "--lengths", "--rows", "--series", "--hidden-dim", "--heads", "--devices", "--batches",
    "--set", "--tables",
)  # fmt: skip


def _is_out_of_memory(error: BaseException) -> bool:
    """NumPy's `MemoryError`, or XLA's RESOURCE_EXHAUSTED (any backend's allocator)."""
    if isinstance(error, MemoryError):
        return True
    return isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(error)


def sizes_given(argv: Sequence[str]) -> list[str]:
    """The size flags in `argv` with their values, as typed ('--tables a b', '--set=x=1')."""
    given = []
    for index, token in enumerate(argv):
        if token.split("=", 1)[0] not in SIZE_FLAGS:
            continue
        values = []
        if "=" not in token:
            for value in argv[index + 1 :]:
                if value.startswith("--"):
                    break
                values.append(value)
        given.append(" ".join([token, *values]))
    return given


def run_command(main: Callable[[], Any]) -> Any:
    """Runs a benchmark's `main` as a command: running out of memory ends in one line.

    A size too large for the machine otherwise ends in a traceback from deep
    inside the measurement (XLA's RESOURCE_EXHAUSTED, NumPy's MemoryError);
    the line names the benchmark, the allocator's words and the size flags
    given, and the exit status is 1. Other errors keep their traceback.
    Returns what `main` returns.
    """
    try:
        return main()
    except (MemoryError, jax.errors.JaxRuntimeError) as error:
        if not _is_out_of_memory(error):
            raise
        program = f"benchmarks.{os.path.splitext(os.path.basename(sys.argv[0]))[0]}"
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        sizes = ", ".join(sizes_given(sys.argv[1:])) or "the defaults"
        sys.exit(
            f"{program}: out of memory ({detail}) with {sizes}; measure a smaller configuration"
        )


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` with each option's default, e.g. `(default: 20)`.

    Left out where it says nothing: a default of None (the option's help says
    what not giving it means) and flags (`store_true`, whose default is off).
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.nargs == 0:
            return action.help
        return super()._get_help_string(action)


def base_parser(
    description: str,
    steps: int = MIN_TIMED_STEPS,
    *,
    steps_help: str = "timed calls per measurement",
    warmup_help: str = "untimed calls before timing, after the one untimed first call that "
    "always precedes them",
    output_help: str = "also append the JSON lines to this file",
    compile_cache_help: str = "keep JAX's persistent compilation cache on (compile times then "
    "measure cache loads)",
) -> argparse.ArgumentParser:
    """The options every benchmark shares: `--json`, `--output`, `--steps`, `--warmup`.

    `--help` shows the defaults (`HelpFormatter`); a script whose steps are
    not timed calls says what they are with `steps_help` and `warmup_help`,
    and one that reports no compile time what `--compile-cache` does for it
    with `compile_cache_help`.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object per line")
    parser.add_argument("--output", help=output_help)
    parser.add_argument("--steps", type=positive_int, default=steps, help=steps_help)
    parser.add_argument("--warmup", type=non_negative_int, default=DEFAULT_WARMUP, help=warmup_help)
    parser.add_argument(
        "--compile-cache",
        action="store_true",
        help=compile_cache_help,
    )
    return parser


def check_path_given(path: str, option: str, kind: str = "file") -> None:
    """Raises `ValueError` naming `option` when `path` is empty.

    `Path("")` and `open` relative to `""` mean the current directory: an
    empty value would write there instead of being refused.
    """
    if not path:
        raise ValueError(f"{option} is empty: give a {kind} name")


def check_output_path(path: str | None, option: str = "--output") -> None:
    """Raises `ValueError` naming `option` unless `path` (if given) can be appended to.

    The JSON lines are written when a benchmark ends, so a path in a missing
    or read-only directory must be refused before minutes of measurements,
    not after them. The check opens the file for appending, as the write will
    (permission bits alone say nothing for root, nor for a dangling link or a
    read-only mount), and leaves it as it was: an existing file unchanged, a
    new one removed again (nothing is created).
    """
    if path is None:
        return
    check_path_given(path, option)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{option} must name a file, got the directory {path!r}")
    if not os.path.isdir(directory):
        raise ValueError(f"{option}: the directory {directory!r} of {path!r} does not exist")
    # A dangling link: appending would create its target, which then stays.
    target = os.path.realpath(path) if os.path.islink(path) else path
    try:
        try:
            with open(target, "x", encoding="utf-8"):
                created = True
        except FileExistsError:
            with open(target, "a", encoding="utf-8"):
                created = False
    except OSError as error:
        raise ValueError(
            f"{option}: {path!r} cannot be written ({error.strerror or error})"
        ) from None
    if created:
        with contextlib.suppress(OSError):
            os.remove(target)


def setup(args: argparse.Namespace) -> None:
    """Checks the shared options and switches the compilation cache off unless asked to keep it."""
    check_step_counts(args.steps, args.warmup)
    check_output_path(getattr(args, "output", None))
    if not args.compile_cache:
        disable_compilation_cache()


def split_names(text: str, allowed: Iterable[str], option: str) -> list[str]:
    """Parses a comma-separated list of names, each from `allowed` (`ValueError` otherwise)."""
    allowed = list(allowed)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        raise ValueError(f"{option} must be a comma-separated subset of {allowed}, got {text!r}")
    check_distinct(names, option, text)
    return names


def split_positive_ints(text: str, option: str) -> list[int]:
    """Parses a comma-separated list of distinct ints >= 1 (`ValueError` naming `option`)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option} must be comma-separated ints, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{option} must be positive ints, got {text!r}")
    check_distinct(values, option, text)
    return values


def check_distinct(values: Sequence[Any], option: str, text: str) -> None:
    """Raises `ValueError` naming `option` and each value that `values` holds more than once.

    A value twice would measure twice, the second time from JAX's in-memory
    caches (a compile time near 0 s recorded as the compile), and records keyed
    by it (a ratio to the float run of the same batch) would pair the wrong runs.
    `text` is the command line's spelling of the values, shown in the message.
    """
    twice = sorted(repeated(values))
    if twice:
        shown = ", ".join(map(str, twice))
        raise ValueError(f"{option} names {shown} more than once, got {text!r}")


# ---------------------------------------------------------------------------
# Suites


@dataclasses.dataclass(frozen=True)
class Task:
    """One unit of a suite: a name, what produces its records, and how to show them."""

    name: str
    part: str
    run: Callable[[], list[dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class PartView:
    """How a suite prints the records of one part (a benchmark module)."""

    title: str
    columns: Sequence[tuple[str, str, str]]
    view: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None


def run_suite(
    suite: str,
    tasks: Sequence[Task],
    budget_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
    report: Callable[[Task, list[dict[str, Any]]], None] | None = None,
    keep_going: bool = False,
) -> list[dict[str, Any]]:
    """Runs `tasks` in order until the time budget is spent; returns their records and a summary.

    A task is started only while `budget_s` has not run out (None = no
    budget); those left are named in the final `suite` record, with the
    elapsed time, so a cut-short run says what it skipped. `report(task,
    records)` is called as each task finishes (to print results as they come).
    With `keep_going`, a task that raises (`Exception`, not an interrupt) has
    its traceback printed on stderr and is named with its error in the
    summary's `tasks_failed`, and the next task runs: a one-shot run on a
    lent machine keeps what the other tasks measure.
    """
    start = clock()
    records: list[dict[str, Any]] = []
    done: list[str] = []
    skipped: list[str] = []
    failed: list[dict[str, str]] = []
    for task in tasks:
        if budget_s is not None and clock() - start >= budget_s:
            skipped.append(task.name)
            continue
        try:
            produced = task.run()
        except Exception as error:
            if not keep_going:
                raise
            traceback.print_exc(file=sys.stderr)
            print(f"{suite}: task {task.name!r} failed; continuing", file=sys.stderr, flush=True)
            failed.append({"task": task.name, "error": f"{type(error).__name__}: {error}"})
            continue
        records.extend(produced)
        done.append(task.name)
        if report is not None:
            report(task, produced)
    summary = make_record(
        "suite",
        suite,
        tasks_run=done,
        tasks_skipped=skipped,
        tasks_failed=failed,
        elapsed_s=clock() - start,
        budget_s=budget_s,
    )
    if report is not None:
        report(Task(suite, "suite", list), [summary])
    return [*records, summary]


def suite_reporter(
    views: Mapping[str, PartView], as_json: bool, output: str | None = None
) -> Callable[[Task, list[dict[str, Any]]], None]:
    """A `run_suite` report callback: JSON lines, or one table per benchmark, as tasks finish.

    With `output`, every record is also appended to that file as it comes.
    """

    def report(task: Task, records: list[dict[str, Any]]) -> None:
        if output:
            with open(output, "a", encoding="utf-8") as handle:
                handle.writelines(json.dumps(r, allow_nan=False) + "\n" for r in records)
        if as_json:
            if records:
                print("\n".join(json.dumps(r, allow_nan=False) for r in records), flush=True)
            return
        for record in (r for r in records if r["benchmark"] == "suite"):
            skipped = ", ".join(record["tasks_skipped"]) or "none"
            failed = ", ".join(f["task"] for f in record.get("tasks_failed", [])) or "none"
            print(
                f"\n{record['config']}: {len(record['tasks_run'])} tasks in "
                f"{record['elapsed_s']:.0f} s; skipped: {skipped}; failed: {failed}",
                flush=True,
            )
        for benchmark, part in views.items():
            rows = [r for r in records if r["benchmark"] == benchmark]
            if rows:
                emit(rows, part.columns, False, None, title=f"\n{part.title}", view=part.view)

    return report
