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
import subprocess
import sys
import textwrap
import threading

import jax
import pytest

from tft_jax import cli
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
