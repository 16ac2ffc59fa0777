"""`Forecaster` names what is wrong with what it is given: a config.json edited by hand (a
field deleted), a non-finite number in `save`'s extra, a series off the freq grid, a
backtest longer than the table or with a new series unscaled before its first cutoff,
future rows of integer or empty ids; and backtest cutoffs stay freq steps apart across a
stretch no series covers.

One tiny FP32 model is fitted once on the synthetic stores table (the
settings of `tests/test_forecaster.py`, so that its compiled steps are
shared); every test reads it.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from tft_jax.config import TFTConfig
from tft_jax.forecaster import Forecaster, RunFolderError, run_folder
from tft_jax.forecaster.config import SECTIONS

from .cli_tables import HISTORY, HORIZON
from .forecaster_stores import cut, edited, fitted_stores


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """`(forecaster, table, saved folder)`."""
    return fitted_stores(tmp_path_factory.mktemp("forecaster_errors"))


@pytest.mark.parametrize(
    "field, value", [("attend_to_self", False), ("dtype", "bfloat16"), ("use_known_history", False)]
)
def test_a_tft_config_field_that_fit_fixes_edited_by_hand_is_refused_at_load(
    fitted, tmp_path, field, value
):
    # No setting reaches these fields: an edit loaded the same weights into another
    # computation (no causal mask, bfloat16 activations) and forecast otherwise, silently.
    _, _, saved = fitted
    folder = edited(saved, tmp_path / "run", lambda c: c["tft_config"].update({field: value}))
    with pytest.raises(
        RunFolderError,
        match=rf"config.json is damaged: .*tft_config.{field} is {value!r}, Forecaster.fit "
        "always trains with",
    ):
        Forecaster.load(folder)


def test_models_or_summary_of_another_type_in_config_json_are_named(fitted, tmp_path):
    # models="fp32" was read letter by letter ("models ['f', 'p', '3', '2'] must include
    # 'fp32'"); a summary list loaded and came back from `summary` as a list.
    _, _, saved = fitted
    folder = edited(saved, tmp_path / "models", lambda c: c.update(models="fp32"))
    with pytest.raises(RunFolderError, match=r"models must be a list of model names, got 'fp32'"):
        Forecaster.load(folder)
    folder = edited(saved, tmp_path / "summary", lambda c: c.update(summary=[1]))
    with pytest.raises(RunFolderError, match=r"summary must be an object, got list"):
        Forecaster.load(folder)


def test_every_field_of_every_section_is_in_a_saved_config_json(fitted):
    # What makes a missing field a hand edit: `save` writes each of them.
    _, _, saved = fitted
    config = json.loads((saved / "config.json").read_text())
    for section, kind in {**SECTIONS, "tft_config": TFTConfig}.items():
        if config[section] is not None:  # qat: null for an FP32 run
            assert sorted(config[section]) == sorted(f.name for f in dataclasses.fields(kind))


@pytest.mark.parametrize(
    "section, field",
    [("training", "seed"), ("data", "scaler"), ("tft_config", "dtype"),
     ("model", "dropout_rate")],
)  # fmt: skip
def test_a_field_deleted_from_a_section_of_config_json_is_refused_by_name(
    fitted, tmp_path, monkeypatch, section, field
):
    # The dataclasses took their defaults without a word: another seed for a resume,
    # another scaler, another dtype.
    _, _, saved = fitted
    kept = json.loads((saved / "config.json").read_text())[section][field]
    folder = edited(saved, tmp_path / "run", lambda c: c[section].pop(field))
    with pytest.raises(
        RunFolderError,
        match=rf"config.json is damaged: ValueError\('{section}\.{field} is missing from a "
        "folder of format version 4: Forecaster.save writes every field",
    ):
        Forecaster.load(folder)
    # A field that folders of earlier versions lack takes the value listed for them.
    added = {run_folder.FORMAT_VERSION + 1: {f"{section}.{field}": kept}}
    monkeypatch.setattr(run_folder, "FIELDS_ADDED", added)
    assert Forecaster.load(folder).models == ("fp32",)


def test_fields_added_since_the_first_runs_take_the_values_those_runs_were_trained_with(
    fitted,
):
    # Runs of format version 1 saved before these fields existed lack them: they were
    # refused as "edited by hand", and took today's defaults before that check (window
    # normalization on, a 3-minute time budget), which those runs never had.
    _, _, saved = fitted
    config = json.loads((saved / "config.json").read_text())
    for key in run_folder.fields_absent_before(1):
        section, field = key.split(".")
        if config[section] is not None:  # qat: null for an FP32 run
            config[section].pop(field)
    sections = {**SECTIONS, "tft_config": TFTConfig}
    completed = run_folder.complete_sections(config, sections, 1)
    assert completed["data"]["window_normalization"] is False
    assert completed["data"]["nonnegative"] is False
    assert completed["training"]["time_budget"] is None
    assert completed["tft_config"]["known_categorical_cardinalities"] == []
    assert "window_normalization" not in config["data"]  # the config read is left as it was
    # From format version 2 on every folder holds them: one that lacks them was edited.
    with pytest.raises(
        ValueError,
        match=r"data\.window_normalization, .* missing from a folder of format version 2",
    ):
        run_folder.complete_sections(config, sections, 2)


def test_a_folder_of_format_version_1_without_the_later_fields_loads_and_forecasts_alike(
    fitted, tmp_path
):
    # Folders of version 1 written before these fields existed lack them; one of version
    # 2 never does, and an older tft-jax (which reads version 1 only) refuses it by name.
    forecaster, table, saved = fitted

    def as_version_1(config):
        config["format_version"] = 1
        for key, value in run_folder.fields_absent_before(1).items():
            section, field = key.split(".")
            if config[section] is not None and config[section][field] == value:
                config[section].pop(field)

    folder = edited(saved, tmp_path / "v1", as_version_1)
    assert json.loads((saved / "config.json").read_text())["format_version"] == 4
    loaded = Forecaster.load(folder)
    assert loaded.config == forecaster.config
    history, future = cut(table, "2024-03-30")
    expected = forecaster.predict(history, future)
    pd.testing.assert_frame_equal(loaded.predict(history, future), expected)
    # Saved again, it is a folder of this version with every field.
    again = loaded.save(tmp_path / "again")
    config = json.loads((again / "config.json").read_text())
    assert config["format_version"] == run_folder.FORMAT_VERSION
    assert config["data"]["window_normalization"] == forecaster.config.data.window_normalization


@pytest.mark.parametrize(
    "extra, where",
    [({"x": float("nan")}, r"extra\['x'\] is nan"),
     ({"cli": {"rates": [0.1, np.float64("-inf")]}}, r"extra\['cli'\]\['rates'\]\[1\] is -inf")],
)  # fmt: skip
def test_save_refuses_a_non_finite_number_in_extra_naming_its_key(fitted, tmp_path, extra, where):
    # It was written as null and read back as None, without a word.
    forecaster, _, _ = fitted
    with pytest.raises(ValueError, match=rf"^save: {where}; JSON has no NaN or infinity"):
        forecaster.save(tmp_path / "run", extra=extra)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_backtest_cutoffs_are_step_grid_steps_apart_across_a_stretch_without_series(fitted):
    # Steps were counted over the times some series has: with no series from Mar 1 to
    # Mar 10 the two cutoffs "60 steps apart" were 70 days apart.
    forecaster, table, _ = fitted
    alpha = table[(table["store"] == "alpha") & (table["day"] <= "2024-02-29")]
    beta = table[table["store"] == "beta"].iloc[:50]
    beta = beta.assign(day=pd.date_range("2024-03-11", periods=50, freq="D").strftime("%Y-%m-%d"))
    # alpha's cutoff lies in the model's training period: announced.
    with pytest.warns(UserWarning, match=r"backtest: 1 of the 2 cutoffs \(2024-02-23 00:00:00\)"):
        result = forecaster.backtest(pd.concat([alpha, beta]), n_windows=2, step=60)
    cutoffs = sorted(result["cutoff"].unique())
    last = pd.Timestamp("2024-04-29") - pd.Timedelta(days=HORIZON - 1)
    assert cutoffs == [last - pd.Timedelta(days=60), last]
    assert (result["windows"] == 1).all()


def test_backtest_names_a_new_series_without_targets_before_its_first_cutoff(fitted):
    # The data layer's "series 'delta' is new and has no observed target before ..." did
    # not say that the time was the backtest's first cutoff, nor what to change.
    forecaster, table, _ = fitted
    last = pd.Timestamp(table["day"].max())
    first_cutoff = last - pd.Timedelta(days=3 * HORIZON - 1)  # n_windows=3, step=HORIZON
    alpha = table[table["store"] == "alpha"]
    late = alpha[pd.to_datetime(alpha["day"]) >= first_cutoff].assign(store="delta")
    with pytest.raises(
        ValueError,
        match=rf"^backtest: series 'delta' is not in the training data and has no observed "
        rf"target before the first cutoff {first_cutoff} to scale it by .*; lower n_windows or "
        "step",
    ):
        forecaster.backtest(pd.concat([table, late]), n_windows=3)
    # One step of its target before the first cutoff scales it: the backtest runs.
    earlier = alpha[pd.to_datetime(alpha["day"]) >= first_cutoff - pd.Timedelta(days=1)]
    in_sample = rf"backtest: 1 of the 3 cutoffs \({first_cutoff}\)"  # before the test start
    with pytest.warns(UserWarning, match=in_sample), pytest.warns(UserWarning, match="delta"):
        result = forecaster.backtest(pd.concat([table, earlier.assign(store="delta")]), 3)
    assert len(result["cutoff"].unique()) == 3


def test_backtest_refuses_a_series_recorded_at_another_offset_naming_it(fitted):
    # A series at noon among series at midnight doubled the count of times: cutoffs fell
    # half a step apart and the last failed with "no series has 14 steps of history".
    forecaster, table, _ = fitted
    shifted = table.assign(day=pd.to_datetime(table["day"]))
    noon = shifted["store"] == "alpha"
    shifted.loc[noon, "day"] += pd.Timedelta(hours=12)
    with pytest.raises(
        ValueError,
        match=r"backtest: series 'alpha' is recorded at 2024-01-01 12:00:00, off the freq='D' "
        r"grid from 2024-01-01 00:00:00",
    ):
        forecaster.backtest(shifted, n_windows=2)


def test_backtest_says_the_steps_its_cutoffs_need_history_included(fitted):
    # 13 cutoffs 7 days apart need 14 + 91 days of the table's 100: refused as "no series
    # has 14 steps of history before the cutoff 2024-01-10", a cutoff the user never chose.
    forecaster, table, _ = fitted
    with pytest.raises(
        ValueError,
        match=rf"backtest: 13 cutoffs 7 steps apart need {HISTORY + 91} steps of data "
        rf"\({HISTORY} of history before the first cutoff, 91 from it\), the table spans 100",
    ):
        forecaster.backtest(table, n_windows=13, step=7)
    with pytest.warns(UserWarning, match=r"backtest: 10 of the 12 cutoffs .* in-sample"):
        result = forecaster.backtest(table, n_windows=12, step=7)
    assert len(result["cutoff"].unique()) == 12


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda f: f.iloc[1:], r"future has no row for series 1 at 2024-03-30"),
        (lambda f: pd.concat([f, f.iloc[:1]]), r"future repeats series 1 at 2024-03-30"),
        (
            lambda f: f.assign(promo=np.where(np.arange(len(f)) == 1, np.nan, f["promo"])),
            r"future column 'promo' is empty for series 1 at 2024-03-31",
        ),
        (
            lambda f: pd.concat([f, f.iloc[:1].assign(day="2024-05-01")]),
            r"rows outside the forecast steps, e.g. series 1 at 2024-05-01",
        ),
        (
            lambda f: f.assign(store=f["store"].astype(float).where(np.arange(len(f)) != 2)),
            r"future column 'store' is empty at row 2 \(1 empty ids\)",
        ),
    ],
)
def test_future_errors_name_integer_ids_as_written_and_an_empty_id_as_one(fitted, edit, message):
    # Integer ids were named np.int64(1); an empty id as a series [nan] the history lacks.
    forecaster, table, _ = fitted
    history, future = cut(table, "2024-03-30")
    codes = {"alpha": 1, "beta": 2, "gamma": 3}
    history = history.assign(store=history["store"].map(codes))
    future = future.assign(store=future["store"].map(codes)).reset_index(drop=True)
    with pytest.raises(ValueError, match=message):  # refused before the ids are coded
        forecaster.predict(history, edit(future))


@pytest.mark.parametrize("method", ["predict", "evaluate", "backtest"])
@pytest.mark.parametrize(
    "without_time", [lambda t: t.drop(columns="day"), lambda t: t.set_index("day")]
)
def test_a_table_without_the_time_column_is_named_not_a_pandas_key_error(
    fitted, method, without_time
):
    # The time column was read (for its zone) before the columns were checked: a bare
    # KeyError: 'day' from pandas, also for a time moved into the index.
    forecaster, table, _ = fitted
    with pytest.raises(
        ValueError, match=r"table lacks columns \['day'\] that the model was trained with"
    ):
        getattr(forecaster, method)(without_time(table))


def test_evaluating_a_table_with_gaps_says_the_model_reads_the_filled_steps_as_observed(fitted):
    # The stores model was trained without gaps, so without a missing flag: evaluate
    # called the filled steps "flagged" where predict said the model has no flag.
    forecaster, table, _ = fitted
    gap = table[~((table["store"] == "beta") & table["day"].isin(["2024-02-10", "2024-02-11"]))]
    with pytest.warns(
        UserWarning,
        match=r"filled 2 missing target steps \(.*; the model has no missing flag and reads "
        r"them as observed\) in 1 of 3 series: 'beta' 2",
    ):
        forecaster.evaluate(gap)
