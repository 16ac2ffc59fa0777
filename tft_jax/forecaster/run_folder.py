"""The files of a saved forecaster: a self-contained folder that needs no training data.

Layout::

    config.json          settings (data, model, training, qat), the TFT config, the
                         fitted preprocessing (series vocabulary, scalers, time
                         index), baseline period, package versions, format version
    models/fp32.msgpack  variables of each trained form (flax msgpack); qat and int8
    models/qat.msgpack   with QAT
    models/int8.msgpack
    history.json         training and validation loss per evaluation and phase

A folder of another format version, or with a file missing or damaged, is
refused with an error that names the folder and the file.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import jax
import numpy as np
from flax import serialization

FORMAT = "tft-jax-forecaster"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
HISTORY_FILE = "history.json"


class RunFolderError(ValueError):
    """A run folder that cannot be loaded: missing, incomplete or of another format."""


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


def write_json(path: pathlib.Path, data: Any) -> None:
    """Writes `data` as indented JSON (strict: NaN becomes null), atomically."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(json_ready(data), indent=2, allow_nan=False) + "\n")
    temporary.replace(path)


def read_json(path: pathlib.Path) -> Any:
    """Reads a JSON file of a run folder, with a clear error when it is missing."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise RunFolderError(
            f"{path} does not exist; is {path.parent} a folder written by Forecaster.save "
            "or `tft-jax train`?"
        )
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunFolderError(f"{path} is damaged (not JSON): {error}") from None


def save_variables(path: pathlib.Path, variables: Any) -> None:
    """Writes a variable dict as flax msgpack, atomically."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_bytes(serialization.msgpack_serialize(jax.device_get(dict(variables))))
    temporary.replace(path)


def load_variables(path: pathlib.Path) -> dict[str, Any]:
    """Reads a variable dict written by `save_variables`."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise RunFolderError(
            f"{path} does not exist; the run folder {path.parent.parent} is incomplete"
        )
    try:
        variables = serialization.msgpack_restore(path.read_bytes())
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


def check_format(config: dict[str, Any], root: pathlib.Path) -> None:
    """Raises `RunFolderError` unless `config` is of this format version."""
    found = (config.get("format"), config.get("format_version"))
    if found != (FORMAT, FORMAT_VERSION):
        written = config.get("versions", {}).get("tft_jax", "an unknown version")
        raise RunFolderError(
            f"{root / CONFIG_FILE} is format {found[0]!r} version {found[1]!r}, written by "
            f"tft-jax {written}; this tft-jax reads {FORMAT!r} version {FORMAT_VERSION}. "
            "Load it with the tft-jax that wrote it, or train again"
        )


def versions() -> dict[str, Any]:
    """Package versions and devices, recorded in config.json."""
    import os

    import flax
    import optax

    import tft_jax

    return {
        "tft_jax": tft_jax.__version__,
        "jax": jax.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(device) for device in jax.devices()],
        "processes": jax.process_count(),
        "cpu_count": os.cpu_count(),
    }
