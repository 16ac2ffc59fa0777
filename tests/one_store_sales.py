"""A one-store table of 40 daily sales, its dates written in a given format."""

from __future__ import annotations

import numpy as np
import pandas as pd


def _table(times: str = "%Y-%m-%d") -> pd.DataFrame:
    days = pd.date_range("2024-01-01", periods=40, freq="D")
    return pd.DataFrame({"store": "a", "date": days.strftime(times), "sales": np.arange(40.0)})
