"""`benchmarks.attention` says which attention kernel ran: cuDNN's fused one or XLA's.

The kernel is read from the compiled module, and a GPU `flash` path that did
not get cuDNN is announced rather than passed off as cuDNN.
"""

from __future__ import annotations

import json

from benchmarks import attention, common

# One timed call, no warm-up, and the test session's compilation cache (tests/conftest.py).
FAST = ["--json", "--steps", "1", "--warmup", "0", "--compile-cache"]


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
