"""The benchmark scripts run their smallest configurations and emit well-formed JSON records.

The tests that compile a whole TFT train step or forward are marked `slow`
(tens of seconds cold on 2 cores; the session's compilation cache makes
reruns faster).
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from benchmarks import accelerator, attention, common, cpu, fake_quant, inference, train_step

# One timed call, no warm-up, and the test session's compilation cache (tests/conftest.py).
FAST = ["--json", "--steps", "1", "--warmup", "0", "--compile-cache"]


def run_json(main, argv, capsys) -> list[dict]:
    main([*argv, *FAST])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_train_step_records_float_and_qat_with_consistent_derived_fields(capsys):
    records = run_json(train_step.main, ["--config", "seed", "--mode", "float,qat"], capsys)
    assert [r["mode"] for r in records] == ["float", "qat"]
    for record in records:
        common.validate_record(record, train_step.REQUIRED_FIELDS)
        assert record["config"] == "seed" and record["batch_size"] == 4
        assert record["samples_per_s"] == pytest.approx(4 / record["median_s"])
        assert record["memory"]["peak_bytes"] > 0
    # The QAT model trains the FP32 model's very parameter tree.
    assert records[0]["params"] == records[1]["params"] > 0
    float_record, qat_record = records
    assert float_record["ratio_to_float"] == 1.0
    assert qat_record["ratio_to_float"] == pytest.approx(
        qat_record["median_s"] / float_record["median_s"]
    )

    (ratio,) = fake_quant.step_ratios(records)
    common.validate_record(ratio, fake_quant.RATIO_FIELDS)
    assert ratio["ratio"] == pytest.approx(qat_record["median_s"] / float_record["median_s"])
    assert ratio["meets_target"] == (ratio["ratio"] <= fake_quant.TARGET_RATIO)


def test_attention_records_one_per_length_and_path(capsys):
    records = run_json(attention.main, ["--lengths", "8,16", "--paths", "default,flash"], capsys)
    assert [(r["seq_len"], r["path"]) for r in records] == [
        (8, "default"),
        (8, "flash"),
        (16, "default"),
        (16, "flash"),
    ]
    for record in records:
        common.validate_record(record, attention.REQUIRED_FIELDS)
        assert record["tokens_per_s"] == pytest.approx(record["seq_len"] / record["median_s"])


def test_fake_quant_throughput_records_both_directions(capsys):
    records = run_json(fake_quant.main, ["--sizes", "64", "--ratio-config", "none"], capsys)
    assert [r["direction"] for r in records] == list(fake_quant.DIRECTIONS)
    for record in records:
        common.validate_record(record, fake_quant.THROUGHPUT_FIELDS)
        assert record["elements"] == 64
        assert record["ratio_to_baseline"] == pytest.approx(
            record["median_s"] / record["baseline_median_s"]
        )


@pytest.mark.slow
def test_inference_records_float_and_int8_with_smaller_int8_weights(capsys):
    records = run_json(inference.main, ["--config", "seed", "--batch-sizes", "1"], capsys)
    assert [r["kind"] for r in records] == ["float", "int8"]
    for record in records:
        common.validate_record(record, inference.REQUIRED_FIELDS)
    float_record, int8_record = records
    assert float_record["speedup_vs_float"] is None
    assert int8_record["speedup_vs_float"] == pytest.approx(
        float_record["median_s"] / int8_record["median_s"]
    )
    assert int8_record["weight_bytes"] < float_record["weight_bytes"] / 2


@pytest.mark.slow
@pytest.mark.peers
@pytest.mark.skipif(
    importlib.util.find_spec("pytorch_forecasting") is None, reason="needs the 'peers' extra"
)
def test_peer_records_both_frameworks_and_their_parameter_counts(capsys):
    from benchmarks import peer

    (record,) = run_json(peer.main, ["--config", "seed", "--block", "1"], capsys)
    common.validate_record(record, peer.REQUIRED_FIELDS)
    assert record["ours_params"] > 0 and record["theirs_params"] > 0
    assert record["param_ratio"] == pytest.approx(record["ours_params"] / record["theirs_params"])
    assert record["speedup"] == pytest.approx(record["theirs_median_s"] / record["ours_median_s"])
    assert record["meets_target"] == (record["speedup"] >= peer.TARGET_SPEEDUP["seed"])


def test_cpu_suite_ends_with_a_summary_of_the_tasks_run(capsys):
    records = run_json(cpu.main, ["--quick", "--only", "matmul-peak,fake_quant"], capsys)
    summary = records[-1]
    common.validate_record(summary, {"tasks_run": list, "tasks_skipped": list})
    assert summary["benchmark"] == "suite"
    assert summary["tasks_run"] == ["matmul-peak", "fake_quant"]
    assert {r["benchmark"] for r in records[:-1]} == {"matmul_peak", "fake_quant"}
    assert records[0]["matmul_peak_gflops"] > 0


def test_accelerator_refuses_a_cpu_backend_without_allow_cpu():
    with pytest.raises(SystemExit, match="no GPU/TPU"):
        accelerator.main(["--quick", "--out", "/dev/null"])


def test_accelerator_quick_writes_its_records_to_the_output_file(tmp_path, capsys):
    out = tmp_path / "results" / "accelerator.jsonl"
    argv = ["--quick", "--allow-cpu", "--only", "fake_quant", "--out", str(out)]
    records = run_json(accelerator.main, argv, capsys)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == records
    assert records[-1]["config"] == "accelerator" and records[-1]["tasks_run"] == ["fake_quant"]


def test_suite_skips_the_tasks_that_start_after_the_budget():
    ticks = iter([0.0, 0.0, 5.0, 11.0, 12.0])
    ran = []

    def task(name):
        return common.Task(name, "x", lambda: ran.append(name) or [])

    records = common.run_suite("t", [task("a"), task("b"), task("c")], 10.0, lambda: next(ticks))
    assert ran == ["a", "b"]
    assert records[-1]["tasks_run"] == ["a", "b"] and records[-1]["tasks_skipped"] == ["c"]
    assert records[-1]["elapsed_s"] == 12.0


def test_validate_record_names_the_missing_or_mistyped_field():
    record = common.make_record("x", "c", median_s=0.5)
    common.validate_record(record, {"median_s": float})
    with pytest.raises(ValueError, match="'steps'"):
        common.validate_record(record, {"steps": int})
    with pytest.raises(ValueError, match="'median_s'"):
        common.validate_record({**record, "median_s": "fast"}, {"median_s": float})


def test_step_times_summary_matches_numpy():
    np = pytest.importorskip("numpy")
    times = common.StepTimes((0.4, 0.1, 0.3, 0.2))
    summary = times.summary()
    assert summary["median_s"] == pytest.approx(np.median([0.1, 0.2, 0.3, 0.4]))
    assert summary["p90_s"] == pytest.approx(np.percentile([0.1, 0.2, 0.3, 0.4], 90))
    assert summary["min_s"] == 0.1 and summary["steps"] == 4


@pytest.mark.parametrize("steps, warmup", [(0, 0), (1, -1)])
def test_step_counts_out_of_range_raise_value_error(steps, warmup):
    with pytest.raises(ValueError):
        common.time_steps(lambda: None, steps, warmup)


def test_unknown_config_name_raises_value_error_listing_the_choices():
    with pytest.raises(ValueError, match="electricity"):
        train_step.get_config("weather")
