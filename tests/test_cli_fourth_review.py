"""CLI messages and outputs found by a walkthrough of `tft-jax` as a user runs it.

Nothing here trains: each command is refused before any model is built, or
the helper that names an output is called directly.
"""

from __future__ import annotations

import argparse
import pathlib
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from tft_jax import cli
from tft_jax.cli_experiments import _clipping_settings
from tft_jax.cli_parser import build_parser, flag_message
from tft_jax.data import prepare_dataset
from tft_jax.data.tables import TableSpec, read_table, validate_table
from tft_jax.forecaster import DataConfig

COLUMNS = ["--id-col", "store", "--time-col", "date", "--target", "sales", "--freq", "D"]


def _table(times: str = "%Y-%m-%d") -> pd.DataFrame:
    days = pd.date_range("2024-01-01", periods=40, freq="D")
    return pd.DataFrame({"store": "a", "date": days.strftime(times), "sales": np.arange(40.0)})


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


def test_a_dataframe_read_with_the_wrong_separator_is_named_in_the_missing_columns_error():
    frame = pd.DataFrame({"store;date;sales": ["a;2024-01-01;1.0"]})
    with pytest.raises(ValueError, match=r"looks separated by ';'.*sep=';'"):
        validate_table(frame, TableSpec("store", "date", "sales"), history=2, horizon=1)


def test_a_one_column_csv_with_the_id_column_or_no_id_column_is_read_as_it_is(tmp_path):
    # Only a table that lacks its id column is taken for a wrongly separated one.
    csv = tmp_path / "notes.csv"
    csv.write_text("note;text\nsee;below\n")
    assert list(read_table(csv).columns) == ["note;text"]
    assert list(read_table(csv, id_col="note;text").columns) == ["note;text"]


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


def test_flag_message_says_a_keyword_and_its_flag_once():
    assert flag_message("e.g. encoding='latin-1' (--encoding latin-1)") == "e.g. --encoding latin-1"
    assert flag_message("dayfirst=False (--dayfirst)") == "dayfirst=False (--dayfirst)"
    # A command without the flag keeps the data layer's text.
    text = "pass dayfirst=True (--dayfirst) or time_format='%d' (--time-format)"
    assert flag_message(text, {"encoding"}) == text


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


def _clipping_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["experiment", "clipping", *flags])


def test_clipping_eval_every_above_steps_is_announced_and_recorded_as_steps():
    with pytest.warns(UserWarning, match=r"--eval-every 50 is more than --steps 4"):
        settings = _clipping_settings(_clipping_args("--steps", "4", "--eval-every", "50"))
    assert settings.eval_every == 4


def test_clipping_eval_every_within_steps_is_kept_without_a_warning(recwarn):
    settings = _clipping_settings(_clipping_args("--steps", "4", "--eval-every", "2"))
    assert settings.eval_every == 2
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


def test_a_csv_given_to_a_run_fitted_on_text_codes_reads_them_as_text(tmp_path):
    # A model saved from Python, fitted on a DataFrame of digit-string ids and codes;
    # `tft-jax predict/evaluate --csv` read the file themselves: '007' stayed 7.
    times = pd.date_range("2021-03-01", periods=120, freq="h")
    table = pd.concat(
        [
            pd.DataFrame({"id": sid, "time": times, "y": np.arange(120.0), "grade": grade})
            for sid, grade in (("12", "007"), ("5", "3"))
        ],
        ignore_index=True,
    )
    data = DataConfig(
        id_col="id", time_col="time", target="y", freq="h", static_cols=("grade",),
        categorical_cols=("grade",), history=8, horizon=4,
    )  # fmt: skip
    preprocessor = prepare_dataset(table, **data.prepare_options()).preprocessor
    run = SimpleNamespace(
        config=SimpleNamespace(data=data), preprocessor=preprocessor, is_fitted=True
    )
    args = argparse.Namespace(encoding=None, dayfirst=None, time_format=None)
    path = tmp_path / "table.csv"
    table.to_csv(path, index=False)
    read = cli.read_given_csv(path, "--csv", run, args)
    assert read["id"].tolist() == table["id"].tolist()
    assert read["grade"].tolist() == table["grade"].tolist()


def test_a_csv_with_a_header_and_no_rows_is_refused_naming_the_flag_and_file(capsys, tmp_path):
    csv = tmp_path / "header_only.csv"
    csv.write_text("store,date,sales\n")
    code, err = _train(capsys, tmp_path, csv)
    assert code == 2
    assert f"--csv: {csv} has a header but no rows" in err
    assert "Traceback" not in err
