"""A run folder whose config.json was edited by hand is refused at load, naming the key.

One tiny FP32 model (three daily stores, a categorical static `region`) is
fitted once; each test edits copies of its folder. Every edit here loaded
before and then failed deep inside `predict` or forecast with another model
(wrong scaler, shifted codes, another origin) without a word.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from flax import serialization

from tft_jax.config import TFTConfig
from tft_jax.data.preprocessing import Preprocessor
from tft_jax.forecaster import (
    DataConfig,
    Forecaster,
    ForecasterConfig,
    ModelConfig,
    RunFolderError,
    TrainingConfig,
)
from tft_jax.forecaster.run_folder import check_preprocessor

from .cli_tables import HISTORY, HORIZON, write_table

DATA = DataConfig(
    id_col="store", time_col="day", target="sales", freq="D", static_cols=("size", "region"),
    known_cols=("promo",), observed_cols=("temperature",), history=HISTORY, horizon=HORIZON,
    validation_fraction=0.15, test_fraction=0.15, categorical_cols=("region",),
)  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The folder of a tiny fitted run with a categorical static column."""
    folder = tmp_path_factory.mktemp("edits")
    table = pd.read_csv(write_table(folder / "stores.csv"))
    table["region"] = table["store"].map({"alpha": "north", "beta": "south", "gamma": "north"})
    forecaster = Forecaster(
        DATA, ModelConfig(hidden_dim=8, num_heads=2), TrainingConfig(batch_size=8, max_steps=2)
    ).fit(table, quiet=True)
    return forecaster.save(folder / "run")


def edited(saved, tmp_path, edit):
    """A copy of the run `saved` whose config.json `edit` changed."""
    folder = tmp_path / "edited"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(saved, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def refused(saved, tmp_path, edits):
    """Each `(edit of config.json's preprocessor, message)` is refused at load with it."""
    for edit, message in edits:
        folder = edited(saved, tmp_path, lambda c, edit=edit: edit(c["preprocessor"]))
        with pytest.raises(RunFolderError, match=r"config.json is damaged: .*" + message):
            Forecaster.load(folder)


def test_scaler_lists_of_another_length_non_finite_or_text_are_refused_at_load(saved, tmp_path):
    def shorter(p):  # both lists one entry short: an IndexError at the first forecast
        for key in ("loc", "scale"):
            p["target_scaler"][key] = p["target_scaler"][key][:2]

    refused(saved, tmp_path, [
        (shorter, r"preprocessor.target_scaler.loc has 2 entries, it must have one per series "
                  r"of preprocessor.series_ids \(3\)"),
        (lambda p: p["target_scaler"]["loc"].append(0.0),  # silently ignored
         r"target_scaler.loc has 4 entries"),
        (lambda p: p["target_scaler"]["scale"].__setitem__(0, None),  # NaN
         r"target_scaler.scale must be a list of numbers, got \[None"),
        (lambda p: p["target_scaler"]["scale"].__setitem__(0, "2.5"),  # read as 2.5
         r"target_scaler.scale must be a list of numbers, got \['2.5'"),
        (lambda p: p["target_scaler"]["scale"].__setitem__(0, -2.0),  # mirrored forecasts
         r"target_scaler.scale must be positive and finite, got -2.0"),
        (lambda p: p["feature_scaler"].update(loc=[0.0]),  # broadcast over both columns
         r"preprocessor.feature_scaler.loc has 1 entries, it must have one per real observed "
         r"then known column of preprocessor.spec \(2\)"),
        (lambda p: p["feature_scaler"]["scale"].__setitem__(1, 0), r"feature_scaler.scale must "
         r"be positive and finite, got 0"),
    ])  # fmt: skip


def test_real_statics_are_standardised_over_the_training_series_and_saved(saved, tmp_path):
    table = pd.read_csv(write_table(tmp_path / "stores.csv"))
    table["region"] = table["store"].map({"alpha": "north", "beta": "south", "gamma": "north"})
    sizes = table.groupby("store")["size"].first()  # one per store, stores sorted
    mean, std = sizes.mean(), sizes.std(ddof=0)
    assert std > 0
    described = json.loads((saved / "config.json").read_text())["preprocessor"]
    np.testing.assert_allclose(described["static_scaler"]["loc"], [mean], rtol=1e-12)
    np.testing.assert_allclose(described["static_scaler"]["scale"], [std], rtol=1e-12)

    def static_inputs(folder):
        """Each window's real static input and its store, as the loaded run feeds them."""
        forecaster = Forecaster.load(folder)
        dataset = forecaster.prepare(table, "test")
        windows = dataset.split("test")
        arrays = windows.arrays()
        stores = [dataset.series_ids[code] for code in arrays["series_code"]]
        return arrays["static"][:, 0], sizes.loc[stores].to_numpy(np.float64)

    fed, expected = static_inputs(saved)
    np.testing.assert_allclose(fed, (expected - mean) / std, rtol=1e-6, atol=1e-6)

    # A run saved before statics were scaled has no static_scaler: its model was
    # trained on the raw values, which it still gets.
    def as_older_run(config):
        config["preprocessor"].pop("static_scaler")
        config["format_version"] = 1

    fed, expected = static_inputs(edited(saved, tmp_path, as_older_run))
    np.testing.assert_allclose(fed, expected, rtol=1e-6)
    # A folder of format version 2 holds every key: one without it was edited (it loaded
    # and fed the raw values to a model trained on scaled ones).
    refused(
        saved,
        tmp_path,
        [
            (lambda p: p.pop("static_scaler"), r"preprocessor lacks the keys \['static_scaler'\]"),
        ],
    )
    refused(saved, tmp_path, [
        (lambda p: p["static_scaler"].update(loc=[0.0, 1.0]),
         r"preprocessor.static_scaler.loc has 2 entries, it must have one per real static "
         r"column of preprocessor.spec \(1\)"),
        (lambda p: p["static_scaler"]["scale"].__setitem__(0, 0.0),
         r"static_scaler.scale must be positive and finite, got 0.0"),
        (lambda p: p["static_scaler"].update(mean=[0.0]),
         r"preprocessor.static_scaler has the unknown keys \['mean'\]"),
    ])  # fmt: skip


def test_unknown_scaler_names_and_unknown_or_missing_keys_are_refused_at_load(saved, tmp_path):
    refused(saved, tmp_path, [
        # An unknown transform was taken as 'none', an unknown method as 'none' for new series.
        (lambda p: p["target_scaler"].update(transform="log"),
         r"preprocessor.target_scaler.transform must be one of \('none', 'log1p'\), got 'log'"),
        (lambda p: p["target_scaler"].update(method="robustt"),
         r"target_scaler.method must be one of .*got 'robustt'"),
        (lambda p: p["target_scaler"].update(tranform="log1p"),  # a typo: ignored
         r"preprocessor.target_scaler has the unknown keys \['tranform'\]"),
        (lambda p: p.update(timezone="UTC"), r"preprocessor has the unknown keys \['timezone'\]"),
        (lambda p: p.pop("feature_scaler"), r"preprocessor lacks the keys \['feature_scaler'\]"),
        (lambda p: p.update(vocabularies={}),  # a KeyError at the first forecast
         r"preprocessor.vocabularies must have one list per column of "
         r"preprocessor.spec.categorical_cols \['region'\], got \{\}"),
    ])  # fmt: skip


def test_vocabularies_and_series_ids_with_repeats_or_non_values_are_refused_at_load(
    saved, tmp_path
):
    refused(saved, tmp_path, [
        # A repeated value shifts the codes of the values after it: another embedding.
        (lambda p: p["vocabularies"].update(region=["north", "north"]),
         r"preprocessor.vocabularies.region lists 'north' more than once"),
        (lambda p: p.update(series_ids=["alpha", "alpha", "gamma"]),
         r"preprocessor.series_ids lists 'alpha' more than once"),
        (lambda p: p["vocabularies"].update(region=[["north"], "south"]),  # unhashable
         r"preprocessor.vocabularies.region must hold texts or numbers only, got \['north'\]"),
        (lambda p: p.update(series_ids="alpha"),  # read as the ids 'a', 'l', 'p', 'h', 'a'
         r"preprocessor.series_ids must be a list of texts or numbers, got 'alpha'"),
    ])  # fmt: skip


def test_origin_train_steps_flag_and_zone_edits_are_refused_at_load(saved, tmp_path):
    refused(saved, tmp_path, [
        # Read month first, as nanoseconds since 1970, or as NaT: another time_index.
        (lambda p: p.update(origin="01/02/2024"),
         r"preprocessor.origin must be an ISO 8601 time such as .*got '01/02/2024'"),
        (lambda p: p.update(origin=0), r"preprocessor.origin must be an ISO 8601 time"),
        (lambda p: p.update(origin=None), r"preprocessor.origin must be an ISO 8601 time"),
        (lambda p: p.update(train_steps=-5),
         r"preprocessor.train_steps must be a number >= 1 .*got -5"),
        (lambda p: p.update(missing_flag="false"),  # bool('false') is True
         r"preprocessor.missing_flag must be true or false, got 'false'"),
        (lambda p: p.update(time_zone="Europe/Berlin"),  # was a pandas TypeError
         r"preprocessor.time_zone is 'Europe/Berlin' but preprocessor.origin "
         r"'2024-01-01T00:00:00' has no UTC offset"),
    ])  # fmt: skip


def test_an_aware_origin_must_be_a_time_of_the_saved_zone(saved):
    described = json.loads((saved / "config.json").read_text())["preprocessor"]
    aware = dict(described, origin="2024-01-01T00:00:00+01:00", time_zone="Europe/Berlin")
    assert str(Preprocessor.from_json(aware).origin.tz) == "Europe/Berlin"
    # Another zone would read every calendar input at other hours without a word.
    with pytest.raises(
        ValueError,
        match=r"origin '2024-01-01T00:00:00\+01:00' is not a time of "
        r"preprocessor.time_zone 'America/New_York' \(its offset then is -0500\)",
    ):
        Preprocessor.from_json(dict(aware, time_zone="America/New_York"))
    with pytest.raises(ValueError, match=r"time_zone 'Mars/Base' is not a time zone pandas"):
        Preprocessor.from_json(dict(aware, time_zone="Mars/Base"))


def parts(folder):
    """The preprocessor, TFT config and settings `Forecaster.load` reads from `folder`."""
    config = json.loads((folder / "config.json").read_text())
    tft = {key: tuple(value) if isinstance(value, list) else value
           for key, value in config["tft_config"].items()}  # fmt: skip
    preprocessor = Preprocessor.from_json(config["preprocessor"])
    return preprocessor, TFTConfig(**tft), ForecasterConfig.from_json(config)


def test_a_preprocessor_that_disagrees_with_the_model_or_the_data_section_is_refused(
    saved, tmp_path
):
    check_preprocessor(*parts(saved))  # the saved run agrees with itself

    def added_series(p):  # consistent in itself; its code 4 is beyond the embedding's 4 rows
        p["series_ids"].append("zeta")
        p["target_scaler"]["loc"].append(0.0)
        p["target_scaler"]["scale"].append(1.0)

    for edit, message in (
        (lambda c: added_series(c["preprocessor"]),
         r"tft_config.static_categorical_cardinalities is \(4, 3\), the preprocessor's inputs "
         r"make \(5, 3\)"),
        (lambda c: c["preprocessor"]["vocabularies"].update(region=["east", "north", "south"]),
         r"static_categorical_cardinalities is \(4, 3\), the preprocessor's inputs make \(4, 4\)"),
        (lambda c: c["preprocessor"].update(missing_flag=True),
         r"tft_config.num_observed_features is 2, the preprocessor's inputs make 3"),
        (lambda c: c["data"].update(known_cols=[]),  # ignored: predict reads the preprocessor's
         r"preprocessor.spec.known_cols is \('promo',\), data.known_cols is \(\)"),
        (lambda c: c["data"].update(freq="h"), r"preprocessor.spec.freq is 'D', data.freq is 'h'"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            check_preprocessor(*parts(edited(saved, tmp_path, edit)))


def test_a_vocabulary_grown_past_the_model_or_a_data_section_edit_is_refused_at_load(
    saved, tmp_path
):
    # A region added to the vocabulary took a code beyond the model's embedding
    # table (JAX clamps it silently); an edited data section was ignored by predict.
    for edit, message in [
        (lambda c: c["preprocessor"]["vocabularies"]["region"].append("west"),
         r"static_categorical_cardinalities is \(4, 3\), the preprocessor.*inputs make "
         r"\(4, 4\)"),
        (lambda c: c["data"].__setitem__("freq", "h"),
         r"preprocessor.spec.freq is 'D', data.freq is 'h'"),
    ]:  # fmt: skip
        folder = edited(saved, tmp_path, edit)
        with pytest.raises(RunFolderError, match=r"config.json is damaged: .*" + message):
            Forecaster.load(folder)


def test_a_scaler_transform_or_window_normalization_edit_of_the_data_section_is_refused(
    saved, tmp_path
):
    # predict scales with the preprocessor's target scaler: an edited `scaler` or
    # `target_transform` was ignored without a word, and an edited
    # `window_normalization` fed the model windows on another scale than it learnt.
    summary = json.loads((saved / "config.json").read_text())["summary"]
    assert summary["dataset"]["window_normalization"] is True  # DataConfig's default
    for edit, message in [
        (lambda c: c["data"].update(scaler="robust"),
         r"preprocessor.target_scaler.method is 'standard', data.scaler is 'robust'"),
        (lambda c: c["data"].update(target_transform="log1p"),
         r"preprocessor.target_scaler.transform is 'none', data.target_transform is 'log1p'"),
        (lambda c: c["data"].update(window_normalization=False),
         r"data.window_normalization is False, the model was trained on windows with "
         r"window_normalization True"),
        (lambda c: c["summary"]["dataset"].update(window_normalization="yes"),
         r"summary.dataset.window_normalization must be a bool, got 'yes'"),
    ]:  # fmt: skip
        folder = edited(saved, tmp_path, edit)
        with pytest.raises(RunFolderError, match=r"config.json is damaged: .*" + message):
            Forecaster.load(folder)
    # A run saved before the summary kept the setting loads as it did.
    folder = edited(saved, tmp_path, lambda c: c["summary"]["dataset"].pop("window_normalization"))
    Forecaster.load(folder)


def test_a_model_file_with_a_nan_parameter_is_refused_at_load(saved, tmp_path):
    # `fit` never keeps a non-finite state; such a file forecast NaN without a word.
    folder = edited(saved, tmp_path, lambda config: None)
    path = folder / "models" / "fp32.msgpack"
    variables = serialization.msgpack_restore(path.read_bytes())
    kernel = np.array(variables["params"]["quantile_head"]["kernel"])
    kernel[0, 0] = np.nan
    variables["params"]["quantile_head"]["kernel"] = kernel
    path.write_bytes(serialization.msgpack_serialize(variables))
    with pytest.raises(RunFolderError, match=r"fp32.msgpack: parameter \['quantile_head'\]"
                       r"\['kernel'\] holds 1 NaN or infinite value\(s\)"):  # fmt: skip
        Forecaster.load(folder)
