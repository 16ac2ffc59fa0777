"""`Forecaster`: forecasts after the end of the data, save/load, evaluation, bad input.

One tiny FP32 model is fitted once on the synthetic stores table (three
daily series, a known promotion column, an observed temperature, a static
size); every test reads it. The QAT and int8 forms are exercised through the
CLI's trained run in `tests/test_cli.py`.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import hashlib
import json
import pathlib
import pickle
import shutil
import warnings

import jax
import numpy as np
import pandas as pd
import pytest
from flax import serialization

from tft_jax.checkpoint import TrainingCheckpointer
from tft_jax.config import TFTConfig
from tft_jax.data import WindowSet, prepare_dataset
from tft_jax.data.tables import TableContentError
from tft_jax.evaluation import to_original_units
from tft_jax.forecaster import (
    DataConfig,
    Forecaster,
    ForecasterConfig,
    ModelConfig,
    QATTrainingConfig,
    RunFolderError,
)
from tft_jax.forecaster import forecaster as forecaster_module
from tft_jax.forecaster.forecaster import BATCH_STREAM_FILE, _check_batch_stream, monotone
from tft_jax.forecaster.run_folder import (
    EarlierResultsWarning,
    RunFolderWriteError,
    check_params,
    earlier_results,
    load_variables,
    model_param_shapes,
    save_variables,
)
from tft_jax.model import TemporalFusionTransformer

from .cli_tables import HISTORY, HORIZON, TINY_TRAINING
from .forecaster_stores import DATA, QUANTILES, cut, fitted_stores
from .tracing import recorded_traces


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """`(forecaster, table, saved folder)`; the training CSV is deleted after fitting."""
    folder = tmp_path_factory.mktemp("forecaster")
    fitted = fitted_stores(folder)
    (folder / "stores.csv").unlink()
    return fitted


def test_forecasts_start_one_step_after_each_series_end_and_survive_save_and_load(fitted):
    forecaster, table, saved = fitted
    history, future = cut(table, "2024-03-30")
    history = history[~((history["store"] == "beta") & (history["day"] >= "2024-03-27"))]
    future = pd.concat(
        [
            future[future["store"] != "beta"],
            table[(table["store"] == "beta") & table["day"].between("2024-03-27", "2024-04-02")][
                ["store", "day", "promo"]
            ],
        ]
    )
    forecast = forecaster.predict(history, future)
    assert list(forecast.columns) == ["store", "day", *QUANTILES]
    for store, rows in forecast.groupby("store"):
        last = pd.Timestamp(history[history["store"] == store]["day"].max())
        expected = pd.date_range(last + pd.Timedelta(days=1), periods=HORIZON, freq="D")
        np.testing.assert_array_equal(pd.DatetimeIndex(rows["day"]), expected)
    values = forecast[QUANTILES].to_numpy()
    assert np.isfinite(values).all()
    assert (np.diff(values, axis=1) >= 0).all()
    loaded = Forecaster.load(saved)  # the training CSV is gone
    pd.testing.assert_frame_equal(loaded.predict(history, future), forecast)


def test_a_forecaster_that_has_predicted_pickles_and_copies_and_forecasts_the_same(fitted):
    # Its compiled predictors (closures over jitted programs) made pickle fail after
    # the first forecast, while a fresh forecaster pickled.
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    forecast = forecaster.predict(history, future)
    assert forecaster._predictors  # predicted: compiled predictors are cached
    for copied in (pickle.loads(pickle.dumps(forecaster)), copy.deepcopy(forecaster)):
        pd.testing.assert_frame_equal(copied.predict(history, future), forecast)
    assert forecaster._predictors  # the original keeps its own


def test_settings_the_model_was_not_fitted_with_are_refused_until_it_is_fitted_again(fitted):
    # A notebook cell that set `config` after fit (window normalization off, say) moved
    # forecasts by up to 1.4 on a level of 14.5 and evaluate's scores without a word, and
    # save wrote a folder that load refused as "edited by hand".
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    expected = forecaster.predict(history, future)
    edited = copy.copy(forecaster)  # shares the fitted model, not the `config` attribute
    settings = forecaster.config
    edited.config = dataclasses.replace(
        settings, data=dataclasses.replace(settings.data, window_normalization=False)
    )
    message = (
        r"Forecaster.config holds other settings than its model was fitted with "
        r"\(DataConfig.window_normalization True then, False now\); call fit to train"
    )
    for use in (
        lambda: edited.predict(history, future),
        lambda: edited.evaluate(table),
        lambda: edited.save(pathlib.Path("never-written")),
    ):
        with pytest.raises(ValueError, match=message):
            use()
    assert not pathlib.Path("never-written").exists()
    edited.config = dataclasses.replace(
        settings, model=dataclasses.replace(settings.model, quantiles=(0.2, 0.5, 0.9))
    )
    with pytest.raises(ValueError, match=r"ModelConfig.quantiles \(0.1, 0.5, 0.9\) then, "):
        edited.predict(history, future)
    # What is read only when forecasting may change: the batch, how tables are read.
    edited.config = dataclasses.replace(
        settings,
        data=dataclasses.replace(settings.data, encoding="latin-1", max_missing_fraction=0.9),
        training=dataclasses.replace(settings.training, eval_batch_size=2),
    )
    pd.testing.assert_frame_equal(edited.predict(history, future), expected)
    with pytest.raises(TypeError, match=r"config must be a ForecasterConfig, got str"):
        edited.config = "settings"


def test_a_qat_section_set_after_an_fp32_fit_is_refused(fitted, tmp_path):
    # A resume may add it; a fitted FP32 model saved with it claimed to be QAT-trained.
    forecaster, table, _ = fitted
    edited = copy.copy(forecaster)
    edited.config = dataclasses.replace(forecaster.config, qat=QATTrainingConfig())
    with pytest.raises(ValueError, match=r"ForecasterConfig.qat None then, QAT settings now"):
        edited.save(tmp_path / "run")
    with pytest.raises(ValueError, match=r"ForecasterConfig.qat None then"):
        edited.predict(*cut(table, "2024-03-30"))


def test_variables_summary_and_history_are_copies_an_edit_of_which_changes_nothing(fitted):
    # Edits of the returned dicts reached the forecaster: its cached predictor kept the old
    # parameters while pickle and save took the edited ones.
    forecaster, _, _ = fitted
    variables, summary, history = forecaster.variables, forecaster.summary, forecaster.history
    variables["fp32"]["params"].clear()
    summary["fp32"]["steps_trained"] = -1
    next(iter(history.values())).clear()
    assert forecaster.variables["fp32"]["params"]
    assert forecaster.summary["fp32"]["steps_trained"] >= 1
    assert all(forecaster.history.values())


def test_a_forecaster_shows_its_table_roles_windows_size_and_what_is_fitted(fitted):
    forecaster, _, _ = fitted
    described = (
        f"<Forecaster of 'sales' by 'store' at 'day' (freq 'D'), history {HISTORY}, "
        f"horizon {HORIZON}; hidden_dim 8, quantiles (0.1, 0.5, 0.9); no QAT; "
    )
    assert repr(forecaster) == described + "fitted: fp32>"
    assert repr(Forecaster.from_config(forecaster.config)) == described + "not fitted>"


def test_loading_and_predicting_again_trace_nothing(fitted):
    forecaster, table, saved = fitted
    history, future = cut(table, "2024-03-30")
    forecast = forecaster.predict(history, future)
    Forecaster.load(saved)  # the first load of a configuration checks its parameter shapes
    with recorded_traces() as traced:
        loaded = Forecaster.load(saved)  # new model objects, equal to the fitted ones
        again = loaded.predict(history, future)
    pd.testing.assert_frame_equal(again, forecast)
    assert traced == []


def test_predict_runs_the_forward_fit_compiled_whatever_the_number_of_series(fitted):
    # Batches of the next power of two compiled one forward per bucket (5-14 s each,
    # the first predict after a fit always): now every call pads to the eval batch
    # size, the program fit's validation compiled, and a series' forecast does not
    # depend on the others forecast with it.
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    extra_history = history[history["store"] == "alpha"].assign(store="delta")
    extra_future = future[future["store"] == "alpha"].assign(store="delta")
    with recorded_traces() as traced, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # delta is a new series
        three = forecaster.predict(history, future)
        beta = forecaster.predict(history[history["store"] == "beta"],
                                  future[future["store"] == "beta"])  # fmt: skip
        four = forecaster.predict(
            pd.concat([history, extra_history]), pd.concat([future, extra_future])
        )
    assert traced == []
    pd.testing.assert_frame_equal(
        beta, three[three["store"] == "beta"].reset_index(drop=True), check_exact=True
    )
    assert sorted(pd.unique(four["store"])) == ["alpha", "beta", "delta", "gamma"]
    original = four[four["store"] != "delta"].reset_index(drop=True)
    pd.testing.assert_frame_equal(original, three, check_exact=True)


def test_warnings_of_predict_and_evaluate_name_the_users_line(fitted):
    # A helper reached by several routes named a library line on some of them (a new
    # series in predict: tft_jax/data/future.py; in evaluate: tft_jax/data/dataset.py;
    # changed statics: the forecaster's own line), which a notebook shows above the message.
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    extra = history[history["store"] == "alpha"].assign(store="delta")
    moved = history.assign(size=np.where(history["store"] == "beta", 99.0, history["size"]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forecaster.predict(
            pd.concat([moved, extra]),
            pd.concat([future, future[future["store"] == "alpha"].assign(store="delta")]),
        )
        forecaster.evaluate(
            pd.concat([table, table[table["store"] == "alpha"].assign(store="delta")])
        )
    ours = [w for w in caught if issubclass(w.category, UserWarning)]
    messages = " | ".join(str(w.message) for w in ours)
    assert "were not in the training" in messages and "beta" in messages, messages
    assert {w.filename for w in ours} == {__file__}, [(w.filename, w.lineno) for w in ours]


def test_the_model_reads_the_known_column_of_the_future_table(fitted):
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    flipped = future.assign(promo=1.0 - future["promo"])
    base = forecaster.predict(history, future)[QUANTILES].to_numpy()
    changed = forecaster.predict(history, flipped)[QUANTILES].to_numpy()
    assert np.abs(base - changed).max() > 1e-4


def test_predicting_from_a_truncated_table_equals_the_test_window_at_that_origin(fitted):
    forecaster, table, _ = fitted
    dataset = forecaster.prepare(table)
    test = dataset.test
    origin = test.forecast_start[0]
    at_origin = test.starts[test.forecast_start == origin]
    windows = WindowSet(dataset.panel, at_origin, HISTORY, HORIZON, normalized=test.normalized)
    predicted = forecaster.predictions(dataset, windows, ["fp32"])["fp32"]
    expected = monotone(to_original_units(dataset, windows, predicted.quantiles))
    history, future = cut(table, origin.strftime("%Y-%m-%d"))
    forecast = forecaster.predict(history, future)
    got = forecast[QUANTILES].to_numpy().reshape(len(at_origin), HORIZON, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_backtest_scores_each_cutoff_step_apart(fitted):
    forecaster, table, _ = fitted
    result = forecaster.backtest(table, n_windows=3, step=2)
    cutoffs = sorted(result["cutoff"].unique())
    last = pd.Timestamp(table["day"].max()) - pd.Timedelta(days=HORIZON - 1)
    assert cutoffs == [last - pd.Timedelta(days=2 * k) for k in (2, 1, 0)]
    assert set(result["model"]) == {"seasonal_naive", "best_baseline", "fp32"}
    assert (result["windows"] == 3).all()
    assert np.isfinite(result[["p50_q_risk", "p90_q_risk"]].to_numpy()).all()


def _backtest_warnings(forecaster, table, **options):
    """`(result, the text of its UserWarnings)` of a 3-cutoff backtest of `table`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = forecaster.backtest(table, n_windows=3, **options)
    return result, " | ".join(str(w.message) for w in caught if w.category is UserWarning)


def test_backtest_names_each_series_it_cannot_score_at_a_cutoff_and_scores_the_others(fitted):
    # A series left out of a cutoff changed which series that cutoff's scores averaged, and
    # nothing named it; a cutoff that scored no series failed the whole backtest.
    forecaster, table, _ = fitted
    edited = table[~((table["store"] == "beta") & (table["day"] == "2024-04-09"))].copy()
    edited.loc[(edited["store"] == "gamma") & (edited["day"] == "2024-03-29"), "sales"] = np.nan
    edited.loc[edited["day"] == "2024-03-22", "sales"] = np.nan  # every series, cutoff 03-20
    result, said = _backtest_warnings(forecaster, edited)
    windows = result.groupby("cutoff")["windows"].first()
    assert windows.to_dict() == {pd.Timestamp("2024-03-27"): 2, pd.Timestamp("2024-04-03"): 2}
    ends = "'beta' (its data ends at 2024-04-08 00:00:00, within the 7 steps from it)"
    assert f"at 2024-04-03 00:00:00: {ends}" in said
    assert "at 2024-03-27 00:00:00: 'gamma' (its target at 2024-03-29 00:00:00 is missing)" in said
    assert "'alpha' (its target at 2024-03-22 00:00:00 is missing)" in said
    assert "the cutoffs 2024-03-20 00:00:00 score no series and have no rows" in said
    # No cutoff with a series to score: refused, saying why at the last one.
    for day in ("2024-03-29", "2024-04-05"):
        edited.loc[edited["day"] == day, "sales"] = np.nan
    why = r"\(at the last cutoff 2024-04-03 00:00:00: 'alpha' \(its target at 2024-04-05"
    with pytest.raises(TableContentError, match=r"no cutoff scores a series: .* " + why):
        _backtest_warnings(forecaster, edited)


def test_backtest_says_a_series_whose_data_ends_before_a_cutoff_ends_before_it(fitted):
    # It said "ends at 2024-03-19, within the 7 steps from" cutoffs after that day.
    forecaster, table, _ = fitted
    cut_short = table[~((table["store"] == "beta") & (table["day"] > "2024-03-19"))]
    result, said = _backtest_warnings(forecaster, cut_short)
    assert set(result["windows"]) == {2}
    for cutoff in ("2024-03-20", "2024-03-27", "2024-04-03"):
        assert (
            f"at {cutoff} 00:00:00: 'beta' (its data ends at 2024-03-19 00:00:00, before it)"
            in said
        )


def test_a_series_unseen_in_training_is_forecast_with_a_warning(fitted):
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    new = history[history["store"] == "alpha"].assign(store="delta")
    new_future = future[future["store"] == "alpha"].assign(store="delta")
    with pytest.warns(UserWarning, match=r"series \['delta'\] were not in the training data"):
        forecast = forecaster.predict(new, new_future)
    assert set(forecast["store"]) == {"delta"}


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda f: f[f["store"] != "beta"], r"no row for series 'beta' at 2024-03-30"),
        (lambda f: f.iloc[1:], r"no row for series 'alpha' at 2024-03-30"),
        (lambda f: f.drop(columns="promo"), r"future lacks the columns \['promo'\]"),
        (
            lambda f: f.assign(promo=np.where(np.arange(len(f)) == 2, np.nan, f["promo"])),
            r"future column 'promo' is empty for series 'alpha' at 2024-04-01",
        ),
        (lambda f: pd.concat([f, f.iloc[:1]]), r"future repeats series 'alpha' at 2024-03-30"),
        (
            lambda f: pd.concat([f, f.iloc[:1].assign(day="2024-05-01")]),
            r"rows outside the forecast steps, e.g. series 'alpha' at 2024-05-01",
        ),
        (
            lambda f: pd.concat([f, f.iloc[:1].assign(store="omega")]),
            r"future has series \['omega'\] that the history does not",
        ),
    ],
)
def test_a_bad_future_table_is_named_in_the_error(fitted, edit, message):
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    with pytest.raises(ValueError, match=message):
        forecaster.predict(history, edit(future.reset_index(drop=True)))


def test_known_columns_need_a_future_table_and_models_must_exist(fitted):
    forecaster, table, _ = fitted
    history, _ = cut(table, "2024-03-30")
    with pytest.raises(ValueError, match=r"future is required: the model uses the known columns"):
        forecaster.predict(history)
    with pytest.raises(ValueError, match=r"model must be one of \('fp32', 'qat', 'int8'\)"):
        forecaster.predict(history, model="fp16")
    with pytest.raises(ValueError, match=r"model='int8' was not trained"):
        forecaster.predict(history, model="int8")


def test_a_short_history_names_the_series(fitted):
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    short = history[~((history["store"] == "gamma") & (history["day"] < "2024-03-25"))]
    with pytest.raises(
        ValueError,
        match=r"1 series are shorter than 14 steps .*forecasting needs history.*'gamma' \(5",
    ):
        forecaster.predict(short, future)


def test_predict_refuses_a_mostly_filled_history_by_the_configured_fraction(fitted, tmp_path):
    _, table, saved = fitted
    history, future = cut(table, "2024-03-30")
    gap = (history["store"] == "gamma") & history["day"].between("2024-03-20", "2024-03-27")
    sparse = history[~gap]  # 8 of gamma's last 14 days missing: 57% filled
    with pytest.raises(ValueError, match=r"more than 50% .*'gamma' \(8 of 14\)"):
        Forecaster.load(saved).predict(sparse, future)
    lenient = tmp_path / "lenient"
    shutil.copytree(saved, lenient)
    config = json.loads((lenient / "config.json").read_text())
    config["data"]["max_missing_fraction"] = 0.9
    (lenient / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match=r"filled 8 missing target steps of the history"):
        forecast = Forecaster.load(lenient).predict(sparse, future)
    assert np.isfinite(forecast[QUANTILES].to_numpy()).all()


def test_an_incomplete_or_foreign_run_folder_is_refused(fitted, tmp_path):
    _, _, saved = fitted
    broken = tmp_path / "broken"
    shutil.copytree(saved, broken)
    (broken / "models" / "fp32.msgpack").unlink()
    with pytest.raises(RunFolderError, match=r"fp32.msgpack does not exist"):
        Forecaster.load(broken)
    foreign = tmp_path / "foreign"
    shutil.copytree(saved, foreign)
    config = json.loads((foreign / "config.json").read_text())
    config["format_version"] = 99
    (foreign / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        RunFolderError, match=r"version 99, .* reads 'tft-jax-forecaster' versions 1 to 4"
    ):
        Forecaster.load(foreign)
    with pytest.raises(RunFolderError, match=r"config.json does not exist"):
        Forecaster.load(tmp_path)
    damaged = tmp_path / "damaged"
    shutil.copytree(saved, damaged)
    weights = damaged / "models" / "fp32.msgpack"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(RunFolderError, match=r"fp32.msgpack is damaged \(not flax msgpack"):
        Forecaster.load(damaged)
    (damaged / "config.json").write_text('{"format": "tft-jax-forecaster", ')
    with pytest.raises(RunFolderError, match=r"config.json is damaged \(not JSON\)"):
        Forecaster.load(damaged)
    for edit, message in (
        (lambda config: config.pop("models"), r"config.json is damaged: KeyError\('models'\)"),
        (lambda config: config.pop("season_period"), r"damaged: KeyError\('season_period'\)"),
        (lambda config: config["data"].update(history=-3), r"damaged: .*history must be >= 1"),
        (lambda config: config.clear() or config.update(x=[1, 2]), r"format None version None"),
    ):
        config = json.loads((saved / "config.json").read_text())
        edit(config)
        (damaged / "config.json").write_text(json.dumps(config))
        with pytest.raises(RunFolderError, match=message):
            Forecaster.load(damaged)
    (damaged / "config.json").write_text("[1, 2]")
    with pytest.raises(RunFolderError, match=r"config.json is damaged: it holds a JSON list"):
        Forecaster.load(damaged)


@pytest.mark.parametrize("known_history", [False, True])
def test_the_load_check_takes_every_input_kind_of_the_model(known_history, tmp_path):
    config = TFTConfig(
        num_static_features=1, num_known_features=2, num_observed_features=3, hidden_dim=8,
        num_heads=2, sequence_length=5, prediction_horizon=2, use_known_history=known_history,
        static_categorical_cardinalities=(4,), known_categorical_cardinalities=(3, 2),
        observed_categorical_cardinalities=(5,),
    )  # fmt: skip
    b, t, h = 2, 5, 2
    inputs = dict(
        static=np.zeros((b, 1), np.float32), historical=np.zeros((b, t, 3), np.float32),
        future=np.zeros((b, h, 2), np.float32), static_categorical=np.zeros((b, 1), np.int32),
        future_categorical=np.zeros((b, h, 2), np.int32),
        observed_categorical=np.zeros((b, t, 1), np.int32),
    )  # fmt: skip
    if known_history:
        inputs["known_history"] = np.zeros((b, t, 2), np.float32)
        inputs["known_categorical_history"] = np.zeros((b, t, 2), np.int32)
    rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    params = jax.eval_shape(TemporalFusionTransformer(config).init, rngs, **inputs)["params"]
    check_params({"params": params}, model_param_shapes(config), tmp_path / "fp32.msgpack")
    narrower = dataclasses.replace(config, observed_categorical_cardinalities=(6,))
    with pytest.raises(RunFolderError, match=r"fp32.msgpack does not hold this run's model"):
        check_params({"params": params}, model_param_shapes(narrower), tmp_path / "fp32.msgpack")


def test_weights_of_another_model_are_refused_at_load_naming_the_file(fitted, tmp_path):
    _, _, saved = fitted
    foreign = tmp_path / "foreign_weights"
    shutil.copytree(saved, foreign)
    weights = foreign / "models" / "fp32.msgpack"
    variables = serialization.msgpack_restore(weights.read_bytes())
    key = variables["params"]["attention"]["key"]
    key["kernel"] = np.zeros((key["kernel"].shape[0], 2 * key["kernel"].shape[1]), np.float32)
    weights.write_bytes(serialization.msgpack_serialize(variables))
    with pytest.raises(
        RunFolderError,
        match=r"fp32.msgpack does not hold this run's model \(\['attention'\]\['key'\]\['kernel'\] "
        r"has shape \(8, 16\), the model's is \(8, 8\)",
    ):
        Forecaster.load(foreign)


def edit_config(folder, edit) -> None:
    """Applies `edit` to the dict in `folder`/config.json and writes it back."""
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def without_window_normalization(config: dict) -> None:
    """A run's config.json as if its model were trained without window normalization."""
    config["data"]["window_normalization"] = False
    config["summary"]["dataset"]["window_normalization"] = False


def test_model_files_of_another_form_dtype_or_bit_width_are_refused_at_load(fitted, tmp_path):
    _, _, saved = fitted
    params = serialization.msgpack_restore((saved / "models" / "fp32.msgpack").read_bytes())
    params = params["params"]
    stats = {"attention": {"key": {"dot_general": {"bits": np.int32(8)}}}}
    for variables, message in (
        ({"params": params, "quant_stats": stats},
         r"fp32.msgpack holds the collections \['params', 'quant_stats'\], the fp32 form's are "
         r"\['params'\]; is it the file of another model form"),
        ({"params": jax.tree.map(lambda leaf: leaf.astype(np.float16), params)},
         r"fp32.msgpack: parameter \['attention'\]\['key'\]\['kernel'\] is float16, the run's "
         r"parameters are float32"),
    ):  # fmt: skip
        folder = tmp_path / f"form{len(variables)}"
        shutil.copytree(saved, folder)
        (folder / "models" / "fp32.msgpack").write_bytes(serialization.msgpack_serialize(variables))
        with pytest.raises(RunFolderError, match=message):
            Forecaster.load(folder)
    edited = tmp_path / "bits"  # a QAT form observed at 8 bits, config.json edited to 4
    shutil.copytree(saved, edited)
    qat_bytes = serialization.msgpack_serialize({"params": params, "quant_stats": stats})
    (edited / "models" / "qat.msgpack").write_bytes(qat_bytes)
    qat_section = dataclasses.asdict(QATTrainingConfig(bits=8))

    def with_qat_form(config):
        config["models_sha256"]["qat"] = hashlib.sha256(qat_bytes).hexdigest()
        config.update(models=["fp32", "qat"], qat=qat_section)

    edit_config(edited, with_qat_form)
    assert Forecaster.load(edited).models == ("fp32", "qat")
    edit_config(edited, lambda c: c["qat"].update(bits=4))
    with pytest.raises(
        RunFolderError,
        match=r"qat.msgpack was quantized with \[8\] bits, config.json says qat.bits=4",
    ):
        Forecaster.load(edited)


def test_a_config_json_whose_sections_disagree_or_a_bad_history_json_is_refused(fitted, tmp_path):
    _, _, saved = fitted
    folder = tmp_path / "edited"
    for edit, message in (
        (lambda c: c["tft_config"].update(quantiles=[0.2, 0.5, 0.8]),
         r"config.json is damaged: .*tft_config.quantiles is \(0.2, 0.5, 0.8\), "
         r"model.quantiles is \(0.1, 0.5, 0.9\)"),
        (lambda c: c["data"].update(history=HISTORY + 1),
         rf"tft_config.sequence_length is {HISTORY}, data.history is {HISTORY + 1}"),
        (lambda c: c.update(format_version=9, versions="0.1", saved_by=None),
         r"version 9, written by an unknown version of tft-jax"),
        (lambda c: c.update(season_period=7.9), r"season_period must be an int >= 1, got 7.9"),
        (lambda c: c.update(season_period=-1), r"season_period must be an int >= 1, got -1"),
    ):  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(saved, folder)
        edit_config(folder, edit)
        with pytest.raises(RunFolderError, match=message):
            Forecaster.load(folder)
    shutil.rmtree(folder)
    shutil.copytree(saved, folder)
    (folder / "history.json").write_text("[1, 2]")
    with pytest.raises(RunFolderError, match=r"history.json is damaged: it holds a JSON list"):
        Forecaster.load(folder)
    (folder / "history.json").unlink()
    with pytest.raises(RunFolderError, match=r"history.json does not exist"):
        Forecaster.load(folder)


def test_saving_over_an_earlier_run_leaves_none_of_its_models_and_a_failed_save_keeps_it(
    fitted, tmp_path, monkeypatch
):
    forecaster, _, saved = fitted
    earlier = tmp_path / "earlier"
    shutil.copytree(saved, earlier)
    for name in ("qat", "int8"):  # forms of the earlier run that this forecaster lacks
        shutil.copy(earlier / "models" / "fp32.msgpack", earlier / "models" / f"{name}.msgpack")
    forecaster.save(earlier)
    assert sorted(path.name for path in (earlier / "models").iterdir()) == ["fp32.msgpack"]
    assert Forecaster.load(earlier).models == ("fp32",)

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(pathlib.Path, "write_bytes", crash)
    with pytest.raises(
        RunFolderWriteError, match=r"fp32.msgpack \(disk full\); the earlier run in .* is left"
    ):
        forecaster.save(earlier)  # cut short: the earlier run stays as it was
    monkeypatch.undo()
    assert Forecaster.load(earlier).models == ("fp32",)


def test_evaluate_on_the_training_table_reports_every_model_and_the_baseline(fitted):
    forecaster, table, _ = fitted
    metrics = forecaster.evaluate(table)
    assert set(metrics["models"]) == {"seasonal_naive", "best_baseline", "fp32"}
    assert metrics["models"]["best_baseline"]["name"] in metrics["baselines"]
    assert set(metrics["baselines"]) == {"seasonal_naive_1", "drift_1", "seasonal_naive_7",
                                         "drift_7", "empirical_7"}  # fmt: skip
    assert metrics["windows"] == len(forecaster.prepare(table).test)
    assert metrics["seasonal_naive_period"] == 7


def test_unfitted_forecaster_says_so():
    with pytest.raises(RuntimeError, match=r"not fitted; call fit\(df\)"):
        Forecaster(DATA).predict(pd.DataFrame())


def test_a_config_of_a_reloaded_module_is_named_as_such():
    # A notebook's importlib.reload made "data must be a DataConfig, got DataConfig".
    reloaded = type("DataConfig", (), {"__module__": "tft_jax.forecaster.config"})
    with pytest.raises(TypeError, match=r"got DataConfig \(two imports of tft_jax.forecaster"):
        Forecaster(reloaded())
    with pytest.raises(TypeError, match=r"data must be a DataConfig, got dict \{\}$"):
        ForecasterConfig({}, ModelConfig(), None)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"ModelConfig.hidden_dim \(10\) must be divisible"):
        ModelConfig(hidden_dim=10, num_heads=4)
    # A width of 1 or 2 trained a model whose forecasts ignore the inputs (one or two values).
    with pytest.raises(ValueError, match=r"ModelConfig.hidden_dim must be >= 3, got 2: every"):
        ModelConfig(hidden_dim=2, num_heads=1)
    assert ModelConfig(hidden_dim=3, num_heads=1).hidden_dim == 3
    # One history step has no spread to normalize by: every window's history target read 0.
    with pytest.raises(
        ValueError,
        match=r"DataConfig.history must be >= 2 with DataConfig.window_normalization=True, got 1",
    ):
        DataConfig(**{**DATA.__dict__, "history": 1})
    assert DataConfig(**{**DATA.__dict__, "history": 1, "window_normalization": False})
    with pytest.raises(ValueError, match=r"DataConfig: give both validation_start and test_start"):
        DataConfig(**{**DATA.__dict__, "validation_start": "2024-03-01"})
    with pytest.raises(TypeError, match=r"DataConfig.known_cols must be a list of column names"):
        DataConfig(**{**DATA.__dict__, "known_cols": "promo"})
    with pytest.raises(ValueError, match=r"DataConfig.id_col 'q0.5' is also the name of a quanti"):
        ForecasterConfig(DataConfig(**{**DATA.__dict__, "id_col": "q0.5"}))


def test_predict_batch_size_must_be_a_positive_int(fitted):
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=rf"batch_size must be an int >= 1, got {bad}"):
            forecaster.predict(history, future, batch_size=bad)


def test_nonnegative_clips_forecasts_at_zero(fitted, tmp_path):
    _, table, saved = fitted
    runs = {}
    for name, nonnegative in (("raw", False), ("clipped", True)):
        runs[name] = tmp_path / name
        shutil.copytree(saved, runs[name])
        config = json.loads((runs[name] / "config.json").read_text())
        config["data"]["nonnegative"] = nonnegative
        # Sink every forecast below zero by moving the series scaler's level
        # (window normalization would take the same shift out of each window).
        config["data"]["window_normalization"] = False
        config["summary"]["dataset"]["window_normalization"] = False  # as if trained so
        scaler = config["preprocessor"]["target_scaler"]
        scaler["loc"] = [value - 1000.0 for value in scaler["loc"]]
        (runs[name] / "config.json").write_text(json.dumps(config))
    history, future = cut(table, "2024-03-30")
    with pytest.warns(UserWarning, match=r"^predict: forecasts of 'sales' below 0"):
        raw = Forecaster.load(runs["raw"]).predict(history, future)[QUANTILES].to_numpy()
    assert (raw < 0).all()
    clipped = Forecaster.load(runs["clipped"]).predict(history, future)[QUANTILES].to_numpy()
    np.testing.assert_array_equal(clipped, 0.0)


def test_nonnegative_announces_negative_targets_it_would_clip(fitted, tmp_path):
    # A history of negative targets came back as forecasts of exactly 0, without a word.
    _, table, saved = fitted
    run = shutil.copytree(saved, tmp_path / "run")
    edit_config(run, lambda config: config["data"].update(nonnegative=True))
    forecaster = Forecaster.load(run)
    history, future = cut(table, "2024-03-30")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forecaster.predict(history, future)  # nonnegative data: nothing to say
    assert not [warning for warning in caught if "nonnegative" in str(warning.message)]
    negative = history.assign(sales=np.where(history["store"] == "beta", -3.0, history["sales"]))
    with pytest.warns(
        UserWarning, match=r"nonnegative=True clips .* in 1 series \(e.g. series 'beta': -3.0"
    ):
        forecaster.predict(negative, future)


def test_a_new_series_is_scored_without_its_scaler_knowing_the_scored_steps(fitted, tmp_path):
    _, table, saved = fitted
    # Without window normalization the series scaler alone sets the model's input scale.
    run = shutil.copytree(saved, tmp_path / "run")
    edit_config(run, without_window_normalization)
    forecaster = Forecaster.load(run)
    new = table[table["store"] == "alpha"].assign(store="delta")
    last_days = new["day"].isin(sorted(new["day"])[-HORIZON:])
    jumped = new.assign(sales=np.where(last_days, new["sales"] + 100.0, new["sales"]))
    quantiles, first_cutoff = [], []
    for delta in (new, jumped):  # differ only in the target of the last H steps, always scored
        both = pd.concat([table, delta], ignore_index=True)
        with pytest.warns(UserWarning, match=r"series \['delta'\] were not in the training data"):
            _, predictions = forecaster.evaluation(both, "test")
        quantiles.append(predictions["fp32"].quantiles)
        with pytest.warns(UserWarning, match=r"series \['delta'\] were not in the training data"):
            result = forecaster.backtest(both, n_windows=2, step=HORIZON)
        first_cutoff.append(result[result["cutoff"] == result["cutoff"].min()])
    np.testing.assert_array_equal(quantiles[0], quantiles[1])
    pd.testing.assert_frame_equal(first_cutoff[0], first_cutoff[1])


def test_resuming_checkpoints_of_another_batch_stream_is_refused_before_training(
    fitted, tmp_path, monkeypatch
):
    # A checkpoint knows how many batches of its epoch were drawn, not their size: resumed
    # with another batch size it used to read other windows than the run it continues.
    _, table, _ = fitted
    checkpoints = tmp_path / "checkpoints"
    dataset = prepare_dataset(table, **DATA.prepare_options())
    _check_batch_stream(checkpoints, False, TINY_TRAINING.batch_size, dataset)
    written = json.loads((checkpoints / BATCH_STREAM_FILE).read_text())
    assert written == {
        "batch_size": TINY_TRAINING.batch_size,
        "train_windows": len(dataset.train),
        "train_windows_sha256": dataset.train.digest(),
    }
    # As if a step were saved: a record alone binds nothing (the resume starts over).
    monkeypatch.setattr(forecaster_module, "_holds_checkpoints", lambda checkpoints: True)
    _check_batch_stream(checkpoints, True, TINY_TRAINING.batch_size, dataset)  # the same stream
    other = dataclasses.replace(TINY_TRAINING, batch_size=2 * TINY_TRAINING.batch_size)
    resumed = Forecaster(DATA, ModelConfig(hidden_dim=8, num_heads=2), other)
    # A record of the stream alone (no settings): written before settings were recorded.
    with (
        pytest.warns(UserWarning, match="cannot be checked"),
        pytest.raises(ValueError, match=r"batch_size \d+ then, \d+ now"),
    ):
        resumed.fit(table, checkpoint_dir=checkpoints, resume=True, quiet=True)
    assert not (checkpoints / "fp32").exists()  # refused before any training


def test_save_and_load_read_a_leading_tilde_as_the_home_folder(fitted, tmp_path, monkeypatch):
    # pathlib does not expand "~": the run went into a folder literally named "~".
    forecaster, _, _ = fitted
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    forecaster.save("~/runs/tilde")
    assert (tmp_path / "runs" / "tilde" / "config.json").is_file()
    assert not (tmp_path / "~").exists()
    assert Forecaster.load("~/runs/tilde").models == forecaster.models


def test_models_given_as_one_string_are_refused_by_name(fitted):
    # A bare string was iterated letter by letter: "model must be one of ..., got 'f'".
    forecaster, table, _ = fitted
    message = r"models must be a list of model names such as \['fp32'\], got the string 'fp32'"
    with pytest.raises(TypeError, match=message):
        forecaster.evaluate(table, models="fp32")
    with pytest.raises(TypeError, match=message):
        forecaster.backtest(table, n_windows=1, models="fp32")


def test_a_backtest_cutoff_or_a_split_whose_targets_are_all_zero_is_named(fitted):
    forecaster, table, _ = fitted
    last_days = sorted(table["day"].unique())[-HORIZON:]
    zeroed = table.assign(sales=table["sales"].where(~table["day"].isin(last_days), 0.0))
    # Raised only when no cutoff can be scored.
    with pytest.raises(ValueError, match=rf"each cutoff \({last_days[0]}( 00:00:00)?\) is zero"):
        forecaster.backtest(zeroed, n_windows=1)
    test_days = sorted(table["day"].unique())[-(HORIZON + 20) :]  # past the test cut
    zeroed = table.assign(sales=table["sales"].where(~table["day"].isin(test_days), 0.0))
    with pytest.raises(ValueError, match=r"every target of the test split \(\d+ windows\) is zero"):
        forecaster.evaluate(zeroed)


def test_a_backtest_cutoff_whose_targets_are_all_zero_is_nan_and_the_others_are_scored(fitted):
    # One zero cutoff made the whole backtest raise, so the others were not scored.
    forecaster, table, _ = fitted
    days = sorted(table["day"].unique())
    last_days = days[-HORIZON:]
    zeroed = table.assign(sales=table["sales"].where(~table["day"].isin(last_days), 0.0))
    with pytest.warns(UserWarning, match=rf"cutoff\(s\) {last_days[0]}( 00:00:00)? is zero"):
        result = forecaster.backtest(zeroed, n_windows=2)
    zero_cutoff = pd.Timestamp(last_days[0])
    first, zero = result[result["cutoff"] != zero_cutoff], result[result["cutoff"] == zero_cutoff]
    assert set(zero["model"]) == set(first["model"]) == {"seasonal_naive", "best_baseline", "fp32"}
    assert zero[["p50_q_risk", "p90_q_risk"]].isna().all().all()
    # The other cutoff scores as in the untouched table (its windows end before the zeros).
    reference = forecaster.backtest(table, n_windows=2)
    reference = reference[reference["cutoff"] != zero_cutoff]
    pd.testing.assert_frame_equal(first.reset_index(drop=True), reference.reset_index(drop=True))
    # Against zero actuals the pinball loss of a forecast f >= 0 is (1 - q) f: the seasonal
    # naive forecast repeats the H = 7 = period days before the cutoff.
    levels = np.asarray(forecaster.tft_config.quantiles)
    assert forecaster.season_period == HORIZON
    before = table[table["day"].isin(days[-2 * HORIZON : -HORIZON])]["sales"].to_numpy()
    assert (before >= 0).all()
    by_model = zero.set_index("model")
    expected = (1.0 - levels.mean()) * before.mean()
    assert by_model.loc["seasonal_naive", "mean_quantile_loss"] == pytest.approx(expected, rel=1e-9)
    assert np.isnan(by_model.loc["best_baseline", "mean_quantile_loss"])
    assert pd.isna(by_model.loc["best_baseline", "baseline"])
    assert np.isfinite(by_model.loc["fp32", "mean_quantile_loss"])


def test_a_scored_period_without_observed_targets_names_the_option_only_where_it_scores(fitted):
    # The error offered "pass require_observed_target=False to keep them", an option
    # Forecaster.evaluate lacked, also where no kept window would have an observed step.
    forecaster, table, _ = fitted
    days = sorted(table["day"].unique())
    # The last 10 days blank: each test window holds one, those starting in the first 5
    # test days have observed steps, which the option scores.
    blank = table.assign(sales=table["sales"].where(~table["day"].isin(days[-10:])))
    with pytest.raises(ValueError, match=r"all have a filled target step") as caught:
        forecaster.evaluate(blank)
    assert "no actual to score a forecast against; 15 of them have observed steps, which " in (
        str(caught.value)
    )
    assert "DataConfig.require_observed_target=False scores alone" in str(caught.value)
    # The whole test period blank: nothing the option could score, so it is not named.
    empty = table.assign(sales=table["sales"].where(~table["day"].isin(days[-15:])))
    with pytest.raises(ValueError, match=r"all have a filled target step") as caught:
        forecaster.evaluate(empty)
    assert "require_observed_target" not in str(caught.value)
    assert "no observed target to score a forecast against" in str(caught.value)
    # Preparing a table to fit on offers the option, which prepare_dataset takes.
    with (
        pytest.raises(ValueError, match=r"require_observed_target=False to keep the 15 of them"),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        prepare_dataset(blank, **DATA.prepare_options())


def test_backtest_and_predict_take_numpy_integers(fitted):
    # The configs take NumPy integers; these refused np.int64(2) as "not an int >= 1".
    forecaster, table, _ = fitted
    result = forecaster.backtest(table, n_windows=np.int64(2), step=np.int32(7))
    assert result.equals(forecaster.backtest(table, n_windows=2, step=7))
    history, future = cut(table, "2024-03-30")
    forecast = forecaster.predict(history, future, batch_size=np.int64(2))
    assert forecast.equals(forecaster.predict(history, future, batch_size=2))


def test_evaluating_a_split_without_windows_names_the_split(fitted):
    # A zero test fraction leaves no test window: "there are no windows to evaluate".
    forecaster, table, _ = fitted
    options = {**DATA.prepare_options(), "test_fraction": 0.0}
    dataset = prepare_dataset(table, **options, preprocessor=forecaster.preprocessor)
    assert len(dataset.test) == 0
    with pytest.raises(ValueError, match=r"evaluate: the test split of the table holds no complet"):
        forecaster.evaluate(dataset)
    assert forecaster.evaluate(dataset, split="validation")["windows"] == len(dataset.validation)


def test_forecast_ids_keep_the_dtype_of_integer_ids(fitted):
    # Integer ids came back as an object column, so the forecasts did not compare,
    # concatenate or save like the user's int64 ids.
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    codes = {"alpha": 1, "beta": 2, "gamma": 3}
    history = history.assign(store=history["store"].map(codes))
    future = future.assign(store=future["store"].map(codes))
    with pytest.warns(UserWarning, match=r"series \[1, 2, 3\] were not in the training data"):
        forecast = forecaster.predict(history, future)
    assert forecast["store"].dtype == history["store"].dtype == np.int64
    assert forecast["store"].tolist() == [code for code in (1, 2, 3) for _ in range(HORIZON)]
    assert forecaster.predict(*cut(table, "2024-03-30"))["store"].dtype == table["store"].dtype


def test_save_refuses_a_path_that_is_a_file_or_lies_under_one(fitted, tmp_path):
    # pathlib's NotADirectoryError named neither the file nor the cause.
    forecaster, _, _ = fitted
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for path in (notes, notes / "run"):
        with pytest.raises(ValueError, match=rf"save: {notes} is a file, not a folder"):
            forecaster.save(path)
    assert notes.read_text() == "mine"


def test_save_refuses_extra_sections_named_like_the_runs_own(fitted, tmp_path):
    # extra={"models": ...} replaced the run's own section: the folder then loaded with
    # other settings, or was damaged, without a word at save.
    forecaster, _, saved = fitted
    folder = shutil.copytree(saved, tmp_path / "run")
    for section in ("models", "data", "tft_config"):
        with pytest.raises(
            ValueError,
            match=rf"save: extra sections \['{section}'\] are sections of the run's own config",
        ):
            forecaster.save(folder, extra={"source": "x", section: None})
    with pytest.raises(TypeError, match=r"save: extra must be a dict of sections, got list"):
        forecaster.save(folder, extra=[("source", "x")])
    with pytest.raises(TypeError, match=r"save: extra must hold JSON values: .*ndarray"):
        forecaster.save(folder, extra={"source": np.arange(3)})
    assert Forecaster.load(folder).models == ("fp32",)  # refused before anything was written
    forecaster.save(folder, extra={"source": "stores.csv"})
    assert json.loads((folder / "config.json").read_text())["source"] == "stores.csv"


def test_a_refused_fresh_start_keeps_the_batch_stream_of_the_checkpoints(fitted, tmp_path):
    # A fresh fit over an earlier run's checkpoints wrote its own batch size into their
    # record before training refused to start; resuming with that batch size then passed.
    _, table, _ = fitted
    checkpoints = tmp_path / "checkpoints"
    dataset = prepare_dataset(table, **DATA.prepare_options())
    _check_batch_stream(checkpoints, False, 16, dataset)  # the earlier run's batch size
    state = collections.namedtuple("State", "step weights")(np.int32(3), np.zeros(2, np.float32))
    with TrainingCheckpointer(checkpoints / "fp32") as checkpointer:
        checkpointer.save_latest(state, jax.random.key(0), {})
    _check_batch_stream(checkpoints, False, TINY_TRAINING.batch_size, dataset)  # fit refuses
    assert json.loads((checkpoints / BATCH_STREAM_FILE).read_text())["batch_size"] == 16
    with pytest.raises(ValueError, match=r"batch_size 16 then, 8 now"):
        _check_batch_stream(checkpoints, True, TINY_TRAINING.batch_size, dataset)
    _check_batch_stream(checkpoints, True, 16, dataset)


def test_save_names_the_earlier_models_results_it_leaves(fitted, tmp_path):
    forecaster, _, _ = fitted
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fresh folder: not a word
        forecaster.save(tmp_path / "run")
    run = tmp_path / "run"
    (run / "metrics.json").write_text("{}")
    (run / "forecasts_fp32_test.csv").write_text("x\n")
    (run / "plots").mkdir()
    (run / "plots" / "attention.png").write_bytes(b"png")
    (run / "checkpoints" / "fp32").mkdir(parents=True)
    (run / "notes.txt").write_text("the user's own")  # not a result: not named
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the very model saved there again: its own results
        forecaster.save(run)
    # Another model saved there before (one weight moved): the results are that model's.
    earlier = load_variables(run / "models" / "fp32.msgpack")
    key = earlier["params"]["attention"]["key"]
    key["kernel"] = key["kernel"] + 1.0
    save_variables(run / "models" / "fp32.msgpack", earlier)
    with pytest.warns(EarlierResultsWarning) as caught:
        forecaster.save(run)
    message = str(caught[0].message)
    assert "checkpoints/, forecasts_fp32_test.csv, metrics.json, plots/ of the model" in message
    assert "notes.txt" not in message
    assert (run / "metrics.json").read_text() == "{}"  # left as they are
    assert earlier_results(run) == [
        "checkpoints/", "forecasts_fp32_test.csv", "metrics.json", "plots/",
    ]  # fmt: skip
    # Results in a folder where no model was saved (a fit's own checkpoints): nothing to say.
    fresh = tmp_path / "fresh"
    (fresh / "checkpoints" / "fp32").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        forecaster.save(fresh)
    # A folder of its own under plots/ or an empty checkpoints/ is not a result.
    (run / "plots" / "attention.png").unlink()
    (run / "plots" / "mine").mkdir()
    (run / "checkpoints" / "fp32").rmdir()
    assert earlier_results(run) == ["forecasts_fp32_test.csv", "metrics.json"]


def test_evaluating_a_short_table_names_the_scored_period_and_the_runs_split(fitted):
    # The error named the train period (which evaluation does not use) and told to
    # change validation_fraction/test_fraction, settings `tft-jax evaluate` has no flags for.
    forecaster, table, _ = fitted
    short = table.groupby("store").head(25)
    with pytest.raises(
        ValueError,
        match=r"the test period \[2024-01-23 00:00:00, 2024-01-26 00:00:00\) of this table holds "
        r"no complete window: it spans 3 steps of the grid, and a window needs 7 horizon steps "
        r"inside it with an observed target and 14 history steps before; the model splits a "
        r"table by its data settings \(validation_fraction=0.15, test_fraction=0.15\)",
    ):
        forecaster.evaluate(short)


def test_a_table_too_short_to_train_on_is_evaluated_on_its_test_period(fitted):
    # 30 days split 40/10/50: the 12-day train period holds no window (history 14 +
    # horizon 7), the 15-day test period 9 per series. Evaluation needs no train window.
    forecaster, table, _ = fitted
    short = table.groupby("store").head(30)
    options = {**DATA.prepare_options(), "validation_fraction": 0.1, "test_fraction": 0.5}
    dataset = prepare_dataset(short, **options, preprocessor=forecaster.preprocessor, scored="test")
    assert len(dataset.train) == 0
    assert len(dataset.test) == 3 * (15 - HORIZON + 1)
    test = len(dataset.test)
    with pytest.warns(  # that test split lies in the model's training period: announced
        UserWarning, match=rf"{test} of the {test} windows scored there .* in-sample"
    ):
        metrics = forecaster.evaluate(dataset)
    assert metrics["windows"] == len(dataset.test)
    assert np.isfinite(metrics["models"]["fp32"]["p50_q_risk"])


def test_a_history_lacking_a_column_the_model_uses_says_to_add_it(fitted):
    # "Rename the columns or pass the right names": a fitted model's names cannot change.
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    with pytest.raises(
        ValueError,
        match=r"table lacks columns \['temperature'\] that the model was trained with "
        r"\(observed_cols='temperature'\); it has .*: add them to the table$",
    ):
        forecaster.predict(history.drop(columns="temperature"), future)


def test_scored_windows_whose_history_is_mostly_filled_are_left_out_as_predict_refuses(fitted):
    # evaluate and backtest scored windows from wholly forward-filled histories, which
    # predict refuses (more than max_missing_fraction of the last `history` steps filled).
    forecaster, table, _ = fitted
    days = sorted(table["day"].unique())
    blank = table["day"].isin(days[70:86]) & (table["store"] == "alpha")
    blanked = table.assign(sales=table["sales"].where(~blank))
    full = forecaster.evaluate(table)["windows"]
    # The reference, from the raw table: alpha's test windows (those evaluate scores on the
    # full table start at its last `full / 3` forecast starts) with over half their history blank.
    empty = blanked[blanked["store"] == "alpha"].set_index("day")["sales"].isna()
    # A window with a blank in its horizon is left out already (as the table's own warning says).
    starts = range(len(days) - HORIZON - full // 3 + 1, len(days) - HORIZON + 1)
    kept = [start for start in starts if not empty.iloc[start : start + HORIZON].any()]
    scored = full - (len(starts) - len(kept))
    sparse = sum(empty.iloc[start - HISTORY : start].mean() > 0.5 for start in kept)
    assert 0 < sparse < len(kept)
    filled = r"filled {0} missing target steps .* in {1} of 3 series: {2};"
    with (
        pytest.warns(UserWarning, match=filled.format(16, 1, "'alpha' 16")),
        pytest.warns(
            UserWarning,
            match=rf"evaluate: the test split: left out of the scores {sparse} of {scored} windows "
            rf"with more than 50% of their {HISTORY} history steps filled .*: 'alpha' {sparse}$",
        ),
    ):
        metrics, predictions = forecaster.evaluation(blanked)
    assert metrics["windows"] == scored - sparse
    # The forecasts stay those of every window of the split, as the CLI and plots pair them.
    assert predictions["fp32"].quantiles.shape[0] == scored
    # A backtest cutoff whose alpha history is 13 of 14 steps blank.
    blank = table["day"].isin(days[-HORIZON - 13 : -HORIZON]) & (table["store"] == "alpha")
    with (
        pytest.warns(UserWarning, match=filled.format(13, 1, "'alpha' 13")),
        pytest.warns(UserWarning, match=r"backtest: the cutoff .*: left out of the scores 1 of 3"),
    ):
        result = forecaster.backtest(table.assign(sales=table["sales"].where(~blank)), n_windows=1)
    assert set(result["windows"]) == {2}
    # Every history that sparse: nothing to score, said as such.
    blank = table["day"].isin(days[-HORIZON - 13 : -HORIZON])
    every = "'alpha' 13, 'beta' 13, 'gamma' 13"
    with (
        pytest.warns(UserWarning, match=filled.format(39, 3, every)),
        pytest.raises(
            ValueError,
            match=r"no cutoff scores a series: .* \(at most 50% of them filled\) .* every window "
            r"has a history predict refuses",
        ),
    ):
        forecaster.backtest(table.assign(sales=table["sales"].where(~blank)), n_windows=1)


# FC02 (dayfirst dropped from FITTED_USE_FIELDS), FC03 (min_series_length dropped): every
# setting of how new tables are read and screened may change after fit (the docstring's
# "how it reads new tables"), not only the two the test above sets.
def test_a_fitted_forecaster_forecasts_with_other_table_reading_settings(fitted):
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    expected = forecaster.predict(history, future)
    edited = copy.copy(forecaster)
    settings = forecaster.config
    for data in (
        dataclasses.replace(settings.data, dayfirst=True),
        dataclasses.replace(settings.data, time_format="%Y-%m-%d"),
        dataclasses.replace(settings.data, min_series_length=1),
    ):
        edited.config = dataclasses.replace(settings, data=data)
        pd.testing.assert_frame_equal(edited.predict(history, future), expected)


# FC07: forecaster.py predictor: the jitted model of a forecaster whose config was set to
# other settings built without the check (the public `predictor` on a fresh forecaster).
def test_the_predictor_of_a_forecaster_set_to_other_settings_is_refused(fitted):
    forecaster, _, _ = fitted
    fresh = pickle.loads(pickle.dumps(forecaster))  # no predictor compiled yet
    settings = fresh.config
    fresh.config = dataclasses.replace(
        settings, data=dataclasses.replace(settings.data, window_normalization=False)
    )
    with pytest.raises(ValueError, match=r"DataConfig.window_normalization True then, False"):
        fresh.predictor("fp32")


# FC08: forecaster.py load: a loaded forecaster records no settings, so a config set after
# load to others than its model's is never refused.
def test_a_loaded_forecaster_refuses_settings_its_model_was_not_fitted_with(fitted):
    _, table, saved = fitted
    loaded = Forecaster.load(saved)
    settings = loaded.config
    loaded.config = dataclasses.replace(
        settings, data=dataclasses.replace(settings.data, window_normalization=False)
    )
    with pytest.raises(ValueError, match=r"DataConfig.window_normalization True then, False"):
        loaded.predict(*cut(table, "2024-03-30"))


# FC13: forecaster.py __setstate__: a forecaster pickled before `config` was a property
# (its state holds "config", not "_config") unpickled without its settings.
def test_a_forecaster_pickled_before_config_was_a_property_unpickles_with_its_settings(fitted):
    forecaster, _, _ = fitted
    state = pickle.loads(pickle.dumps(forecaster)).__dict__.copy()
    state["config"] = state.pop("_config")  # the attribute's name in such a pickle
    old = Forecaster.__new__(Forecaster)
    old.__setstate__(state)
    assert old.config == forecaster.config and "config" not in old.__dict__
    assert old.models == ("fp32",)
