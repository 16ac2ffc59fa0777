"""The CLI parser (`tft_jax.cli_parser`): text encodings are checked as the flags are parsed,
the model and split choices are the library's own tuples, not copies, and the data layer's
keyword hints become flags."""

from __future__ import annotations

import argparse

import pytest

from tft_jax.cli_parser import (
    build_parser,
    duration,
    flag_message,
    fraction,
    fraction_or_one,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from tft_jax.data.dataset import SPLITS
from tft_jax.forecaster.predictors import MODEL_NAMES


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "--run", "r", "--csv", "c.csv", "--out", "o.csv", "--encoding", "bogus"],
        ["train", "--csv", "c.csv", "--encoding", "bogus"],
        ["plot", "--run", "r", "--encoding", "utf-9"],
    ],
)
def test_an_unknown_encoding_is_refused_by_the_parser_naming_the_flag(capsys, argv):
    # Unchecked, it failed only when the CSV was read, with an error naming --csv.
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(argv)
    assert raised.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "argument --encoding: unknown text encoding" in line


def test_a_known_encoding_parses_unchanged():
    args = build_parser().parse_args(["train", "--csv", "c.csv", "--encoding", "latin-1"])
    assert args.encoding == "latin-1"


def _subparser(name: str) -> argparse.ArgumentParser:
    (commands,) = [
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return commands.choices[name]


@pytest.mark.parametrize("command", ["predict", "forecast", "plot"])
def test_model_choices_are_the_librarys_model_names_not_a_copy(command):
    (action,) = [a for a in _subparser(command)._actions if "--model" in a.option_strings]
    assert action.choices is MODEL_NAMES


@pytest.mark.parametrize("command", ["evaluate", "forecast", "plot"])
def test_split_choices_are_the_data_layers_splits_not_a_copy(command):
    (action,) = [a for a in _subparser(command)._actions if "--split" in a.option_strings]
    assert action.choices is SPLITS


def test_flag_message_says_a_keyword_and_its_flag_once():
    assert flag_message("e.g. encoding='latin-1' (--encoding latin-1)") == "e.g. --encoding latin-1"
    assert flag_message("dayfirst=False (--dayfirst)") == "dayfirst=False (--dayfirst)"
    # A command without the flag keeps the data layer's text.
    text = "pass dayfirst=True (--dayfirst) or time_format='%d' (--time-format)"
    assert flag_message(text, {"encoding"}) == text


@pytest.mark.parametrize(
    ("parse", "text", "want"),
    [
        (positive_float, "0", None),  # > 0: zero is refused
        (positive_float, "1e-300", 1e-300),
        (non_negative_float, "0", 0.0),
        (non_negative_float, "-1e-9", None),
        (fraction, "0", 0.0),
        (fraction, "0.999", 0.999),
        (fraction, "1", None),  # [0, 1)
        (fraction_or_one, "1", 1.0),  # [0, 1]
        (fraction_or_one, "1.0001", None),
        (duration, "0", None),  # a duration > 0
        (duration, "0s", None),
        (duration, "90s", 90.0),
        (duration, "1.5h", 5400.0),
        (duration, "3m", 180.0),
        (positive_int, str(2**31 - 1), 2**31 - 1),  # an int32, as shapes and indices need
        (positive_int, str(2**31), None),
        (positive_int, "0", None),
        (non_negative_int, "0", 0),
    ],
)
def test_flag_value_types_accept_and_refuse_at_their_bounds(parse, text, want):
    if want is None:
        with pytest.raises(argparse.ArgumentTypeError, match="expected"):
            parse(text)
    else:
        assert parse(text) == want
