"""The `Forecaster` settings of the stores table (`tests/cli_tables.py`) shared by the
forecaster tests, and how they cut that table into a history and a future."""

from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

import pandas as pd

from tft_jax.forecaster import DataConfig, Forecaster, ForecasterConfig, ModelConfig

from .cli_tables import HISTORY, HORIZON, TINY_TRAINING, write_table

DATA = DataConfig(
    id_col="store", time_col="day", target="sales", freq="D", static_cols=("size",),
    known_cols=("promo",), observed_cols=("temperature",), history=HISTORY, horizon=HORIZON,
    validation_fraction=0.15, test_fraction=0.15,
)  # fmt: skip
QUANTILES = ["q0.1", "q0.5", "q0.9"]
MODEL = ModelConfig(hidden_dim=8, num_heads=2)
SETTINGS = ForecasterConfig(DATA, MODEL, TINY_TRAINING)


def fitted_stores(folder: pathlib.Path) -> tuple[Forecaster, pd.DataFrame, pathlib.Path]:
    """`(forecaster, table, saved run folder)`: the small model fitted on the stores table."""
    csv = write_table(folder / "stores.csv")
    forecaster = Forecaster(DATA, MODEL, TINY_TRAINING).fit(csv, quiet=True)
    return forecaster, pd.read_csv(csv), forecaster.save(folder / "run")


def checkpointed_stores_run(
    folder: pathlib.Path,
) -> tuple[pd.DataFrame, Forecaster, pathlib.Path]:
    """`(table, fitted forecaster, its checkpoint folder)`: a finished 4-step run of `SETTINGS`."""
    table = pd.read_csv(write_table(folder / "stores.csv"))
    checkpoints = folder / "checkpoints"
    forecaster = Forecaster.from_config(SETTINGS).fit(table, checkpoint_dir=checkpoints, quiet=True)
    return table, forecaster, checkpoints


def cut(table: pd.DataFrame, day: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """History before `day`, and the known column over the H days from `day`."""
    history = table[table["day"] < day]
    days = pd.date_range(day, periods=HORIZON, freq="D").strftime("%Y-%m-%d")
    future = table[table["day"].isin(days)][["store", "day", "promo"]]
    return history, future


def edited(
    saved: pathlib.Path, folder: pathlib.Path, edit: Callable[[dict[str, Any]], Any]
) -> pathlib.Path:
    """A copy of the run folder `saved` in `folder` with `edit` applied to its config.json."""
    shutil.copytree(saved, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
