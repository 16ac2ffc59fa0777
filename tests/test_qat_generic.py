"""QAT and int8 for a user's own Linen model: only the hooked layers are quantized.

The int8 forward is checked against the fake-quantized one and a float64 reference;
the whole flow (calibrate, fine-tune with clipping + AdamW, convert, int8) runs on a
conv + attention model and on layers stacked by `nn.scan`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from jax import lax

from qat import (
    Int8DotGeneral,
    QATConfig,
    QATModel,
    calibrate,
    convert,
    from_fp32,
    int8_apply,
    int8_dot_general,
    quantized_layers,
)
from qat.dot_general import INT8, lhs_rows_with_nan
from tft_jax import Linear
from tft_jax.lstm import LSTM

from .quantization_references import away_from_ties
from .tracing import recorded_traces

FEATURES, HIDDEN, OUT, BATCH = 5, 16, 3, 32
RNG = np.random.default_rng(31)


class MixedModel(nn.Module):
    """A quantized `Linear`, then a float `nn.Dense` head that never sees the hook."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        hidden = nn.tanh(Linear(HIDDEN, dot_general_cls=self.dot_general_cls, name="body")(x))
        return nn.Dense(OUT, name="head")(hidden)


class DenseMLP(nn.Module):
    """Two hooked `flax.linen.Dense` layers with dropout between them."""

    dot_general_cls: Any = None
    dropout_rate: float = 0.2

    @nn.compact
    def __call__(self, x, deterministic: bool | None = None):
        hidden = nn.relu(nn.Dense(HIDDEN, dot_general_cls=self.dot_general_cls)(x))
        hidden = nn.Dropout(self.dropout_rate, deterministic=deterministic)(hidden)
        return nn.Dense(OUT, dot_general_cls=self.dot_general_cls)(hidden)


def batches(count: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(BATCH, FEATURES)).astype(np.float32) for _ in range(count)]


@functools.cache
def quantized(model_cls: type, bits: int = 8):
    """`(qat_model, fp32 variables, calibrated QAT variables)`."""
    model = model_cls()
    x = batches()[0]
    # Flax's Dropout needs `deterministic` even in init; from_fp32 and calibrate add it.
    kwargs = {"deterministic": True} if model_cls is DenseMLP else {}
    fp32 = jax.jit(functools.partial(model.init, **kwargs))(jax.random.key(0), x)
    qat_model = QATModel(model, QATConfig(bits=bits, calibration_batches=2))
    qat_vars = calibrate(qat_model, from_fp32(fp32, qat_model, x), batches())
    return qat_model, fp32, qat_vars


def init_jitted(model: nn.Module, seed: int, *args: Any) -> Any:
    """`model.init(jax.random.key(seed), *args)` as one program: op by op it compiled every
    primitive apart. The arguments are closed over (Python flags stay Python; any model)."""
    return jax.jit(lambda key: model.init(key, *args))(jax.random.key(seed))


@functools.partial(jax.jit, static_argnums=0)
def fake_forward(qat_model, variables, x):
    kwargs = {"deterministic": True} if isinstance(qat_model.model, DenseMLP) else {}
    return qat_model.apply(variables, x, **kwargs)


@functools.partial(jax.jit, static_argnums=0)
def int8_forward(qat_model, variables, x):
    return int8_apply(qat_model, variables, x)


def test_convert_quantizes_the_hooked_layer_and_leaves_the_float_head_untouched():
    _, fp32, qat_vars = quantized(MixedModel)
    assert set(quantized_layers(qat_vars)) == {("body", "dot_general")}
    int8_vars = convert(qat_vars)
    assert int8_vars["params"]["body"]["kernel"].dtype == jnp.int8
    for name in ("kernel", "bias"):
        head = int8_vars["params"]["head"][name]
        assert head.dtype == jnp.float32
        np.testing.assert_array_equal(head, fp32["params"]["head"][name])
    assert set(int8_vars["int8"]) == {"body"}


def test_mixed_model_int8_output_matches_fake_quant_within_one_output_step():
    qat_model, _, qat_vars = quantized(MixedModel)
    x = batches(4)[3]
    fake = np.asarray(fake_forward(qat_model, qat_vars, x))
    integer = np.asarray(int8_forward(qat_model, convert(qat_vars), x))
    step = np.ptp(fake) / 255
    assert np.max(np.abs(integer - fake)) <= step
    # The head really is float: the same hidden state through the float head is the output.
    params = qat_vars["params"]
    body = jax.jit(Linear(HIDDEN).apply)({"params": params["body"]}, x)
    assert not np.allclose(
        np.tanh(body) @ params["head"]["kernel"] + params["head"]["bias"], fake, atol=1e-6
    ), "the body is fake-quantized, so the float body must differ"


def test_flax_dense_round_trips_through_qat_convert_and_int8():
    qat_model, fp32, qat_vars = quantized(DenseMLP)
    assert set(quantized_layers(qat_vars)) == {
        ("Dense_0", "dot_general"),
        ("Dense_1", "dot_general"),
    }
    # Same parameter tree as the FP32 model.
    assert jax.tree.structure(qat_vars["params"]) == jax.tree.structure(fp32["params"])
    int8_vars = convert(qat_vars)
    x = batches(4)[3]
    fake = np.asarray(fake_forward(qat_model, qat_vars, x))
    integer = np.asarray(int8_forward(qat_model, int8_vars, x))
    assert np.max(np.abs(integer - fake)) <= np.ptp(fake) / 255
    # Every hooked Dense contracts int8 codes into int32.
    jaxpr = jax.make_jaxpr(lambda v: int8_apply(qat_model, v, x))(int8_vars)
    integer_dots = [
        eqn
        for eqn in all_equations(jaxpr.jaxpr)
        if eqn.primitive.name == "dot_general"
        and [v.aval.dtype for v in eqn.invars] == [jnp.int8, jnp.int8]
        and eqn.outvars[0].aval.dtype == jnp.int32
    ]
    assert len(integer_dots) == 2


def all_equations(jaxpr):
    """Every equation of a jaxpr, including those of nested jaxprs (cond, pjit)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(item, "jaxpr", item)
                if hasattr(inner, "eqns"):
                    yield from all_equations(inner)


def test_a_4_bit_qat_model_converts_with_4_bit_weights():
    qat_model, _, qat_vars = quantized(MixedModel, bits=4)
    assert quantized_layers(qat_vars) == {("body", "dot_general"): 4}
    int8_vars = convert(qat_vars)
    codes = np.asarray(int8_vars["params"]["body"]["kernel"])
    kernel = np.asarray(qat_vars["params"]["body"]["kernel"], np.float64)
    # Symmetric 4-bit grid: scale max|w| / 7 per output channel, codes in [-8, 7].
    scale = np.abs(kernel).max(axis=0) / 7
    np.testing.assert_array_equal(codes, np.clip(np.round(kernel / scale), -8, 7))
    np.testing.assert_allclose(int8_vars["int8"]["body"]["dot_general"]["weight_scale"], scale)
    assert np.abs(codes).max() == 7
    x = batches(4)[3]
    fake = np.asarray(fake_forward(qat_model, qat_vars, x))
    integer = np.asarray(int8_forward(qat_model, int8_vars, x))
    assert np.max(np.abs(integer - fake)) <= np.ptp(fake) / 15


def test_a_bit_width_other_than_the_qat_config_is_an_error():
    _, _, qat_vars = quantized(MixedModel, bits=4)
    with pytest.raises(
        ValueError, match=r"bits=8 does not match the QAT model's QATConfig.bits \[4\]"
    ):
        convert(qat_vars, bits=8)
    assert convert(qat_vars, bits=np.int64(4)).keys() == convert(qat_vars).keys()  # as QATConfig
    eight_bit = QATModel(MixedModel(), QATConfig(bits=8))
    with pytest.raises(ValueError, match=r"\[4\]-bit QAT model, qat_model has QATConfig.bits=8"):
        int8_apply(eight_bit, convert(qat_vars), batches()[0])


def test_variables_without_quantized_layers_cannot_be_converted():
    _, fp32, _ = quantized(MixedModel)
    with pytest.raises(ValueError, match="no quantized layer"):
        convert(fp32)


def test_qat_model_needs_a_dot_general_cls_field():
    class Plain(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(x)

    with pytest.raises(TypeError, match=r"dot_general_cls field.*Plain has none"):
        QATModel(Plain())


def test_layout_settings_the_qat_model_does_not_use_are_announced_once(monkeypatch):
    # QATModel quantizes with its fixed layout; these QATConfig fields configure
    # stand-alone observers. Set on a model they were ignored without a word.
    import qat.config as qat_config_module

    monkeypatch.setattr(qat_config_module, "_ANNOUNCED_LAYOUTS", set())
    config = QATConfig(per_channel=True, observer="moving_average")
    message = r"QATModel quantizes with a fixed layout .* per_channel=True, observer='moving_avera"
    with pytest.warns(UserWarning, match=message) as caught:
        qat_model = QATModel(MixedModel(), config)
        x = batches()[0]
        fp32 = init_jitted(MixedModel(), 0, x)
        calibrate(qat_model, from_fp32(fp32, qat_model, x), [x])  # Flax clones the model
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        QATModel(MixedModel(), QATConfig(bits=4, averaging_constant=0.5))  # fields it uses


def test_inputs_of_another_shape_are_named_in_from_fp32_calibrate_and_int8_apply():
    # Before: from_fp32 blamed the parameters, and calibrate and int8_apply raised
    # Flax's ScopeParamShapeError, which is no ValueError.
    qat_model, fp32, qat_vars = quantized(MixedModel)
    narrow = batches()[0][:, :3]
    with pytest.raises(
        ValueError,
        match=r"parameter tree built on the sample inputs: body/kernel is \(5, 16\) float32, "
        r"the sample inputs make it \(3, 16\) float32",
    ):
        from_fp32(fp32, qat_model, narrow)
    with pytest.raises(ValueError, match=r"calibrate: the inputs of batch 1 do not fit the var"):
        calibrate(qat_model, qat_vars, [batches()[0], narrow])
    with pytest.raises(ValueError, match=r"int8_apply: the inputs do not fit the variables"):
        int8_apply(qat_model, convert(qat_vars), narrow)
    # Applying the QAT model itself raised Flax's ScopeParamShapeError.
    with pytest.raises(ValueError, match=r"the QAT model's inputs do not fit the variables"):
        qat_model.apply(qat_vars, narrow)


def test_disabled_quantization_is_the_fp32_model_exactly():
    model = MixedModel()
    x = batches()[0]
    fp32 = jax.jit(model.init)(jax.random.key(0), x)
    qat_model = QATModel(model, QATConfig(bits=None))
    qat_vars = from_fp32(fp32, qat_model, x)
    np.testing.assert_array_equal(
        fake_forward(qat_model, qat_vars, x), jax.jit(model.apply)(fp32, x)
    )


def test_a_hand_built_int8_contraction_under_another_name_is_told_where_to_look():
    qat_model, _, qat_vars = quantized(DenseMLP)
    by_class_name = functools.partial(Int8DotGeneral, config=qat_model.qat_config)
    with pytest.raises(ValueError, match=r"no int8 weight_scale for the layer at 'Dense_0/Int8"):
        DenseMLP(dot_general_cls=by_class_name).apply(
            convert(qat_vars), batches()[0], deterministic=True
        )
    # The factory names it as the QAT side does, and the variables are found.
    named = DenseMLP(dot_general_cls=int8_dot_general(qat_model.qat_config))
    np.testing.assert_allclose(
        named.apply(convert(qat_vars), batches()[0], deterministic=True),
        int8_forward(qat_model, convert(qat_vars), batches()[0]),
        rtol=1e-6,
        atol=1e-6,
    )


class MultiAxisDense(nn.Module):
    """`nn.DenseGeneral` contracted over other axes than the kernel's second-to-last alone."""

    features: tuple[int, ...]
    axis: tuple[int, ...]
    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        return nn.DenseGeneral(self.features, self.axis, dot_general_cls=self.dot_general_cls)(x)


@pytest.mark.parametrize(
    "features, axis, x_shape, contracted",
    [
        ((2, 4), (-1,), (4, 2), (0,)),  # (2, 2, 4): the input axis in front, shapes ambiguous
        ((3,), (-2, -1), (4, 2, 5), (0, 1)),  # (2, 5, 3): two input axes
        ((2, 3), (-2, -1), (4, 2, 5), (0, 1)),  # (2, 5, 2, 3): two of each
    ],
)
def test_a_kernel_contracted_over_other_axes_converts_and_runs_in_int8(
    features, axis, x_shape, contracted
):
    # convert quantized every kernel over axis -2; for these layers it wrote codes and
    # scales of the wrong channels, and int8_apply refused to run them.
    rng = np.random.default_rng(0)
    x = rng.normal(size=x_shape).astype(np.float32)
    model = MultiAxisDense(features, axis)
    qat_model = QATModel(model, QATConfig(bits=8))
    qat_vars = calibrate(qat_model, from_fp32(init_jitted(model, 0, x), qat_model, x), [x])
    int8_vars = convert(qat_vars)
    (layer,) = int8_vars["params"]
    kernel = np.asarray(qat_vars["params"][layer]["kernel"], np.float64)
    # Independent reference: per output channel, max|w| over the contracted axes.
    scale = np.max(np.abs(kernel), axis=contracted, keepdims=True) / 127.0
    np.testing.assert_array_equal(
        int8_vars["params"][layer]["kernel"], np.round(kernel / scale).astype(np.int8)
    )
    np.testing.assert_allclose(
        int8_vars[INT8][layer]["dot_general"]["weight_scale"], scale, rtol=1e-6
    )
    want = np.asarray(fake_forward(qat_model, qat_vars, x), np.float64)
    got = np.asarray(int8_apply(qat_model, int8_vars, x), np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_an_int8_scale_made_over_the_wrong_axes_is_refused():
    # int8 variables converted without the contraction's record (over axis -2):
    # with 2 input features the scale shapes agreed and the output was wrong.
    x = np.random.default_rng(0).normal(size=(4, 2)).astype(np.float32)
    model = MultiAxisDense((2, 4), (-1,))
    qat_model = QATModel(model, QATConfig(bits=8))
    qat_vars = calibrate(qat_model, from_fp32(init_jitted(model, 0, x), qat_model, x), [x])
    int8_vars = convert(qat_vars)
    (layer,) = int8_vars["params"]
    stale = int8_vars[INT8][layer]["dot_general"]["weight_scale"]
    int8_vars[INT8][layer]["dot_general"]["weight_scale"] = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match=r"contracts kernel axes \(0,\) .* convert the QAT"):
        int8_apply(qat_model, int8_vars, x)
    assert stale.shape == (1, 2, 4)


def test_int8_outputs_that_read_a_nan_input_are_nan_like_the_fake_quantized_ones():
    # A NaN has no integer code: without the mask its row came out finite and plausible.
    qat_model, _, qat_vars = quantized(DenseMLP)
    x = batches(1)[0].copy()
    x[2, 1] = np.nan
    want = np.asarray(fake_forward(qat_model, qat_vars, x))
    got = np.asarray(int8_forward(qat_model, convert(qat_vars), x))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[2]).all() and not np.isnan(np.delete(got, 2, axis=0)).any()


@pytest.mark.parametrize(
    "lhs_shape, rhs_shape, dimension_numbers",
    [
        ((4, 5), (5, 3), (((1,), (0,)), ((), ()))),
        ((2, 4, 5), (5, 3), (((2,), (0,)), ((), ()))),
        ((3, 4, 5), (3, 5, 6), (((2,), (1,)), ((0,), (0,)))),  # VariableLinear's layout
        ((4, 3, 5), (3, 5, 6), (((2,), (1,)), ((1,), (0,)))),  # batch axis not leading
        ((5, 2, 4), (2, 5, 3, 2), (((0,), (1,)), ((1,), (0,)))),
    ],
)
def test_nan_mask_marks_where_a_float_contraction_propagates_a_nan(
    lhs_shape, rhs_shape, dimension_numbers
):
    rng = np.random.default_rng(0)
    lhs = rng.normal(size=lhs_shape).astype(np.float32)
    lhs[rng.random(lhs_shape) < 0.1] = np.nan
    # Reference: a float contraction of the NaN pattern with a kernel of ones.
    poison = np.where(np.isnan(lhs), np.nan, 0.0).astype(np.float32)
    want = np.isnan(jax.lax.dot_general(poison, np.ones(rhs_shape, np.float32), dimension_numbers))
    got = lhs_rows_with_nan(jnp.asarray(lhs), dimension_numbers, len(rhs_shape))
    np.testing.assert_array_equal(np.broadcast_to(got, want.shape), want)
    assert want.any() and not want.all()


class FlaggedDense(nn.Module):
    """A hooked `nn.Dense` whose activation is chosen by a Python flag given by position."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x, squash: bool):
        y = nn.Dense(OUT, dot_general_cls=self.dot_general_cls)(x)
        return nn.tanh(y) if squash else y


def test_a_flag_given_by_position_stays_static_in_from_fp32_and_calibrate():
    # A bool inside a batch tuple used to be traced: `if squash` raised
    # TracerBoolConversionError instead of calibrating.
    x = batches(1)[0]
    model = FlaggedDense()
    qat_model = QATModel(model, QATConfig(bits=8))
    qat_vars = from_fp32(init_jitted(model, 0, x, True), qat_model, x, True)
    for squash in (True, False):
        calibrated = calibrate(qat_model, qat_vars, [(x, squash)])
        out = np.asarray(qat_model.apply(calibrated, x, squash))
        assert (np.abs(out).max() <= 1.0) == squash  # the flag reached the model


class NormalizedMLP(nn.Module):
    """Hooked `nn.Dense` layers around a BatchNorm: model state in `'batch_stats'`."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        hidden = nn.Dense(HIDDEN, dot_general_cls=self.dot_general_cls)(x)
        hidden = nn.BatchNorm(use_running_average=True)(hidden)
        return nn.Dense(OUT, dot_general_cls=self.dot_general_cls)(nn.relu(hidden))


@functools.cache
def normalized(bits: int | None):
    """`(qat_model, fp32 variables with trained-looking batch_stats, from_fp32's variables)`."""
    model = NormalizedMLP()
    x = batches(1)[0]
    fp32 = jax.jit(model.init)(jax.random.key(0), x)
    rng = np.random.default_rng(1)
    stats = fp32["batch_stats"]["BatchNorm_0"]
    fp32 = {
        **fp32,
        "batch_stats": {
            "BatchNorm_0": {
                "mean": rng.normal(size=stats["mean"].shape).astype(np.float32),
                "var": rng.uniform(0.5, 4.0, stats["var"].shape).astype(np.float32),
            }
        },
    }
    qat_model = QATModel(model, QATConfig(bits=bits))
    return qat_model, fp32, from_fp32(fp32, qat_model, x)


def test_from_fp32_keeps_the_models_own_state_so_disabled_qat_is_the_fp32_model():
    # Before: 'batch_stats' came back freshly initialised (mean 0, var 1).
    qat_model, fp32, qat_vars = normalized(None)
    jax.tree.map(np.testing.assert_array_equal, qat_vars["batch_stats"], fp32["batch_stats"])
    x = batches(2)[1]
    np.testing.assert_array_equal(
        fake_forward(qat_model, qat_vars, x), jax.jit(NormalizedMLP().apply)(fp32, x)
    )


def test_from_fp32_refuses_model_state_of_another_shape():
    qat_model, fp32, _ = normalized(8)
    stats = {"BatchNorm_0": {"mean": np.zeros(HIDDEN + 1, np.float32), "var": np.ones(HIDDEN)}}
    with pytest.raises(ValueError, match=r"fp32_variables\['batch_stats'\] does not match"):
        from_fp32({**fp32, "batch_stats": stats}, qat_model, batches(1)[0])


def test_convert_carries_the_models_own_state_into_int8_inference():
    # Before: convert dropped 'batch_stats' and int8_apply failed in Flax.
    qat_model, fp32, qat_vars = normalized(8)
    calibrated = calibrate(qat_model, qat_vars, batches(2))
    int8_vars = convert(calibrated)
    jax.tree.map(np.testing.assert_array_equal, int8_vars["batch_stats"], fp32["batch_stats"])
    x = batches(3)[2]
    fake = np.asarray(fake_forward(qat_model, calibrated, x))
    integer = np.asarray(int8_forward(qat_model, int8_vars, x))
    assert np.max(np.abs(integer - fake)) <= np.ptp(fake) / 255


def test_deterministic_given_by_position_is_not_given_twice():
    # Before: from_fp32, calibrate and int8_apply added deterministic=True as a
    # keyword too: "got multiple values for argument 'deterministic'".
    qat_model, fp32, by_keyword = quantized(DenseMLP)
    x = batches(1)[0]
    fresh = from_fp32(fp32, qat_model, x, True)
    calibrated = calibrate(qat_model, fresh, [(x, True) for x in batches()])
    jax.tree.map(np.testing.assert_array_equal, calibrated, by_keyword)
    int8_vars = convert(calibrated)
    np.testing.assert_allclose(
        int8_apply(qat_model, int8_vars, x, True),
        int8_forward(qat_model, int8_vars, x),
        rtol=1e-6,
        atol=1e-6,
    )


def test_from_fp32_of_an_equal_model_traces_nothing_again():
    """A refit builds a new, equal QAT model: its variables come from the compiled init."""
    x = batches()[0]
    _, fp32, _ = quantized(MixedModel)
    first = from_fp32(fp32, QATModel(MixedModel(), QATConfig(bits=8)), x)
    with recorded_traces() as traced:
        again = from_fp32(fp32, QATModel(MixedModel(), QATConfig(bits=8)), x)
    assert traced == []
    jax.tree.map(np.testing.assert_array_equal, again, first)


def test_lstm_initial_state_beyond_the_unit_range_is_quantized_not_clipped():
    # The recurrent quantizer's fixed [-1, 1] grid holds every h = o·tanh(c) but not a
    # given initial state (the TFT's: a static encoder's LayerNorm output); beyond it,
    # h0 was clipped (37% of the TFT's at width 16) and its gradient zeroed.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 3, FEATURES)).astype(np.float32)
    state = (
        (3.0 * rng.normal(size=(4, 8))).astype(np.float32),
        rng.normal(size=(4, 8)).astype(np.float32),
    )
    assert np.mean(np.abs(state[0]) > 1.0) > 0.5
    lstm = LSTM(8)
    fp32 = jax.jit(lstm.init)(jax.random.key(0), x, state)
    qat_model = QATModel(lstm, QATConfig(bits=8))
    qat_vars = calibrate(qat_model, from_fp32(fp32, qat_model, x, state), [(x, state)])
    expected, _ = jax.jit(lstm.apply)(fp32, x, state)
    fake, (hidden, _) = jax.jit(qat_model.apply)(qat_vars, x, state)
    # 8-bit weights and activations: each output within a few grid steps of FP32.
    np.testing.assert_allclose(fake, expected, atol=0.02)
    np.testing.assert_array_equal(hidden, fake[:, -1])
    integer, _ = jax.jit(functools.partial(int8_apply, qat_model))(convert(qat_vars), x, state)
    np.testing.assert_allclose(integer, fake, atol=1e-6)

    def first_outputs(h0):
        return jnp.sum(qat_model.apply(qat_vars, x, (h0, state[1]))[0][:, 0])

    gradient = np.asarray(jax.jit(jax.grad(first_outputs))(state[0]))
    assert np.all(gradient != 0.0)  # clipped elements had a zero straight-through gradient


class _Repeated(nn.Module):
    """`num_steps` hooked layers in a row: a Python int argument, static under jit."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x, num_steps: int = 1):
        for _ in range(num_steps):
            x = nn.relu(nn.Dense(x.shape[-1], dot_general_cls=self.dot_general_cls)(x))
        return x


def test_a_python_int_argument_stays_static_in_from_fp32_and_calibrate():
    # It was traced under their jit: `range(num_steps)` raised TracerIntegerConversionError.
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    fp32 = _Repeated()
    variables = init_jitted(fp32, 0, x, 2)
    model = QATModel(fp32, QATConfig(bits=8))
    for given in ((x, 2), (x,)):
        kwargs = {} if len(given) == 2 else {"num_steps": 2}
        qat_vars = from_fp32(variables, model, *given, **kwargs)
        assert jax.tree.map(jnp.shape, qat_vars["params"]) == jax.tree.map(
            jnp.shape, variables["params"]
        )
    calibrated = calibrate(model, qat_vars, [(x, 2)])
    stats = calibrated["quant_stats"]
    assert [stats[f"Dense_{i}"]["dot_general"]["num_batches"] for i in (0, 1)] == [1, 1]
    hidden = np.maximum(x @ variables["params"]["Dense_0"]["kernel"], 0)  # zero biases
    np.testing.assert_allclose(stats["Dense_1"]["dot_general"]["max"], hidden.max(), rtol=1e-2)
    out = model.apply(calibrated, x, 2)
    reference = jax.jit(lambda v: fp32.apply(v, x, 2))(variables)
    np.testing.assert_allclose(out, reference, atol=0.05)


class SharedLayerModel(nn.Module):
    """One hooked `nn.Dense` called twice per forward: on `x` and on `5 x`."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        shared = nn.Dense(OUT, dot_general_cls=self.dot_general_cls, name="shared")
        return shared(x) + shared(5.0 * x)


def test_a_layer_called_twice_per_forward_observes_the_range_of_both_calls():
    # Each call was observed as a batch of its own: on the first forward the first call
    # set the range and the second moved it by 1% (the moving average), so the 5x
    # activations of the second call were clipped to a fifth of their range.
    config = QATConfig(bits=8, averaging_constant=0.25)
    qat_model = QATModel(SharedLayerModel(), config)
    data = batches(2)
    fp32 = init_jitted(SharedLayerModel(), 0, data[0])
    variables = from_fp32(fp32, qat_model, data[0])
    step = jax.jit(lambda v, x: qat_model.apply(v, x, calibrate=True, mutable=["quant_stats"])[1])
    low = high = None
    for x in data:  # float64 reference: one moving-average update per forward
        both = np.concatenate([x, 5.0 * x]).astype(np.float64)
        if low is None:
            low, high = both.min(), both.max()
        else:
            low += 0.25 * (both.min() - low)
            high += 0.25 * (both.max() - high)
        variables = {**variables, **step(variables, x)}
        stats = variables["quant_stats"]["shared"]["dot_general"]
        np.testing.assert_allclose(float(stats["min"]), low, rtol=1e-6)
        np.testing.assert_allclose(float(stats["max"]), high, rtol=1e-6)
    assert int(stats["num_batches"]) == 2  # one update per forward, not per call


# A hooked dense layer in integers against float64.


@functools.partial(jax.jit, static_argnums=0)
def _fake_and_int8(qat_model, qat_variables, int8_variables, x):
    """The fake-quantized and the int8 forward, compiled once (op by op, each op compiles)."""
    return qat_model.apply(qat_variables, x), int8_apply(qat_model, int8_variables, x)


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


# The full flow on small user models: a conv + attention model, layers under `nn.scan`.


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


class PartlyMappedStack(nn.Module):
    """`ScannedLayer` under `nn.scan` mapping only the collections in `mapped`."""

    mapped: tuple[str, ...]
    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        axes = dict.fromkeys(self.mapped, 0)
        scan = nn.scan(ScannedLayer, variable_axes=axes, split_rngs={"params": True}, length=3)
        return scan(dot_general_cls=self.dot_general_cls)(x, None)[0]


@pytest.mark.parametrize(
    "mapped, learnable_scale, hidden",
    [
        (("params",), False, "'quant_stats'"),
        (("params", "quant_stats", "int8"), True, "'quant_params'"),
    ],
)
def test_a_lift_that_does_not_map_the_quantization_collections_is_named(
    mapped, learnable_scale, hidden
):
    # The body of the scan cannot see the collections it does not map: from_fp32 failed
    # deep in Flax with ScopeCollectionNotFound ('quant_stats' ... is empty).
    x = RNG.normal(size=(8, 4)).astype(np.float32)
    model = PartlyMappedStack(mapped)
    qat_model = QATModel(model, QATConfig(bits=8, learnable_scale=learnable_scale))
    fp32 = init_jitted(model, 0, x)
    with pytest.raises(
        ValueError,
        match=rf"ScanScannedLayer_0/Dense_0/dot_general: .*cannot create its {hidden} "
        r"variables.*nn\.scan, nn\.vmap.*'quant_stats', 'quant_params' and 'int8' in its "
        r"variable_axes",
    ):
        from_fp32(fp32, qat_model, x)


class ActivationProduct(nn.Module):
    """A hooked dense layer, then the hook at the model's root for `h h^T` (no weight)."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4, dot_general_cls=self.dot_general_cls)(x)
        contract = self.dot_general_cls() if self.dot_general_cls else lax.dot_general
        return contract(h, h, (((1,), (1,)), ((), ())))


class VectorWeight(nn.Module):
    """The hook at the model's root contracting a 1-axis `kernel`."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", nn.initializers.normal(), (x.shape[-1],))
        contract = self.dot_general_cls() if self.dot_general_cls else lax.dot_general
        return contract(x, kernel, (((1,), (0,)), ((), ())))


@pytest.mark.parametrize(
    "model, message",
    [
        (
            ActivationProduct(),
            r"contraction '<root>/dot_general' has no 'kernel' param beside it \(in '<root>'\): "
            r"its second operand is not a 'kernel' parameter",
        ),
        (VectorWeight(), r"contraction '<root>/dot_general' contracts a 'kernel' of shape \(4,\)"),
    ],
    ids=["activation_product", "vector_kernel"],
)
def test_convert_names_a_contraction_it_cannot_convert(model, message):
    # The message named the layer by its parent's path, empty at the model's root
    # ("quantized layer  needs a 'kernel' param"), and did not say why there was none.
    x = RNG.normal(size=(6, 4)).astype(np.float32)
    qat_model = QATModel(model, QATConfig(bits=8))
    qat_vars = from_fp32(init_jitted(model, 0, x), qat_model, x)
    with pytest.raises(ValueError, match=message):
        convert(qat_vars)


class VmappedEnsemble(nn.Module):
    """Three copies of one hooked dense layer under `nn.vmap`, each fed its own input."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        axes = {name: 0 for name in ("params", "quant_stats", "quant_params", "int8")}
        copies = nn.vmap(
            nn.Dense, variable_axes=axes, split_rngs={"params": True}, in_axes=0, axis_size=3
        )
        return copies(4, dot_general_cls=self.dot_general_cls)(x)


def test_layers_under_nn_vmap_calibrate_per_copy_and_run_jitted():
    # Before: any jitted forward of a vmapped hooked layer failed in the lowering of
    # the scale's division (an IndexError), so `calibrate` (jitted) never worked.
    x = RNG.normal(size=(5, 4)).astype(np.float32)
    inputs = np.stack([x, 2 * x, 3 * x])  # (3, 5, 4): copy i sees (i + 1) x
    model = VmappedEnsemble()
    qat_model = QATModel(model, QATConfig(bits=8))
    qat_vars = calibrate(
        qat_model, from_fp32(init_jitted(model, 0, inputs), qat_model, inputs), [inputs]
    )
    observed = qat_vars["quant_stats"]["VmapDense_0"]["dot_general"]
    np.testing.assert_array_equal(np.asarray(observed["min"]), inputs.min(axis=(1, 2)))
    np.testing.assert_array_equal(np.asarray(observed["max"]), inputs.max(axis=(1, 2)))
    eager = qat_model.apply(qat_vars, inputs)
    np.testing.assert_allclose(
        np.asarray(jax.jit(qat_model.apply)(qat_vars, inputs)), eager, atol=1e-6
    )


class ListMLP(nn.Module):
    """Flax's usual MLP with its widths in a list: the module cannot be hashed."""

    features: Any
    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        for width in self.features:
            x = nn.relu(nn.Dense(width, dot_general_cls=self.dot_general_cls)(x))
        return x


def test_a_model_with_an_unhashable_field_goes_through_the_whole_flow():
    # Before: from_fp32 and calibrate jit their helpers with the model static, and a
    # list field made that "Non-hashable static arguments are not supported".
    x = RNG.normal(size=(6, 3)).astype(np.float32)
    model = ListMLP(features=[5, 2])
    qat_model = QATModel(model, QATConfig(bits=8))
    with pytest.raises(TypeError):
        hash(qat_model)
    qat_vars = calibrate(qat_model, from_fp32(init_jitted(model, 1, x), qat_model, x), [x])
    observed = qat_vars["quant_stats"]["Dense_0"]["dot_general"]
    assert (float(observed["min"]), float(observed["max"])) == (x.min(), x.max())
    fake = np.asarray(qat_model.apply(qat_vars, x))
    integer = np.asarray(int8_apply(qat_model, convert(qat_vars), x))
    np.testing.assert_allclose(integer, fake, atol=1e-5 * np.abs(fake).max())
