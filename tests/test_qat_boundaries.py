"""`qat` at its boundaries: bad qparams, uncalibrated observers, non-finite data, wrong variables.

Each case once gave NaN, silent garbage or a deep error; now it raises (or
warns) naming the argument. The last tests check int8 inference against a
float64 NumPy reference of `int8 x int8 -> int32`, then rescale.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from qat import (
    FakeQuantize,
    QATConfig,
    QATDotGeneral,
    QATModel,
    QuantizationObserver,
    calibrate,
    convert,
    fake_quantize,
    from_fp32,
    int8_apply,
    int8_dot_general,
    lsq_fake_quantize,
    model_size,
    qat_dot_general,
    quantized_layers,
)

X4 = np.array([-1.0, 0.0, 0.5, 1.0], np.float32)


class TinyMLP(nn.Module):
    """Two hooked `nn.Dense` layers."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        hidden = nn.relu(nn.Dense(6, dot_general_cls=self.dot_general_cls)(x))
        return nn.Dense(3, dot_general_cls=self.dot_general_cls)(hidden)


def sample(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(8, 4)).astype(np.float32)


@functools.cache
def tiny(bits: int = 8):
    """`(qat_model, fp32 variables, fresh QAT variables)` of `TinyMLP`."""
    model = TinyMLP()
    fp32 = jax.jit(model.init)(jax.random.key(0), sample())
    qat_model = QATModel(model, QATConfig(bits=bits))
    return qat_model, fp32, from_fp32(fp32, qat_model, sample())


# ---------------------------------------------------------------------------
# fake_quantize / lsq_fake_quantize qparams


@pytest.mark.parametrize("scale", [0.0, -0.1, np.nan, np.inf])
def test_fake_quantize_rejects_a_scale_that_is_not_finite_and_positive(scale):
    # Before: scale 0 gave NaN at x=0 (0/0), inf or NaN gave all-NaN, negative mirrored the grid.
    with pytest.raises(ValueError, match=r"scale must be finite and > 0, got \["):
        fake_quantize(X4, scale, 0, -128, 127)


@pytest.mark.parametrize("zero_point", [2.5, 300, -1, np.nan])
def test_fake_quantize_rejects_a_zero_point_off_the_integer_grid(zero_point):
    # Before: 300 on [0, 255] returned -4.5 for every input; NaN gave NaN.
    with pytest.raises(ValueError, match=r"zero_point must be an integer in \[qmin, qmax\]"):
        fake_quantize(X4, 0.1, zero_point, 0, 255)


def test_fake_quantize_still_takes_traced_qparams_under_jit():
    quantize = jax.jit(lambda s, zp: fake_quantize(X4, s, zp, 0, 255))
    np.testing.assert_allclose(np.asarray(quantize(0.5, 2.0)), [-1.0, 0.0, 0.5, 1.0])


@pytest.mark.parametrize("scale", [np.nan, np.inf])
def test_lsq_rejects_a_non_finite_scale(scale):
    with pytest.raises(ValueError, match="scale must be finite"):
        lsq_fake_quantize(X4, scale, 0, -128, 127)


@pytest.mark.parametrize(
    ("grad_scale", "error", "match"),
    [
        (float("nan"), ValueError, "grad_scale must be finite and >= 0, got nan"),
        (-1.0, ValueError, "grad_scale must be finite and >= 0, got -1.0"),
        ("a", TypeError, "grad_scale must be a float or None, got str"),
    ],
)
def test_lsq_rejects_a_bad_grad_scale(grad_scale, error, match):
    # Before: NaN gave a NaN step-size gradient; "a" a bare float() ValueError.
    with pytest.raises(error, match=match):
        lsq_fake_quantize(X4, 0.1, 0, -128, 127, grad_scale=grad_scale)


def test_lsq_names_a_traced_grad_scale():
    # Before: a ConcretizationTypeError from float() deep in the call.
    with pytest.raises(TypeError, match="grad_scale must be a concrete Python float"):
        jax.jit(lambda g: lsq_fake_quantize(X4, 0.1, 0, -128, 127, grad_scale=g))(0.5)


# ---------------------------------------------------------------------------
# FakeQuantize and observers


@pytest.mark.parametrize("scale", [np.nan, np.inf])
def test_create_rejects_a_non_finite_scale(scale):
    # Before: NaN passed `scale <= 0`, and the quantizer returned NaN.
    with pytest.raises(ValueError, match=r"scale must be finite and > 0, got \[(nan|inf)\]"):
        FakeQuantize.create(QATConfig(), scale=scale)


def test_create_rejects_a_nonzero_zero_point_on_a_symmetric_grid():
    with pytest.raises(ValueError, match="zero_point must be 0 for a symmetric QATConfig"):
        FakeQuantize.create(QATConfig(), scale=0.1, zero_point=5)


def test_create_names_zero_point_and_scale_on_bad_shapes_and_types():
    cfg = QATConfig(symmetric=False, per_channel=True)
    with pytest.raises(ValueError, match=r"zero_point must be a scalar or of scale's shape \(2,\)"):
        FakeQuantize.create(cfg, scale=[0.1, 0.2], zero_point=[1, 2, 3])
    with pytest.raises(TypeError, match="scale must be a number or numeric array"):
        FakeQuantize.create(QATConfig(), scale="0.1")


def test_from_observer_refuses_an_observer_that_saw_nothing():
    # Before: the eps placeholder scale clipped every input to about +-1.5e-5.
    fresh = QuantizationObserver.create(QATConfig())
    with pytest.raises(ValueError, match="observer has not observed any batch"):
        FakeQuantize.from_observer(fresh)
    with pytest.raises(TypeError, match=r"observer must be a qat\.QuantizationObserver, got int"):
        FakeQuantize.from_observer(3)
    seen = FakeQuantize.from_observer(fresh.observe(X4))
    np.testing.assert_allclose(np.asarray(seen(X4)), X4, atol=float(seen.scale))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_observe_rejects_non_finite_data(bad):
    # Before: the range, then the scale, became NaN or inf without a word.
    x = np.array([bad, 1.0], np.float32)
    for cfg in (QATConfig(), QATConfig(symmetric=False, observer="moving_average")):
        with pytest.raises(ValueError, match=r"x must be finite: it holds 1 NaN or inf value"):
            QuantizationObserver.create(cfg).observe(x)


def test_observer_num_channels_takes_numpy_ints_and_names_other_types():
    cfg = QATConfig(per_channel=True)
    observer = QuantizationObserver.create(cfg, num_channels=np.int64(3))
    assert observer.min_val.shape == (3,)
    with pytest.raises(TypeError, match=r"num_channels must be a positive int, got float 3\.0"):
        QuantizationObserver.create(cfg, num_channels=3.0)


# ---------------------------------------------------------------------------
# calibrate, convert, int8_apply


def test_calibrate_refuses_no_batches_and_a_single_mapping_batch():
    qat_model, _, fresh = tiny()
    # Before: [] returned the uncalibrated variables silently.
    with pytest.raises(ValueError, match="batches is empty"):
        calibrate(qat_model, fresh, [])
    with pytest.raises(TypeError, match=r"batches must be an iterable of batches.*got dict"):
        calibrate(qat_model, fresh, {"x": sample()})
    with pytest.raises(TypeError, match=r"batches must be an iterable of batches.*got int"):
        calibrate(qat_model, fresh, 3)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_calibrate_refuses_a_batch_that_makes_the_ranges_non_finite(bad):
    # Before: the observers held NaN/inf and QAT and int8 outputs were all NaN.
    qat_model, _, fresh = tiny()
    poisoned = sample(1).copy()
    poisoned[0, 0] = bad
    with pytest.raises(ValueError, match=r"calibration batch 1 .*\(Dense_0/dot_general"):
        calibrate(qat_model, fresh, [sample(0), poisoned, sample(2)])


def test_calibrate_warns_when_an_observer_saw_only_zeros():
    # Before: a range of [0, 0] took the EPS scale floor without a word, and
    # every real input of the layer then quantized to about 0.
    qat_model, _, fresh = tiny()
    zeros = np.zeros_like(sample())
    with pytest.warns(UserWarning, match=r"2 activation observer\(s\) saw only zeros \(Dense_0/"):
        calibrated = calibrate(qat_model, fresh, [zeros])
    stats = calibrated["quant_stats"]["Dense_0"]["dot_general"]
    assert float(stats["min"]) == float(stats["max"]) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calibrate(qat_model, fresh, [zeros, sample()])


def test_an_empty_calibration_batch_is_named_with_its_layer_and_index():
    # Before: JAX's "zero-size array to reduction operation min which has no identity".
    qat_model, _, fresh = tiny()
    message = (
        r"calibrate: batch 1 \(counting from 0\): calibrating Dense_0/dot_general: .*shape \(0, 4\)"
    )
    with pytest.raises(ValueError, match=message):
        calibrate(qat_model, fresh, [sample(), sample()[:0]])


def test_variables_made_for_another_qat_config_are_refused_by_the_forward():
    # Before: FP32 variables failed in Flax's scope lookup ("ScopeCollectionNotFound"),
    # a learned step size the config does not use was ignored (the output moved
    # silently), and variables of another width ran at the model's width while
    # calibrate kept their width's markers for convert.
    qat_model, fp32, fresh = tiny()
    x = sample()
    with pytest.raises(ValueError, match=r"Dense_0/dot_general: .*no 'quant_stats'.*qat.from_fp32"):
        qat_model.apply(fp32, x)
    learned_model = QATModel(TinyMLP(), QATConfig(bits=8, learnable_scale=True))
    learned = from_fp32(fp32, learned_model, x)
    assert "quant_params" in learned
    with pytest.raises(ValueError, match=r"hold a learned step size .* learnable_scale=False"):
        qat_model.apply(learned, x)
    with pytest.raises(ValueError, match=r"hold no learned step size .* learnable_scale=True"):
        learned_model.apply(fresh, x)
    four_bits = QATModel(TinyMLP(), QATConfig(bits=4))
    with pytest.raises(ValueError, match=r"made for \[8\] bits but .* bits=4"):
        four_bits.apply(fresh, x)
    with pytest.raises(ValueError, match=r"another bit width than the model's QATConfig.bits=4"):
        calibrate(four_bits, fresh, [x])


def test_calibrate_draws_no_batch_past_num_batches():
    qat_model, _, fresh = tiny()
    drawn = []

    def batches():
        for seed in range(5):
            drawn.append(seed)
            yield sample(seed)

    calibrated = calibrate(qat_model, fresh, batches(), num_batches=2)
    assert drawn == [0, 1]
    assert int(calibrated["quant_stats"]["Dense_0"]["dot_general"]["num_batches"]) == 2


def test_convert_warns_when_observers_never_saw_a_batch():
    qat_model, _, fresh = tiny()
    with pytest.warns(UserWarning, match="2 of 2 activation observers never saw a batch"):
        convert(fresh)
    calibrated = calibrate(qat_model, fresh, [sample()])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert(calibrated)


def test_the_variables_arguments_must_be_mappings():
    qat_model, fp32, _ = tiny()
    cases = [
        ("fp32_variables", lambda: from_fp32(3, qat_model, sample())),
        ("qat_variables", lambda: calibrate(qat_model, 3, [sample()])),
        ("qat_variables", lambda: convert(3)),
        ("qat_variables", lambda: quantized_layers(3)),
        ("int8_variables", lambda: int8_apply(qat_model, 3, sample())),
    ]
    for name, call in cases:
        with pytest.raises(TypeError, match=f"{name} must be a mapping of variable collections"):
            call()
    with pytest.raises(ValueError, match="holds no parameters"):
        model_size({"params": {}}, fp32)


def test_a_dense_with_int8_dot_general_refuses_float_weights_that_are_not_codes():
    # Before: the FP32 kernel was truncated to int8 (all weights |w| < 1 became 0).
    qat_model, fp32, fresh = tiny()
    int8_vars = convert(calibrate(qat_model, fresh, [sample()]))
    named = TinyMLP(dot_general_cls=int8_dot_general(qat_model.qat_config))
    named.apply(int8_vars, sample())  # the converted codes are fine
    with pytest.raises(ValueError, match="not 8-bit integer codes in \\[-128, 127\\]"):
        named.apply({**int8_vars, "params": fp32["params"]}, sample())


# ---------------------------------------------------------------------------
# int8 inference against a float64 reference


def reference_dense(x, kernel, bias, stats, bits):
    """Int8 `Dense` in float64: affine activation codes, symmetric per-channel weight codes."""
    qmin, qmax = 0, 2**bits - 1
    low, high = min(float(stats["min"]), 0.0), max(float(stats["max"]), 0.0)
    s_a = np.float32(np.float32(high - low) / np.float32(qmax - qmin))
    zero_point = np.clip(qmin - np.round(low / s_a), qmin, qmax)
    w_qmax = 2 ** (bits - 1) - 1
    s_w = (np.abs(kernel).max(0) / np.float32(w_qmax)).astype(np.float32).astype(np.float64)
    w_codes = np.clip(np.round(kernel / s_w), -w_qmax - 1, w_qmax)
    a_codes = np.clip(np.round(x / np.float64(s_a)) + zero_point, qmin, qmax)
    integer = (a_codes - zero_point).astype(np.int64) @ w_codes.astype(np.int64)
    return np.float64(s_a) * integer * s_w + bias


@pytest.mark.parametrize("bits", [8, 4])
def test_int8_apply_matches_a_float64_integer_reference(bits):
    qat_model, fp32, fresh = tiny(bits)
    x = sample(3) * 2 + 0.5
    calibrated = calibrate(qat_model, fresh, [x])
    out = np.asarray(int8_apply(qat_model, convert(calibrated), x), np.float64)

    params = jax.tree.map(lambda a: np.asarray(a, np.float64), fp32["params"])
    stats = calibrated["quant_stats"]
    hidden = reference_dense(
        x.astype(np.float64), **params["Dense_0"], stats=stats["Dense_0"]["dot_general"], bits=bits
    )
    hidden = np.maximum(hidden.astype(np.float32), 0).astype(np.float64)
    expected = reference_dense(
        hidden, **params["Dense_1"], stats=stats["Dense_1"]["dot_general"], bits=bits
    )
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert jnp.isfinite(out).all()


def test_int8_apply_refuses_a_learnable_scale_mismatch():
    # Before: a plain model silently dropped the learned step-size offsets (other
    # scales than QAT trained with); the other way round, a Flax ScopeCollectionNotFound.
    plain, fp32, _ = tiny()
    learned = QATModel(plain.model, QATConfig(learnable_scale=True))
    variables = calibrate(learned, from_fp32(fp32, learned, sample()), [sample()])
    variables["quant_params"] = jax.jit(lambda tree: jax.tree.map(lambda a: a + 0.05, tree))(
        variables["quant_params"]
    )
    with pytest.raises(ValueError, match=r"int8_variables hold learned .*learnable_scale=False"):
        int8_apply(plain, convert(variables), sample())
    plain_variables = convert(calibrate(plain, tiny()[2], [sample()]))
    with pytest.raises(ValueError, match=r"int8_variables do not hold .*learnable_scale=True"):
        int8_apply(learned, plain_variables, sample())
    np.testing.assert_allclose(
        np.asarray(int8_apply(learned, convert(variables), sample())),
        np.asarray(jax.jit(learned.apply)(variables, sample())),  # the QAT reference, jitted
        atol=1e-5,
    )


def test_numpy_integer_calibration_counts_are_taken_as_ints():
    # Before: QATConfig kept np.int64, and calibrate then refused it as
    # "num_batches must be a positive int, got None" (the argument it was not given).
    config = QATConfig(calibration_batches=np.int64(2))
    assert type(config.calibration_batches) is int and config.calibration_batches == 2
    qat_model, _, fresh = tiny()
    numpy_model = QATModel(qat_model.model, config)
    calibrated = calibrate(numpy_model, fresh, [sample(seed) for seed in range(3)])
    assert int(calibrated["quant_stats"]["Dense_0"]["dot_general"]["num_batches"]) == 2
    calibrated = calibrate(qat_model, fresh, [sample(0), sample(1)], num_batches=np.int64(1))
    assert int(calibrated["quant_stats"]["Dense_0"]["dot_general"]["num_batches"]) == 1


def test_converting_converted_variables_again_is_refused():
    # Before: the int8 codes were read as weights: every weight scale became 1
    # and the int8 output was off by hundreds.
    qat_model, _, fresh = tiny()
    int8_vars = convert(calibrate(qat_model, fresh, [sample()]))
    with pytest.raises(ValueError, match=r"Dense_0 is int8, not float: qat_variables are already"):
        convert(int8_vars)


def test_the_qat_forward_refuses_converted_variables():
    # Before: nn.Dense cast the int8 codes to float and the QAT forward used
    # them as weights (an output off by hundreds), calibrate likewise.
    qat_model, _, fresh = tiny()
    int8_vars = convert(calibrate(qat_model, fresh, [sample()]))
    with pytest.raises(ValueError, match=r"'int8' collection of qat\.convert: run them with"):
        qat_model.apply(int8_vars, sample())
    with pytest.raises(ValueError, match=r"'int8' collection of qat\.convert: run them with"):
        jax.jit(qat_model.apply)(int8_vars, sample())
    with pytest.raises(ValueError, match=r"'int8' collection of qat\.convert: run them with"):
        calibrate(qat_model, int8_vars, [sample()])


# ---------------------------------------------------------------------------
# A hook that reaches no layer, the stand-alone hooks' config, calibration batches


class HookUnused(nn.Module):
    """Has the `dot_general_cls` field but hands it to no layer (a forgotten hook)."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.relu(nn.Dense(4)(x)))


class ConvOnly(nn.Module):
    """Has the field, but no dense layer to hand it to."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        return nn.Conv(3, (1,))(x)


@pytest.mark.parametrize("model_cls", [HookUnused, ConvOnly])
def test_a_model_whose_hook_reaches_no_layer_is_refused_not_run_as_fp32(model_cls):
    # Before: from_fp32, calibrate, apply and training ran without a word, the
    # "4-bit QAT" output was the FP32 one, and only convert noticed, asking for bits.
    model, x = model_cls(), sample()
    fp32 = jax.jit(model.init)(jax.random.key(0), x)
    qat_model = QATModel(model, QATConfig(bits=4))
    name = model_cls.__name__
    message = (
        rf"QATModel: no layer of {name} received its dot_general_cls.*"
        r"nn\.Dense\(\.\.\., dot_general_cls=self\.dot_general_cls\)"
    )
    with pytest.raises(ValueError, match=message):
        from_fp32(fp32, qat_model, x)
    with pytest.raises(ValueError, match=message):  # any init: create_train_state's too
        qat_model.init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="calibrate: " + message):
        calibrate(qat_model, fp32, [x])
    with pytest.raises(ValueError, match=r"no quantized layer .*passes its dot_general_cls"):
        convert(fp32)
    # Quantization off is not refused: that model is the FP32 one by design.
    disabled = QATModel(model, QATConfig(bits=None))
    np.testing.assert_array_equal(
        disabled.apply(from_fp32(fp32, disabled, x), x), model.apply(fp32, x)
    )


def test_calibrate_with_quantization_off_warns_that_there_is_nothing_to_calibrate():
    # Before: it ran every batch through the FP32 forward without a word.
    _, fp32, _ = tiny()
    disabled = QATModel(TinyMLP(), QATConfig(bits=None))
    variables = from_fp32(fp32, disabled, sample())
    message = r"calibrate: .*QATConfig\.bits is None .*no activation observers to calibrate"
    with pytest.warns(UserWarning, match=message):
        calibrate(disabled, variables, [sample(0), sample(1)])
    qat_model, _, fresh = tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calibrate(qat_model, fresh, [sample()])


@pytest.mark.parametrize("factory", [qat_dot_general, int8_dot_general])
def test_the_stand_alone_hooks_name_a_config_that_is_not_a_qat_config(factory):
    # Before: AttributeError "'FrozenDict' object has no attribute 'enabled'" from inside
    # the layer's call.
    name = factory.__name__
    with pytest.raises(TypeError, match=rf"{name}: config must be a QATConfig, got dict"):
        factory({"bits": 8})
    with pytest.raises(TypeError, match=r"QATDotGeneral: config must be a QATConfig, got"):
        QATDotGeneral(config={"bits": 8})


@pytest.mark.parametrize("factory", [qat_dot_general, int8_dot_general])
def test_the_stand_alone_hooks_announce_layout_fields_they_ignore_once(factory, monkeypatch):
    # Before: nn.Dense(dot_general_cls=qat_dot_general(QATConfig(symmetric=False)))
    # quantized with the fixed layout, silently (QATModel warned about exactly this).
    import qat.config as qat_config_module

    monkeypatch.setattr(qat_config_module, "_ANNOUNCED_LAYOUTS", set())
    config = QATConfig(symmetric=False, observer="moving_average")
    message = (
        rf"{factory.__name__} quantizes with a fixed layout .*config's symmetric=False, "
        r"observer='moving_average' configure stand-alone observers"
    )
    with pytest.warns(UserWarning, match=message) as caught:
        for _ in range(3):  # a hook built in every trace still says it once
            factory(config)
    assert len(caught) == 1
    assert caught[0].filename == __file__  # points at the line that built the hook
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        factory(QATConfig(bits=4, averaging_constant=0.5))  # fields the hook uses


class ThreeInputs(nn.Module):
    """A forecaster-shaped model: `(static, historical, future, ...)` positional inputs."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, static, historical, future, known_history=None, static_categorical=None,
                 deterministic=True):  # fmt: skip
        flat = historical.reshape(historical.shape[0], -1)
        return nn.Dense(2, dot_general_cls=self.dot_general_cls)(flat)


def three_inputs():
    rng = np.random.default_rng(0)
    shapes = ((4, 1), (4, 3, 2), (4, 2, 1))
    return tuple(rng.normal(size=shape).astype(np.float32) for shape in shapes)


def test_calibrate_names_a_batch_that_does_not_fit_the_model_and_a_bare_tuple_of_inputs():
    # Before: the model's raw "__call__() missing 2 required positional arguments",
    # which named neither calibrate, the batch nor the forms a batch takes.
    model, (static, historical, future) = ThreeInputs(), three_inputs()
    fp32 = jax.jit(model.init)(jax.random.key(0), static, historical, future)
    qat_model = QATModel(model, QATConfig())
    fresh = from_fp32(fp32, qat_model, static, historical, future)
    with pytest.raises(
        TypeError,
        match=r"calibrate: batch 0 \(counting from 0\) does not fit the model: ThreeInputs\."
        r"__call__\(static, historical, future.*missing a required argument: 'historical'.*"
        r"an array \(one argument\), a tuple or list .*tft_jax\.train\.Batch.*"
        r"batches is a tuple of 3 items .*each read as one batch .*wrap it in a list",
    ):
        calibrate(qat_model, fresh, (static, historical, future))
    with pytest.raises(
        TypeError, match=r"calibrate: batch 1 .*unexpected keyword argument 'future_values'"
    ):
        inputs = {"static": static, "historical": historical, "future": future}
        calibrate(qat_model, fresh, [(static, historical, future), {**inputs, "future_values": 1}])


def test_calibrate_takes_the_training_batch_of_a_qat_model():
    # Before: a tft_jax.train.Batch was passed as the model's one positional argument.
    from tft_jax.train import Batch

    model, (static, historical, future) = ThreeInputs(), three_inputs()
    fp32 = jax.jit(model.init)(jax.random.key(0), static, historical, future)
    qat_model = QATModel(model, QATConfig())
    fresh = from_fp32(fp32, qat_model, static, historical, future)
    batch = Batch(static=static, historical=historical, future=future, known_history=None,
                  static_categorical=None, target=np.zeros((4, 2), np.float32))  # fmt: skip
    jax.tree.map(
        np.testing.assert_array_equal,
        calibrate(qat_model, fresh, [batch]),
        calibrate(qat_model, fresh, [(static, historical, future)]),
    )


class TakesTheBatch(nn.Module):
    """Takes a `tft_jax.train.Batch` itself as its one argument."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, batch):
        flat = batch.historical.reshape(batch.historical.shape[0], -1)
        return nn.Dense(2, dot_general_cls=self.dot_general_cls)(flat)


def test_calibrate_still_passes_the_batch_to_a_model_that_takes_it_whole():
    from tft_jax.train import Batch

    static, historical, future = three_inputs()
    batch = Batch(static=static, historical=historical, future=future, known_history=None,
                  static_categorical=None, target=np.zeros((4, 2), np.float32))  # fmt: skip
    model = TakesTheBatch()
    qat_model = QATModel(model, QATConfig())
    fresh = from_fp32(jax.jit(model.init)(jax.random.key(0), batch), qat_model, batch)
    calibrated = calibrate(qat_model, fresh, [batch])
    assert int(calibrated["quant_stats"]["Dense_0"]["dot_general"]["num_batches"]) == 1
