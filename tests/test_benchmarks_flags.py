"""Benchmark flags the file system or machine cannot honour are usage errors before measuring.

An `--output` that cannot be written and `--devices` beyond the visible devices
(or not dividing the batch) are refused naming the flag; a failed write never
swallows the printed records.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from benchmarks import (
    accelerator,
    attention,
    common,
    cpu,
    device_check,
    fake_quant,
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
    assert moved[0] == moved[1] == 3 * x.nbytes


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
