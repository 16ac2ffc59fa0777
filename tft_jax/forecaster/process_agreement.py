"""What the processes of a multi-process `Forecaster.fit` must agree on, before any collective.

Processes given different settings or tables trained silently on a mix of
tables, or ended in JAX or gloo errors that named nothing;
`tft_jax.distributed.check_settings_agree` compares these settings' digests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

import jax
import numpy as np
import pandas as pd

import tft_jax
from tft_jax.distributed import file_digest
from tft_jax.forecaster import run_folder
from tft_jax.forecaster.config import (
    DataConfig,
    ForecasterConfig,
    ModelConfig,
    QATTrainingConfig,
    TrainingConfig,
)
from tft_jax.paths import expanded


def table_digest(table: Any) -> tuple[str, str]:
    """`(compared, shown)` of a table for `check_settings_agree`: its content, not its name.

    A path: the SHA-256 of the file (`file_digest`; hosts may mount it at
    other paths). A DataFrame: the SHA-256 of its column names (by `repr`:
    `1` is not `'1'`), dtypes and row hashes (`pd.util.hash_pandas_object`,
    the index left out, as `prepare_dataset` reads the columns only), and of
    the type of each cell of an object column (whose values it hashes as
    text: the number `1` and the text `'1'` alike). Anything else by its type
    (`fit` refuses it once the processes agree).
    """
    if isinstance(table, str | os.PathLike):
        digest = file_digest(expanded(table))
        return digest, f"{os.fspath(table)} (sha256 {digest[:16]})"
    if isinstance(table, pd.DataFrame):
        hasher = hashlib.sha256()
        columns = [[repr(name), str(dtype)] for name, dtype in table.dtypes.items()]
        hasher.update(json.dumps(columns).encode())
        objects = table.loc[:, [dtype == np.dtype(object) for dtype in table.dtypes]]  # not str
        kinds = objects.map(lambda cell: type(cell).__name__)
        try:
            for part in (table, kinds):
                rows = pd.util.hash_pandas_object(part, index=False).to_numpy()
                hasher.update(np.ascontiguousarray(rows).tobytes())
        except (TypeError, ValueError):  # unhashable cells (lists, dicts): their text
            hasher.update(table.to_csv(index=False).encode())
            hasher.update(kinds.to_csv(index=False).encode())
        hexdigest = hasher.hexdigest()
        shape = f"{len(table)} rows x {table.shape[1]} columns"
        return hexdigest, f"a DataFrame of {shape} (content digest {hexdigest[:16]})"
    return f"a {type(table).__name__}", f"a {type(table).__name__}"


def _config_value(value: Any) -> tuple[str, str]:
    """`(compared, shown)` of a config field: its JSON text (NumPy scalars as Python ones)."""
    return json.dumps(run_folder.json_ready(value), default=repr), repr(value)


def fit_settings(
    config: ForecasterConfig,
    table: Any,
    checkpoint_dir: str | os.PathLike | None,
    resume: bool,
) -> dict[str, tuple[str, str]]:
    """What the processes of a multi-process `fit` must agree on: name -> (compared, shown).

    Every field of the config's sections by dotted name (`training.batch_size`;
    the `qat.*` fields read 'no QAT' for `qat=None`), the table's content
    (`table_digest`), `resume`, whether `checkpoint_dir` is given (its path may
    differ between hosts that mount the shared folder otherwise, as the CLI's
    `--out` may), and the versions of tft_jax and JAX.
    """
    settings: dict[str, tuple[str, str]] = {
        "tft_jax version": (tft_jax.__version__, tft_jax.__version__),
        "jax version": (jax.__version__, jax.__version__),
        "table": table_digest(table),
        "resume": (json.dumps(bool(resume)), repr(resume)),
        "checkpoint_dir": (
            json.dumps(checkpoint_dir is not None),
            "None" if checkpoint_dir is None else repr(os.fspath(checkpoint_dir)),
        ),
    }
    sections: dict[str, DataConfig | ModelConfig | TrainingConfig] = {
        "data": config.data,
        "model": config.model,
        "training": config.training,
    }
    for section, values in sections.items():
        for field in dataclasses.fields(values):
            settings[f"{section}.{field.name}"] = _config_value(getattr(values, field.name))
    for field in dataclasses.fields(QATTrainingConfig):
        settings[f"qat.{field.name}"] = (
            ("null-qat", "no QAT (qat=None)")
            if config.qat is None
            else _config_value(getattr(config.qat, field.name))
        )
    return settings
