"""The clipping experiment: its divergence rule, its summary of the runs, and the whole
experiment on a tiny table."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from tft_jax import cli, experiments
from tft_jax.cli_parser import forecaster_config
from tft_jax.data import prepare_dataset
from tft_jax.experiments import ClippingSettings, _summary, diverged

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


# ---------------------------------------------------------------------------
# Settings and bookkeeping (no training)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seeds", ()),
        ("seeds", (-1,)),  # NumPy's batch-order generator rejects it only after init
        ("seeds", (0.5,)),
        ("seeds", (0, 2**32)),  # the same keys twice: a JAX key keeps the low 32 bits
        ("seeds", 3),
        ("seeds", (0, 0)),
        ("calibrate_steps", -1),  # would silently never calibrate the observers
        ("calibrate_steps", 2.5),
        ("calibrate_steps", "5"),
        ("weight_decay", math.nan),
        ("weight_decay", -0.1),
        ("learning_rate", True),
        ("learning_rate", math.inf),
        ("clip_norm", 0.0),
        ("explode_factor", "3"),
        ("explode_factor", 1.0),
        ("validation_windows", 16),  # < batch_size 64: would evaluate 64, not "at most 16"
    ],
)
def test_settings_reject_bad_values_naming_the_field(field, value):
    with pytest.raises(
        ValueError, match=rf"ClippingSettings\.{field} .*got {re.escape(repr(value))}"
    ):
        ClippingSettings(**{field: value})


def test_settings_accept_their_documented_range():
    settings = ClippingSettings(
        seeds=(3, 0), calibrate_steps=0, weight_decay=0.0, batch_size=8, validation_windows=8
    )
    assert settings.seeds == (3, 0) and settings.calibrate_steps == 0


def test_the_reported_validation_windows_are_the_evaluated_ones(csv_path, monkeypatch):
    """A split that is not a whole number of batches: the count is what `evaluate` sees."""
    args = cli.build_parser().parse_args(["train", *table_args(csv_path)])
    dataset = prepare_dataset(csv_path, **forecaster_config(args, qat=False).data.prepare_options())
    batch_size = 8
    assert len(dataset.validation) % batch_size  # the case under test
    evaluated = []

    def fake_run(state, batches, val_batches, **kwargs):
        evaluated.append(sum(len(batch.target) for batch in val_batches))
        one = {"step": [1], "train_loss": [1.0], "val_loss": [1.0], "skipped_steps": [0]}
        return {**one, "step_loss": [1.0], "step_grad_norm": [1.0]}

    monkeypatch.setattr(experiments, "create_train_state", lambda *args, **kwargs: None)
    monkeypatch.setattr(experiments, "train_run", fake_run)
    settings = ClippingSettings(seeds=(0,), steps=1, batch_size=batch_size, validation_windows=256)
    result = experiments.clipping_experiment(None, dataset.train, dataset.validation, settings)
    expected = len(dataset.validation) // batch_size * batch_size
    assert evaluated == [expected, expected]
    assert result["settings"]["validation_windows"] == expected


def test_train_run_rejects_an_epoch_without_batches_instead_of_looping():
    epochs = []

    def empty(epoch):
        epochs.append(epoch)
        if len(epochs) > 3:
            raise RuntimeError("train_run keeps asking for epochs")
        return iter(())

    with pytest.raises(ValueError, match=r"batches\(0\) gave no batch"):
        experiments.train_run(None, empty, [], steps=2, eval_every=1, seed=0, calibrate_steps=0)
    with pytest.raises(ValueError, match="eval_every must be an int >= 1, got 0"):
        experiments.train_run(None, empty, [], steps=2, eval_every=0, seed=0, calibrate_steps=0)


def test_cli_settings_errors_name_the_flag(capsys, csv_path, tmp_path):
    code, _, err = run(
        capsys, "experiment", "clipping", *table_args(csv_path), "--explode-factor", "0.5",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 2
    assert "--explode-factor must be > 1, got 0.5" in err
    assert "ClippingSettings" not in err
    code, _, err = run(
        capsys, "experiment", "clipping", *table_args(csv_path), "--batch-size", "32",
        "--val-windows", "16", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 2
    assert "--val-windows must be >= --batch-size (32)" in err
    assert not (tmp_path / "out" / "clipping.json").exists()


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


def test_clipping_summary_matches_a_hand_computation():
    runs = [
        {"final_val_loss": 0.5, "diverged": False, "skipped_total": 0, "clipped_fraction": 0.2},
        {"final_val_loss": float("nan"), "diverged": True, "skipped_total": 3,
         "clipped_fraction": 0.6},
        {"final_val_loss": 0.3, "diverged": False, "skipped_total": 1, "clipped_fraction": 0.1},
        {"final_val_loss": 0.4, "diverged": True, "skipped_total": 0, "clipped_fraction": 0.3},
    ]  # fmt: skip
    summary = _summary(runs)
    assert summary["runs"] == 4
    assert summary["diverged"] == 2
    assert summary["skipped_steps"] == 4
    assert summary["clipped_fraction_mean"] == pytest.approx(0.3)
    assert summary["final_val_loss_median"] == pytest.approx(0.4)
    assert summary["final_val_loss_mean"] == pytest.approx(0.4)
    assert summary["final_val_loss_min"] == 0.3
    assert summary["final_val_loss_max"] == 0.5
    assert summary["non_finite_final_val_loss"] == 1
