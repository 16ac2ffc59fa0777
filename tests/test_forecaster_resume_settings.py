"""`Forecaster.fit(resume=True)` checks the settings against those its checkpoints recorded.

One tiny checkpointed FP32 run (the settings of `tests/test_forecaster.py`)
is fitted once; each test resumes a copy of its checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings

import jax
import numpy as np
import pandas as pd
import pytest

from tft_jax.checkpoint import digest as tree_digest
from tft_jax.cli_parser import flag_message
from tft_jax.forecaster import (
    Forecaster,
    ForecasterConfig,
    QATTrainingConfig,
)
from tft_jax.forecaster import forecaster as forecaster_module
from tft_jax.forecaster.forecaster import BATCH_STREAM_FILE, _changed_settings

from .cli_tables import TINY_TRAINING, write_table
from .forecaster_stores import DATA, MODEL, SETTINGS, checkpointed_stores_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`(table, fitted forecaster, its checkpoint folder)` of a finished 4-step run."""
    return checkpointed_stores_run(tmp_path_factory.mktemp("resume_settings"))


def _copy(checkpoints, tmp_path):
    return shutil.copytree(checkpoints, tmp_path / "checkpoints")


def _record(checkpoints):
    return json.loads((checkpoints / BATCH_STREAM_FILE).read_text())


def test_a_checkpointed_fit_records_its_settings_next_to_the_checkpoints(trained):
    _, _, checkpoints = trained
    recorded = ForecasterConfig.from_json(_record(checkpoints)["settings"])
    assert recorded == SETTINGS


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        (
            dataclasses.replace(SETTINGS, model=dataclasses.replace(MODEL, hidden_dim=16)),
            ("ModelConfig.hidden_dim 8 then, 16 now", "--hidden-dim 8 then, 16 now"),
        ),
        (
            dataclasses.replace(
                SETTINGS, training=dataclasses.replace(TINY_TRAINING, learning_rate=2e-3)
            ),
            ("TrainingConfig.learning_rate 0.001 then, 0.002 now", "--lr 0.001 then, 0.002 now"),
        ),
        (
            dataclasses.replace(
                SETTINGS, model=dataclasses.replace(MODEL, quantiles=(0.1, 0.5, 0.9, 0.95))
            ),
            (
                "ModelConfig.quantiles (0.1, 0.5, 0.9) then, (0.1, 0.5, 0.9, 0.95) now",
                "--quantiles (0.1, 0.5, 0.9) then, (0.1, 0.5, 0.9, 0.95) now",
            ),
        ),
    ],
    ids=["hidden_dim", "learning_rate", "quantiles"],
)
def test_a_resume_with_changed_settings_is_refused_naming_the_field_before_training(
    trained, tmp_path, monkeypatch, changed, expected
):
    # Only the batch stream and parameter shapes were checked: a new hidden size stopped
    # on an orbax shape mismatch naming no setting, a new learning rate or new quantiles
    # trained on, mixed into the run they continued.
    table, _, checkpoints = trained
    checkpoints = _copy(checkpoints, tmp_path)
    before = _record(checkpoints)

    def training_started(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(forecaster_module, "train_fp32", training_started)
    with pytest.raises(ValueError, match="were trained with other settings") as error:
        Forecaster.from_config(changed).fit(
            table, checkpoint_dir=checkpoints, resume=True, quiet=True
        )
    message, flagged = expected
    assert message in str(error.value)
    assert flagged in flag_message(str(error.value))  # as `tft-jax train --resume` says it
    assert _record(checkpoints) == before


def test_an_unchanged_resume_of_a_finished_run_gives_its_variables(trained, tmp_path):
    table, fitted, checkpoints = trained
    checkpoints = _copy(checkpoints, tmp_path)
    resumed = Forecaster.from_config(SETTINGS).fit(
        table, checkpoint_dir=checkpoints, resume=True, quiet=True
    )
    jax.tree.map(
        np.testing.assert_array_equal,
        resumed._fitted.variables["fp32"],
        fitted._fitted.variables["fp32"],
    )


def test_a_resume_with_a_larger_max_steps_trains_on_and_records_it(trained, tmp_path):
    table, _, checkpoints = trained
    checkpoints = _copy(checkpoints, tmp_path)
    longer = dataclasses.replace(
        SETTINGS, training=dataclasses.replace(TINY_TRAINING, max_steps=6, eval_batch_size=16)
    )
    # The 4-step cosine ended at 0; the 6-step one gives 1e-3 * (1 + cos(4/6 pi)) / 2 at step 4.
    with pytest.warns(UserWarning, match=r"this run's at step 6 \(warmup 0\); the rate goes on "
                      r"from 0.00025 \(the checkpoint's schedule gives 0 there\)"):  # fmt: skip
        resumed = Forecaster.from_config(longer).fit(
            table, checkpoint_dir=checkpoints, resume=True, quiet=True
        )
    assert resumed.summary["fp32"]["total_steps"] == 6
    assert resumed.summary["fp32"]["steps_trained"] == 6
    assert sorted(int(step.name) for step in (checkpoints / "fp32" / "latest").iterdir())[-1] == 6
    assert ForecasterConfig.from_json(_record(checkpoints)["settings"]) == longer


def test_a_resume_with_a_lower_max_steps_records_the_steps_the_model_was_trained(trained, tmp_path):
    # The summary said total_steps 2 of a model trained 4 steps (the warning aside).
    table, _, checkpoints = trained
    checkpoints = _copy(checkpoints, tmp_path)
    shorter = dataclasses.replace(
        SETTINGS, training=dataclasses.replace(TINY_TRAINING, max_steps=2)
    )
    with pytest.warns(UserWarning) as warned:
        resumed = Forecaster.from_config(shorter).fit(
            table, checkpoint_dir=checkpoints, resume=True, quiet=True
        )
    # One warning: nothing is left to train, so no word of the schedule's steps ahead.
    assert len(warned) == 1 and "is at step 4, past max_steps=2" in str(warned[0].message)
    assert resumed.summary["fp32"]["steps_trained"] == 4


@pytest.mark.parametrize("record", ["without settings", "missing"])
def test_checkpoints_from_before_the_settings_record_resume_with_a_warning(
    trained, tmp_path, record
):
    table, _, checkpoints = trained
    checkpoints = _copy(checkpoints, tmp_path)
    path = checkpoints / BATCH_STREAM_FILE
    if record == "missing":
        path.unlink()
    else:
        path.write_text(
            json.dumps({k: v for k, v in _record(checkpoints).items() if k != "settings"})
        )
    changed = dataclasses.replace(
        SETTINGS, training=dataclasses.replace(TINY_TRAINING, learning_rate=2e-3)
    )
    with pytest.warns(UserWarning, match="cannot be checked"):
        Forecaster.from_config(changed).fit(
            table, checkpoint_dir=checkpoints, resume=True, quiet=True
        )


def _recorded(settings: ForecasterConfig) -> dict:
    return json.loads(json.dumps(settings.to_json()))


def test_qat_may_be_added_on_resume_but_not_removed():
    with_qat = dataclasses.replace(SETTINGS, qat=QATTrainingConfig(steps=3))
    assert _changed_settings(_recorded(SETTINGS), with_qat) == []
    assert _changed_settings(_recorded(with_qat), SETTINGS) == [
        "ForecasterConfig.qat QAT settings then, None now"
    ]
    assert flag_message("(ForecasterConfig.qat QAT settings then, None now)") == (
        "(--qat QAT settings then, None now)"
    )  # as `tft-jax train --resume` without --qat says it
    more_bits = dataclasses.replace(with_qat, qat=QATTrainingConfig(steps=30, bits=4))
    assert _changed_settings(_recorded(with_qat), more_bits) == [
        "QATTrainingConfig.bits 8 then, 4 now"
    ]


def test_every_changed_field_is_named_and_a_field_missing_from_the_record_is_its_default():
    written = _recorded(SETTINGS)
    del written["data"]["nonnegative"], written["training"]["weight_decay"]  # older records
    assert _changed_settings(written, SETTINGS) == []
    changed = dataclasses.replace(
        SETTINGS,
        data=dataclasses.replace(DATA, history=21, scaler="robust", nonnegative=True),
        training=dataclasses.replace(TINY_TRAINING, seed=1, batch_size=16, epochs=3, patience=9),
    )
    assert _changed_settings(written, changed) == [
        "DataConfig.history 14 then, 21 now",
        "DataConfig.scaler 'standard' then, 'robust' now",
        "TrainingConfig.batch_size 8 then, 16 now",
        "TrainingConfig.seed 0 then, 1 now",
    ]


def test_a_record_without_a_saved_step_binds_nothing_and_is_written_anew(trained, tmp_path):
    # A run killed before its first checkpoint leaves the record alone; a job script
    # resuming it with a new learning rate was refused, though nothing was trained.
    table, _, checkpoints = trained
    checkpoints = _copy(checkpoints, tmp_path)
    shutil.rmtree(checkpoints / "fp32")
    changed = dataclasses.replace(
        SETTINGS, training=dataclasses.replace(TINY_TRAINING, learning_rate=5e-4)
    )
    resumed = Forecaster.from_config(changed).fit(
        table, checkpoint_dir=checkpoints, resume=True, quiet=True
    )
    assert resumed.summary["fp32"]["total_steps"] == TINY_TRAINING.max_steps
    assert ForecasterConfig.from_json(_record(checkpoints)["settings"]) == changed


def test_settings_spelled_otherwise_are_the_same_settings():
    written = _recorded(SETTINGS)
    written["data"].update(freq="1D", encoding="UTF8", validation_start=None)
    assert _changed_settings(written, SETTINGS) == []
    written["data"].update(encoding=None)  # a record of DataConfig(encoding=None) before
    assert _changed_settings(written, SETTINGS) == []
    cut = dataclasses.replace(DATA, validation_start="2024-03-01", test_start="2024-03-15")
    spelled = dataclasses.replace(
        DATA, validation_start="2024-03-01 00:00:00", test_start="2024-03-15T00:00"
    )
    assert (
        _changed_settings(
            _recorded(dataclasses.replace(SETTINGS, data=cut)),
            dataclasses.replace(SETTINGS, data=spelled),
        )
        == []
    )
    moved = dataclasses.replace(DATA, validation_start="2024-03-02", test_start="2024-03-15")
    assert _changed_settings(
        _recorded(dataclasses.replace(SETTINGS, data=cut)),
        dataclasses.replace(SETTINGS, data=moved),
    ) == ["DataConfig.validation_start '2024-03-01' then, '2024-03-02' now"]


def test_a_resume_on_another_table_with_as_many_windows_is_announced(trained, tmp_path):
    # Only the batch size and the count of training windows were compared: a table of other
    # values (as many windows) resumed without a word, mixing two runs.
    table, _, checkpoints = trained
    checkpoints = _copy(checkpoints, tmp_path)
    noisy = table.assign(sales=table["sales"] + np.random.default_rng(1).normal(size=len(table)))
    longer = dataclasses.replace(SETTINGS, training=dataclasses.replace(TINY_TRAINING, max_steps=6))
    record = _record(checkpoints)
    with (
        pytest.warns(UserWarning, match=r"resuming at step 4 on another learning-rate schedule"),
        pytest.warns(
            UserWarning,
            match=rf"training windows hold other values .* \(train_windows_sha256 "
            rf"{record['train_windows_sha256']} then, [0-9a-f]{{64}} now\): another table",
        ),
    ):
        Forecaster.from_config(longer).fit(
            noisy, checkpoint_dir=checkpoints, resume=True, quiet=True
        )
    assert _record(checkpoints)["train_windows_sha256"] == record["train_windows_sha256"]
    # The same table again: nothing said of its windows.
    checkpoints = _copy(trained[2], tmp_path / "again")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        forecaster_module._check_batch_stream(
            checkpoints, True, TINY_TRAINING.batch_size,
            forecaster_module.prepare_dataset(table, **DATA.prepare_options()), SETTINGS,
        )  # fmt: skip


# ------------------------------------------------------------ QAT over a resumed FP32 phase

QAT_SETTINGS = dataclasses.replace(SETTINGS, qat=QATTrainingConfig(steps=3, calibration_batches=2))
LONGER_QAT = dataclasses.replace(
    QAT_SETTINGS, training=dataclasses.replace(TINY_TRAINING, max_steps=6)
)
REPLACED = "QAT starts again from it; its checkpoints of the earlier FP32 model in"


@pytest.fixture(scope="module")
def qat_trained(tmp_path_factory):
    """`(table, fitted forecaster, its checkpoint folder)`: 4 FP32 steps, then 3 QAT steps."""
    folder = tmp_path_factory.mktemp("resume_qat")
    table = pd.read_csv(write_table(folder / "stores.csv"))
    checkpoints = folder / "checkpoints"
    forecaster = Forecaster.from_config(QAT_SETTINGS).fit(
        table, checkpoint_dir=checkpoints, quiet=True
    )
    return table, forecaster, checkpoints


def _qat_source(checkpoints):
    return json.loads((checkpoints / "qat" / forecaster_module.QAT_SOURCE_FILE).read_text())


def _assert_same_variables(one, other):
    jax.tree.map(np.testing.assert_array_equal, one, other)


def _resume(settings, table, checkpoints):
    """`(forecaster, the warnings' texts)` of a resumed fit."""
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        resumed = Forecaster.from_config(settings).fit(
            table, checkpoint_dir=checkpoints, resume=True, quiet=True
        )
    return resumed, [str(warning.message) for warning in warned]


def test_qat_checkpoints_record_the_fp32_model_they_were_fine_tuned_from(qat_trained):
    _, fitted, checkpoints = qat_trained
    assert _qat_source(checkpoints) == {
        "fp32_steps_trained": 4,
        forecaster_module.FP32_DIGEST_KEY: tree_digest(fitted._fitted.variables["fp32"]),
    }


def test_a_resume_whose_fp32_model_trains_on_starts_qat_again_from_it(qat_trained, tmp_path):
    # `--max-steps 6 --resume` over a finished QAT run trained FP32 on (4 -> 6 steps), then
    # restored the finished QAT checkpoint, fine-tuned from the step-4 FP32 model, and
    # returned it unchanged: the QAT and int8 models were stale, without a word.
    table, fitted, checkpoints = qat_trained
    checkpoints = _copy(checkpoints, tmp_path)
    resumed, warned = _resume(LONGER_QAT, table, checkpoints)
    replaced = [text for text in warned if REPLACED in text]
    assert replaced == [
        f"resume: the FP32 model trained on from step 4 to 6: {REPLACED} "
        f"{checkpoints / 'qat'} are replaced"
    ]
    assert resumed.summary["fp32"]["steps_trained"] == 6
    assert resumed.summary["qat"]["steps_trained"] == 3
    fp32 = resumed._fitted.variables["fp32"]
    assert tree_digest(fp32) != tree_digest(fitted._fitted.variables["fp32"])
    assert _qat_source(checkpoints) == {
        "fp32_steps_trained": 6,
        forecaster_module.FP32_DIGEST_KEY: tree_digest(fp32),
    }
    for model in ("qat", "int8"):
        assert tree_digest(resumed._fitted.variables[model]) != tree_digest(
            fitted._fitted.variables[model]
        )
    # The QAT of a run started afresh from that FP32 model: its checkpoints' run without
    # the QAT ones. FP32 is restored (the best checkpoint's bytes, the digest says), and
    # QAT runs from step 0 with the same seeds, schedule and compiled steps in this
    # process: bit for bit the same QAT model, as no computation differs.
    fresh = shutil.copytree(checkpoints, tmp_path / "fresh_qat")
    shutil.rmtree(fresh / "qat")
    again, warned = _resume(LONGER_QAT, table, fresh)
    assert not [text for text in warned if REPLACED in text]
    _assert_same_variables(again._fitted.variables["fp32"], fp32)
    for model in ("qat", "int8"):
        _assert_same_variables(again._fitted.variables[model], resumed._fitted.variables[model])
    assert again.history["qat"] == resumed.history["qat"]


@pytest.mark.parametrize("run", ["finished", "interrupted in QAT", "unrecorded"])
def test_a_resume_that_leaves_the_fp32_model_keeps_the_qat_checkpoints(qat_trained, tmp_path, run):
    # As before the record: a finished run gives its QAT model back, an interrupted QAT
    # phase goes on from its checkpoint to the same model, and checkpoints written before
    # QAT recorded its FP32 model are kept when FP32 does not train on.
    table, fitted, checkpoints = qat_trained
    checkpoints = _copy(checkpoints, tmp_path)
    source = _qat_source(checkpoints)
    if run == "interrupted in QAT":
        shutil.rmtree(checkpoints / "qat" / "latest" / "3")  # killed before its last save
    if run == "unrecorded":
        (checkpoints / "qat" / forecaster_module.QAT_SOURCE_FILE).unlink()
    resumed, warned = _resume(QAT_SETTINGS, table, checkpoints)
    assert not [text for text in warned if REPLACED in text]
    for model in ("fp32", "qat", "int8"):
        _assert_same_variables(resumed._fitted.variables[model], fitted._fitted.variables[model])
    if run != "unrecorded":
        assert _qat_source(checkpoints) == source
    else:
        assert not (checkpoints / "qat" / forecaster_module.QAT_SOURCE_FILE).exists()


def test_unrecorded_qat_checkpoints_are_replaced_when_fp32_trains_on(qat_trained, tmp_path):
    table, fitted, checkpoints = qat_trained
    checkpoints = _copy(checkpoints, tmp_path)
    (checkpoints / "qat" / forecaster_module.QAT_SOURCE_FILE).unlink()
    resumed, warned = _resume(LONGER_QAT, table, checkpoints)
    assert [text for text in warned if REPLACED in text] == [
        f"resume: the FP32 model trained on from step 4 to 6, and the QAT checkpoints in "
        f"{checkpoints / 'qat'} do not record which FP32 model they were fine-tuned from "
        f"(written before runs recorded it, in {forecaster_module.QAT_SOURCE_FILE}): "
        f"{REPLACED} {checkpoints / 'qat'} are replaced"
    ]
    assert _qat_source(checkpoints)["fp32_steps_trained"] == 6
    assert tree_digest(resumed._fitted.variables["qat"]) != tree_digest(
        fitted._fitted.variables["qat"]
    )
