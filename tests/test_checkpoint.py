"""Tests of checkpointing and resume (`tft_jax.checkpoint`, `tft_jax.train.fit`)."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.checkpoint_states import (
    CONFIG,
    MODEL,
    STAND_IN,
    TEMPLATE,
    TX,
    VAL,
    _array_files,
    _truncate,
    assert_bitwise_equal,
    corrupt_warning,
    epoch_batches,
    randomized,
    sample_batch,
    stand_in_state,
)
from tests.stepped_state import _Stepped
from tft_jax.checkpoint import (
    BEST,
    CORRUPT,
    LATEST,
    CheckpointWriteError,
    TrainingCheckpointer,
    load_state,
)
from tft_jax.config import TFTConfig
from tft_jax.model import TemporalFusionTransformer
from tft_jax.train import create_train_state, decay_model_params_only, fit

ROOT = pathlib.Path(__file__).resolve().parent.parent

LOOP = {"epoch": 1, "batches_done": 3, "history": {"val_loss": [0.1 + 0.2, None]}, "x": 1 / 3}


def test_save_restore_round_trip_is_bit_identical(tmp_path: pathlib.Path) -> None:
    state = randomized(TEMPLATE, seed=1, step=7)
    rng = jax.random.fold_in(jax.random.key(42), 3)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        assert checkpointer.save_latest(state, rng, LOOP)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        restored = checkpointer.restore_latest(TEMPLATE)
    assert restored is not None
    assert restored.step == 7
    assert_bitwise_equal(restored.state, state)
    assert restored.state.apply_fn == TEMPLATE.apply_fn
    assert restored.state.quantiles == TEMPLATE.quantiles
    np.testing.assert_array_equal(jax.random.key_data(restored.rng), jax.random.key_data(rng))
    assert restored.loop == LOOP


def test_saving_a_step_again_keeps_the_first_copy(tmp_path: pathlib.Path) -> None:
    first, second = randomized(TEMPLATE, 8, step=4), randomized(TEMPLATE, 9, step=4)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        assert checkpointer.save_latest(first, jax.random.key(0), {})
        assert not checkpointer.save_latest(second, jax.random.key(0), {})
        restored = checkpointer.restore_latest(TEMPLATE)
    assert restored is not None
    assert_bitwise_equal(restored.state, first)


@pytest.mark.parametrize("kind", [LATEST, BEST])
def test_saving_a_step_older_than_the_newest_raises_instead_of_writing_nothing(
    tmp_path: pathlib.Path, kind: str
) -> None:
    # A fresh run in the directory of a longer one: orbax skipped every step up to the
    # old run's newest without a word, and resume / load_state then read the old run.
    newer, older = randomized(TEMPLATE, 10, step=10), randomized(TEMPLATE, 11, step=4)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        save = checkpointer.save_latest if kind == LATEST else checkpointer.save_best
        assert save(newer, jax.random.key(0), {})
        with pytest.raises(ValueError, match=f"save_{kind}: step 4 is older than the newest"):
            save(older, jax.random.key(0), {})
        assert checkpointer.steps(kind) == [10]
        restored = checkpointer.restore(kind, TEMPLATE)
    assert restored is not None and restored.step == 10
    assert_bitwise_equal(restored.state, newer)


# What orbax raised on a full disk: an OSError at first, then tensorstore's status
# (whose text quotes the OS error); and a status error saying nothing of the disk.
_FAILED_WRITES = [
    (OSError(28, "No space left on device"), 28),
    (
        ValueError(
            'RESOURCE_EXHAUSTED: Error writing local file "/x/4.orbax-checkpoint-tmp/state/'
            "_sharding\": [OS error: No space left on device] [tensorstore_spec='{...}']"
        ),
        28,
    ),
    (ValueError("RESOURCE_EXHAUSTED: Error writing local file: quota exceeded"), None),
]


@pytest.mark.parametrize(
    ("raised", "number"), _FAILED_WRITES, ids=["oserror", "tensorstore", "quota"]
)
def test_a_failed_write_is_one_oserror_naming_the_step_and_directory(
    tmp_path, raised, number
) -> None:
    # Before: the first failure of a full disk raised OSError, later ones orbax's ValueError.
    state = randomized(TEMPLATE, seed=1, step=4)
    with TrainingCheckpointer(tmp_path) as checkpointer:

        def full(*args: Any, **kwargs: Any) -> bool:
            raise raised

        checkpointer._managers[LATEST].save = full
        with pytest.raises(CheckpointWriteError) as caught:
            checkpointer.save_latest(state, jax.random.key(0), {})
    error = caught.value
    assert isinstance(error, OSError) and error.errno == number and error.__cause__ is raised
    assert "saving the latest checkpoint of step 4 failed:" in str(error)
    assert str(error).startswith(str(tmp_path)) and "tensorstore_spec" not in str(error)


def test_a_value_error_that_is_no_failed_write_is_raised_as_it_is(tmp_path) -> None:
    state = randomized(TEMPLATE, seed=1, step=4)
    with TrainingCheckpointer(tmp_path) as checkpointer:

        def wrong(*args: Any, **kwargs: Any) -> bool:
            raise ValueError("a bug")

        checkpointer._managers[LATEST].save = wrong
        with pytest.raises(ValueError, match=r"^a bug$"):
            checkpointer.save_latest(state, jax.random.key(0), {})


# A failed write inside orbax leaves an asyncio callback behind; it is harmless.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_loop_json_cannot_hold_is_refused_before_anything_is_written(
    tmp_path: pathlib.Path,
) -> None:
    with TrainingCheckpointer(tmp_path) as checkpointer:
        with pytest.raises(TypeError) as raised:
            checkpointer.save_latest(
                randomized(TEMPLATE, 12, step=3), jax.random.key(0), {"val": np.float32(0.5)}
            )
        assert sorted(os.listdir(tmp_path / LATEST)) == []  # no temporary step left behind
        # The checkpointer still saves (a leftover temporary step made this an OSError).
        assert checkpointer.save_latest(
            randomized(TEMPLATE, 12, step=3), jax.random.key(0), {"val": 0.5}
        )
        restored = checkpointer.restore_latest(TEMPLATE)
    assert restored is not None and restored.loop == {"val": 0.5}
    assert "loop must hold only JSON values" in str(raised.value)
    assert "float32" in str(raised.value)


def test_restore_without_checkpoints_returns_none(tmp_path: pathlib.Path) -> None:
    with TrainingCheckpointer(tmp_path) as checkpointer:
        assert checkpointer.restore_latest(TEMPLATE) is None
        assert checkpointer.restore_best(TEMPLATE) is None


def test_load_state_finds_a_folder_under_home_where_fit_wrote_it(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fit(checkpoint_dir="~/ck") wrote under the home folder; load_state("~/ck") said
    # "no checkpoint directory ~/ck".
    monkeypatch.setenv("HOME", str(tmp_path))
    state = randomized(TEMPLATE, 1, step=7)
    with TrainingCheckpointer("~/ck") as checkpointer:  # what fit opens
        checkpointer.save_best(state, jax.random.key(0), {})
    assert (tmp_path / "ck" / BEST / "7").is_dir()
    assert_bitwise_equal(load_state("~/ck", TEMPLATE), state)
    assert_bitwise_equal(load_state(pathlib.Path("~/ck"), TEMPLATE), state)
    with pytest.raises(TypeError, match=r"load_state: directory must be a path .*NoneType"):
        load_state(None, TEMPLATE)


@pytest.mark.parametrize("entry", [LATEST, BEST, CORRUPT])
def test_a_file_where_a_checkpoint_folder_belongs_is_refused_naming_it(
    tmp_path: pathlib.Path, entry: str
) -> None:
    # orbax failed on latest/ or best/ from a background thread, then found no checkpoint;
    # moving a damaged step aside into a corrupt/ that is a file raised FileExistsError.
    (tmp_path / entry).write_text("x")
    path = re.escape(str(tmp_path / entry))
    expected = rf"^TrainingCheckpointer: {path} is a file, expected a directory holding "
    with pytest.raises(ValueError, match=expected):
        TrainingCheckpointer(tmp_path)
    with pytest.raises(ValueError, match=expected):
        load_state(tmp_path, TEMPLATE)
    assert (tmp_path / entry).read_text() == "x"


# ---------------------------------------------------------------------------
# The PRNG key: a key restore could not give back is refused at save


def _state(step: int) -> _Stepped:
    return _Stepped({"step": jnp.asarray(step, jnp.int32), "w": jnp.arange(3.0)})


@pytest.mark.parametrize(
    "make, shown",
    [
        (lambda: jax.random.split(jax.random.key(1), 3), r"shape \(3, 2\)"),
        (lambda: jax.random.key(1, impl="rbg"), r"shape \(4,\) \(rbg\)"),
    ],
)
def test_a_key_restore_cannot_give_back_is_refused_at_save(tmp_path, make, shown):
    # Saved without a word, then every resume failed: "does not fit the template: ['rng']".
    with TrainingCheckpointer(tmp_path) as checkpointer:
        with pytest.raises(ValueError, match=rf"save_latest: rng must be one PRNG key .*{shown}"):
            checkpointer.save_latest(_state(2), make(), {})
        assert checkpointer.steps() == []


def test_a_legacy_uint32_key_restores_as_the_same_typed_key(tmp_path):
    with TrainingCheckpointer(tmp_path) as checkpointer:
        assert checkpointer.save_latest(_state(2), jax.random.PRNGKey(7), {"epoch": 1})
        restored = checkpointer.restore(LATEST, _state(0))
    assert restored is not None and restored.step == 2 and restored.loop == {"epoch": 1}
    np.testing.assert_array_equal(jax.random.key_data(restored.rng), [0, 7])
    expected = jax.random.uniform(jax.random.key(7), (4,))
    np.testing.assert_array_equal(jax.random.uniform(restored.rng, (4,)), expected)
    np.testing.assert_array_equal(restored.state["w"], np.arange(3.0))


def _flip_bytes(step_dir: pathlib.Path) -> None:
    for path in _array_files(step_dir):
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 16] = bytes(255 - value for value in data[middle : middle + 16])
        path.write_bytes(bytes(data))


def _arrays_of_older_step(step_dir: pathlib.Path) -> None:
    # Well-formed arrays that are not the ones saved: only the digest can tell.
    shutil.rmtree(step_dir / "state")
    shutil.copytree(step_dir.parent / "5" / "state", step_dir / "state")


def _empty_step(step_dir: pathlib.Path) -> None:
    for path in sorted(step_dir.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()


def _garble_meta(step_dir: pathlib.Path) -> None:
    for path in (step_dir / "meta").rglob("*"):
        if path.is_file():
            path.write_text("{not json")


# The damage each one is found as: the check that catches it, named in the warning.
DAMAGES = [
    pytest.param(_truncate, "unreadable arrays: ", id="_truncate"),
    # Flipped bytes fail the read where they land in a b-tree node, the digest elsewhere.
    pytest.param(
        _flip_bytes, "unreadable arrays: |the bytes do not match the saved digest", id="_flip_bytes"
    ),
    pytest.param(
        _arrays_of_older_step, "the bytes do not match the saved digest", id="_arrays_of_older_step"
    ),
    pytest.param(_empty_step, "unreadable metadata: ", id="_empty_step"),
    pytest.param(_garble_meta, "unreadable metadata: JSONDecodeError", id="_garble_meta"),
]


@pytest.mark.parametrize(("damage", "reason"), DAMAGES)
def test_damaged_newest_checkpoint_is_never_restored(
    tmp_path: pathlib.Path, damage: Any, reason: str
) -> None:
    good, newer = randomized(TEMPLATE, 2, step=5), randomized(TEMPLATE, 3, step=10)
    rng = jax.random.key(0)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        checkpointer.save_latest(good, rng, {"step": 5})
        checkpointer.save_latest(newer, rng, {"step": 10})
    damage(tmp_path / LATEST / "10")
    with TrainingCheckpointer(tmp_path) as checkpointer:
        # Moving the step aside is a repair of the user's run: it is announced.
        with pytest.warns(UserWarning, match=corrupt_warning(tmp_path, LATEST, 10, reason)):
            restored = checkpointer.restore_latest(TEMPLATE)
        assert restored is not None and restored.step == 5
        assert_bitwise_equal(restored.state, good)
        assert checkpointer.steps() == [5]
    assert (tmp_path / CORRUPT / "latest-10").is_dir()


def test_interrupted_save_leaves_a_temporary_directory_that_is_never_a_step(
    tmp_path: pathlib.Path,
) -> None:
    state = randomized(TEMPLATE, 4, step=3)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        checkpointer.save_latest(state, jax.random.key(0), {})
    # What a process killed inside orbax's save leaves behind: a temporary directory.
    partial = tmp_path / LATEST / "8.orbax-checkpoint-tmp-1700000000"
    (partial / "state").mkdir(parents=True)
    (partial / "state" / "manifest.ocdbt").write_bytes(b"\x00" * 7)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        assert checkpointer.steps() == [3]
        restored = checkpointer.restore_latest(TEMPLATE)
    assert restored is not None and restored.step == 3


def test_every_checkpoint_damaged_means_nothing_is_restored(tmp_path: pathlib.Path) -> None:
    with TrainingCheckpointer(tmp_path) as checkpointer:
        for step in (1, 2):
            checkpointer.save_latest(randomized(TEMPLATE, step, step), jax.random.key(0), {})
    for step in (1, 2):
        _truncate(tmp_path / LATEST / str(step))
    with (
        TrainingCheckpointer(tmp_path) as checkpointer,
        pytest.warns(UserWarning, match=r"^checkpoint latest step") as caught,
    ):
        assert checkpointer.restore_latest(TEMPLATE) is None
    # Each step is moved aside with its own warning, the newest first.
    messages = [
        str(record.message)
        for record in caught
        if re.match(r"checkpoint latest step", str(record.message))
    ]
    assert len(messages) == 2, messages
    for message, step in zip(messages, (2, 1), strict=True):
        assert re.search(corrupt_warning(tmp_path, LATEST, step, "unreadable arrays: "), message)
        assert (tmp_path / CORRUPT / f"latest-{step}").is_dir()


def test_checkpoint_of_another_model_raises_and_is_kept(tmp_path: pathlib.Path) -> None:
    with TrainingCheckpointer(tmp_path) as checkpointer:
        checkpointer.save_latest(randomized(TEMPLATE, 5, 4), jax.random.key(0), {})
    wider = TemporalFusionTransformer(
        TFTConfig(**{**CONFIG.__dict__, "hidden_dim": 12, "num_heads": 2})
    )
    # Restoring reads only the template's structure, shapes and dtypes: its values can be
    # zeros of `wider.init`'s shapes (no compiled init of a second model).
    batch, keys = sample_batch(), {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    shapes = jax.eval_shape(wider.init, keys, batch.static, batch.historical, batch.future)
    zeros = jax.device_put(jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), shapes))
    other = create_train_state(wider, TX, jax.random.key(0), batch, variables=zeros)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        with pytest.raises(ValueError, match="does not fit the template"):
            checkpointer.restore_latest(other)
        assert checkpointer.steps() == [4]


def test_checkpoint_with_per_leaf_adam_moments_names_the_optimizer_layout(
    tmp_path: pathlib.Path,
) -> None:
    """A checkpoint from before the flat optimizer: same model, optax's per-leaf Adam state."""
    per_leaf = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(1e-3, weight_decay=1e-4, mask=decay_model_params_only),
    )
    old = create_train_state(MODEL, per_leaf, jax.random.key(0), sample_batch())
    with TrainingCheckpointer(tmp_path) as checkpointer:
        checkpointer.save_latest(randomized(old, 5, 4), jax.random.key(0), {})
    with TrainingCheckpointer(tmp_path) as checkpointer:
        with pytest.raises(ValueError, match="does not fit the template") as raised:
            checkpointer.restore_latest(TEMPLATE)
        assert checkpointer.steps() == [4]
    message = str(raised.value)
    assert "Only the optimizer state differs" in message
    assert str(tmp_path / LATEST / "4") in message
    assert "ScaleByAdamState" in message and "FlatAdamWState" in message


def test_best_checkpoints_newer_than_the_resumed_step_are_discarded(
    tmp_path: pathlib.Path,
) -> None:
    rng = jax.random.key(0)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        checkpointer.save_best(randomized(TEMPLATE, 6, 4), rng, {})
        checkpointer.save_best(randomized(TEMPLATE, 7, 9), rng, {})
        assert checkpointer.steps("best") == [9]
        checkpointer.discard_best_after(6)
        assert checkpointer.steps("best") == []


def test_the_best_checkpoint_of_the_resumed_step_itself_is_kept(tmp_path: pathlib.Path) -> None:
    # Resuming from step 4 whose evaluation was the best: that best step was written
    # before the checkpoint resumed from, so it stays; only a later one (6) goes.
    rng = jax.random.key(0)
    with TrainingCheckpointer(tmp_path) as checkpointer:
        checkpointer.save_best(randomized(TEMPLATE, 6, 4), rng, {})
        checkpointer.discard_best_after(4)
        assert checkpointer.steps("best") == [4]
        checkpointer.save_best(randomized(TEMPLATE, 7, 6), rng, {})
        assert checkpointer.steps("best") == [6]
        checkpointer.discard_best_after(4)
        assert checkpointer.steps("best") == []


# ---------------------------------------------------------------------------
# Resume through fit, in process, on a stand-in forecaster


def test_resume_of_a_finished_run_returns_its_results_without_training(
    tmp_path: pathlib.Path,
) -> None:
    first = fit(stand_in_state(), epoch_batches, VAL, epochs=2, checkpoint_dir=tmp_path, quiet=True)
    again = fit(
        stand_in_state(),
        epoch_batches,
        VAL,
        epochs=2,
        checkpoint_dir=tmp_path,
        resume=True,
        quiet=True,
    )
    assert again.history == first.history
    assert_bitwise_equal(again.state, first.state)
    assert_bitwise_equal(again.best_state, first.best_state)
    assert_bitwise_equal(load_state(tmp_path, stand_in_state()), first.best_state)
    assert_bitwise_equal(load_state(tmp_path, stand_in_state(), prefer="latest"), first.state)
    with pytest.raises(FileNotFoundError):
        load_state(tmp_path / "missing", stand_in_state())


def test_resuming_a_finished_run_with_more_epochs_equals_training_them_at_once(
    tmp_path: pathlib.Path,
) -> None:
    def run(directory: pathlib.Path, epochs: int, resume: bool) -> Any:
        return fit(
            stand_in_state(),
            epoch_batches,
            VAL,
            epochs=epochs,
            checkpoint_dir=directory,
            resume=resume,
            quiet=True,
        )

    run(tmp_path / "extended", epochs=2, resume=False)
    extended = run(tmp_path / "extended", epochs=3, resume=True)
    at_once = run(tmp_path / "at_once", epochs=3, resume=False)
    assert extended.history == at_once.history
    assert extended.history["epoch"] == [0, 1, 2]
    assert_bitwise_equal(extended.state, at_once.state)
    assert_bitwise_equal(extended.best_state, at_once.best_state)


def test_resume_with_another_seed_is_rejected(tmp_path: pathlib.Path) -> None:
    fit(stand_in_state(), epoch_batches, VAL, epochs=1, seed=0, checkpoint_dir=tmp_path, quiet=True)
    with pytest.raises(ValueError, match="seed"):
        fit(
            stand_in_state(),
            epoch_batches,
            epochs=1,
            seed=1,
            checkpoint_dir=tmp_path,
            resume=True,
            quiet=True,
        )


def test_a_fresh_start_refuses_a_folder_holding_an_earlier_run(tmp_path: pathlib.Path) -> None:
    fit(stand_in_state(), epoch_batches, VAL, epochs=1, checkpoint_dir=tmp_path, quiet=True)
    before = _steps(tmp_path)
    # Its saves would interleave with the earlier run's (or be refused mid-training).
    with pytest.raises(ValueError, match=r"earlier run \(latest step 6\); pass resume=True"):
        fit(stand_in_state(), epoch_batches, VAL, epochs=2, checkpoint_dir=tmp_path, quiet=True)
    assert _steps(tmp_path) == before


class FakeClock:
    """A clock that stands still until told to advance (`now` seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Interrupted(Exception):
    """The stand-in for a crash in the middle of training."""


def timed_batches(clock: FakeClock, crash_before: int | None = None) -> Any:
    """`epoch_batches` where each batch takes a second on `clock`; raises before fetch N."""
    fetched = 0

    def source(epoch: int) -> Any:
        nonlocal fetched
        for batch in epoch_batches(epoch):
            fetched += 1
            if fetched == crash_before:
                raise Interrupted
            clock.now += 1.0
            yield batch

    return source


def test_a_run_interrupted_between_evaluations_resumes_from_its_timed_checkpoint(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "run"
    clock = FakeClock()
    # One evaluation, at the end (step 12); latest checkpoints every 3.5 s
    # (step s ends at s seconds), none by steps.
    common = dict(epochs=2, seed=5, eval_every=12, checkpoint_dir=directory)
    with pytest.raises(Interrupted):
        fit(
            stand_in_state(),
            timed_batches(clock, crash_before=12),
            VAL,
            checkpoint_every_seconds=3.5,
            clock=clock,
            quiet=True,
            **common,
        )
    assert _steps(directory) == [6, 10]  # 4 (timed), 6 (epoch end), 10 (timed)
    assert not list((directory / BEST).iterdir())
    capsys.readouterr()
    resumed = fit(stand_in_state(), epoch_batches, VAL, resume=True, label="FP32", **common)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"FP32: resuming from step 10 (epoch 1) of the checkpoint in {directory}"
    reference = fit(
        stand_in_state(), epoch_batches, VAL, epochs=2, seed=5, eval_every=12, quiet=True
    )
    assert resumed.history == reference.history
    assert_bitwise_equal(resumed.state, reference.state)
    assert_bitwise_equal(resumed.best_state, reference.best_state)


def test_without_timed_checkpoints_a_crash_falls_back_to_the_epoch_end(
    tmp_path: pathlib.Path,
) -> None:
    clock = FakeClock()
    with pytest.raises(Interrupted):
        fit(
            stand_in_state(),
            timed_batches(clock, crash_before=12),
            VAL,
            epochs=2,
            eval_every=12,
            checkpoint_dir=tmp_path,
            checkpoint_every_seconds=None,
            clock=clock,
            quiet=True,
        )
    assert _steps(tmp_path) == [6]


def test_resume_without_a_checkpoint_says_so_and_starts_from_step_0(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = fit(
        stand_in_state(),
        epoch_batches,
        VAL,
        epochs=1,
        checkpoint_dir=tmp_path / "empty",
        resume=True,
        label="FP32",
    )
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"FP32: no checkpoint in {tmp_path / 'empty'}: starting from step 0"
    assert result.history["step"] == [6]


# ---------------------------------------------------------------------------
# SIGKILL mid-training, then resume: bit-identical to the uninterrupted run

SCRIPT = (
    """
import json, pathlib, sys, time
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[4])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
import numpy as np
from tft_jax.train import create_train_state, fit, make_optimizer
"""
    + STAND_IN
    + """
mode, directory, out = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
options = json.loads(sys.argv[5])
repeat = options.pop("repeat", 1)
tx = make_optimizer(3e-2, clip_norm=1.0, weight_decay=1e-3)
state = create_train_state(StandIn(), tx, jax.random.key(3), TRAIN[0])
delay = 0.04 if mode == "killed" else 0.0
result = fit(state, lambda epoch: epoch_batches(epoch, delay, repeat), VAL, seed=11,
             checkpoint_dir=directory, resume=mode == "resumed", quiet=mode != "resumed",
             **options)
trees = {"state": result.state, "best": result.best_state}
arrays = {f"{name}/{i}": np.asarray(leaf)
          for name, tree in trees.items() for i, leaf in enumerate(jax.tree.leaves(tree))}
np.savez(out / "arrays.npz", **arrays)
(out / "history.json").write_text(json.dumps(result.history))
"""
)


def _launch(
    mode: str,
    directory: pathlib.Path,
    out: pathlib.Path,
    script: pathlib.Path,
    options: dict[str, Any],
) -> subprocess.Popen:
    """Runs `script` in `mode` ('reference', 'killed' or 'resumed'): `fit(**options)`."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    cache = str(ROOT / ".jax_cache")
    return subprocess.Popen(
        [sys.executable, str(script), mode, str(directory), str(out), cache, json.dumps(options)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _finished(process: subprocess.Popen, timeout: float = 300) -> str:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output.decode()[-3000:]
    return output.decode()


def _steps(directory: pathlib.Path, kind: str = LATEST) -> list[int]:
    folder = directory / kind
    if not folder.is_dir():
        return []
    return sorted(int(path.name) for path in folder.iterdir() if path.name.isdigit())


def _kill_then_resume(
    tmp_path: pathlib.Path, options: dict[str, Any], kill_at: int
) -> tuple[dict[str, list[int]], str, dict[str, list]]:
    """Runs `fit(**options)` uninterrupted and, beside it, a victim SIGKILLed once a
    latest checkpoint of step >= `kill_at` exists, then resumed; checks the two end
    bit-identical. Returns the victim's latest and best steps at the kill, the
    resumed run's output and the history."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT))
    reference = _launch(
        "reference", tmp_path / "reference", tmp_path / "reference_out", script, options
    )
    victim = _launch("killed", tmp_path / "victim", tmp_path / "victim_out", script, options)
    deadline = time.monotonic() + 240
    while max(_steps(tmp_path / "victim"), default=0) < kill_at:
        assert victim.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint appeared in time"
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    killed_steps = {kind: _steps(tmp_path / "victim", kind) for kind in (LATEST, BEST)}
    assert not (tmp_path / "victim_out" / "arrays.npz").exists()

    resumed = _launch("resumed", tmp_path / "victim", tmp_path / "victim_out", script, options)
    _finished(reference)
    output = _finished(resumed)
    want = np.load(tmp_path / "reference_out" / "arrays.npz")
    got = np.load(tmp_path / "victim_out" / "arrays.npz")
    assert sorted(want.files) == sorted(got.files)
    for name in want.files:
        assert want[name].dtype == got[name].dtype
        assert want[name].tobytes() == got[name].tobytes(), name
    history = json.loads((tmp_path / "reference_out" / "history.json").read_text())
    assert json.loads((tmp_path / "victim_out" / "history.json").read_text()) == history
    return killed_steps, output, history


@pytest.mark.slow
def test_sigkill_then_resume_ends_bit_identical_to_an_uninterrupted_run(
    tmp_path: pathlib.Path,
) -> None:
    # 8 epochs of 6 steps, an evaluation after each: kill once a checkpoint past
    # the second epoch exists.
    options = {"epochs": 8, "patience": 100, "checkpoint_every": 2}
    killed_steps, output, history = _kill_then_resume(tmp_path, options, kill_at=14)
    assert max(killed_steps[LATEST]) < 48
    assert killed_steps[BEST]
    assert f"resuming from step {max(killed_steps[LATEST])} " in output
    assert history["step"][-1] == 48


@pytest.mark.slow
def test_sigkill_before_the_first_evaluation_resumes_from_a_timed_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    # One epoch of 48 steps, evaluated at its end only; the latest checkpoint is
    # saved every 0.25 s (about every 5 steps of the victim), never by steps.
    options = {"epochs": 1, "repeat": 8, "checkpoint_every_seconds": 0.25}
    killed_steps, output, history = _kill_then_resume(tmp_path, options, kill_at=10)
    assert 10 <= max(killed_steps[LATEST]) < 48
    assert killed_steps[BEST] == []  # killed before any evaluation
    resumed_from = max(killed_steps[LATEST])
    assert f"resuming from step {resumed_from} (epoch 0) of the checkpoint in " in output
    assert history["step"] == [48]


_DAMAGED_RESTORE = """
import gc, pathlib, sys, time
sys.path.insert(0, {root!r})
import jax
from tests.checkpoint_states import TEMPLATE, _truncate, randomized
from tft_jax.checkpoint import LATEST, TrainingCheckpointer

directory = pathlib.Path({directory!r})
with TrainingCheckpointer(directory) as checkpointer:
    checkpointer.save_latest(randomized(TEMPLATE, 2, step=5), jax.random.key(0), {{}})
    checkpointer.save_latest(randomized(TEMPLATE, 3, step=10), jax.random.key(0), {{}})
_truncate(directory / LATEST / "10")
with TrainingCheckpointer(directory) as checkpointer:
    print("restored step", checkpointer.restore_latest(TEMPLATE).step)
# The abandoned reads' tasks are reported when collected, after the restore returned.
time.sleep(0.5)
gc.collect()
"""


def test_restoring_past_a_damaged_step_prints_its_warning_and_no_asyncio_tracebacks(
    tmp_path: pathlib.Path,
) -> None:
    """What a user's process shows: the one warning, not orbax's abandoned reads.

    The other reads of a damaged step fail after orbax has closed its event
    loop: without the checkpointer's filters Python printed an `Event loop is
    closed` traceback for each of ~200 callbacks and asyncio logged each
    failed task, hundreds of lines for one damaged step.
    """
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    script = _DAMAGED_RESTORE.format(root=root, directory=str(tmp_path / "run"))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.split() == ["restored", "step", "5"]
    assert re.search(r"UserWarning: checkpoint latest step 10 in .* is corrupt", result.stderr)
    for noise in ("Event loop is closed", "Task exception was never retrieved", "Traceback"):
        assert noise not in result.stderr, result.stderr[-4000:]


def test_only_callbacks_on_a_closed_loop_are_dropped_from_the_unraisable_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from tft_jax import checkpoint

    seen: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: seen.append(report.exc_value))
    checkpoint._drop_late_loop_callbacks()
    checkpoint._drop_late_loop_callbacks()  # installed once: no second wrapper
    assert sys.unraisablehook.drops_late_loop_callbacks  # type: ignore[attr-defined]

    def report(error: BaseException) -> None:
        # The fields of `sys.UnraisableHookArgs` the hook reads (the type is not constructible).
        sys.unraisablehook(
            types.SimpleNamespace(
                exc_type=type(error),
                exc_value=error,
                exc_traceback=error.__traceback__,
                err_msg=None,
                object=None,
            )
        )

    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(print)
    except RuntimeError as error:  # what a late tensorstore callback meets
        closed = error
    report(closed)
    other = RuntimeError("Event loop is closed")  # the same text, raised elsewhere
    report(other)
    report(ValueError("a real problem"))
    assert [type(error) for error in seen] == [RuntimeError, ValueError]
    assert seen[0] is other


@pytest.mark.parametrize("future", ["task", "gather"])
def test_asyncio_reports_of_abandoned_reads_are_dropped_only_inside_a_step_that_failed(
    future: str, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Real unretrieved-exception reports, collected after the read: only the failed step's go."""
    import asyncio
    import gc

    from tft_jax import checkpoint

    failed, read, sibling = (tmp_path / "latest" / name for name in ("10", "5", "100"))

    async def read_array(step: pathlib.Path) -> None:
        raise ValueError(f'Error reading "scale/.zarray" at local file "{step}/state/"')

    async def start(step: pathlib.Path) -> asyncio.Future:
        if future == "task":
            return asyncio.ensure_future(read_array(step))
        return asyncio.gather(read_array(step))  # a _GatheringFuture

    def abandon(step: pathlib.Path) -> None:
        """A read that fails and is never awaited, collected later (as orbax's are)."""
        loop = asyncio.new_event_loop()
        pending = loop.run_until_complete(start(step))
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.close()
        del pending
        gc.collect()

    with (
        pytest.raises(ValueError, match="the read orbax raises"),
        checkpoint._abandoned_reads_unlogged(failed),
    ):
        raise ValueError("the read orbax raises")
    with checkpoint._abandoned_reads_unlogged(read):  # read in full: off the list again
        pass
    # A damaged step moved aside and saved again: its new read succeeds, while
    # the failed read's tasks may still be collected.
    with checkpoint._abandoned_reads_unlogged(failed):
        pass
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for step in (failed, read, sibling):
            abandon(step)
    reported = [record.exc_info[1] for record in caplog.records if record.name == "asyncio"]
    assert [str(error).split('"')[3] for error in reported] == [
        f"{read}/state/",
        f"{sibling}/state/",
    ]
    assert all("exception was never retrieved" in record.msg for record in caplog.records)
