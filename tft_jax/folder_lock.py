"""One writer per folder: an exclusive, advisory lock that a process holds while it writes.

Two processes writing one run folder at once (two `tft-jax train --overwrite
--out X`, two `--resume`s of one run, an `evaluate` writing metrics while a
`train` saves another model there) end with a folder of two runs, each
process reporting success. So every writer of a folder holds its lock: the
second is refused at once, naming the process that holds it, and touches
nothing.

The lock is `fcntl.flock` on `LOCK_FILE` inside the folder:

- the operating system releases it when the holder dies (a crash, SIGKILL),
  so a lock is never stale; the file left behind by a killed holder is
  taken over by the next writer;
- it is re-entrant within one process, and shared by its threads (the CLI's
  `train` holds the run folder and then calls `Forecaster.save` into it);
- it is advisory: readers (`Forecaster.load`) take no lock and are never
  kept waiting, and another program can still write the folder;
- the lock file records the holder (process id, host, when it took the lock,
  command line), which the refusal names; the last release in the process
  deletes it, and a folder the lock created is removed again if it is left
  empty (a command refused before writing anything leaves no folder);
- where `fcntl` does not exist (Windows), nothing is locked; neither is a
  folder where the lock file cannot be made (a read-only folder: the
  caller's own write then fails with its error), nor one on a file system
  without `flock` support.

The lock file is no run file: the lists of a run's files and results
(`run_folder.earlier_results`, the CLI's `remove_run_files`) never name it.
A process forked without `exec` shares its parent's lock (the same open
file); the file is closed on `exec`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import pathlib
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator

from tft_jax.paths import expanded

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "FolderLockedError", "folder_locked"]

LOCK_FILE = ".tft-jax.lock"
# The errors of making the lock file or taking the lock that say this folder cannot be
# locked here (read-only, not ours, no flock on the file system), not that it is held.
_CANNOT_LOCK = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOLCK, errno.EOPNOTSUPP}
# Tries to take the lock while the folder or lock file is removed by the one releasing it.
_TRIES = 20
_COMMAND_CHARACTERS = 300


class FolderLockedError(RuntimeError):
    """A folder that another process is writing (holds its lock): `folder`, and `holder`,
    the lock file's record of that process (empty when it was not written yet)."""

    def __init__(self, message: str, folder: pathlib.Path, holder: dict[str, object]) -> None:
        super().__init__(message)
        self.folder = folder
        self.holder = holder


@dataclasses.dataclass
class _Hold:
    """This process's hold of one folder's lock: the open lock file and how many holds."""

    folder: pathlib.Path
    descriptor: int
    count: int
    created: list[pathlib.Path]


# This process's holds, by the folder's (device, inode): one per folder, however spelled.
_HOLDS: dict[tuple[int, int], _Hold] = {}
_HOLDS_GUARD = threading.RLock()


@contextlib.contextmanager
def folder_locked(
    folder: str | os.PathLike[str], label: str = "", *, enabled: bool = True
) -> Iterator[None]:
    """Holds the lock of `folder` (made where absent) for writing, within the block.

    Raises `FolderLockedError` at once, changing nothing, when another process
    holds it: "`label` `folder` is being written by process 1234 (tft-jax train
    ..., since 10:02:11); wait for it to finish, or use another folder".
    `label` ("--out ", "save: ") says which argument named the folder.
    `enabled` False locks nothing (the processes of a multi-host run other than
    process 0, which writes for them).
    """
    hold = _taken(expanded(folder), label) if enabled and fcntl is not None else None
    try:
        yield
    finally:
        if hold is not None:
            _released(hold)


def _taken(folder: pathlib.Path, label: str) -> _Hold | None:
    """This process's hold of `folder`'s lock, taken or counted again; None where the
    folder cannot be locked (see the module's docstring)."""
    with _HOLDS_GUARD:
        for _ in range(_TRIES):
            try:
                created = _made(folder)
            except _Vanished:
                continue  # removed by the holder releasing it meanwhile: again
            except OSError:
                return None  # a path that is no folder, or not ours: the caller's write says
            try:
                key = _identity(folder)
            except FileNotFoundError:
                continue  # removed meanwhile, as above
            except OSError:
                return None
            hold = _HOLDS.get(key)
            if hold is not None:
                hold.count += 1
                return hold
            descriptor = _locked_file(folder / LOCK_FILE, folder, label)
            if descriptor is None:
                return None
            if descriptor < 0:  # the lock file or folder went with its last holder: again
                continue
            _record_holder(descriptor)
            hold = _Hold(folder, descriptor, 1, created)
            _HOLDS[key] = hold
            return hold
    raise OSError(f"could not lock {folder}: its lock file {LOCK_FILE} kept being replaced")


class _Vanished(Exception):
    """A folder `_made` made (or found) that was removed before it returned."""


def _made(folder: pathlib.Path) -> list[pathlib.Path]:
    """Makes `folder` and its missing parents; the folders made, innermost first."""
    missing = []
    path = folder
    # `lexists`: a link to nothing is no missing folder (mkdir fails on it), but a path
    # that is not a folder, for the caller's own write to report.
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    made = []
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            continue
        made.append(path)
    if not os.path.lexists(folder):  # made, then removed by a holder releasing it: again
        raise _Vanished(str(folder))
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(folder))
    return made[::-1]


def _identity(folder: pathlib.Path) -> tuple[int, int]:
    status = folder.stat()
    return status.st_dev, status.st_ino


def _locked_file(path: pathlib.Path, folder: pathlib.Path, label: str) -> int | None:
    """The open lock file `path`, locked; -1 when it or its folder vanished meanwhile
    (try again); None where it cannot be locked. Raises `FolderLockedError` when held."""
    assert fcntl is not None
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        return -1
    except OSError as error:
        if error.errno in _CANNOT_LOCK or isinstance(error, IsADirectoryError):
            return None
        raise
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(descriptor)
        os.close(descriptor)
        raise FolderLockedError(_held_text(folder, label, holder), folder, holder) from None
    except OSError as error:
        os.close(descriptor)
        if error.errno in _CANNOT_LOCK:
            return None
        raise
    # The holder before may have deleted this file as it released it: a lock on a file
    # no longer at `path` excludes nobody.
    try:
        same = os.path.samestat(os.fstat(descriptor), os.stat(path))
    except FileNotFoundError:
        same = False
    if not same:
        os.close(descriptor)
        return -1
    return descriptor


def _record_holder(descriptor: int) -> None:
    """Writes who holds the lock into the lock file (best effort: a refusal names it)."""
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": _command_line(),
    }
    with contextlib.suppress(OSError):
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, (json.dumps(record) + "\n").encode(), 0)


def _command_line() -> str:
    """This process's command line, its program by name only ("tft-jax train ...")."""
    argv = list(sys.argv) or ["python"]
    program = os.path.basename(argv[0]) or "python"
    if program == "-c":  # `python -c CODE`
        program = "python -c"
    text = " ".join([program, shlex.join(argv[1:])]).strip()
    if len(text) > _COMMAND_CHARACTERS:
        text = text[: _COMMAND_CHARACTERS - 3] + "..."
    return text


def _holder(descriptor: int) -> dict[str, object]:
    """The lock file's record of its holder; {} when unreadable or not written yet."""
    try:
        record = json.loads(os.pread(descriptor, 4096, 0).decode())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _held_text(folder: pathlib.Path, label: str, holder: dict[str, object]) -> str:
    """The refusal of a folder whose lock `holder` holds, naming that process."""
    if "pid" not in holder:
        who = "another process (it has not recorded itself yet)"
    else:
        where = "" if holder.get("host") == socket.gethostname() else f" on {holder.get('host')}"
        since = str(holder.get("since", ""))
        if since.startswith(time.strftime("%Y-%m-%d ")):
            since = since.split(" ", 1)[1]
        who = f"process {holder['pid']}{where} ({holder.get('command')}, since {since})"
    return (
        f"{label}{folder} is being written by {who}; wait for it to finish, or use another "
        f"folder (the lock is {folder / LOCK_FILE}, released when that process ends)"
    )


def _released(hold: _Hold) -> None:
    """Counts one hold of `hold` off; the last deletes the lock file, then unlocks."""
    with _HOLDS_GUARD:
        hold.count -= 1
        if hold.count:
            return
        for key, held in list(_HOLDS.items()):
            if held is hold:
                del _HOLDS[key]
        # Deleted while still locked: a process that opened it meanwhile finds, once it
        # gets the lock, that the file is gone (`_locked_file`), and makes a new one.
        with contextlib.suppress(OSError):
            (hold.folder / LOCK_FILE).unlink()
        os.close(hold.descriptor)
        for path in hold.created:  # innermost first; only folders left empty
            try:
                path.rmdir()
            except OSError:
                break
