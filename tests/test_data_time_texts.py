"""Times written as text: day-first tables, a time format, and cut times read like the table.

References: the dates the texts stand for, built with `pd.date_range`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.forecaster import DataConfig

DAYS = pd.date_range("2024-01-01", periods=100, freq="D")


def prepare(times: pd.Index, **options: Any) -> Any:
    """`prepare_dataset` of one daily series whose time column holds `times`."""
    table = pd.DataFrame({"id": "a", "time": times, "y": np.sin(np.arange(len(times)) / 4.0)})
    return prepare_dataset(
        table, id_col="id", time_col="time", target="y", freq="D", history=7, horizon=3,
        **options,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("texts", "options", "cuts"),
    [
        (DAYS.strftime("%d/%m/%Y"), {"dayfirst": True}, ("02/03/2024", "21/03/2024")),
        (DAYS.strftime("%d.%m.%Y"), {"time_format": "%d.%m.%Y"}, ("02.03.2024", "21.03.2024")),
        (DAYS.strftime("%d.%m.%Y"), {"time_format": "%d.%m.%Y"}, ("2024-03-02", "2024-03-21")),
    ],
)
def test_cut_times_are_read_as_the_tables_times(texts, options, cuts):
    # '02/03/2024' was read month first (3 February) while the table was read day first:
    # the run trained on a third of its training period without a word.
    dataset = prepare(texts, **options, validation_start=cuts[0], test_start=cuts[1])
    assert dataset.validation_start == pd.Timestamp("2024-03-02")
    assert dataset.test_start == pd.Timestamp("2024-03-21")


def test_a_data_config_compares_its_cuts_as_the_table_reads_them():
    names = {"id_col": "id", "time_col": "time", "target": "y", "freq": "D"}
    config = DataConfig(
        **names, dayfirst=True, validation_start="21/03/2024", test_start="02/04/2024"
    )  # 2 April: refused as 4 February, before the validation start
    assert config.test_start == "02/04/2024"
    with pytest.raises(ValueError, match=r"validation_start \(02/04/2024\) must not be after"):
        dataclasses.replace(config, validation_start="02/04/2024", test_start="21/03/2024")


def test_iso_dates_are_read_as_iso_when_dayfirst_is_set():
    # A run trained with --dayfirst reads a history from a database in ISO dates:
    # pandas read '2024-01-13' year-day-month and the table was refused as mixing formats.
    dataset = prepare(DAYS.strftime("%Y-%m-%d"), dayfirst=True)
    assert dataset.train.panel.times.equals(prepare(DAYS).train.panel.times)


def test_day_first_dates_with_dots_get_a_hint_with_dots_that_works():
    texts = DAYS.strftime("%d.%m.%Y")
    with pytest.raises(
        ValueError,
        match=r"column 'time' has times that do not read in the format of its first time "
        r"'01.01.2024', e.g. '13.01.2024' in series 'a' at row 12; .* pass dayfirst=True "
        r"\(--dayfirst\) or time_format='%d.%m.%Y' \(--time-format\)",
    ):
        prepare(texts)
    assert prepare(texts, time_format="%d.%m.%Y").train.panel.times.equals(
        prepare(DAYS).train.panel.times
    )
