"""`tft-jax experiment` (`tft_jax.cli_experiments`): the settings it makes from its flags and the
JSON it writes."""

from __future__ import annotations

import argparse
import json
import math
import re

import pytest

from tft_jax import cli_experiments
from tft_jax.cli_experiments import MAX_SEEDS, _clipping_settings
from tft_jax.cli_parser import UsageError, build_parser

from .cli_tables import TINY_MODEL, run, table_args, write_table


def _clipping_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["experiment", "clipping", *flags])


def test_clipping_eval_every_above_steps_is_announced_and_recorded_as_steps():
    with pytest.warns(UserWarning, match=r"--eval-every 50 is more than --steps 4"):
        settings = _clipping_settings(_clipping_args("--steps", "4", "--eval-every", "50"))
    assert settings.eval_every == 4


def test_clipping_default_eval_every_above_steps_is_said_to_be_the_default(recwarn):
    # "--eval-every 10 is more than --steps 2" named a flag the user had not given.
    settings = _clipping_settings(_clipping_args("--steps", "2"))
    assert settings.eval_every == 2
    messages = [str(w.message) for w in recwarn if issubclass(w.category, UserWarning)]
    assert messages == [
        "the default --eval-every 10 is more than --steps 2: each run records one point, "
        "after its last step (--eval-every 2)"
    ]
    recwarn.clear()  # the same value given on the command line is the user's, not the default
    _clipping_settings(_clipping_args("--steps", "2", "--eval-every", "10"))
    messages = [str(w.message) for w in recwarn if issubclass(w.category, UserWarning)]
    assert messages == [
        "--eval-every 10 is more than --steps 2: each run records one point, "
        "after its last step (--eval-every 2)"
    ]


def test_clipping_seeds_beyond_the_cap_are_refused_before_they_are_listed(monkeypatch):
    # `tuple(range(3_000_000_000))` was built first: a MemoryError, or the machine's memory.
    def no_settings(**kwargs):
        raise AssertionError("ClippingSettings was built")

    monkeypatch.setattr(cli_experiments, "ClippingSettings", no_settings)
    with pytest.raises(
        UsageError, match=rf"^--seeds must be at most {MAX_SEEDS} .*, got 3000000000$"
    ):
        _clipping_settings(_clipping_args("--seeds", "3000000000"))
    monkeypatch.undo()
    settings = _clipping_settings(_clipping_args("--seeds", str(MAX_SEEDS)))
    assert settings.seeds == tuple(range(MAX_SEEDS))


def test_clipping_eval_every_within_steps_is_kept_without_a_warning(recwarn):
    settings = _clipping_settings(_clipping_args("--steps", "4", "--eval-every", "2"))
    assert settings.eval_every == 2
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


def test_clipping_eval_every_equal_to_steps_is_kept_without_a_warning(recwarn):
    # One point after the last step is what was asked: nothing to announce.
    settings = _clipping_settings(_clipping_args("--steps", "4", "--eval-every", "4"))
    assert settings.eval_every == 4
    assert [str(w.message) for w in recwarn if issubclass(w.category, UserWarning)] == []


def test_clipping_json_tells_nan_from_inf_and_stays_strict_json(capsys, tmp_path, monkeypatch):
    """A run whose loss overflowed and whose norm went NaN: null for both said neither."""

    def fake_experiment(model, train, validation, settings, *, on_run=None):
        diverged = {
            "clip": False, "seed": 0, "step_loss": [0.5, math.inf],
            "step_grad_norm": [1.0, math.nan], "final_val_loss": -math.inf, "diverged": True,
        }  # fmt: skip
        healthy = {
            "clip": True, "seed": 0, "step_loss": [0.5, 0.4],
            "step_grad_norm": [1.0, 0.5], "final_val_loss": 0.4, "diverged": False,
        }  # fmt: skip
        summary = {
            "runs": 1, "diverged": 0, "final_val_loss_median": None,
            "final_val_loss_min": None, "final_val_loss_max": None,
        }  # fmt: skip
        return {
            "settings": {"learning_rate": 0.2, "clip_norm": 0.05},
            "runs": [healthy, diverged],
            "summary": {"with_clipping": summary, "without_clipping": summary},
        }

    monkeypatch.setattr(cli_experiments, "clipping_experiment", fake_experiment)
    csv = write_table(tmp_path / "stores.csv")
    code, _, _ = run(
        capsys, "experiment", "clipping", *table_args(csv), *TINY_MODEL, "--batch-size", "8",
        "--val-windows", "16", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0

    def refuse(constant):
        raise AssertionError(f"not strict JSON: {constant}")

    text = (tmp_path / "out" / "clipping.json").read_text()
    saved = json.loads(text, parse_constant=refuse)["runs"][1]
    assert saved["step_loss"] == [0.5, "inf"]
    assert saved["step_grad_norm"] == [1.0, "nan"]
    assert saved["final_val_loss"] == "-inf"
    summary = json.loads(text)["summary"]["with_clipping"]
    assert summary["final_val_loss_median"] is None  # no value, not a non-finite one


def _no_experiment(*args, **kwargs):
    raise AssertionError("the experiment ran")


@pytest.mark.parametrize("name", ["clipping.json", "clipping.png"])
def test_clipping_output_file_that_is_a_folder_is_refused_before_training(
    capsys, tmp_path, monkeypatch, name
):
    # It trained for minutes, then failed naming its temporary file:
    # "writing OUT/clipping.json.19061.tmp failed: Is a directory".
    monkeypatch.setattr(cli_experiments, "clipping_experiment", _no_experiment)
    out = tmp_path / "out"
    (out / name).mkdir(parents=True)
    code, _, err = run(
        capsys, "experiment", "clipping", *table_args(tmp_path / "absent.csv"), *TINY_MODEL,
        "--out", str(out),
    )  # fmt: skip
    assert code == 2
    assert f"error: --out {out}: {out / name} is a folder, not a file;" in err
    assert "absent.csv" not in err  # before the table is read


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        # It said "fewer than one batch of 8; lower the batch size": no batch size helps.
        (
            ["--validation-fraction", "0", "--batch-size", "8", "--val-windows", "16"],
            "the validation split has no windows, so the runs cannot be evaluated; give it "
            "some with --validation-fraction > 0 or --validation-start",
        ),
        (
            ["--batch-size", "64", "--val-windows", "64"],
            r"the validation split has \d+ windows, fewer than one batch of 64; lower "
            "--batch-size",
        ),
    ],
)
def test_clipping_split_without_a_batch_names_the_flag_that_helps(
    capsys, tmp_path, monkeypatch, flags, message
):
    monkeypatch.setattr(cli_experiments, "clipping_experiment", _no_experiment)
    monkeypatch.setattr(cli_experiments, "qat_model_for", _no_experiment)  # not even built
    csv = write_table(tmp_path / "stores.csv")
    code, _, err = run(
        capsys, "experiment", "clipping", *table_args(csv), *TINY_MODEL, "--seeds", "1",
        "--steps", "2", *flags, "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 2
    assert re.search(rf"error: {message}$", err.strip()), err


def test_clipping_errors_after_parsing_have_the_prefix_of_argparse(capsys, tmp_path):
    # argparse said "tft-jax experiment clipping: error:", the checks after parsing
    # "tft-jax experiment: error:".
    with pytest.raises(SystemExit):
        run(capsys, "experiment", "clipping", "--steps", "x")
    assert "tft-jax experiment clipping: error: argument --steps" in capsys.readouterr().err
    code, _, err = run(
        capsys, "experiment", "clipping", "--seeds", "3000000000", "--out", str(tmp_path / "o")
    )
    assert code == 2
    assert err.startswith("tft-jax experiment clipping: error: --seeds must be at most")


def _finished_experiment(model, train, validation, settings, *, on_run=None):
    """A stand-in `clipping_experiment`: one healthy run per arm, in no time."""
    runs = [
        {"clip": clip, "seed": 0, "step_loss": [0.5, 0.4], "step_grad_norm": [1.0, 0.5],
         "final_val_loss": 0.4, "diverged": False}
        for clip in (True, False)
    ]  # fmt: skip
    summary = {
        "runs": 1, "diverged": 0, "final_val_loss_median": 0.4, "final_val_loss_min": 0.4,
        "final_val_loss_max": 0.4,
    }  # fmt: skip
    return {
        "settings": {"learning_rate": 0.2, "clip_norm": 0.05},
        "runs": runs,
        "summary": {"with_clipping": summary, "without_clipping": summary},
    }


def test_clipping_says_it_replaces_an_earlier_experiments_results(capsys, tmp_path, monkeypatch):
    # A second experiment in one --out replaced clipping.json and clipping.png without a
    # word; as `tft-jax demo` says it replaces an earlier demo, it says so (and its --help).
    monkeypatch.setattr(cli_experiments, "clipping_experiment", _finished_experiment)
    csv = write_table(tmp_path / "stores.csv")
    out = tmp_path / "out"
    argv = [
        "experiment", "clipping", *table_args(csv), *TINY_MODEL, "--batch-size", "8",
        "--val-windows", "16", "--out", str(out),
    ]  # fmt: skip
    code, first, _ = run(capsys, *argv)
    assert code == 0 and "replacing" not in first
    code, second, _ = run(capsys, *argv)
    assert code == 0
    assert (
        f"tft-jax experiment clipping: replacing the earlier results in {out} "
        "(clipping.json, clipping.png)"
    ) in second.splitlines()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["experiment", "clipping", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "of an earlier experiment there are replaced, as the experiment says" in shown
