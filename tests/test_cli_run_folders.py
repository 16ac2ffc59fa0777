"""What `tft-jax` does with the files in and around a run folder: `--overwrite`, `--resume`,
a file given as `--run`, outputs that are inputs, config.json's `source`, output names and
the demo's marker.

Each test builds the smallest folder that shows its case; none trains.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import warnings

import jax
import jax.numpy as jnp
import pytest

from tft_jax import cli
from tft_jax.checkpoint import TrainingCheckpointer
from tft_jax.cli_parser import UsageError, forecaster_config
from tft_jax.forecaster import Forecaster, RunFolderError
from tft_jax.forecaster.run_folder import EarlierResultsWarning

from .cli_tables import run, table_args, write_table
from .one_store_sales import _table
from .stepped_state import _Stepped


@pytest.fixture(scope="module")
def csv_path(tmp_path_factory) -> pathlib.Path:
    return write_table(tmp_path_factory.mktemp("table") / "stores.csv")


def _files(folder: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------
# --overwrite deletes the run's files only


def test_overwrite_keeps_the_users_files_inside_models_plots_and_checkpoints(tmp_path):
    # `--out .` in a project: its own models/ package, plots and checkpoints of another
    # tool sit next to the run's. The help promises "other files stay"; they were rmtree'd.
    run_files = [
        "config.json", "models/fp32.msgpack", "models/int8.msgpack",
        "plots/forecasts_fp32.png", "plots/attention.png", "plots/future_fp32.png",
        "plots/loss_curves.png", "plots/variable_importance.png",
        "checkpoints/fp32/latest/3/x", "checkpoints/qat/best/2/x",
        "checkpoints/batch_stream.json",
    ]  # fmt: skip
    run_files += ["plots/train/forecasts_fp32.png", "plots/test_week/attention.png"]
    # Files named like the run's folders (`plot`'s plots/<split>/ and plots/<split>_<CSV
    # name>/) are the user's: they were deleted.
    mine = ["models/__init__.py", "models/resnet.py", "plots/figure1.png",
            "checkpoints/resnet50.pt", "notes.txt", "plots/train_notes.txt",
            "plots/validation"]  # fmt: skip
    for name in run_files + mine:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    removed = cli.remove_run_files(tmp_path)
    assert removed == ["checkpoints/", "config.json", "models/", "plots/"]
    assert _files(tmp_path) == sorted(mine)


def test_overwrite_removes_a_run_folder_left_empty(tmp_path):
    for name in ["models/fp32.msgpack", "models/qat.msgpack.tmp", "plots/attention.png"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "plots" / "mine.svg").write_text("x")
    assert cli.remove_run_files(tmp_path) == ["models/", "plots/"]
    assert not (tmp_path / "models").exists()
    assert _files(tmp_path) == ["plots/mine.svg"]


def test_overwrite_removes_plot_folders_and_partial_files_but_not_lookalike_user_files(tmp_path):
    # `plot --split validation` and `plot --csv other.csv` draw into plots/validation/ and
    # plots/test_other/: they survived --overwrite and described the old model. And the
    # patterns metrics*.json / forecasts*.csv deleted the user's own files of such names.
    run_files = [
        "metrics.json", "metrics_validation.json", "metrics_test_other.json",
        "metrics.json.tmp", "forecasts.csv", "forecasts_int8_test.csv",
        "forecasts_fp32_validation_other.csv", "forecasts.csv.tmp", "other_tables.json",
        "plots/attention.png", "plots/validation/attention.png",
        "plots/test_other/forecasts_fp32.png", "plots/loss_curves.png.tmp",
    ]  # fmt: skip
    mine = ["forecasts_sales_team.csv", "metrics_dashboard.json", "plots/figure1.png"]
    for name in run_files + mine:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    removed = cli.remove_run_files(tmp_path)
    assert removed == sorted([*(name for name in run_files if "/" not in name), "plots/"])
    assert _files(tmp_path) == sorted(mine)


class _SavingStub:
    """A forecaster whose `save` warns as `Forecaster.save` does over another saved model."""

    def __init__(self, replaced: bool) -> None:
        self.replaced = replaced

    def save(self, out: pathlib.Path, extra: dict) -> pathlib.Path:
        warnings.warn("another warning of the save", UserWarning, stacklevel=2)
        if self.replaced:
            warnings.warn("save: earlier results", EarlierResultsWarning, stacklevel=2)
        return out


@pytest.mark.parametrize("replaced", [True, False])
def test_a_train_over_another_model_names_the_results_other_commands_left(tmp_path, replaced):
    # A --resume that trained on rewrote metrics.json and the run's plots, and left
    # evaluate's, forecast's and plot's outputs of the replaced models without a word.
    train_writes = ["metrics.json", "forecasts.csv", "plots/attention.png", "plots/loss_curves.png"]
    others = [
        "metrics_validation.json", "metrics_test_other.json", "forecasts_int8_test.csv",
        "forecasts_fp32_validation_other.csv", "other_tables.json", "plots/future_fp32.png",
        "plots/validation/attention.png", "plots/test_other/forecasts_fp32.png",
    ]  # fmt: skip
    mine = ["forecasts_sales_team.csv", "metrics_dashboard.json", "plots/figure1.png"]
    for name in train_writes + others + mine + ["metrics.json.tmp"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    left = [*others[:6], "plots/test_other/", "plots/validation/"]
    assert cli.outputs_train_leaves(tmp_path) == sorted(left)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli.save_run(_SavingStub(replaced), tmp_path, {})
    messages = [str(warning.message) for warning in caught]
    assert messages[0] == "another warning of the save"  # passed through
    if replaced:
        assert messages[1:] == [
            f"--out {tmp_path} still holds {', '.join(sorted(left))}, written by evaluate, "
            "forecast or plot from the models this run replaced: they describe those, not "
            "the new ones; run those commands again, or delete them"
        ]
    else:  # the same models (a finished run resumed): their results still hold
        assert messages[1:] == []


def test_two_tables_of_one_file_name_cannot_share_the_runs_outputs(tmp_path):
    # Outputs for another table are named after its file: a second sales.csv from
    # another folder replaced the first's metrics_test_sales.json without a word.
    first, second = tmp_path / "2023" / "sales.csv", tmp_path / "2024" / "sales.csv"
    for path in (first, second):
        path.parent.mkdir()
        _table().to_csv(path, index=False)
    run_folder = tmp_path / "run"
    config = {"source": {"csv": str(tmp_path / "own.csv"), "command": "train"}}
    assert cli.metrics_output(_forecast_args(run_folder, first), config).name == (
        "metrics_validation_sales.json"
    )
    # Naming checks only; the command about to write claims the name.
    assert not (run_folder / "other_tables.json").exists()
    cli.record_other_table_name(_forecast_args(run_folder, first), config)
    # The same table again, by another spelling of its path, keeps its names.
    again = _forecast_args(run_folder, tmp_path / "2023" / ".." / "2023" / "sales.csv")
    assert cli.forecast_output(again, config, "fp32").name == "forecasts_fp32_validation_sales.csv"
    for output in (cli.metrics_output, cli.plots_output):
        with pytest.raises(UsageError, match=r"--csv .*2024/sales.csv: .* named 'sales' .*2023"):
            output(_forecast_args(run_folder, second), config)
    with pytest.raises(UsageError, match=r"named 'sales'"):
        cli.forecast_output(_forecast_args(run_folder, second), config, "fp32")
    with pytest.raises(UsageError, match=r"named 'sales'"):
        cli.record_other_table_name(_forecast_args(run_folder, second), config)
    # An --output of the user's own is no name of the run's.
    args = argparse.Namespace(run=run_folder, csv=second, output=tmp_path / "m.json", split="test")
    assert cli.metrics_output(args, config) == tmp_path / "m.json"
    cli.record_other_table_name(args, config)
    assert json.loads((run_folder / "other_tables.json").read_text()) == {
        "sales": str(first.resolve())
    }


# ---------------------------------------------------------------------------
# --resume over a run that has nothing to continue


def resume_train(
    capsys, monkeypatch, csv_path, out, *flags: str, stop: type[Exception] = AssertionError
) -> tuple[int, str]:
    """`tft-jax train --resume` into `out`: `(exit code, stderr)`.

    `Forecaster.fit` raises `stop("training started")`: an `AssertionError`
    (the default) fails a test that expects a refusal before training, a
    `UsageError` ends a run that was let through with that one line.
    """

    def training_started(*args, **kwargs):
        raise stop("training started")

    monkeypatch.setattr(Forecaster, "fit", training_started)
    code, _, err = run(
        capsys, "train", *table_args(csv_path), "--compile-cache", "none",
        "--out", str(out), "--resume", *flags,
    )  # fmt: skip
    return code, err


@pytest.mark.parametrize("saved", [["config.json", "models/fp32.msgpack"], ["models/fp32.msgpack"]])
def test_resume_over_a_saved_run_without_checkpoints_is_refused_before_training(
    capsys, monkeypatch, csv_path, tmp_path, saved
):
    # A `Forecaster.save` folder, or a run whose checkpoints/ was deleted to free space:
    # `--resume` trained from step 0 ("no checkpoint" shown only without --quiet) and
    # replaced its models.
    for name in saved:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")

    code, err = resume_train(capsys, monkeypatch, csv_path, tmp_path, "--quiet")
    assert code == 2
    assert f"--resume: --out {tmp_path} holds a saved run ({', '.join(saved)})" in err
    assert "pass --overwrite" in err and len(err.strip().splitlines()) == 1
    assert _files(tmp_path) == sorted(saved)


def test_resume_over_checkpoints_or_an_empty_folder_goes_on_to_training(
    capsys, monkeypatch, csv_path, tmp_path
):
    empty = tmp_path / "empty"
    code, err = resume_train(capsys, monkeypatch, csv_path, empty, stop=UsageError)
    assert (code, err.strip()) == (2, "tft-jax train: error: training started")

    saved = tmp_path / "saved"
    (saved / "models").mkdir(parents=True)
    (saved / "models" / "fp32.msgpack").write_text("{}")
    state = {"step": jnp.asarray(3, jnp.int32), "w": jnp.ones(2)}
    with TrainingCheckpointer(saved / "checkpoints" / "fp32") as checkpointer:
        checkpointer.save_latest(_Stepped(state), jax.random.key(0), {})
    code, err = resume_train(capsys, monkeypatch, csv_path, saved, stop=UsageError)
    assert (code, err.strip()) == (2, "tft-jax train: error: training started")


# ---------------------------------------------------------------------------
# --resume over a run trained with or without --qat


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


# ---------------------------------------------------------------------------
# --run given a file of the run


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_a_run_file_given_for_the_run_folder_is_named_so(capsys, csv_path, tmp_path, command):
    # --run run/config.json said "run/config.json/config.json does not exist; is
    # run/config.json a folder written by Forecaster.save ...?".
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    given = folder / "config.json"
    outputs = ["--csv", str(csv_path), "--out", str(tmp_path / "f.csv")]
    argv = [command, "--run", str(given), *(outputs if command == "predict" else [])]
    code, _, err = run(capsys, *argv, "--compile-cache", "none")
    assert code == 2
    assert err.strip() == (
        f"tft-jax {command}: error: --run {given} is a file, not a run folder; give the folder "
        f"that holds it, {folder}"
    )
    with pytest.raises(RunFolderError, match=r"^Forecaster.load: .*config.json is a file, not"):
        Forecaster.load(given)


# ---------------------------------------------------------------------------
# Outputs that are inputs


def test_predict_refuses_an_out_that_is_its_history_csv_and_leaves_it(capsys, csv_path, tmp_path):
    history = tmp_path / "history.csv"
    history.write_bytes(csv_path.read_bytes())
    for out in (history, tmp_path / "." / "history.csv"):
        code, _, err = run(
            capsys, "predict", "--run", str(tmp_path / "run"), "--csv", str(history),
            "--out", str(out), "--compile-cache", "none",
        )  # fmt: skip
        assert code == 2
        assert f"--out {out} is the --csv file, which tft-jax reads" in err
    assert history.read_bytes() == csv_path.read_bytes()


def test_predict_refuses_an_out_that_is_a_file_of_the_run(capsys, csv_path, tmp_path):
    (tmp_path / "run").mkdir()
    config = tmp_path / "run" / "config.json"
    config.write_text("{}")
    code, _, err = run(
        capsys, "predict", "--run", str(tmp_path / "run"), "--csv", str(csv_path),
        "--out", str(config), "--compile-cache", "none",
    )  # fmt: skip
    assert code == 2 and "is the run's config.json, which tft-jax reads" in err
    assert config.read_text() == "{}"


def test_only_evaluate_may_write_the_runs_metrics_json(tmp_path):
    run_folder = tmp_path / "run"
    assert run_folder / "metrics.json" in cli.run_inputs(run_folder).values()
    assert run_folder / "metrics.json" not in cli.run_inputs(run_folder, metrics=False).values()
    assert run_folder / "checkpoints" / "batch_stream.json" in cli.run_inputs(run_folder).values()


def test_an_output_that_is_no_input_passes(tmp_path):
    (tmp_path / "a.csv").write_text("x")
    (tmp_path / "b.csv").write_text("x")
    cli.check_not_input(tmp_path / "b.csv", "--out", {"the --csv file": tmp_path / "a.csv"})
    cli.check_not_input(tmp_path / "new.csv", "--out", {"the --csv file": tmp_path / "a.csv"})
    with pytest.raises(UsageError, match="is the run's table"):
        cli.check_not_input(
            tmp_path / "a.csv", "--output", {"the run's table": str(tmp_path / "a.csv")}
        )


# ---------------------------------------------------------------------------
# The names of the outputs written into a run folder


def _forecast_args(run: pathlib.Path, csv: pathlib.Path | None) -> argparse.Namespace:
    return argparse.Namespace(run=run, csv=csv, output=None, split="validation")


def test_forecasts_of_another_table_are_named_after_it_as_its_metrics_are(tmp_path):
    own, other = tmp_path / "own.csv", tmp_path / "stores.csv"
    for path in (own, other):
        _table().to_csv(path, index=False)
    run = tmp_path / "run"
    config = {"source": {"csv": str(own), "command": "train"}}
    args = _forecast_args(run, other)
    assert cli.forecast_output(args, config, "fp32") == run / "forecasts_fp32_validation_stores.csv"
    assert cli.metrics_output(args, config) == run / "metrics_validation_stores.json"
    # The run's own table, by any path, and no --csv keep the run's names.
    link = tmp_path / "link.csv"
    link.symlink_to(own)
    for csv in (own, link, None):
        args = _forecast_args(run, csv)
        assert cli.forecast_output(args, config, "int8") == run / "forecasts_int8_validation.csv"
    # A folder of `Forecaster.save` names no table: a --csv is another one.
    args = _forecast_args(run, own)
    assert cli.forecast_output(args, {}, "fp32") == run / "forecasts_fp32_validation_own.csv"


# ---------------------------------------------------------------------------
# config.json's `source`, edited by hand


@pytest.mark.parametrize(
    "source", ["runs/x.csv", None, ["a.csv"], {"command": "train"}, {"csv": 5}]
)
def test_a_source_section_edited_by_hand_is_a_usage_error_naming_it(csv_path, source):
    # It failed as an AttributeError ('str' object has no attribute 'get'), a traceback.
    args = cli.build_parser().parse_args(["evaluate", "--run", "edited"])
    train = cli.build_parser().parse_args(["train", *table_args(csv_path)])
    forecaster = Forecaster.from_config(forecaster_config(train, qat=False))
    with pytest.raises(UsageError, match=r"^--run edited: its config.json's source .* pass --csv"):
        cli.run_table(args, {"source": source}, forecaster)


def test_the_source_csv_that_train_writes_is_read(csv_path):
    args = cli.build_parser().parse_args(["evaluate", "--run", "r"])
    train = cli.build_parser().parse_args(["train", *table_args(csv_path)])
    forecaster = Forecaster.from_config(forecaster_config(train, qat=False))
    table = cli.run_table(args, {"source": {"csv": str(csv_path), "command": "train"}}, forecaster)
    assert set(table["store"]) == {"alpha", "beta", "gamma"}


# ---------------------------------------------------------------------------
# The demo's marker


def test_a_train_over_a_demo_folder_makes_it_the_users_run(capsys, monkeypatch, csv_path, tmp_path):
    # The marker outlived `train --overwrite`: a later `tft-jax demo` took the user's run
    # for the demo's and replaced it without asking.
    (tmp_path / "checkpoints" / "fp32").mkdir(parents=True)
    (tmp_path / cli.DEMO_MARKER).write_text("written by `tft-jax demo`\n")
    assert cli.is_demo_run(tmp_path)

    def start_then_stop(self, table, **kwargs):
        kwargs["before_training"]()
        raise UsageError("stopped after --out was readied")

    monkeypatch.setattr(Forecaster, "fit", start_then_stop)
    code, _, err = run(
        capsys, "train", *table_args(csv_path), "--compile-cache", "none", "--quiet",
        "--out", str(tmp_path), "--overwrite",
    )  # fmt: skip
    assert code == 2 and "stopped after --out was readied" in err
    assert not (tmp_path / cli.DEMO_MARKER).exists()
    (tmp_path / "checkpoints" / "fp32").mkdir(parents=True)  # what the stopped train left
    code, _, err = run(capsys, "demo", "--out", str(tmp_path), "--compile-cache", "none")
    assert code == 2 and "holds a run that is not the demo's" in err
