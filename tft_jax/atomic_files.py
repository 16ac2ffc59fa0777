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
from collections.abc import Iterator

from tft_jax.paths import expanded

__all__ = ["interrupts_held", "replaced_atomically", "temporary_sibling"]


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


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Holds a Ctrl-C (SIGINT) that arrives within the block, and raises it once the block ends.

    For a few renames that must all happen or none (a run folder's files,
    whose config.json lists the others' hashes): an interrupt between two
    of them would leave a folder of two runs, which loads as neither.
    An error that ends the block goes on instead (it says more). Python
    runs signal handlers in the main thread only, and only Python handlers
    raise there: in another thread, or with SIGINT ignored or left to the
    system, the block runs as it is.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    held: list[tuple[int, object]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    except BaseException:
        # An error already ends the block (a failed rename): it stops the caller as
        # the interrupt would, and says what became of the files.
        signal.signal(signal.SIGINT, previous)
        raise
    signal.signal(signal.SIGINT, previous)
    if held:
        previous(*held[0])
