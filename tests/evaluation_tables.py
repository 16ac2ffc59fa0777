"""The evaluation tests' table: three daily shops at very different levels, one with a gap,
and how they prepare it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tft_jax.data import PreparedDataset, prepare_dataset

QUANTILES = (0.1, 0.5, 0.9)
HISTORY, HORIZON = 14, 7


def make_table(seed: int = 0) -> pd.DataFrame:
    """Three daily series at very different levels, one with a gap."""
    rng = np.random.default_rng(seed)
    frames = []
    for code, (name, level) in enumerate({"a": 10.0, "b": 200.0, "c": 5000.0}.items()):
        times = pd.date_range("2024-01-01", periods=90, freq="D")
        values = level * (1 + 0.3 * np.sin(2 * np.pi * np.arange(90) / 7))
        values = values + rng.normal(scale=0.05 * level, size=90)
        frame = pd.DataFrame({"shop": name, "day": times, "sales": values})
        if code == 1:
            frame = frame.drop(index=[30, 31])
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def prepare(
    table: pd.DataFrame | None = None, id_col: str = "shop", time_col: str = "day", **options
) -> PreparedDataset:
    """`table` (default `make_table()`) prepared with the tests' spec and splits (plus
    `options`)."""
    return prepare_dataset(
        make_table() if table is None else table,
        id_col=id_col,
        time_col=time_col,
        target="sales",
        freq="D",
        history=HISTORY,
        horizon=HORIZON,
        validation_fraction=0.2,
        test_fraction=0.2,
        **options,
    )
