"""The flash path's kernel choice: cuDNN exactly where it applies, XLA's elsewhere, same function.

The GPU test runs where a CUDA GPU is the default device (skipped elsewhere):
it checks in the compiled program that cuDNN's fused kernel runs, and its
outputs and gradients against the explicit kernel in float32.
"""

from __future__ import annotations

import math
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from benchmarks.attention import attention_kernel
from tft_jax import TemporalSelfAttention
from tft_jax import fused_attention as fused

HOPPER = types.SimpleNamespace(platform="gpu", compute_capability="9.0")
OK = dict(dtype=jnp.bfloat16, head_dim=32, scale=0.25, masked=False, steps=7)


def test_cudnn_applies_inside_its_envelope():
    assert fused.cudnn_unsupported_reason(HOPPER, **OK) is None
    assert fused.cudnn_unsupported_reason(HOPPER, **{**OK, "dtype": jnp.float16}) is None
    assert fused.cudnn_unsupported_reason(HOPPER, **{**OK, "masked": True, "steps": 8}) is None
    assert fused.cudnn_unsupported_reason(HOPPER, **{**OK, "head_dim": 128}) is None


@pytest.mark.parametrize(
    "device, change, reason",
    [
        (types.SimpleNamespace(platform="cpu"), {}, "not a CUDA GPU (cpu)"),
        (types.SimpleNamespace(platform="gpu", compute_capability="gfx90a"), {}, "not a CUDA"),
        (types.SimpleNamespace(platform="gpu", compute_capability="7.5"), {}, "7.5 is below 8.0"),
        (HOPPER, {"dtype": jnp.float32}, "dtype float32"),
        (HOPPER, {"head_dim": 12}, "head_dim 12"),
        (HOPPER, {"head_dim": 136}, "head_dim 136"),
        (HOPPER, {"scale": None}, "temperature is traced"),
        (HOPPER, {"masked": True}, "odd number of steps (7)"),
    ],
)
def test_cudnn_is_refused_outside_its_envelope_with_the_reason(device, change, reason):
    assert reason in fused.cudnn_unsupported_reason(device, **{**OK, **change})


def test_the_scale_is_concrete_only_for_a_concrete_temperature():
    assert fused.concrete_scale(16, 2.0) == 1.0 / (4.0 * 2.0)
    assert fused.concrete_scale(16, jnp.float32(0.5)) == 1.0 / (4.0 * 0.5)
    seen = []
    jax.jit(lambda t: seen.append(fused.concrete_scale(16, t)) or t)(1.0)
    assert seen == [None]


def test_the_default_device_honours_jax_default_device():
    assert fused.default_device() == jax.devices()[0]
    last = jax.devices()[-1]
    with jax.default_device(last):
        assert fused.default_device() == last
    with jax.default_device("cpu"):
        assert fused.default_device().platform == "cpu"


def test_xla_runs_off_a_cuda_gpu():
    if jax.default_backend() == "gpu":
        pytest.skip("this host's default device is a GPU")
    assert fused.flash_implementation(jnp.bfloat16, 32, 0.25, False, 8) is None


def test_a_refusal_by_cudnn_warns_and_computes_the_same_function():
    if jax.default_backend() == "gpu":
        pytest.skip("cuDNN may accept these operands here")
    q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 8, 2, 8))
    with pytest.warns(RuntimeWarning, match="cuDNN's fused attention refused"):
        y = fused.dot_product_attention(q, k, v, scale=0.3, implementation="cudnn", is_causal=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        expected = fused.dot_product_attention(
            q, k, v, scale=0.3, implementation=None, is_causal=True
        )
    np.testing.assert_array_equal(y, expected)


def _loss_and_grads(block, params, x, mask):
    # A fixed random readout: the block ends in a LayerNorm, so a loss such as
    # mean(y ** 2) would be constant in x and its gradient zero.
    readout = jax.random.normal(jax.random.key(2), x.shape)

    def loss(p, x):
        return jnp.mean(block.apply(p, x, causal=True, mask=mask).astype(jnp.float32) * readout)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal+mask"])
def test_gpu_flash_path_runs_cudnn_and_matches_the_explicit_kernel(masked):
    if fused.flash_implementation(jnp.bfloat16, 32, 0.25, masked, 64) != "cudnn":
        pytest.skip("cuDNN's fused attention does not apply on this host's default device")
    batch, steps, hidden, heads = 4, 64, 128, 4
    x = jax.random.normal(jax.random.key(1), (batch, steps, hidden))
    mask = None
    if masked:
        mask = jnp.arange(steps)[None, :] < jnp.array([[64], [50], [33], [64]])
    flash = TemporalSelfAttention(hidden, heads, use_flash_attention=True, dtype=jnp.bfloat16)
    explicit = TemporalSelfAttention(hidden, heads)
    params = explicit.init(jax.random.key(0), x)

    step = _loss_and_grads(flash, params, x, mask)
    assert attention_kernel(step.lower(params, x).compile().as_text()) == "cudnn"
    with jax.default_matmul_precision("highest"):
        ref_loss, (ref_params, ref_x) = _loss_and_grads(explicit, params, x, mask)(params, x)
    loss, (grad_params, grad_x) = step(params, x)
    valid = np.ones((batch, steps), bool) if mask is None else np.asarray(mask)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=2e-2)
    # bfloat16 keeps 8 bits: gradients agree to a few percent of their scale.
    # The key bias adds q . b to every score of a query's row, which the softmax
    # ignores: its gradient is zero in exact arithmetic, so its bfloat16 roundoff
    # is measured against the scale of the key kernel's gradient.
    scale = {
        name: float(jnp.max(jnp.abs(leaf)))
        for name, leaf in traverse_util.flatten_dict(ref_params, sep="/").items()
    }
    assert scale["params/key/bias"] <= 1e-4 * scale["params/key/kernel"]
    scale["params/key/bias"] = scale["params/key/kernel"]
    got_flat = traverse_util.flatten_dict(grad_params, sep="/")
    for name, want in traverse_util.flatten_dict(ref_params, sep="/").items():
        np.testing.assert_allclose(
            np.asarray(got_flat[name], np.float32),
            want,
            atol=3e-2 * scale[name] + 1e-6,
            err_msg=name,
        )
    got_x = np.asarray(grad_x, np.float32)[valid]
    want_x = np.asarray(ref_x)[valid]
    np.testing.assert_allclose(got_x, want_x, atol=3e-2 * float(np.abs(want_x).max()))
    assert math.isfinite(float(loss))
