"""One prepared run for a lent GPU/TPU: device tests, the property suite's device cases, benchmarks.

A lent accelerator comes for minutes, so what a session should check on it
is one command with a time box per stage. Each stage writes its log under
`--out`, and one JSON line per stage (also appended to
`OUT/device_check.jsonl`) says what ran, its exit status, its seconds and
its summary::

    python -m benchmarks.device_check --out results/device [--budget 480]

Stages, in order: the environment (packages, devices); the tests whose
meaning is on an accelerator at full optimization (cuDNN's attention, the
correctly rounded division); the property suite's device cases (`pytest -n 8
-k "gpu or tpu"`, fewer workers on a host with fewer cores); `python -m
benchmarks.accelerator` in what remains of the budget. A stage past its time
box is stopped with the processes it started (its record says `timed_out`)
and the next one runs. Exits 1 when a stage failed or timed out. The boxes
of the stages chosen must fit in `--budget`, and on a machine where JAX
finds no GPU or TPU every stage but the environment is refused unless
`--allow-cpu` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import common
from benchmarks.backend_probe import probe_default_backend
from tft_jax.allocator import relaunch_with_tuned_allocator

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the stages run from the checkout
DEFAULT_BUDGET_S = 480.0
DEVICE_TESTS = ("tests/test_fused_attention.py", "tests/test_division.py")
PROPERTY_TESTS = (
    "tests/test_backends.py",
    "tests/test_properties_attention.py",
    "tests/test_properties_tft.py",
    "tests/test_properties_optimizer.py",
    "tests/test_properties_qat.py",
)
PROPERTY_WORKERS = min(8, os.cpu_count() or 1)  # each device case compiles on the host
STAGE_LIMITS_S = {"environment": 60.0, "device_tests": 100.0, "properties": 150.0}
ACCELERATOR_MARGIN_S = 45.0  # the accelerator's last task finishes after its budget
_ENVIRONMENT = """
import importlib.metadata as metadata
import jax
for name in ("jax", "jaxlib", "flax", "optax", "chex", "orbax-checkpoint", "hypothesis", "numpy"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "absent")
print("devices", jax.devices())
"""
_PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed|error|skipped|deselected).*?)\s*=*$")


def pytest_summary(log: str) -> str | None:
    """pytest's last summary line ('3 passed, 1 skipped in 2.1s'), None if it never got there."""
    for line in reversed(log.splitlines()):
        match = _PYTEST_SUMMARY.match(line.strip())
        if match:
            return match.group(1)
    return None


def _stop(process: subprocess.Popen) -> None:
    """Kills a stage and, on POSIX, every process of its group, then waits for it.

    Killing only the stage's own process would leave what it started (pytest-xdist's
    workers) running on past the time box, holding the cores and the chip.
    """
    if os.name == "posix":
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(process.pid, signal.SIGKILL)
    else:
        process.kill()
    process.wait()


def run_stage(
    name: str, command: Sequence[str], limit_s: float, out: pathlib.Path
) -> dict[str, Any]:
    """Runs `command` for at most `limit_s` seconds, its output in `out/NAME.log`; its record.

    On POSIX the stage leads a session of its own, so that a stage past its
    time box (or interrupted) is stopped with all the processes it started.
    """
    log_path = out / f"{name}.log"
    start = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=os.name == "posix",
        )
        try:
            returncode: int | None = process.wait(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _stop(process)
            returncode, timed_out = None, True
        except BaseException:  # Ctrl-C: in a session of its own, the stage never sees it
            _stop(process)
            raise
    text = log_path.read_text(errors="replace")
    return {
        "stage": name,
        "command": " ".join(part if len(part) < 200 else "<script>" for part in command),
        "returncode": returncode,
        "timed_out": timed_out,
        "elapsed_s": time.perf_counter() - start,
        "limit_s": limit_s,
        "summary": pytest_summary(text) or (text.strip().splitlines() or [""])[-1][-300:],
        "log": str(log_path),
    }


STAGE_NAMES = ("environment", "device_tests", "properties", "accelerator")
MIN_ACCELERATOR_S = 30.0  # the accelerator's own budget: at least one task's worth


def stages(
    out: pathlib.Path, budget_s: float, names: Sequence[str] = STAGE_NAMES
) -> list[tuple[str, list[str], float]]:
    """`(name, command, time box)` of each stage in `names`, their boxes within `budget_s`.

    The accelerator gets what the other stages' boxes leave (less its margin
    for the last task); `ValueError` when the budget cannot hold the stages.
    """
    python = sys.executable
    pytest = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    fixed = sum(limit for name, limit in STAGE_LIMITS_S.items() if name in names)
    needed = fixed + (MIN_ACCELERATOR_S + ACCELERATOR_MARGIN_S if "accelerator" in names else 0)
    if budget_s < needed:
        raise ValueError(
            f"--budget must be at least {needed:.0f} s for the stages {', '.join(names)} "
            f"(their time boxes), got {budget_s:g}; run fewer with --only"
        )
    accelerator_budget = budget_s - fixed - ACCELERATOR_MARGIN_S
    planned = [
        ("environment", [python, "-c", _ENVIRONMENT], STAGE_LIMITS_S["environment"]),
        (
            "device_tests",
            [*pytest, "-n", "0", "-rs", *DEVICE_TESTS],
            STAGE_LIMITS_S["device_tests"],
        ),
        (
            "properties",
            [*pytest, "-n", str(PROPERTY_WORKERS), *PROPERTY_TESTS, "-k", "gpu or tpu"],
            STAGE_LIMITS_S["properties"],
        ),
        (
            "accelerator",
            [
                python,
                "-m",
                "benchmarks.accelerator",
                "--json",
                "--out",
                str(out / "accelerator.jsonl"),
                "--budget",
                f"{accelerator_budget:.0f}",
            ],
            accelerator_budget + ACCELERATOR_MARGIN_S,
        ),
    ]
    return [stage for stage in planned if stage[0] in names]


def default_backend() -> str:
    """JAX's default backend, probed in a child process (this one never holds the chip)."""
    return probe_default_backend(cwd=ROOT) or "unknown"


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.device_check --out DIR [--budget 480]`."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=common.HelpFormatter
    )
    parser.add_argument("--out", required=True, help="folder for the logs and records")
    parser.add_argument(
        "--budget",
        type=common.positive_seconds,
        default=DEFAULT_BUDGET_S,
        help="seconds for all stages",
    )
    parser.add_argument(
        "--only",
        default=None,
        help=f"comma-separated stages to run, of {list(STAGE_NAMES)} (default: all)",
    )
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run the stages when JAX finds no GPU or TPU (refused by default)",
    )
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    # Checked before anything is created or run.
    with common.usage_errors(parser):
        common.check_path_given(args.out, "--out", "folder")
        names = STAGE_NAMES
        if args.only is not None:
            names = tuple(common.split_names(args.only, STAGE_NAMES, "--only"))
        planned = stages(out, args.budget, names)
        if set(names) - {"environment"} and not args.allow_cpu:
            backend = default_backend()
            if backend not in ("gpu", "tpu"):
                raise ValueError(
                    f"JAX's default backend here is {backend!r}, not a GPU or TPU: the stages "
                    f"{', '.join(n for n in names if n != 'environment')} check an accelerator "
                    "(--allow-cpu runs them anyway)"
                )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--out: cannot create {out} ({error})")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the stages share the chip
    records = []
    for name, command, limit_s in planned:
        record = run_stage(name, command, limit_s, out)
        records.append(record)
        line = json.dumps(record, allow_nan=False)  # strict JSON, as every benchmark writes
        print(line, flush=True)
        with open(out / "device_check.jsonl", "a") as jsonl:
            jsonl.write(line + "\n")
    # pytest's 5 is "no tests collected": a backend without device cases.
    failed = [r["stage"] for r in records if r["timed_out"] or r["returncode"] not in (0, 5)]
    if failed:
        raise SystemExit(
            f"benchmarks.device_check: stage(s) {', '.join(failed)} failed or timed out"
        )
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()  # its stages inherit the tunable
    common.run_command(main)
