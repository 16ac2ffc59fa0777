"""`qat.division`: float32 quotients with NumPy's (IEEE) bits, whatever XLA does to a division."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from qat import division, observers

TINY = np.finfo(np.float32).tiny


def random_floats(size: int, seed: int) -> np.ndarray:
    """float32 values from uniformly random bit patterns: every sign, exponent and special."""
    bits = np.random.default_rng(seed).integers(0, 2**32, size, dtype=np.int64)
    return bits.astype(np.uint32).view(np.float32)


def normal(values: np.ndarray) -> np.ndarray:
    return np.isfinite(values) & (np.abs(values) >= TINY)


def same_bits(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    return (actual.view(np.uint32) == expected.view(np.uint32)) | (
        np.isnan(actual) & np.isnan(expected)
    )


def test_integer_divide_gives_numpy_bits_for_every_normal_quotient():
    a = random_floats(400_000, seed=0)
    # Random divisors, and divisors near a (quotients near 1, where rounding is tightest).
    with np.errstate(all="ignore"):
        near = a * np.float32(1.0009765625)
    for b in (random_floats(a.size, seed=1), near):
        with np.errstate(all="ignore"):
            expected = a / b
        actual = np.asarray(jax.jit(division.integer_divide)(a, b))
        exact = normal(a) & normal(b) & normal(expected)
        assert exact.mean() > 0.5
        wrong = exact & ~same_bits(actual, expected)
        assert not wrong.any(), (a[wrong][:3], b[wrong][:3], actual[wrong][:3])


def test_reciprocal_of_every_significand_of_one_binade_has_numpy_bits():
    mantissas = np.arange(0, 2**23, 7, dtype=np.uint32)
    scales = ((np.uint32(127 + 3) << 23) | mantissas).view(np.float32)  # [8, 16)
    actual = np.asarray(jax.jit(division.reciprocal)(scales))
    np.testing.assert_array_equal(actual.view(np.uint32), (np.float32(1) / scales).view(np.uint32))


@pytest.mark.parametrize("offset", [-100, -3, -1, 1, 3, 100])
def test_rounded_quotient_recovers_from_an_estimate_off_by_up_to_100(offset):
    # A GPU's approximate division gives an estimate a few units off; the remainder corrects it.
    rng = np.random.default_rng(offset + 200)
    dividend = rng.integers(2**23, 2**24, 50_000)
    divisor = rng.integers(2**23, 2**24, dividend.size)
    shift = np.where(dividend < divisor, 24, 23)
    numerator = dividend.astype(object) << shift.astype(object)
    floor = np.array(numerator // divisor.astype(object), dtype=np.int64)
    remainder = np.array(numerator - floor * divisor.astype(object), dtype=np.int64)
    half_even_up = (2 * remainder > divisor) | ((2 * remainder == divisor) & (floor % 2 == 1))
    expected = floor + half_even_up
    actual = division.rounded_quotient(
        jnp.asarray(dividend, jnp.int32),
        jnp.asarray(shift, jnp.int32),
        jnp.asarray(divisor, jnp.int32),
        jnp.asarray(floor + offset, jnp.int32),
    )
    np.testing.assert_array_equal(np.asarray(actual), expected)


def test_divide_by_a_constant_or_a_broadcast_divisor_under_jit_keeps_numpy_bits():
    # XLA rewrites both divisions into a multiplication by the reciprocal: on CPU that
    # changed the last bit of about 70% (constant 255) and 26% (broadcast) of these quotients.
    rng = np.random.default_rng(3)
    a = rng.uniform(0.0, 100.0, (512, 64)).astype(np.float32)
    b = rng.uniform(0.5, 3.0, (1, 64)).astype(np.float32)
    by_constant = np.asarray(jax.jit(lambda a: division.divide(a, 255.0))(a))
    expected = (a / np.float32(255)).view(np.uint32)
    np.testing.assert_array_equal(by_constant.view(np.uint32), expected)
    by_broadcast = np.asarray(jax.jit(division.divide)(a, b))
    np.testing.assert_array_equal(by_broadcast.view(np.uint32), (a / b).view(np.uint32))
    eager = np.asarray(division.divide(a, b))
    np.testing.assert_array_equal(eager.view(np.uint32), (a / b).view(np.uint32))


def test_zeros_infinities_nans_and_subnormals_get_the_backends_division():
    values = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3.0, -2.5], np.float32)
    a, b = np.meshgrid(values, values)
    actual = np.asarray(jax.jit(division.integer_divide)(a, b))
    backend = np.asarray(jax.jit(lambda a, b: a / b)(a, b))
    exact = normal(a) & normal(b)
    assert same_bits(actual, backend)[~exact].all()
    with np.errstate(all="ignore"):
        assert same_bits(actual, a / b)[exact].all()


def test_a_subnormal_dividend_with_a_normal_quotient_is_not_read_as_a_normal_number():
    # A subnormal has no implicit bit: read as a normal number, 1e-40 / 1e-30 came out
    # about 1.7e-8 instead of 1e-10. Whatever the backend does with subnormals (divide or
    # flush them to zero), the quotient is NumPy's correctly rounded one or a zero.
    a = np.float32([1e-40, -3e-39, 5e-45, 1e-40])
    b = np.float32([1e-30, 2e-35, 1e-37, -2e-38])  # normal divisors
    actual = np.asarray(jax.jit(division.integer_divide)(a, b))
    exact = a / b
    assert np.all(np.isfinite(exact)) and np.all(np.abs(exact) >= np.finfo(np.float32).tiny)
    assert np.all(same_bits(actual, exact) | (actual == 0.0)), (actual, exact)


def test_signs_dtypes_and_shapes():
    assert float(division.divide(-3.0, 7.0)) == float(np.float32(-3) / np.float32(7))
    assert float(division.divide(3.0, -7.0)) == float(np.float32(3) / np.float32(-7))
    assert division.divide(jnp.ones((2, 1)), jnp.ones(3)).shape == (2, 3)
    half = division.divide(jnp.ones(2, jnp.bfloat16), jnp.bfloat16(2))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(half, np.float32), [0.5, 0.5])


@pytest.mark.parametrize("batched", ["divisor", "dividend", "both"])
def test_divide_under_vmap_and_jit_keeps_shapes_and_numpy_bits(batched: str) -> None:
    # Before: the batching rule bound operands of different shapes, and the
    # abstract shape was the first operand's: `jit(vmap(reciprocal))` raised an
    # IndexError in the lowering, `eval_shape` gave (1, 1, 4) for (3, 1, 4).
    a = random_floats(3 * 2 * 4, seed=5).reshape(3, 2, 4)
    b = random_floats(3 * 1 * 4, seed=6).reshape(3, 1, 4)
    fixed_a, fixed_b = a[0], b[0]
    with np.errstate(all="ignore"):
        if batched == "divisor":
            fn, args, want = (lambda y: division.divide(fixed_a, y)), (b,), fixed_a / b
        elif batched == "dividend":
            fn, args, want = (lambda x: division.divide(x, fixed_b)), (a,), a / fixed_b
        else:
            fn, args, want = division.divide, (a, b), a / b
    assert jax.eval_shape(jax.vmap(fn), *args).shape == (3, 2, 4)
    with np.errstate(all="ignore"):
        got = np.asarray(jax.jit(jax.vmap(fn))(*args))
    assert got.shape == want.shape == (3, 2, 4)
    ok = normal(want)
    assert ok.sum() > 5
    assert same_bits(got[ok], want[ok]).all()
    reciprocals = np.asarray(jax.jit(jax.vmap(division.reciprocal))(np.abs(b) + 1.0))
    assert same_bits(reciprocals, np.float32(1.0) / (np.abs(b) + np.float32(1.0))).all()


def test_observer_qparams_under_jit_are_numpys_float32_formulas_bit_for_bit():
    rng = np.random.default_rng(4)
    low = -rng.uniform(0.1, 5.0, 64).astype(np.float32)
    high = rng.uniform(0.1, 5.0, 64).astype(np.float32)
    scale, zero_point = jax.jit(observers.compute_qparams, static_argnums=(2, 3, 4))(
        low, high, 0, 255, False
    )
    expected_scale = (high - low) / np.float32(255)
    np.testing.assert_array_equal(np.asarray(scale).view(np.uint32), expected_scale.view(np.uint32))
    expected_zero_point = np.clip(0 - np.round(low / expected_scale), 0, 255)
    np.testing.assert_array_equal(np.asarray(zero_point), expected_zero_point.astype(np.int32))
    symmetric, _ = jax.jit(observers.compute_qparams, static_argnums=(2, 3, 4))(
        low, high, -128, 127, True
    )
    expected = np.maximum(-low, high) / np.float32(127.5)
    np.testing.assert_array_equal(np.asarray(symmetric).view(np.uint32), expected.view(np.uint32))


def _lowered_text(fn: Callable[..., Any], platform: str, *args: Any) -> str:
    """The StableHLO of `fn` lowered for `platform` (no such device needed)."""
    return export.export(jax.jit(fn), platforms=[platform])(*args).mlir_module()


@pytest.mark.parametrize("platform", ["cpu", "cuda", "rocm"])
def test_cpus_and_gpus_divide_in_float64(platform):
    a, b = np.ones((4, 3), np.float32), np.ones((1, 3), np.float32)
    text = _lowered_text(division.divide, platform, a, b)
    assert "stablehlo.divide" in text and "tensor<4x3xf64>" in text
    assert "bitcast_convert" not in text
    # GPUs round the float64 quotient to float32's format before converting it.
    assert ("stablehlo.reduce_precision" in text) == (platform != "cpu")
    if platform != "cpu":
        assert "format = e8m23 : tensor<4x3xf64>" in text
    # A symbolic batch is traced instead of emitted: the same operations.
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("n, 3"), jnp.float32)
    symbolic = _lowered_text(division.divide, platform, spec, spec)
    assert "stablehlo.divide" in symbolic and "tensor<?x3xf64>" in symbolic
    assert ("stablehlo.reduce_precision" in symbolic) == (platform != "cpu")


def test_the_gpu_form_gives_numpy_bits_for_every_normal_quotient():
    a, b = random_floats(400_000, seed=8), random_floats(400_000, seed=9)
    with np.errstate(all="ignore"):
        expected = a / b
    with jax.enable_x64(True):
        actual = np.asarray(jax.jit(division._float64_divide_in_float32_format)(a, b))
    finite = normal(a) & normal(b) & (normal(expected) | np.isinf(expected))
    assert np.isinf(expected[finite]).any()  # overflow to infinity is covered
    wrong = finite & ~same_bits(actual, expected)
    assert not wrong.any(), (a[wrong][:3], b[wrong][:3], actual[wrong][:3])


# Run at XLA's default optimization level (the suite compiles at -O0, which
# skips LLVM's instruction combiner): NumPy's bits on this backend, and on a
# CPU the combiner's rewrite seen in the optimized LLVM IR, which on a GPU
# turned the plain float64 form into XLA's approximate float32 division.
_FULL_OPTIMIZATION_CHECK = """
import glob, json, os, sys
import jax, jax.numpy as jnp, numpy as np
from qat import division
rng = np.random.default_rng(0)
a = rng.uniform(0.0, 100.0, 1 << 20).astype(np.float32)
b = rng.uniform(0.5, 3.0, a.size).astype(np.float32)
divide = np.asarray(jax.jit(division.divide)(a, b))
reciprocal = np.asarray(jax.jit(division.reciprocal)(b))
with jax.enable_x64(True):
    gpu_form = jax.jit(division._float64_divide_in_float32_format)(a, b)
result = {
    "backend": jax.default_backend(),
    "divide_wrong": float((divide.view(np.uint32) != (a / b).view(np.uint32)).mean()),
    "reciprocal_wrong": float(
        (reciprocal.view(np.uint32) != (np.float32(1) / b).view(np.uint32)).mean()
    ),
}
def divisions(name):
    text = "".join(open(f).read() for f in glob.glob(f"{sys.argv[1]}/*{name}*ir-with-opt.ll"))
    return {width: f"fdiv <8 x {width}>" in text or f"fdiv {width}" in text
            for width in ("float", "double")}
if result["backend"] == "cpu":
    result["plain"] = divisions("jit_divide")
    result["gpu_form"] = divisions("_float64_divide_in_float32_format")
print(json.dumps(result))
"""


def test_at_full_optimization_quotients_keep_numpy_bits_and_the_gpu_form_a_float64_division(
    tmp_path,
):
    flags = f"--xla_dump_to={tmp_path} --xla_dump_hlo_module_re=.*divide.*"
    env = {**os.environ, "XLA_FLAGS": flags}
    child = subprocess.run(
        [sys.executable, "-c", _FULL_OPTIMIZATION_CHECK, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["divide_wrong"] == 0.0 and result["reciprocal_wrong"] == 0.0, result
    if result["backend"] == "cpu":
        # LLVM folds the plain form into a float32 division (exact on a CPU) ...
        assert result["plain"] == {"float": True, "double": False}, result
        # ... but not the GPU form, whose rounding goes through integer operations.
        assert result["gpu_form"] == {"float": False, "double": True}, result


def test_tpus_divide_in_integer_arithmetic():
    a, b = np.ones((4, 3), np.float32), np.ones((1, 3), np.float32)
    text = _lowered_text(division.divide, "tpu", a, b)
    assert "bitcast_convert" in text and "f64" not in text
    qparams = _lowered_text(
        lambda low, high: observers.compute_qparams(low, high, 0, 255, False), "tpu", b, b
    )
    assert "bitcast_convert" in qparams


def test_vmap_grad_and_64_bit_mode():
    rng = np.random.default_rng(5)
    a = rng.uniform(0.0, 100.0, (64, 8)).astype(np.float32)
    b = rng.uniform(0.5, 3.0, 8).astype(np.float32)
    batched = np.asarray(jax.vmap(division.divide, in_axes=(1, 0), out_axes=1)(a, b))
    np.testing.assert_array_equal(batched.view(np.uint32), (a / b).view(np.uint32))
    da, db = jax.grad(division.divide, argnums=(0, 1))(3.0, 2.0)
    assert (float(da), float(db)) == (0.5, -0.75)
    with jax.enable_x64(True):
        assert division.divide(np.float32(1), np.float32(3)).dtype == jnp.float32
        assert float(division.divide(1.0, 3.0)) == 1.0 / 3.0  # float64: XLA's division


def test_eager_and_op_by_op_calls_keep_numpy_bits_and_the_device():
    rng = np.random.default_rng(6)
    a = rng.uniform(0.0, 100.0, (64, 8)).astype(np.float32)
    b = rng.uniform(0.5, 3.0, (1, 8)).astype(np.float32)
    with jax.disable_jit():  # an impl that called jit recursed here
        quotient = division.divide(jnp.asarray(a), b)
    np.testing.assert_array_equal(np.asarray(quotient).view(np.uint32), (a / b).view(np.uint32))
    device = jax.devices()[-1]
    placed = division.divide(jax.device_put(a, device), b)
    assert placed.devices() == {device}


def test_an_export_with_a_symbolic_batch_keeps_numpy_bits_at_every_size():
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("b, 3"), jnp.float32)
    exported = export.export(jax.jit(division.divide))(spec, spec)
    rng = np.random.default_rng(7)
    for rows in (1, 9):
        a = rng.uniform(0.0, 100.0, (rows, 3)).astype(np.float32)
        b = rng.uniform(0.5, 3.0, (rows, 3)).astype(np.float32)
        quotient = np.asarray(exported.call(a, b))
        np.testing.assert_array_equal(quotient.view(np.uint32), (a / b).view(np.uint32))
