"""Files written whole or not at all: a temporary sibling, renamed over the target once written.

A write cut short (a full disk, a file-size limit, an interrupt) must not
leave a truncated forecast table, plot or JSON file where a complete one was:
the temporary file is removed, and the earlier file stays as it was.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from tft_jax.paths import expanded

__all__ = ["interrupts_held", "replaced_atomically", "temporary_sibling"]

# A signal's handler as `signal.getsignal` gives it, None (not set from Python) left out:
# a Python callable, or `SIG_DFL`/`SIG_IGN` (ints).
_Handler = Callable[[int, FrameType | None], Any] | int


def temporary_sibling(path: str | os.PathLike[str]) -> pathlib.Path:
    """Where `replaced_atomically(path)` writes first: `path`, `~` expanded, plus `.<pid>.tmp`.

    One name per process: two processes writing one output (the hosts of a
    multi-host run) would otherwise rename each other's file away.
    """
    path = expanded(path)
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike[str]) -> Iterator[pathlib.Path]:
    """Yields a temporary sibling of `path` to write; it replaces `path` when the block ends.

    On an error the temporary file is removed and `path` is untouched. An
    `OSError` that names no file (pandas' and Matplotlib's writes raise
    "File too large" without one) is given the temporary file's name, so that
    the message can say which output failed. A leading `~` in `path` is the
    home folder: expanded once, before the temporary name is made, so that the
    write and the rename name the same folder.
    """
    path = expanded(path)
    temporary = temporary_sibling(path)
    try:
        yield temporary
        temporary.replace(path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(temporary)
        raise


# The signals that stop a process and are held during renames that must all happen or
# none: Ctrl-C, what job schedulers and `kill` send, and a closed terminal (not on Windows).
HELD_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Holds a Ctrl-C (SIGINT), SIGTERM or SIGHUP that arrives within the block, and
    delivers it once the block ends.

    For a few renames that must all happen or none (a run folder's files,
    whose config.json lists the others' hashes): a signal between two of
    them would leave a folder of two runs, which loads as neither. A held
    signal is delivered as it would have been: to the Python handler there
    was (a KeyboardInterrupt for Ctrl-C), or, left to the system, raised
    again, which ends the process as it would have ended. An error that ends
    the block goes on instead of a held Python handler's signal (it says
    more), but not instead of one left to the system: a scheduler's SIGTERM
    still ends the process. Python runs signal handlers in
    the main thread only: in another thread the block runs as it is, and so
    does a signal that was ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        number: handler
        for number in HELD_SIGNALS
        if (handler := signal.getsignal(number)) is not None and handler != signal.SIG_IGN
    }
    held: list[tuple[int, FrameType | None]] = []
    for number in previous:
        signal.signal(number, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    except BaseException:
        # An error already ends the block (a failed rename): it stops the caller as a
        # KeyboardInterrupt would, and says what became of the files. A signal left to
        # the system ends the process even so: a caller that catches the error must not
        # outlive a kill request.
        _restore(previous)
        _deliver(held, previous, python_handlers=False)
        raise
    _restore(previous)
    _deliver(held, previous, python_handlers=True)


def _deliver(
    held: list[tuple[int, FrameType | None]], handlers: dict[int, _Handler], python_handlers: bool
) -> None:
    """Delivers each signal of `held` once to its handler of `handlers`, those that end the
    process first (a KeyboardInterrupt raised first would lose a SIGTERM held after it);
    signals with a Python handler only where `python_handlers`."""
    arrived = dict.fromkeys(signum for signum, _ in held)
    for number in sorted(arrived, key=lambda number: callable(handlers[number])):
        handler = handlers[number]
        if not callable(handler):  # the system's default action: ends the process
            signal.raise_signal(number)
        elif python_handlers:
            handler(number, next(frame for signum, frame in held if signum == number))


def _restore(handlers: dict[int, _Handler]) -> None:
    """Sets each signal's handler back (`signal.getsignal`'s values, by signal number)."""
    for number, handler in handlers.items():
        signal.signal(number, handler)
