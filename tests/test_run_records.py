"""What a run folder records of how its model came about: resumed parts, stop notes, versions.

The forecaster runs use the tiny settings of `tests/test_forecaster_resume_settings.py`
(a 4-step FP32 run, resumed with `max_steps=6` and `eval_batch_size=16`), so
they compile nothing that file does not.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil

import flax
import jax
import jaxlib
import numpy as np
import optax
import pandas as pd
import pytest

from tft_jax.fit import LoopState, _refit_note, _undecayed_note
from tft_jax.forecaster import Forecaster
from tft_jax.forecaster import run_folder as run_folder_module
from tft_jax.forecaster.run_folder import cpu_model, versions

from .cli_tables import TINY_TRAINING
from .forecaster_stores import SETTINGS, checkpointed_stores_run


def _resumed(max_steps: int):
    return dataclasses.replace(
        SETTINGS,
        training=dataclasses.replace(TINY_TRAINING, max_steps=max_steps, eval_batch_size=16),
    )


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """`(table, fitted forecaster, its checkpoint folder)` of an uninterrupted 4-step run."""
    return checkpointed_stores_run(tmp_path_factory.mktemp("run_records"))


def _part(at_step: int, schedule_steps: int) -> dict:
    # The tiny runs' schedule: warmup min(200, total // 20) = 0, peak 1e-3, end 0.
    return {
        "at_step": at_step,
        "schedule_steps": schedule_steps,
        "warmup_steps": 0,
        "peak_lr": pytest.approx(TINY_TRAINING.learning_rate),
        "end_lr": 0.0,
        "refitted_by_time_budget": None,
    }


def test_a_run_never_resumed_records_no_parts(plain):
    _, forecaster, _ = plain
    assert "resumed" not in forecaster.summary["fp32"]


def test_a_resume_on_a_longer_schedule_records_its_parts_through_save_load_and_a_second_resume(
    plain, tmp_path
):
    table, _, checkpoints = plain
    checkpoints = shutil.copytree(checkpoints, tmp_path / "checkpoints")
    with pytest.warns(UserWarning, match="on another learning-rate schedule"):
        once = Forecaster.from_config(_resumed(6)).fit(
            table, checkpoint_dir=checkpoints, resume=True, quiet=True
        )
    assert once.summary["fp32"]["steps_trained"] == 6
    assert once.summary["fp32"]["resumed"] == [_part(4, 4)]

    loaded = Forecaster.load(once.save(tmp_path / "run"))
    assert loaded.summary["fp32"]["resumed"] == [_part(4, 4)]
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert written["summary"]["fp32"]["resumed"] == [_part(4, 4)]

    with pytest.warns(UserWarning, match="on another learning-rate schedule"):
        twice = Forecaster.from_config(_resumed(8)).fit(
            table, checkpoint_dir=checkpoints, resume=True, quiet=True
        )
    assert twice.summary["fp32"]["resumed"] == [_part(4, 4), _part(6, 6)]


def test_an_unchanged_resume_records_no_parts(plain, tmp_path):
    table, _, checkpoints = plain
    checkpoints = shutil.copytree(checkpoints, tmp_path / "checkpoints")
    again = Forecaster.from_config(SETTINGS).fit(
        table, checkpoint_dir=checkpoints, resume=True, quiet=True
    )
    assert "resumed" not in again.summary["fp32"]


def test_loop_state_keeps_its_resumed_parts_through_json_and_reads_older_checkpoints():
    loop = LoopState(step=6, resumed=[{"at_step": 4, "schedule_steps": 4}])
    assert LoopState.from_json(json.loads(json.dumps(loop.to_json()))) == loop
    older = loop.to_json()
    del older["resumed"]  # written before the field was kept
    assert LoopState.from_json(older).resumed == []


def test_a_budget_within_the_warmup_says_the_rate_will_not_decay():
    # The audit's case: 111 steps fit, the warmup is 200, the schedule must end past it.
    assert _refit_note(111, 201, 200) == (
        "the time budget fits about 111 steps, within the warmup of 200 steps: the learning "
        "rate will not decay (the schedule now ends at step 201)"
    )
    assert _refit_note(300, 300, 200) == (
        "the time budget fits about 300 steps: the learning rate now decays to step 300"
    )


UNMEASURED = "the budget ran out before the step time was measured"
SOONER = "sooner than the measured step time foretold"


@pytest.mark.parametrize(
    ("step", "end", "warmup", "measured", "fits", "why"),
    [
        (111, 201, 200, True, 111, "still in the warmup: the budget ends within it"),
        # Measured to end past the warmup, stopped in it: no "ends within it".
        (111, 301, 200, True, 300, f"still in the warmup: {SOONER}"),
        (3, 40, 4, False, None, f"still in the warmup: {UNMEASURED}"),
        (250, 300, 200, True, 300, SOONER),
        (250, 300, 200, True, None, SOONER),
        (30, 40, 4, False, None, UNMEASURED),
    ],
)  # fmt: skip
def test_a_budget_stop_before_the_schedules_end_says_the_rate_did_not_decay(
    step, end, warmup, measured, fits, why
):
    assert _undecayed_note(step, end, warmup, measured=measured, fits=fits) == (
        f"; the learning rate did not decay to its end: stopped after {step} of the schedule's "
        f"{end} updates (warmup {warmup}), {why}; give a larger time budget, or fewer steps"
    )


@pytest.mark.parametrize("measured", [True, False])
def test_a_budget_stop_at_the_schedules_end_adds_nothing(measured):
    assert _undecayed_note(201, 201, 200, measured=measured) == ""
    assert _undecayed_note(202, 201, 200, measured=measured) == ""


@pytest.mark.parametrize("flags", ["--xla_cpu_enable_fast_math=false", None])
def test_versions_record_the_packages_xla_flags_and_machine(monkeypatch, flags):
    if flags is None:
        monkeypatch.delenv("XLA_FLAGS", raising=False)
    else:
        monkeypatch.setenv("XLA_FLAGS", flags)
    recorded = json.loads(json.dumps(versions()))  # as config.json holds it
    assert recorded["xla_flags"] == flags
    assert recorded["jax"] == jax.__version__ and recorded["jaxlib"] == jaxlib.__version__
    assert recorded["flax"] == flax.__version__ and recorded["optax"] == optax.__version__
    assert recorded["numpy"] == np.__version__ and recorded["pandas"] == pd.__version__
    assert recorded["backend"] == jax.default_backend()
    assert recorded["machine"] == platform.machine()
    assert recorded["cpu"] == cpu_model()
    assert recorded["cpu_count"] == os.cpu_count()


def test_cpu_model_reads_the_first_model_name_else_the_platforms(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: Test\nmodel name\t: Test CPU 9000 @ 1.0GHz\n\n"
        "processor\t: 1\nmodel name\t: Another CPU\n"
    )
    assert cpu_model(cpuinfo) == "Test CPU 9000 @ 1.0GHz"
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert cpu_model(tmp_path / "missing") is None
    monkeypatch.setattr(platform, "processor", lambda: "arm")
    assert cpu_model(tmp_path / "missing") == "arm"


def test_a_saved_model_records_the_versions_it_was_trained_with_not_those_it_is_saved_with(
    plain, tmp_path, monkeypatch
):
    # Loaded and saved elsewhere, a run recorded the saving machine's packages and flags.
    _, forecaster, _ = plain
    first = json.loads((forecaster.save(tmp_path / "first") / "config.json").read_text())
    assert first["versions"] == versions()
    monkeypatch.setattr(run_folder_module, "versions", lambda: {"tft_jax": "elsewhere"})
    again = Forecaster.load(tmp_path / "first").save(tmp_path / "again")
    assert json.loads((again / "config.json").read_text())["versions"] == first["versions"]
