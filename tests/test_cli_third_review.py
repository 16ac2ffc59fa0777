"""Third review of the `tft-jax` command line, used as a shell user would use it.

Each test builds the smallest run folder that shows its case; none trains.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import pytest

from tft_jax import cli
from tft_jax.checkpoint import TrainingCheckpointer

from .cli_tables import run, table_args, write_table
from .test_cli_checkpoint_review import _Stepped, resume_train


@pytest.fixture(scope="module")
def csv_path(tmp_path_factory) -> pathlib.Path:
    return write_table(tmp_path_factory.mktemp("table") / "stores.csv")


def _finished_run(out: pathlib.Path, qat: dict | None) -> list[str]:
    """A finished run folder: config.json (with or without a QAT section), models, a checkpoint."""
    models = ["fp32"] + (["qat", "int8"] if qat is not None else [])
    (out / "models").mkdir(parents=True)
    for name in models:
        (out / "models" / f"{name}.msgpack").write_text("{}")
    (out / "config.json").write_text(json.dumps({"qat": qat, "models": models}))
    state = _Stepped(step=jnp.asarray(4, jnp.int32), w=jnp.ones(2))
    with TrainingCheckpointer(out / "checkpoints" / "fp32") as checkpointer:
        checkpointer.save_latest(state, jax.random.key(0), {})
    return models


@pytest.mark.parametrize("space", ["", "my run "])
def test_resume_without_qat_over_a_qat_run_is_refused_before_training(
    capsys, monkeypatch, csv_path, tmp_path, space
):
    # `train --resume` with the QAT run's flags but `--qat` forgotten resumed FP32, then
    # saved an FP32-only forecaster: models/qat.msgpack and int8.msgpack were deleted
    # without a word and plots/forecasts_int8.png stayed, drawn by a model now gone.
    out = tmp_path / f"{space}run"
    models = _finished_run(out, qat={"bits": 8, "steps": 3})

    code, err = resume_train(capsys, monkeypatch, csv_path, out, "--quiet")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert f"--resume: the run in --out {out} was trained with --qat" in err
    assert "pass --qat" in err
    assert sorted(p.stem for p in (out / "models").iterdir()) == sorted(models)


@pytest.mark.parametrize(("saved_qat", "flags"), [(None, []), ({"bits": 8}, ["--qat"])])
def test_resume_with_the_runs_qat_setting_goes_on_to_training(
    capsys, monkeypatch, csv_path, tmp_path, saved_qat, flags
):
    _finished_run(tmp_path, qat=saved_qat)

    code, err = resume_train(
        capsys, monkeypatch, csv_path, tmp_path, "--quiet", *flags, stop=cli.UsageError
    )
    assert (code, err.strip()) == (2, "tft-jax train: error: training started")


@pytest.mark.parametrize("given", ["--validation-start", "--test-start"])
def test_one_split_start_is_refused_naming_the_flags_not_the_config_class(
    capsys, csv_path, tmp_path, given
):
    # The line read "error: DataConfig: give both --validation-start and ...": a shell
    # user never wrote a DataConfig.
    code, _, err = run(
        capsys, "train", *table_args(csv_path), given, "2024-03-01", "--compile-cache", "none",
        "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert code == 2
    assert err.strip() == (
        "tft-jax train: error: give both --validation-start and --test-start, "
        "or neither (fractions)"
    )
    assert not (tmp_path / "run").exists()
