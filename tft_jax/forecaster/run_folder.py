"""The files of a saved forecaster: a self-contained folder that needs no training data.

Layout::

    config.json          settings (data, model, training, qat), the TFT config, the
                         fitted preprocessing (series vocabulary, scalers, time
                         index), baseline period, package versions, format version,
                         and the SHA-256 of each model file (`models_sha256`)
    models/fp32.msgpack  variables of each trained form (flax msgpack); qat and int8
    models/qat.msgpack   with QAT
    models/int8.msgpack
    history.json         training and validation loss per evaluation and phase

A folder of another format version, or with a file missing or damaged, is
refused with an error that names the folder and the file.

`Forecaster.save` writes every file to a temporary sibling first and replaces
the earlier run's files only once all are written (`write_run_files`): a
write that fails (a full disk, a read-only folder) leaves the earlier run
loadable. A model file whose bytes differ from the digest config.json records
for it is refused at load (`check_model_digest`), and so is a history.json
whose bytes differ from `history_sha256` (`read_history`); runs saved before
the digests were recorded load as before.

One process writes a folder at a time (`folder_lock`); `Forecaster.load`
takes no lock. A load that overlaps a save, or finds a save that was cut
short (its complete files left as `*.<pid>.tmp` siblings), finds files of
two runs: their digests refuse them, saying so (`interrupted_save_text`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import pathlib
import platform
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from tft_jax.atomic_files import interrupts_held, replaced_atomically, temporary_sibling
from tft_jax.config import TFTConfig
from tft_jax.data.listing import repeated
from tft_jax.model import TemporalFusionTransformer
from tft_jax.paths import expanded

if TYPE_CHECKING:
    from tft_jax.data.preprocessing import Preprocessor

FORMAT = "tft-jax-forecaster"
# Raised with every change that adds a config.json field (`FIELDS_ADDED`) or changes
# what a saved field or model file means, so that an older tft-jax refuses a newer
# folder naming both versions instead of calling it damaged. `load` reads every version
# from 1 to this one. Version 4 added `preprocessor.fills_empty_categoricals` (False: the
# empty cells of categorical inputs are coded unknown, not filled; folders of versions 1
# to 3 filled them), which `Preprocessor.from_json` completes for earlier folders.
FORMAT_VERSION = 4
CONFIG_FILE = "config.json"
HISTORY_FILE = "history.json"
# config.json's record of the SHA-256 of each model file's bytes, by model name.
DIGESTS_KEY = "models_sha256"
# config.json's record of the SHA-256 of history.json's bytes, checked at load where present.
# Not a format version change (`FORMAT_VERSION`): a top-level key that an older tft-jax
# reads past (it ignores unknown top-level keys, as it ignores the CLI's `source` and
# `arguments` sections), so that older tft-jax loads these folders as before, unchecked;
# raising the version would make it refuse them for a check it cannot make. Folders saved
# before it lack it and load unchecked (hence not in `KEYS_ABSENT_FROM_EARLIER_RUNS`).
HISTORY_DIGEST_KEY = "history_sha256"
# config.json's record of the tft-jax that saved it (`versions` records the one that
# trained the model, kept when a later one loads and saves it again).
SAVED_BY_KEY = "saved_by"


class RunFolderError(ValueError):
    """A run folder that cannot be loaded: missing, incomplete or of another format."""


class RunFolderWriteError(OSError):
    """A file of a run folder that `Forecaster.save` could not write (a full disk, a
    read-only folder): `'save: ...'` saying which file and what became of the earlier
    run; `filename` is the file, `errno` and `__cause__` the failed write's."""

    def __init__(self, path: pathlib.Path, detail: str, cause: OSError) -> None:
        super().__init__(cause.errno, detail, str(path))

    def __str__(self) -> str:
        return str(self.strerror)


# What the `tft-jax` commands write beside a saved forecaster: results of the model
# saved there (entries of each folder, and files at the top).
# Exactly the names written (and their `.tmp` siblings): other files there are the user's.
_SPLITS = ("train", "validation", "test")
_MODELS = ("fp32", "qat", "int8")
# Where the `tft-jax` commands record which table each `<CSV name>` in the names of
# their outputs for another table stands for (two tables of one name would share them).
OTHER_TABLES_FILE = "other_tables.json"
# Next to the training checkpoints: what fixes the stream of training batches, and the
# settings (`ForecasterConfig.to_json`) the checkpoints were trained with.
BATCH_STREAM_FILE = "batch_stream.json"
# Where QAT checkpoints of an earlier FP32 model go while they are deleted (a resume whose
# FP32 phase trained on): left behind only by a run killed during the deletion.
REPLACED_QAT_FOLDER = "qat.replaced"
# The plots of a split (`plots.draw_run_plots`) and of a forecast (`tft-jax plot --future-csv`).
ATTENTION_PLOT = "attention.png"
VARIABLE_IMPORTANCE_PLOT = "variable_importance.png"
LOSS_CURVES_PLOT = "loss_curves.png"


def forecast_plot(model: str) -> str:
    """The name of the fan chart of model `model`'s forecasts over a split."""
    return f"forecasts_{model}.png"


def future_plot(model: str) -> str:
    """The name of the fan chart of model `model`'s forecast of the future."""
    return f"future_{model}.png"


RESULT_FOLDERS = {
    "checkpoints": ("fp32", "qat", REPLACED_QAT_FOLDER, f"{BATCH_STREAM_FILE}*"),
    "plots": (
        forecast_plot("*"), future_plot("*"), ATTENTION_PLOT, VARIABLE_IMPORTANCE_PLOT,
        LOSS_CURVES_PLOT, "*.png*.tmp",
        # `tft-jax plot`'s folders: plots/<split>/ and plots/<split>_<CSV name>/.
        *(split for split in _SPLITS if split != "test"),
        *(f"{split}_*" for split in _SPLITS),
    ),
}  # fmt: skip
_RESULT_FILES = (
    "metrics.json",
    *(f"metrics_{split}.json" for split in _SPLITS),
    *(f"metrics_{split}_*.json" for split in _SPLITS),
    "forecasts.csv",
    *(f"forecasts_{model}_{split}.csv" for model in _MODELS for split in _SPLITS),
    *(f"forecasts_{model}_{split}_*.csv" for model in _MODELS for split in _SPLITS),
    OTHER_TABLES_FILE,
)
RESULT_FILE_PATTERNS = (*_RESULT_FILES, *(f"{name}*.tmp" for name in _RESULT_FILES))


class EarlierResultsWarning(UserWarning):
    """`Forecaster.save` of a new model into a folder holding the results (metrics,
    forecasts, plots, checkpoints) that `tft-jax` wrote there for the model saved before."""


def earlier_results(root: pathlib.Path) -> list[str]:
    """The result files and folders (`RESULT_FOLDERS`, `RESULT_FILE_PATTERNS`) in `root`, sorted."""
    found = {
        f"{name}/"
        for name, patterns in RESULT_FOLDERS.items()
        if (root / name).is_dir() and any(any((root / name).glob(p)) for p in patterns)
    }
    found.update(path.name for p in RESULT_FILE_PATTERNS for path in root.glob(p) if path.is_file())
    return sorted(found)


def model_path(root: pathlib.Path, name: str) -> pathlib.Path:
    """Where model `name`'s variables live in the folder `root`."""
    return pathlib.Path(root) / "models" / f"{name}.msgpack"


def json_ready(value: Any) -> Any:
    """`value` with NaN/inf floats as None, tuples as lists and NumPy scalars as Python ones."""
    if isinstance(value, dict):
        return {str(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, pathlib.Path):
        return str(value)
    return value


def json_text(data: Any) -> str:
    """`data` as the indented JSON text `write_json` writes (strict: NaN becomes null)."""
    return json.dumps(json_ready(data), indent=2, allow_nan=False) + "\n"


def write_json(path: pathlib.Path, data: Any) -> None:
    """Writes `data` as indented JSON (strict: NaN becomes null), atomically."""
    path = expanded(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json_text(data)
    with replaced_atomically(path) as temporary:
        temporary.write_text(text)


def _non_finite_at(value: Any, where: str) -> str | None:
    """Where in `value` (`where` and its keys: "extra['x'][0]") a NaN or infinite float is,
    or None: `json_ready` writes those as null, which reads back as another value."""
    if isinstance(value, dict):
        found = (_non_finite_at(item, f"{where}[{key!r}]") for key, item in value.items())
        return next((place for place in found if place is not None), None)
    if isinstance(value, list | tuple):
        found = (_non_finite_at(item, f"{where}[{index}]") for index, item in enumerate(value))
        return next((place for place in found if place is not None), None)
    if isinstance(value, float | np.floating) and not math.isfinite(value):
        return f"{where} is {float(value)}"
    return None


def check_finite_extra(extra: dict[str, Any] | None) -> None:
    """Raises `ValueError` naming the key if `save`'s `extra` holds a NaN or infinite float:
    written as null (JSON has neither), it would read back as None without a word."""
    place = _non_finite_at(extra or {}, "extra")
    if place is not None:
        raise ValueError(
            f"save: {place}; JSON has no NaN or infinity (it would be written as null): give "
            "a finite number, a string or None"
        )


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of `data` as hex: what `DIGESTS_KEY` records of each model file."""
    return hashlib.sha256(data).hexdigest()


def write_run_files(
    root: pathlib.Path, files: dict[pathlib.Path, bytes], stale: Iterable[pathlib.Path] = ()
) -> None:
    """Writes `files` (path: bytes) into the run folder `root`, then deletes `stale`.

    Every file is written to its temporary sibling (`replaced_atomically`)
    first, and the earlier files are replaced only once all are written: a
    write that fails (a full disk, a read-only models/) removes the temporary
    files and leaves the earlier run as it was, loadable. They replace the
    earlier files in the reverse order of `files`, so the last entry (the
    config.json) first: should a later replace fail, its `models_sha256`
    refuses the model files not replaced yet, instead of loading them under
    the new settings. A Ctrl-C, SIGTERM or SIGHUP during the renames is held
    until they are done (`interrupts_held`), then delivered: the folder holds
    the new run whole. `stale` (model files of forms the new run lacks) go once the new
    config.json no longer lists them. Raises
    `RunFolderWriteError` naming the file and what became of the earlier run.
    """
    root = pathlib.Path(root)
    earlier = (root / CONFIG_FILE).is_file()
    for folder in sorted({path.parent for path in files}):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise _write_error(
                root, folder, f"could not create {folder}", error, earlier
            ) from error
    targets = {temporary_sibling(path): path for path in files}
    written = False
    # A Ctrl-C during the writes removes the temporary files (the earlier run stays);
    # a signal during the renames waits for them (the new run is whole), then is delivered.
    with contextlib.ExitStack() as renaming:
        try:
            with contextlib.ExitStack() as stack:
                for path, data in files.items():
                    stack.enter_context(replaced_atomically(path)).write_bytes(data)
                written = True
                renaming.enter_context(interrupts_held())  # the renames, as `stack` closes
        except OSError as error:
            failed = targets.get(pathlib.Path(os.fsdecode(error.filename or "")), root)
            if not written:
                raise _write_error(
                    root, failed, f"could not write {failed}", error, earlier
                ) from error
            # The config.json is replaced first: if it failed, no earlier file was replaced.
            intact = failed == list(files)[-1]
            what = f"could not replace {failed} with its new version"
            raise _write_error(root, failed, what, error, earlier and intact, not intact) from error
        for path in stale:
            try:
                path.unlink(missing_ok=True)
            except OSError as error:
                raise RunFolderWriteError(
                    path,
                    f"save: the run is saved in {root}, but {path} (a model form it lacks, not "
                    f"listed in its config.json) could not be deleted: {_cause_text(error)}",
                    error,
                ) from error


def _write_error(
    root: pathlib.Path,
    path: pathlib.Path,
    what: str,
    error: OSError,
    earlier: bool,
    incomplete: bool = False,
) -> RunFolderWriteError:
    """`what` failed at `path`: the error, saying what became of the run in `root`."""
    if incomplete:
        fate = (
            f"the run in {root} is incomplete (its config.json is the new one, and refuses the "
            "model files not replaced): save again"
        )
    elif earlier:
        fate = f"the earlier run in {root} is left intact"
    else:
        fate = f"nothing was saved in {root}"
    return RunFolderWriteError(path, f"save: {what} ({_cause_text(error)}); {fate}", error)


def _cause_text(error: OSError) -> str:
    """What went wrong, without the file (named apart): the OS's text, or the message of an
    `OSError` raised with one only (to which `replaced_atomically` gave a file name)."""
    if error.strerror:
        return error.strerror
    return str(error.args[0]) if len(error.args) == 1 else str(error)


def read_json(path: pathlib.Path) -> Any:
    """Reads a JSON file of a run folder, with a clear error when it is missing."""
    path = expanded(path)
    if not path.is_file():
        raise RunFolderError(
            f"{path} does not exist; is {path.parent} a folder written by Forecaster.save "
            "or `tft-jax train`?"
        )
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunFolderError(f"{path} is damaged (not JSON): {error}") from None


def variables_bytes(variables: Any) -> bytes:
    """A variable dict as the flax msgpack bytes `save_variables` writes."""
    return serialization.msgpack_serialize(jax.device_get(dict(variables)))


def save_variables(path: pathlib.Path, variables: Any) -> None:
    """Writes a variable dict as flax msgpack, atomically."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = variables_bytes(variables)
    with replaced_atomically(path) as temporary:
        temporary.write_bytes(data)


def holds_models(root: pathlib.Path, models: dict[str, bytes]) -> bool:
    """Whether `root` holds exactly these model files (`variables_bytes` by name), byte for
    byte (a model saved again)."""
    saved = {path.stem for path in (root / "models").glob("*.msgpack")}
    if saved != set(models):
        return False
    return all(model_path(root, name).read_bytes() == data for name, data in models.items())


def read_model_bytes(path: pathlib.Path) -> bytes:
    """The bytes of a model file, with a clear error when it is missing."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise RunFolderError(
            f"{path} does not exist; the run folder {path.parent.parent} is incomplete"
        )
    return path.read_bytes()


def load_variables(path: pathlib.Path) -> dict[str, Any]:
    """Reads a variable dict written by `save_variables`."""
    return restore_variables(path, read_model_bytes(path))


def restore_variables(path: pathlib.Path, data: bytes) -> dict[str, Any]:
    """The variable dict of the bytes `data` of the model file `path` (named by its errors)."""
    try:
        variables = serialization.msgpack_restore(data)
    except Exception as error:  # msgpack raises several types for damaged bytes
        raise RunFolderError(
            f"{path} is damaged (not flax msgpack: {type(error).__name__}: {error}); "
            "save the forecaster or train the run again"
        ) from None
    if not isinstance(variables, dict):
        raise RunFolderError(
            f"{path} holds a {type(variables).__name__}, not a dict of model variables"
        )
    return variables


def _abstract_inputs(config: TFTConfig) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Shapes and dtypes of one sample's model inputs for `config` (no values)."""
    steps, horizon = config.sequence_length, config.prediction_horizon

    def real(*shape: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((1, *shape), jnp.float32)

    def codes(*shape: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((1, *shape), jnp.int32)

    static = real(config.num_static_features) if config.num_static_features else None
    args = (static, real(steps, config.num_observed_features),
            real(horizon, config.num_known_features))  # fmt: skip
    kwargs: dict[str, Any] = {}
    if config.use_known_history:
        kwargs["known_history"] = real(steps, config.num_known_features)
    if config.static_categorical_cardinalities:
        kwargs["static_categorical"] = codes(len(config.static_categorical_cardinalities))
    if config.known_categorical_cardinalities:
        count = len(config.known_categorical_cardinalities)
        kwargs["future_categorical"] = codes(horizon, count)
        if config.use_known_history:
            kwargs["known_categorical_history"] = codes(steps, count)
    if config.observed_categorical_cardinalities:
        count = len(config.observed_categorical_cardinalities)
        kwargs["observed_categorical"] = codes(steps, count)
    return args, kwargs


def _param_shapes(params: Any) -> dict[str, tuple[int, ...]]:
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return {jax.tree_util.keystr(path): tuple(np.shape(leaf)) for path, leaf in leaves}


def model_param_shapes(config: TFTConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every `params` leaf of the TFT of `config`, by path (`eval_shape`: no values).

    The FP32, QAT and int8 forms share this tree and these shapes (int8
    kernels hold codes).
    """
    return dict(_model_param_shapes(config))


@functools.lru_cache(maxsize=16)
def _model_param_shapes(config: TFTConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """`model_param_shapes` as pairs, traced once per configuration (every load checks them)."""
    args, kwargs = _abstract_inputs(config)
    rngs = {"params": jax.random.key(0), "dropout": jax.random.key(0)}
    model = TemporalFusionTransformer(config)
    shapes = _param_shapes(jax.eval_shape(model.init, rngs, *args, **kwargs)["params"])
    return tuple(shapes.items())


def check_params(
    variables: dict[str, Any], expected: dict[str, tuple[int, ...]], path: pathlib.Path
) -> None:
    """Raises `RunFolderError` naming `path` unless `variables['params']` have the shapes
    `expected` (`model_param_shapes` of the run's config): weights copied from another
    run would otherwise fail inside Flax at the first forecast."""
    got = _param_shapes(variables.get("params", {}))
    if got == expected:
        return
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    differ = [key for key in sorted(set(got) & set(expected)) if got[key] != expected[key]]
    details = [f"{key} has shape {got[key]}, the model's is {expected[key]}" for key in differ[:3]]
    details += [f"missing {missing[:3]}"] if missing else []
    details += [f"unexpected {extra[:3]}"] if extra else []
    raise RunFolderError(
        f"{path} does not hold this run's model ({'; '.join(details)}); "
        "were the weights copied from another run?"
    )


# The variable collections of each trained form, as `fit` makes them.
COLLECTIONS = {"fp32": ("params",), "qat": ("params", "quant_stats"),
               "int8": ("int8", "params", "quant_stats")}  # fmt: skip


def check_form(
    variables: dict[str, Any], name: str, config: TFTConfig, bits: int, path: pathlib.Path
) -> None:
    """Raises `RunFolderError` naming `path` unless `variables` are of the form `name`.

    Checked: the collections (`COLLECTIONS`), every parameter finite and of
    `config.param_dtype` (int8 codes allowed in the int8 form), and, for 'qat'
    and 'int8', finite observer ranges and weight scales (`_check_state_finite`)
    and observers of `bits` bits (the run's `qat.bits`). The three
    forms share their parameter shapes (`check_params`), so the file of
    another form, weights cast to another dtype, or an edited `qat.bits`
    would otherwise load and forecast with another model without a word, or
    fail deep inside Flax at the first forecast.
    """
    found, expected = sorted(variables), sorted(COLLECTIONS[name])
    if found != expected:
        raise RunFolderError(
            f"{path} holds the collections {found}, the {name} form's are {expected}; "
            "is it the file of another model form?"
        )
    dtypes = {jnp.dtype(config.param_dtype)} | ({jnp.dtype(jnp.int8)} if name == "int8" else set())
    for key, leaf in jax.tree_util.tree_flatten_with_path(variables["params"])[0]:
        if jnp.dtype(np.asarray(leaf).dtype) not in dtypes:
            raise RunFolderError(
                f"{path}: parameter {jax.tree_util.keystr(key)} is {np.asarray(leaf).dtype}, "
                f"the run's parameters are {config.param_dtype}"
            )
        # `fit` never keeps a non-finite state: such a file would forecast NaN.
        bad = int(np.size(leaf) - np.count_nonzero(np.isfinite(np.asarray(leaf, np.float32))))
        if bad:
            raise RunFolderError(
                f"{path}: parameter {jax.tree_util.keystr(key)} holds {bad} NaN or infinite "
                f"value(s) of {np.size(leaf)}; the file is damaged (a trained model's are finite)"
            )
    if name == "fp32":
        return
    _check_state_finite(variables, path)
    marked = {
        int(np.asarray(leaf))
        for key, leaf in jax.tree_util.tree_flatten_with_path(variables["quant_stats"])[0]
        if getattr(key[-1], "key", None) == "bits"
    }
    if marked - {bits}:
        raise RunFolderError(
            f"{path} was quantized with {sorted(marked)} bits, config.json says qat.bits={bits}"
        )


def _check_state_finite(variables: dict[str, Any], path: pathlib.Path) -> None:
    """Raises `RunFolderError` naming `path` and the leaf if a QAT or int8 state value is
    NaN or infinite where `fit` never leaves one.

    Every float leaf of the collections other than `params` (observer ranges in
    `quant_stats`, weight scales in `int8`) must be finite, except the `min`/`max`
    of an observer that has seen no batch (`num_batches` 0: its fresh +inf/-inf,
    as `qat.calibrate` leaves it). A NaN or infinite scale or range there makes
    every forecast of the form NaN, without an error.
    """
    for collection in sorted(variables):
        if collection == "params":
            continue
        leaves = jax.tree_util.tree_flatten_with_path(variables[collection])[0]
        counts = {
            tuple(key[:-1]): int(np.asarray(leaf).max(initial=0))
            for key, leaf in leaves
            if getattr(key[-1], "key", None) == "num_batches"
        }
        for key, leaf in leaves:
            values = np.asarray(leaf)
            if not np.issubdtype(values.dtype, np.floating) or np.isfinite(values).all():
                continue
            fresh = (
                getattr(key[-1], "key", None) in ("min", "max") and counts.get(tuple(key[:-1])) == 0
            )
            if fresh and not np.isnan(values).any():
                continue
            bad = int(values.size - np.count_nonzero(np.isfinite(values)))
            raise RunFolderError(
                f"{path}: {collection}{jax.tree_util.keystr(key)} holds {bad} NaN or infinite "
                f"value(s) of {values.size}; the file is damaged (a trained model's are finite, "
                "and every forecast of this form would be NaN)"
            )


# `TFTConfig` fields no setting reaches, as `Forecaster.fit` trains them: the defaults, and
# the known inputs over the history that every window carries (`tft_config_kwargs`).
FIT_FIXED = {
    **{
        field.name: field.default
        for field in dataclasses.fields(TFTConfig)
        if field.name in ("attend_to_self", "dtype", "param_dtype")
    },
    "use_known_history": True,
}


def check_tft_config(config: TFTConfig, settings: Any) -> None:
    """Raises `ValueError` unless `config` (the saved `TFTConfig`) has the fields that `fit`
    copies from `settings` (a `ForecasterConfig`), and those it fixes as `fit` fixes them:
    an edit of one of them in config.json would otherwise be ignored, rename the forecast
    columns (`tft_config.quantiles`), or forecast with another computation
    (`attend_to_self`, `dtype`)."""
    data, model = settings.data, settings.model
    copied = {
        "sequence_length": ("data.history", data.history),
        "prediction_horizon": ("data.horizon", data.horizon),
        "hidden_dim": ("model.hidden_dim", model.hidden_dim),
        "num_heads": ("model.num_heads", model.num_heads),
        "dropout_rate": ("model.dropout_rate", model.dropout_rate),
        "variable_hidden_dim": ("model.variable_hidden_dim", model.variable_hidden_dim),
        "compact_selection": ("model.compact_selection", model.compact_selection),
        "quantiles": ("model.quantiles", tuple(model.quantiles)),
    }
    differ = [
        f"tft_config.{field} is {getattr(config, field)!r}, {name} is {value!r}"
        for field, (name, value) in copied.items()
        if getattr(config, field) != value
    ]
    # An edit of a field no setting reaches loads weights of the same shapes into another
    # computation (another attention mask, bfloat16 activations): other forecasts, silently.
    differ += [
        f"tft_config.{field} is {getattr(config, field)!r}, Forecaster.fit always trains with "
        f"{value!r}"
        for field, value in FIT_FIXED.items()
        if getattr(config, field) != value
    ]
    if differ:
        raise ValueError("; ".join(differ))


def check_preprocessor(preprocessor: Preprocessor, config: TFTConfig, settings: Any) -> None:
    """Raises `ValueError` unless the saved preprocessing makes the inputs of the saved model.

    `preprocessor` (config.json's `preprocessor`), `config` (its `tft_config`)
    and `settings` (a `ForecasterConfig`) come from one file that can be edited
    by hand. `fit` derives the model's input counts and embedding sizes from
    the preprocessor, and the preprocessor's table spec from `settings.data`;
    an edit of one side only would otherwise forecast with inputs the model was
    not trained on (a series or category added to a vocabulary takes codes
    beyond the model's embedding, which JAX clamps silently), fail at the
    first forecast, or be ignored (`predict` reads the preprocessor's spec).
    """
    derived = {
        "num_static_features": len(preprocessor.static_feature_names),
        "num_known_features": len(preprocessor.known_feature_names),
        "num_observed_features": len(preprocessor.observed_feature_names),
        "static_categorical_cardinalities": preprocessor.static_categorical_cardinalities,
        "known_categorical_cardinalities": preprocessor.known_categorical_cardinalities,
        "observed_categorical_cardinalities": preprocessor.observed_categorical_cardinalities,
    }
    differ = [
        f"tft_config.{field} is {getattr(config, field)!r}, the preprocessor's inputs make "
        f"{value!r}"
        for field, value in derived.items()
        if getattr(config, field) != value
    ]
    spec, data = preprocessor.spec, settings.data.table_spec()
    # `fit` adds columns of text to the categorical ones (`infer_categorical`).
    differ += [
        f"preprocessor.spec.{field} is {getattr(spec, field)!r}, data.{field} is "
        f"{getattr(data, field)!r}"
        for field in (f.name for f in dataclasses.fields(spec))
        if field != "categorical_cols" and getattr(spec, field) != getattr(data, field)
    ]
    # `predict` scales with the preprocessor's target scaler: an edit of these alone was ignored.
    scaler = preprocessor.target_scaler
    fitted_target = {
        "scaler": ("method", scaler.method),
        "target_transform": ("transform", scaler.target_transform),
    }
    differ += [
        f"preprocessor.target_scaler.{key} is {fitted!r}, data.{name} is "
        f"{getattr(settings.data, name)!r}"
        for name, (key, fitted) in fitted_target.items()
        if fitted != getattr(settings.data, name)
    ]
    if not set(data.categorical_cols) <= set(spec.categorical_cols):
        differ.append(
            f"data.categorical_cols {list(data.categorical_cols)} are not all in "
            f"preprocessor.spec.categorical_cols {list(spec.categorical_cols)}"
        )
    if differ:
        raise ValueError("; ".join(differ) + "; was config.json edited by hand?")


def check_trained_windows(summary: dict[str, Any], settings: Any) -> None:
    """Raises `ValueError` unless `settings.data` normalizes windows as the model was trained.

    `summary` is config.json's `summary`, whose `dataset.window_normalization`
    (absent in runs saved before it was kept) records the training windows.
    The setting changes the scale of every window the model reads: an edit of
    `data.window_normalization` alone would forecast from windows on another
    scale than it was trained on, without a word.
    """
    dataset = summary.get("dataset")
    trained = dataset.get("window_normalization") if isinstance(dataset, dict) else None
    if trained is None:
        return
    if not isinstance(trained, bool):
        raise TypeError(f"summary.dataset.window_normalization must be a bool, got {trained!r}")
    if trained != settings.data.window_normalization:
        raise ValueError(
            f"data.window_normalization is {settings.data.window_normalization}, the model was "
            f"trained on windows with window_normalization {trained} "
            "(summary.dataset.window_normalization); was config.json edited by hand?"
        )


def check_format(config: dict[str, Any], root: pathlib.Path) -> int:
    """The format version of `config`; `RunFolderError` unless it is one this tft-jax
    reads (1 to `FORMAT_VERSION`)."""
    found = (config.get("format"), config.get("format_version"))
    written_version = found[1]
    version = (
        written_version
        if isinstance(written_version, int) and not isinstance(written_version, bool)
        else None
    )
    if found[0] == FORMAT and version is not None and 1 <= version <= FORMAT_VERSION:
        return version
    import tft_jax

    written = writer(config)

    advice = (
        "Upgrade tft-jax to load it, or train again"
        if found[0] == FORMAT and version is not None and version > FORMAT_VERSION
        else "Load it with the tft-jax that wrote it, or train again"
    )
    raise RunFolderError(
        f"{root / CONFIG_FILE} is format {found[0]!r} version {found[1]!r}, {written}; "
        f"this tft-jax ({tft_jax.__version__}) reads {FORMAT!r} versions "
        f"1 to {FORMAT_VERSION}. {advice}"
    )


def saved_by() -> dict[str, str]:
    """config.json's `saved_by`: the tft-jax that writes the file."""
    import tft_jax

    return {"tft_jax": tft_jax.__version__}


def writer(config: dict[str, Any]) -> str:
    """Which tft-jax wrote `config`, in words: the one that saved it (`saved_by`), or, in
    folders saved before that was recorded, the one that trained the model (`versions`,
    which a later tft-jax keeps when it saves the model again)."""
    for key, verb in ((SAVED_BY_KEY, "saved by"), ("versions", "trained with")):
        record = config.get(key)
        if isinstance(record, dict) and isinstance(record.get("tft_jax"), str):
            return f"{verb} tft-jax {record['tft_jax']}"
    return "written by an unknown version of tft-jax"


def check_not_a_file(root: pathlib.Path, label: str) -> None:
    """Raises `RunFolderError` if the run folder `root`, given as `label` ('--run',
    'Forecaster.load:'), is a file: a run's config.json given for its folder was read
    as `config.json/config.json`, said to "not exist"."""
    root = pathlib.Path(root)
    if not root.exists() or root.is_dir():
        return
    hint = (
        f"; give the folder that holds it, {root.parent}"
        if (root.parent / CONFIG_FILE).is_file()
        else ""
    )
    raise RunFolderError(f"{label} {root} is a file, not a run folder{hint}")


# Fields of config.json's sections that folders of earlier format versions may lack,
# by the version from which every folder holds them, with the value that means what
# those runs did: not always today's default (a run saved before window normalization
# existed scaled by its series' scaler alone, and one saved before time budgets trained
# without one). Every other field must be there: `Forecaster.save` writes all of them
# (`dataclasses.asdict`), so a missing one was deleted by hand, and its default may be
# another setting than the run's (another seed, clipping of negative forecasts). A
# change that adds a field raises `FORMAT_VERSION` and lists the field under it.
FIELDS_ADDED: dict[int, dict[str, Any]] = {
    # Added while version 1 was written: some version 1 folders hold them, some not.
    2: {
        "data.categorical_cols": [],
        "data.time_format": None,
        "data.dayfirst": False,
        "data.encoding": "utf-8",
        "data.max_missing_fraction": 0.5,
        "data.min_series_length": None,
        "data.target_transform": "none",
        "data.window_normalization": False,
        "data.nonnegative": False,
        "training.time_budget": None,
        "qat.time_budget": None,
        "tft_config.known_categorical_cardinalities": [],
        "tft_config.observed_categorical_cardinalities": [],
    },
    # Runs saved before it left out every window whose horizon held a filled target.
    3: {
        "data.require_observed_target": True,
    },
}


# From this format version on, config.json holds every key `Forecaster.save` writes (null
# for a part the run has not): a missing one was deleted by hand. Folders of earlier
# versions may lack those added while they were written (the digests, the summary, parts
# of the preprocessor), read with the meaning they had for those runs.
COMPLETE_FROM_VERSION = 2
KEYS_ABSENT_FROM_EARLIER_RUNS = (DIGESTS_KEY, "summary")


def check_complete(config: dict[str, Any], version: int) -> None:
    """Raises `ValueError` naming the keys of `KEYS_ABSENT_FROM_EARLIER_RUNS` that a folder
    of format `version` lacks, from `COMPLETE_FROM_VERSION` on (without its digests a
    flipped byte of a model file would load; without its summary, unchecked windows)."""
    missing = [key for key in KEYS_ABSENT_FROM_EARLIER_RUNS if key not in config]
    if version >= COMPLETE_FROM_VERSION and missing:
        raise ValueError(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing from a "
            f"folder of format version {version}: Forecaster.save writes them; was "
            "config.json edited by hand?"
        )


def fields_absent_before(version: int) -> dict[str, Any]:
    """The fields a folder of format `version` may lack (`section.field`), with the
    value that means what its run did."""
    return {
        key: value
        for added, fields in FIELDS_ADDED.items()
        if added > version
        for key, value in fields.items()
    }


def complete_sections(
    config: dict[str, Any], sections: dict[str, type], version: int
) -> dict[str, Any]:
    """`config`, a folder of format `version`, with the fields its version may lack
    filled in (`FIELDS_ADDED`); `ValueError` naming `section.field` for any other field
    of `sections` (config.json's section name: its dataclass) that config.json's
    section lacks.

    The dataclasses would take their defaults for them without a word (a
    missing `data.nonnegative` loaded as False, `tft_config.dtype` as
    float32). A section that is absent or null is left to the reader that
    needs it (`qat` may be null). Unknown keys are refused by the dataclasses.
    """
    absent = fields_absent_before(version)
    missing, completed = [], dict(config)
    for name, kind in sections.items():
        section = config.get(name)
        if not isinstance(section, dict):
            continue
        for field in dataclasses.fields(kind):
            key = f"{name}.{field.name}"
            if not field.init or field.name in section:
                continue
            if key in absent:
                completed[name] = {**completed[name], field.name: absent[key]}
            else:
                missing.append(key)
    if missing:
        raise ValueError(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing from a "
            f"folder of format version {version}: Forecaster.save writes every field, and "
            "the default would load the run with another setting than it was trained with; "
            "was config.json edited by hand?"
        )
    return completed


def check_models(
    config: dict[str, Any], qat_forms: Iterable[str], known: Iterable[str]
) -> list[str]:
    """config.json's `models`, checked to be a list of model names `known`, with 'fp32',
    each once, and, if it lists a form of `qat_forms`, with the QAT settings (`qat`) there.

    Raises `TypeError` or `ValueError` naming the field: a repeated name was
    dropped without a word, and a quantized form without its QAT section
    loaded with 8 bits whatever it was trained with.
    """
    names = config["models"]
    if not isinstance(names, list):  # list("fp32") would name the forms 'f', 'p', ...
        raise TypeError(f"models must be a list of model names, got {names!r}")
    known = tuple(known)
    unknown = [name for name in names if name not in known]
    if unknown or "fp32" not in names:
        raise ValueError(f"models {names} must include 'fp32', all in {known}")
    twice = sorted(repeated(names))
    if twice:
        raise ValueError(f"models {names} lists {twice} more than once; list each form once")
    quantized = [name for name in names if name in tuple(qat_forms)]
    if quantized and not isinstance(config.get("qat"), dict):
        found = f"qat is {json.dumps(config['qat'])}" if "qat" in config else "qat is missing"
        raise ValueError(
            f"{found}, but models lists the quantized forms {quantized}: their QAT settings "
            "(qat.bits, ...) are lost; was config.json edited by hand?"
        )
    return names


def recorded_digests(config: dict[str, Any], names: list[str]) -> dict[str, str] | None:
    """config.json's `models_sha256`, checked to hold a SHA-256 hex digest for each model of
    `names`; None for a run saved before the digests were recorded (not checked)."""
    if DIGESTS_KEY not in config:
        return None
    digests = config[DIGESTS_KEY]
    if not isinstance(digests, dict):
        raise TypeError(
            f"{DIGESTS_KEY} must be an object of SHA-256 digests by model name, got {digests!r}"
        )
    for name in names:
        digest = digests.get(name)
        if digest is None:
            raise ValueError(
                f"{DIGESTS_KEY} records no digest of {name!r}, which models lists; was "
                "config.json edited by hand?"
            )
        if not (isinstance(digest, str) and len(digest) == 64 and _is_hex(digest)):
            raise ValueError(
                f"{DIGESTS_KEY}.{name} must be a SHA-256 digest (64 hex digits), got {digest!r}"
            )
    return digests


def _is_hex(text: str) -> bool:
    return all(character in "0123456789abcdef" for character in text)


def check_model_digest(path: pathlib.Path, data: bytes, name: str, expected: str) -> None:
    """Raises `RunFolderError` naming `path` and both digests unless `data` (its bytes) have
    the SHA-256 `expected` that config.json records: a flipped byte in a weight loads and
    forecasts otherwise, without a word."""
    actual = sha256_hex(data)
    if actual != expected:
        raise RunFolderError(
            f"{path} is damaged or was replaced after the run was saved: its SHA-256 is "
            f"{actual}, config.json's {DIGESTS_KEY}.{name} is {expected}; "
            + interrupted_save_text(path.parent.parent)
        )


def interrupted_save_text(root: pathlib.Path) -> str:
    """What a digest that does not match says of the run folder `root`: it may be being
    saved (a load reads its files one by one, without a lock), or a save into it was cut
    short, whose complete files (`*.<pid>.tmp`) are named; then what to do."""
    left = sorted(
        str(path.relative_to(root))
        for folder in (root, root / "models")
        for path in folder.glob("*.tmp")
        if path.is_file()
    )
    found = f" (it holds {', '.join(left)}, left by a save cut short)" if left else ""
    return (
        f"the folder may be being saved by another process, or a save into it was "
        f"interrupted{found}: retry the load; if this persists, save the forecaster or "
        "train the run again"
    )


def history_bytes(history: Any) -> bytes:
    """history.json's bytes, as `Forecaster.save` writes them (`HISTORY_DIGEST_KEY` is
    their digest)."""
    return json_text(history).encode()


def read_history(root: pathlib.Path, config: dict[str, Any]) -> dict[str, Any]:
    """history.json of the run folder `root`, checked against config.json's
    `history_sha256` where recorded (`RunFolderError` naming both digests): one of another
    run (a save overlapping the load) loaded with this run's model without a word."""
    path = pathlib.Path(root) / HISTORY_FILE
    if not path.is_file():
        read_json(path)  # raises, naming the folder
    data = path.read_bytes()
    try:
        history = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunFolderError(f"{path} is damaged (not JSON): {error}") from None
    if not isinstance(history, dict):
        raise RunFolderError(
            f"{path} is damaged: it holds a JSON {type(history).__name__}, "
            "not an object of losses by phase"
        )
    # After the checks above, which say more of a file edited on purpose.
    expected = config.get(HISTORY_DIGEST_KEY)
    if expected is not None and sha256_hex(data) != expected:
        raise RunFolderError(
            f"{path} is damaged or was replaced after the run was saved: its SHA-256 is "
            f"{sha256_hex(data)}, config.json's {HISTORY_DIGEST_KEY} is {expected}; "
            + interrupted_save_text(pathlib.Path(root))
        )
    return history


def versions() -> dict[str, Any]:
    """Package versions, devices and the compiler's settings, recorded in config.json.

    What a run's numbers depend on beyond its settings: the packages that
    compute them (jaxlib compiles the program, numpy and pandas prepare the
    data), the `XLA_FLAGS` the compiler read (None when unset; they change
    the float results), and the machine (architecture, CPU model), whose
    instruction set changes them too. Records only: a run folder written
    elsewhere loads all the same (only the tft_jax version is read back).
    `Forecaster.fit` takes them, and `save` writes those of the training
    process (a model loaded and saved again keeps them). `XLA_FLAGS` is
    recorded verbatim, paths it names included.
    """
    import flax
    import jaxlib
    import optax
    import pandas

    import tft_jax

    return {
        "tft_jax": tft_jax.__version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "numpy": np.__version__,
        "pandas": pandas.__version__,
        "backend": jax.default_backend(),
        "devices": [str(device) for device in jax.devices()],
        "processes": jax.process_count(),
        "cpu_count": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
    }


def cpu_model(cpuinfo: pathlib.Path = pathlib.Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name: the first `model name` of `cpuinfo` (Linux), else
    `platform.processor()`; None when neither names one."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or None
