"""Where a train step spends its time: a `jax.profiler` trace attributed to model modules.

Runs `steps` train steps of one configuration under `jax.profiler.trace`
(with a Perfetto trace), reads the per-operation events of the trace, and maps
each executed HLO instruction to the `op_name` metadata of the compiled
module (`jit(_train_step)/jvp(TemporalFusionTransformer)/history_selection/...`),
so the time adds up per model module and per pass (forward `fwd`, backward
`bwd`, the optimizer and the rest `other`). Loop and call instructions are
left out so that their bodies are not counted twice. Instructions without
`op_name` metadata (copies and fusions XLA adds) are grouped by opcode under
the pass `?`; every record's `unattributed_share` is their share of the
step's operation time, also printed under the table (a share of all rows, not
only of the `--top` shown).

On CPU the per-operation events need `--xla_cpu_enable_xprof_traceme=true`
in `XLA_FLAGS`; this script adds it when JAX has not started a backend yet.

Usage::

    python -m benchmarks.profile_step --config electricity --steps 2 --depth 2 [--json]
"""

from __future__ import annotations

import collections
import contextlib
import glob
import gzip
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from tft_jax.allocator import relaunch_with_tuned_allocator

_TRACEME_FLAG = "--xla_cpu_enable_xprof_traceme=true"
# Trace events that are not HLO instructions (runtime, Python, bookkeeping).
_RUNTIME = re.compile(
    r"^(\$|end: |ThunkExecutor|PjitFunction|Pjrt|PjRt|CommonPjRt|ParseArguments|Handle |"
    r"SlinkyThreadPool|TfrtCpu|Execute|AllocateOutputBuffers)"
)
_CONTAINERS = re.compile(r"^(while|call|conditional)(\.\d+)?$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = .*?op_name=\"([^\"]*)\"", re.MULTILINE)
# An instruction whose opcode runs other computations (its event spans theirs): `%cond.9 =
# (f32[], s32[]) conditional(...)`. The shape may hold spaces; the opcode follows it.
_CONTAINER_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT )?%(\S+) = [^=]*?\s(?:while|call|conditional)\(", re.MULTILINE
)

# The pass of the instructions without `op_name` metadata (grouped by opcode).
UNATTRIBUTED = "?"


def enable_op_events() -> None:
    """Adds the XLA:CPU flag that emits one trace event per executed operation."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _TRACEME_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_TRACEME_FLAG}".strip()


def instruction_op_names(hlo_text: str) -> dict[str, str]:
    """`{instruction name: op_name metadata}` of a compiled HLO module's text."""
    return {match.group(1): match.group(2) for match in _INSTRUCTION.finditer(hlo_text)}


def module_of(op_name: str, depth: int) -> tuple[str, str]:
    """`(pass, module path)` of an `op_name`: the first `depth` scopes under the model.

    `jit(f)/transpose(jvp(Model))/a/b/c` is `("bwd", "a/b")` at depth 2;
    `jit(f)/jvp(Model)/a/b/c` is `("fwd", "a/b")`; anything else (optimizer,
    loss) is `("other", <first two scopes after jit(f)>)`.
    """
    parts = op_name.split("/")[1:] if op_name.startswith("jit(") else op_name.split("/")
    if parts and parts[0].startswith("transpose(jvp("):
        return "bwd", "/".join(parts[1 : 1 + depth])
    if parts and parts[0].startswith("jvp("):
        return "fwd", "/".join(parts[1 : 1 + depth])
    return "other", "/".join(parts[:2])


def container_instructions(hlo_text: str) -> frozenset[str]:
    """Names of the `while`/`call`/`conditional` instructions of a compiled HLO module's text."""
    return frozenset(match.group(1) for match in _CONTAINER_INSTRUCTION.finditer(hlo_text))


def op_durations(
    trace: Mapping[str, Any], containers: frozenset[str] = frozenset()
) -> collections.Counter:
    """Total microseconds per HLO instruction name in a Perfetto/Chrome trace.

    Runtime events and the events of instructions that run other
    computations (`containers`, and names like `while.3`) are left out: the
    operations they run have events of their own, which would count twice.
    """
    totals: collections.Counter = collections.Counter()
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X":
            continue
        name = event.get("name", "")
        if _RUNTIME.match(name) or _CONTAINERS.match(name) or name in containers:
            continue
        totals[name] += float(event.get("dur", 0.0))
    return totals


def attribute(
    durations: Mapping[str, float], op_names: Mapping[str, str], depth: int
) -> collections.Counter:
    """Microseconds per `(pass, module)`; instructions without metadata go to `("?", opcode)`."""
    totals: collections.Counter = collections.Counter()
    for name, micros in durations.items():
        op_name = op_names.get(name)
        opcode = re.sub(r"\.\d+$", "", name)
        key = module_of(op_name, depth) if op_name else (UNATTRIBUTED, opcode)
        totals[key] += micros
    return totals


def unattributed_share(totals: Mapping[tuple[str, str], float]) -> float:
    """The share of the time (of `attribute`'s totals) in instructions without `op_name`."""
    overall = sum(totals.values())
    missing = sum(micros for (phase, _), micros in totals.items() if phase == UNATTRIBUTED)
    return missing / overall if overall else 0.0


def check_trace_dir(trace_dir: str | None) -> None:
    """Raises `ValueError` naming `--trace-dir` unless the trace can be written there.

    Checked before the step is compiled and profiled (`jax.profiler` fails
    only after the steps ran): an existing path must be a folder this process
    can create a file in; a new one is created now, with its parents.
    """
    if trace_dir is None:
        return
    if not trace_dir:
        raise ValueError("--trace-dir is empty: give a folder")
    if os.path.exists(trace_dir) and not os.path.isdir(trace_dir):
        raise ValueError(f"--trace-dir must name a folder, got the file {trace_dir!r}")
    try:
        os.makedirs(trace_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=trace_dir):
            pass
    except OSError as error:
        raise ValueError(
            f"--trace-dir: cannot write in {trace_dir!r} ({error.strerror or error})"
        ) from None


def load_trace(directory: str) -> dict[str, Any]:
    """The newest `perfetto_trace.json.gz` under a `jax.profiler.trace` directory."""
    paths = sorted(
        glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True)
    )
    if not paths:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {directory}")
    with gzip.open(paths[-1], "rt", encoding="utf-8") as handle:
        return json.load(handle)


def profile(
    config_name: str,
    mode: str = "float",
    steps: int = 2,
    depth: int = 2,
    trace_dir: str | None = None,
    top: int = 25,
    warmup: int = 1,
) -> list[dict[str, Any]]:
    """Profiles `steps` train steps after `warmup` unprofiled ones.

    Returns one record per `(pass, module)`, largest first. The trace is kept
    in `trace_dir` when given (each record names it); otherwise it is written
    to a temporary folder, removed once read, and `trace_dir` is None.
    """
    import jax

    from benchmarks import common
    from benchmarks import train_step as steps_bench

    common.check_step_counts(steps, warmup)
    prepared = steps_bench.PreparedStep(steps_bench.get_config(config_name), mode)
    for _ in range(warmup):
        prepared()
    with contextlib.ExitStack() as stack:
        directory = trace_dir or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="tft-profile-")
        )
        with jax.profiler.trace(directory, create_perfetto_trace=True):
            for _ in range(steps):
                prepared()
        trace = load_trace(directory)
    hlo_text = prepared.compile.compiled.as_text()
    durations = op_durations(trace, container_instructions(hlo_text))
    totals = attribute(durations, instruction_op_names(hlo_text), depth)
    overall = sum(totals.values()) or 1.0
    unattributed = unattributed_share(totals)
    return [
        common.make_record(
            "profile_step",
            config_name,
            mode=mode,
            phase=phase,
            module=module,
            ms_per_step=micros / steps / 1e3,
            share=micros / overall,
            op_ms_per_step=overall / steps / 1e3,
            unattributed_share=unattributed,
            steps=steps,
            warmup=warmup,
            trace_dir=trace_dir,
        )
        for (phase, module), micros in totals.most_common(top)
    ]


COLUMNS = [
    ("pass", "phase", ""),
    ("module", "module", ""),
    ("ms/step", "ms_per_step", ".1f"),
    ("share %", "share_percent", ".1f"),
]


def table_view(record: dict[str, Any]) -> dict[str, Any]:
    """Percent for the table."""
    return {**record, "share_percent": 100 * record["share"]}


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.profile_step [--config electricity] [--depth 2]`."""
    enable_op_events()
    from benchmarks import common
    from benchmarks import train_step as steps_bench

    parser = common.base_parser(
        __doc__.splitlines()[0],
        steps=2,
        steps_help="profiled train steps (the records' times are per step)",
        warmup_help="unprofiled warm-up train steps before the profiled ones",
        compile_cache_help="keep JAX's persistent compilation cache on (a cached step loads "
        "instead of compiling: a quicker start; no compile time is reported here)",
    )
    parser.add_argument(
        "--config",
        default="electricity",
        choices=list(steps_bench.CONFIGS),
        help="the benchmarks.train_step configuration",
    )
    parser.add_argument(
        "--mode", default="float", choices=steps_bench.MODES, help="the train step's mode"
    )
    parser.add_argument(
        "--depth", type=common.positive_int, default=2, help="module scopes to group by"
    )
    parser.add_argument("--top", type=common.positive_int, default=25, help="rows to report")
    parser.add_argument(
        "--trace-dir",
        default=None,
        help="keep the trace in this folder, created if missing (by default it is written to "
        "a temporary folder and removed once read)",
    )
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        common.setup(args)
        check_trace_dir(args.trace_dir)  # last: it creates the folder
    records = profile(
        args.config, args.mode, args.steps, args.depth, args.trace_dir, args.top, args.warmup
    )
    total = records[0]["op_ms_per_step"] if records else 0.0
    unattributed = records[0]["unattributed_share"] if records else 0.0
    common.emit(
        records,
        COLUMNS,
        args.json,
        args.output,
        title=f"{args.config} {args.mode} train step: {total:.1f} ms of operations per step, "
        f"{100 * unattributed:.1f}% of them in instructions without op_name (pass "
        f"{UNATTRIBUTED!r})",
        view=table_view,
    )
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    from benchmarks import common  # imports JAX; XLA reads the flags when a backend starts

    common.run_command(main)
