"""One writer per folder (`tft_jax.folder_lock`): a second writer is refused, naming the first.

Another process holds the lock (a tiny Python script, not a training run):
`Forecaster.save`, a writing `TrainingCheckpointer` (what `fit(checkpoint_dir=...)`
opens) and the CLI's `train --overwrite` are refused naming it, and change nothing.
The lock goes with its holder (SIGKILL), is re-entrant within a process and
shared by its threads, and its file is never a run's file. A run-reading command
refuses to write results once the run was saved again since it loaded it. One
tiny run is fitted once; each test copies its folder.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import jax
import pytest

from tft_jax import cli, folder_lock
from tft_jax.checkpoint import TrainingCheckpointer
from tft_jax.folder_lock import LOCK_FILE, FolderLockedError, folder_locked
from tft_jax.forecaster import Forecaster, run_folder

from .cli_tables import TINY_MODEL, TINY_RUN, run, table_args
from .forecaster_stores import fitted_stores

_ROOT = pathlib.Path(__file__).resolve().parent.parent
# Takes the lock of the folder argv[1], says so, and holds it until its stdin closes.
_HOLDER = textwrap.dedent(
    """
    import sys
    from tft_jax.folder_lock import folder_locked
    with folder_locked(sys.argv[1]):
        print("locked", flush=True)
        sys.stdin.read()
    """
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """`(forecaster, its table's CSV, its saved run folder)`: the tiny stores run."""
    folder = tmp_path_factory.mktemp("saved")
    forecaster, _, root = fitted_stores(folder)
    return forecaster, folder / "stores.csv", root


@pytest.fixture
def holder():
    """Starts a process holding the lock of a folder: `hold(folder)` gives its `Popen`."""
    started = []

    def hold(folder: pathlib.Path) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=_ROOT,
        )
        started.append(process)
        assert process.stdout.readline().strip() == "locked"
        return process

    yield hold
    for process in started:
        process.kill()
        process.wait()


def _folder_bytes(folder: pathlib.Path) -> dict[str, bytes]:
    """Every file under `folder` (the lock file too), by relative path."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _is_locked(folder: pathlib.Path) -> bool:
    """Whether some open file description holds `folder`'s lock (this process's too)."""
    try:
        descriptor = os.open(folder / LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        assert error.errno in (errno.EAGAIN, errno.EWOULDBLOCK)
        return True
    finally:
        os.close(descriptor)
    return False


def _held_by(process: subprocess.Popen) -> str:
    """What a refusal says of the holder `process`."""
    return rf"is being written by process {process.pid} \(python -c .*, since [0-9: -]+\)"


def test_save_into_a_folder_another_process_writes_is_refused_naming_it(saved, holder, tmp_path):
    forecaster, _, root = saved
    folder = tmp_path / "run"
    shutil.copytree(root, folder)
    process = holder(folder)
    before = _folder_bytes(folder)
    assert LOCK_FILE in before and json.loads(before[LOCK_FILE])["pid"] == process.pid
    with pytest.raises(FolderLockedError, match=rf"save: {folder} {_held_by(process)}"):
        forecaster.save(folder)
    assert _folder_bytes(folder) == before  # nothing written, no temporary file left


def test_a_writing_checkpointer_refuses_a_folder_another_process_trains_into(holder, tmp_path):
    # Its orbax managers removed the other writer's step in progress, and both runs failed.
    checkpoints = tmp_path / "checkpoints"
    in_progress = checkpoints / "latest" / "4.orbax-checkpoint-tmp-1700000000000000"
    in_progress.mkdir(parents=True)
    process = holder(checkpoints)
    with pytest.raises(FolderLockedError, match=rf"{checkpoints} {_held_by(process)}"):
        TrainingCheckpointer(checkpoints)
    assert in_progress.is_dir()
    with TrainingCheckpointer(checkpoints, create=False) as reader:  # readers take no lock
        assert reader.steps() == []
    process.kill()
    process.wait()
    with TrainingCheckpointer(checkpoints) as writer:
        assert _is_locked(checkpoints) and writer.steps() == []
    assert not _is_locked(checkpoints) and not (checkpoints / LOCK_FILE).exists()


def test_a_fit_into_checkpoints_another_process_trains_into_is_refused_before_training(
    saved, holder, tmp_path
):
    # The phases' checkpointers lock their own folders; the batch-stream record beside them
    # was written by both processes.
    forecaster, csv, _ = saved
    checkpoints = tmp_path / "checkpoints"
    process = holder(checkpoints)
    with pytest.raises(
        FolderLockedError, match=rf"fit: checkpoint_dir {checkpoints} {_held_by(process)}"
    ):
        Forecaster.from_config(forecaster.config).fit(csv, checkpoint_dir=checkpoints, quiet=True)
    assert sorted(path.name for path in checkpoints.iterdir()) == [LOCK_FILE]


def test_train_overwrite_of_a_run_another_process_writes_is_refused_and_deletes_nothing(
    saved, holder, tmp_path, capsys
):
    # Both trains exited 0, the second deleting the first's files while it trained.
    _, csv, root = saved
    out = tmp_path / "run"
    shutil.copytree(root, out)
    process = holder(out)
    before = _folder_bytes(out)
    argv = ["train", *table_args(csv), *TINY_MODEL, *TINY_RUN, "--overwrite", "--out", str(out)]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert f"tft-jax train: error: --out {out} is being written by process {process.pid}" in err
    assert _folder_bytes(out) == before
    # Without --overwrite into a new folder (the check-then-create race): refused the same.
    fresh = tmp_path / "fresh"
    holder(fresh)
    code, _, err = run(capsys, *argv[:-2], "--out", str(fresh))
    assert code == 2 and f"--out {fresh} is being written by process" in err
    assert sorted(os.listdir(fresh)) == [LOCK_FILE]


def test_the_lock_goes_with_its_holder_and_its_file_is_no_run_file(saved, holder, tmp_path):
    _, _, root = saved
    folder = tmp_path / "run"
    shutil.copytree(root, folder)
    process = holder(folder)
    assert _is_locked(folder)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not _is_locked(folder)
    assert (folder / LOCK_FILE).is_file()  # left by the killed holder: taken over
    assert run_folder.earlier_results(folder) == []
    assert cli.remove_run_files(folder) == ["config.json", "history.json", "models/"]
    assert sorted(os.listdir(folder)) == [LOCK_FILE]
    with folder_locked(folder):
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (folder / LOCK_FILE).exists()


def test_the_lock_is_reentrant_within_a_process_and_shared_by_its_threads(tmp_path):
    folder = tmp_path / "made" / "run"
    entered = []

    def in_a_thread() -> None:
        with folder_locked(folder):
            entered.append(_is_locked(folder))

    with folder_locked(folder):
        with folder_locked(folder):  # the CLI's train, then Forecaster.save into its --out
            assert _is_locked(folder)
        assert _is_locked(folder)  # the outer hold stays
        thread = threading.Thread(target=in_a_thread)
        thread.start()
        thread.join()
        assert entered == [True] and _is_locked(folder)
    assert not _is_locked(folder)
    assert not (tmp_path / "made").exists()  # made for the lock, left empty: removed


def test_results_of_a_run_saved_again_since_it_was_loaded_are_refused(saved, holder, tmp_path):
    # `evaluate` overlapping a `train --resume` wrote the old model's metrics beside the new.
    _, _, root = saved
    folder = tmp_path / "run"
    shutil.copytree(root, folder)
    loaded = Forecaster.load(folder)
    with cli.writing_into_run(folder, loaded, True):
        assert _is_locked(folder)
    other = Forecaster.load(folder)
    variables = other._fitted.variables
    variables["fp32"] = jax.tree.map(lambda leaf: leaf + 0.25, variables["fp32"])
    other.save(folder)
    refused = pytest.raises(cli.UsageError, match=rf"--run {folder} was saved again while")
    with refused, cli.writing_into_run(folder, loaded, True):
        pytest.fail("written into a run saved again")
    process = holder(folder)
    refused = pytest.raises(FolderLockedError, match=rf"--run {folder} {_held_by(process)}")
    with refused, cli.writing_into_run(folder, Forecaster.load(folder), True):
        pytest.fail("written into a run another process writes")


# F04: folder_lock.py _released: the lock file unlinked after os.close (the unlock), not
# before: in between, another process may lock that file and record itself in it, and the
# unlink then deletes the file of the new holder (a third process makes and locks another).
def test_the_last_release_deletes_the_lock_file_while_still_holding_the_lock(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir()
    held_when_deleted = []
    unlink = pathlib.Path.unlink

    def deleting(path, *args, **kwargs):
        if path.name == LOCK_FILE:
            held_when_deleted.append(_is_locked(folder))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "unlink", deleting)
    with folder_locked(folder):
        with folder_locked(folder):
            pass
        assert held_when_deleted == []  # the inner release deletes nothing
    assert held_when_deleted == [True]
    assert not (folder / LOCK_FILE).exists() and not _is_locked(folder)


# F05 (samestat check dropped), F06 (a vanished lock file gives up, locking nothing),
# F07 (_TRIES = 1: a vanished lock file raises OSError): the earlier holder deletes the
# lock file between this process's open and its flock. The lock then taken is on a file
# no longer at the path and excludes nobody: a new lock file must be made and locked.
def test_a_lock_file_its_last_holder_deletes_meanwhile_is_made_again_and_locked(
    tmp_path, monkeypatch
):
    folder = tmp_path / "run"
    folder.mkdir()
    flock = fcntl.flock
    calls = []

    def deleted_first(descriptor, operation):
        if not calls:
            (folder / LOCK_FILE).unlink()  # the earlier holder's last release, meanwhile
        calls.append(operation)
        return flock(descriptor, operation)

    monkeypatch.setattr(fcntl, "flock", deleted_first)
    with folder_locked(folder):
        assert (folder / LOCK_FILE).is_file() and _is_locked(folder)
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (folder / LOCK_FILE).exists() and not _is_locked(folder)


# F11: folder_lock.py _held_text: today's date kept in "since" (a holder of today is
# named by its time only; one of an earlier day by date and time).
def test_a_refusal_names_a_holder_since_today_by_its_time_and_an_earlier_one_by_date(tmp_path):
    here = socket.gethostname()
    today = {"pid": 7, "host": here, "command": "tft-jax train", "since": "10:02:11"}
    today["since"] = time.strftime("%Y-%m-%d ") + today["since"]
    text = folder_lock._held_text(tmp_path, "--out ", today)
    assert text.startswith(f"--out {tmp_path} is being written by process 7 (tft-jax train, ")
    assert "since 10:02:11);" in text
    before = {**today, "since": "2001-02-03 10:02:11", "host": "elsewhere"}
    text = folder_lock._held_text(tmp_path, "", before)
    assert "process 7 on elsewhere (tft-jax train, since 2001-02-03 10:02:11);" in text


# F13: folder_lock.py _command_line: a long command line cut to 303 characters, not 300.
def test_a_long_command_line_is_recorded_cut_to_300_characters(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/tft-jax", "train", "--out", "x" * 1000])
    text = folder_lock._command_line()
    assert text.startswith("tft-jax train --out xxx") and text.endswith("xxx...")
    assert len(text) == 300


# F17: folder_lock.py _identity: holds keyed by how the folder is spelled, not by the
# folder: the CLI's train locks --out and Forecaster.save locks the same folder spelled
# otherwise (a symlink, "a/../run"); the second is refused by its own process.
def test_one_folder_spelled_two_ways_is_one_hold_of_its_lock(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (tmp_path / "link").symlink_to(folder)
    with folder_locked(folder):
        with folder_locked(tmp_path / "link"), folder_locked(tmp_path / "link" / ".." / "run"):
            assert _is_locked(folder)
        assert _is_locked(folder)  # the outer hold stays
    assert not _is_locked(folder) and not (folder / LOCK_FILE).exists()


# F18: folder_lock.py folder_locked: enabled=False ignored (the processes of a multi-host
# run other than process 0 lock, and make, the folder too).
def test_a_disabled_lock_makes_and_locks_nothing(holder, tmp_path):
    folder = tmp_path / "made" / "run"
    with folder_locked(folder, enabled=False):
        assert not (tmp_path / "made").exists()
    held = tmp_path / "held"
    process = holder(held)
    with folder_locked(held, enabled=False):  # another process's lock refuses nothing
        assert json.loads((held / LOCK_FILE).read_text())["pid"] == process.pid


# CL03: cli.py writing_into_run: the run locked even when the command writes elsewhere
# (`--output` outside the run): an evaluate to another folder refused while a train
# --resume writes the run.
def test_a_command_writing_outside_the_run_takes_no_lock_of_it(saved, holder, tmp_path):
    _, _, root = saved
    folder = tmp_path / "run"
    shutil.copytree(root, folder)
    loaded = Forecaster.load(folder)
    holder(folder)
    with cli.writing_into_run(folder, loaded, False):
        pass  # neither refused nor checked


# CL08: cli.py check_run_unchanged: in a folder whose config.json records no digests, the
# model files are not compared with the loaded ones (a run saved again is written into).
def test_results_of_an_undigested_run_saved_again_since_it_was_loaded_are_refused(saved, tmp_path):
    _, _, root = saved
    folder = tmp_path / "run"
    shutil.copytree(root, folder)
    loaded = Forecaster.load(folder)
    other = Forecaster.load(folder)
    variables = other._fitted.variables
    variables["fp32"] = jax.tree.map(lambda leaf: leaf + 0.25, variables["fp32"])
    other.save(folder)
    config = json.loads((folder / "config.json").read_text())
    del config[run_folder.DIGESTS_KEY]  # as in a folder saved before digests were recorded
    (folder / "config.json").write_text(json.dumps(config))
    with (
        pytest.raises(cli.UsageError, match=rf"--run {folder} was saved again while"),
        cli.writing_into_run(folder, loaded, True),
    ):
        pytest.fail("written into a run saved again")
    with cli.writing_into_run(folder, other, True):  # the model it holds: written
        assert _is_locked(folder)


# CL05 (evaluate's metrics inside the run written without its lock), CL06 (is_inside
# reversed), CL09 (forecast's file inside the run written without its lock): run through
# the CLI on a run folder that names its training table (as `tft-jax train` writes it),
# without --csv, so only "the output lies in the run" makes the command a writer.
def test_evaluate_and_forecast_into_a_run_another_process_writes_are_refused(
    saved, holder, tmp_path, capsys
):
    _, csv, root = saved
    folder = tmp_path / "run"
    shutil.copytree(root, folder)
    config = json.loads((folder / "config.json").read_text())
    config["source"] = {"csv": str(csv)}
    (folder / "config.json").write_text(json.dumps(config))
    process = holder(folder)
    before = _folder_bytes(folder)
    for command in ("evaluate", "forecast"):
        code, _, err = run(
            capsys, command, "--run", str(folder), "--quiet", "--compile-cache", "none"
        )
        assert code == 2, err
        assert f"--run {folder} is being written by process {process.pid}" in err
    assert _folder_bytes(folder) == before


# BUG: the folder removed by the release of a holder that had made it (its `created`
# rmdir), between this process's `_made` and `_identity`: `_taken` returned None, as for a
# folder that cannot be locked, and the caller wrote with no lock at all (a third writer
# could then take the lock beside it).
def test_a_folder_its_last_holder_removes_meanwhile_is_made_again_and_locked(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir()
    made = folder_lock._made
    calls = []

    def made_then_removed(path):
        result = made(path)
        if not calls:
            path.rmdir()  # the releasing holder removes the empty folder it had made
        calls.append(path)
        return result

    monkeypatch.setattr(folder_lock, "_made", made_then_removed)
    with folder_locked(folder):
        assert folder.is_dir() and _is_locked(folder)


def test_a_link_to_nothing_is_left_to_the_callers_write_not_retried_as_a_lock(tmp_path):
    # `mkdir` met the link, the folder never existed, and the lock retried 20 times to say
    # its lock file "kept being replaced".
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    with folder_locked(link, "--out "):
        assert not os.path.lexists(tmp_path / "gone")  # nothing made, nothing locked
    with pytest.raises(OSError) as raised, folder_locked(link, "--out "):
        (link / "config.json").write_text("{}")  # the caller's own write says why
    assert "kept being replaced" not in str(raised.value)
