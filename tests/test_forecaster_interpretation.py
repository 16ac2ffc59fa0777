"""`Forecaster.interpretation` checked against the model's own outputs recomputed here:
the fitted model applied to every window of the split, averaged with NumPy over the
documented axes."""

from __future__ import annotations

import copy
import dataclasses

import jax
import numpy as np
import pandas as pd
import pytest

from tft_jax.evaluation import Predictions, to_batch
from tft_jax.forecaster.interpretation import interpretation_tables
from tft_jax.model import TemporalFusionTransformer
from tft_jax.train_state import model_inputs

from .cli_tables import HISTORY, HORIZON
from .forecaster_stores import fitted_stores


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """`(forecaster, table)`: the small fitted stores model (fp32 only)."""
    forecaster, table, _ = fitted_stores(tmp_path_factory.mktemp("forecaster_interpretation"))
    return forecaster, table


def _raw_outputs(forecaster, dataset, split):
    """The fp32 model's outputs on every window of `split`, as float64 arrays."""
    windows = dataset.split(split)
    args, kwargs = model_inputs(to_batch(windows.take(np.arange(len(windows)))))
    model = TemporalFusionTransformer(forecaster.tft_config)
    output = model.apply(forecaster.variables["fp32"], *args, deterministic=True, **kwargs)
    names = ("attention", "static_weights", "history_weights", "future_weights")
    return {name: np.asarray(getattr(output, name), dtype=np.float64) for name in names}


@pytest.mark.parametrize("split", ["test", "validation"])
def test_interpretation_matches_the_model_outputs_averaged_over_the_documented_axes(stores, split):
    forecaster, table = stores
    dataset = forecaster.prepare(table, split)
    raw = _raw_outputs(forecaster, dataset, split)
    # A batch size that does not divide the windows: the padded last batch must not count.
    assert len(dataset.split(split)) % 4
    tables = forecaster.interpretation(table, split=split, batch_size=4)
    assert list(tables) == ["static", "history", "future", "attention"]

    history_names = (
        dataset.history_weight_names
        if forecaster.tft_config.use_known_history
        else dataset.observed_weight_names
    )
    expected = {
        "static": (dataset.static_weight_names, raw["static_weights"].mean(axis=0)),
        "history": (history_names, raw["history_weights"].mean(axis=(0, 1))),
        "future": (dataset.future_weight_names, raw["future_weights"].mean(axis=(0, 1))),
    }
    for group, (names, weights) in expected.items():
        got = tables[group]
        assert list(got.columns) == ["variable", "weight"], group
        assert list(got["variable"]) == list(names), group  # the model's order
        assert len(names) > 0, group
        np.testing.assert_allclose(got["weight"].to_numpy(), weights, atol=1e-6, err_msg=group)
        assert got["weight"].sum() == pytest.approx(1.0, abs=1e-5), group

    attention = tables["attention"]
    assert attention.shape == (HORIZON, HISTORY + HORIZON)
    assert list(attention.index) == list(range(1, HORIZON + 1))
    assert attention.index.name == "horizon" and attention.columns.name == "position"
    assert list(attention.columns) == [*range(-HISTORY, 0), *range(HORIZON)]
    np.testing.assert_allclose(attention.to_numpy(), raw["attention"].mean(axis=(0, 1)), atol=1e-6)
    np.testing.assert_allclose(attention.sum(axis=1), 1.0, atol=1e-5)
    # Causal: horizon step h (decoder position h-1) puts no weight on positions h..H-1.
    for step in attention.index:
        later = [p for p in attention.columns if p >= step]
        np.testing.assert_array_equal(attention.loc[step, later].to_numpy(), 0.0)
    assert (attention.loc[:, -HISTORY:-1].to_numpy() > 0).all()


def test_interpretation_takes_a_prepared_dataset_as_evaluate_does(stores):
    forecaster, table = stores
    from_table = forecaster.interpretation(table)
    from_dataset = forecaster.interpretation(forecaster.prepare(table, "test"), "test")
    for name, frame in from_table.items():
        pd.testing.assert_frame_equal(frame, from_dataset[name], check_exact=False, atol=1e-9)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"split": "tst"}, r"split must be one of \('train', 'validation', 'test'\), got 'tst'"),
        ({"model": "bf16"}, r"model must be one of \('fp32', 'qat', 'int8'\), got 'bf16'"),
        ({"model": "int8"}, r"model='int8' was not trained: this forecaster has \('fp32',\)"),
        ({"batch_size": 0}, r"interpretation: batch_size must be an int >= 1, got 0"),
        ({"batch_size": 2.0}, r"interpretation: batch_size must be an int >= 1, got 2.0"),
    ],
)
def test_interpretation_refuses_bad_arguments_naming_them(stores, arguments, message):
    forecaster, table = stores
    with pytest.raises(ValueError, match=message):
        forecaster.interpretation(table, **arguments)


def test_interpretation_tables_refuses_labels_that_do_not_match_the_weights():
    predictions = Predictions(
        quantiles=np.zeros((1, 2, 3)),
        attention=np.full((2, 5), 0.2),
        static_weights=np.array([1.0]),
        history_weights=np.array([0.5, 0.5]),
        future_weights=np.array([1.0]),
    )
    tables = interpretation_tables(predictions, ["size"], ["y", "promo"], ["promo"], 3)
    assert list(tables["attention"].columns) == [-3, -2, -1, 0, 1]
    with pytest.raises(ValueError, match=r"history weights: 1 variable names \['y'\]"):
        interpretation_tables(predictions, ["size"], ["y"], ["promo"], 3)
    with pytest.raises(ValueError, match=r"attention must have shape \(H, T\+H\) with T=4"):
        interpretation_tables(predictions, ["size"], ["y", "promo"], ["promo"], 4)


@pytest.mark.parametrize("poisoned", ["history_selection", "attention"])
def test_interpretation_of_a_diverged_model_is_refused_naming_the_table(stores, poisoned):
    """NaN parameters gave tables of NaN weights silently (evaluate refuses the forecasts)."""
    forecaster, table = stores
    diverged = copy.copy(forecaster)
    variables = forecaster.variables["fp32"]
    nan = lambda layer: jax.tree.map(lambda leaf: leaf * np.nan, layer)  # noqa: E731
    params = {
        name: nan(layer) if name.startswith(poisoned) else layer
        for name, layer in variables["params"].items()
    }
    assert any(name.startswith(poisoned) for name in params)
    diverged._fitted = dataclasses.replace(
        forecaster._fitted, variables={"fp32": {**variables, "params": params}}
    )
    diverged._predictors = {}
    group = "history selection weights" if poisoned == "history_selection" else "attention"
    with pytest.raises(ValueError, match=rf"interpretation: the fp32 model's {group} on the test"):
        diverged.interpretation(table)
    assert np.isfinite(forecaster.interpretation(table)["history"]["weight"]).all()
