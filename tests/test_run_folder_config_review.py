"""Second review of the run folder, the forecaster's settings and the allocator relaunch.

Each test failed before its fix: a QAT or int8 file with a NaN or infinite
observer range or weight scale loaded and forecast NaN without a word; a
`DataConfig` took a number as its time zone (pandas: an offset in seconds),
`None` as a column list (a `TypeError` naming no field), an unknown encoding
and a validation cut after the test cut; a program read from standard input
that asked for the tuned allocator exited at once with status 0, the rest of
it never run.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pandas as pd
import pytest
from flax import serialization

from tft_jax import allocator
from tft_jax.config import TFTConfig
from tft_jax.forecaster import (
    DataConfig,
    Forecaster,
    ForecasterConfig,
    ModelConfig,
    QATTrainingConfig,
    RunFolderError,
    TrainingConfig,
)
from tft_jax.forecaster.run_folder import check_form

from .cli_tables import HISTORY, HORIZON, write_table
from .test_allocator import PROBE

DATA = DataConfig(
    id_col="store", time_col="day", target="sales", freq="D", static_cols=("size",),
    known_cols=("promo",), observed_cols=("temperature",), history=HISTORY, horizon=HORIZON,
    validation_fraction=0.15, test_fraction=0.15,
)  # fmt: skip


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """The folder of a tiny run with all three forms, and its table."""
    folder = tmp_path_factory.mktemp("quantized")
    table = pd.read_csv(write_table(folder / "stores.csv"))
    forecaster = Forecaster(
        DATA,
        ModelConfig(hidden_dim=8, num_heads=2),
        TrainingConfig(batch_size=8, max_steps=1, validation_windows=8, time_budget=None),
        QATTrainingConfig(steps=1, calibration_batches=1, time_budget=None),
    ).fit(table, quiet=True)
    return forecaster.save(folder / "run"), table


def _with_leaf(folder, tmp_path, form, collection, leaf_name, value):
    """A copy of `folder` whose first `leaf_name` leaf of `collection` in `form` is `value`."""
    copy = tmp_path / f"{form}_{collection}_{leaf_name}"
    shutil.copytree(folder, copy)
    path = copy / "models" / f"{form}.msgpack"
    variables = serialization.msgpack_restore(path.read_bytes())
    edited = []

    def edit(key, leaf):
        if not edited and getattr(key[-1], "key", None) == leaf_name:
            edited.append(jax.tree_util.keystr(key))
            return np.full_like(leaf, value)
        return leaf

    variables[collection] = jax.tree_util.tree_map_with_path(edit, variables[collection])
    assert edited, f"{form} has no {leaf_name} in {collection}"
    path.write_bytes(serialization.msgpack_serialize(variables))
    return copy, edited[0]


@pytest.mark.parametrize(
    "form, collection, leaf_name, value",
    [
        ("qat", "quant_stats", "max", np.nan),
        ("qat", "quant_stats", "min", -np.inf),
        ("int8", "int8", "weight_scale", np.nan),
        ("int8", "quant_stats", "max", np.inf),
    ],
)
def test_a_non_finite_observer_range_or_weight_scale_is_refused_at_load(
    quantized, tmp_path, form, collection, leaf_name, value
):
    folder, table = quantized
    # The untouched run forecasts finite values with every form.
    loaded = Forecaster.load(folder)
    dataset = loaded.prepare(table)
    finite = loaded.predictions(dataset, dataset.test, [form])[form].quantiles
    assert np.isfinite(np.asarray(finite)).all()
    # Each of these damaged files loaded and made every forecast of the form NaN.
    copy, where = _with_leaf(folder, tmp_path, form, collection, leaf_name, value)
    message = rf"{form}\.msgpack: {collection}{re.escape(where)} holds \d+ NaN or infinite"
    with pytest.raises(RunFolderError, match=message):
        Forecaster.load(copy)


def test_an_observer_that_saw_no_batch_keeps_its_fresh_infinite_range():
    # `qat.calibrate` leaves an observer that saw no batch at min=+inf, max=-inf: not damage.
    params = {"dense": {"kernel": np.ones((2, 2), np.float32)}}

    def stats(low, high, batches):
        observer = {"min": np.float32(low), "max": np.float32(high)}
        return {"dense": {"dot_general": {**observer, "num_batches": np.int32(batches), "bits": 8}}}

    path = pathlib.Path("run/models/qat.msgpack")
    fresh = {"params": params, "quant_stats": stats(np.inf, -np.inf, 0)}
    check_form(fresh, "qat", TFTConfig(), 8, path)
    check_form({"params": params, "quant_stats": stats(-1.0, 2.0, 3)}, "qat", TFTConfig(), 8, path)
    for low, high, batches in ((np.inf, -np.inf, 3), (np.nan, np.nan, 0), (-1.0, np.nan, 3)):
        damaged = {"params": params, "quant_stats": stats(low, high, batches)}
        with pytest.raises(RunFolderError, match=r"quant_stats\['dense'\]\['dot_general'\]"):
            check_form(damaged, "qat", TFTConfig(), 8, path)


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


@pytest.mark.skipif(not allocator._uses_glibc(), reason="the relaunch is glibc's")
def test_a_program_read_from_standard_input_runs_on_instead_of_relaunching():
    env = {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}
    env.pop("TFT_JAX_ALLOCATOR", None)
    result = subprocess.run(
        [sys.executable, "-", "--flag", "value"],
        input=PROBE,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # The relaunched process read an exhausted standard input: the probe printed
    # "started" once and nothing after the call.
    assert result.stdout.splitlines() == ["started", "tunables None args ['--flag', 'value']"]
    assert "RuntimeWarning" in result.stderr and "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in (
        result.stderr
    )
