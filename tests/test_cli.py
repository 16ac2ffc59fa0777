"""The `tft-jax` command line: argument errors, and the whole pipeline on a tiny table.

The end-to-end tests (marked slow) train for a handful of steps on a tiny
synthetic long-format CSV with `--qat`, then check every file a run writes.
Their cost is XLA compilation (about ten jitted functions); with the
persistent cache of tests/conftest.py a second run is much faster.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pandas as pd
import pytest

from tft_jax import cli
from tft_jax.experiments import diverged

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HISTORY, HORIZON = 14, 7


def write_table(path: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """Three daily stores, 100 days each: weekly pattern, promotions, a static size."""
    rng = np.random.default_rng(seed)
    frames = []
    for code, store in enumerate(("alpha", "beta", "gamma")):
        days = pd.date_range("2024-01-01", periods=100, freq="D")
        promo = (rng.random(100) < 0.2).astype(float)
        weekend = (days.dayofweek >= 5).astype(float)
        sales = 10 + 3 * code + 2 * weekend + 4 * promo + rng.normal(scale=0.5, size=100)
        frames.append(
            pd.DataFrame(
                {
                    "store": store,
                    "day": days.strftime("%Y-%m-%d"),
                    "sales": sales,
                    "size": 1.0 + code,
                    "promo": promo,
                    "temperature": rng.normal(size=100),
                }
            )
        )
    pd.concat(frames).to_csv(path, index=False)
    return path


def table_args(csv: pathlib.Path) -> list[str]:
    return [
        "--csv", str(csv),
        "--id-col", "store",
        "--time-col", "day",
        "--target", "sales",
        "--static-cols", "size",
        "--known-cols", "promo",
        "--observed-cols", "temperature",
        "--freq", "D",
        "--history", str(HISTORY),
        "--horizon", str(HORIZON),
        "--validation-fraction", "0.15",
        "--test-fraction", "0.15",
    ]  # fmt: skip


TINY_MODEL = ["--hidden-dim", "8", "--heads", "2", "--compile-cache", "none", "--quiet"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


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
    assert "--id-col describe a table but no --csv was given" in err


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


@pytest.mark.parametrize("command", ["evaluate", "forecast", "plot"])
def test_commands_on_a_directory_without_a_run_say_so(capsys, tmp_path, command):
    code, _, err = run(capsys, command, "--run", str(tmp_path))
    assert code == 2
    assert "config.json does not exist" in err


def test_demo_options_parse_as_train_arguments():
    args = cli.build_parser().parse_args(["train", *cli.demo_argv()])
    assert args.qat and args.history == 72 and args.horizon == 24
    assert args.history >= 24  # the hourly seasonal naive period must fit


def test_json_ready_turns_non_finite_floats_into_null():
    data = {"a": math.nan, "b": [1.0, math.inf], "c": np.float32(0.5), "d": (1, 2)}
    assert cli.json_ready(data) == {"a": None, "b": [1.0, None], "c": 0.5, "d": [1, 2]}


# ---------------------------------------------------------------------------
# Divergence rule of the clipping experiment


def history(train, val, skipped=0):
    return {
        "train_loss": train,
        "val_loss": val,
        "skipped_steps": [0] * (len(train) - 1) + [skipped],
    }


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (history([0.5, 0.4, 0.3], [0.5, 0.4, 0.3]), False),
        (history([0.5, 0.4, 1.6], [0.5, 0.4, 0.3]), True),  # > 3x the first interval
        (history([0.5, 1.4, 0.3], [0.5, 0.4, 0.3]), False),  # below 3x
        (history([0.5, math.nan, 0.3], [0.5, 0.4, 0.3]), True),
        (history([0.5, 0.4, 0.3], [0.5, math.inf, 0.3]), True),
        (history([0.5, 0.4, 0.3], [0.5, 0.4, 0.3], skipped=2), True),
    ],
)
def test_divergence_rule(record, expected):
    assert diverged(record, explode_factor=3.0) is expected


# ---------------------------------------------------------------------------
# End to end


@pytest.fixture(scope="module")
def trained_run(csv_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    code = cli.main(
        [
            "train", *table_args(csv_path), *TINY_MODEL,
            "--batch-size", "8", "--max-steps", "4", "--eval-every", "2", "--val-windows", "16",
            "--qat", "--qat-steps", "3", "--qat-calibration-batches", "2",
            "--eval-batch-size", "32", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    return out


@pytest.mark.slow
def test_train_writes_metrics_of_all_four_models_with_finite_values(trained_run):
    metrics = json.loads((trained_run / "metrics.json").read_text())
    assert set(metrics["models"]) == {"seasonal_naive", "fp32", "qat", "int8"}
    for name, row in metrics["models"].items():
        for key in ("p50_q_risk", "p90_q_risk", "mean_quantile_loss", "mean_quantile_loss_scaled"):
            assert math.isfinite(row[key]) and row[key] >= 0, (name, key)
    assert metrics["split"] == "test" and metrics["seasonal_naive_period"] == 7
    # int8 runs the fake-quant model's arithmetic in integers: near-identical risk.
    assert metrics["models"]["int8"]["p50_q_risk"] == pytest.approx(
        metrics["models"]["qat"]["p50_q_risk"], rel=0.05
    )


@pytest.mark.slow
def test_train_writes_the_config_it_used(trained_run, csv_path):
    config = json.loads((trained_run / "config.json").read_text())
    assert config["data"]["csv"] == str(csv_path.resolve())
    assert config["data"]["static_cols"] == ["size"]
    assert config["model"]["hidden_dim"] == 8 and config["model"]["num_heads"] == 2
    assert config["model"]["sequence_length"] == HISTORY
    assert config["training"]["total_steps"] == 4
    assert config["qat"]["enabled"] and config["qat"]["bits"] == 8
    assert config["baseline"]["seasonal_naive_period"] == 7


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
    for name in ("seasonal_naive", "fp32", "qat", "int8"):
        assert after["models"][name]["p50_q_risk"] == pytest.approx(
            before["models"][name]["p50_q_risk"], rel=1e-5
        )


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
def test_clipping_experiment_writes_paired_runs_a_summary_and_a_plot(capsys, csv_path, tmp_path):
    code, out, _ = run(
        capsys, "experiment", "clipping", *table_args(csv_path), *TINY_MODEL,
        "--seeds", "2", "--steps", "4", "--eval-every", "2", "--batch-size", "8",
        "--val-windows", "16", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0
    result = json.loads((tmp_path / "clipping.json").read_text())
    pairs = sorted((run["clip"], run["seed"]) for run in result["runs"])
    assert pairs == [(False, 0), (False, 1), (True, 0), (True, 1)]
    for record in result["runs"]:
        assert record["step"] == [2, 4]
        assert len(record["train_loss"]) == len(record["val_loss"]) == 2
        assert len(record["step_loss"]) == len(record["step_grad_norm"]) == 4
        assert all(math.isfinite(v) for v in record["step_grad_norm"])
        # The interval means are the means of the per-step losses.
        assert record["train_loss"][1] == pytest.approx(np.mean(record["step_loss"][2:]))
    assert result["summary"]["with_clipping"]["runs"] == 2
    assert result["settings"]["clip_norm"] == 0.05
    assert (tmp_path / "clipping.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "with_clipping" in out
