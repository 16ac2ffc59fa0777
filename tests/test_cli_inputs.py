"""The inputs `tft-jax` commands read: the CSV files given, a folder saved by `Forecaster.save`.

Bad inputs end with one line naming the flag, flags never do nothing without a
word, and a CSV is read as the run read its table. One tiny FP32 model (three
daily stores whose id column is named `model`, a known column `promo`) is
fitted for two steps and saved once.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from tft_jax import cli
from tft_jax.data import prepare_dataset
from tft_jax.forecaster import DataConfig

from .cli_tables import HISTORY, HORIZON, saved_tiny_run, stores_files, write_table

NO_CACHE = ["--compile-cache", "none", "--quiet"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """`tft-jax ARGV`: exit status, stdout, stderr."""
    code = cli.main([*argv, *NO_CACHE])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str, command: str) -> str:
    """The single error line of a failed command (no traceback, no other line)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tft-jax {command}: error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, pathlib.Path]:
    """The stores table with its id column named `model`, its history and future CSVs."""
    return stores_files(tmp_path_factory.mktemp("second_review"), id_col="model")


@pytest.fixture(scope="module")
def saved(tables) -> pathlib.Path:
    """A folder saved by `Forecaster.save` (not `tft-jax train`): no `source` table."""
    return saved_tiny_run(tables, id_col="model")


@pytest.mark.parametrize("command", ["evaluate", "forecast", "plot"])
@pytest.mark.parametrize(
    "flags, named",
    [
        (["--dayfirst"], "--dayfirst"),
        (["--no-dayfirst"], "--no-dayfirst"),
        (["--encoding", "latin-1"], "--encoding"),
        (["--time-format", "%d/%m/%Y", "--encoding", "utf-8"], "--encoding, --time-format"),
    ],
)
def test_reading_flags_with_no_csv_to_read_are_refused_not_ignored(
    capsys, tmp_path, command, flags, named
):
    # Without --csv the run's own table is read as the run read it: these flags did
    # nothing, and `evaluate --run RUN --dayfirst` exited 0 as if they had been used.
    code, _, err = run(capsys, command, "--run", str(tmp_path / "no-run"), *flags)
    assert code == 2
    line = one_error_line(err, command)
    verb = "describe" if ", " in named else "describes"
    assert f"error: {named} {verb} the CSV files given, but no --csv" in line
    assert ("--csv or --future-csv was given" in line) == (command == "plot")


def test_reading_flags_describe_the_future_csv_of_plot_without_csv(tmp_path):
    # plot's --future-csv is read with them: nothing is ignored there.
    args = cli.build_parser().parse_args(
        ["plot", "--run", str(tmp_path), "--future-csv", "f.csv", "--dayfirst"]
    )
    cli.check_reading_flags(args)


@pytest.mark.parametrize("command", ["evaluate", "plot"])  # this run's id column bars forecast
def test_a_refused_table_claims_no_output_name_in_the_run(capsys, tmp_path, saved, tables, command):
    # Outputs for another table are named after its file and the name is claimed in
    # other_tables.json: the claim was written while naming the outputs, before the
    # table was read, so a table refused for a missing column left its claim behind.
    run_copy = pathlib.Path(shutil.copytree(saved, tmp_path / "run"))
    broken = tmp_path / "sales.csv"
    pd.read_csv(tables["table"]).drop(columns="sales").to_csv(broken, index=False)
    code, _, err = run(capsys, command, "--run", str(run_copy), "--csv", str(broken))
    assert code == 2
    assert "'sales'" in one_error_line(err, command)
    assert not (run_copy / cli.OTHER_TABLES_FILE).exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "--run", "RUN", "--csv", "DIR", "--future-csv", "FUTURE",
         "--out", "OUT/f.csv"],
        ["predict", "--run", "RUN", "--csv", "HISTORY", "--future-csv", "DIR",
         "--out", "OUT/f.csv"],
        ["evaluate", "--run", "RUN", "--csv", "DIR"],
        ["plot", "--run", "RUN", "--csv", "DIR"],
        ["train", "--csv", "DIR", "--id-col", "model", "--time-col", "day", "--target", "sales",
         "--freq", "D", "--out", "OUT/run"],
    ],
)  # fmt: skip
def test_a_folder_given_as_a_csv_is_named_a_folder_not_a_missing_file(
    capsys, tmp_path, saved, tables, argv
):
    (tmp_path / "a folder").mkdir()
    names = {"RUN": str(saved), "DIR": str(tmp_path / "a folder"),
             "HISTORY": str(tables["history"]), "FUTURE": str(tables["future"]),
             "OUT": str(tmp_path / "out")}  # fmt: skip
    argv = [names.get(word, word.replace("OUT", names["OUT"])) for word in argv]
    code, _, err = run(capsys, *argv)
    assert code == 2
    line = one_error_line(err, argv[0])
    flag = argv[argv.index(names["DIR"]) - 1]
    assert line.endswith(f"{flag} {tmp_path / 'a folder'}: is a folder, not a file"), line
    assert not (tmp_path / "out").exists()


def test_predict_without_future_csv_names_the_flag_when_the_model_has_known_columns(
    capsys, tmp_path, saved, tables
):
    # It said "future is required: ...", the Python argument, not the flag to pass.
    out = tmp_path / "forecast.csv"
    code, _, err = run(
        capsys, "predict", "--run", str(saved), "--csv", str(tables["history"]), "--out", str(out)
    )
    assert code == 2
    line = one_error_line(err, "predict")
    assert "error: --future-csv is missing: the model uses the known columns ['promo']" in line
    assert f"for the {HORIZON} steps after each series' last time in --csv" in line
    assert not out.exists()


def test_predict_on_another_runs_table_names_its_missing_columns_before_the_future(
    capsys, tmp_path, saved, tables
):
    # It asked for --future-csv first; given one, it then said the table was another's.
    other = tmp_path / "other.csv"
    pd.read_csv(tables["history"]).rename(columns={"promo": "discount"}).to_csv(other, index=False)
    out = tmp_path / "forecast.csv"
    code, _, err = run(
        capsys, "predict", "--run", str(saved), "--csv", str(other), "--out", str(out)
    )
    assert code == 2
    line = one_error_line(err, "predict")
    assert f"--csv {other}: table lacks columns ['promo'] that the model was trained with" in line
    assert "--future-csv" not in line and not out.exists()


def test_predict_on_a_saved_folder_writes_the_horizon_after_each_series_end(
    capsys, tmp_path, saved, tables
):
    # An id column named `model` is no forecast-table column for predict: its output works.
    out = tmp_path / "forecast.csv"
    code, stdout, err = run(
        capsys, "predict", "--run", str(saved), "--csv", str(tables["history"]),
        "--future-csv", str(tables["future"]), "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    written = pd.read_csv(out)
    assert list(written.columns) == ["model", "day", "q0.1", "q0.5", "q0.9"]
    future = pd.read_csv(tables["future"])
    expected = future.sort_values(["model", "day"])[["model", "day"]].reset_index(drop=True)
    assert written["model"].tolist() == expected["model"].tolist()
    assert pd.to_datetime(written["day"]).tolist() == pd.to_datetime(expected["day"]).tolist()
    assert f"fp32: {len(expected)} forecast rows (3 series): {out}" in stdout


def test_a_future_csv_of_day_first_times_is_named_with_the_flag_that_reads_it(
    capsys, tmp_path, saved, tables
):
    # The future's 03/04/2024 (3 April) read as 4 March: "future has no row for series ...
    # (7 missing)", naming neither the file nor --dayfirst, as the README says errors do.
    future = pd.read_csv(tables["future"])
    future["day"] = pd.to_datetime(future["day"]).dt.strftime("%d/%m/%Y")
    day_first = tmp_path / "future_day_first.csv"
    future.to_csv(day_first, index=False)
    out = tmp_path / "forecast.csv"
    argv = ["predict", "--run", str(saved), "--csv", str(tables["history"]),
            "--future-csv", str(day_first), "--out", str(out)]  # fmt: skip
    code, _, err = run(capsys, *argv)
    assert code == 2 and not out.exists()
    line = one_error_line(err, "predict")
    first = pd.to_datetime(pd.read_csv(tables["future"])["day"]).min()
    assert f"error: --future-csv {day_first}: future has no row for series" in line
    assert line.endswith(
        f"; its times read otherwise with --dayfirst: '{first:%d/%m/%Y}' is "
        f"{first.replace(month=first.day, day=first.month)} as read, {first} with --dayfirst"
    ), line
    code, _, err = run(capsys, *argv, "--dayfirst")
    assert code == 0, err
    assert len(pd.read_csv(out)) == len(future)


def test_forecast_refuses_a_run_whose_id_column_is_named_model_before_predicting(
    capsys, tmp_path, saved, tables
):
    # The forecast CSV inserts its own `model` column: pandas refused that after the
    # predictions ("cannot insert model, already exists"), naming no column or flag.
    out = tmp_path / "forecasts.csv"
    code, _, err = run(
        capsys, "forecast", "--run", str(saved), "--csv", str(tables["table"]),
        "--output", str(out),
    )  # fmt: skip
    assert code == 2
    line = one_error_line(err, "forecast")
    assert "error: the run's id column 'model' is the name of a column the forecast tables" in line
    assert not out.exists()


@pytest.mark.parametrize(
    "rename, flag",
    [({"store": "model"}, "--id-col"), ({"store": "horizon"}, "--id-col"),
     ({"day": "actual"}, "--time-col"), ({"store": "p50"}, "--id-col")],
)  # fmt: skip
def test_train_refuses_an_id_or_time_column_named_as_a_forecast_column_before_training(
    capsys, tmp_path, rename, flag
):
    # `model` crashed the run after training (no metrics, no plots); `horizon`, `actual`
    # and a quantile's `p50` replaced the ids or times of forecasts.csv without a word.
    table = pd.read_csv(write_table(tmp_path / "stores.csv")).rename(columns=rename)
    table.to_csv(tmp_path / "stores.csv", index=False)
    id_col, time_col = rename.get("store", "store"), rename.get("day", "day")
    out = tmp_path / "run"
    code, _, err = run(
        capsys, "train", "--csv", str(tmp_path / "stores.csv"), "--id-col", id_col,
        "--time-col", time_col, "--target", "sales", "--freq", "D",
        "--history", str(HISTORY), "--horizon", str(HORIZON), "--hidden-dim", "8",
        "--heads", "2", "--batch-size", "8", "--max-steps", "1", "--out", str(out),
    )  # fmt: skip
    assert code == 2
    line = one_error_line(err, "train")
    column = rename.get("store", rename.get("day"))
    assert f"error: {flag} {column!r} is the name of a column the forecast tables add" in line
    assert not out.exists()


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
