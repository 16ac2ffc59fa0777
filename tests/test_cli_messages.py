"""The one-line errors of `tft-jax` for a table or flags it cannot use, naming the flags to pass.

A wrong separator, missing columns, an unknown time zone, day-first dates, a
header without rows, one split start. Nothing here trains: each command is
refused before any model is built.
"""

from __future__ import annotations

import argparse
import errno
import pathlib

import pytest

from tft_jax import cli
from tft_jax.atomic_files import temporary_sibling
from tft_jax.data.tables import TableSpec

from .cli_tables import run, table_args, write_table
from .one_store_sales import _table

COLUMNS = ["--id-col", "store", "--time-col", "date", "--target", "sales", "--freq", "D"]


@pytest.fixture(scope="module")
def csv_path(tmp_path_factory) -> pathlib.Path:
    return write_table(tmp_path_factory.mktemp("table") / "stores.csv")


def _train(capsys, tmp_path: pathlib.Path, csv: pathlib.Path, *flags: str) -> tuple[int, str]:
    argv = ["train", "--csv", str(csv), *COLUMNS, *flags]
    code = cli.main([*argv, "--out", str(tmp_path / "run"), "--compile-cache", "none", "--quiet"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("sep", [";", "\t"])
def test_a_csv_separated_by_another_character_is_refused_naming_it(capsys, tmp_path, sep):
    csv = tmp_path / "table.csv"
    _table().to_csv(csv, sep=sep, index=False)
    code, err = _train(capsys, tmp_path, csv)
    assert code == 2
    assert f"looks separated by {sep!r}" in err
    assert f"pandas.read_csv(path, sep={sep!r}).to_csv(new_path, index=False)" in err
    assert not (tmp_path / "run").exists()


def test_missing_columns_are_named_by_the_flags_that_name_them(capsys, tmp_path):
    csv = tmp_path / "table.csv"
    _table().to_csv(csv, index=False)
    argv = ["--csv", str(csv), "--id-col", "shop", "--time-col", "date", "--target", "revenue"]
    code = cli.main(
        ["train", *argv, "--freq", "D", "--out", str(tmp_path / "run"),
         "--compile-cache", "none", "--quiet"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "lacks columns ['shop', 'revenue'] (--id-col 'shop', --target 'revenue')" in err
    assert "target=" not in err and "(id_col" not in err


def test_an_unknown_timezone_is_refused_without_offering_none_on_the_command_line(capsys, tmp_path):
    csv = tmp_path / "table.csv"
    _table().to_csv(csv, index=False)
    code, err = _train(capsys, tmp_path, csv, "--timezone", "Mars/Olympus")
    assert code == 2
    assert "unknown --timezone 'Mars/Olympus'" in err
    assert "None" not in err
    with pytest.raises(ValueError, match="or leave the timezone out"):
        TableSpec("store", "date", "sales", timezone="Mars/Olympus")


def test_the_day_first_hint_names_each_flag_once(capsys, tmp_path):
    csv = tmp_path / "table.csv"
    _table("%d/%m/%Y").to_csv(csv, index=False)
    code, err = _train(capsys, tmp_path, csv, "--history", "7", "--horizon", "3")
    assert code == 2
    assert "pass --dayfirst or --time-format '%d/%m/%Y'" in err
    assert err.count("--time-format") == 1 and err.count("--dayfirst") == 1


def test_a_csv_with_a_header_and_no_rows_is_refused_naming_the_flag_and_file(capsys, tmp_path):
    csv = tmp_path / "header_only.csv"
    csv.write_text("store,date,sales\n")
    code, err = _train(capsys, tmp_path, csv)
    assert code == 2
    assert f"--csv: {csv} has a header but no rows" in err
    assert "Traceback" not in err


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


def test_an_empty_flag_value_is_named_as_empty_not_as_missing(capsys, tmp_path, csv_path):
    # It said "--csv needs --freq as well", for a --freq that was given.
    argv = ["train", "--csv", str(csv_path), *COLUMNS[:-1], ""]
    code = cli.main([*argv, "--out", str(tmp_path / "run"), "--compile-cache", "none", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "tft-jax train: error: --freq: expected a value, got an empty one" in err


def test_an_empty_path_is_refused_by_the_parser_not_read_as_the_current_folder(capsys):
    # `pathlib.Path('')` is '.': the error said "--out .: is a folder, not a file".
    with pytest.raises(SystemExit) as stop:
        cli.main(["predict", "--run", "run", "--csv", "a.csv", "--out", ""])
    assert stop.value.code == 2
    assert "argument --out: expected a path, got an empty one" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("failed", "expected"),
    [
        ("temporary sibling", "--output /proc/x: writing it failed: No such file or directory"),
        ("/proc/x", "--output /proc/x: writing it failed: No such file or directory"),
        ("/elsewhere/y", "/elsewhere/y: No such file or directory"),
    ],
)
def test_an_output_that_fails_late_is_named_by_its_flag(failed, expected):
    # The checks before a run cannot foresee every refusal: the error named
    # '/proc/x.tmp', a temporary file, and no flag.
    if failed == "temporary sibling":  # named in the body: the name holds this process' id
        failed = str(temporary_sibling("/proc/x"))
    error = FileNotFoundError(errno.ENOENT, "No such file or directory", failed)
    args = argparse.Namespace(output=pathlib.Path("/proc/x"))
    assert cli.output_error_text(error, args) == expected
    inside = FileNotFoundError(errno.ENOSPC, "No space left on device", "/runs/a/config.json")
    assert cli.output_error_text(inside, argparse.Namespace(out=pathlib.Path("/runs/a"))) == (
        "--out /runs/a: writing /runs/a/config.json failed: No space left on device"
    )
