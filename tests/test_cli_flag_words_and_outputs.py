"""`tft-jax` says its warnings and errors in flags, and refuses outputs and sizes it cannot use
before any training.

Warnings named Python settings (`DataConfig.nonnegative=True`, the table
`future`); an output path in /proc, or a folder where `train` writes a file,
failed only after training; a huge size failed deep inside JAX. Nothing here
trains: each command is refused, or a stand-in command warns, in a second.
"""

from __future__ import annotations

import argparse
import errno
import pathlib
import warnings

import pytest

from tft_jax import cli, cli_experiments
from tft_jax.cli_parser import (
    MAX_COUNT,
    UsageError,
    build_parser,
    flag_message,
    forecaster_config,
    positive_int,
)

from .cli_tables import TINY_MODEL, run, table_args, write_table

RUN_ONLY = ["--compile-cache", "none"]


def _shown(capsys, monkeypatch, argv: list[str], raised: Exception | str) -> str:
    """What `tft-jax` prints when the command of `argv` warns `raised` (a text) or raises it."""

    def stand_in(args: argparse.Namespace) -> int:
        if isinstance(raised, Exception):
            raise raised
        warnings.warn(raised, UserWarning, stacklevel=2)
        return 0

    args = build_parser().parse_args([*argv, *RUN_ONLY])
    monkeypatch.setitem(cli.COMMANDS, args.command, stand_in)
    cli.run_parsed(args, [])
    return capsys.readouterr().err


TRAIN = ["train", "--out", "run"]
EVALUATE = ["evaluate", "--run", "run"]


@pytest.mark.parametrize(
    ("argv", "warning", "expected"),
    [
        (
            TRAIN,
            "DataConfig.nonnegative=True clips forecasts at 0, but the table holds 1 negative "
            "targets; set nonnegative=False for a quantity that can be negative",
            "--nonnegative clips forecasts at 0, but the table holds 1 negative targets; leave "
            "out --nonnegative for a quantity that can be negative",
        ),
        (
            TRAIN,
            "QATTrainingConfig.calibration_batches is 50, but one epoch holds 18 batches of 8",
            "--qat-calibration-batches is 50, but one epoch holds 18 batches of 8",
        ),
        (
            TRAIN,
            "left out 1 of 4 series with no observed target before validation_start 2024-03-01",
            "left out 1 of 4 series with no observed target before --validation-start 2024-03-01",
        ),
        (
            EVALUATE,
            "left out 7 of 27 windows with more than 50% of their 14 history steps filled "
            "(missing target steps; DataConfig.max_missing_fraction)",
            "left out 7 of 27 windows with more than 50% of their 14 history steps filled "
            "(missing target steps; the run's limit, set when it trained: train again with "
            "--max-missing-fraction)",
        ),
        (
            EVALUATE,
            "filled 2 missing target steps; windows whose horizon holds one are left out "
            "(PreparedDataset.missing_report())",
            "filled 2 missing target steps; windows whose horizon holds one are left out",
        ),
        (
            ["predict", "--run", "run", "--csv", "h.csv", "--future-csv", "f.csv", "--out", "p"],
            "future holds the columns ['sales'], which the model reads from the history only",
            "--future-csv f.csv holds the columns ['sales'], which the model reads from the "
            "history only",
        ),
        (
            ["predict", "--run", "run", "--csv", "h.csv", "--out", "p"],
            "DataConfig.nonnegative=True clips forecasts at 0, but the table holds 1 negative "
            "targets; set nonnegative=False for a quantity that can be negative",
            "the run's --nonnegative (set when it trained) clips forecasts at 0, but the table "
            "holds 1 negative targets; train again without --nonnegative for a quantity that "
            "can be negative",
        ),
        (
            TRAIN,
            "scaler='standard': 1 series have a few values in the training period ...: 'a' "
            "1e+30 at 2024-01-11 00:00:00: scale 1e+29, 3.2 without it; ... Fix or drop those "
            "values if they are errors, or fit with scaler='robust' (--scaler robust), whose "
            "median and interquartile range they do not move",
            "--scaler 'standard': 1 series have a few values in the training period ...: 'a' "
            "1e+30 at 2024-01-11 00:00:00: scale 1e+29, 3.2 without it; ... Fix or drop those "
            "values if they are errors, or fit with --scaler robust, whose median and "
            "interquartile range they do not move",
        ),
        (
            ["predict", "--run", "run", "--csv", "h.csv", "--future-csv", "f.csv", "--out", "p"],
            "future known column 'promo' holds 1 value in 1 series far outside its training "
            "range [0, 1]",
            "--future-csv f.csv known column 'promo' holds 1 value in 1 series far outside its "
            "training range [0, 1]",
        ),
    ],
)
def test_a_warning_names_the_commands_flags_not_python_settings(
    capsys, monkeypatch, argv, warning, expected
):
    err = _shown(capsys, monkeypatch, argv, warning)
    assert err.strip() == f"tft-jax {argv[0]}: warning: {expected}"


def test_a_library_error_asking_for_a_smaller_batch_names_the_batch_size_flag(capsys, monkeypatch):
    error = ValueError("the training split has 3 windows, fewer than one batch of 8; lower the "
                       "batch size")  # fmt: skip
    err = _shown(capsys, monkeypatch, TRAIN, error)
    assert err.strip().endswith("fewer than one batch of 8; lower --batch-size")


def test_advice_to_raise_the_validation_fraction_follows_cut_times_when_they_are_given(
    capsys, monkeypatch
):
    # --validation-fraction with --validation-start is refused: the advice names the cut.
    error = ValueError("the validation split has 3 windows, fewer than one batch of 8; lower "
                       "the batch size or raise the validation fraction")  # fmt: skip
    argv = [*TRAIN, "--validation-start", "2024-03-01", "--test-start", "2024-03-20"]
    err = _shown(capsys, monkeypatch, argv, error)
    assert err.strip().endswith("lower --batch-size or move --validation-start earlier"), err
    err = _shown(capsys, monkeypatch, TRAIN, error)
    assert err.strip().endswith("lower --batch-size or raise --validation-fraction"), err


def test_a_switch_setting_is_said_as_its_flag_or_its_negation():
    assert flag_message("set window_normalization=False") == "set --no-window-normalization"
    assert flag_message("ModelConfig.compact_selection=True") == "--compact-selection"
    # A keyword the command lacks stays as it is.
    assert flag_message("set nonnegative=False", {"out": None}) == "set nonnegative=False"


@pytest.mark.parametrize("flag", ["--hidden-dim", "--train-stride", "--batch-size", "--history"])
def test_a_size_beyond_int32_is_refused_by_the_parser_naming_the_flag(capsys, flag):
    # 1e20 failed as an OverflowError traceback inside JAX (--hidden-dim) or windows.py.
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["train", flag, str(10**20)])
    assert stop.value.code == 2
    assert (
        f"argument {flag}: expected an integer at most {MAX_COUNT} (2**31 - 1), got {10**20}"
        in capsys.readouterr().err
    )


def test_the_largest_count_is_accepted_and_one_more_is_not():
    assert positive_int(str(2**31 - 1)) == 2**31 - 1
    with pytest.raises(argparse.ArgumentTypeError):
        positive_int(str(2**31))


@pytest.mark.parametrize("command", [["train"], ["experiment", "clipping"]])
def test_a_batch_above_the_default_validation_windows_blames_the_batch_size(
    capsys, tmp_path, command
):
    # It said "--val-windows must be >= --batch-size", a flag the user never gave.
    code, _, err = run(
        capsys, *command, *table_args(tmp_path / "absent.csv"), *TINY_MODEL,
        "--batch-size", "100000", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 2
    assert "error: --batch-size 100000 is more than the --val-windows" in err
    assert "(the default)" in err and "absent.csv" not in err


def test_validation_windows_given_below_the_batch_are_still_named():
    args = build_parser().parse_args(["train", "--batch-size", "64", "--val-windows", "8"])
    with pytest.raises(UsageError, match=r"--val-windows must be >= --batch-size \(64\)"):
        forecaster_config(args, qat=False)


@pytest.mark.parametrize(
    ("entry", "make", "says"),
    [
        ("forecasts.csv", "folder", "is a folder, not a file; train writes its forecasts.csv"),
        ("metrics.json", "folder", "is a folder, not a file; train writes its metrics.json"),
        ("plots", "file", "is a file, not a folder; train writes its plots/"),
        ("models", "file", "is a file, not a folder; train writes its models/"),
    ],
)
def test_train_refuses_an_out_entry_of_the_wrong_kind_before_reading_the_table(
    capsys, tmp_path, entry, make, says
):
    # `mkdir -p OUT/forecasts.csv` trained for minutes, then failed writing a temporary file.
    out = tmp_path / "out"
    out.mkdir()
    (out / entry).mkdir() if make == "folder" else (out / entry).write_text("")
    code, _, err = run(
        capsys, "train", *table_args(tmp_path / "absent.csv"), *TINY_MODEL, "--out", str(out)
    )
    assert code == 2
    assert f"error: --out {out}: {out / entry} {says}" in err
    assert "absent.csv" not in err


def _no_experiment(*args, **kwargs):
    raise AssertionError("the experiment ran")


@pytest.mark.skipif(not pathlib.Path("/proc").is_dir(), reason="needs /proc")
def test_an_experiment_out_that_cannot_be_made_is_refused_before_the_runs(
    capsys, tmp_path, monkeypatch
):
    # Both arms trained, then "error: /proc/x: No such file or directory", naming no flag.
    monkeypatch.setattr(cli_experiments, "clipping_experiment", _no_experiment)
    monkeypatch.setattr(cli_experiments, "qat_model_for", _no_experiment)
    csv = write_table(tmp_path / "stores.csv")
    code, _, err = run(
        capsys, "experiment", "clipping", *table_args(csv), *TINY_MODEL, "--seeds", "1",
        "--steps", "2", "--batch-size", "4", "--val-windows", "4", "--eval-every", "1",
        "--out", "/proc/x/y",
    )  # fmt: skip
    assert code == 2
    assert "error: --out /proc/x/y: " in err


def test_an_output_whose_folder_cannot_be_made_is_named_by_its_flag():
    error = FileNotFoundError(errno.ENOENT, "No such file or directory", "/proc/x")
    args = argparse.Namespace(output=pathlib.Path("/proc/x/m.json"))
    assert cli.output_error_text(error, args) == (
        "--output /proc/x/m.json: creating /proc/x failed: No such file or directory"
    )


def test_a_run_folder_that_does_not_exist_is_named_by_the_run_flag(capsys, tmp_path):
    run_folder = tmp_path / "nonexist"
    code, _, err = run(
        capsys, "predict", "--run", str(run_folder), "--csv", str(tmp_path / "h.csv"),
        "--out", str(tmp_path / "p.csv"), *RUN_ONLY,
    )  # fmt: skip
    assert code == 2
    assert err.strip() == f"tft-jax predict: error: --run {run_folder}: no such folder; give " \
        "a run folder (written by `tft-jax train` or Forecaster.save)"  # fmt: skip


def test_a_run_folder_without_a_config_is_named_by_the_run_flag(capsys, tmp_path):
    code, _, err = run(
        capsys, "evaluate", "--run", str(tmp_path), *RUN_ONLY,
    )  # fmt: skip
    assert code == 2
    assert err.strip() == (
        f"tft-jax evaluate: error: --run {tmp_path}: {tmp_path / 'config.json'} does not exist, "
        "so it is not a run folder (one written by `tft-jax train` or Forecaster.save)"
    )


COLUMNS = ["--id-col", "store", "--time-col", "day", "--target", "sales", "--freq", "D"]


@pytest.mark.parametrize(
    "command",
    [
        ["train", *COLUMNS, "--out", "absent/out"],
        ["evaluate", "--run", "absent/run"],
        ["predict", "--run", "absent/run", "--out", "absent/p.csv"],
    ],
)
def test_dayfirst_with_a_time_format_is_refused_naming_both(capsys, tmp_path, command):
    # The format decides where the day is: --dayfirst was ignored without a word.
    code, _, err = run(
        capsys, *command, "--csv", str(tmp_path / "absent.csv"), "--time-format", "%Y-%m-%d",
        "--dayfirst", *RUN_ONLY,
    )  # fmt: skip
    assert code == 2
    assert "error: --dayfirst and --time-format '%Y-%m-%d' contradict each other" in err
