"""Checkpoints read while a `fit` may be writing them: a reader writes and deletes nothing.

`load_state` (and every `TrainingCheckpointer(..., create=False)`) removed the
temporary directory of the step a running `fit` was saving, and failed that
save; moved damaged steps aside; and raised a bare `FileNotFoundError` for a
step that the writer removed while it was read.
"""

from __future__ import annotations

import errno
import os
import pathlib
import re
import shutil
import sys
import warnings
from typing import Any

import jax
import orbax.checkpoint as ocp
import pytest

from tests.checkpoint_states import (
    TEMPLATE,
    _truncate,
    assert_bitwise_equal,
    randomized,
    save_two_latest_steps,
)
from tft_jax.checkpoint import (
    BEST,
    CORRUPT,
    LATEST,
    CheckpointReadError,
    TrainingCheckpointer,
    load_state,
)

RNG = jax.random.key(0)


def _tree(directory: pathlib.Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


def left_in_place(directory: pathlib.Path, kind: str, step: int) -> str:
    """The regex of the warning of a reader that skips damaged step `step` of `kind`."""
    return (
        rf"^checkpoint {kind} step {step} in {re.escape(str(directory))} is corrupt \(.*\); "
        r"left in place, as the folder is opened for reading only"
    )


def test_a_reader_leaves_the_temporary_directory_of_a_running_save_alone(
    tmp_path: pathlib.Path,
) -> None:
    from tft_jax.cli import holds_checkpoints

    folder = tmp_path / "checkpoints" / "fp32"
    state = randomized(TEMPLATE, 4, step=3)
    with TrainingCheckpointer(folder) as checkpointer:
        checkpointer.save_latest(state, RNG, {})
    # What orbax has written so far while a running fit saves step 8.
    in_progress = folder / LATEST / "8.orbax-checkpoint-tmp"
    shutil.copytree(folder / LATEST / "3", in_progress)
    before = _tree(folder)
    assert_bitwise_equal(load_state(folder, TEMPLATE, prefer=LATEST), state)
    assert holds_checkpoints(tmp_path)  # the CLI's look at --out reads only too
    assert _tree(folder) == before
    # A writer (a fit that resumes) removes it, before its first save at the latest.
    with TrainingCheckpointer(folder) as checkpointer:
        checkpointer.save_latest(randomized(TEMPLATE, 5, step=9), RNG, {})
    assert not in_progress.exists()


def test_a_reader_skips_a_damaged_step_and_leaves_it_in_place(tmp_path: pathlib.Path) -> None:
    older, _ = save_two_latest_steps(tmp_path)
    _truncate(tmp_path / LATEST / "10")
    before = _tree(tmp_path)
    with pytest.warns(UserWarning, match=left_in_place(tmp_path, LATEST, 10)):
        restored = load_state(tmp_path, TEMPLATE, prefer=LATEST)
    assert_bitwise_equal(restored, older)
    assert _tree(tmp_path) == before  # no step moved, no empty corrupt/ folder
    assert not (tmp_path / CORRUPT).exists()


def test_a_reader_takes_a_damaged_best_from_the_latest_step_without_saving_it(
    tmp_path: pathlib.Path,
) -> None:
    best = randomized(TEMPLATE, 3, step=10)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        checkpointer.save_best(best, RNG, {})
        checkpointer.save_latest(best, RNG, {})
    _truncate(tmp_path / BEST / "10")
    before = _tree(tmp_path)
    with (
        pytest.warns(UserWarning, match=left_in_place(tmp_path, BEST, 10)),
        pytest.warns(UserWarning, match=r"latest checkpoint of the same step \(not saved as best"),
    ):
        assert_bitwise_equal(load_state(tmp_path, TEMPLATE), best)
    assert _tree(tmp_path) == before


def _vanishing(directory: pathlib.Path, step: int, read: int, replace: Any = None) -> Any:
    """`CheckpointManager.restore`, removing `directory/step` before its `read`-th read.

    What a running `fit` does between a reader's listing and its read: it
    removes an old latest step, or the best step it replaced (`replace()`
    then puts the new best in place).
    """
    original = ocp.CheckpointManager.restore
    reads = []

    def restore(manager: Any, restored: int, *args: Any, **kwargs: Any) -> Any:
        if pathlib.Path(manager.directory) == directory and restored == step:
            reads.append(restored)
            if len(reads) == read:
                if replace is not None:
                    replace()
                shutil.rmtree(directory / str(step))
        return original(manager, restored, *args, **kwargs)

    return restore


@pytest.mark.parametrize("read", [1, 2], ids=["before-metadata", "before-arrays"])
def test_a_step_removed_while_a_reader_reads_it_is_skipped_for_the_older_one(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, read: int
) -> None:
    older, _ = save_two_latest_steps(tmp_path)
    monkeypatch.setattr(ocp.CheckpointManager, "restore", _vanishing(tmp_path / LATEST, 10, read))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = load_state(tmp_path, TEMPLATE, prefer=LATEST)
    assert_bitwise_equal(restored, older)
    assert not [str(w.message) for w in caught if "step 10" in str(w.message)]
    assert not (tmp_path / CORRUPT).exists()


def test_a_best_step_replaced_while_a_reader_reads_it_gives_the_new_best(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer's next best is saved elsewhere, and moved in when the old one goes.
    new_best = randomized(TEMPLATE, 3, step=12)
    with TrainingCheckpointer(tmp_path / "writer") as checkpointer:
        checkpointer.save_best(new_best, RNG, {})
    with TrainingCheckpointer(tmp_path / "run") as checkpointer:
        checkpointer.save_best(randomized(TEMPLATE, 2, step=10), RNG, {})

    def replace() -> None:
        shutil.move(tmp_path / "writer" / BEST / "12", tmp_path / "run" / BEST / "12")

    monkeypatch.setattr(
        ocp.CheckpointManager, "restore", _vanishing(tmp_path / "run" / BEST, 10, 1, replace)
    )
    assert_bitwise_equal(load_state(tmp_path / "run", TEMPLATE), new_best)


def test_errors_of_abandoned_reads_inside_a_vanished_step_are_not_printed(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that failed as its step vanished: the other reads' errors on close are dropped.

    Python printed a traceback with a tensorstore spec, a hundred lines, for
    each array read that orbax abandoned, when it was garbage-collected.
    """
    from tft_jax import checkpoint

    seen: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: seen.append(str(report.exc_value)))
    checkpoint._drop_late_loop_callbacks()
    vanished, other = tmp_path / LATEST / "10", tmp_path / LATEST / "100"
    with (
        pytest.raises(FileNotFoundError),
        checkpoint._abandoned_reads_unlogged(vanished),
    ):
        raise FileNotFoundError(errno.ENOENT, "Checkpoint not found", str(vanished))

    class Pending:
        def __await__(self) -> Any:
            yield

    async def read_array(step: pathlib.Path) -> None:
        try:
            await Pending()
        except BaseException as error:  # as orbax's `_read_array_index_and_device_put`
            message = f"Encountered error while reading array index: 'path': '{step}/state/'"
            raise Exception(message) from error  # the type orbax raises

    for step in (vanished, other):
        read = read_array(step)
        read.send(None)  # under way
        del read  # collected: its close raises, reported to sys.unraisablehook
    assert seen == [f"Encountered error while reading array index: 'path': '{other}/state/'"]


def test_a_step_removed_while_a_reader_lists_the_steps_is_not_listed(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # orbax lists the step directories, then stats each: one removed in between fails it.
    older, _ = save_two_latest_steps(tmp_path)
    original = ocp.CheckpointManager._load_checkpoint_infos
    removed = tmp_path / LATEST / "10"

    def listing(manager: Any, *args: Any, **kwargs: Any) -> Any:
        if removed.exists():
            shutil.rmtree(removed)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(removed))
        return original(manager, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "_load_checkpoint_infos", listing)
    assert_bitwise_equal(load_state(tmp_path, TEMPLATE, prefer=LATEST), older)


def test_saving_through_a_checkpointer_opened_for_reading_is_refused(
    tmp_path: pathlib.Path,
) -> None:
    with (
        TrainingCheckpointer(tmp_path, create=False) as checkpointer,
        pytest.raises(ValueError, match=r"save_latest: .* opened for reading only"),
    ):
        checkpointer.save_latest(randomized(TEMPLATE, 2, step=5), RNG, {})
    assert not tmp_path.joinpath(LATEST).exists()


def test_a_step_that_cannot_be_read_for_permissions_is_an_error_not_a_vanished_step(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `os.path.lexists` says False for a path it cannot stat: the unreadable step 10 was
    # taken for one the writer removed, and step 5 returned without a word.
    save_two_latest_steps(tmp_path)
    step10 = tmp_path / LATEST / "10"
    restore, lstat = ocp.CheckpointManager.restore, os.lstat

    def denied_restore(manager: Any, step: int, *args: Any, **kwargs: Any) -> Any:
        if step == 10:
            raise PermissionError(errno.EACCES, "Permission denied", str(step10))
        return restore(manager, step, *args, **kwargs)

    def denied_lstat(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == str(step10):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return lstat(path, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "restore", denied_restore)
    monkeypatch.setattr(os, "lstat", denied_lstat)
    with pytest.raises(CheckpointReadError, match=r"latest checkpoint step 10 \(PermissionErr"):
        load_state(tmp_path, TEMPLATE, prefer=LATEST)
