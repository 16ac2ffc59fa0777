"""The settings a run folder's config.json holds (`DataConfig`, `ForecasterConfig`).

A value pandas or json would misread is refused when the config is made, and
the fixed fields round-trip through config.json exactly.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tft_jax.forecaster import DataConfig, ForecasterConfig, QATTrainingConfig


@pytest.mark.parametrize("zone", [3, 3.0, pd.Timestamp(0, tz="UTC").tzinfo])
def test_a_time_zone_that_is_not_a_name_is_refused(zone):
    # pandas read 3 as UTC+00:00:03 (seconds); a tzinfo object failed at save, in json.
    with pytest.raises(TypeError, match=r"DataConfig\.timezone must be an IANA zone name"):
        DataConfig(id_col="s", time_col="t", target="y", freq="h", timezone=zone)
    assert DataConfig(id_col="s", time_col="t", target="y", freq="h", timezone="UTC").timezone


@pytest.mark.parametrize("name", ["static_cols", "known_cols", "observed_cols", "categorical_cols"])
@pytest.mark.parametrize("value", [None, 3])
def test_a_column_list_that_is_not_a_sequence_is_refused_by_name(name, value):
    with pytest.raises(TypeError, match=rf"DataConfig\.{name} must be a list of column names"):
        DataConfig(id_col="s", time_col="t", target="y", freq="h", **{name: value})


def test_an_unknown_encoding_is_refused_when_the_config_is_made():
    with pytest.raises(ValueError, match=r"DataConfig\.encoding 'utf-99' is not a text encoding"):
        DataConfig(id_col="s", time_col="t", target="y", freq="h", encoding="utf-99")
    assert DataConfig(id_col="s", time_col="t", target="y", freq="h", encoding="latin-1")


def test_a_validation_cut_after_the_test_cut_is_refused_when_the_config_is_made():
    options = dict(id_col="s", time_col="t", target="y", freq="D")
    with pytest.raises(ValueError, match=r"validation_start \(2024-03-02\) must not be after"):
        DataConfig(**options, validation_start="2024-03-02", test_start="2024-03-01")
    # Equal cuts (no validation period) are `prepare_dataset`'s to judge, as are cuts of
    # which only one names a zone (compared in the table's zone).
    DataConfig(**options, validation_start="2024-03-01", test_start="2024-03-01")
    DataConfig(**options, validation_start="2024-03-02", test_start="2024-03-01T12:00+00:00")


def test_the_fixed_fields_round_trip_through_config_json_exactly():
    data = DataConfig(
        id_col="s", time_col="t", target="y", freq="h", timezone="Europe/Paris",
        static_cols=["a"], encoding="latin-1", validation_start="2024-03-01",
        test_start="2024-03-02",
    )  # fmt: skip
    config = ForecasterConfig(data=data, qat=QATTrainingConfig(bits=4))
    assert ForecasterConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
