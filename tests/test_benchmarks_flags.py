"""Benchmark flags the file system or machine cannot honour are usage errors before measuring.

An `--output` that cannot be written and `--devices` beyond the visible devices
(or not dividing the batch) are refused naming the flag; a failed write never
swallows the printed records.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import common, fake_quant, train_step

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
