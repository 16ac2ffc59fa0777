"""Forecaster settings that must be refused (or normalised) before any training.

Each test but one builds configs only: a bad setting is named at
construction, never after minutes of training or at `save`. The one fits a
tiny QAT run, reads what `fit` records about it, and checks that its forecasts
run the forwards that validated it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tft_jax import Forecaster
from tft_jax.data import prepare_dataset
from tft_jax.data.tables import read_table
from tft_jax.forecaster import (
    DataConfig,
    ForecasterConfig,
    ModelConfig,
    QATTrainingConfig,
    TrainingConfig,
)
from tft_jax.train import deterministic_output

from .cli_tables import HISTORY, HORIZON, TINY_TRAINING, write_table

DATA = DataConfig(id_col="store", time_col="day", target="sales", freq="D", history=14, horizon=7)


def test_numpy_numbers_are_stored_as_plain_python_numbers():
    # np.int64 passed the checks, then qat.calibrate refused it after FP32 training
    # and json could not write it into config.json at save.
    qat = QATTrainingConfig(steps=np.int64(3), calibration_batches=np.int64(2))
    training = TrainingConfig(max_steps=np.int64(4), learning_rate=np.float32(1e-3))
    data = DataConfig(**{**DATA.__dict__, "history": np.int32(14)})
    model = ModelConfig(hidden_dim=np.int64(8), num_heads=np.int64(2))
    assert type(qat.calibration_batches) is int and type(qat.steps) is int
    assert type(training.max_steps) is int and type(training.learning_rate) is float
    assert type(data.history) is int and type(model.hidden_dim) is int
    assert training.learning_rate == pytest.approx(1e-3)
    config = ForecasterConfig(data, model, training, qat)
    json.dumps(config.to_json())  # what save writes
    # bools are still refused as numbers, and remain bools where they are flags
    with pytest.raises(TypeError, match=r"TrainingConfig.max_steps must be an int"):
        TrainingConfig(max_steps=True)
    assert DataConfig(**{**DATA.__dict__, "nonnegative": True}).nonnegative is True


@pytest.mark.parametrize(
    ("quantiles", "message"),
    [
        (0.5, r"ModelConfig.quantiles must be a sequence of levels .* got float 0.5"),
        ("0.5", r"ModelConfig.quantiles must be a sequence of levels .* got str '0.5'"),
        (None, r"ModelConfig.quantiles must be a sequence of levels .* got NoneType None"),
        (("0.1", "0.5", "0.9"), r"ModelConfig.quantiles must hold numbers, got str '0.1'"),
        ((0.1, 0.5j, 0.9), r"ModelConfig.quantiles must hold numbers, got complex 0.5j"),
        ((True, 0.5, 0.9), r"ModelConfig.quantiles must hold numbers, got bool True"),
    ],
)
def test_quantiles_of_the_wrong_type_are_named(quantiles, message):
    with pytest.raises(TypeError, match=message):
        ModelConfig(quantiles=quantiles)


def test_quantile_levels_as_a_numpy_array_or_list_are_taken():
    assert ModelConfig(quantiles=np.array([0.1, 0.5, 0.9])).quantiles == (0.1, 0.5, 0.9)
    assert ModelConfig(quantiles=[0.5, 0.9]).quantiles == (0.5, 0.9)


def test_fewer_validation_windows_than_one_batch_are_refused():
    # Validation runs in whole batches: 10 windows with batch 64 evaluated 64.
    with pytest.raises(
        ValueError,
        match=r"TrainingConfig.validation_windows must be >= TrainingConfig.batch_size \(64\)"
        r".*got 10",
    ):
        TrainingConfig(batch_size=64, validation_windows=10)
    assert TrainingConfig(batch_size=64, validation_windows=64).validation_windows == 64


def test_warmup_not_below_max_steps_is_refused_at_construction():
    with pytest.raises(
        ValueError,
        match=r"TrainingConfig.warmup_steps \(4\) must be below TrainingConfig.max_steps \(4\)",
    ):
        TrainingConfig(max_steps=4, warmup_steps=4)
    assert TrainingConfig(max_steps=4, warmup_steps=3).warmup_steps == 3
    assert TrainingConfig(warmup_steps=500).warmup_steps == 500  # the data sets the total


@pytest.mark.parametrize("name", ["time_format", "encoding"])
def test_data_text_settings_of_another_type_are_named(name):
    with pytest.raises(TypeError, match=rf"DataConfig.{name} must be a string or None, got 5"):
        DataConfig(**{**DATA.__dict__, name: 5})


def test_an_encoding_of_none_reads_a_csv_as_utf_8(tmp_path):
    # None named no codec: reading a CSV file raised a TypeError from `codecs.lookup`.
    config = DataConfig(**{**DATA.__dict__, "encoding": None})
    assert config.encoding == "utf-8"
    path = tmp_path / "caf\u00e9.csv"
    path.write_text("store,day\ncaf\u00e9,2024-01-01\n", encoding="utf-8")
    assert read_table(path, config.encoding)["store"].tolist() == ["caf\u00e9"]


@pytest.mark.parametrize(
    ("section", "value", "message"),
    [
        ("model", {"hidden_dim": 8}, r"model must be a ModelConfig, got dict"),
        ("training", 5, r"training must be a TrainingConfig, got int 5"),
        ("qat", True, r"qat must be a QATTrainingConfig or None, got bool True"),
        ("model", {}, r"model must be a ModelConfig, got dict \{\}"),  # not the default
    ],
)
def test_a_section_of_the_wrong_type_is_named(section, value, message):
    with pytest.raises(TypeError, match=message):
        Forecaster(DATA, **{section: value})
    with pytest.raises(TypeError, match=message):
        ForecasterConfig(DATA, **{section: value})


def test_qat_records_the_calibration_it_ran_and_the_layout_it_used(tmp_path):
    csv = write_table(tmp_path / "stores.csv")
    data = DataConfig(
        id_col="store", time_col="day", target="sales", freq="D", static_cols=("size",),
        known_cols=("promo",), observed_cols=("temperature",), history=HISTORY,
        horizon=HORIZON, validation_fraction=0.15, test_fraction=0.15,
    )  # fmt: skip
    qat = QATTrainingConfig(steps=3, calibration_batches=50, time_budget=None)
    forecaster = Forecaster(data, ModelConfig(hidden_dim=8, num_heads=2), TINY_TRAINING, qat)
    train = prepare_dataset(csv, **data.prepare_options()).train  # the windows fit trains on
    per_epoch = len(train) // TINY_TRAINING.batch_size
    assert per_epoch < 50
    # Fewer calibration batches than asked for is a repair: warned even when quiet.
    deterministic_output.clear_cache()  # count only the signatures this run traces
    with pytest.warns(UserWarning, match=rf"calibration_batches is 50, .* holds {per_epoch} batch"):
        forecaster.fit(csv, quiet=True)
    summary = forecaster.summary["qat"]
    assert summary["calibration_batches"] == per_epoch
    # The QAT TFT's layout is fixed; QATConfig's stand-alone layout fields (observer
    # 'minmax', per-tensor weights by default) contradicted the recorded layout.
    assert "moving-average" in summary["layout"]
    assert not {"observer", "per_channel", "symmetric", "channel_axis"} & set(summary["qat_config"])
    assert summary["qat_config"]["bits"] == 8
    assert summary["qat_config"]["calibration_batches"] == 50
    # Validation ran each model's forward on batches of the forecasts' size, placed
    # alike: forecasting the test windows compiles nothing more.
    forwards = deterministic_output._cache_size()
    forecaster.predictions(forecaster.dataset, forecaster.dataset.test, ("fp32", "qat"))
    assert deterministic_output._cache_size() == forwards


def test_quantile_levels_that_share_a_forecast_column_are_refused():
    # 0.9 and 0.9000001 are both 'q0.9': predict wrote the second over the first and
    # returned one quantile column fewer than the model has.
    with pytest.raises(
        ValueError,
        match=r"ModelConfig\.quantiles .* levels \[0.9, 0.9000001\] share the columns \['q0.9'\]",
    ):
        ModelConfig(quantiles=(0.1, 0.5, 0.9, 0.9000001))
    assert Forecaster(DATA, ModelConfig(quantiles=(0.1, 0.5, 0.9, 0.95))).config.model.quantiles[
        -1
    ] == pytest.approx(0.95)


@pytest.mark.parametrize("text", ["foo", "NaT", "2024-13-45"])
def test_a_cut_time_pandas_cannot_read_is_refused_when_the_config_is_made(text):
    # Accepted before, and refused only once a table was prepared with it.
    with pytest.raises(ValueError, match=rf"DataConfig.test_start must be a time.*{text!r}"):
        DataConfig(**{**DATA.__dict__, "validation_start": "2024-01-01", "test_start": text})
    cuts = DataConfig(
        **{**DATA.__dict__, "validation_start": "2024-01-01", "test_start": "2024-02"}
    )
    assert cuts.test_start == "2024-02"


@pytest.mark.parametrize("value", [1.00005, 1.5])
def test_max_missing_fraction_above_one_is_refused_when_the_config_is_made(value):
    # 1.00005 was accepted here and refused only by prepare_dataset; 1.5 was refused
    # as outside "[0.0, 1.0001)", a range no fraction has.
    with pytest.raises(
        ValueError, match=rf"max_missing_fraction must lie in \[0.0, 1.0\], got {value}"
    ):
        DataConfig(id_col="id", time_col="t", target="y", freq="D", max_missing_fraction=value)
    DataConfig(id_col="id", time_col="t", target="y", freq="D", max_missing_fraction=1)
