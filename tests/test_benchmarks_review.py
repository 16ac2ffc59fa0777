"""Review pass on the benchmark scripts: each test fails on the code before its fix.

* a `--output` that cannot be written is refused before anything is measured,
  and a failed write never swallows the printed results;
* the attention records say which kernel ran (cuDNN's fused one or XLA's), and
  a GPU `flash` path without cuDNN is announced, not passed off as cuDNN;
* the peer's first (untimed) step is taken when it is built, as ours is;
* `--devices` that the machine or the batch cannot honour is a usage error.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from benchmarks import attention, common, fake_quant, train_step

FAST = ["--json", "--steps", "1", "--warmup", "0", "--compile-cache"]


def _never(*args, **kwargs):
    raise AssertionError("the benchmark started measuring despite a bad flag")


# ---------------------------------------------------------------------------
# --output


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


# ---------------------------------------------------------------------------
# attention kernel


def test_attention_kernel_is_read_from_the_compiled_module():
    cudnn = 'custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax"'
    assert attention.attention_kernel(cudnn) == "cudnn"
    assert attention.attention_kernel("%dot = f32[2,2] dot(%a, %b)") == "xla"


def test_a_gpu_flash_path_without_cudnn_is_announced():
    assert "not cuDNN" in attention.announce_kernel("flash", "xla", "gpu", 64)
    assert attention.announce_kernel("flash", "cudnn", "gpu", 64) is None
    assert attention.announce_kernel("default", "xla", "gpu", 64) is None
    assert attention.announce_kernel("flash", "xla", "cpu", 64) is None


def test_attention_records_say_which_kernel_ran(capsys):
    argv = ["--lengths", "8", "--hidden-dim", "8", "--heads", "2", *FAST]
    attention.main(argv)
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert [r["path"] for r in records] == list(attention.PATHS)
    for record in records:
        common.validate_record(record, attention.REQUIRED_FIELDS)
        # jax.nn.dot_product_attention picks XLA unless asked for cuDNN; no cuDNN on CPU.
        assert record["kernel"] == "xla"


# ---------------------------------------------------------------------------
# peer


@pytest.mark.peers
@pytest.mark.skipif(
    importlib.util.find_spec("pytorch_forecasting") is None, reason="needs the 'peers' extra"
)
def test_peer_takes_its_first_step_untimed_when_built():
    from benchmarks import peer

    step = peer.PeerStep(train_step.get_config("tiny"))
    # Adam's state exists only after a step: the first call is not left to the timed ones.
    assert len(step.optimizer.state) > 0
    assert step.first_call_s > 0.0


# ---------------------------------------------------------------------------
# --devices


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
