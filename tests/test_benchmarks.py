"""The benchmark scripts run their smallest configurations and emit well-formed JSON records.

Every script runs on the `tiny` configuration (the cheapest model to compile),
one timed call and no warm-up. Compiling a TFT dominates the cost, so compiled
executables are shared: one module-scoped run of `benchmarks.train_step` (FP32
and QAT) serves every train-step assertion; the inference script at the same
batch size and the peer comparison build their weights and FP32 step the same
way, and find those executables in the session's compilation cache.
"""

from __future__ import annotations

import datetime
import importlib.util
import json

import pytest

from benchmarks import (
    accelerator,
    attention,
    common,
    cpu,
    dropout_keys,
    fake_quant,
    inference,
    optimizer,
    profile_step,
    selection_variants,
    train_step,
)

# One timed call, no warm-up, and the test session's compilation cache (tests/conftest.py).
FAST = ["--json", "--steps", "1", "--warmup", "0", "--compile-cache"]


def run_json(main, argv, capsys) -> list[dict]:
    main([*argv, *FAST])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def train_run(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    """`(returned records, JSON lines written to --output)` of one float+qat run on `tiny`."""
    out = tmp_path_factory.mktemp("train_step") / "records.jsonl"
    argv = ["--config", "tiny", "--mode", "float,qat", *FAST, "--output", str(out)]
    records = train_step.main(argv)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    return records, written


def test_train_step_writes_one_valid_json_record_per_mode(train_run):
    records, written = train_run
    assert written == records
    assert [r["mode"] for r in records] == ["float", "qat"]
    tiny = train_step.CONFIGS["tiny"]
    for record in records:
        common.validate_record(record, train_step.REQUIRED_FIELDS)
        assert record["benchmark"] == "train_step" and record["config"] == "tiny"
        # One real CPU device in the test process: nothing simulated.
        assert record["env"]["device_count"] == 1 and record["env"]["simulated_devices"] is False
        assert record["batch_size"] == tiny.batch_size and record["steps"] == 1
        assert record["samples_per_s"] == pytest.approx(tiny.batch_size / record["median_s"])
        assert record["p10_s"] <= record["median_s"] <= record["p90_s"]
        assert record["compile_s"] == pytest.approx(record["lower_s"] + record["xla_compile_s"])
        memory = record["memory"]
        assert memory["peak_bytes"] == (
            memory["argument_bytes"]
            + memory["output_bytes"]
            - memory["alias_bytes"]
            + memory["temp_bytes"]
        )
        assert memory["alias_bytes"] > 0  # the state is donated
        assert record["flops"] > 0
        assert record["gflops_per_s"] == pytest.approx(record["flops"] / record["median_s"] / 1e9)


def test_train_step_layered_mode_is_the_fp32_model_through_the_plain_hook():
    config = train_step.CONFIGS["tiny"].model
    model = train_step.build_model("float-layered", config)
    assert model.config == config and model.dot_general_cls is train_step.PlainDotGeneral
    assert train_step.build_model("float", config).dot_general_cls is None


def test_train_step_qat_trains_the_same_parameters_and_reports_its_ratio(train_run):
    float_record, qat_record = train_run[0]
    # The QAT model trains the FP32 model's very parameter tree.
    assert float_record["params"] == qat_record["params"] > 0
    assert float_record["ratio_to_float"] == 1.0
    assert qat_record["ratio_to_float"] == pytest.approx(
        qat_record["median_s"] / float_record["median_s"]
    )
    (ratio,) = fake_quant.step_ratios(train_run[0])
    common.validate_record(ratio, fake_quant.RATIO_FIELDS)
    assert ratio["config"] == "tiny" and ratio["mode"] == "qat"
    assert ratio["ratio"] == pytest.approx(qat_record["ratio_to_float"])
    assert ratio["meets_target"] == (ratio["ratio"] <= fake_quant.TARGET_RATIO)


def test_train_step_parameter_count_matches_the_model(train_run):
    import jax

    from tft_jax import TemporalFusionTransformer

    tiny = train_step.CONFIGS["tiny"]
    batch = train_step.make_batch(tiny.model, tiny.batch_size)
    shapes = jax.eval_shape(
        TemporalFusionTransformer(tiny.model).init,
        jax.random.key(0),
        batch.static,
        batch.historical,
        batch.future,
    )
    assert train_run[0][0]["params"] == train_step.parameter_count(shapes["params"])


def test_optimizer_records_both_optimizers_and_fewer_kernels_for_the_flat_one(capsys):
    records = run_json(optimizer.main, ["--config", "tiny"], capsys)
    assert [r["optimizer"] for r in records] == list(optimizer.OPTIMIZERS)
    tree, flat = records
    for record in records:
        common.validate_record(record, optimizer.REQUIRED_FIELDS)
        assert record["leaves"] == tree["leaves"] and record["params"] == tree["params"]
    # Optax's chain costs several kernels per leaf; the flat vector a few in all.
    assert flat["fusions"] < tree["fusions"] - tree["leaves"]
    assert flat["fusions_ratio"] == pytest.approx(flat["fusions"] / tree["fusions"])
    assert tree["median_ratio"] == 1.0


def test_selection_variants_compute_the_same_loss_in_every_layout(capsys, monkeypatch):
    # Small chunks, so that `tiny`'s selection networks run over several of them.
    monkeypatch.setattr(selection_variants.chunked_selection, "DEFAULT_CHUNK_BYTES", 64)
    records = run_json(selection_variants.main, ["--config", "tiny", "--mode", "qat"], capsys)
    assert [r["variant"] for r in records] == list(selection_variants.VARIANTS)
    default = records[0]
    for record in records:
        common.validate_record(record, selection_variants.REQUIRED_FIELDS)
        assert record["loss_difference"] <= 1e-5 * abs(default["first_loss"])
        if record["variant"] != "default" and record["same_program"]:
            # `tiny` has no selection GRN, whose layers are all `recompute` stops keeping.
            assert record["median_ratio"] is None
        else:
            assert record["median_ratio"] == pytest.approx(record["median_s"] / default["median_s"])


def test_attention_records_one_per_path_timed_alternately(capsys, monkeypatch):
    # The paths were timed one after the other, so their ratio drifted with the load.
    timed = []

    def alternating(steps, *args, **kwargs):
        timed.append(list(steps))
        return time_alternating(steps, *args, **kwargs)

    time_alternating = common.time_alternating
    monkeypatch.setattr(common, "time_alternating", alternating)
    records = run_json(attention.main, ["--lengths", "8", "--paths", "default,flash"], capsys)
    assert timed == [["default", "flash"]]
    assert [(r["seq_len"], r["path"]) for r in records] == [(8, "default"), (8, "flash")]
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


def test_inference_records_float_and_int8_with_smaller_int8_weights(train_run, capsys):
    batch_size = train_step.CONFIGS["tiny"].batch_size  # the train run's shapes: shared compiles
    argv = ["--config", "tiny", "--batch-sizes", str(batch_size)]
    records = run_json(inference.main, argv, capsys)
    assert [r["kind"] for r in records] == ["float", "int8"]
    for record in records:
        common.validate_record(record, inference.REQUIRED_FIELDS)
        assert record["model_config"] == "tiny" and record["batch_size"] == batch_size
        assert record["samples_per_s"] == pytest.approx(batch_size / record["median_s"])
    float_record, int8_record = records
    assert float_record["speedup_vs_float"] is None
    assert int8_record["speedup_vs_float"] == pytest.approx(
        float_record["median_s"] / int8_record["median_s"]
    )
    assert int8_record["weight_bytes"] < float_record["weight_bytes"]
    # The float weights are the train run's float32 parameters.
    assert float_record["weight_bytes"] == 4 * train_run[0][0]["params"]


@pytest.mark.peers
@pytest.mark.skipif(
    importlib.util.find_spec("pytorch_forecasting") is None, reason="needs the 'peers' extra"
)
def test_peer_records_both_frameworks_and_their_parameter_counts(train_run, capsys, monkeypatch):
    from benchmarks import peer

    # A machine busier than its cores: torch's threads stall far more than XLA's, so the
    # ratio says little about the frameworks, and the record says so.
    monkeypatch.setattr(peer.os, "getloadavg", lambda: (1000.0, 1000.0, 1000.0))
    (record,) = run_json(peer.main, ["--config", "tiny", "--block", "1"], capsys)
    assert record["contended"] is True
    common.validate_record(record, peer.REQUIRED_FIELDS)
    assert record["ours_params"] == train_run[0][0]["params"]
    assert record["theirs_params"] > 0 and record["selection"] == "compact"
    assert record["param_ratio"] == pytest.approx(record["ours_params"] / record["theirs_params"])
    assert record["speedup"] == pytest.approx(record["theirs_median_s"] / record["ours_median_s"])
    # No target is set for `tiny`.
    assert record["target_speedup"] is None and record["meets_target"] is None


def test_each_record_carries_its_own_date(monkeypatch):
    # The date lived in the per-process `environment()`: every record of a long suite
    # carried the suite's start.
    first = common.make_record("x", "tiny")

    class Later(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2031, 1, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(common.datetime, "datetime", Later)
    second = common.make_record("x", "tiny")
    assert second["env"]["date_utc"] == "2031-01-02T03:04:05+00:00"
    assert first["env"]["date_utc"] != second["env"]["date_utc"]
    assert {k: v for k, v in first["env"].items() if k != "date_utc"} == {
        k: v for k, v in second["env"].items() if k != "date_utc"
    }


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


# `--output` is the flag every script shares; the accelerator's own name is `--out`.
@pytest.mark.parametrize("flag", ["--out", "--output"])
def test_accelerator_quick_writes_its_records_to_the_output_file(tmp_path, capsys, flag):
    out = tmp_path / "results" / "accelerator.jsonl"
    argv = ["--quick", "--allow-cpu", "--only", "fake_quant", flag, str(out)]
    records = run_json(accelerator.main, argv, capsys)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == records
    assert records[-1]["config"] == "accelerator" and records[-1]["tasks_run"] == ["fake_quant"]


def test_accelerator_only_takes_task_names_and_parts_and_runs_one_task_per_length():
    quick = accelerator.tasks(2, 1, quick=True)
    chosen = accelerator.select_tasks(quick, "attention, inference-B1,matmul-peak")
    assert [task.name for task in chosen] == [
        "matmul-peak",
        "attention-T16",
        "attention-T32",
        "inference-B1",
    ]
    with pytest.raises(ValueError, match=r"--only must be .*'attention'.*got 'atention'"):
        accelerator.select_tasks(quick, "atention")


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


def test_alternating_timing_takes_exactly_the_steps_asked_for_in_turns():
    calls: list[str] = []
    contenders = {name: (lambda name=name: calls.append(name)) for name in ("a", "b")}
    times = common.time_alternating(contenders, 2, 5, warmup=1, total_steps=7)
    assert [t.summary()["steps"] for t in times.values()] == [7, 7]
    # warm-up once each, then rounds of 5 and a last round cut to 2
    assert calls == ["a", "b", *"aaaaa", *"bbbbb", *"aa", *"bb"]
    with pytest.raises(ValueError, match="total_steps=11 is more than"):
        common.time_alternating(contenders, 2, 5, warmup=0, total_steps=11)


@pytest.mark.parametrize("steps, warmup", [(0, 0), (1, -1)])
def test_step_counts_out_of_range_raise_value_error(steps, warmup):
    with pytest.raises(ValueError):
        common.time_steps(lambda: None, steps, warmup)


@pytest.mark.parametrize(
    ("script", "argv", "flag"),
    [
        ("train_step", ["--steps", "0"], "--steps"),
        ("train_step", ["--warmup", "-1"], "--warmup"),
        ("train_step", ["--config", "weather"], "--config"),
        ("train_step", ["--mode", "int4"], "--mode"),
        ("train_step", ["--batch-size", "0"], "--batch-size"),
        ("inference", ["--batch-sizes", "1,x"], "--batch-sizes"),
        ("peer", ["--block", "0"], "--block"),
        ("attention", ["--lengths", "0"], "--lengths"),
        ("fake_quant", ["--ratio-config", "weather"], "--ratio-config"),
        ("optimizer", ["--optimizer", "sgd"], "--optimizer"),
        ("dropout_keys", ["--variant", "other"], "--variant"),
        ("selection_variants", ["--mode", "float", "--variant", "materialized"], "--mode qat"),
        ("cpu", ["--only", "nothing"], "--only"),
        ("accelerator", ["--budget", "nan", "--allow-cpu", "--quick", "--only", "x"], "--budget"),
        ("quality", ["--cutoffs", "0"], "--cutoffs"),
        ("quality", ["--set", "training.max_step=2"], "--set"),
    ],
)
def test_a_bad_flag_value_is_a_usage_error_naming_the_flag(script, argv, flag, capsys, monkeypatch):
    # Refused while the flags are checked, before any work: exit 2 and one error line.
    module = importlib.import_module(f"benchmarks.{script}")

    def must_not_run(*args, **kwargs):
        raise AssertionError(f"{script} started measuring despite a bad flag")

    monkeypatch.setattr(module, "run", must_not_run, raising=False)  # quality's fit, say
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in error and flag in error


def test_unknown_config_name_raises_value_error_listing_the_choices():
    with pytest.raises(ValueError, match="electricity"):
        train_step.get_config("weather")


# Last in the file: the dropout-keys benchmark calls `jax.clear_caches()` (it retraces
# the step at each inline threshold), which would make every later test here trace its
# model again instead of reusing the traced `tiny` functions of the tests above.
@pytest.mark.usefixtures("library_inline_threshold")
def test_dropout_keys_records_both_variants_with_equal_losses_and_fewer_loops_inline(capsys):
    # `seed` has dropout (`tiny` has none); at the library's threshold (the
    # suite raises it) its small masks too are drawn inline.
    records = run_json(dropout_keys.main, ["--config", "seed"], capsys)
    assert [r["variant"] for r in records] == list(dropout_keys.VARIANTS)
    builtin, inline = records
    for record in records:
        common.validate_record(record, dropout_keys.REQUIRED_FIELDS)
    assert inline["whiles"] < builtin["whiles"] and inline["copies"] < builtin["copies"]
    # The same masks: the same loss up to the order of float32 sums.
    assert inline["loss_difference"] <= 1e-5 * abs(builtin["first_loss"])
    assert inline["median_ratio"] == pytest.approx(inline["median_s"] / builtin["median_s"])


def test_profile_runs_the_warmup_steps_then_profiles_the_timed_ones(capsys, monkeypatch):
    calls = []
    original = train_step.PreparedStep.__call__

    def counted(self):
        calls.append(self)
        return original(self)

    monkeypatch.setattr(train_step.PreparedStep, "__call__", counted)
    argv = ["--config", "tiny", "--top", "3", "--steps", "1", "--warmup", "2", "--json"]
    profile_step.main([*argv, "--compile-cache"])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(calls) == 1 + 2 + 1  # PreparedStep's own first call, the warm-up, the profiled step
    assert 1 <= len(records) <= 3 and all(r["ms_per_step"] >= 0 for r in records)


def test_quality_lines_stay_strict_json_when_a_score_is_not_finite(capsys, monkeypatch):
    from benchmarks import quality

    def run(table, variant, overrides, cutoffs, qat=True):
        # The q-risk of a NaN forecast, and an infinite one, as `run` would report them.
        scores = {"p50": float("nan"), "p90": float("inf")}
        return {"table": table, "validation": {"fp32": scores}, "backtest": {"fp32": scores}}

    monkeypatch.setattr(quality, "run", run)
    assert quality.main(["--tables", "pedestrian"]) == 0
    (line,) = capsys.readouterr().out.splitlines()

    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    record = json.loads(line, parse_constant=refuse)
    assert record["validation"]["fp32"] == {"p50": None, "p90": None}
    assert record["backtest"]["fp32"] == {"p50": None, "p90": None}


def test_train_step_peak_fraction_is_of_the_matmul_peak_in_the_step_dtype(capsys):
    argv = ["--config", "tiny", "--mode", "float", "--dtype", "bfloat16"]
    (record,) = run_json(train_step.main, argv, capsys)
    assert record["dtype"] == "bfloat16" and record["matmul_peak_dtype"] == "bfloat16"
    assert record["peak_fraction"] == pytest.approx(
        record["gflops_per_s"] / record["matmul_peak_gflops"]
    )


def test_accelerator_bfloat16_steps_are_measured_against_the_bfloat16_peak(tmp_path, capsys):
    task = "train_step-tiny-float-bfloat16-B8"
    argv = ["--quick", "--allow-cpu", "--only", f"matmul-peak,{task}"]
    records = run_json(accelerator.main, [*argv, "--out", str(tmp_path / "a.jsonl")], capsys)
    peaks = {r["config"]: r for r in records if r["benchmark"] == "matmul_peak"}
    steps = [r for r in records if r["benchmark"] == "train_step"]
    assert steps
    for step in steps:
        assert step["dtype"] == step["matmul_peak_dtype"] == "bfloat16"
        assert step["matmul_peak_gflops"] == peaks["bfloat16"]["matmul_peak_gflops"]
        assert step["peak_fraction"] == pytest.approx(
            step["gflops_per_s"] / peaks["bfloat16"]["matmul_peak_gflops"]
        )
