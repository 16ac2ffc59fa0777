"""Benchmark flags the file system or machine cannot honour are usage errors before measuring.

An `--output` that cannot be written and `--devices` beyond the visible devices
(or not dividing the batch) are refused naming the flag; a failed write never
swallows the printed records.
"""

from __future__ import annotations

import json
import math
import tempfile
import types

import jax
import jax.numpy as jnp
import pytest

from benchmarks import (
    accelerator,
    attention,
    common,
    cpu,
    data_pipeline,
    device_check,
    fake_quant,
    inference,
    peer,
    profile_step,
    quality,
    train_step,
)

# One timed call, no warm-up, and the test session's compilation cache (tests/conftest.py).
FAST = ["--json", "--steps", "1", "--warmup", "0", "--compile-cache"]


def _never(*args, **kwargs):
    raise AssertionError("the benchmark started measuring despite a bad flag")


def test_output_path_checks_name_the_flag(tmp_path):
    common.check_output_path(None)
    common.check_output_path(str(tmp_path / "new.jsonl"))  # a new file in an existing directory
    with pytest.raises(ValueError, match=r"--output.*does not exist"):
        common.check_output_path(str(tmp_path / "missing" / "x.jsonl"))
    with pytest.raises(ValueError, match="--output must name a file"):
        common.check_output_path(str(tmp_path))
    assert not (tmp_path / "new.jsonl").exists()  # nothing is created


def test_unwritable_output_is_a_usage_error_before_any_measurement(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fake_quant, "run", _never)
    monkeypatch.setattr(common, "matmul_peak_gflops", _never)
    argv = ["--sizes", "8", "--ratio-config", "none", "--output", str(tmp_path / "no" / "x.jsonl")]
    with pytest.raises(SystemExit) as exit_info:
        fake_quant.main(argv)
    assert exit_info.value.code == 2
    assert "--output" in capsys.readouterr().err


def test_emit_prints_the_records_even_when_the_output_cannot_be_written(tmp_path, capsys):
    record = {"benchmark": "x", "config": "c", "median_s": 0.5}
    with pytest.raises(OSError):
        common.emit([record], [], True, str(tmp_path / "gone" / "x.jsonl"))
    assert json.loads(capsys.readouterr().out) == record


def test_more_devices_than_visible_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(common, "matmul_peak_gflops", _never)
    monkeypatch.setattr(train_step, "bench_modes", _never)
    with pytest.raises(SystemExit) as exit_info:
        train_step.main(["--config", "tiny", "--mode", "float", "--devices", "64", *FAST])
    assert exit_info.value.code == 2
    assert "--devices 64" in capsys.readouterr().err


def test_devices_that_do_not_divide_the_batch_are_refused(monkeypatch):
    monkeypatch.setattr(train_step.jax, "device_count", lambda: 2)
    train_step.check_devices(2, [train_step.get_config("tiny", batch_size=4)])
    with pytest.raises(ValueError, match="--devices 2 does not divide the batch size 3"):
        train_step.check_devices(2, [train_step.get_config("tiny", batch_size=3)])


def test_an_empty_output_and_a_name_given_twice_are_refused():
    # `--out ''` wrote nothing and said "wrote 3 records to "; `--mode float,float`
    # measured the second from JAX's caches and recorded a compile of ~0 s.
    with pytest.raises(ValueError, match="--output is empty"):
        common.check_output_path("")
    with pytest.raises(ValueError, match="--mode names float more than once"):
        common.split_names("float,qat,float", ["float", "qat"], "--mode")
    assert common.split_names("float, qat", ["float", "qat"], "--mode") == ["float", "qat"]


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        (cpu, ["--only", ""]),
        (accelerator, ["--allow-cpu", "--quick", "--only", ""]),
        (device_check, ["--out", "OUT", "--allow-cpu", "--only", ""]),
    ],
    ids=["cpu", "accelerator", "device_check"],
)
def test_an_empty_only_is_a_usage_error_not_every_task(module, argv, tmp_path, capsys, monkeypatch):
    # `if args.only:` read '' as not given: every task (or stage) ran.
    monkeypatch.setattr(common, "run_suite", _never)
    monkeypatch.setattr(device_check, "run_stage", _never)
    argv = [str(tmp_path / "out") if arg == "OUT" else arg for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    assert "--only must be a comma-separated subset" in capsys.readouterr().err


def test_device_check_keeps_its_budget_and_refuses_a_cpu(tmp_path, capsys, monkeypatch):
    # The stages' boxes summed past the budget (`--budget 1` could run 385 s), and on a
    # CPU the test stages ran before the accelerator stage failed.
    monkeypatch.setattr(device_check, "run_stage", _never)
    needed = sum(device_check.STAGE_LIMITS_S.values()) + 75
    with pytest.raises(ValueError, match=rf"--budget must be at least {needed:.0f} s"):
        device_check.stages(tmp_path, 120)
    boxes = [box for *_, box in device_check.stages(tmp_path, 480, ("environment", "accelerator"))]
    assert sum(boxes) <= 480
    monkeypatch.setattr(device_check, "default_backend", lambda: "cpu")
    with pytest.raises(SystemExit) as exit_info:
        device_check.main(["--out", str(tmp_path / "out"), "--only", "device_tests"])
    assert exit_info.value.code == 2
    assert "default backend here is 'cpu'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_quality_checks_its_json_path_and_settings_before_fitting(tmp_path, capsys, monkeypatch):
    # A missing --json folder failed after the first table's fit; a bad --set value
    # failed with a traceback from inside the run.
    monkeypatch.setattr(quality, "run", _never)
    for argv, shown in [
        (["--json", str(tmp_path / "missing" / "q.jsonl")], "--json: the directory"),
        (["--set", "training.max_steps=abc"], "--set training.max_steps=abc: TrainingConfig"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            quality.main(["--tables", "tourism", *argv])
        assert exit_info.value.code == 2
        assert shown in capsys.readouterr().err


def test_peer_and_attention_refuse_what_they_cannot_build_before_measuring(capsys, monkeypatch):
    # peer compiled our batch-1024 step, then its own constructor refused the config;
    # attention's head count failed in the model with a traceback.
    monkeypatch.setattr(peer, "bench", _never)
    monkeypatch.setattr(attention, "run", _never)
    for module, argv, shown in [
        (peer, ["--config", "seed,electricity-nvidia"], "--config must be a comma-separated"),
        (attention, ["--lengths", "8", "--heads", "3"], "must be divisible by --heads (3)"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            module.main(argv)
        assert exit_info.value.code == 2
        assert shown in capsys.readouterr().err
    assert "electricity-nvidia" not in peer.PEER_CONFIGS and "electricity" in peer.PEER_CONFIGS


def test_fake_quant_baseline_moves_as_many_bytes_as_the_quantizer():
    # The baseline's gradient `g * c` did not read x: a third less memory than the
    # straight-through gradient, so the overhead ratio was overstated.
    x = jnp.linspace(-1.0, 1.0, 1024)
    quantized, baseline = fake_quant._functions("forward+backward")
    moved = [
        common._first_analysis(fn.lower(x, x).compile().cost_analysis())["bytes accessed"]
        for fn in (quantized, baseline)
    ]
    # Reads of x and g, writes of the forward's output and the gradient (XLA's two
    # kernels each read x: 5 arrays, for both).
    assert moved[0] == moved[1] >= 4 * x.nbytes


def test_profile_leaves_out_the_events_of_instructions_that_run_others():
    # A conditional's event (`cond.9`) spans its branch's operations, which have their own
    # events: both were counted.
    def stepped(flag, x):
        y, _ = jax.lax.scan(lambda c, _: (c * 2.0, None), x, None, length=3)
        return jax.lax.cond(flag, lambda v: v + 1.0, lambda v: v - 1.0, y)

    text = jax.jit(stepped).lower(True, jnp.ones(3)).compile().as_text()
    containers = profile_step.container_instructions(text)
    assert any(name.startswith("cond") for name in containers)
    assert any(name.startswith("while") for name in containers)
    conditional = next(name for name in containers if name.startswith("cond"))
    trace = {
        "traceEvents": [
            {"ph": "X", "name": conditional, "dur": 19.0},
            {"ph": "X", "name": "add.3", "dur": 11.9},
            {"ph": "X", "name": "AllocateOutputBuffersWithInputReuse", "dur": 2.0},
        ]
    }
    assert profile_step.op_durations(trace, containers) == {"add.3": 11.9}


@pytest.mark.parametrize(
    ("module", "argv", "shown"),
    [
        (
            inference,
            ["--config", "tiny", "--batch-sizes", "1,256,1"],
            "--batch-sizes names 1 more than once, got '1,256,1'",
        ),
        (attention, ["--lengths", "32,32"], "--lengths names 32 more than once, got '32,32'"),
        (
            fake_quant,
            ["--sizes", "1000,1000", "--ratio-config", "none"],
            "--sizes names 1000 more than once, got '1000,1000'",
        ),
    ],
    ids=["inference", "attention", "fake_quant"],
)
def test_a_number_given_twice_is_a_usage_error(module, argv, shown, capsys, monkeypatch):
    # `--batch-sizes 1,1` measured twice and paired the first int8 run with the second
    # float run; `--lengths 32,32` and `--sizes 1000,1000` printed duplicate rows.
    monkeypatch.setattr(module, "run", _never)
    monkeypatch.setattr(common, "matmul_peak_gflops", _never)
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: {shown}")


def test_positive_int_lists_keep_their_order_and_refuse_what_is_not_one():
    assert common.split_positive_ints(" 256, 1,", "--batch-sizes") == [256, 1]
    with pytest.raises(ValueError, match=r"--lengths names 8, 16 more than once"):
        common.split_positive_ints("16,8,16,8", "--lengths")
    with pytest.raises(ValueError, match="--sizes must be positive ints"):
        common.split_positive_ints("4,0", "--sizes")
    with pytest.raises(ValueError, match="--sizes must be comma-separated ints"):
        common.split_positive_ints("4,x", "--sizes")


def test_each_int8_speedup_is_against_the_float_run_timed_with_it(monkeypatch):
    # `add_int8_speedups` over all records keyed by (config, batch): with a batch size
    # twice, the first int8 record was divided by the second float run's median.
    medians = iter([(4.0, 2.0), (9.0, 3.0)])

    def bench(config, kinds, steps, warmup):
        float_median, int8_median = next(medians)
        return [
            {"model_config": "tiny", "batch_size": 1, "kind": kind, "median_s": median}
            for kind, median in (("float", float_median), ("int8", int8_median))
        ]

    monkeypatch.setattr(inference, "bench", bench)
    records = inference.run(["tiny"], [1, 1], inference.KINDS, 1, 0)
    assert [r["speedup_vs_float"] for r in records] == [None, 2.0, None, 3.0]


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["--tables", "pedestrian", "tourism", "pedestrian"], "--tables names pedestrian "),
        (["--variants", "default", "default"], "--variants names default "),
        (
            ["--set", "training.max_steps=2", "model.hidden_dim=8", "training.max_steps=3"],
            "--set names training.max_steps ",
        ),
    ],
    ids=["tables", "variants", "set"],
)
def test_quality_refuses_a_run_or_setting_given_twice(argv, shown, capsys, monkeypatch):
    # Repeated tables or variants fitted the same model again; a repeated --set key
    # silently kept the last value.
    monkeypatch.setattr(quality, "run", _never)
    with pytest.raises(SystemExit) as exit_info:
        quality.main(["--tables", "pedestrian", *argv])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{shown}more than once" in error


def test_quality_qat_settings_with_no_qat_are_a_usage_error(capsys, monkeypatch):
    # `--set qat.steps=5 --no-qat` failed with "replace() should be called on dataclass
    # instances"; with QAT on, the same setting reaches the run.
    monkeypatch.setattr(quality, "run", _never)
    with pytest.raises(SystemExit) as exit_info:
        quality.main(["--tables", "pedestrian", "--set", "qat.steps=5", "--no-qat"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith("--set qat.steps=5: qat.steps has no effect with --no-qat")
    assert quality.configured("pedestrian", "default", {"qat.steps": 5}).qat.steps == 5


def test_quality_refuses_a_set_of_the_field_a_variant_measures(capsys, monkeypatch):
    # `--variants window_normalization --set data.window_normalization=false` ran the
    # default settings under the variant's name.
    monkeypatch.setattr(quality, "run", _never)
    with pytest.raises(SystemExit) as exit_info:
        quality.main(
            ["--tables", "pedestrian", "--variants", "window_normalization",
             "--set", "data.window_normalization=false"]
        )  # fmt: skip
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(
        "data.window_normalization is what the variant 'window_normalization' sets"
    )
    config = quality.configured("pedestrian", "default", {"data.window_normalization": True})
    assert config.data.window_normalization is True


def _quality_record(table, variant, overrides, cutoffs, qat=True):
    return {"table": table, "variant": variant}


@pytest.mark.parametrize("flag", ["--output", "--json"])
def test_quality_appends_to_output_and_keeps_json_file_as_its_alias(
    flag, tmp_path, capsys, monkeypatch
):
    # The other benchmarks spell the file `--output FILE`; quality's `--json FILE` still works.
    monkeypatch.setattr(quality, "run", _quality_record)
    out = tmp_path / "q.jsonl"
    out.write_text('{"earlier": 1}\n')
    assert quality.main(["--tables", "pedestrian", "tourism", flag, str(out)]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["table"] for r in printed] == ["pedestrian", "tourism"]
    assert [json.loads(line) for line in out.read_text().splitlines()] == [{"earlier": 1}, *printed]


def test_quality_bare_json_prints_the_same_lines_and_two_files_are_refused(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(quality, "run", _quality_record)
    assert quality.main(["--tables", "pedestrian", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"table": "pedestrian", "variant": "default"}
    argv = ["--json", str(tmp_path / "a.jsonl"), "--output", str(tmp_path / "b.jsonl")]
    monkeypatch.setattr(quality, "run", _never)
    with pytest.raises(SystemExit) as exit_info:
        quality.main(["--tables", "pedestrian", *argv])
    assert exit_info.value.code == 2
    assert "both name the output file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


class _MatmulStep:
    """A stand-in for `train_step.PreparedStep`: a small jitted matmul, no model to compile."""

    def __init__(self, config, mode):
        self.x = jnp.ones((64, 64))
        self.function = jax.jit(lambda x: jnp.tanh(x @ x))
        self.compile = types.SimpleNamespace(compiled=self.function.lower(self.x).compile())

    def __call__(self):
        return jax.block_until_ready(self.function(self.x))


def test_profile_removes_its_temporary_trace_and_keeps_one_asked_for(tmp_path, capsys, monkeypatch):
    # Without --trace-dir every run left a /tmp/tft-profile-XXXX folder behind.
    monkeypatch.setattr(train_step, "PreparedStep", _MatmulStep)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    argv = ["--config", "tiny", "--json", "--steps", "1", "--warmup", "0", "--compile-cache"]
    dropped = profile_step.main(argv)
    assert list(temporary.iterdir()) == []
    kept = tmp_path / "trace"
    records = profile_step.main([*argv, "--trace-dir", str(kept)])
    assert list(kept.rglob("perfetto_trace.json.gz"))
    assert dropped and records
    assert {r["trace_dir"] for r in dropped} == {None}
    assert {r["trace_dir"] for r in records} == {str(kept)}
    for record in records:
        assert record["benchmark"] == "profile_step"
        assert 0.0 <= record["unattributed_share"] <= 1.0
        assert record["unattributed_share"] == records[0]["unattributed_share"]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["trace_dir"] for r in printed] == [
        *(None for _ in dropped),
        *(str(kept) for _ in records),
    ]


def test_accelerator_names_a_bad_only_before_looking_for_a_gpu(tmp_path, capsys, monkeypatch):
    # On a CPU, `--only nope` said "found no GPU/TPU" (exit 1) and never named the flag.
    monkeypatch.setattr(accelerator.jax, "default_backend", lambda: "cpu")
    monkeypatch.setattr(common, "run_suite", _never)
    out = tmp_path / "results" / "a.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        accelerator.main(["--only", "nope", "--out", str(out)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--only must be a comma-separated subset" in error and "'nope'" in error
    assert not out.parent.exists()


@pytest.mark.parametrize("module", [accelerator, device_check], ids=["accelerator", "device_check"])
@pytest.mark.parametrize("budget", ["inf", "nan", "-inf", "1e400", "0"])
def test_a_budget_that_is_not_finite_and_positive_is_refused_naming_it(
    module, budget, tmp_path, capsys, monkeypatch
):
    # `--budget inf` passed the `> 0` check, ran every task, then lost the summary
    # record to `json.dumps(allow_nan=False)` (device_check wrote `Infinity`).
    monkeypatch.setattr(common, "run_suite", _never)
    monkeypatch.setattr(device_check, "run_stage", _never)
    argv = ["--allow-cpu", f"--budget={budget}", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        module.main([*argv, "--only", "peak" if module is accelerator else "environment"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument --budget: must be a finite number of seconds > 0, got {budget!r}" in error
    assert not (tmp_path / "out").exists()


def test_device_check_refuses_an_empty_out_instead_of_writing_here(tmp_path, capsys, monkeypatch):
    # `Path("")` is ".": the logs and device_check.jsonl landed in the current directory.
    monkeypatch.setattr(device_check, "run_stage", _never)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        device_check.main(["--out", "", "--only", "environment"])
    assert exit_info.value.code == 2
    assert "--out is empty: give a folder name" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_device_check_writes_strict_json_or_nothing(tmp_path, monkeypatch):
    # Plain `json.dumps` wrote `"limit_s": Infinity`, which strict JSON parsers refuse.
    def stage(name, command, limit_s, out):
        return {"stage": name, "returncode": 0, "timed_out": False, "limit_s": math.inf}

    monkeypatch.setattr(device_check, "run_stage", stage)
    with pytest.raises(ValueError, match="not JSON compliant"):
        device_check.main(["--out", str(tmp_path), "--only", "environment"])
    assert not (tmp_path / "device_check.jsonl").exists()


def _first_call_setups(monkeypatch, calls):
    """`{module: (bench call, step functions)}` with the compile, records and functions stubbed."""

    def step(*args, **kwargs):
        calls.append(None)
        return 0

    compiled = common.CompileResult(None, 0.0, 0.0)
    monkeypatch.setattr(common, "compile_timed", lambda *args, **kwargs: compiled)
    monkeypatch.setattr(inference, "prepare", lambda *args: inference.Prepared(step, (), 0))
    monkeypatch.setattr(inference, "_record", lambda *args: {})
    monkeypatch.setattr(attention, "_prepare", lambda *a: attention._PreparedPath(step, 0, {}, 0))
    monkeypatch.setattr(attention, "_record", lambda *args: {})
    monkeypatch.setattr(fake_quant, "_functions", lambda direction: (step, step))
    monkeypatch.setattr(common, "make_record", lambda benchmark, config, **fields: fields)
    return {
        "inference": (lambda: inference.bench(train_step.get_config("tiny"), ["float"], 1, 0), 1),
        "attention": (lambda: attention.bench(8, ["default"], 1, 0), 1),
        "fake_quant": (lambda: fake_quant.bench_throughput(8, "forward", 1, 0), 2),
    }


@pytest.mark.parametrize("name", ["inference", "attention", "fake_quant"])
def test_the_first_call_after_compiling_is_never_timed(name, monkeypatch):
    # With `--warmup 0` the first call after the ahead-of-time compile was a timed one
    # (27-60 ms against 0.5 ms), as it never is in the train-step benchmarks.
    calls: list[None] = []
    before_timing = []

    def timed(steps, *args, **kwargs):
        before_timing.append(len(calls))
        return {key: common.StepTimes((1.0,), warmup=0) for key in steps}

    monkeypatch.setattr(common, "time_alternating", timed)
    monkeypatch.setattr(common, "time_in_blocks", timed)
    run, functions = _first_call_setups(monkeypatch, calls)[name]
    run()
    assert before_timing == [functions]


@pytest.mark.parametrize("module", [inference, attention, fake_quant, train_step])
def test_the_warmup_help_says_one_untimed_call_always_comes_first(module, capsys):
    with pytest.raises(SystemExit):
        module.main(["--help"])
    assert "one untimed first call that always precedes them" in " ".join(
        capsys.readouterr().out.split()
    )


def test_compile_cache_help_claims_no_compile_times_where_none_are_reported(capsys, monkeypatch):
    # Both said "compile times then measure cache loads"; neither reports a compile time.
    monkeypatch.setattr(profile_step, "enable_op_events", lambda: None)
    for module in (data_pipeline, profile_step):
        with pytest.raises(SystemExit):
            module.main(["--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--compile-cache" in text and "no compile time is reported" in text
        assert "measure cache loads" not in text


def test_a_train_step_record_without_a_measured_peak_holds_the_peak_as_null():
    # A suite run without its peak task left `matmul_peak_gflops` out, a required field.
    prepared = types.SimpleNamespace(
        config=train_step.get_config("tiny"),
        mode="float",
        devices=1,
        compiler_options=None,
        params=10,
        compile=common.CompileResult(None, 0.1, 0.2),
        first_call_s=0.01,
        flop_count=lambda: common.FlopCount(1e6, 1e6),
    )
    for peak in ({}, None):
        record = train_step.measure(prepared, common.StepTimes((0.5,), warmup=0), peak)
        assert record["matmul_peak_gflops"] is None and record["peak_fraction"] is None
        common.validate_record(record, train_step.REQUIRED_FIELDS)


def test_the_quick_accelerator_set_names_each_task_once():
    # Its last task (the `traffic` stand-in) was the headline task again: a second
    # record of the same program, with a compile of ~0 s from JAX's in-memory cache.
    names = [task.name for task in accelerator.tasks(1, 0, quick=True)]
    assert len(names) == len(set(names))
