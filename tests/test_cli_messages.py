"""The one-line errors of `tft-jax` for a table or flags it cannot use, naming the flags to pass.

A wrong separator, missing columns, an unknown time zone, day-first dates, a
header without rows, one split start. Nothing here trains: each command is
refused before any model is built.
"""

from __future__ import annotations

import pathlib

import pytest

from tft_jax import cli
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
