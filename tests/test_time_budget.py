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
from tft_jax.forecaster import Forecaster, TrainingConfig

from .cli_tables import TINY_QAT, TINY_RUN, table_args, write_table


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
