"""Files written whole or not at all: a temporary sibling, renamed over the target once written.

A write cut short (a full disk, a file-size limit, an interrupt) must not
leave a truncated forecast table, plot or JSON file where a complete one was:
the temporary file is removed, and the earlier file stays as it was.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Iterator

from tft_jax.paths import expanded

__all__ = ["replaced_atomically", "temporary_sibling"]


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
