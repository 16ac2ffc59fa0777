"""The `tft-jax` command line: argument errors, and the whole pipeline on a tiny table.

The end-to-end tests (marked slow) train for a handful of steps on a tiny
synthetic long-format CSV with `--qat`, then check every file a run writes.
Their cost is XLA compilation (about ten jitted functions); with the
persistent cache of tests/conftest.py a second run is much faster.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np
import pandas as pd
import pytest
from flax import serialization

from tft_jax import cli, plots
from tft_jax.checkpoint import load_state
from tft_jax.cli_parser import UsageError, check_train_flags, flag_message, forecaster_config
from tft_jax.data import prepare_dataset
from tft_jax.distributed import JOIN_TIMEOUT_SECONDS, SETTINGS_SLOTS, process_rows
from tft_jax.evaluation import epoch_batches, fixed_batches
from tft_jax.forecaster import (
    DEMO,
    DataConfig,
    Forecaster,
    ForecasterConfig,
    ModelConfig,
    QATTrainingConfig,
    TrainingConfig,
)
from tft_jax.forecaster.config import MAX_SEED
from tft_jax.forecaster.forecaster import check_global_batch
from tft_jax.forecaster.run_folder import earlier_results
from tft_jax.forecaster.training import sample_batch
from tft_jax.model import TemporalFusionTransformer
from tft_jax.train import create_train_state, make_optimizer, warmup_cosine_schedule

from .cli_tables import (
    HISTORY,
    HORIZON,
    PNG_SIGNATURE,
    TINY_MODEL,
    TINY_QAT,
    TINY_RUN,
    run,
    table_args,
    write_table,
)


@pytest.fixture(scope="module")
def csv_path(tmp_path_factory) -> pathlib.Path:
    return write_table(tmp_path_factory.mktemp("table") / "stores.csv")


# ---------------------------------------------------------------------------
# Argument errors: reported in one line, exit status 2, no training started.


def test_csv_without_its_column_options_names_the_missing_ones(capsys, csv_path, tmp_path):
    code, _, err = run(capsys, "train", "--csv", str(csv_path), "--out", str(tmp_path / "r"))
    assert code == 2
    assert "--csv needs --id-col, --time-col, --target, --freq as well" in err
    assert "Traceback" not in err


def test_table_options_without_csv_are_rejected(capsys, tmp_path):
    code, _, err = run(capsys, "train", "--id-col", "store", "--out", str(tmp_path / "r"))
    assert code == 2
    assert "--id-col describes a table but no --csv was given" in err


def test_missing_csv_file_is_named(capsys, tmp_path):
    missing = tmp_path / "nope.csv"
    args = table_args(missing)
    code, _, err = run(capsys, "train", *args, "--out", str(tmp_path / "r"))
    assert code == 2
    assert f"--csv {missing}: no such file" in err


def test_hidden_dim_must_be_divisible_by_heads(capsys, csv_path, tmp_path):
    code, _, err = run(
        capsys, "train", *table_args(csv_path), "--hidden-dim", "10", "--heads", "4",
        "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert code == 2
    assert "--hidden-dim (10) must be divisible by --heads (4)" in err


def test_quantiles_must_include_the_reported_levels(capsys, csv_path, tmp_path):
    code, _, err = run(
        capsys, "train", *table_args(csv_path), "--quantiles", "0.25", "0.5", "0.75",
        "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert code == 2
    assert "--quantiles must include 0.5 and 0.9" in err


def test_non_positive_history_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--history", "0"])
    assert exit_info.value.code == 2
    assert "--history: expected an integer >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, values", [("--known-cols", ["a", "b"]), ("--quantiles", ["0.5", "0.9"])]
)
def test_a_list_flag_given_twice_is_refused_instead_of_dropping_the_first(capsys, flag, values):
    # argparse keeps the last one: `--known-cols a --known-cols b` trained without `a`.
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", flag, values[0], flag, values[1]])
    assert exit_info.value.code == 2
    assert f"{flag} given twice" in capsys.readouterr().err


def test_unknown_scaler_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--scaler", "magic"])
    assert "invalid choice: 'magic'" in capsys.readouterr().err


def test_bad_table_is_reported_with_the_data_layers_message(capsys, tmp_path):
    table = pd.read_csv(write_table(tmp_path / "t.csv"))
    table["sales"] = table["sales"].astype(object)
    table.loc[5, "sales"] = "n/a?"
    table.to_csv(tmp_path / "bad.csv", index=False)
    code, _, err = run(capsys, "train", *table_args(tmp_path / "bad.csv"), "--out", str(tmp_path))
    assert code == 2
    assert "column 'sales' has 1 non-numeric values" in err


def test_season_longer_than_history_is_rejected(capsys, csv_path, tmp_path):
    code, _, err = run(
        capsys, "train", *table_args(csv_path), "--season-period", "30",
        "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert code == 2
    assert "seasonal naive period (30 steps) exceeds --history (14)" in err


def test_existing_run_needs_resume_or_overwrite(capsys, csv_path, tmp_path):
    (tmp_path / "checkpoints").mkdir()
    code, _, err = run(capsys, "train", *table_args(csv_path), "--out", str(tmp_path))
    assert code == 2
    assert "already holds a run; pass --resume" in err


def test_overwrite_removes_every_file_of_the_earlier_run_and_nothing_else(tmp_path):
    run_files = ["config.json", "history.json", "metrics.json", "metrics_validation.json",
                 "forecasts.csv", "forecasts_qat_test.csv", "models/qat.msgpack",
                 "plots/forecasts_int8.png", "checkpoints/fp32/latest/3/x"]  # fmt: skip
    mine = ["notes.txt", "table.csv", "data/config.json"]
    for name in run_files + mine:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    removed = cli.remove_run_files(tmp_path)
    assert removed == sorted(["checkpoints/", "models/", "plots/", "config.json", "history.json",
                              "metrics.json", "metrics_validation.json", "forecasts.csv",
                              "forecasts_qat_test.csv"])  # fmt: skip
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(mine)
    assert not cli.holds_run(tmp_path)


@pytest.mark.parametrize(
    "renamed, flags, message",
    [
        ({"promo": "nope"}, [], "nope"),  # --known-cols nope
        ({}, ["--season-period", "30"], "seasonal naive period (30 steps) exceeds --history"),
    ],
)
def test_overwrite_keeps_the_earlier_run_when_the_table_is_refused(
    capsys, csv_path, tmp_path, renamed, flags, message
):
    run_files = ["config.json", "metrics.json", "models/fp32.msgpack", "checkpoints/fp32/3/x"]
    for name in run_files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    args = [renamed.get(arg, arg) for arg in table_args(csv_path)]
    code, out, err = run(capsys, "train", *args, *flags, "--out", str(tmp_path), "--overwrite")
    assert code == 2
    assert message in err
    assert "removed the earlier run" not in out
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(run_files)


@pytest.mark.parametrize("command", ["evaluate", "forecast", "plot"])
def test_commands_on_a_directory_without_a_run_say_so(capsys, tmp_path, command):
    code, _, err = run(capsys, command, "--run", str(tmp_path))
    assert code == 2
    assert "config.json does not exist" in err


# Non-finite numbers, out-of-range seeds, unusable output paths and contradictory
# flags: refused by name before any data is read or any training starts.


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--qat-lr", "nan", "a finite number > 0"),
        ("--lr", "nan", "a finite number > 0"),
        ("--lr", "inf", "a finite number > 0"),
        ("--weight-decay", "nan", "a finite number >= 0"),
        ("--weight-decay", "inf", "a finite number >= 0"),
        ("--clip-norm", "nan", "a finite number > 0"),
        ("--clip-norm", "inf", "a finite number > 0"),
        ("--dropout", "nan", r"a number in \[0, 1\)"),
        ("--validation-fraction", "nan", r"a number in \[0, 1\)"),
        ("--test-fraction", "nan", r"a number in \[0, 1\)"),
        ("--max-missing-fraction", "nan", r"a number in \[0, 1\]"),
        ("--seed", "99999999999999999999999", rf"an integer in 0..{MAX_SEED} \(2\*\*32 - 3\)"),
        ("--seed", str(MAX_SEED + 1), rf"an integer in 0..{MAX_SEED} \(2\*\*32 - 3\)"),
    ],
)
def test_non_finite_and_out_of_range_numbers_are_refused_by_the_parser(
    capsys, flag, value, message
):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(f"argument {flag}: expected {message}, got {value}", err), err


def test_largest_seed_parses_and_its_derived_keys_exist():
    args = cli.build_parser().parse_args(["train", "--seed", str(MAX_SEED)])
    assert args.seed == MAX_SEED
    assert TrainingConfig(seed=MAX_SEED).seed == MAX_SEED
    # QAT calibration draws batches with seed + 2: its key holds the whole seed (a key
    # keeps a seed's low 32 bits, so a larger seed would share the keys of a smaller one).
    for derived in (MAX_SEED, MAX_SEED + 2):
        assert jax.random.key_data(jax.random.key(derived)).tolist() == [0, derived]
    with pytest.raises(ValueError, match=r"TrainingConfig\.seed must be <= "):
        TrainingConfig(seed=MAX_SEED + 1)


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: TrainingConfig(learning_rate=math.nan), "TrainingConfig.learning_rate"),
        (lambda: TrainingConfig(learning_rate=math.inf), "TrainingConfig.learning_rate"),
        (lambda: TrainingConfig(weight_decay=math.inf), "TrainingConfig.weight_decay"),
        (lambda: TrainingConfig(clip_norm=math.nan), "TrainingConfig.clip_norm"),
        (lambda: TrainingConfig(time_budget=math.inf), "TrainingConfig.time_budget"),
        (lambda: QATTrainingConfig(learning_rate=math.nan), "QATTrainingConfig.learning_rate"),
        (lambda: ModelConfig(dropout_rate=math.nan), "ModelConfig.dropout_rate"),
        (
            lambda: DataConfig.pedestrian(validation_fraction=math.nan),
            "DataConfig.validation_fraction",
        ),
        (
            lambda: DataConfig.pedestrian(max_missing_fraction=math.nan),
            "DataConfig.max_missing_fraction",
        ),
    ],
)
def test_configs_refuse_non_finite_numbers_by_field(make, field):
    with pytest.raises(ValueError, match=rf"^{re.escape(field)} must lie in .* and be finite"):
        make()


def test_an_empty_compile_cache_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--compile-cache", ""])
    assert exit_info.value.code == 2
    assert "argument --compile-cache: expected a folder or 'none', got an empty path" in (
        capsys.readouterr().err
    )


@pytest.fixture
def a_file(tmp_path) -> pathlib.Path:
    path = tmp_path / "afile"
    path.write_text("not a folder\n")
    return path


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--out", "{file}"], "--out {file}: is a file, not a folder"),
        (["train", "--out", "{file}/sub"], "--out {file}/sub: {file} is a file, not a folder"),
        (["train", "--compile-cache", "{file}"], "--compile-cache {file}: is a file, not a folder"),
        (
            ["predict", "--run", "{dir}/run", "--csv", "{dir}/h.csv", "--out", "{dir}"],
            "--out {dir}: is a folder, not a file",
        ),
        (
            ["forecast", "--run", "{dir}/run", "--output", "{dir}"],
            "--output {dir}: is a folder, not a file",
        ),
        (
            ["experiment", "clipping", "--out", "{file}/x"],
            "--out {file}/x: {file} is a file, not a folder",
        ),
        (["demo", "--out", "{file}"], "--out {file}: is a file, not a folder"),
    ],
)
def test_unusable_output_paths_are_refused_before_any_work(capsys, a_file, argv, message):
    values = {"file": str(a_file), "dir": str(a_file.parent)}
    argv = [arg.format(**values) for arg in argv]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert f"error: {message.format(**values)}" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_os_error_left_to_main_is_one_line_naming_the_path(capsys, monkeypatch, tmp_path):
    def fail(args):
        raise IsADirectoryError(21, "Is a directory", str(tmp_path / "x.csv"))

    monkeypatch.setitem(cli.COMMANDS, "predict", fail)
    code, _, err = run(
        capsys, "predict", "--run", "r", "--csv", "h.csv", "--out", "o.csv",
        "--compile-cache", "none",
    )  # fmt: skip
    assert code == 2
    assert err == f"tft-jax predict: error: {tmp_path / 'x.csv'}: Is a directory\n"


@pytest.mark.parametrize("mark", ["config.json", "models"])
def test_a_saved_forecaster_without_checkpoints_is_a_run_too(capsys, csv_path, tmp_path, mark):
    (tmp_path / mark).mkdir() if mark == "models" else (tmp_path / mark).write_text("{}")
    code, _, err = run(capsys, "train", *table_args(csv_path), "--out", str(tmp_path))
    assert code == 2
    assert f"--out {tmp_path} already holds a run; pass --resume" in err


def test_demo_refuses_a_folder_holding_another_run(capsys, tmp_path):
    (tmp_path / "checkpoints" / "fp32").mkdir(parents=True)
    config = {"source": {"csv": "t.csv", "command": "train"}, "arguments": {}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, _, err = run(capsys, "demo", "--out", str(tmp_path), "--compile-cache", "none")
    assert code == 2
    assert f"--out {tmp_path} holds a run that is not the demo's" in err
    assert (tmp_path / "checkpoints" / "fp32").is_dir()  # nothing deleted


def test_a_demo_run_is_recognised_by_its_source_or_its_settings(tmp_path):
    config = tmp_path / "config.json"
    assert not cli.is_demo_run(tmp_path)  # no config.json
    config.write_text(json.dumps({"source": {"csv": None, "command": "demo"}}))
    assert cli.is_demo_run(tmp_path)
    config.write_text(json.dumps({"source": {"csv": None, "command": "train"}}))
    assert not cli.is_demo_run(tmp_path)
    # Written before config.json said which command: the demo's settings (any eval batch).
    training = dataclasses.replace(DEMO.training, eval_batch_size=17)
    old = json.loads(json.dumps(dataclasses.replace(DEMO, training=training).to_json()))
    config.write_text(json.dumps({**old, "source": {"csv": None}}))
    assert cli.is_demo_run(tmp_path)
    # ... and from before the demo clipped its forecasts at 0, a setting read after training.
    old["data"]["nonnegative"] = False
    config.write_text(json.dumps({**old, "source": {"csv": None}}))
    assert cli.is_demo_run(tmp_path)
    old["model"]["hidden_dim"] = 16
    config.write_text(json.dumps({**old, "source": {"csv": None}}))
    assert not cli.is_demo_run(tmp_path)
    config.write_text('{"source": ')
    assert not cli.is_demo_run(tmp_path)


def test_a_demo_stopped_before_it_saved_is_still_the_demos(tmp_path):
    (tmp_path / "checkpoints" / "fp32").mkdir(parents=True)  # what a stopped run leaves
    assert cli.holds_run(tmp_path) and not cli.is_demo_run(tmp_path)
    (tmp_path / cli.DEMO_MARKER).write_text("written by `tft-jax demo`\n")
    assert cli.is_demo_run(tmp_path)
    cli.remove_run_files(tmp_path)  # the demo's --overwrite keeps its marker
    assert (tmp_path / cli.DEMO_MARKER).is_file() and not cli.holds_run(tmp_path)


def test_resume_and_overwrite_together_are_refused(capsys, csv_path, tmp_path):
    code, _, err = run(
        capsys, "train", *table_args(csv_path), "--resume", "--overwrite",
        "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert code == 2
    assert "--resume and --overwrite contradict each other" in err
    assert not (tmp_path / "r").exists()


def test_qat_flags_without_qat_are_refused_even_at_their_defaults(capsys, csv_path, tmp_path):
    default_steps = str(QATTrainingConfig().steps)
    code, _, err = run(
        capsys, "train", *table_args(csv_path), "--qat-steps", default_steps,
        "--qat-lr=1e-4", "--qat-bits", "4", "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert code == 2
    assert "--qat-steps, --qat-lr, --qat-bits given without --qat" in err
    assert not (tmp_path / "r").exists()


def test_split_fractions_with_the_cut_times_are_refused(capsys, csv_path, tmp_path):
    # table_args gives --validation-fraction and --test-fraction; the cut times replace them.
    code, _, err = run(
        capsys, "train", *table_args(csv_path), "--validation-start", "2024-03-01",
        "--test-start", "2024-03-20", "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert code == 2
    assert (
        "--validation-fraction, --test-fraction and --validation-start/--test-start "
        "contradict each other"
    ) in err
    assert not (tmp_path / "r").exists()
    # The cut times alone, and the fractions alone, are fine.
    parse = cli.build_parser().parse_args
    cuts = ["--validation-start", "2024-03-01", "--test-start", "2024-03-20"]
    assert forecaster_config(parse(["train", *cuts]), qat=False).data.test_start == "2024-03-20"
    forecaster_config(parse(["train", "--test-fraction", "0.2"]), qat=False)


def test_qat_flags_with_qat_and_plain_train_flags_pass_the_check(csv_path):
    parse = cli.build_parser().parse_args
    check_train_flags(parse(["train", "--qat", "--qat-steps", "3", "--qat-lr", "1e-3"]))
    check_train_flags(parse(["train", "--lr", "1e-3", "--overwrite"]))
    with pytest.raises(UsageError, match=r"^--qat-time-budget given without --qat"):
        check_train_flags(parse(["train", "--qat-time-budget", "none"]))


@pytest.mark.parametrize("command", ["predict", "evaluate", "forecast", "plot"])
def test_run_reading_commands_default_to_the_runs_settings(capsys, command):
    argv = [command, "--run", "r"] + (["--csv", "h", "--out", "o"] if command == "predict" else [])
    args = cli.build_parser().parse_args(argv)
    assert (args.eval_batch_size, args.encoding, args.dayfirst, args.time_format) == (
        None, None, None, None,
    )  # fmt: skip
    given = cli.build_parser().parse_args(
        [*argv, "--eval-batch-size", "5", "--encoding", "latin-1", "--no-dayfirst",
         "--time-format", "%d/%m/%Y"]
    )  # fmt: skip
    assert (given.eval_batch_size, given.encoding, given.dayfirst, given.time_format) == (
        5, "latin-1", False, "%d/%m/%Y",
    )  # fmt: skip
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([command, "--help"])
    assert "(default: the run's --eval-batch-size)" in " ".join(capsys.readouterr().out.split())
    train = cli.build_parser().parse_args(["train"])
    assert train.eval_batch_size == TrainingConfig().eval_batch_size


def test_the_clipping_experiment_takes_no_eval_batch_size_it_would_ignore(capsys):
    # Its validation batches are its --batch-size; the flag used to parse and do nothing.
    parse = cli.build_parser().parse_args
    assert not hasattr(parse(["experiment", "clipping"]), "eval_batch_size")
    with pytest.raises(SystemExit):
        parse(["experiment", "clipping", "--eval-batch-size", "3"])
    assert "unrecognized arguments: --eval-batch-size 3" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--season-period", "3"], ["--nonnegative"]])
def test_the_clipping_experiment_takes_no_forecast_flags_it_would_ignore(capsys, flags):
    # It scores no forecast: neither flag reached anything it computes.
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["experiment", "clipping", *flags])
    assert f"unrecognized arguments: {' '.join(flags)}" in capsys.readouterr().err


def _help(capsys, monkeypatch, *command: str) -> str:
    """The `--help` of a command, each flag's help on one line (no wrapping)."""
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*command, "--help"])
    return capsys.readouterr().out


def test_help_states_which_form_of_a_boolean_flag_is_the_default(capsys, monkeypatch):
    text = _help(capsys, monkeypatch, "train")
    # argparse puts the help of a long pair of flags on the next line.
    (line,) = re.findall(r"--window-normalization, --no-window-normalization\s+(.*)", text)
    assert DataConfig.__dataclass_fields__["window_normalization"].default is True
    assert line.endswith("(default --window-normalization)")


def test_help_states_an_overridden_default_once(capsys, monkeypatch):
    # The clipping experiment's own width replaces the config's "(default: --hidden-dim)".
    text = _help(capsys, monkeypatch, "experiment", "clipping")
    (line,) = re.findall(r"--variable-hidden-dim VARIABLE_HIDDEN_DIM\s+(.*)", text)
    assert line.count("default") == 1 and line.endswith("(default 8)")


@pytest.mark.parametrize(
    "flags", [["--dayfirst"], ["--encoding", "latin-1"], ["--encoding", "utf-8"]]
)
def test_reading_flags_without_csv_are_refused_not_dropped(flags):
    # The bundled table is read with its own settings: these flags would do nothing.
    args = cli.build_parser().parse_args(["train", *flags])
    with pytest.raises(UsageError, match=rf"^{flags[0]} describes a table but no --csv was given"):
        forecaster_config(args, qat=False)


def _day_first_latin1_table(csv_path: pathlib.Path, path: pathlib.Path) -> pd.DataFrame:
    table = pd.read_csv(csv_path)
    table["store"] = table["store"].str.replace("alpha", "alph\u00e9")
    written = table.assign(day=pd.to_datetime(table["day"]).dt.strftime("%d/%m/%Y"))
    written.to_csv(path, index=False, encoding="latin-1")
    return table


def test_reading_flags_apply_over_the_runs_data_settings(csv_path, tmp_path):
    path = tmp_path / "dmy.csv"
    table = _day_first_latin1_table(csv_path, path)
    args = cli.build_parser().parse_args(["train", *table_args(csv_path)])
    forecaster = Forecaster.from_config(forecaster_config(args, qat=False))
    argv = ["predict", "--run", "r", "--csv", str(path), "--out", "o.csv"]
    plain = cli.build_parser().parse_args(argv)
    with pytest.raises(UsageError, match=r"^--csv: .* is not utf-8 text .*--encoding latin-1"):
        cli.read_given_csv(path, "--csv", forecaster, plain)
    for flags in (["--dayfirst"], ["--time-format", "%d/%m/%Y"]):
        given = cli.build_parser().parse_args([*argv, "--encoding", "latin-1", *flags])
        data = cli.reading_config(forecaster, given)
        assert data.encoding == "latin-1" and data.history == HISTORY
        assert forecaster.config.data.encoding == "utf-8"  # the run's settings are kept
        read = cli.read_given_csv(path, "--csv", forecaster, given)
        assert list(read["store"]) == list(table["store"])
        np.testing.assert_array_equal(
            read["day"].to_numpy(), pd.to_datetime(table["day"]).to_numpy()
        )
    wrong = cli.build_parser().parse_args([*argv, "--encoding", "latin-1", "--time-format", "%Y"])
    with pytest.raises(UsageError, match=r"^--csv .*dmy\.csv: column 'day' has 300 times not in"):
        cli.read_given_csv(path, "--csv", forecaster, wrong)


def test_a_folder_saved_by_forecaster_save_needs_csv_instead_of_the_bundled_table(csv_path):
    # config.json without the CLI's `source`: the run-reading commands used to fall back to
    # the pedestrian counts and fail on their columns ("table lacks columns ['store', ...]").
    args = cli.build_parser().parse_args(["evaluate", "--run", "saved"])
    train = cli.build_parser().parse_args(["train", *table_args(csv_path)])
    mine = Forecaster.from_config(forecaster_config(train, qat=False))
    with pytest.raises(UsageError, match=r"^--run saved: its config.json names no training table"):
        cli.run_table(args, {"data": {}}, mine)
    pedestrian = Forecaster.from_config(ForecasterConfig(data=DataConfig.pedestrian()))
    assert list(cli.run_table(args, {}, pedestrian).columns[:2]) == ["Sensor", "Date_Time"]
    # `tft-jax train` without --csv records `source.csv` None: the bundled table.
    assert "Sensor" in cli.run_table(args, {"source": {"csv": None}}, mine).columns


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--coordinator", "h:1234"], "--coordinator without --num-processes, --process-id"),
        (["--num-processes", "2", "--process-id", "0"], "without --coordinator"),
        (
            ["--coordinator", "h:1", "--num-processes", "2", "--process-id", "2"],
            r"--process-id must be in \[0, 2\) for 2 processes, got 2",
        ),
        (
            ["--coordinator", "h", "--num-processes", "2", "--process-id", "0"],
            "--coordinator must be HOST:PORT with a port in 1..65535, got 'h'",
        ),
    ],
)
def test_multihost_flags_are_checked_before_joining_a_run(
    capsys, csv_path, tmp_path, flags, message
):
    code, _, err = run(capsys, "train", *table_args(csv_path), *flags, "--out", str(tmp_path / "r"))
    assert code == 2
    assert re.search(message, err), err
    assert not (tmp_path / "r").exists()


MULTIHOST = ["--coordinator", "localhost:1234", "--num-processes", "2", "--process-id", "1"]


def test_a_processs_flag_errors_end_it_before_it_joins_the_run(
    capsys, csv_path, tmp_path, monkeypatch
):
    # A --qat-* flag without --qat on one host was found after joining: that process
    # printed its error and then waited in JAX's shutdown, the others waited for it.
    def join(*settings):
        raise AssertionError(f"joined {settings}")

    monkeypatch.setattr(cli, "initialize_multihost", join)
    code, _, err = run(
        capsys, "train", *table_args(csv_path), *MULTIHOST, "--qat-steps", "3",
        "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert code == 2
    assert err.splitlines() == [
        "tft-jax train: error: --qat-steps given without --qat, which they configure; pass "
        "--qat to fine-tune with QAT, or drop them"
    ]


def test_an_error_after_joining_ends_the_process_instead_of_returning(
    capsys, csv_path, tmp_path, monkeypatch
):
    # Returning from main would wait in JAX's distributed shutdown for the processes that
    # carry on: the process is ended with its status once the error is printed.
    class Ended(Exception):
        pass

    def end(code):
        raise Ended(code)

    monkeypatch.setattr(cli, "initialize_multihost", lambda *settings: None)
    monkeypatch.setattr(cli.os, "_exit", end)
    with pytest.raises(Ended) as ended:
        cli.main(["train", *table_args(csv_path), *MULTIHOST, "--target", "revenue",
                  "--out", str(tmp_path / "r")])  # fmt: skip
    assert ended.value.args == (2,)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "tft-jax train: process 1 of 2 joining the run at localhost:1234 (JAX ends each "
        f"process if all 2 have not joined within {JOIN_TIMEOUT_SECONDS} s)"
    )
    assert err[-1].startswith("tft-jax train: error: --csv ") and "'revenue'" in err[-1]


def test_data_layer_keywords_become_the_flags_of_the_running_command(capsys, csv_path, tmp_path):
    message = (
        "give both validation_start and test_start; off the freq='D' grid; pass their zone "
        "as timezone= (--timezone); use target_transform='none' or a larger "
        "max_missing_fraction; df['time_col'] stays"
    )
    assert flag_message(message) == (
        "give both --validation-start and --test-start; off the --freq 'D' grid; pass their "
        "zone as --timezone; use --target-transform 'none' or a larger --max-missing-fraction; "
        "df['time_col'] stays"
    )
    # `predict` has --time-format but not --max-missing-fraction (a training setting).
    predict_flags = {"time_format", "encoding", "dayfirst"}
    assert flag_message("time_format='%d'; a larger max_missing_fraction", predict_flags) == (
        "--time-format '%d'; a larger max_missing_fraction"
    )
    # End to end: only --validation-start given (the data layer names both keywords).
    code, _, err = run(
        capsys, "train", *table_args(csv_path), "--validation-start", "2024-03-01",
        "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert code == 2
    assert "give both --validation-start and --test-start" in err


def test_global_batch_must_divide_over_every_device_of_every_process():
    check_global_batch(8, 4, 2)
    with pytest.raises(
        ValueError,
        match=r"TrainingConfig.batch_size \(6\) is the global batch .* 4 "
        r"devices of 2 processes; use a multiple of 4",
    ):
        check_global_batch(6, 4, 2)
    message = "TrainingConfig.batch_size (6) must be divisible by ..."
    assert flag_message(message).startswith("--batch-size (6)")


def _stack(batches):
    return jax.tree.map(lambda *leaves: np.concatenate(leaves), *batches)


def test_processes_read_their_own_rows_of_the_same_shuffled_global_batches(csv_path):
    args = cli.build_parser().parse_args(["train", *table_args(csv_path)])
    settings = forecaster_config(args, qat=False)
    windows = prepare_dataset(csv_path, **settings.data.prepare_options()).train
    for epoch in (0, 1):
        whole = list(epoch_batches(windows, 8, seed=3)(epoch))
        parts = [
            list(epoch_batches(windows, 8, seed=3, rows=process_rows(8, index, 2))(epoch))
            for index in range(2)
        ]
        assert len(whole) == len(parts[0]) == len(parts[1]) == len(windows) // 8
        for step, batch in enumerate(whole):
            assert parts[0][step].batch_size == parts[1][step].batch_size == 4
            assembled = _stack([parts[0][step], parts[1][step]])
            for got, want in zip(jax.tree.leaves(assembled), jax.tree.leaves(batch), strict=True):
                np.testing.assert_array_equal(got, want)
    fixed = fixed_batches(windows, 8)
    halves = [fixed_batches(windows, 8, process_rows(8, index, 2)) for index in range(2)]
    for step, batch in enumerate(fixed):
        assembled = _stack([halves[0][step], halves[1][step]])
        np.testing.assert_array_equal(assembled.target, batch.target)


def test_demo_options_parse_as_train_arguments():
    args = cli.build_parser().parse_args(["train", *cli.demo_argv()])
    assert args.qat and args.history == 72 and args.horizon == 24
    assert args.history >= 24  # the hourly seasonal naive period must fit
    # Every setting of the demo reaches it, limits it turns off included.
    assert forecaster_config(args, qat=True) == DEMO


def test_compact_selection_flag_reaches_the_model_config_and_survives_config_json(csv_path):
    args = cli.build_parser().parse_args(["train", *table_args(csv_path), "--compact-selection"])
    config = forecaster_config(args, qat=True)
    assert config.model.compact_selection is True
    assert ForecasterConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    default = cli.build_parser().parse_args(["train", *table_args(csv_path)])
    assert forecaster_config(default, qat=False).model.compact_selection is False


def test_every_flag_default_is_the_config_default(csv_path):
    args = cli.build_parser().parse_args(["train", *table_args(csv_path)])
    config = forecaster_config(args, qat=True)
    assert config.model == ModelConfig() and config.training == TrainingConfig()
    assert config.qat == QATTrainingConfig()


def test_metrics_table_names_the_integer_models_width():
    # A --qat-bits 4 run's integer model (named 'int8': int8 arrays) was shown as "TFT int8".
    row = {"p50_q_risk": 0.2, "p90_q_risk": 0.1, "mean_quantile_loss": 1.0}
    metrics = {
        "models": {"fp32": row, "int8": row},
        "comparison": {"int8_vs_fp32_p50_q_risk_relative": 0.0125},
    }
    eight = cli.metrics_table(metrics).splitlines()
    assert eight[2].startswith("TFT int8 ") and eight[-1] == "int8 vs fp32 (P50): +1.25%"
    four = cli.metrics_table({**metrics, "qat_bits": 4}).splitlines()
    assert four[2].startswith("TFT int4 (codes in int8) ") and four[2][26:] == eight[2][26:]
    assert four[-1] == "int4 vs fp32 (P50): +1.25%"


def test_json_ready_turns_non_finite_floats_into_null():
    data = {"a": math.nan, "b": [1.0, math.inf], "c": np.float32(0.5), "d": (1, 2)}
    assert cli.json_ready(data) == {"a": None, "b": [1.0, None], "c": 0.5, "d": [1, 2]}


# ---------------------------------------------------------------------------
# End to end


# What the trained run's `train` printed to stderr (its warnings among it).
TRAINED_RUN_STDERR: list[str] = []


@pytest.fixture(scope="module")
def trained_run(csv_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main(
            [
                "train", *table_args(csv_path), *TINY_MODEL, *TINY_RUN, *TINY_QAT,
                "--out", str(out),
            ]
        )  # fmt: skip
    TRAINED_RUN_STDERR.append(stderr.getvalue())
    assert code == 0, stderr.getvalue()
    return out


def test_train_saves_over_its_own_checkpoints_without_an_earlier_results_warning(trained_run):
    # `train` saves its model with this run's checkpoints beside it, then writes its
    # metrics, forecasts and plots: none of them is another model's.
    assert "also holds" not in TRAINED_RUN_STDERR[0]
    assert set(earlier_results(trained_run)) >= {"checkpoints/", "metrics.json", "plots/"}


@pytest.mark.slow
def test_train_writes_metrics_of_all_four_models_with_finite_values(trained_run):
    metrics = json.loads((trained_run / "metrics.json").read_text())
    assert set(metrics["models"]) == {"seasonal_naive", "best_baseline", "fp32", "qat", "int8"}
    for name, row in metrics["models"].items():
        for key in ("p50_q_risk", "p90_q_risk", "mean_quantile_loss", "mean_quantile_loss_scaled"):
            assert math.isfinite(row[key]) and row[key] >= 0, (name, key)
    assert metrics["split"] == "test" and metrics["seasonal_naive_period"] == 7
    assert metrics["qat_bits"] == 8
    # int8 runs the fake-quant model's arithmetic in integers: near-identical risk.
    assert metrics["models"]["int8"]["p50_q_risk"] == pytest.approx(
        metrics["models"]["qat"]["p50_q_risk"], rel=0.05
    )


@pytest.mark.slow
def test_train_writes_the_config_it_used(trained_run, csv_path):
    config = json.loads((trained_run / "config.json").read_text())
    assert config["source"]["csv"] == str(csv_path.resolve())
    assert config["data"]["static_cols"] == ["size"]
    assert config["model"]["hidden_dim"] == 8 and config["model"]["num_heads"] == 2
    assert config["model"]["compact_selection"] is False
    assert config["tft_config"]["sequence_length"] == HISTORY
    assert config["summary"]["fp32"]["total_steps"] == 4
    assert config["qat"]["bits"] == 8 and config["qat"]["calibration_batches"] == 2
    assert config["summary"]["qat"]["qat_config"]["calibration_batches"] == 2
    assert config["season_period"] == 7
    assert config["models"] == ["fp32", "qat", "int8"]


@pytest.mark.slow
def test_train_writes_a_forecast_csv_with_a_row_per_test_window_step(trained_run):
    metrics = json.loads((trained_run / "metrics.json").read_text())
    table = pd.read_csv(trained_run / "forecasts.csv")
    assert list(table.columns) == [
        "model", "store", "forecast_start", "day", "horizon", "p10", "p50", "p90", "actual"
    ]  # fmt: skip
    assert len(table) == metrics["windows"] * HORIZON
    assert set(table["store"]) == {"alpha", "beta", "gamma"}
    assert table["horizon"].between(1, HORIZON).all()
    assert table[["p10", "p50", "p90", "actual"]].notna().all().all()


@pytest.mark.slow
def test_train_writes_non_empty_pngs(trained_run):
    names = {path.name for path in (trained_run / "plots").glob("*.png")}
    assert names == {
        "forecasts_fp32.png", "forecasts_qat.png", "forecasts_int8.png",
        "attention.png", "variable_importance.png", "loss_curves.png",
    }  # fmt: skip
    for name in names:
        assert (trained_run / "plots" / name).read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.slow
def test_evaluate_reproduces_the_metrics_from_the_saved_models(capsys, trained_run):
    before = json.loads((trained_run / "metrics.json").read_text())
    code, out, _ = run(capsys, "evaluate", "--run", str(trained_run), "--compile-cache", "none")
    assert code == 0 and "TFT int8" in out
    after = json.loads((trained_run / "metrics.json").read_text())
    for name in ("seasonal_naive", "best_baseline", "fp32", "qat", "int8"):
        assert after["models"][name]["p50_q_risk"] == pytest.approx(
            before["models"][name]["p50_q_risk"], rel=1e-5
        )


@pytest.mark.slow
def test_evaluate_on_another_table_leaves_the_runs_metrics_alone(
    capsys, trained_run, csv_path, tmp_path
):
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    before = (copy / "metrics.json").read_bytes()
    other = tmp_path / "doubled.csv"
    table = pd.read_csv(csv_path)
    table["sales"] = table["sales"] * 2.0 + 5.0  # another table: other errors, other metrics
    table.to_csv(other, index=False)
    code, out, _ = run(
        capsys, "evaluate", "--run", str(copy), "--csv", str(other), "--compile-cache", "none"
    )
    assert code == 0
    assert (copy / "metrics.json").read_bytes() == before  # the run's own figures stand
    written = copy / "metrics_test_doubled.json"
    assert f"metrics: {written}" in out
    claims = json.loads((copy / "other_tables.json").read_text())
    assert claims == {"doubled": str(other.resolve())}
    scored = json.loads(written.read_text())
    assert scored["table"] == str(other) and scored["split"] == "test"
    own = json.loads(before)
    assert scored["models"]["fp32"]["p50_q_risk"] != own["models"]["fp32"]["p50_q_risk"]
    # the run's own table, named with --csv, still updates the run's metrics.json
    code, out, _ = run(
        capsys, "evaluate", "--run", str(copy), "--csv", str(csv_path), "--compile-cache", "none"
    )
    assert code == 0 and f"metrics: {copy / 'metrics.json'}" in out
    again = json.loads((copy / "metrics.json").read_text())
    assert again["models"]["fp32"]["p50_q_risk"] == pytest.approx(
        own["models"]["fp32"]["p50_q_risk"], rel=1e-5
    )
    assert again["seconds"] == own["seconds"]  # train's other entries kept
    # written over metrics.json on purpose, then the run's own table again: no stale `table`
    code, _, _ = run(
        capsys, "evaluate", "--run", str(copy), "--csv", str(other), "--output",
        str(copy / "metrics.json"), "--compile-cache", "none",
    )  # fmt: skip
    assert code == 0 and json.loads((copy / "metrics.json").read_text())["table"] == str(other)
    code, _, _ = run(capsys, "evaluate", "--run", str(copy), "--compile-cache", "none")
    assert code == 0 and "table" not in json.loads((copy / "metrics.json").read_text())


@pytest.mark.slow
def test_evaluate_names_the_table_whose_test_targets_are_all_zero(
    capsys, trained_run, csv_path, tmp_path
):
    # Raised by the Forecaster, not the data layer: the message named no file.
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    table = pd.read_csv(csv_path)
    last_days = sorted(table["day"].unique())[-40:]  # past the test cut
    zeroed = tmp_path / "zeroed.csv"
    table.assign(sales=table["sales"].where(~table["day"].isin(last_days), 0.0)).to_csv(
        zeroed, index=False
    )
    code, _, err = run(
        capsys, "evaluate", "--run", str(copy), "--csv", str(zeroed), "--compile-cache", "none"
    )
    assert code == 2 and "Traceback" not in err
    assert f"--csv {zeroed}: evaluate: every target of the test split (" in err


@pytest.mark.slow
def test_evaluate_refuses_an_output_that_is_its_table(capsys, trained_run, csv_path, tmp_path):
    other = tmp_path / "table.csv"
    shutil.copyfile(csv_path, other)
    code, _, err = run(
        capsys, "evaluate", "--run", str(trained_run), "--csv", str(other), "--output",
        str(other), "--compile-cache", "none",
    )  # fmt: skip
    assert code == 2
    assert f"--output {other} is the --csv file" in err
    assert other.read_bytes() == csv_path.read_bytes()
    # Without --csv the run's own table is read: it was overwritten with the metrics.
    code, _, err = run(
        capsys, "evaluate", "--run", str(trained_run), "--output", str(csv_path),
        "--compile-cache", "none",
    )  # fmt: skip
    assert code == 2 and f"--output {csv_path} is the run's table" in err
    assert csv_path.read_bytes() == other.read_bytes()


@pytest.mark.slow
def test_evaluate_keeps_trains_entries_of_metrics_json_however_its_path_is_spelled(
    capsys, trained_run, tmp_path
):
    # Compared as text, an absolute --output to the run's metrics.json dropped train's
    # `plots`, `seconds` and `size`.
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    before = json.loads((copy / "metrics.json").read_text())
    spelled = copy / "plots" / ".." / "metrics.json"
    code, _, _ = run(
        capsys, "evaluate", "--run", str(copy), "--output", str(spelled), "--compile-cache", "none"
    )
    assert code == 0
    after = json.loads((copy / "metrics.json").read_text())
    assert {key: after[key] for key in ("plots", "seconds")} == {
        key: before[key] for key in ("plots", "seconds")
    }


def test_forecast_refuses_an_output_that_is_the_runs_metrics_json(capsys, trained_run):
    # Before: forecast --output RUN/metrics.json replaced it with a CSV, silently, and
    # evaluate then failed on it ("metrics.json is damaged (not JSON)").
    metrics = trained_run / "metrics.json"
    before = metrics.read_bytes()
    code, _, err = run(
        capsys, "forecast", "--run", str(trained_run), "--output", str(metrics),
        "--compile-cache", "none",
    )  # fmt: skip
    assert code == 2 and "is the run's metrics.json, which tft-jax reads" in err, err
    assert metrics.read_bytes() == before


@pytest.mark.slow
def test_forecast_command_writes_the_chosen_models_csv(capsys, trained_run):
    output = trained_run / "validation.csv"
    code, _, _ = run(
        capsys, "forecast", "--run", str(trained_run), "--model", "fp32", "--split",
        "validation", "--output", str(output), "--compile-cache", "none",
    )  # fmt: skip
    assert code == 0
    table = pd.read_csv(output)
    assert set(table["model"]) == {"fp32"}
    assert len(table) % HORIZON == 0 and len(table) > 0


@pytest.mark.slow
def test_predict_command_writes_what_the_python_predict_returns(capsys, trained_run, csv_path):
    table = pd.read_csv(csv_path)
    history = table[table["day"] < "2024-03-30"]
    days = pd.date_range("2024-03-30", periods=HORIZON, freq="D").strftime("%Y-%m-%d")
    future = table[table["day"].isin(days)][["store", "day", "promo"]]
    history.to_csv(trained_run / "history_in.csv", index=False)
    future.to_csv(trained_run / "future_in.csv", index=False)
    out = trained_run / "predicted.csv"
    code, stdout, _ = run(
        capsys, "predict", "--run", str(trained_run), "--csv", str(trained_run / "history_in.csv"),
        "--future-csv", str(trained_run / "future_in.csv"), "--out", str(out),
        "--compile-cache", "none",
    )  # fmt: skip
    assert code == 0 and stdout.startswith("int8: 21 forecast rows (3 series)")
    written = pd.read_csv(out)
    expected = Forecaster.load(trained_run).predict(history, future, model="int8")
    assert list(written.columns) == ["store", "day", "q0.1", "q0.5", "q0.9"]
    assert list(written["store"]) == list(expected["store"])
    np.testing.assert_array_equal(
        pd.to_datetime(written["day"]).to_numpy(), expected["day"].to_numpy()
    )
    np.testing.assert_allclose(
        written[["q0.1", "q0.5", "q0.9"]].to_numpy(),
        expected[["q0.1", "q0.5", "q0.9"]].to_numpy(),
        rtol=1e-6,
    )


def test_predict_names_the_future_columns_the_model_does_not_read(
    capsys, trained_run, csv_path, tmp_path
):
    # A future column the model does not read ('discount'; 'size', a static column read
    # from the history) was dropped without a word.
    table = pd.read_csv(csv_path)
    history = table[table["day"] < "2024-03-30"]
    days = pd.date_range("2024-03-30", periods=HORIZON, freq="D").strftime("%Y-%m-%d")
    future = table[table["day"].isin(days)][["store", "day", "promo", "size"]]
    history.to_csv(tmp_path / "history.csv", index=False)
    future.assign(discount=0.1).to_csv(tmp_path / "future.csv", index=False)
    code, _, err = run(
        capsys, "predict", "--run", str(trained_run), "--csv", str(tmp_path / "history.csv"),
        "--future-csv", str(tmp_path / "future.csv"), "--out", str(tmp_path / "out.csv"),
        "--model", "fp32", "--compile-cache", "none", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    said = [line for line in err.splitlines() if "not read" in line]
    assert said == [
        f"tft-jax predict: warning: --future-csv {tmp_path / 'future.csv'} holds the columns "
        "['size', 'discount'], which the model does not read (it reads only ['store', 'day', "
        "'promo'] of this table; the static columns ['size'] come from the history): they "
        "are not used"
    ]


def test_evaluate_refuses_another_split_over_the_runs_test_metrics(capsys, trained_run):
    # The run's test-split `plots`, `seconds` and `size` were kept in a file then marked
    # `split: validation`.
    metrics = trained_run / "metrics.json"
    before = metrics.read_bytes()
    code, _, err = run(
        capsys, "evaluate", "--run", str(trained_run), "--split", "validation",
        "--output", str(metrics), "--compile-cache", "none", "--quiet",
    )  # fmt: skip
    assert code == 2
    assert f"error: --output {metrics} holds the run's test metrics" in err
    assert f"leave out --output (evaluate writes {trained_run / 'metrics_validation.json'})" in err
    assert metrics.read_bytes() == before


def test_predict_says_how_to_raise_the_runs_limit_of_filled_history_steps(
    capsys, trained_run, csv_path, tmp_path
):
    # It said to raise max_missing_fraction, which `predict` has no flag for.
    table = pd.read_csv(csv_path)
    history = table[table["day"] < "2024-03-30"].copy()
    alpha = history.index[history["store"] == "alpha"]
    history.loc[alpha[-HISTORY:-1], "sales"] = np.nan  # the last one observed: not trailing
    history.to_csv(tmp_path / "sparse.csv", index=False)
    days = pd.date_range("2024-03-30", periods=HORIZON, freq="D").strftime("%Y-%m-%d")
    table[table["day"].isin(days)][["store", "day", "promo"]].to_csv(
        tmp_path / "future.csv", index=False
    )
    code, _, err = run(
        capsys, "predict", "--run", str(trained_run), "--csv", str(tmp_path / "sparse.csv"),
        "--future-csv", str(tmp_path / "future.csv"), "--out", str(tmp_path / "out.csv"),
        "--compile-cache", "none", "--quiet",
    )  # fmt: skip
    assert code == 2 and "'alpha' (13 of 14)" in err
    assert f"--csv {tmp_path / 'sparse.csv'}: 1 series have more than 50%" in err
    assert "raise the limit (a run keeps the one it trained with: train again with " in err
    assert "--max-missing-fraction)" in err and "DataConfig" not in err
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_a_table_lacking_a_column_the_run_uses_is_named_with_its_flag(
    capsys, trained_run, csv_path, command
):
    # It said "table lacks columns ['temperature'] (observed_cols='temperature') ...
    # pass the right names": no file, and these commands take no names.
    table = pd.read_csv(csv_path)
    lacking = trained_run / "without_temperature.csv"
    table[table["day"] < "2024-03-30"].drop(columns="temperature").to_csv(lacking, index=False)
    days = pd.date_range("2024-03-30", periods=HORIZON, freq="D").strftime("%Y-%m-%d")
    future = trained_run / "future_promo.csv"
    table[table["day"].isin(days)][["store", "day", "promo"]].to_csv(future, index=False)
    out = ["--future-csv", str(future), "--out", str(trained_run / "never.csv")]
    code, _, stderr = run(
        capsys, command, "--run", str(trained_run), "--csv", str(lacking),
        *(out if command == "predict" else []), "--compile-cache", "none",
    )  # fmt: skip
    assert code == 2
    assert stderr.strip() == (
        f"tft-jax {command}: error: --csv {lacking}: table lacks columns ['temperature'] that "
        "the model was trained with (observed_cols='temperature'); it has ['store', 'day', "
        "'sales', 'size', 'promo']: add them to the table"
    )


@pytest.mark.slow
def test_predict_command_rejects_an_unknown_model_and_a_missing_future(
    capsys, trained_run, csv_path
):
    with pytest.raises(SystemExit):
        cli.main(["predict", "--run", str(trained_run), "--csv", str(csv_path), "--out", "x.csv",
                  "--model", "fp16"])  # fmt: skip
    assert "invalid choice: 'fp16'" in capsys.readouterr().err
    code, _, err = run(
        capsys, "predict", "--run", str(trained_run), "--csv", str(csv_path),
        "--out", str(trained_run / "none.csv"), "--compile-cache", "none",
    )  # fmt: skip
    assert code == 2 and "future is required" in err


def known_future(
    table: pd.DataFrame, stores: Iterable[Any], time_format: str = "%Y-%m-%d"
) -> pd.DataFrame:
    """The known column (promo 0) of `stores` over the H days after `table`'s last day."""
    last = pd.Timestamp(table["day"].max())
    days = pd.date_range(last + pd.Timedelta(days=1), periods=HORIZON, freq="D")
    return pd.DataFrame(
        [(store, day.strftime(time_format), 0.0) for store in stores for day in days],
        columns=["store", "day", "promo"],
    )


@pytest.mark.slow
def test_plot_draws_the_forecast_after_the_data(capsys, trained_run, csv_path):
    future = known_future(pd.read_csv(csv_path), ("alpha", "beta", "gamma"))
    future.to_csv(trained_run / "future_end.csv", index=False)
    code, stdout, _ = run(
        capsys, "plot", "--run", str(trained_run), "--future-csv",
        str(trained_run / "future_end.csv"), "--series", "beta", "--compile-cache", "none",
    )  # fmt: skip
    assert code == 0 and "future_fp32.png" in stdout
    assert (trained_run / "plots" / "future_fp32.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "future chart: the first" not in stdout  # the series were named


def test_plot_says_when_the_future_chart_shows_only_the_first_series(
    capsys, trained_run, csv_path, tmp_path, monkeypatch
):
    future = tmp_path / "future_end.csv"
    known_future(pd.read_csv(csv_path), ("alpha", "beta", "gamma")).to_csv(future, index=False)
    monkeypatch.setattr(plots, "MAX_FAN_SERIES", 2)
    code, stdout, err = run(
        capsys, "plot", "--run", str(trained_run), "--future-csv", str(future),
        "--compile-cache", "none",
    )  # fmt: skip
    assert code == 0, err
    assert "future chart: the first 2 of 3 series (choose them with --series)" in stdout
    # The test fan charts were cut to the first series without a word, and --series
    # chose only the future chart's.
    assert "test fan charts: the first 2 of 3 series (choose them with --series)" in stdout


def test_plot_refuses_a_bad_future_csv_before_it_redraws_the_runs_plots(
    capsys, trained_run, csv_path, tmp_path
):
    # The run's plots were redrawn (replaced) first, then the future table was refused.
    future = known_future(pd.read_csv(csv_path), ("alpha", "beta", "gamma"))
    future.drop(index=future.index[1]).to_csv(tmp_path / "future_gap.csv", index=False)
    fans = trained_run / "plots" / "forecasts_fp32.png"
    drawn = fans.stat().st_mtime_ns
    code, _, err = run(
        capsys, "plot", "--run", str(trained_run), "--future-csv", str(tmp_path / "future_gap.csv"),
        "--compile-cache", "none", "--quiet",
    )  # fmt: skip
    assert code == 2 and f"--future-csv {tmp_path / 'future_gap.csv'}: " in err
    assert fans.stat().st_mtime_ns == drawn


@pytest.mark.slow
def test_plot_finds_numeric_series_ids_given_to_series(capsys, trained_run, csv_path, tmp_path):
    # Series ids that are numbers in the CSV: `--series 202` is the text '202'.
    numbers = {"alpha": 101, "beta": 202, "gamma": 303}
    table = pd.read_csv(csv_path).assign(store=lambda t: t["store"].map(numbers))
    table.to_csv(tmp_path / "numeric.csv", index=False)
    future = known_future(table, numbers.values())
    future.to_csv(tmp_path / "future.csv", index=False)
    plot = [
        "plot", "--run", str(trained_run), "--csv", str(tmp_path / "numeric.csv"),
        "--future-csv", str(tmp_path / "future.csv"), "--compile-cache", "none", "--quiet",
    ]  # fmt: skip
    fans = trained_run / "plots" / "forecasts_fp32.png"
    drawn = fans.stat().st_mtime_ns
    code, _, err = run(capsys, *plot, "--series", "202", "404")
    assert code == 2 and "--series 404: not a series of the table; it has 101, 202, 303" in err
    assert fans.stat().st_mtime_ns == drawn  # refused before the plots are redrawn
    code, _, err = run(capsys, *plot, "--series", "202", "202")
    assert code == 2 and "--series names 202 more than once" in err
    assert fans.stat().st_mtime_ns == drawn
    # Another table's plots go to their own folder: the run's own figures, which
    # metrics.json lists, were replaced by this table's.
    future_png = trained_run / "plots" / "test_numeric" / "future_fp32.png"
    future_png.unlink(missing_ok=True)
    code, stdout, err = run(capsys, *plot, "--series", "202")
    assert code == 0, err
    assert "future_fp32.png" in stdout and future_png.read_bytes()[:8] == PNG_SIGNATURE
    assert (future_png.parent / "forecasts_fp32.png").read_bytes()[:8] == PNG_SIGNATURE
    assert fans.stat().st_mtime_ns == drawn
    assert cli.chosen_series(["303", "101"], table["store"]) == [303, 101]


@pytest.mark.slow
def test_plot_reads_the_runs_table_as_the_run_did_whatever_the_future_csvs_format(
    capsys, trained_run, csv_path, tmp_path
):
    # The reading flags describe --future-csv; the run's own table (ISO dates) used to be
    # parsed with them for the future chart, and refused.
    future = known_future(pd.read_csv(csv_path), ("alpha", "beta", "gamma"), "%d/%m/%Y")
    future.to_csv(tmp_path / "future_dmy.csv", index=False)
    future_png = trained_run / "plots" / "future_fp32.png"
    future_png.unlink(missing_ok=True)
    code, stdout, err = run(
        capsys, "plot", "--run", str(trained_run), "--future-csv", str(tmp_path / "future_dmy.csv"),
        "--time-format", "%d/%m/%Y", "--compile-cache", "none", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    assert "future_fp32.png" in stdout and future_png.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.slow
def test_eval_batch_size_reaches_the_predictions_of_a_run(capsys, monkeypatch, trained_run):
    assert cli.load_run(trained_run)[0].config.training.eval_batch_size == 32  # TINY_RUN's
    assert cli.load_run(trained_run, 5)[0].config.training.eval_batch_size == 5
    import tft_jax.forecaster.forecaster as forecaster_module

    sizes = []
    original = forecaster_module.predict_windows

    def spy(predict, windows, batch_size=256):
        sizes.append(batch_size)
        return original(predict, windows, batch_size)

    monkeypatch.setattr(forecaster_module, "predict_windows", spy)
    output = trained_run / "batch5.csv"
    code, _, _ = run(
        capsys, "forecast", "--run", str(trained_run), "--model", "fp32", "--split",
        "validation", "--output", str(output), "--eval-batch-size", "5",
        "--compile-cache", "none",
    )  # fmt: skip
    assert code == 0 and sizes == [5]


@pytest.mark.slow
def test_evaluate_reads_a_damaged_metrics_json_before_evaluating(capsys, trained_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    (copy / "metrics.json").write_text('{"split": ')
    code, out, err = run(capsys, "evaluate", "--run", str(copy), "--compile-cache", "none")
    assert code == 2
    assert f"{copy / 'metrics.json'} is damaged" in err
    assert "evaluating" not in out + err
    assert (copy / "metrics.json").read_text() == '{"split": '


@pytest.mark.slow
def test_predict_reads_a_history_in_another_encoding_and_date_format(
    capsys, trained_run, csv_path, tmp_path
):
    table = pd.read_csv(csv_path)
    history = table[table["day"] < "2024-03-30"]
    days = pd.date_range("2024-03-30", periods=HORIZON, freq="D").strftime("%Y-%m-%d")
    future = table[table["day"].isin(days)][["store", "day", "promo"]]
    day_first = {"day": lambda t: pd.to_datetime(t["day"]).dt.strftime("%d/%m/%Y")}
    history.assign(**day_first).to_csv(tmp_path / "h.csv", index=False, encoding="utf-16")
    future.assign(**day_first).to_csv(tmp_path / "f.csv", index=False, encoding="utf-16")
    out = tmp_path / "p.csv"
    code, _, err = run(
        capsys, "predict", "--run", str(trained_run), "--csv", str(tmp_path / "h.csv"),
        "--future-csv", str(tmp_path / "f.csv"), "--out", str(out), "--encoding", "utf-16",
        "--dayfirst", "--model", "fp32", "--compile-cache", "none",
    )  # fmt: skip
    assert code == 0, err
    expected = Forecaster.load(trained_run).predict(history, future, model="fp32")
    written = pd.read_csv(out)
    np.testing.assert_array_equal(
        pd.to_datetime(written["day"]).to_numpy(), expected["day"].to_numpy()
    )
    np.testing.assert_allclose(
        written[["q0.1", "q0.5", "q0.9"]].to_numpy(),
        expected[["q0.1", "q0.5", "q0.9"]].to_numpy(),
        rtol=1e-6,
    )


# A time budget spent by the first step (`--time-budget`, tests/test_time_budget.py): the
# same table and settings as `trained_run`, so in this process it reuses its traced steps.


@pytest.mark.slow
def test_a_budget_spent_by_the_first_step_stops_fp32_then_qat_and_int8_follow(
    csv_path, capsys
) -> None:
    argv = [
        "train", *table_args(csv_path), "--hidden-dim", "8", "--heads", "2", *TINY_RUN,
        "--time-budget", "0.001", *TINY_QAT, "--qat-time-budget", "0.001",
    ]  # fmt: skip
    settings = forecaster_config(cli.build_parser().parse_args(argv), qat=True)
    forecaster = Forecaster.from_config(settings).fit(csv_path)
    # The compilation alone spends each budget: FP32 stops after its first step
    # and evaluates it, QAT starts from it and does the same, and int8 follows.
    assert settings.qat.time_budget == 0.001
    for phase in ("fp32", "qat"):
        assert forecaster.summary[phase]["stop_reason"] == "time_budget"
        assert forecaster.history[phase]["step"] == [1]
    lines = capsys.readouterr().err.splitlines()
    expected_in_order = [
        "FP32: compiling the train step...",
        "FP32: compiled in ",
        "FP32: stopped on the time budget of 0.0s at step 1/4 after ",
        "QAT: calibrated the activation observers on 2 batches in ",
        "QAT: compiling the train step...",
        "QAT: stopped on the time budget of 0.0s at step 1/3 after ",
        "int8: converted the QAT model in ",
    ]
    found = [
        next((i for i, line in enumerate(lines) if line.startswith(start)), None)
        for start in expected_in_order
    ]
    assert None not in found and found == sorted(found), "\n".join(lines)


# ---------------------------------------------------------------------------
# Two processes (jax.distributed on CPU, gloo collectives)

# What `tft-jax train` without --qat writes, checkpoint steps included.
FP32_RUN_FILES = {
    "config.json", "metrics.json", "history.json", "forecasts.csv", "models/fp32.msgpack",
    "plots/forecasts_fp32.png", "plots/attention.png", "plots/variable_importance.png",
    "plots/loss_curves.png", "checkpoints/batch_stream.json", "checkpoints/fp32/latest/2",
    "checkpoints/fp32/latest/4", "checkpoints/fp32/best/4",
}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def _run_files(run: pathlib.Path) -> set[str]:
    """Files of a run; inside a checkpoint step only the step itself (orbax's own layout)."""
    names = set()
    for path in run.rglob("*"):
        parts = path.relative_to(run).parts
        if parts[0] == "checkpoints" and len(parts) >= 4:
            names.add("/".join(parts[:4]))
        elif path.is_file():
            names.add("/".join(parts))
    return names


def _two_process_env() -> dict[str, str]:
    env = dict(os.environ)
    flags = [flag for flag in env.get("XLA_FLAGS", "").split() if "device_count" not in flag]
    env.update(
        XLA_FLAGS=" ".join(flags),
        JAX_PLATFORMS="cpu",
        # Process 0 reads and writes the test cache (JAX lets only process 0 write).
        JAX_COMPILATION_CACHE_DIR=str(
            pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"
        ),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    )
    return env


def _two_processes(
    argvs: list[list[str]], logs: pathlib.Path, timeout: float
) -> tuple[list[int], list[str]]:
    """`tft-jax train argvs[i]` as process i of a 2-process run: exit statuses and outputs.

    A process still running after `timeout` seconds is killed (status -9).
    """
    coordinator = f"localhost:{_free_port()}"
    env = _two_process_env()
    processes = []
    for index, argv in enumerate(argvs):
        log = (logs / f"process{index}.log").open("w")
        command = [sys.executable, "-m", "tft_jax.cli", "train", *argv]
        command += ["--coordinator", coordinator, "--num-processes", str(len(argvs))]
        command += ["--process-id", str(index)]
        processes.append((subprocess.Popen(command, stdout=log, stderr=log, env=env), log))
    try:
        for process, _ in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=timeout)
    finally:
        for process, log in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    outputs = [(logs / f"process{i}.log").read_text() for i in range(len(argvs))]
    return [process.returncode for process, _ in processes], outputs


def _train_in_two_processes(argv: list[str], logs: pathlib.Path) -> None:
    """`tft-jax train argv` as processes 0 and 1 of a 2-process run; raises if either fails."""
    codes, outputs = _two_processes([argv, argv], logs, timeout=900)
    assert codes == [0, 0], "".join(output[-3000:] for output in outputs)


@pytest.mark.slow
def test_processes_given_other_flags_or_tables_stop_at_once_naming_each(csv_path, tmp_path):
    # Before: both joined the run, then waited forever, without a word, in the first
    # collective whose shapes differed (SIGTERM did not end them either).
    other = tmp_path / "other.csv"
    table = pd.read_csv(csv_path)
    table.loc[0, "sales"] += 1
    table.to_csv(other, index=False)
    common = ["--out", str(tmp_path / "run"), *TINY_MODEL, *TINY_RUN]
    codes, outputs = _two_processes(
        [
            [*table_args(csv_path), *common, "--batch-size", "8"],
            [*table_args(other), *common, "--batch-size", "16"],
        ],
        tmp_path,
        timeout=150,  # the imports, the joining and one tiny gather: about 15 s
    )
    assert codes == [2, 2], "".join(outputs)
    for index, (batch, csv) in enumerate([("8", csv_path), ("16", other)]):
        errors = [line for line in outputs[index].splitlines() if "error" in line]
        digest = hashlib.sha256(csv.read_bytes()).hexdigest()[:16]
        assert errors == [
            f"tft-jax train: error: --batch-size differs between the processes (this "
            f"process, {index} of 2: {batch}; process {1 - index}: differs); --csv differs "
            f"between the processes (this process, {index} of 2: {csv} (sha256 {digest}); "
            f"process {1 - index}: differs): every process must be given the same flags and "
            "table"
        ], outputs[index]
    assert not (tmp_path / "run").exists()


def test_the_compared_settings_are_every_flag_but_the_processs_own_and_the_tables_content(
    csv_path, tmp_path
):
    parser = cli.build_parser()
    multihost = ["--coordinator", "h:1", "--num-processes", "2"]
    copy = tmp_path / "copy.csv"
    copy.write_bytes(csv_path.read_bytes())

    def settings(csv, *flags):
        argv = ["train", *table_args(csv), *TINY_RUN, *multihost, *flags]
        return cli.run_settings(parser.parse_args(argv))

    zero = settings(csv_path, "--process-id", "0")
    # Another index, address, path to the same bytes, mount of the run folder, cache or
    # progress output: the same run.
    one = settings(
        copy,
        *("--process-id", "1", "--coordinator", "localhost:1", "--out", str(tmp_path / "b")),
        *("--compile-cache", str(tmp_path / "cache"), "--quiet"),
    )
    compared = {label: value for label, (value, _) in zero.items()}
    assert compared == {label: value for label, (value, _) in one.items()}
    flags = {
        "--" + action.dest.replace("_", "-")
        for action in parser._subparsers._group_actions[0].choices["train"]._actions
        if action.option_strings and action.dest != "help"
    }
    local = {"--process-id", "--coordinator", "--out", "--compile-cache", "--quiet"}
    assert set(zero) == flags - local | {"the command"}
    assert zero["--batch-size"] == ("8", "8")
    assert zero["--csv"][0] == hashlib.sha256(csv_path.read_bytes()).hexdigest()
    assert zero["--quantiles"][1] == "0.1 0.5 0.9"
    assert zero["--qat"][1] == "off"
    assert len(zero) < SETTINGS_SLOTS  # each compared on its own
    without = cli.run_settings(parser.parse_args(["train", *multihost, "--process-id", "0"]))
    assert without["--csv"] == ("null", "not given")


@pytest.mark.slow
@pytest.mark.multidevice
def test_two_processes_train_the_same_model_as_one_and_write_the_same_run(
    csv_path, trained_run, tmp_path
):
    # The FP32 phase of `trained_run`: same data, model, seed and global batch.
    out = tmp_path / "run"
    _train_in_two_processes(
        ["--out", str(out), *table_args(csv_path), *TINY_MODEL, *TINY_RUN], tmp_path
    )
    two = serialization.msgpack_restore((out / "models" / "fp32.msgpack").read_bytes())
    one = serialization.msgpack_restore((trained_run / "models" / "fp32.msgpack").read_bytes())
    for (path, got), want in zip(
        jax.tree_util.tree_flatten_with_path(two)[0], jax.tree.leaves(one), strict=True
    ):
        # Adam divides by sqrt(v): where a gradient is ~0, the all-reduce's other summation
        # order moves m/sqrt(v) visibly, so near-zero parameters get an absolute tolerance.
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=5e-5, err_msg=str(path))
    history_two = json.loads((out / "history.json").read_text())["fp32"]
    history_one = json.loads((trained_run / "history.json").read_text())["fp32"]
    assert history_two["step"] == history_one["step"] == [2, 4]
    for key in ("train_loss", "val_loss"):
        np.testing.assert_allclose(history_two[key], history_one[key], rtol=1e-5)
    metrics_two = json.loads((out / "metrics.json").read_text())["models"]
    metrics_one = json.loads((trained_run / "metrics.json").read_text())["models"]
    assert metrics_two["fp32"]["p50_q_risk"] == pytest.approx(
        metrics_one["fp32"]["p50_q_risk"], rel=1e-4
    )
    assert _run_files(out) == FP32_RUN_FILES
    assert FP32_RUN_FILES.issubset(_run_files(trained_run))  # later tests add files there
    config = json.loads((out / "config.json").read_text())
    assert config["versions"]["processes"] == 2

    # The checkpoint written by two processes restores on this process's one device.
    forecaster = Forecaster.load(out)
    data = forecaster.prepare(csv_path)
    training, steps = config["training"], config["summary"]["fp32"]
    tx = make_optimizer(
        warmup_cosine_schedule(
            training["learning_rate"], steps["total_steps"], steps["warmup_steps"]
        ),
        clip_norm=training["clip_norm"],
    )
    template = create_train_state(
        TemporalFusionTransformer(forecaster.tft_config),
        tx,
        jax.random.key(0),
        sample_batch(data, 8),
    )
    restored = load_state(out / "checkpoints" / "fp32", template)
    assert int(restored.step) == 4
    for got, want in zip(
        jax.tree.leaves(restored.params), jax.tree.leaves(two["params"]), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_an_unknown_allocator_choice_is_a_one_line_error_of_the_command(capsys, monkeypatch):
    monkeypatch.setenv("TFT_JAX_ALLOCATOR", "off")
    monkeypatch.setattr(sys, "argv", ["tft-jax", "--help"])
    assert cli.main() == 2
    err = capsys.readouterr().err
    assert err.startswith("tft-jax: error: TFT_JAX_ALLOCATOR must be 'default'") and "'off'" in err
    assert "Traceback" not in err


def test_csv_ids_with_leading_zeros_are_read_as_the_file_writes_them(tmp_path):
    path = tmp_path / "padded.csv"
    pd.DataFrame({"store": ["001", "01"], "day": ["2024-01-01"] * 2, "sales": 1.0}).to_csv(
        path, index=False
    )
    assert cli.read_csv(path, "--csv", "utf-8", "store")["store"].tolist() == ["001", "01"]
    assert cli.read_csv(path, "--csv")["store"].tolist() == [1, 1]  # no id column named


@pytest.mark.parametrize(("command", "hint"), [("train", "--resume"), ("evaluate", None)])
def test_ctrl_c_ends_a_command_with_one_line_and_status_130(
    capsys, monkeypatch, tmp_path, command, hint
):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, command, interrupted)
    argv = [command, "--out", str(tmp_path / "r")] if command == "train" else [command]
    argv += ["--run", str(tmp_path)] if command == "evaluate" else []
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert err.startswith(f"tft-jax {command}: interrupted") and "Traceback" not in err
    assert (hint in err) if hint else ("--resume" not in err)
    if command == "train":  # no checkpoint was written: nothing to go on from
        assert "interrupted before the first checkpoint; train again with --resume" in err


def test_ctrl_c_after_a_checkpoint_says_resume_goes_on_from_it(capsys, monkeypatch, tmp_path):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "train", interrupted)
    monkeypatch.setattr(cli, "holds_checkpoints", lambda out: out == tmp_path / "r")
    assert cli.main(["train", "--out", str(tmp_path / "r")]) == 130
    err = capsys.readouterr().err
    assert "interrupted; train again with --resume to go on from the last checkpoint" in err


# `tft-jax train`'s process (as the console script runs it) with Ctrl-C sent once the XLA
# compilation of the train step has run for `delay` seconds (its first line says when).
# JAX raises KeyboardInterrupt from its wait on the compilation, which goes on in a jaxlib
# thread; the compilation of a validation step mid-training is interrupted the same way.
_INTERRUPTED_COMPILE = """
import os, signal, sys, threading
from jax._src import compiler
compile_and_load = compiler.backend_compile_and_load
delay = float(sys.argv.pop(1))
sent = []
def interrupting(backend, module, *args, **kwargs):
    name = str(module.operation.attributes["sym_name"]).strip('"')
    compiling = [True]
    def interrupt():
        if compiling[0] and not sent:
            sent.append(name)
            print(f"SIGINT while compiling {name}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGINT)
    if "train_step" in name:
        timer = threading.Timer(delay, interrupt)
        timer.daemon = True
        timer.start()
    try:
        return compile_and_load(backend, module, *args, **kwargs)
    finally:
        compiling[0] = False
compiler.backend_compile_and_load = interrupting
from tft_jax import cli
sys.exit(cli.main())
"""


def test_ctrl_c_during_an_xla_compilation_ends_the_process_with_status_130(csv_path, tmp_path):
    # Before: the process printed its one line, then died in interpreter shutdown with
    # "Fatal Python error: Segmentation fault" (status -11): JAX's exit handler dropped
    # the XLA client, and the compilation still running in a jaxlib thread used it.
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # a cached step would not compile
    # The allocator the console script relaunches with, so that it does not relaunch.
    env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
    out = tmp_path / "run"
    argv = ["train", *table_args(csv_path), "--out", str(out), *TINY_MODEL, *TINY_RUN]
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_COMPILE, "0.2", *argv],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert "SIGINT while compiling jit__train_step" in done.stderr, done.stderr[-3000:]
    assert "Fatal Python error" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == cli.INTERRUPTED, done.stderr[-3000:]
    assert "tft-jax train: interrupted before the first checkpoint; train again with --resume" in (
        done.stderr
    )


# What JAX 0.10 raised in the survivor when process 1 of a 2-process `train` was killed mid-run.
GLOO_LOST = (
    "UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read "
    "error [127.0.0.1]:3469: Connection reset by peer"
)


@pytest.mark.parametrize(
    ("raised", "line"),
    [
        (
            jax.errors.JaxRuntimeError(GLOO_LOST),
            "tft-jax train: error: another process of the run stopped or was cut off, so this "
            f"one cannot go on (JAX: {GLOO_LOST}); train again with --resume in every process "
            "to go on from the last checkpoint",
        ),
        (jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: out of memory"), None),
        (jax.errors.JaxRuntimeError("INTERNAL: Gloo context initialization: bad option"), None),
        (RuntimeError("Connection reset by peer"), None),
    ],
)
def test_a_process_that_loses_another_mid_run_ends_with_one_line(
    capsys, monkeypatch, tmp_path, raised, line
):
    # The survivors of a killed process printed JAX's traceback from the step they waited in.
    def joined_then_failed(args, joined):
        joined.append(True)
        raise raised

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(cli, "run_parsed", joined_then_failed)
    monkeypatch.setattr(cli, "holds_checkpoints", lambda out: True)
    monkeypatch.setattr(cli.os, "_exit", exit_now)
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--out", str(tmp_path / "r")])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    if line is None:  # any other error keeps its traceback: it is a bug or the host's
        assert "Traceback" in err and str(raised) in err
    else:
        assert err == line + "\n"


@pytest.mark.parametrize(
    ("split", "folder"), [("test", "plots"), ("validation", "plots/validation")]
)
def test_plot_draws_another_split_of_the_runs_table_into_its_own_folder(tmp_path, split, folder):
    args = argparse.Namespace(run=tmp_path, csv=None, split=split)
    assert cli.plots_output(args, {}) == tmp_path / folder
