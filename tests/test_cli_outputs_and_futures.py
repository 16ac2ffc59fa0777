"""`tft-jax` outputs named as what they are, futures read as what they add, messages in the
command's own words.

A file output given as a folder (`--out DIR/`) wrote a file named DIR, and
one named for another format (`.parquet`, `.csv.gz`) got plain CSV text;
`evaluate --split validation --output RUN/metrics.json` marked the run's
test-split entries (training seconds, sizes, plots) as the validation
split's; a future table the model does not read, for a run with no known
columns, was ignored without a word; messages named `history/horizon` and
a `--time-format` the command was not given. Nothing here trains.
"""

from __future__ import annotations

import argparse
import pathlib
import warnings

import pytest

from tft_jax import cli
from tft_jax.cli_parser import (
    UsageError,
    build_parser,
    check_output_suffix,
    flag_message,
)

from .cli_tables import run

RUN = ["--run", "RUN"]


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "flag", "example"),
    [
        (["predict", *RUN, "--csv", "h.csv", "--out", "DIR/"], "--out", "forecasts.csv"),
        (["evaluate", *RUN, "--output", "DIR/"], "--output", "metrics.json"),
        (["forecast", *RUN, "--output", "DIR/"], "--output", "forecasts.csv"),
    ],
)
def test_a_file_output_ending_with_a_separator_is_refused_naming_the_flag(
    capsys, argv, flag, example
):
    # `pathlib` dropped the '/', and the command wrote a file named DIR.
    with pytest.raises(SystemExit) as stop:
        _args(*argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"error: argument {flag}: 'DIR/' ends with '/', so it names a folder, but this is "
        f"the file to write: give the file's name, e.g. DIR/{example}"
    ) in err


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("forecasts.parquet", "a .parquet name says Parquet"),
        # pandas infers compression from the name it reads: the plain text failed to read.
        ("forecasts.csv.gz", "a .gz name says gzip-compressed"),
        ("forecasts.json", "a .json name says JSON"),
    ],
)
def test_predict_refuses_an_output_named_for_another_format_before_reading_the_run(
    capsys, tmp_path, name, says
):
    out = tmp_path / name
    code, _, err = run(
        capsys, "predict", "--run", str(tmp_path / "no_run"), "--csv", "h.csv",
        "--out", str(out), "--compile-cache", "none",
    )  # fmt: skip
    assert code == 2
    assert err.strip() == (
        f"tft-jax predict: error: --out {out}: {says}, but the command writes plain CSV "
        f"text; give it a .csv name, e.g. {tmp_path / 'forecasts.csv'}"
    )
    assert not out.exists()


def test_a_metrics_output_named_csv_is_refused_as_the_json_it_is_not(tmp_path):
    said = (
        r"--output .*m\.csv: a \.csv name says CSV, but the command writes plain JSON text; "
        r"give it a \.json name, e.g. .*m\.json"
    )
    with pytest.raises(UsageError, match=said):
        check_output_suffix(tmp_path / "m.csv", "--output", ".json")


def test_an_output_with_an_unknown_ending_is_announced_and_the_right_ones_are_not(recwarn):
    with pytest.warns(UserWarning, match=r"^--out p\.txt: written as CSV text, which its \.txt "
                      r"name does not say \(a \.csv name does\)$"):  # fmt: skip
        check_output_suffix(pathlib.Path("p.txt"), "--out", ".csv")
    recwarn.clear()
    for name, written in (("p.csv", ".csv"), ("P.CSV", ".csv"), ("p", ".csv"), ("m.json", ".json")):
        check_output_suffix(pathlib.Path(name), "--out", written)
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


def test_another_split_is_not_written_over_the_runs_test_metrics():
    # The run's `plots`, `seconds`, `size` of the test split were kept in a file then
    # marked `split: validation`.
    target = pathlib.Path("RUN/metrics.json")
    args = _args("evaluate", *RUN, "--split", "validation", "--output", str(target))
    # The file evaluate writes without --output is metrics_output's (another --csv's
    # name included), not one spelled again here.
    default = pathlib.Path("RUN/metrics_validation_other.json")
    with pytest.raises(UsageError) as caught:
        cli.check_same_split({"split": "test", "plots": []}, target, args, default)
    assert str(caught.value) == (
        "--output RUN/metrics.json holds the run's test metrics (with its training seconds, "
        "model sizes and plots, which only train writes); writing the validation split's "
        "over them would lose those: leave out --output (evaluate writes "
        "RUN/metrics_validation_other.json) or choose another file"
    )
    cli.check_same_split({"split": "validation"}, target, args, default)  # the same split
    test = _args("evaluate", *RUN, "--output", str(target))
    cli.check_same_split({"split": "validation"}, target, test, default)  # restoring the test


def test_a_future_that_adds_nothing_is_named_as_the_future_csv():
    args = _args("predict", *RUN, "--csv", "h.csv", "--future-csv", "f.csv", "--out", "p.csv")
    message = (
        "future adds nothing: the model uses no known columns, so the forecast reads the "
        "history only; leave it out"
    )
    assert cli.warning_text(message, args) == (
        "--future-csv f.csv adds nothing: the model uses no known columns, so the forecast "
        "reads the history only; leave it out"
    )


def test_history_and_horizon_advice_names_their_flags_in_train_only():
    message = "1 series are shorter than 105 steps; drop them or shorten history/horizon"
    assert flag_message(message, vars(_args("train"))).endswith(
        "drop them or shorten --history/--horizon"
    )
    # A run's history and horizon are fixed: evaluate has no such flags.
    assert flag_message(message, vars(_args("evaluate", *RUN))) == message


def test_the_runs_time_format_is_not_said_as_a_flag_the_command_was_not_given():
    message = (
        "column 'day' has 7 times not in time_format='%d/%m/%Y', e.g. '2024-04-03' in "
        "series 'beta' at row 2"
    )
    plain = _args("predict", *RUN, "--csv", "h.csv", "--out", "p.csv")
    assert cli.cli_text(message, plain) == (
        "column 'day' has 7 times not in the run's time format '%d/%m/%Y' (set when it "
        "trained; pass --time-format to read this file's times otherwise), e.g. "
        "'2024-04-03' in series 'beta' at row 2"
    )
    given = _args("predict", *RUN, "--csv", "h.csv", "--out", "p.csv", "--time-format", "%d/%m/%Y")
    assert "times not in --time-format '%d/%m/%Y', e.g." in cli.cli_text(message, given)


def test_the_check_warns_nothing_for_a_file_output_without_a_format(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_output_suffix(tmp_path / "forecasts", "--out", ".csv")
