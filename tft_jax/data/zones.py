"""Reading a fitted model's new tables in the zone its training times were in.

A model fitted on times of a zone with daylight saving (Berlin midnights)
steps its grid by local days. The same instants given in another zone (UTC
from a database) are read in the training zone before gridding, so they land
on that grid; the results are then given back in the zone the table held.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd

from tft_jax.data.preprocessing import Preprocessor
from tft_jax.data.tables import TableSpec, _is_aware
from tft_jax.data.windows import Panel


def in_training_zone(
    spec: TableSpec, preprocessor: Preprocessor, times: pd.Series | None
) -> TableSpec:
    """`spec` reading aware `times` in the training table's zone when no `timezone` is set.

    The same instants given in another zone are then gridded and stepped as
    the training times were: UTC instants of Berlin midnights move by an hour
    across a daylight-saving change, off a UTC daily grid, and the steps would
    be 24-hour UTC days. Naive times keep `spec` (and are refused by
    `Preprocessor.check_time_zone`), and so does a table without the time
    column (`times` None), which the table's validation then names.
    """
    zone = preprocessor.time_zone
    if spec.timezone is not None or zone is None or times is None:
        return spec
    if isinstance(times.dtype, pd.DatetimeTZDtype):
        aware = True
    else:
        present = times.dropna()
        aware = bool(len(present)) and bool(
            _is_aware(present.iloc[0], spec.time_format, spec.dayfirst)
        )
    return dataclasses.replace(spec, timezone=zone) if aware else spec


def zone_to_give_back(spec: TableSpec, reading: TableSpec, times: pd.Series) -> Any | None:
    """The zone results go back in: that of an aware column read in another zone, else None.

    Only a datetime column carries a zone of its own; texts with UTC offsets
    ('2024-03-31T22:00+00:00') name an offset, not a zone, and stay in the
    training zone.
    """
    if reading is not spec and isinstance(times.dtype, pd.DatetimeTZDtype):
        return times.dtype.tz
    return None


def panel_in_zone(panel: Panel, zone: Any) -> Panel:
    """`panel` with its times (the same instants) in `zone`."""
    return dataclasses.replace(panel, times=panel.times.tz_convert(zone))


def frame_in_zone(frame: pd.DataFrame, time_col: str, zone: Any) -> pd.DataFrame:
    """`frame` with its `time_col` (the same instants) in `zone`."""
    return frame.assign(**{time_col: frame[time_col].dt.tz_convert(zone)})
