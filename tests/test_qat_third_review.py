"""Third QAT review: the generic QAT pieces on a user's own models, against float64 references.

A researcher's flow: observers and fake quantizers checked element by element
against NumPy float64, the straight-through and LSQ gradients against their
closed forms, then a small MLP and a conv + attention model (the convolution
as a hooked `nn.Dense` over im2col patches) calibrated, fine-tuned with
`clip_by_global_norm` + AdamW, converted to int8 and run with integer matmuls.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from qat import (
    FakeQuantize,
    QATConfig,
    QATModel,
    QuantizationObserver,
    calibrate,
    convert,
    fake_quantize,
    from_fp32,
    int8_apply,
    lsq_fake_quantize,
    quantized_layers,
)

RNG = np.random.default_rng(31)


def reference_fake_quantize(x, scale, zero_point, qmin, qmax):
    """`(clip(round(x/s) + zp, qmin, qmax) - zp) * s` in float64, round half to even."""
    x, scale = np.asarray(x, np.float64), np.asarray(scale, np.float64)
    codes = np.clip(np.round(x / scale) + zero_point, qmin, qmax)
    return (codes - zero_point) * scale


def away_from_ties(x, scale, margin=1e-3):
    """Elements whose `x / s` is not within `margin` of a rounding tie (`k + 0.5`).

    XLA divides by a broadcast scale as a multiplication by its reciprocal
    (as PyTorch does), which can differ from float64 division by an ulp:
    exactly at a tie that is one code either way.
    """
    ratio = np.asarray(x, np.float64) / np.asarray(scale, np.float64)
    return np.abs(ratio - np.floor(ratio) - 0.5) > margin


# Observers and fake quantizers against float64.


@pytest.mark.parametrize(
    ("symmetric", "per_channel", "channel_axis"),
    [(True, False, -1), (False, False, -1), (True, True, 0), (True, True, -1), (False, True, 1)],
)
def test_fake_quantizer_from_observer_matches_float64_reference(
    symmetric, per_channel, channel_axis
):
    cfg = QATConfig(bits=8, symmetric=symmetric, per_channel=per_channel, channel_axis=channel_axis)
    x = (RNG.normal(size=(6, 5)) * np.array([0.1, 1.0, 3.0, 0.5, 2.0]) + 0.3).astype(np.float32)
    quantizer = FakeQuantize.from_observer(QuantizationObserver.create(cfg).observe(x))

    axes = None if not per_channel else tuple(a for a in range(2) if a != channel_axis % 2)
    low = np.minimum(x.astype(np.float64).min(axis=axes, keepdims=True), 0.0)
    high = np.maximum(x.astype(np.float64).max(axis=axes, keepdims=True), 0.0)
    if symmetric:
        qmin, qmax = -128, 127
        scale = np.maximum(-low, high) / 127.5
        zero_point = np.zeros_like(scale)
    else:
        qmin, qmax = 0, 255
        scale = (high - low) / 255
        zero_point = np.clip(qmin - np.round(low / scale), qmin, qmax)
    got_scale, got_zero_point = quantizer.scale_zero_point()
    np.testing.assert_allclose(np.asarray(got_scale), scale.squeeze(), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(got_zero_point), zero_point.squeeze())

    expected = reference_fake_quantize(x, scale, zero_point, qmin, qmax)
    got = np.asarray(quantizer(x), np.float64)
    clean = away_from_ties(x, scale)
    np.testing.assert_allclose(got[clean], expected[clean], atol=1e-6)
    # A symmetric range puts its extreme on 127.5 (or -127.5): a tie, one code either way.
    step = np.broadcast_to(scale, x.shape)
    assert np.all(np.abs(got - expected)[~clean] <= step[~clean] * (1 + 1e-6))


def test_fake_quantize_rounds_half_to_even_and_clips_at_both_grid_ends():
    x = jnp.array([0.5, 1.5, 2.5, -0.5, -2.5, 6.5, 7.5, -7.5, -8.5, -9.0, 100.0])
    got = fake_quantize(x, 1.0, 0, -8, 7)
    np.testing.assert_array_equal(np.asarray(got), [0, 2, 2, 0, -2, 6, 7, -8, -8, -8, 7])
    # Affine: codes 0..15 with zero point 3, step 0.5.
    got = fake_quantize(jnp.array([-1.75, -1.5, -1.25, 0.0, 6.0, 6.25, 6.5]), 0.5, 3, 0, 15)
    np.testing.assert_array_equal(np.asarray(got), [-1.5, -1.5, -1.0, 0.0, 6.0, 6.0, 6.0])


def test_straight_through_gradient_is_one_on_the_grid_ends_and_zero_past_them():
    # Step 1: round(x) is exact, so the mask is 1[qmin <= round(x) + zp <= qmax].
    x = jnp.array([-9.0, -8.5, -8.0, -7.6, 0.0, 6.6, 7.0, 7.49, 7.5, 8.0])
    grad = jax.jit(jax.grad(lambda x: jnp.sum(fake_quantize(x, 1.0, 0, -8, 7) * 3.0)))(x)
    # -8.5 rounds to -8 (even): inside; 7.5 rounds to 8: outside.
    np.testing.assert_array_equal(np.asarray(grad), 3.0 * np.array([0, 1, 1, 1, 1, 1, 1, 1, 0, 0]))
    # With a zero point the mask shifts with it.
    x = jnp.array([-3.6, -3.4, 0.0, 12.4, 12.6])
    grad = jax.jit(jax.grad(lambda x: jnp.sum(fake_quantize(x, 1.0, 3, 0, 15))))(x)
    np.testing.assert_array_equal(np.asarray(grad), [0, 1, 1, 1, 0])


@pytest.mark.parametrize("zero_point", [0, 5])
def test_lsq_step_size_gradient_is_the_papers_formula_times_its_gradient_scale(zero_point):
    qmin, qmax = (-8, 7) if zero_point == 0 else (0, 15)
    x = (RNG.normal(size=(4, 3)) * 0.6).astype(np.float32)
    upstream = RNG.normal(size=(4, 3)).astype(np.float32)
    scale = np.array([0.07, 0.1, 0.05], np.float32)  # per channel along the last axis

    def loss(s):
        return jnp.sum(lsq_fake_quantize(x, s, zero_point, qmin, qmax) * upstream)

    got = np.asarray(jax.jit(jax.grad(loss))(jnp.asarray(scale)))
    ratio = x.astype(np.float64) / scale
    position = np.round(ratio) + zero_point
    partial = np.where(
        position < qmin,
        qmin - zero_point,
        np.where(position > qmax, qmax - zero_point, np.round(ratio) - ratio),
    )
    assert (position < qmin).any() or (position > qmax).any()
    # N: the elements sharing one step size (a column of 4).
    expected = (partial * upstream).sum(axis=0) / np.sqrt(4 * qmax)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_observer_first_update_sets_the_range_then_each_kind_follows_its_rule():
    first, second = jnp.array([-1.0, 2.0]), jnp.array([-3.0, 1.0])
    minmax = QuantizationObserver.create(QATConfig(symmetric=False)).observe(first)
    average = QuantizationObserver.create(
        QATConfig(symmetric=False, observer="moving_average", averaging_constant=0.25)
    ).observe(first)
    for observer in (minmax, average):
        assert (float(observer.min_val), float(observer.max_val)) == (-1.0, 2.0)
        assert int(observer.num_batches) == 1
    minmax, average = minmax.observe(second), average.observe(second)
    assert (float(minmax.min_val), float(minmax.max_val)) == (-3.0, 2.0)
    assert float(average.min_val) == pytest.approx(-1.0 + 0.25 * (-3.0 + 1.0))
    assert float(average.max_val) == pytest.approx(2.0 + 0.25 * (1.0 - 2.0))


@pytest.mark.parametrize("value", [0.0, -3.0, 2.5])
def test_observer_of_a_constant_tensor_gives_a_finite_scale_that_keeps_the_value(value):
    for symmetric in (True, False):
        observer = QuantizationObserver.create(QATConfig(symmetric=symmetric))
        observer = observer.observe(jnp.full((3, 2), value))
        scale, _ = observer.qparams()
        assert np.isfinite(float(scale)) and float(scale) > 0
        quantizer = FakeQuantize.from_observer(observer)
        np.testing.assert_allclose(
            np.asarray(quantizer(jnp.full((4,), value))), value, atol=float(scale)
        )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_observer_refuses_a_non_finite_batch_by_name(bad):
    observer = QuantizationObserver.create(QATConfig(observer="moving_average"))
    with pytest.raises(ValueError, match="finite"):
        observer.observe(jnp.array([0.0, bad]))


@functools.partial(jax.jit, static_argnums=0)
def _fake_and_int8(qat_model, qat_variables, int8_variables, x):
    """The fake-quantized and the int8 forward, compiled once (op by op, each op compiles)."""
    return qat_model.apply(qat_variables, x), int8_apply(qat_model, int8_variables, x)


# A hooked dense layer in integers against float64.


class Dense(nn.Module):
    """One hooked `nn.Dense`."""

    features: int = 3
    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.features, dot_general_cls=self.dot_general_cls)(x)


def test_int8_dense_equals_the_float64_product_of_the_dequantized_operands():
    x = (RNG.normal(size=(16, 7)) + 0.4).astype(np.float32)
    model = Dense()
    qat_model = QATModel(model, QATConfig(bits=8))
    fp32 = jax.jit(model.init)(jax.random.key(1), x)
    qat_vars = calibrate(qat_model, from_fp32(fp32, qat_model, x), [x])
    got = np.asarray(_fake_and_int8(qat_model, qat_vars, convert(qat_vars), x)[1], np.float64)

    kernel = np.asarray(qat_vars["params"]["Dense_0"]["kernel"], np.float64)
    bias = np.asarray(qat_vars["params"]["Dense_0"]["bias"], np.float64)
    w_scale = np.abs(kernel).max(axis=0) / 127
    w = np.clip(np.round(kernel / w_scale), -128, 127) * w_scale
    low, high = min(x.min(), 0.0), max(x.max(), 0.0)
    a_scale = (np.float64(high) - low) / 255
    zero_point = np.clip(-np.round(low / a_scale), 0, 255)
    assert away_from_ties(x, a_scale).all()
    a = (np.clip(np.round(x / a_scale) + zero_point, 0, 255) - zero_point) * a_scale
    expected = a @ w + bias
    # float32 scales and a float32 rescale of an exact int32 sum.
    bound = 1e-5 * (np.abs(a) @ np.abs(w) + np.abs(bias))
    assert np.all(np.abs(got - expected) <= bound)


# The full flow on a user's models.


class ConvAttention(nn.Module):
    """1-D convolution (a hooked `nn.Dense` over im2col patches), self-attention, float head."""

    dot_general_cls: Any = None
    width: int = 8

    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        steps = x.shape[1]
        padded = jnp.pad(x, ((0, 0), (1, 1), (0, 0)))
        patches = jnp.concatenate([padded[:, i : i + steps] for i in range(3)], axis=-1)
        hook = {"dot_general_cls": self.dot_general_cls}
        h = nn.gelu(nn.Dense(self.width, name="conv", **hook)(patches))
        q, k, v = (nn.Dense(self.width, name=name, **hook)(h) for name in "qkv")
        weights = jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / np.sqrt(self.width), axis=-1)
        attended = nn.Dense(self.width, name="out", **hook)(weights @ v)
        h = h + nn.Dropout(0.1, deterministic=deterministic)(attended)
        return nn.Dense(1, name="head")(h.mean(axis=1))  # no hook: stays float


@functools.partial(jax.jit, static_argnums=(0, 1))
def _fine_tune(qat_model, tx, variables, x, y):
    """Three clip + AdamW steps on `'params'` and `'quant_params'`; losses and last gradients."""
    trainable = {name: variables[name] for name in ("params", "quant_params")}
    frozen = {name: value for name, value in variables.items() if name not in trainable}

    def loss(trainable, key):
        out = qat_model.apply(
            {**frozen, **trainable}, x, deterministic=False, rngs={"dropout": key}
        )
        return jnp.mean((out - y) ** 2)

    def step(carry, index):
        trainable, state, _ = carry
        value, grads = jax.value_and_grad(loss)(trainable, jax.random.key(index))
        updates, state = tx.update(grads, state, trainable)
        return (optax.apply_updates(trainable, updates), state, grads), value

    # One traced step under `lax.scan` (an unrolled loop would compile it three times).
    zero_grads = jax.tree.map(jnp.zeros_like, trainable)
    (trainable, _, grads), losses = jax.lax.scan(
        step, (trainable, tx.init(trainable), zero_grads), jnp.arange(3)
    )
    return {**frozen, **trainable}, losses, grads


def test_conv_attention_model_calibrates_fine_tunes_converts_and_runs_in_int8():
    x = RNG.normal(size=(16, 6, 2)).astype(np.float32)
    y = np.sin(x.sum(axis=(1, 2)))[:, None].astype(np.float32)
    model = ConvAttention()
    fp32 = jax.jit(model.init)(jax.random.key(0), x)
    qat_model = QATModel(model, QATConfig(bits=8, learnable_scale=True))
    qat_vars = calibrate(qat_model, from_fp32(fp32, qat_model, x), [x[:8], x[8:]])
    hooked = {path[0] for path in quantized_layers(qat_vars)}
    assert hooked == {"conv", "q", "k", "v", "out"}

    tx = optax.chain(optax.clip_by_global_norm(0.05), optax.adamw(1e-3))
    trained, losses, grads = _fine_tune(qat_model, tx, qat_vars, x, y)
    assert np.all(np.isfinite(np.asarray(losses)))
    # The straight-through gradient reaches every hooked kernel and every step size.
    # Host arithmetic from here on: op by op, each leaf shape would compile its own kernel.
    for name in hooked:
        assert np.abs(np.asarray(grads["params"][name]["kernel"])).max() > 0
        assert abs(float(grads["quant_params"][name]["dot_general"]["scale_offset"])) > 0
    # Observers stay frozen while training with calibrate=False.
    assert jax.tree.all(
        jax.tree.map(
            lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),
            trained["quant_stats"],
            qat_vars["quant_stats"],
        )
    )

    int8_vars = convert(trained)
    for name in hooked:
        assert int8_vars["params"][name]["kernel"].dtype == jnp.int8
    assert int8_vars["params"]["head"]["kernel"].dtype == jnp.float32
    fake, integer = map(np.asarray, _fake_and_int8(qat_model, trained, int8_vars, x))
    # Integer sums are exact; what remains is float32 rounding of the same codes.
    np.testing.assert_allclose(integer, fake, atol=1e-5 * np.abs(fake).max())


class ScannedLayer(nn.Module):
    """One hooked dense layer, the body of `nn.scan` over layers."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x, _):
        return nn.relu(nn.Dense(4, dot_general_cls=self.dot_general_cls)(x)), None


class ScannedStack(nn.Module):
    """Three layers as one `nn.scan` (every variable gets a leading layer axis), then a head."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        axes = {name: 0 for name in ("params", "quant_stats", "quant_params", "int8")}
        scan = nn.scan(ScannedLayer, variable_axes=axes, split_rngs={"params": True}, length=3)
        x = scan(dot_general_cls=self.dot_general_cls)(x, None)[0]
        return nn.Dense(2, dot_general_cls=self.dot_general_cls)(x)


def test_layers_stacked_by_nn_scan_convert_and_run_in_int8():
    # Each scanned layer stores its bits marker and observer with a layer axis, (3,):
    # calibrate stacked the (3,) and () finiteness flags, convert read the marker with
    # int(): both crashed with a bare TypeError.
    x = (RNG.normal(size=(8, 4)) + 0.2).astype(np.float32)
    model = ScannedStack()
    qat_model = QATModel(model, QATConfig(bits=6))
    fp32 = jax.jit(model.init)(jax.random.key(2), x)
    qat_vars = calibrate(qat_model, from_fp32(fp32, qat_model, x), [x])
    assert quantized_layers(qat_vars) == {
        ("ScanScannedLayer_0", "Dense_0", "dot_general"): 6,
        ("Dense_0", "dot_general"): 6,
    }
    int8_vars = convert(qat_vars)
    kernel = np.asarray(qat_vars["params"]["ScanScannedLayer_0"]["Dense_0"]["kernel"], np.float64)
    # One scale per layer and output feature: max |w| over that layer's inputs / 31.
    np.testing.assert_allclose(
        np.asarray(
            int8_vars["int8"]["ScanScannedLayer_0"]["Dense_0"]["dot_general"]["weight_scale"]
        ),
        np.abs(kernel).max(axis=1) / 31,
        rtol=1e-6,
    )
    fake, integer = map(np.asarray, _fake_and_int8(qat_model, qat_vars, int8_vars, x))
    np.testing.assert_allclose(integer, fake, atol=1e-5 * np.abs(fake).max())


def test_second_derivative_of_fake_quantize_is_zero_not_the_estimator_applied_twice():
    # As the package docstring says: round has derivative 0 in the rule's formulas.
    x = jnp.array([0.12, -0.37, 5.0, -5.0, 0.25])

    def loss(x):
        return jnp.sum(fake_quantize(x, 0.1, 0, -8, 7) ** 2)

    np.testing.assert_array_equal(np.asarray(jax.jit(jax.hessian(loss))(x)), np.zeros((5, 5)))
    np.testing.assert_array_equal(
        np.asarray(jax.grad(loss)(x)),
        2 * np.asarray(fake_quantize(x, 0.1, 0, -8, 7)) * np.array([1, 1, 0, 0, 1]),
    )
