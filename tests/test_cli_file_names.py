"""Errors about the contents of a CSV name the file: `--csv PATH: ...`, once.

A table whose dates, rows or target the data layer refuses was reported
without its path (`error: column 'date' has times that do not read ...`),
and in `predict`, given `--csv` and `--future-csv`, the user could not tell
which file to mend. Errors that are not about a file's contents (flags, the
run folder) name no file. Nothing here trains past the tiny saved run: each
command is refused while its table is read or prepared.
"""

from __future__ import annotations

import argparse
import pathlib

import pandas as pd
import pytest

from tft_jax import cli
from tft_jax.data.tables import TableSpec
from tft_jax.forecaster import Forecaster
from tft_jax.forecaster.forecaster import check_global_batch

from .cli_tables import saved_tiny_run, stores_files, table_args

NO_CACHE = ["--compile-cache", "none", "--quiet"]


def error_line(capsys, command: str, *argv: str) -> str:
    """The one error line of `tft-jax COMMAND ARGV`, which exits with status 2."""
    code = cli.main([command, *argv, *NO_CACHE])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    subcommand = f" {argv[0]}" if command == "experiment" else ""  # as argparse names it
    assert lines[0].startswith(f"tft-jax {command}{subcommand}: error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, pathlib.Path]:
    """The stores table, its history and the future of its known column `promo`."""
    return stores_files(tmp_path_factory.mktemp("file_names"))


@pytest.fixture(scope="module")
def saved(tables) -> pathlib.Path:
    """A tiny FP32 run (the settings of test_cli_inputs' saved folder), saved once."""
    return saved_tiny_run(tables)


def with_duplicate_row(source: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    table = pd.read_csv(source)
    pd.concat([table, table.iloc[[5]]]).to_csv(target, index=False)
    return target


def with_text_target(source: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    table = pd.read_csv(source)
    table["sales"] = table["sales"].astype(str)
    table.loc[7, "sales"] = "n/a?"
    table.to_csv(target, index=False)
    return target


def test_train_names_the_csv_whose_dates_do_not_read_in_one_format(capsys, tmp_path, tables):
    # It said "error: column 'day' has times that do not read in the format of its
    # first time '01.01.2024' ...": the user was not told which file.
    table = pd.read_csv(tables["table"])
    table["day"] = pd.to_datetime(table["day"]).dt.strftime("%d.%m.%Y")
    csv = tmp_path / "dotted.csv"
    table.to_csv(csv, index=False)
    line = error_line(capsys, "train", *table_args(csv), "--out", str(tmp_path / "run"))
    assert line.startswith(
        f"tft-jax train: error: --csv {csv}: column 'day' has times that do not read in the "
        "format of its first time '01.01.2024'"
    )
    assert line.endswith("pass --dayfirst or --time-format '%d.%m.%Y'")
    assert line.count(str(csv)) == 1
    assert not (tmp_path / "run").exists()


def test_train_names_the_csv_with_repeated_rows(capsys, tmp_path, tables):
    csv = with_duplicate_row(tables["table"], tmp_path / "repeated.csv")
    line = error_line(capsys, "train", *table_args(csv), "--out", str(tmp_path / "run"))
    assert line.startswith(f"tft-jax train: error: --csv {csv}: 2 rows repeat a ('store', 'day')")


def test_an_error_of_the_flags_during_training_names_no_file(capsys, tmp_path, tables):
    # Raised while the table is prepared, but by the forecaster, about the flags.
    line = error_line(
        capsys, "train", *table_args(tables["table"]), "--history", "3",
        "--season-period", "7", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert line == (
        "tft-jax train: error: the seasonal naive period (7 steps) exceeds --history (3); "
        "lengthen it or set a shorter --season-period"
    )


def test_a_message_naming_the_file_already_names_it_once(capsys, tmp_path, tables):
    csv = tmp_path / "semicolons.csv"
    pd.read_csv(tables["table"]).to_csv(csv, sep=";", index=False)
    line = error_line(capsys, "train", *table_args(csv), "--out", str(tmp_path / "run"))
    assert f"{csv} looks separated by ';'" in line
    assert line.count(str(csv)) == 1


def test_experiment_names_the_csv_with_repeated_rows(capsys, tmp_path, tables):
    csv = with_duplicate_row(tables["table"], tmp_path / "repeated.csv")
    line = error_line(
        capsys, "experiment", "clipping", *table_args(csv), "--out", str(tmp_path / "exp")
    )
    assert line.startswith(
        f"tft-jax experiment clipping: error: --csv {csv}: 2 rows repeat a ('store', 'day')"
    )


@pytest.mark.parametrize("command", ["evaluate", "forecast", "plot"])
def test_run_commands_name_the_csv_with_repeated_rows(capsys, tmp_path, saved, tables, command):
    csv = with_duplicate_row(tables["table"], tmp_path / "repeated.csv")
    line = error_line(capsys, command, "--run", str(saved), "--csv", str(csv))
    assert line.startswith(
        f"tft-jax {command}: error: --csv {csv}: 2 rows repeat a ('store', 'day') pair"
    )
    assert line.count(str(csv)) == 1


def test_evaluate_names_the_csv_with_a_text_target(capsys, tmp_path, saved, tables):
    csv = with_text_target(tables["table"], tmp_path / "texts.csv")
    line = error_line(capsys, "evaluate", "--run", str(saved), "--csv", str(csv))
    assert line.startswith(
        f"tft-jax evaluate: error: --csv {csv}: column 'sales' has 1 non-numeric values, "
        "e.g. 'n/a?'"
    )


@pytest.mark.parametrize("mend", [with_text_target, with_duplicate_row])
def test_predict_names_the_history_csv_not_the_future_csv(capsys, tmp_path, saved, tables, mend):
    # Both files are given: an error in the history names --csv only.
    history = mend(tables["history"], tmp_path / "history.csv")
    out = tmp_path / "forecasts.csv"
    line = error_line(
        capsys, "predict", "--run", str(saved), "--csv", str(history),
        "--future-csv", str(tables["future"]), "--out", str(out),
    )  # fmt: skip
    assert line.startswith(f"tft-jax predict: error: --csv {history}: ")
    assert "--future-csv" not in line and str(tables["future"]) not in line
    assert line.count(str(history)) == 1
    assert not out.exists()


def test_predict_names_the_future_csv_not_the_history_csv(capsys, tmp_path, saved, tables):
    future = with_duplicate_row(tables["future"], tmp_path / "future.csv")
    out = tmp_path / "forecasts.csv"
    line = error_line(
        capsys, "predict", "--run", str(saved), "--csv", str(tables["history"]),
        "--future-csv", str(future), "--out", str(out),
    )  # fmt: skip
    assert line.startswith(f"tft-jax predict: error: --future-csv {future}: future repeats")
    assert "--csv" not in line and str(tables["history"]) not in line
    assert not out.exists()


def test_a_run_folder_error_names_no_csv(capsys, tmp_path, tables):
    line = error_line(
        capsys, "evaluate", "--run", str(tmp_path / "no-run"), "--csv", str(tables["table"])
    )
    assert "--csv" not in line and str(tables["table"]) not in line


def test_only_the_data_layers_errors_are_led_by_the_csv(tmp_path):
    args = argparse.Namespace(csv=tmp_path / "t.csv")
    with pytest.raises(TypeError) as data_layer:
        TableSpec("store", "day", "sales", static_cols="size")
    with pytest.raises(ValueError) as forecaster:
        check_global_batch(3, devices=2, processes=1)
    assert cli.data_error_text(data_layer.value, args).startswith(f"--csv {args.csv}: ")
    assert cli.data_error_text(data_layer.value, argparse.Namespace(csv=None)) == str(
        data_layer.value
    )
    assert not cli.data_error_text(forecaster.value, args).startswith("--csv")


def test_a_data_layer_type_error_is_one_line_naming_the_csv(capsys, monkeypatch, tmp_path):
    def refused(args: argparse.Namespace) -> int:
        TableSpec("store", "day", "sales", static_cols="size")
        return 0

    def broken(args: argparse.Namespace) -> int:
        raise TypeError("a bug, not the table's")

    csv = tmp_path / "t.csv"
    argv = ["evaluate", "--run", str(tmp_path), "--csv", str(csv), *NO_CACHE]
    monkeypatch.setitem(cli.COMMANDS, "evaluate", refused)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tft-jax evaluate: error: --csv {csv}: static_cols must be a list")
    monkeypatch.setitem(cli.COMMANDS, "evaluate", broken)
    with pytest.raises(TypeError, match="a bug"):
        cli.main(argv)


def test_the_runs_own_table_read_without_csv_is_named(capsys, tmp_path, saved, tables):
    # Read from config.json's source, its errors gave "line N of the file" of no file.
    csv = with_text_target(tables["table"], tmp_path / "trained_on.csv")
    run = tmp_path / "run"
    Forecaster.load(saved).save(run, extra={"source": {"csv": str(csv), "command": "train"}})
    line = error_line(capsys, "evaluate", "--run", str(run))
    assert line.startswith(
        f"tft-jax evaluate: error: the run's table {csv}: column 'sales' has 1 non-numeric "
        "values, e.g. 'n/a?' in series 'alpha' at row 7 (line 9 of the file)"
    ), line
