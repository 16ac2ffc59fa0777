"""Small long tables ('id', 'time', 'y') prepared for the data tests, with a history of
4 steps and a horizon of 2, and the forecast inputs of a fitted preprocessor."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from tft_jax.data import prepare_dataset
from tft_jax.data.future import future_windows

HISTORY, HORIZON = 4, 2


def quiet_prepare(table: pd.DataFrame, **options):
    """`prepare_dataset` with its announcements (filled steps) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return prepare_dataset(table, id_col="id", time_col="time", target="y", **options)


def prepare(table: pd.DataFrame, freq: str = "D", **options: Any) -> Any:
    """`prepare_dataset` of columns 'id', 'time', 'y', HISTORY and HORIZON; daily by default."""
    return prepare_dataset(
        table, id_col="id", time_col="time", target="y", freq=freq, history=HISTORY,
        horizon=HORIZON, **options,
    )  # fmt: skip


def forecast_inputs(preprocessor, history, future):
    """`future_windows` of HISTORY and HORIZON steps, and the messages of its user warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = future_windows(preprocessor, history, future, HISTORY, HORIZON)
    return result, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def daily_pair(n: int = 30) -> pd.DataFrame:
    """Two gapless daily series with a linear target."""
    times = pd.date_range("2024-01-01", periods=n, freq="D")
    return pd.concat(
        [
            pd.DataFrame({"id": s, "time": times, "y": np.arange(n) + 100.0 * k})
            for k, s in enumerate("ab")
        ],
        ignore_index=True,
    )
