"""The memory allocator setting that XLA:CPU training needs, and a launcher that applies it.

XLA:CPU allocates a step's temporary buffers with `malloc` and frees them
when the step ends. glibc serves blocks that large with `mmap` and returns
them to the operating system on `free`, so every step faults its temporaries
in again, one 4 KiB page at a time. With the glibc tunable
`glibc.malloc.hugetlb=1` (glibc >= 2.35) malloc asks for transparent huge
pages on the memory it maps (`madvise(MADV_HUGEPAGE)`), so the same memory
is faulted in 2 MiB at a time: 512 times fewer faults for the same bytes.

glibc reads tunables once, when the process starts, so they cannot be set
from inside Python. `relaunch_with_tuned_allocator()` re-executes the
current command with the tunable set, before JAX allocates anything; the
command-line entry points (`tft-jax`, `python -m benchmarks.*`) call it
first. A Python program started by the user runs with whatever allocator
it was started with: set `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` in its
environment, or call `relaunch_with_tuned_allocator()` as the first
statement of the script.

Set `TFT_JAX_ALLOCATOR=default` to keep the process as started.
"""

from __future__ import annotations

import os
import platform
import sys
import warnings
from collections.abc import Mapping, Sequence

from tft_jax.caller_frame import user_stacklevel

TUNABLE = "glibc.malloc.hugetlb"
TUNED_VALUE = "1"
OPT_OUT_VARIABLE = "TFT_JAX_ALLOCATOR"
_MARKER = "TFT_JAX_ALLOCATOR_RELAUNCHED"


def _tunables(environ: Mapping[str, str]) -> list[str]:
    value = environ.get("GLIBC_TUNABLES", "")
    return [item for item in value.split(":") if item]


def is_tuned(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `environ` (default: this process's) sets the malloc huge-page tunable."""
    environ = os.environ if environ is None else environ
    return any(item.split("=", 1)[0] == TUNABLE for item in _tunables(environ))


def tuned_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `environ` with `glibc.malloc.hugetlb=1` added to `GLIBC_TUNABLES`.

    Other tunables are kept; a hugetlb value the user set is never replaced.
    """
    environ = dict(os.environ if environ is None else environ)
    if not is_tuned(environ):
        environ["GLIBC_TUNABLES"] = ":".join([*_tunables(environ), f"{TUNABLE}={TUNED_VALUE}"])
    return environ


def _uses_glibc() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    library, _ = platform.libc_ver()
    return library == "glibc"


def should_relaunch(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `relaunch_with_tuned_allocator` would re-execute this process.

    Only on Linux with glibc, when the tunable is not set yet, the process
    was not relaunched already, and `TFT_JAX_ALLOCATOR` is not `default`.

    Raises:
      ValueError: `TFT_JAX_ALLOCATOR` is set to anything but `default` (a
        value such as `off` or `system`, meant to opt out, would otherwise
        relaunch with the tuned allocator without a word).
    """
    environ = os.environ if environ is None else environ
    choice = environ.get(OPT_OUT_VARIABLE, "").strip().lower()
    if choice not in ("", "default"):
        raise ValueError(
            f"{OPT_OUT_VARIABLE} must be 'default' (keep the allocator the process started "
            f"with) or unset (relaunch with {TUNABLE}={TUNED_VALUE}), "
            f"got {environ[OPT_OUT_VARIABLE]!r}"
        )
    return (
        _uses_glibc() and not is_tuned(environ) and _MARKER not in environ and choice != "default"
    )


def relaunch_with_tuned_allocator(argv: Sequence[str] | None = None) -> None:
    """Re-executes this Python command with the tuned allocator, unless it already has it.

    Call it first thing in a program's entry point: the new process starts
    from scratch (nothing before the call is kept), with the same
    interpreter, arguments (`sys.orig_argv` by default) and environment plus
    the tunable. Returns without doing anything when `should_relaunch()` is
    False. Never call it from library code or tests that run in-process.

    A program read from standard input (`python - < script.py`, a pipe) or
    typed at the interactive prompt cannot be started again: its text is
    gone, and the new process would read an exhausted input and exit at once
    with status 0, without running the rest of the program. Such a process
    keeps its allocator, with a `RuntimeWarning` saying how to set it.
    """
    if not should_relaunch():
        return
    if argv is None and sys.argv[:1] in ([""], ["-"]):
        warnings.warn(
            "relaunch_with_tuned_allocator: this program was read from standard input or "
            "typed interactively and cannot be started again, so it keeps its allocator; "
            f"set GLIBC_TUNABLES={TUNABLE}={TUNED_VALUE} in its environment instead",
            RuntimeWarning,
            stacklevel=user_stacklevel(),
        )
        return
    argv = list(sys.orig_argv if argv is None else argv)
    environ = tuned_environment()
    environ[_MARKER] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], environ)
