"""`benchmarks.accelerator`: the GPU suite's QAT step ratio, its NVIDIA reference model, failures.

The QAT/FP32 step ratio comes from steps timed in alternating blocks in one
process; `electricity-nvidia` has the shapes of the model behind NVIDIA's 10,173
items/s (and runs in the train-step and inference benchmarks), and the records
compared with that figure name how our model differs; a failing task is named
while the others run, and without a GPU nothing is created.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from benchmarks import accelerator, common, inference, train_step

# One timed call, no warm-up, and the test session's compilation cache (tests/conftest.py).
FAST = ["--json", "--steps", "1", "--warmup", "0", "--compile-cache"]

# NVIDIA DeepLearningExamples, PyTorch/Forecasting/TFT/configuration.py, ElectricityConfig:
# hidden_size 128, n_head 4, encoder_length 7 * 24, example_length 8 * 24; one static
# (categorical_id), three known continuous (hour, day_of_week, hours_from_start); the
# historic variables are the known ones and the target; the README's batch is 1024.
NVIDIA_ELECTRICITY = {
    "batch_size": 1024,
    "hidden_dim": 128,
    "num_heads": 4,
    "sequence_length": 7 * 24,
    "prediction_horizon": 8 * 24 - 7 * 24,
    "static_variables": 1,
    "known_variables": 3,
    "history_variables": 3 + 1,
}


def test_electricity_nvidia_has_the_shapes_of_the_model_behind_the_reference_figure():
    config = train_step.get_config("electricity-nvidia", "bfloat16", accelerator.HEADLINE_BATCH)
    assert accelerator.model_shapes(config) == NVIDIA_ELECTRICITY
    fields = accelerator.reference_fields(config, 20346.0)
    assert fields["reference_shape_differences"] == []
    assert fields["ratio_to_reference"] == pytest.approx(2.0)
    assert fields["reference_items_per_s"] == 10173.0


def test_the_electricity_headline_names_how_its_model_differs_from_nvidias():
    config = train_step.get_config("electricity", "bfloat16", accelerator.HEADLINE_BATCH)
    differences = accelerator.reference_fields(config, 1.0)["reference_shape_differences"]
    # Ours: hidden 160, 5 statics, 10 known, 15 observed (no known history).
    assert differences == [
        "hidden_dim 160 vs 128",
        "static_variables 5 vs 1",
        "known_variables 10 vs 3",
        "history_variables 15 vs 4",
    ]


def test_accelerator_measures_the_nvidia_shaped_model_right_after_the_headline():
    names = [task.name for task in accelerator.tasks(1, 0)]
    assert names[1:3] == [
        "train_step-electricity-float-bfloat16-B1024",
        "train_step-electricity-nvidia-float-bfloat16-B1024",
    ]


def test_a_known_history_configuration_runs_in_the_train_step_and_inference_benchmarks():
    # `electricity-nvidia` shrunk: its known history reaches both benchmarks' model calls.
    base = train_step.get_config("electricity-nvidia")
    small = dataclasses.replace(
        base.model, hidden_dim=8, num_heads=2, sequence_length=4, prediction_horizon=2
    )
    config = dataclasses.replace(base, model=small, batch_size=2)
    assert small.use_known_history
    record = train_step.bench(config, "float", steps=1, warmup=0)
    assert math.isfinite(record["median_s"]) and record["median_s"] > 0
    (forward,) = inference.bench(config, ("float",), steps=1, warmup=0)
    assert forward["batch_size"] == 2 and forward["median_s"] > 0


def test_accelerator_qat_step_ratio_comes_from_alternating_steps_in_one_process(
    tmp_path, capsys, monkeypatch
):
    calls: list[dict[str, common.StepTimes]] = []
    time_alternating = common.time_alternating

    def spy(steps, *args, **kwargs):
        times = time_alternating(steps, *args, **kwargs)
        calls.append(times)
        return times

    monkeypatch.setattr(common, "time_alternating", spy)
    only = "train_step-tiny-qat-bfloat16-B8,fake_quant"
    argv = ["--quick", "--allow-cpu", "--only", only, "--out", str(tmp_path / "a.jsonl")]
    accelerator.main([*argv, *FAST])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    (qat,) = [r for r in records if r["benchmark"] == "train_step"]
    (ratio,) = [r for r in records if r["benchmark"] == "qat_step_ratio"]
    (pair,) = [times for times in calls if set(times) == {"float", "qat"}]
    assert qat["mode"] == "qat" and qat["dtype"] == "bfloat16"
    assert ratio["float_median_s"] == qat["float_median_s"] == pair["float"].median
    assert ratio["qat_median_s"] == qat["median_s"] == pair["qat"].median
    assert qat["ratio_to_float"] == pytest.approx(pair["qat"].median / pair["float"].median)
    assert ratio["ratio"] == pytest.approx(qat["ratio_to_float"])


def _boom() -> list[dict]:
    raise ValueError("boom")


def test_run_suite_keep_going_names_a_failed_task_and_runs_the_next(capsys):
    ran = []
    tasks = [
        common.Task("a", "x", _boom),
        common.Task("b", "x", lambda: ran.append("b") or [common.make_record("x", "b")]),
    ]
    records = common.run_suite("t", tasks, keep_going=True)
    assert ran == ["b"]
    summary = records[-1]
    assert summary["tasks_run"] == ["b"] and summary["tasks_skipped"] == []
    assert summary["tasks_failed"] == [{"task": "a", "error": "ValueError: boom"}]
    common.validate_record(summary, {"tasks_failed": list})
    assert "ValueError: boom" in capsys.readouterr().err  # the traceback
    with pytest.raises(ValueError, match="boom"):  # without keep_going, as before
        common.run_suite("t", tasks)


def test_accelerator_runs_the_other_tasks_and_exits_nonzero_when_one_fails(
    tmp_path, capsys, monkeypatch
):
    def tasks(steps, warmup, quick=False):
        return [
            common.Task("first", "x", _boom),
            common.Task("second", "x", lambda: [common.make_record("x", "second")]),
        ]

    monkeypatch.setattr(accelerator, "tasks", tasks)
    out = tmp_path / "a.jsonl"
    with pytest.raises(SystemExit, match=r"1 task\(s\) failed \(first;"):
        accelerator.main(["--allow-cpu", "--out", str(out), *FAST])
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["config"] for r in written] == ["second", "accelerator"]
    assert written[-1]["tasks_run"] == ["second"]
    assert written[-1]["tasks_failed"] == [{"task": "first", "error": "ValueError: boom"}]


def test_accelerator_without_a_gpu_refuses_before_creating_the_output_folder(tmp_path):
    folder = tmp_path / "results"
    with pytest.raises(SystemExit, match="no GPU/TPU"):
        accelerator.main(["--out", str(folder / "a.jsonl")])
    assert not folder.exists()
