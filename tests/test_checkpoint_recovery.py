"""Checkpoints read back after something went wrong: each case is moved aside or announced.

A read failure that is no damage, a damaged, corrupt or missing step (latest or
best), and a resume over fewer batches or a lower `max_steps` than the checkpoint saw.
"""

from __future__ import annotations

import dataclasses
import errno
import pathlib
import re
import shutil
from typing import Any

import jax
import orbax.checkpoint as ocp
import pytest

from tests.checkpoint_states import (
    TEMPLATE,
    VAL,
    _truncate,
    assert_bitwise_equal,
    corrupt_warning,
    epoch_batches,
    randomized,
    save_two_latest_steps,
    stand_in_state,
)
from tft_jax.checkpoint import (
    BEST,
    CORRUPT,
    LATEST,
    CheckpointReadError,
    TrainingCheckpointer,
    load_state,
)
from tft_jax.train import fit

RNG = jax.random.key(0)


# What a read of intact files raises when the cause lies elsewhere: Python's open,
# tensorstore (a ValueError with the absl status code) and XLA (device memory).
READ_FAILURES = [
    PermissionError(errno.EACCES, "Permission denied"),
    ValueError('PERMISSION_DENIED: Error reading local file "x": [OS error: Permission denied]'),
    RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1024 bytes."),
    MemoryError(),
    OSError(errno.EMFILE, "Too many open files"),
]


@pytest.mark.parametrize("failure", READ_FAILURES, ids=lambda error: type(error).__name__)
def test_a_read_failure_that_is_no_damage_raises_naming_the_step_and_moves_nothing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    _, newer = save_two_latest_steps(tmp_path)
    original = ocp.CheckpointManager.restore

    def failing(manager: Any, step: int, *args: Any, **kwargs: Any) -> Any:
        if step == 10:
            raise failure
        return original(manager, step, *args, **kwargs)

    with TrainingCheckpointer(tmp_path) as checkpointer:
        monkeypatch.setattr(ocp.CheckpointManager, "restore", failing)
        with pytest.raises(CheckpointReadError) as raised:
            checkpointer.restore_latest(TEMPLATE)
        monkeypatch.undo()
        assert checkpointer.steps() == [5, 10]
    assert isinstance(raised.value, OSError)
    assert raised.value.__cause__ is failure
    assert raised.value.filename == str(tmp_path / LATEST / "10")
    assert str(tmp_path / LATEST / "10") in str(raised.value)
    assert not (tmp_path / CORRUPT).exists()
    # The cause gone, the very step that failed to read is restored.
    with TrainingCheckpointer(tmp_path) as checkpointer:
        restored = checkpointer.restore_latest(TEMPLATE)
    assert restored is not None and restored.step == 10
    assert_bitwise_equal(restored.state, newer)


def test_a_damaged_step_is_moved_aside_with_a_warning_naming_where(
    tmp_path: pathlib.Path,
) -> None:
    save_two_latest_steps(tmp_path)
    _truncate(tmp_path / LATEST / "10")
    with (
        TrainingCheckpointer(tmp_path) as checkpointer,
        pytest.warns(UserWarning, match="latest step 10 .* is corrupt") as caught,
    ):
        restored = checkpointer.restore_latest(TEMPLATE)
    assert restored is not None and restored.step == 5
    assert str(tmp_path / CORRUPT / "latest-10") in str(caught[0].message)
    assert "tensorstore_spec" not in str(caught[0].message)  # one readable line


def test_a_corrupt_best_is_restored_from_the_latest_step_of_the_same_number(
    tmp_path: pathlib.Path,
) -> None:
    best = randomized(TEMPLATE, 3, step=10)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        checkpointer.save_latest(randomized(TEMPLATE, 2, step=5), RNG, {})
        checkpointer.save_best(best, RNG, {})
        checkpointer.save_latest(best, RNG, {})
    _truncate(tmp_path / BEST / "10")
    with TrainingCheckpointer(tmp_path) as checkpointer:
        with (
            pytest.warns(UserWarning, match=corrupt_warning(tmp_path, BEST, 10)),
            pytest.warns(UserWarning, match="restored from the latest checkpoint"),
        ):
            restored = checkpointer.restore_best(TEMPLATE)
        assert restored is not None and restored.step == 10
        assert_bitwise_equal(restored.state, best)
        assert checkpointer.steps(BEST) == [10]  # saved as best again
    assert (tmp_path / CORRUPT / "best-10").is_dir()
    # A later reader finds the best step without any warning.
    assert_bitwise_equal(load_state(tmp_path, TEMPLATE), best)


def test_a_corrupt_best_without_a_stand_in_is_announced_as_lost(tmp_path: pathlib.Path) -> None:
    with TrainingCheckpointer(tmp_path) as checkpointer:
        checkpointer.save_best(randomized(TEMPLATE, 3, step=10), RNG, {})
        checkpointer.save_latest(randomized(TEMPLATE, 2, step=12), RNG, {})
    _truncate(tmp_path / BEST / "10")
    with (
        TrainingCheckpointer(tmp_path) as checkpointer,
        pytest.warns(UserWarning, match=corrupt_warning(tmp_path, BEST, 10)),
        pytest.warns(UserWarning, match="no intact best checkpoint remains .* lost"),
    ):
        assert checkpointer.restore_best(TEMPLATE) is None


# Negated validation targets: training moves away from them, so the first
# evaluation (step 6) is the best and the final state (step 12) is not.
AWAY = [dataclasses.replace(batch, target=-batch.target) for batch in VAL]


def fit_away(directory: pathlib.Path) -> Any:
    """Two epochs on `AWAY`, checkpointed in `directory`: evaluations at steps 6 and 12."""
    first = fit(
        stand_in_state(), epoch_batches, AWAY, epochs=2, checkpoint_dir=directory, quiet=True
    )
    assert first.history["step"] == [6, 12]
    return first


def test_resumed_fit_returns_the_best_state_when_its_best_checkpoint_is_corrupt(
    tmp_path: pathlib.Path,
) -> None:
    first = fit_away(tmp_path)
    assert first.history["val_loss"][0] < first.history["val_loss"][1]
    _truncate(tmp_path / BEST / "6")
    stand_in = (
        r"^best checkpoint step 6 restored from the latest checkpoint of the same step, "
        rf"and saved in {re.escape(str(tmp_path / BEST))} again$"
    )
    with (
        pytest.warns(UserWarning, match=corrupt_warning(tmp_path, BEST, 6)),
        pytest.warns(UserWarning, match=stand_in),
    ):
        again = fit(
            stand_in_state(),
            epoch_batches,
            AWAY,
            epochs=2,
            checkpoint_dir=tmp_path,
            resume=True,
            quiet=True,
        )
    assert_bitwise_equal(again.best_state, first.best_state)
    assert_bitwise_equal(load_state(tmp_path, stand_in_state()), first.best_state)


def test_a_resumed_fit_whose_best_checkpoint_is_gone_says_so(tmp_path: pathlib.Path) -> None:
    fit_away(tmp_path)
    shutil.rmtree(tmp_path / BEST / "6")  # deleted by hand, or moved aside by an earlier resume
    with pytest.warns(UserWarning, match=r"the best checkpoint \(validation loss .*\) is "
                      r"missing from .*; best_state is the resumed state of step 12"):  # fmt: skip
        again = fit(
            stand_in_state(), epoch_batches, AWAY, epochs=2, checkpoint_dir=tmp_path,
            resume=True, quiet=True,
        )  # fmt: skip
    assert_bitwise_equal(again.best_state, again.state)


def test_a_resume_whose_latest_checkpoints_are_all_corrupt_goes_on_from_the_best(
    tmp_path: pathlib.Path,
) -> None:
    # Every latest step damaged (a disk fault), the best step intact: the run goes on
    # from the best step, announced, and ends where the uninterrupted run ended.
    # It restarted from step 0 as if nothing had been saved.
    first = fit_away(tmp_path)
    latest = sorted(int(path.name) for path in (tmp_path / LATEST).iterdir() if path.name.isdigit())
    assert latest == [6, 12]
    for step in latest:
        _truncate(tmp_path / LATEST / str(step))
    # Each latest step is moved aside with its own warning.
    truncated = "unreadable arrays: "
    with (
        pytest.warns(UserWarning, match=corrupt_warning(tmp_path, LATEST, 12, truncated)),
        pytest.warns(UserWarning, match=corrupt_warning(tmp_path, LATEST, 6, truncated)),
        pytest.warns(UserWarning, match=r"no intact latest checkpoint .* best checkpoint, step 6"),
    ):
        again = fit(
            stand_in_state(), epoch_batches, AWAY, epochs=2, checkpoint_dir=tmp_path,
            resume=True, quiet=True,
        )  # fmt: skip
    assert_bitwise_equal(again.state, first.state)
    assert_bitwise_equal(again.best_state, first.best_state)


def test_a_resume_past_a_lowered_max_steps_says_the_state_is_the_checkpoints(
    tmp_path: pathlib.Path,
) -> None:
    # It returned at once as 'completed' with a state beyond the max_steps asked for.
    first = fit(stand_in_state(), epoch_batches, VAL, epochs=2, checkpoint_dir=tmp_path, quiet=True)
    assert int(first.state.step) == 12
    with pytest.warns(UserWarning, match=r"at step 12, past max_steps=8; its state is returned"):
        again = fit(
            stand_in_state(), epoch_batches, VAL, epochs=2, checkpoint_dir=tmp_path,
            resume=True, max_steps=8, quiet=True,
        )  # fmt: skip
    assert int(again.state.step) == 12


def test_a_resume_over_an_epoch_with_fewer_batches_than_were_done_says_so(
    tmp_path: pathlib.Path,
) -> None:
    # Four batches of epoch 0 done; the data now has three an epoch: the rest of
    # epoch 0 was skipped without a word.
    fit(
        stand_in_state(), epoch_batches, VAL, epochs=2, checkpoint_dir=tmp_path,
        checkpoint_every=4, max_steps=4, quiet=True,
    )  # fmt: skip

    def fewer(epoch):
        return list(epoch_batches(epoch))[:3]

    with pytest.warns(UserWarning, match=r"epoch 0 now has 3 batches, but the checkpoint had "
                      r"trained on 4 of it"):  # fmt: skip
        again = fit(
            stand_in_state(), fewer, VAL, epochs=2, checkpoint_dir=tmp_path, resume=True,
            quiet=True,
        )  # fmt: skip
    assert int(again.state.step) == 7  # epoch 1's three batches after the four
