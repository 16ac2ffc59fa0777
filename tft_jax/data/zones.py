"""Reading a fitted model's new tables in the zone its training times were in.

A model fitted on times of a zone with daylight saving (Berlin midnights)
steps its grid by local days. The same instants given in another zone (UTC
from a database) are read in the training zone before gridding, so they land
on that grid; the results are then given back in the zone the table held.
"""

from __future__ import annotations

import dataclasses
import datetime
import warnings
from typing import Any

import pandas as pd

from tft_jax.caller_frame import user_stacklevel
from tft_jax.data.preprocessing import Preprocessor
from tft_jax.data.tables import TableSpec, _is_aware, typical_step
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
            _warn_off_the_days(present, preprocessor, spec)
    return dataclasses.replace(spec, timezone=zone) if aware else spec


def _warn_off_the_days(texts: pd.Series, preprocessor: Preprocessor, spec: TableSpec) -> None:
    """Warns when aware time texts, read in the training zone, fall off its time of day.

    A model fitted on texts of one offset ('2024-01-01T00:00:00+01:00', a
    winter) keeps that offset as its zone ('UTC+01:00'): the texts named no
    zone. Summer texts of the same local midnights ('+02:00') are 23:00 the
    day before in it, so the forecast times and calendar inputs move by a
    day, silently. Checked for steps of a day or more, against the clock
    time of the training table's first time; texts that land on it (the same
    midnights written in UTC, say) pass.
    """
    zone, origin = preprocessor.time_zone, preprocessor.origin
    if origin is None:
        return
    if typical_step(spec.freq) < pd.Timedelta(days=1):
        _warn_other_local_offsets(texts, pd.Timestamp(origin), spec)
        return
    try:
        instants = pd.to_datetime(texts, utc=True, format=spec.time_format)
    except (TypeError, ValueError):  # left to the table's own reading, which names it
        return
    local = pd.DatetimeIndex(instants).tz_convert(zone)
    anchor = pd.Timestamp(origin).tz_convert(zone) if pd.Timestamp(origin).tz else None
    if anchor is None:
        return
    clock = local - local.normalize()
    off = clock != (anchor - anchor.normalize())
    if off.any():
        first = int(off.argmax())
        warnings.warn(
            f"{spec.time_col!r} holds {texts.iloc[first]!r}, which is {local[first]} in the "
            f"model's zone {zone}: off the clock time of its training days "
            f"({anchor.time()}), so the forecast times and calendar inputs move with it "
            f"({int(off.sum())} such times). A zone taken from texts of one UTC offset names no "
            "daylight saving: give the times at the training offset, or refit on times "
            "localized in their zone (e.g. pd.to_datetime(df[col], utc=True)"
            ".dt.tz_convert('Europe/Berlin'))",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


# A UTC offset at the end of a time text: '+02:00', '-0530', or 'Z' (UTC).
_TEXT_OFFSET = r"([+-]\d{2}:?\d{2}|Z)\s*$"


def _warn_other_local_offsets(texts: pd.Series, origin: pd.Timestamp, spec: TableSpec) -> None:
    """Warns when sub-daily texts carry a local offset other than a fixed-offset training zone's.

    A model fitted on texts of one offset ('+01:00', a winter) reads hours on
    that fixed clock ('UTC+01:00'), the clock its hour-of-day inputs were
    learnt on. Texts of another local offset ('+02:00', a summer of a zone
    with daylight saving) are the right instants, but their 09:00 is 08:00 on
    that clock: the calendar inputs move by the offsets' difference, silently.
    UTC texts ('Z', '+00:00') name no local clock and pass. So does a model
    in UTC: texts of mixed offsets are read in UTC, so its training texts
    named no one clock either.
    """
    zone = origin.tz
    # A named zone's clock follows its own rules.
    if not isinstance(zone, datetime.timezone) or not origin.utcoffset():
        return
    found = texts.astype(str).str.extract(_TEXT_OFFSET, expand=False)
    offsets = found.str.replace(":", "", regex=False)
    own = origin.strftime("%z")
    other = offsets.notna() & ~offsets.isin([own, "Z", "+0000", "-0000"])
    if other.any():
        first = int(other.to_numpy().argmax())
        warnings.warn(
            f"{spec.time_col!r} holds {texts.iloc[first]!r}, at UTC offset {found.iloc[first]}, "
            f"while the model's zone is the fixed offset {zone} of its training texts "
            f"({int(other.sum())} such times): its hour-of-day and other calendar inputs are "
            "read on that clock, an hour off where the offsets differ by daylight saving. A zone "
            "taken from texts of one UTC offset names no daylight saving: refit on times "
            "localized in their zone (e.g. pd.to_datetime(df[col], utc=True)"
            ".dt.tz_convert('Europe/Berlin'))",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


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
