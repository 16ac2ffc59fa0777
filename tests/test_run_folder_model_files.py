"""A run folder's model files checked at load: a non-finite observer range or scale is refused.

A QAT or int8 file whose observer range or weight scale is NaN or infinite is
refused naming the leaf; an observer that saw no batch keeps its fresh infinite
range. One tiny run with all three forms is fitted once; each test edits copies.
"""

from __future__ import annotations

import pathlib
import re
import shutil

import jax
import numpy as np
import pandas as pd
import pytest
from flax import serialization

from tft_jax.config import TFTConfig
from tft_jax.forecaster import (
    DataConfig,
    Forecaster,
    ModelConfig,
    QATTrainingConfig,
    RunFolderError,
    TrainingConfig,
)
from tft_jax.forecaster.run_folder import check_form

from .cli_tables import HISTORY, HORIZON, write_table

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
