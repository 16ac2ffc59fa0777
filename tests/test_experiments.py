"""The clipping experiment: its divergence rule, and the whole experiment on a tiny table."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tft_jax.experiments import diverged

from .cli_tables import PNG_SIGNATURE, TINY_MODEL, run, table_args, write_table


@pytest.fixture(scope="module")
def csv_path(tmp_path_factory):
    return write_table(tmp_path_factory.mktemp("table") / "stores.csv")


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
