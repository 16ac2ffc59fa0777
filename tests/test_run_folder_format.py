"""The run folder's format version: what each version's config.json holds, and which
versions `Forecaster.load` reads."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest

import tft_jax
from tft_jax.config import TFTConfig
from tft_jax.data.preprocessing import Preprocessor
from tft_jax.data.tables import TableSpec
from tft_jax.forecaster import RunFolderError, run_folder
from tft_jax.forecaster.config import SECTIONS

# config.json's fields at format version 4, by section. A change to them (a field added,
# renamed or removed) must raise `run_folder.FORMAT_VERSION`, list an added field in
# `run_folder.FIELDS_ADDED` under the new version with the value that means what older
# folders did, and then update this record.
FORMAT_4_FIELDS = {
    "data": (
        "id_col", "time_col", "target", "freq", "static_cols", "known_cols", "observed_cols",
        "timezone", "history", "horizon", "validation_fraction", "test_fraction",
        "validation_start", "test_start", "scaler", "train_stride", "season_period",
        "categorical_cols", "time_format", "dayfirst", "encoding", "max_missing_fraction",
        "min_series_length", "target_transform", "window_normalization", "nonnegative",
        "require_observed_target",
    ),
    "model": (
        "hidden_dim", "num_heads", "dropout_rate", "variable_hidden_dim", "compact_selection",
        "quantiles",
    ),
    "training": (
        "epochs", "max_steps", "time_budget", "batch_size", "learning_rate", "warmup_steps",
        "clip_norm", "weight_decay", "patience", "eval_every", "validation_windows", "seed",
        "eval_batch_size",
    ),
    "qat": (
        "bits", "steps", "learning_rate", "calibration_batches", "observer_steps",
        "time_budget",
    ),
    "tft_config": (
        "num_static_features", "num_known_features", "num_observed_features", "hidden_dim",
        "num_heads", "sequence_length", "prediction_horizon", "quantiles", "dropout_rate",
        "static_categorical_cardinalities", "variable_hidden_dim", "compact_selection",
        "attend_to_self", "use_known_history", "dtype", "param_dtype",
        "known_categorical_cardinalities", "observed_categorical_cardinalities",
    ),
    "preprocessor.spec": (
        "id_col", "time_col", "target", "static_cols", "known_cols", "observed_cols", "freq",
        "timezone", "categorical_cols", "time_format", "dayfirst",
    ),
}  # fmt: skip


def _init_fields(kind: type) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(kind) if field.init)


def test_config_json_holds_the_fields_of_this_format_version():
    # A field added without raising the version was refused as "damaged" by every older
    # tft-jax (the dataclasses refuse unknown keys), which read the folder's version as
    # one they knew.
    assert run_folder.FORMAT_VERSION == 4, "update FORMAT_4_FIELDS's name and the record"
    found = {
        name: _init_fields(kind) for name, kind in {**SECTIONS, "tft_config": TFTConfig}.items()
    }
    found["preprocessor.spec"] = _init_fields(TableSpec)
    assert found == FORMAT_4_FIELDS
    assert _init_fields(Preprocessor)[0] == "spec"


def test_every_field_added_after_version_1_is_a_field_of_its_section():
    known = {f"{name}.{field}" for name, fields in FORMAT_4_FIELDS.items() for field in fields}
    for version, fields in run_folder.FIELDS_ADDED.items():
        assert 1 < version <= run_folder.FORMAT_VERSION
        assert set(fields) <= known, set(fields) - known
    assert run_folder.fields_absent_before(run_folder.FORMAT_VERSION) == {}
    assert run_folder.fields_absent_before(1)["data.window_normalization"] is False
    # Folders of versions 1 and 2 left out every window with a filled target in its horizon.
    assert run_folder.fields_absent_before(2) == {"data.require_observed_target": True}


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_every_version_up_to_this_one_is_read(version):
    config = {"format": run_folder.FORMAT, "format_version": version}
    assert run_folder.check_format(config, pathlib.Path("run")) == version


@pytest.mark.parametrize(
    "format_name, version, advice",
    [("tft-jax-forecaster", 5, "Upgrade tft-jax to load it"),
     ("tft-jax-forecaster", 0, "Load it with the tft-jax that wrote it"),
     ("tft-jax-forecaster", True, "Load it with the tft-jax that wrote it"),
     ("tft-jax-forecaster", "2", "Load it with the tft-jax that wrote it"),
     ("tft-jax-forecaster", 2.0, "Load it with the tft-jax that wrote it"),
     ("another-format", 1, "Load it with the tft-jax that wrote it")],
)  # fmt: skip
def test_another_format_or_version_is_refused_naming_both_versions(format_name, version, advice):
    config = {
        "format": format_name,
        "format_version": version,
        "versions": {"tft_jax": "9.1"},
    }
    with pytest.raises(
        RunFolderError,
        match=rf"run/config.json is format '{format_name}' version {re.escape(repr(version))}, "
        rf"trained with tft-jax 9.1; this tft-jax \({re.escape(tft_jax.__version__)}\) reads "
        rf"'tft-jax-forecaster' versions 1 to 4. {advice}, or train again",
    ):
        run_folder.check_format(config, pathlib.Path("run"))


def test_digests_and_summary_are_required_from_version_2_on():
    config = {"format": run_folder.FORMAT, "format_version": 2}
    run_folder.check_complete(config, 1)
    with pytest.raises(
        ValueError,
        match=r"models_sha256, summary are missing from a folder of format version 2",
    ):
        run_folder.check_complete(config, 2)
    run_folder.check_complete({**config, "models_sha256": {}, "summary": {}}, 2)


# R05: run_folder.py writer: a saved_by whose tft_jax is no string (a hand edit) taken for
# the writer ("saved by tft-jax None") instead of falling back to the trainer's version.
def test_the_writer_named_is_the_saver_else_the_trainer_and_only_by_a_version_text():
    trained = {"versions": {"tft_jax": "0.2"}}
    assert run_folder.writer({**trained, "saved_by": {"tft_jax": "0.3"}}) == "saved by tft-jax 0.3"
    for saved_by in ({"tft_jax": None}, {"tft_jax": 3}, "0.3", None):
        assert run_folder.writer({**trained, "saved_by": saved_by}) == "trained with tft-jax 0.2"
    assert run_folder.writer({"versions": {"tft_jax": 2}}) == (
        "written by an unknown version of tft-jax"
    )
