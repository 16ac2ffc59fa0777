"""Atomic, verified checkpoints of a training run (orbax-checkpoint).

A run directory holds two orbax `CheckpointManager`s: `latest/` (the most
recent steps, for `resume`) and `best/` (the step with the lowest validation
loss). Each checkpoint is a composite of

- `state`: the train state pytree and the raw data of the run's PRNG key;
- `meta`: JSON with the loop position and history, the layout of `state`
  (path, shape, dtype of every leaf) and a SHA-256 digest of its bytes.

Why a checkpoint is never restored half-written: orbax writes each step into a
temporary directory and renames it when complete, and a leftover temporary
directory is not a step. What a rename cannot guard against (a step directory
truncated or altered afterwards, a directory without its files) is caught by
the digest: `restore_*` tries steps newest first, moves any step whose files
are damaged or whose bytes do not match its digest into `corrupt/` (with a
warning), and returns the newest intact one. A best step found corrupt is
replaced by the latest step of the same number when one is intact (`fit` saves
both from the same state), and saved as best again.

A checkpointer opened for reading only (`create=False`: `load_state`, the
CLI's and the forecaster's look at a run's folder) writes and deletes
nothing, as a `fit` may be writing the same folder: it leaves the writer's
temporary step directories alone, skips a damaged step with a warning that
says it was left in place (the next writer moves it aside), and skips a step
that vanishes while it is read (the writer's removal of old steps) for the
next one found.

A read that fails for a reason that says nothing about the files (permission
denied, out of host or device memory, too many open files, an unavailable or
timed-out file system, an I/O error) raises `CheckpointReadError`, an
`OSError` naming the step's directory, and moves nothing: the step may be
intact, and moving it away would resume from an older one, or from step 0. A
checkpoint whose layout differs from the template (another model or
optimizer) raises `ValueError`: that is a user error, not corruption.

A damaged step is reported by its one warning: orbax abandons the step's
other reads when the first fails, and their failures arrive on a closed
event loop, or when their tasks are garbage-collected, long after the
restore returned. So the first restore installs, for the rest of the
process, an `asyncio` log filter that drops only the "... exception was
never retrieved" records of reads inside a step that failed to read, and a
`sys.unraisablehook` wrapper that drops only the `RuntimeError: Event loop
is closed` reports raised by asyncio's `_check_closed` and the errors that
abandoned reads inside such a step raise when they are closed (every other
record and report goes where it went before).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import numbers
import os
import pathlib
import re
import shutil
import sys
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from tft_jax.caller_frame import user_stacklevel
from tft_jax.distributed import barrier, is_primary, to_host
from tft_jax.folder_lock import folder_locked
from tft_jax.paths import expanded

PyTree = Any
Array = Any
_T = TypeVar("_T")

LATEST = "latest"
BEST = "best"
CORRUPT = "corrupt"


class Restored(NamedTuple):
    """A checkpoint read back.

    Attributes:
      step: the step it was saved at.
      state: the train state, with the template's structure and static fields.
      rng: the run's PRNG key (a typed key array).
      loop: the JSON dict saved with it (loop position, history, ...).
    """

    step: int
    state: PyTree
    rng: Array
    loop: dict[str, Any]


class CorruptCheckpointError(RuntimeError):
    """A checkpoint step that cannot be read back intact."""


class _StepVanished(Exception):
    """A step whose read failed because its directory is gone (removed after it was listed)."""

    def __init__(self, kind: str, step: int) -> None:
        super().__init__(f"{kind} checkpoint step {step} vanished while it was read")


class _CheckpointIOError(OSError):
    """A checkpoint read or write that failed: `'PATH: detail'`, the cause's `errno`."""

    def __init__(self, path: pathlib.Path, detail: str, cause: BaseException) -> None:
        super().__init__(getattr(cause, "errno", None), detail, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class CheckpointReadError(_CheckpointIOError):
    """A checkpoint step that could not be read for a reason other than damage; left in place.

    `filename` is the step's directory; `__cause__` the error the read raised.
    """


class CheckpointWriteError(_CheckpointIOError):
    """A checkpoint step that could not be written (a full disk, a read-only folder).

    Raised for the `OSError`s of the write and for tensorstore's status errors,
    which orbax raises as `ValueError`s (`RESOURCE_EXHAUSTED: Error writing
    local file ...`), so that both read as one `OSError`. `filename` is the
    checkpoint directory; `errno` is the cause's, or `ENOSPC` when a status
    error says "No space left on device"; `__cause__` the error the write
    raised. Orbax removes the unfinished step's temporary folder the next
    time the directory is opened.
    """

    def __init__(self, path: pathlib.Path, detail: str, cause: BaseException) -> None:
        super().__init__(path, detail, cause)
        if self.errno is None and os.strerror(errno.ENOSPC) in str(cause):
            self.errno = errno.ENOSPC


# Why a read failed, when the reason lies outside the checkpoint's files: Python's
# exceptions, the errno values (also as the text tensorstore quotes them) and the
# status codes that absl, tensorstore and XLA put in their messages.
_READ_FAILURE_TYPES = (
    PermissionError,
    MemoryError,
    TimeoutError,
    ConnectionError,
    InterruptedError,
    BlockingIOError,
)
_READ_FAILURE_ERRNOS = tuple(
    getattr(errno, name)
    for name in (
        "EACCES",
        "EPERM",
        "ENOMEM",
        "EIO",
        "EMFILE",
        "ENFILE",
        "ETIMEDOUT",
        "EAGAIN",
        "EINTR",
        "ESTALE",
        "EHOSTDOWN",
        "ENOLCK",
    )
    if hasattr(errno, name)
)
_READ_FAILURE_TEXT = re.compile(
    "|".join(
        [
            r"\b(?:PERMISSION_DENIED|RESOURCE_EXHAUSTED|UNAVAILABLE|DEADLINE_EXCEEDED"
            r"|UNAUTHENTICATED|CANCELLED|ABORTED):",
            r"\b[Oo]ut of memory\b",
            *(re.escape(os.strerror(number)) for number in _READ_FAILURE_ERRNOS),
        ]
    )
)


def _is_io_failure(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, says the I/O itself failed.

    A read or a write refused for a reason outside the checkpoint's bytes
    (permissions, memory, a full disk, ...), not damaged data.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _READ_FAILURE_TYPES):
            return True
        if isinstance(current, OSError) and current.errno in _READ_FAILURE_ERRNOS:
            return True
        if _READ_FAILURE_TEXT.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def _summary(error: BaseException) -> str:
    """`error` in one line, without the tensorstore spec that its messages append."""
    text = f"{type(error).__name__}: {error}".split(" [tensorstore_spec=")[0]
    return " ".join(text.split())[:500]


def layout(tree: PyTree) -> list[list[Any]]:
    """`[path, shape, dtype]` of every leaf of `tree`, in flattening order."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [
        [jax.tree_util.keystr(path), list(np.shape(leaf)), _dtype_name(leaf)]
        for path, leaf in leaves
    ]


def _dtype_name(leaf: Any) -> str:
    dtype = getattr(leaf, "dtype", None)
    return str(np.dtype(dtype) if dtype is not None else np.result_type(leaf))


def digest(tree: PyTree) -> str:
    """SHA-256 over the layout and the raw bytes of every leaf of `tree`.

    Leaves are read with `tft_jax.distributed.to_host`: in a multi-process run
    every process computes the digest of the whole global value (a leaf split
    across processes is gathered, so every process must call this).
    """
    hasher = hashlib.sha256()
    hasher.update(repr(layout(tree)).encode())
    for leaf in jax.tree.leaves(to_host(tree)):
        hasher.update(np.ascontiguousarray(leaf).tobytes())
    return hasher.hexdigest()


def _check_rng(rng: Array, caller: str) -> None:
    """Raises `ValueError` unless `rng` is one key that `restore` can give back.

    `restore` wraps the saved key data as a single key of JAX's default PRNG
    implementation: a batch of keys, or a key of another implementation, would
    be written and then never restored ('does not fit the template').
    """
    default = jax.random.key(0)
    try:
        data = jax.random.key_data(rng)
    except TypeError:  # what is no key at all
        raise ValueError(
            f"{caller}: rng must be one PRNG key (jax.random.key(seed)), got "
            f"{type(rng).__name__} {rng!r}"
        ) from None
    typed = jax.dtypes.issubdtype(getattr(rng, "dtype", None), jax.dtypes.prng_key)
    if np.shape(data) != np.shape(jax.random.key_data(default)) or (
        typed and jax.random.key_impl(rng) != jax.random.key_impl(default)
    ):
        impl = jax.random.key_impl(rng) if typed else f"raw {np.asarray(data).dtype}"
        raise ValueError(
            f"{caller}: rng must be one PRNG key of the default implementation "
            f"({jax.random.key_impl(default)}, key data of shape "
            f"{np.shape(jax.random.key_data(default))}), as restore returns it; got key data "
            f"of shape {np.shape(data)} ({impl})"
        )


def _check_quantiles(saved: Any, template: PyTree, step: int, directory: Any) -> None:
    """Raises `ValueError` when a step was trained for other quantile levels than `template`'s.

    The levels shape no array (a model of 0.1/0.5/0.8 has the parameters of
    one of 0.1/0.5/0.9), so the layout check cannot see them; checkpoints
    written before the levels were recorded are not checked.
    """
    expected = getattr(template, "quantiles", None)
    if saved is None or expected is None:
        return
    if [float(level) for level in expected] != [float(level) for level in saved]:
        raise ValueError(
            f"checkpoint step {step} in {directory} was trained for quantile levels "
            f"{tuple(saved)}, the template's model predicts {tuple(expected)}: resume or load "
            "it with the model it was trained as"
        )


# The model settings a checkpoint records (the model's `config`, a QAT model's
# `qat_config`) and the fields it compares on restore: those that change what the
# model computes without changing any array's shape or dtype. Quantile levels have
# their own check; the dropout rate and the compute dtype are the template's to choose.
_MODEL_SETTINGS = {
    "config": ("sequence_length", "prediction_horizon", "attend_to_self", "use_known_history"),
    "qat_config": ("bits",),
}


def _model_settings(state: PyTree) -> dict[str, dict[str, Any]]:
    """`{attribute: {field: value}}`: the settings of `state`'s model named by `_MODEL_SETTINGS`.

    Read from `state.apply_fn.model` (a `ModelApply`); a model without such
    attributes records nothing.
    """
    model = getattr(getattr(state, "apply_fn", None), "model", None)
    settings = {}
    for attribute, fields in _MODEL_SETTINGS.items():
        config = getattr(model, attribute, None)
        values = {field: getattr(config, field) for field in fields if hasattr(config, field)}
        if values:
            settings[attribute] = json.loads(json.dumps(values))
    return settings


def _check_model_settings(saved: Any, template: PyTree, step: int, directory: Any) -> None:
    """Raises `ValueError` when a step was trained as a model of other settings than `template`'s.

    History length, horizon, self-attention, the known history and the bit
    width shape no array (a model of 12 steps has the parameters of one of
    10), so the layout check cannot see them, and the restored parameters
    would run as another model without a word. Checkpoints written before the
    settings were recorded are not checked.
    """
    if not isinstance(saved, Mapping):
        return
    expected = _model_settings(template)
    differ = [
        f"{field}={then!r} (the template's: {expected[attribute][field]!r})"
        for attribute, fields in saved.items()
        if isinstance(fields, Mapping) and attribute in expected
        for field, then in fields.items()
        if field in expected[attribute] and expected[attribute][field] != then
    ]
    if differ:
        raise ValueError(
            f"checkpoint step {step} in {directory} was trained as a model of other settings: "
            f"{', '.join(differ)}; resume or load it with the model it was trained as"
        )


def _payload(state: PyTree, rng: Array) -> dict[str, PyTree]:
    # The key's data as NumPy: the same in every process, so saved once (by process 0).
    return {"train_state": state, "rng": np.asarray(jax.random.key_data(rng))}


def _abstract(tree: PyTree) -> PyTree:
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def _loop_json(loop: Any) -> dict[str, Any]:
    """`loop` as a JSON-serializable dict, checked before anything is written.

    orbax serializes the metadata in a background thread after the arrays:
    a value `json` cannot write (a NumPy scalar, say) failed there, deep in
    orbax, and left a temporary step directory that made every later save of
    the checkpointer fail with `OSError`.
    """
    if hasattr(loop, "to_json"):
        loop = loop.to_json()
    if not isinstance(loop, Mapping):
        raise TypeError(f"loop must be a mapping or have .to_json(), got {type(loop).__name__}")
    try:
        json.dumps(dict(loop))
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"loop must hold only JSON values (dict, list, str, int, float, bool, None): {error}"
        ) from error
    return dict(loop)


def _max_to_keep(value: object) -> int:
    """`TrainingCheckpointer`'s `max_to_keep` as an int >= 2 (a NumPy integer too), or `ValueError`.

    Typed `object`, as it checks what callers really pass: run on the `int`
    parameter, the check read to mypy as always failing (typeshed's `int` is
    no `numbers.Integral`), so it skipped the rest of `__init__` and could
    not type the checkpointer's attributes.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 2:
        raise ValueError(f"TrainingCheckpointer: max_to_keep must be an int >= 2, got {value!r}")
    return int(value)


class TrainingCheckpointer:
    """The latest and best checkpoints of one training run under `directory`.

    Saves are synchronous (the train step donates its buffers, and a finished
    `save_*` call means the step is on disk). `max_to_keep` latest steps are
    kept (at least 2, so a corrupt newest step leaves an intact one); one best.
    """

    def __init__(
        self, directory: str | pathlib.Path, max_to_keep: int = 2, *, create: bool = True
    ) -> None:
        """Opens the checkpoints under `directory`.

        Args:
          directory: the run's checkpoint directory (`~` is expanded); it, or
            its nearest existing ancestor, must be a directory, and so must
            its `latest`, `best` and `corrupt` entries where present
            (`ValueError` for a file).
          max_to_keep: latest steps kept (an int >= 2).
          create: create `directory/latest` and `directory/best` now, remove
            temporary step directories left by an interrupted save, and move
            damaged steps aside; False for reading only (`load_state`), which
            writes and deletes nothing (a `fit` may be writing the folder):
            saving through it raises `ValueError`. A checkpointer that writes
            holds `directory`'s lock (`tft_jax.folder_lock`, process 0 of a
            multi-host run) until `close`: opened while another process
            writes there, it raises `FolderLockedError` naming that process,
            before removing anything (the temporary step directories there
            are that writer's steps in progress).
        """
        kept = _max_to_keep(max_to_keep)
        self.directory = _expanded(directory, "TrainingCheckpointer").resolve()
        _check_directory(self.directory)
        self._create = bool(create)
        self._lock = contextlib.ExitStack()
        if self._create:
            label = "TrainingCheckpointer: "
            self._lock.enter_context(folder_locked(self.directory, label, enabled=is_primary()))
        # Released at `close`, or when a checkpointer left open is collected.
        self._unlock = weakref.finalize(self, self._lock.close)
        try:
            self._managers = {
                LATEST: self._manager(LATEST, kept),
                BEST: self._manager(BEST, 1),
            }
        except BaseException:
            self._unlock()
            raise

    def _manager(self, kind: str, max_to_keep: int) -> ocp.CheckpointManager:
        """The orbax manager of `directory/kind`; one opened for reading only deletes nothing.

        Removing temporary step directories is the writer's: in a reader it
        would delete the step a running `fit` is writing, and fail its save.
        """
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=False,
            cleanup_tmp_directories=self._create,
            create=self._create,
        )
        return _listed(lambda: ocp.CheckpointManager(self.directory / kind, options=options))

    def _check_writable(self, caller: str) -> None:
        """Raises `ValueError` when this checkpointer was opened for reading only."""
        if not self._create:
            raise ValueError(
                f"{caller}: the checkpointer of {self.directory} was opened for reading only "
                "(create=False), which writes and deletes nothing; open it with create=True "
                "to write"
            )

    # Saving -----------------------------------------------------------------

    def save_latest(self, state: PyTree, rng: Array, loop: Any) -> bool:
        """Saves `state` (with `.step`), the PRNG key and the loop dict as the latest step.

        Returns False, writing nothing, when that step is saved already (a
        replay after resume; the state may differ from the saved one there: a
        resumed `fit` given another learning-rate schedule saves the restored
        step with it, and the next step saved holds the new schedule). Raises
        `ValueError` for a step older than the newest saved one or an `rng`
        that is not one key of the default PRNG implementation (`restore`
        could not give it back), `TypeError` for a `loop` that JSON cannot
        hold, and `CheckpointWriteError` (an `OSError`) when the write fails
        (a full disk).
        """
        return self._save(LATEST, state, rng, loop)

    def save_best(self, state: PyTree, rng: Array, loop: Any) -> bool:
        """Saves `state` as the best step, replacing the previous best (see `save_latest`)."""
        return self._save(BEST, state, rng, loop)

    def _save(self, kind: str, state: PyTree, rng: Array, loop: Any) -> bool:
        self._check_writable(f"save_{kind}")
        manager = self._managers[kind]
        if not hasattr(state, "step"):
            raise TypeError(
                f"save_{kind}: state must have a step (a tft_jax.train.TrainState), got "
                f"{type(state).__name__}"
            )
        step = int(state.step)
        loop_json = _loop_json(loop)
        _check_rng(rng, f"save_{kind}")
        saved = manager.all_steps()
        if step in saved:
            # A replay after resume: keep the existing step (see `save_latest`).
            return False
        if saved and step < max(saved):
            # orbax would skip it without a word (it saves only steps past its newest),
            # and a later resume or `load_state` would read the newer step of another run.
            raise ValueError(
                f"save_{kind}: step {step} is older than the newest {kind} checkpoint, "
                f"step {max(saved)}, in {manager.directory}: that directory holds a later "
                "point of a run (another run, or this one before a restart without resume); "
                "resume from it, or save into another directory"
            )
        payload = _payload(state, rng)
        meta = {
            "step": step,
            "loop": loop_json,
            "layout": layout(payload),
            "digest": digest(payload),
        }
        quantiles = getattr(state, "quantiles", None)
        if quantiles is not None:  # the loss's levels: not in the arrays' layout
            meta["quantiles"] = [float(level) for level in quantiles]
        settings = _model_settings(state)
        if settings:  # nor are these
            meta["model"] = settings
        try:
            return manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(payload), meta=ocp.args.JsonSave(meta)
                ),
            )
        except (OSError, ValueError) as error:
            failed = _is_io_failure(error) or "Error writing" in str(error)
            if not isinstance(error, OSError) and not failed:
                raise  # not a failed write: a bug, said as it is
            raise CheckpointWriteError(
                pathlib.Path(manager.directory),
                f"saving the {kind} checkpoint of step {step} failed: {_summary(error)}",
                error,
            ) from error

    # Restoring --------------------------------------------------------------

    def restore_latest(self, template: PyTree) -> Restored | None:
        """The newest intact latest step restored into `template`'s structure, or None."""
        return self.restore(LATEST, template)

    def restore_best(self, template: PyTree) -> Restored | None:
        """The intact best step restored into `template`'s structure, or None."""
        return self.restore(BEST, template)

    def steps(self, kind: str = LATEST) -> list[int]:
        """The saved steps of `kind` (`'latest'` or `'best'`), ascending."""
        return sorted(self._kind(kind).all_steps())

    def _kind(self, kind: str) -> ocp.CheckpointManager:
        """The manager of `kind`, or `ValueError` naming the argument."""
        if kind not in self._managers:
            raise ValueError(f"kind must be 'latest' or 'best', got {kind!r}")
        return self._managers[kind]

    def discard_best_after(self, step: int) -> None:
        """Deletes best steps newer than `step` (written after the checkpoint resumed from)."""
        self._check_writable("discard_best_after")
        manager = self._managers[BEST]
        for saved in manager.all_steps():
            if saved > step:
                manager.delete(saved)

    def restore(self, kind: str, template: PyTree) -> Restored | None:
        """The newest intact step of `kind` (`'latest'` or `'best'`), or None.

        Corrupt steps are moved to `corrupt/` with a warning (opened for
        reading only, they are left in place, with a warning). A corrupt best
        step is replaced by the intact latest step of the same number, which
        is saved as best again (announced; not saved when reading only); when
        there is none, a warning says that the best state is lost. A step that
        vanishes while it is read (a running `fit` removed it: an old latest
        step, or a best step it replaced) is skipped: the steps are listed
        again and the newest one not yet tried is read.

        Raises:
          CheckpointReadError: a step could not be read for a reason other
            than damage (see the module docstring); nothing was moved.
          ValueError: a step does not fit `template`.
        """
        manager = self._kind(kind)
        template_payload = _payload(template, jax.random.key(0))
        lost: list[int] = []
        tried: set[int] = set()
        while untried := sorted(set(manager.all_steps()) - tried, reverse=True):
            step = untried[0]
            tried.add(step)
            try:
                restored = self._read_step(kind, step, template, template_payload)
            except _StepVanished:
                _listed(manager.reload)
                continue
            if restored is not None:
                return restored
            if kind == BEST:
                stand_in = self._best_from_latest(step, template, template_payload)
                if stand_in is not None:
                    return stand_in
                lost.append(step)
        if lost and is_primary():
            warnings.warn(
                f"no intact best checkpoint remains in {self.directory / BEST} (best step "
                f"{lost[0]} was corrupt and the latest checkpoints hold no intact copy of it): "
                "the best state is lost; a resumed fit takes the state it resumes from as "
                "its best until a validation loss beats the lost best's, and load_state "
                "falls back to the latest step",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        return None

    def _best_from_latest(
        self, step: int, template: PyTree, template_payload: PyTree
    ) -> Restored | None:
        """The intact latest step `step`, saved as best again, or None (a corrupt best's stand-in).

        `fit` saves the best and the latest checkpoint of one step from the
        same state, so the latest step of the corrupt best's number holds it.
        Opened for reading only, it is returned without being saved.
        """
        if step not in self._managers[LATEST].all_steps():
            return None
        try:
            restored = self._read_step(LATEST, step, template, template_payload)
        except _StepVanished:
            return None
        if restored is None:
            return None
        if self._create:
            self._save(BEST, restored.state, restored.rng, restored.loop)
            saved = f", and saved in {self.directory / BEST} again"
        else:
            saved = " (not saved as best: the folder is opened for reading only)"
        if is_primary():
            warnings.warn(
                f"best checkpoint step {step} restored from the latest checkpoint of the "
                f"same step{saved}",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        return restored

    def _read_step(
        self, kind: str, step: int, template: PyTree, template_payload: PyTree
    ) -> Restored | None:
        """Step `step` of `kind` restored, or None when it is damaged (set aside, announced).

        Raises `_StepVanished` when the read failed because the step's
        directory is gone (removed by a running `fit` after it was listed),
        and `CheckpointReadError` (see `_restore_step`).
        """
        try:
            return self._restore_step(kind, step, template, template_payload)
        except (CorruptCheckpointError, CheckpointReadError) as error:
            if _gone(pathlib.Path(self._managers[kind].directory) / str(step)):
                raise _StepVanished(kind, step) from error
            if isinstance(error, CheckpointReadError):
                raise
            self._set_aside(kind, step, error)
        return None

    def _restore_step(
        self,
        kind: str,
        step: int,
        template: PyTree,
        template_payload: PyTree,
    ) -> Restored:
        """Step `step` of `kind` restored and checked against its digest.

        Raises `CorruptCheckpointError` when its files are damaged and
        `CheckpointReadError` when the read failed for another reason.
        """
        manager = self._managers[kind]
        try:
            meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
                "meta"
            ]
            saved_layout, saved_digest, loop = meta["layout"], meta["digest"], meta["loop"]
        except Exception as error:  # orbax, tensorstore and json raise many types
            raise self._read_error(kind, step, "metadata", error) from error
        expected_layout = layout(template_payload)
        if saved_layout != expected_layout:
            raise ValueError(
                f"checkpoint step {step} in {manager.directory} does not fit the template: "
                f"{_layout_difference(saved_layout, expected_layout)}"
                f"{_optimizer_layout_note(saved_layout, expected_layout, manager.directory, step)}"
            )
        _check_quantiles(meta.get("quantiles"), template, step, manager.directory)
        _check_model_settings(meta.get("model"), template, step, manager.directory)
        _drop_late_loop_callbacks()
        try:
            with _abandoned_reads_unlogged(pathlib.Path(manager.directory) / str(step)):
                restored = manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(_abstract(template_payload))
                    ),
                )["state"]
        except Exception as error:  # orbax, tensorstore and json raise many types
            raise self._read_error(kind, step, "arrays", error) from error
        if digest(restored) != saved_digest:
            raise CorruptCheckpointError("the bytes do not match the saved digest")
        state = jax.tree.unflatten(
            jax.tree.structure(template), jax.tree.leaves(restored["train_state"])
        )
        rng = jax.random.wrap_key_data(jnp.asarray(restored["rng"]))
        return Restored(step=step, state=state, rng=rng, loop=loop)

    def _read_error(
        self, kind: str, step: int, part: str, error: Exception
    ) -> CorruptCheckpointError | CheckpointReadError:
        """What a failed read of `part` of a step means: damage, or a failure to read."""
        path = pathlib.Path(self._managers[kind].directory) / str(step)
        if _is_io_failure(error):
            return CheckpointReadError(
                path,
                f"could not read the {part} of {kind} checkpoint step {step} "
                f"({_summary(error)}); the step was left in place, as this says nothing "
                "about its files: fix the cause and retry (if the step is damaged, move it "
                "out of the folder and the previous step is restored)",
                error,
            )
        return CorruptCheckpointError(f"unreadable {part}: {_summary(error)}")

    def _set_aside(self, kind: str, step: int, error: Exception) -> None:
        """Moves damaged step `step` of `kind` into `corrupt/`, announced (a warning).

        Opened for reading only, the step is left in place (a reader writes
        and deletes nothing; the next writer to restore it moves it aside),
        and the warning says so. Either way the restore goes on with the next
        older step (a best step: with the latest step of its number).
        """
        where = f"checkpoint {kind} step {step} in {self.directory} is corrupt ({error})"
        if not self._create:
            if is_primary():
                warnings.warn(
                    f"{where}; left in place, as the folder is opened for reading only "
                    "(a fit that resumes from it moves it aside)",
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
            return
        target = self._quarantine(kind, step)
        if target is not None:
            # A repair of the user's run: announced (a warning, shown even when quiet).
            warnings.warn(f"{where}; moved to {target}", UserWarning, stacklevel=user_stacklevel())

    def _quarantine(self, kind: str, step: int) -> pathlib.Path | None:
        """Moves step `step` of `kind` into `corrupt/`; where to (None outside process 0)."""
        manager = self._managers[kind]
        target = None
        # Every process finds the same step corrupt (same bytes); process 0 moves it.
        if is_primary():
            source = pathlib.Path(manager.directory) / str(step)
            target_root = self.directory / CORRUPT
            _check_entry(target_root)  # a file there: say so, not a bare FileExistsError
            target_root.mkdir(parents=True, exist_ok=True)
            target = target_root / f"{kind}-{step}"
            suffix = 0
            while target.exists():
                suffix += 1
                target = target_root / f"{kind}-{step}-{suffix}"
            shutil.move(str(source), str(target))
        barrier(f"tft-jax quarantine {kind} {step}")
        _listed(manager.reload)
        return target

    def close(self) -> None:
        """Waits for pending writes and releases the managers, then the folder's lock."""
        try:
            for manager in self._managers.values():
                manager.close()
        finally:
            self._unlock()

    def __enter__(self) -> TrainingCheckpointer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _is_late_loop_callback(unraisable: Any) -> bool:
    """Whether a `sys.unraisablehook` report is a callback scheduled on a closed asyncio loop.

    When one array of a damaged checkpoint fails to read, orbax ends the
    restore and closes its event loop while tensorstore's other reads are
    still in flight; each of those then schedules its completion on the
    closed loop from a tensorstore thread, and Python prints a `RuntimeError:
    Event loop is closed` traceback for each, hundreds for one damaged step.
    """
    error = getattr(unraisable, "exc_value", None)
    if not isinstance(error, RuntimeError) or str(error) != "Event loop is closed":
        return False
    frames = traceback.extract_tb(getattr(unraisable, "exc_traceback", None))
    return (
        bool(frames)
        and frames[-1].name == "_check_closed"
        and pathlib.Path(frames[-1].filename).parts[-2:] == ("asyncio", "base_events.py")
    )


def _is_abandoned_read(unraisable: Any) -> bool:
    """Whether a `sys.unraisablehook` report is the error of a read inside a step that failed.

    When a step vanishes while it is read (a running `fit` removed it), orbax
    ends the restore at the first array that fails and abandons the others;
    each abandoned read is closed when it is garbage-collected, turns the
    close into its own error (`Encountered error while reading array index`,
    naming the step's files) and Python prints it with its tensorstore spec,
    a hundred lines for each array.
    """
    error = getattr(unraisable, "exc_value", None)
    if error is None:
        return False
    text = str(error)
    return any(f"{directory}/" in text for directory in tuple(_FAILED_READS))


def _drop_late_loop_callbacks() -> None:
    """Makes `sys.unraisablehook` drop late-callback and abandoned-read reports (installed once).

    Drops `_is_late_loop_callback` and `_is_abandoned_read` reports; every
    other report goes to the hook that was in place. Called before a
    checkpoint's arrays are read, so that restoring past a damaged step
    prints its one warning, and past a step that vanished nothing, instead
    of a wall of tracebacks about reads that orbax has already given up.
    """
    previous = sys.unraisablehook
    if getattr(previous, "drops_late_loop_callbacks", False):
        return

    def hook(unraisable: Any) -> None:
        if not (_is_late_loop_callback(unraisable) or _is_abandoned_read(unraisable)):
            previous(unraisable)

    hook.drops_late_loop_callbacks = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


# Step directories whose array reads failed (or are under way): asyncio's
# reports of their abandoned reads are dropped (`_AbandonedReadErrors`).
_FAILED_READS: set[str] = set()


class _AbandonedReadErrors(logging.Filter):
    """Drops asyncio's "... exception was never retrieved" records of reads in `_FAILED_READS`.

    A record is dropped only when its task's (or gathering future's)
    exception names a file inside one of those step directories; every
    other record passes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        # asyncio names the future's class: "Task", "Future", "_GatheringFuture".
        first_line = str(record.msg).split("\n", 1)[0]
        if not first_line.endswith(" exception was never retrieved"):
            return True
        error = record.exc_info[1] if record.exc_info else None
        text = f"{record.msg} {error}"
        return not any(f"{directory}/" in text for directory in _FAILED_READS)


@contextlib.contextmanager
def _abandoned_reads_unlogged(step_directory: pathlib.Path) -> Iterator[None]:
    """Around a read of `step_directory`'s arrays: if it fails, its abandoned reads stay unlogged.

    When one array of a damaged step fails to read, orbax raises that error
    and abandons the step's other reads; each fails too, and asyncio logs it
    with its traceback when its task is garbage-collected, during the read
    or at any later time (hundreds of records for one damaged step). The
    caller reports the step once (a warning naming it). The filter is
    installed on the `asyncio` logger once per process; a step whose read
    succeeds is taken off its list again, unless an earlier read of the same
    directory failed (a damaged step moved aside and saved again).
    """
    logger = logging.getLogger("asyncio")
    if not any(isinstance(kept, _AbandonedReadErrors) for kept in logger.filters):
        logger.addFilter(_AbandonedReadErrors())
    directory = str(step_directory)
    failed_before = directory in _FAILED_READS
    _FAILED_READS.add(directory)
    yield
    if not failed_before:  # an earlier failed read's tasks may still be collected later
        _FAILED_READS.discard(directory)


def _expanded(directory: Any, caller: str) -> pathlib.Path:
    """`directory` as a path with `~` expanded: the one place the public entries expand it.

    `fit(checkpoint_dir="~/ck")` writes under the home folder, so every
    entry (`TrainingCheckpointer`, `load_state`) must read `"~/ck"` there
    too. Raises `TypeError` for what is no path.
    """
    if not isinstance(directory, str | os.PathLike):
        raise TypeError(
            f"{caller}: directory must be a path (str or os.PathLike), got "
            f"{type(directory).__name__} {directory!r}"
        )
    return expanded(directory)


def _gone(path: pathlib.Path) -> bool:
    """Whether `path` no longer exists (False when that cannot be told).

    `os.path.lexists` says False for a path it cannot stat (permission denied,
    an I/O error): a step unreadable for those reasons was skipped as removed,
    silently, instead of raising `CheckpointReadError`.
    """
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


_LISTING_TRIES = 5


def _listed(list_steps: Callable[[], _T]) -> _T:
    """`list_steps()` (an orbax manager's listing of its steps), retried while steps vanish.

    Orbax finds the step directories, then reads each one's metadata (and
    the directory's time when it has none): a step removed in between (a
    running `fit` removing its old steps, while another process reads the
    folder) fails the listing with `FileNotFoundError`; listed again, the
    step is not found any more. Raised after `_LISTING_TRIES` tries.
    """
    for _ in range(_LISTING_TRIES - 1):
        try:
            return list_steps()
        except FileNotFoundError:
            continue
    return list_steps()


# What a checkpoint directory's own entries hold: each must be a directory.
_ENTRIES = {
    LATEST: "the latest steps",
    BEST: "the best step",
    CORRUPT: "the damaged steps moved aside",
}


def _check_entry(path: pathlib.Path) -> None:
    """Raises `ValueError` when `path`, an entry of `_ENTRIES`, exists but is no directory."""
    if os.path.lexists(path) and not path.is_dir():
        actual = "a broken symbolic link" if path.is_symlink() else "a file"
        raise ValueError(
            f"TrainingCheckpointer: {path} is {actual}, expected a directory holding "
            f"{_ENTRIES[path.name]}: move it out of the way, or use another checkpoint "
            "directory"
        )


def _check_directory(directory: pathlib.Path) -> None:
    """Raises `ValueError` when `directory`, its nearest existing ancestor, or an entry is a file.

    Checked up front: orbax would fail deep inside with `NotADirectoryError`
    on `directory/latest` (from a background thread, and then find no
    checkpoint), a path the caller never gave, and moving a damaged step
    aside with `FileExistsError` on `directory/corrupt`.
    """
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        where = "is" if existing == directory else f"lies under {existing}, which is"
        raise ValueError(
            f"TrainingCheckpointer: directory {directory} {where} a file, expected a directory"
        )
    for name in _ENTRIES:
        _check_entry(directory / name)


def _layout_difference(saved: list[list[Any]], expected: list[list[Any]]) -> str:
    saved_map = {entry[0]: entry[1:] for entry in saved}
    expected_map = {entry[0]: entry[1:] for entry in expected}
    missing = sorted(set(expected_map) - set(saved_map))
    extra = sorted(set(saved_map) - set(expected_map))
    changed = [
        f"{path}: saved {saved_map[path]}, expected {expected_map[path]}"
        for path in sorted(set(saved_map) & set(expected_map))
        if saved_map[path] != expected_map[path]
    ]
    parts = []
    if missing:
        parts.append(f"missing leaves {missing[:5]}")
    if extra:
        parts.append(f"unexpected leaves {extra[:5]}")
    if changed:
        parts.append("; ".join(changed[:5]))
    return "; ".join(parts) or "leaf order differs"


_OPT_STATE = "['train_state'].opt_state"


def _optimizer_layout_note(
    saved: list[list[Any]], expected: list[list[Any]], directory: Any, step: int
) -> str:
    """A sentence for a checkpoint whose optimizer state alone has another layout, else ''.

    Checkpoints written before `make_optimizer` kept Adam's moments as two
    flat vectors (`tft_jax.flat_optimizer.FlatAdamWState`) hold optax's
    per-leaf `ScaleByAdamState` instead; their optimizer state cannot be
    restored into today's train state.
    """
    saved_map = {entry[0]: entry[1:] for entry in saved}
    expected_map = {entry[0]: entry[1:] for entry in expected}
    differing = {
        path
        for path in set(saved_map) | set(expected_map)
        if saved_map.get(path) != expected_map.get(path)
    }
    if not differing or not all(path.startswith(_OPT_STATE) for path in differing):
        return ""
    file = pathlib.Path(directory) / str(step)
    note = (
        f". Only the optimizer state differs in {file}: the parameters and the model "
        "state fit, but the optimizer state was written by another optimizer or layout"
    )
    if any(".mu[" in path for path in saved_map) and f"{_OPT_STATE}.mu" in expected_map:
        note += (
            " (this one has Adam's moments per parameter leaf, optax's ScaleByAdamState, "
            "as tft-jax wrote before make_optimizer kept them as two flat vectors, "
            "FlatAdamWState); this version cannot restore it: start a new run, or resume "
            "with the tft-jax version that wrote it"
        )
    return note


def load_state(directory: str | pathlib.Path, template: PyTree, prefer: str = BEST) -> PyTree:
    """The trained state saved under `directory`: the best step, else the latest.

    Reads only: it writes and deletes nothing (see `TrainingCheckpointer`'s
    `create=False`), so it may read the folder of a running `fit`.

    Args:
      directory: a run's checkpoint directory (as given to `fit`; `~` is expanded).
      template: a state of the same model and optimizer (e.g. a fresh
        `create_train_state`), giving structure, shapes and static fields.
      prefer: `'best'` (fall back to the latest when there is no best) or `'latest'`.

    Raises:
      FileNotFoundError: when `directory` holds no intact checkpoint.
    """
    if prefer not in (BEST, LATEST):
        raise ValueError(f"load_state: prefer must be 'best' or 'latest', got {prefer!r}")
    directory = _expanded(directory, "load_state")
    if not directory.is_dir():
        raise FileNotFoundError(f"load_state: no checkpoint directory {directory}")
    order = (BEST, LATEST) if prefer == BEST else (LATEST,)
    with TrainingCheckpointer(directory, create=False) as checkpointer:
        for kind in order:
            restored = checkpointer.restore(kind, template)
            if restored is not None:
                return restored.state
    raise FileNotFoundError(f"load_state: no intact checkpoint under {directory}")
