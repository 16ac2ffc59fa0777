"""Reading a fitted model's new tables in the zone its training times were in.

A model fitted on times of a zone with daylight saving (Berlin midnights)
steps its grid by local days. The same instants given in another zone (UTC
from a database) are read in the training zone before gridding, so they land
on that grid; the results are then given back in the zone the table held.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
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
        if aware:
            _warn_other_offsets(present, zone, spec.time_col)
    return dataclasses.replace(spec, timezone=zone) if aware else spec


# A zone read from ISO texts is their offset ('UTC+01:00'): the texts named no zone.
_FIXED_OFFSET_ZONE = re.compile(r"^UTC[+-]\d{2}:\d{2}$")
_TEXT_OFFSET = re.compile(r"(Z|[+-]\d{2}:?\d{2})$")


def _warn_other_offsets(texts: pd.Series, zone: str, column: str) -> None:
    """Warns when time texts carry other UTC offsets than a fixed-offset training zone.

    A model fitted on texts of one offset ('2024-01-01T00:00:00+01:00', a
    winter) keeps that offset as its zone; summer texts of the same local
    midnights ('+02:00') are the same instants at 23:00 the day before in it,
    so the forecast times and the calendar inputs move by a day, silently.
    """
    if not isinstance(zone, str) or not _FIXED_OFFSET_ZONE.match(zone):
        return
    found = texts.astype(str).str.strip().str.extract(_TEXT_OFFSET, expand=False).dropna()
    expected = pd.Timestamp(0, tz=zone).utcoffset()
    others = sorted(
        {
            text
            for text in found.unique()
            if pd.Timestamp(0, tz=_offset_zone(text)).utcoffset() != expected
        }
    )
    if others:
        warnings.warn(
            f"{column!r} holds times with UTC offsets {others}, but the model's zone is the "
            f"fixed offset {zone} (its training table gave texts of that offset, which name no "
            f"zone): they are read in {zone}, where a midnight at another offset is another "
            "clock time, so the forecast times and calendar inputs move with it. Give the times "
            f"at offset {zone[3:]}, or refit on times localized in their zone (e.g. "
            "pd.to_datetime(df[col], utc=True).dt.tz_convert('Europe/Berlin'))",
            UserWarning,
            stacklevel=4,
        )


def _offset_zone(text: str) -> str:
    """'+02:00', '+0200' or 'Z' as a zone pandas reads ('UTC+02:00', 'UTC')."""
    if text == "Z":
        return "UTC"
    digits = text.replace(":", "")
    return f"UTC{digits[0]}{digits[1:3]}:{digits[3:5]}"


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
