"""The time budget and the progress lines through the pipeline: `--time-budget`,
`TrainingConfig.time_budget`, the `Forecaster`'s labelled phases.

`fit`'s own budget and progress display are tested exactly on a fake clock in
tests/test_train.py; here the settings reach it.
"""

from __future__ import annotations

import argparse

import pytest

from tft_jax import cli
from tft_jax.cli_parser import duration, forecaster_config
from tft_jax.forecaster import TrainingConfig

from .cli_tables import table_args, write_table


@pytest.fixture(scope="module")
def csv_path(tmp_path_factory):
    return write_table(tmp_path_factory.mktemp("table") / "stores.csv")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("3m", 180.0), ("1h", 3600.0), ("1.5h", 5400.0), ("45", 45.0),
     (" 2M ", 120.0), ("0.25", 0.25), ("10 s", 10.0)],
)  # fmt: skip
def test_duration_reads_seconds_minutes_and_hours(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "3x", "-5s", "0", "0m", "1h30m", "inf", "nan"])
def test_duration_rejects_anything_else_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"such as 90s, 3m, 1h or seconds"):
        duration(text)


def test_time_budget_flag_reaches_the_training_config(csv_path, capsys) -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["train", *table_args(csv_path), "--time-budget", "3m"])
    assert forecaster_config(args, qat=False).training.time_budget == 180.0
    default = parser.parse_args(["train", *table_args(csv_path)])
    assert forecaster_config(default, qat=False).training.time_budget == 180.0
    unlimited = parser.parse_args(["train", *table_args(csv_path), "--time-budget", "none"])
    assert forecaster_config(unlimited, qat=False).training.time_budget is None
    qat_default = forecaster_config(parser.parse_args(["train", *table_args(csv_path)]), qat=True)
    assert qat_default.qat.time_budget == 60.0
    with pytest.raises(SystemExit):
        parser.parse_args(["train", *table_args(csv_path), "--time-budget", "3 weeks"])
    assert "--time-budget: expected a duration > 0" in capsys.readouterr().err


def test_training_config_time_budget_is_a_positive_number() -> None:
    assert TrainingConfig(time_budget=90).time_budget == 90
    with pytest.raises(ValueError, match=r"TrainingConfig\.time_budget must lie in \(0\.0, inf\)"):
        TrainingConfig(time_budget=0.0)
    with pytest.raises(TypeError, match=r"TrainingConfig\.time_budget must be a number"):
        TrainingConfig(time_budget="3m")


# The end-to-end run with a spent budget is in tests/test_cli.py, next to the CLI's other
# runs on the same table and settings: in one process it reuses their traced steps.
