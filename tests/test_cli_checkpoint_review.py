"""Review of the `tft-jax` runner and the checkpoints: what a shell user can do to a run folder.

Each test builds the smallest folder or checkpoint that shows its case; none trains.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tft_jax import cli
from tft_jax.checkpoint import LATEST, TrainingCheckpointer
from tft_jax.cli_parser import UsageError, forecaster_config
from tft_jax.forecaster import Forecaster

from .cli_tables import run, table_args, write_table


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
    mine = ["models/__init__.py", "models/resnet.py", "plots/figure1.png",
            "checkpoints/resnet50.pt", "notes.txt"]  # fmt: skip
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


class _Stepped(dict):
    """A dict pytree with a `.step`, as `save_latest` reads it."""

    @property
    def step(self):
        return self["step"]


jax.tree_util.register_pytree_node(
    _Stepped,
    lambda tree: (tuple(tree.values()), tuple(tree.keys())),
    lambda keys, values: _Stepped(zip(keys, values, strict=True)),
)


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
        assert f"--out {out} is the --csv file, which this command reads" in err
    assert history.read_bytes() == csv_path.read_bytes()


def test_predict_refuses_an_out_that_is_a_file_of_the_run(capsys, csv_path, tmp_path):
    (tmp_path / "run").mkdir()
    config = tmp_path / "run" / "config.json"
    config.write_text("{}")
    code, _, err = run(
        capsys, "predict", "--run", str(tmp_path / "run"), "--csv", str(csv_path),
        "--out", str(config), "--compile-cache", "none",
    )  # fmt: skip
    assert code == 2 and "is the run's config.json, which this command reads" in err
    assert config.read_text() == "{}"


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
# Checkpoints: a key restore could not give back is refused at save


def _state(step: int) -> _Stepped:
    return _Stepped({"step": jnp.asarray(step, jnp.int32), "w": jnp.arange(3.0)})


@pytest.mark.parametrize(
    "make, shown",
    [
        (lambda: jax.random.split(jax.random.key(1), 3), r"shape \(3, 2\)"),
        (lambda: jax.random.key(1, impl="rbg"), r"shape \(4,\) \(rbg\)"),
    ],
)
def test_a_key_restore_cannot_give_back_is_refused_at_save(tmp_path, make, shown):
    # Saved without a word, then every resume failed: "does not fit the template: ['rng']".
    with TrainingCheckpointer(tmp_path) as checkpointer:
        with pytest.raises(ValueError, match=rf"save_latest: rng must be one PRNG key .*{shown}"):
            checkpointer.save_latest(_state(2), make(), {})
        assert checkpointer.steps() == []


def test_a_legacy_uint32_key_restores_as_the_same_typed_key(tmp_path):
    with TrainingCheckpointer(tmp_path) as checkpointer:
        assert checkpointer.save_latest(_state(2), jax.random.PRNGKey(7), {"epoch": 1})
        restored = checkpointer.restore(LATEST, _state(0))
    assert restored is not None and restored.step == 2 and restored.loop == {"epoch": 1}
    np.testing.assert_array_equal(jax.random.key_data(restored.rng), [0, 7])
    expected = jax.random.uniform(jax.random.key(7), (4,))
    np.testing.assert_array_equal(jax.random.uniform(restored.rng, (4,)), expected)
    np.testing.assert_array_equal(restored.state["w"], np.arange(3.0))


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
