"""The clipping experiment: its divergence rule, its summary of the runs, and the whole
experiment on a tiny table."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import jax
import numpy as np
import pytest

from tft_jax import cli, experiments
from tft_jax.cli_parser import forecaster_config
from tft_jax.data import prepare_dataset
from tft_jax.experiments import ClippingSettings, _summary, diverged
from tft_jax.train import create_train_state, make_optimizer

from .cli_tables import PNG_SIGNATURE, TINY_MODEL, run, table_args, write_table
from .linear_quantile_model import MODEL as LINEAR_MODEL
from .linear_quantile_model import linear_batch, run_experiments_on_the_linear_model


@pytest.fixture(scope="module")
def csv_path(tmp_path_factory):
    return write_table(tmp_path_factory.mktemp("table") / "stores.csv")


# ---------------------------------------------------------------------------
# Divergence rule of the clipping experiment, on hand-made per-step records


def record(step_loss, points, val, initial_val=0.8, observed=None, skipped=None, train=None):
    """A `train_run` record of these per-step losses, points at the steps `points`.

    Each step has 8 observed targets unless `observed` says otherwise; `train`
    (the interval means) is computed here unless given.
    """
    observed = [8] * len(step_loss) if observed is None else observed
    skipped = [0] * len(step_loss) if skipped is None else skipped
    if train is None:
        train, start = [], 0
        for end in points:
            kept = [
                (loss, count)
                for loss, count, skip in zip(
                    step_loss[start:end], observed[start:end], skipped[start:end], strict=True
                )
                if count and not skip
            ]
            weight = sum(count for _, count in kept)
            train.append(sum(loss * count for loss, count in kept) / weight if kept else math.nan)
            start = end
    return {
        "step": list(points),
        "train_loss": train,
        "val_loss": val,
        "skipped_steps": [sum(skipped[:end]) for end in points],
        "initial_val_loss": initial_val,
        "step_loss": step_loss,
        "step_grad_norm": [0.1] * len(step_loss),
        "step_observed": observed,
        "step_skipped": skipped,
    }


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        pytest.param(record([0.5, 0.45, 0.4, 0.35], [2, 4], [0.5, 0.4]), False, id="healthy"),
        # The audit's run: 0.87 at step 0, 1.2e5 at step 1. The first interval's mean
        # already holds the explosion, so as a baseline it hid it.
        pytest.param(
            record([0.87, 1.2e5, 2.8e4, 2.7e4], [2, 4], [2e4, 1.8e4]),
            True,
            id="explodes-in-the-first-interval",
        ),
        # The same training curve with sane validation losses: the training baseline
        # (step 0's loss) alone flags it.
        pytest.param(
            record([0.87, 1.2e5, 2.8e4, 2.7e4], [2, 4], [0.7, 0.6]),
            True,
            id="training-loss-explodes-in-the-first-interval",
        ),
        # One interval: nothing came after the old baseline to compare with it.
        pytest.param(record([0.5, 9.0, 8.0], [3], [0.5]), True, id="explodes-in-the-only-interval"),
        # Validation 2.5 > 3 x 0.8 at initialization, training loss calm.
        pytest.param(
            record([0.5, 0.45, 0.4, 0.35], [2, 4], [0.6, 2.5]),
            True,
            id="validation-loss-exceeds-3x-its-initial-value",
        ),
        pytest.param(
            record([0.5, 0.45, 0.4, 0.35], [2, 4], [0.6, 2.3]), False, id="validation-below-3x"
        ),
        # Interval means 1.4 and 1.6 against step 0's 0.5: 2.8x and 3.2x.
        pytest.param(record([0.5, 1.4], [1, 2], [0.5, 0.4]), False, id="training-below-3x"),
        pytest.param(record([0.5, 1.6], [1, 2], [0.5, 0.4]), True, id="training-above-3x"),
        # A first interval without an observed target has no training loss (NaN: no
        # data), and the baseline is the first applied step's loss (0.5), not step 0's 0.
        pytest.param(
            record([0.0, 0.0, 0.5, 0.45], [2, 4], [0.6, 0.5], observed=[0, 0, 8, 8]),
            False,
            id="an-interval-without-observed-targets-is-no-data",
        ),
        # A NaN training loss where steps were applied is not "no data".
        pytest.param(
            record([0.5, 0.4], [1, 2], [0.5, 0.4], train=[0.5, math.nan]),
            True,
            id="nan-training-loss-with-data",
        ),
        pytest.param(record([0.5, 0.4, 0.3], [3], [math.inf]), True, id="infinite-validation-loss"),
        pytest.param(
            record([0.5, 0.4, 0.3], [3], [0.5], initial_val=math.nan),
            True,
            id="non-finite-initial-validation-loss",
        ),
        pytest.param(
            record([0.5, math.nan, 0.3], [3], [0.5], skipped=[0, 1, 0]), True, id="skipped"
        ),
    ],
)
def test_divergence_rule_compares_with_the_losses_before_any_update(history, expected):
    assert diverged(history, explode_factor=3.0) is expected


def test_divergence_rule_reads_the_null_of_strict_json_as_nan():
    history = record([0.0, 0.5], [1, 2], [0.5, 0.4], observed=[0, 8], train=[None, 0.5])
    assert diverged(history, explode_factor=3.0) is False


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        # As `clipping.json` writes non-finite values: "nan", "inf", "-inf".
        (record([0.5, 0.4], [1, 2], [0.5, "inf"]), True),
        (record([0.5, 0.4], [1, 2], [0.5, 0.4], initial_val="nan"), True),
        (record([0.5, 0.4], [1, 2], [0.5, 0.4], train=[0.5, "nan"]), True),
        (record([0.5, 0.4], [1, 2], [0.5, 0.4], train=[0.5, "-inf"]), True),
        # The first interval has no applied step: its "nan" is no data, not divergence.
        (record([0.0, 0.5], [1, 2], [0.5, 0.4], observed=[0, 8], train=["nan", 0.5]), False),
    ],
)
def test_divergence_rule_reads_the_non_finite_strings_of_clipping_json(history, expected):
    assert diverged(history, explode_factor=3.0) is expected


@pytest.mark.parametrize("text", ["NaN", "0.4", "", "infinity"])
def test_divergence_rule_refuses_other_strings_naming_the_list(text):
    # NumPy read "0.4" and " NaN" as numbers: only the strings `clipping.json` writes are read.
    history = record([0.5, 0.4], [1, 2], [0.5, 0.4], train=[0.5, text])
    with pytest.raises(
        TypeError, match=rf"train_loss must hold numbers, None or one of \['nan', 'inf', "
        rf"'-inf'\], got {re.escape(repr(text))} at position 1",
    ):  # fmt: skip
        diverged(history, explode_factor=3.0)


def test_clipped_fraction_reads_the_non_finite_strings_of_clipping_json():
    # Step 1 was applied with an infinite norm (it exceeds any threshold); step 2 skipped.
    history = {"step_grad_norm": [0.01, "inf", "nan"], "step_observed": [8, 8, 8],
               "step_skipped": [0, 0, 1]}  # fmt: skip
    assert experiments.clipped_fraction(history, clip_norm=0.05) == 0.5


@pytest.mark.parametrize("factor", [math.nan, math.inf, 1.0, 0.5, -1.0, True, "3"])
def test_divergence_rule_refuses_a_threshold_that_decides_nothing(factor):
    # NaN compared False with every loss (no run diverged); 1 or less flags healthy runs.
    history = record([0.5, 0.45, 0.4, 0.35], [2, 4], [0.5, 0.4])
    with pytest.raises(
        ValueError,
        match=rf"diverged: explode_factor must be a finite number > 1, got "
        rf"{re.escape(repr(factor))}",
    ):
        diverged(history, explode_factor=factor)


@pytest.mark.parametrize("clip_norm", [math.nan, math.inf, 0.0, -1.0, False, None])
def test_clipped_fraction_refuses_a_threshold_that_decides_nothing(clip_norm):
    # NaN gave 0.0 (no norm exceeds it), 0 and -1 gave 1.0 (every norm does).
    history = {"step_grad_norm": [0.1, 0.02], "step_observed": [8, 8], "step_skipped": [0, 0]}
    with pytest.raises(
        ValueError,
        match=rf"clipped_fraction: clip_norm must be a finite number > 0, got "
        rf"{re.escape(repr(clip_norm))}",
    ):
        experiments.clipped_fraction(history, clip_norm=clip_norm)


def test_thresholds_accept_numpy_numbers():
    history = record([0.5, 1.6], [1, 2], [0.5, 0.4])  # 3.2 x step 0's loss
    assert diverged(history, explode_factor=np.float32(3.0)) is True
    assert diverged(history, explode_factor=np.int64(4)) is False
    assert experiments.clipped_fraction(history, clip_norm=np.float64(0.05)) == 1.0


def test_divergence_rule_reads_the_first_validation_loss_after_training():
    # Validation 2.5 > 3 x 0.8 at the first point, back to 0.6 at the second: the
    # explosion at the first point is divergence, whatever the later losses.
    history = record([0.5, 0.45, 0.4, 0.35], [2, 4], [2.5, 0.6], initial_val=0.8)
    assert diverged(history, explode_factor=3.0) is True


def test_divergence_rule_counts_step_0_in_the_first_interval():
    # The first point is at step 1: its interval is step 0 alone, applied, so its
    # NaN training loss is a diverged loss, not an interval without data.
    history = record([0.5, 0.4], [1, 2], [0.5, 0.4], train=[math.nan, 0.4])
    assert diverged(history, explode_factor=3.0) is True


def test_clipped_fraction_counts_norms_above_the_threshold_not_at_it():
    # A norm equal to clip_norm is not scaled down by clipping (factor 1): it did
    # not exceed it. Of 0.5, 0.75 and 0.25 against 0.5, one exceeds it.
    history = {"step_grad_norm": [0.5, 0.75, 0.25], "step_observed": [8, 8, 8],
               "step_skipped": [0, 0, 0]}  # fmt: skip
    assert experiments.clipped_fraction(history, clip_norm=0.5) == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("norms", "observed", "skipped", "expected"),
    [
        # Applied: steps 0, 3 and 5 (norms 0.1, 0.02, 0.07): two of three above 0.05.
        ([0.1, math.inf, math.nan, 0.02, 0.0, 0.07], [8, 8, 8, 8, 0, 8], [0, 1, 1, 0, 0, 0], 2 / 3),
        ([math.nan, math.inf], [8, 8], [1, 1], math.nan),  # nothing applied
    ],
)
def test_clipped_fraction_counts_the_applied_steps_only(norms, observed, skipped, expected):
    history = {"step_grad_norm": norms, "step_observed": observed, "step_skipped": skipped}
    got = experiments.clipped_fraction(history, clip_norm=0.05)
    assert got == pytest.approx(expected, nan_ok=True)


def test_train_run_catches_an_explosion_inside_the_first_interval(monkeypatch):
    """A linear quantile model under Adam at learning rate 100: the loss goes from 1.8
    at step 0 to 23 at step 1, within the first of two intervals; the interval means
    (12.5, 13.0) stay within 3x of each other, so the old first-interval baseline
    missed it. Learning rate 0.05 on the same batches stays healthy. (The linear
    model has no observers: `calibrate` is not passed on.)"""
    run_experiments_on_the_linear_model(monkeypatch)
    batches = [linear_batch(seed) for seed in range(50, 54)]
    validation = [linear_batch(60), linear_batch(61)]
    records = {}
    for lr in (100.0, 0.05):
        state = create_train_state(
            LINEAR_MODEL, make_optimizer(lr, clip_norm=None), jax.random.key(0), batches[0]
        )
        records[lr] = experiments.train_run(
            state, lambda epoch: batches, validation, steps=4, eval_every=2, seed=0,
            calibrate_steps=0,
        )  # fmt: skip
    found = {lr: diverged(history, explode_factor=3.0) for lr, history in records.items()}
    assert found == {100.0: True, 0.05: False}
    for history in records.values():
        assert history["step"] == [2, 4]
        assert history["step_observed"] == [6, 6, 6, 6]
        assert history["step_skipped"] == [0, 0, 0, 0]


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
        ("explode_factor", math.inf),  # switched the loss rule off; the CLI refuses it
        ("explode_factor", math.nan),
        ("steps", np.int64(0)),
        ("steps", np.bool_(True)),
        ("batch_size", 8.0),
        ("seeds", [0, 0]),
        ("seeds", (np.int64(-1),)),
        ("seeds", np.array([[0, 1]])),
        ("seeds", "01"),
        ("validation_windows", 16),  # < batch_size 64: would evaluate 64, not "at most 16"
    ],
)
def test_settings_reject_bad_values_naming_the_field(field, value):
    with pytest.raises(
        ValueError, match=rf"ClippingSettings\.{field} .*got {re.escape(repr(value))}"
    ):
        ClippingSettings(**{field: value})


def test_settings_take_numpy_numbers_as_python_numbers():
    # NumPy integers were refused as "must be an int >= 1, got np.int64(10)"; an
    # np.float32 threshold as "must be a finite number > 0".
    settings = ClippingSettings(
        steps=np.int64(10), batch_size=np.int32(8), eval_every=np.uint8(5),
        validation_windows=np.int64(16), calibrate_steps=np.int64(3), seeds=tuple(np.arange(3)),
        learning_rate=np.float64(0.1), clip_norm=np.float32(0.5), weight_decay=np.float32(0),
        explode_factor=np.int64(4),
    )  # fmt: skip
    assert dataclasses.astuple(settings) == (0.1, 0.5, (0, 1, 2), 10, 8, 5, 3, 4.0, 16, 0.0)
    for name, kind in (("steps", int), ("batch_size", int), ("eval_every", int),
                       ("validation_windows", int), ("calibrate_steps", int),
                       ("learning_rate", float), ("clip_norm", float), ("weight_decay", float),
                       ("explode_factor", float)):  # fmt: skip
        assert type(getattr(settings, name)) is kind, name
    assert all(type(seed) is int for seed in settings.seeds)
    json.dumps(dataclasses.asdict(settings))  # as `clipping.json` records them


@pytest.mark.parametrize("seeds", [[3, 0], np.array([3, 0]), (np.int64(3), np.int64(0))])
def test_settings_keep_seeds_as_a_tuple_of_ints(seeds):
    # A list was kept, so that `hash(settings)` failed: "unhashable type: 'list'".
    settings = ClippingSettings(seeds=seeds)
    assert settings.seeds == (3, 0) and type(settings.seeds) is tuple
    assert hash(settings) == hash(ClippingSettings(seeds=(3, 0)))
    assert settings == ClippingSettings(seeds=(3, 0))


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
        return record([1.0], [1], [1.0])

    monkeypatch.setattr(experiments, "create_train_state", lambda *args, **kwargs: None)
    monkeypatch.setattr(experiments, "train_run", fake_run)
    settings = ClippingSettings(seeds=(0,), steps=1, batch_size=batch_size, validation_windows=256)
    result = experiments.clipping_experiment(None, dataset.train, dataset.validation, settings)
    expected = len(dataset.validation) // batch_size * batch_size
    assert evaluated == [expected, expected]
    assert result["settings"]["validation_windows"] == expected


@pytest.mark.parametrize(
    ("train", "validation", "match"),
    [
        # No batch size mends a split without windows: it was "fewer than one batch of 8;
        # lower the batch size".
        (16, 0, r"validation split has no windows, .*validation_fraction > 0 or validation_start"),
        (16, 5, r"validation split has 5 windows, fewer than one batch of 8; lower "
                r"ClippingSettings\.batch_size$"),
        (0, 16, r"training split has no windows"),
        (7, 16, r"training split has 7 windows, fewer than one batch of 8; lower "
                r"ClippingSettings\.batch_size$"),
    ],
)  # fmt: skip
def test_splits_smaller_than_a_batch_are_refused_saying_what_helps(train, validation, match):
    settings = ClippingSettings(seeds=(0,), steps=1, batch_size=8, validation_windows=8)
    with pytest.raises(ValueError, match=match):
        experiments.check_splits([None] * train, [None] * validation, settings)
    with pytest.raises(ValueError, match=match):  # before any model is built
        experiments.clipping_experiment(None, [None] * train, [None] * validation, settings)


def test_splits_of_a_batch_each_are_accepted():
    settings = ClippingSettings(seeds=(0,), steps=1, batch_size=8, validation_windows=8)
    experiments.check_splits([None] * 8, [None] * 8, settings)
    with pytest.raises(TypeError, match="settings must be a ClippingSettings, got dict"):
        experiments.check_splits([None] * 8, [None] * 8, {})


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
    assert "--explode-factor must be a finite number > 1, got 0.5" in err
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
    for saved in result["runs"]:
        assert saved["step"] == [2, 4]
        assert len(saved["train_loss"]) == len(saved["val_loss"]) == 2
        assert len(saved["step_loss"]) == len(saved["step_grad_norm"]) == 4
        assert all(math.isfinite(v) for v in saved["step_grad_norm"])
        # The interval means are the means of the per-step losses.
        assert saved["train_loss"][1] == pytest.approx(np.mean(saved["step_loss"][2:]))
        assert math.isfinite(saved["initial_val_loss"])  # the divergence baseline
        assert len(saved["step_observed"]) == len(saved["step_skipped"]) == 4
        assert saved["diverged"] == diverged(saved, explode_factor=3.0)
    assert result["summary"]["with_clipping"]["runs"] == 2
    assert result["settings"]["clip_norm"] == 0.05
    assert (tmp_path / "clipping.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "with_clipping" in out


def test_clipping_experiment_judges_each_run_by_its_per_step_record(csv_path, monkeypatch):
    """Seed 0 is the audit's run (an explosion at step 1, every norm above the
    threshold); seed 1 is healthy with a step without an observed target (norm 0,
    nothing applied), so 2 of its 3 applied steps exceed 0.05."""
    args = cli.build_parser().parse_args(["train", *table_args(csv_path)])
    dataset = prepare_dataset(csv_path, **forecaster_config(args, qat=False).data.prepare_options())
    records = {
        0: record([0.87, 1.2e5, 2.8e4, 2.7e4], [2, 4], [2e4, 1.8e4]),
        1: record([0.5, 0.0, 0.4, 0.35], [2, 4], [0.5, 0.4], observed=[8, 0, 8, 8]),
    }
    records[0]["step_grad_norm"] = [73.2, 39.3, 26.3, 14.9]
    records[1]["step_grad_norm"] = [0.1, 0.0, 0.02, 0.07]
    monkeypatch.setattr(experiments, "create_train_state", lambda *args, **kwargs: None)
    monkeypatch.setattr(experiments, "train_run", lambda *args, seed, **kwargs: dict(records[seed]))
    settings = ClippingSettings(seeds=(0, 1), steps=4, eval_every=2, batch_size=8,
                                validation_windows=8)  # fmt: skip
    result = experiments.clipping_experiment(None, dataset.train, dataset.validation, settings)
    judged = {(run["clip"], run["seed"]): (run["diverged"], run["clipped_fraction"])
              for run in result["runs"]}  # fmt: skip
    for clip in (True, False):
        assert judged[clip, 0] == (True, 1.0)
        assert judged[clip, 1] == (False, pytest.approx(2 / 3))
    for summary in result["summary"].values():
        assert summary["diverged"] == 1
        assert summary["clipped_fraction_mean"] == pytest.approx((1.0 + 2 / 3) / 2)


def test_clipping_summary_leaves_runs_without_an_applied_step_out_of_the_clipped_fraction():
    runs = [
        {"final_val_loss": 0.5, "diverged": False, "skipped_total": 0, "clipped_fraction": 0.2},
        {"final_val_loss": math.nan, "diverged": True, "skipped_total": 4,
         "clipped_fraction": math.nan},
        {"final_val_loss": 0.3, "diverged": False, "skipped_total": 0, "clipped_fraction": 0.4},
    ]  # fmt: skip
    assert _summary(runs)["clipped_fraction_mean"] == pytest.approx(0.3)
    assert _summary(runs[1:2])["clipped_fraction_mean"] is None


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
