"""`QATDotGeneral` and `Int8DotGeneral` inside bare `Linear`/`VariableLinear` layers."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from qat import Int8DotGeneral, QATConfig, QATDotGeneral
from qat.dot_general import quantize_weight, rhs_channels_to_output
from tft_jax.linear import Linear, VariableLinear

from .quantization_references import reference_gradients

EPS = np.finfo(np.float32).eps
INT8_CONFIG = QATConfig()
RNG = np.random.default_rng(0)
X = RNG.normal(size=(3, 5)).astype(np.float32)
X2 = (1.5 * RNG.normal(size=(3, 5)) + 0.3).astype(np.float32)
XV = RNG.normal(size=(2, 3, 5)).astype(np.float32)  # (B, V, I) for VariableLinear


def qat_linear(cfg=INT8_CONFIG, calibrate=False, **kwargs):
    return Linear(
        4,
        dot_general_cls=functools.partial(QATDotGeneral, config=cfg, calibrate=calibrate),
        **kwargs,
    )


def qat_variable_linear(cfg=INT8_CONFIG, calibrate=False):
    cls = functools.partial(QATDotGeneral, config=cfg, calibrate=calibrate)
    return VariableLinear(3, 4, dot_general_cls=cls)


def reference_weight(kernel, contracting_axis, bits=8):
    """Per-channel symmetric fake quantization with scale max|w| / qmax, in numpy."""
    qmax = 2 ** (bits - 1) - 1
    scale = np.maximum(np.abs(kernel).max(axis=contracting_axis, keepdims=True) / qmax, EPS)
    return np.clip(np.round(kernel / scale), -qmax - 1, qmax) * scale


def reference_activation(x, low, high, bits=8):
    """Per-tensor affine fake quantization of x on the range [low, high] (widened to 0)."""
    f32 = np.float32
    qmax = 2**bits - 1
    low, high = min(f32(low), f32(0)), max(f32(high), f32(0))
    scale = max((high - low) / f32(qmax), f32(EPS))
    zero_point = np.clip(-np.round(low / scale), 0, qmax)
    return (
        (np.clip(np.round(x / scale) + zero_point, 0, qmax) - zero_point) * scale,
        scale,
        zero_point,
    )


def init(module, x):
    return jax.jit(module.init)(jax.random.key(0), x)


def test_disabled_quantization_is_exactly_lax_dot_general():
    plain = Linear(4)
    variables = init(plain, X)
    for calibrate in (False, True):
        module = qat_linear(QATConfig(bits=None), calibrate=calibrate)
        assert jax.tree.structure(init(module, X)) == jax.tree.structure(variables)
        np.testing.assert_array_equal(
            np.asarray(module.apply(variables, X)), np.asarray(plain.apply(variables, X))
        )


def test_weights_are_fake_quantized_per_output_channel_before_any_calibration():
    module = qat_linear()
    variables = init(module, X)
    kernel = np.asarray(variables["params"]["kernel"])
    expected = X @ reference_weight(kernel, 0) + np.asarray(variables["params"]["bias"])
    np.testing.assert_allclose(
        np.asarray(module.apply(variables, X)), expected, rtol=1e-6, atol=1e-6
    )


def test_variable_linear_weights_are_quantized_per_variable_and_feature():
    module = qat_variable_linear()
    variables = init(module, XV)
    kernel = np.asarray(variables["params"]["kernel"])  # (V, I, F)
    quantized = reference_weight(kernel, 1)
    expected = np.einsum("bvi,vif->bvf", XV, quantized) + np.asarray(variables["params"]["bias"])
    np.testing.assert_allclose(
        np.asarray(module.apply(variables, XV)), expected, rtol=1e-6, atol=1e-6
    )


def test_kernel_gradient_is_straight_through_for_every_weight():
    # scale = max|w| / qmax puts every weight on the grid, so the STE mask is 1 everywhere.
    module = qat_linear()
    variables = init(module, X)
    cotangent = RNG.normal(size=(3, 4)).astype(np.float32)

    def loss(params):
        return jnp.sum(
            module.apply(
                {"params": params, **{k: v for k, v in variables.items() if k != "params"}}, X
            )
            * cotangent
        )

    grads = jax.jit(jax.grad(loss))(variables["params"])  # one program, not one per op
    np.testing.assert_allclose(np.asarray(grads["kernel"]), X.T @ cotangent, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(grads["kernel"]) != 0.0)


def test_calibrate_without_mutable_quant_stats_raises_naming_it():
    module = qat_linear(calibrate=True)
    variables = init(module, X)
    with pytest.raises(ValueError, match="mutable=\\['quant_stats'\\]"):
        module.apply(variables, X)


def test_first_batch_sets_the_range_then_the_moving_average_follows():
    module = qat_linear(calibrate=True)
    variables = init(module, X)
    stats = variables["quant_stats"]["dot_general"]
    assert int(stats["num_batches"]) == 0
    _, updates = module.apply(variables, X, mutable=["quant_stats"])
    variables = {**variables, **updates}
    stats = variables["quant_stats"]["dot_general"]
    assert (float(stats["min"]), float(stats["max"])) == (X.min(), X.max())
    _, updates = module.apply(variables, X2, mutable=["quant_stats"])
    stats = updates["quant_stats"]["dot_general"]
    np.testing.assert_allclose(
        float(stats["min"]), X.min() + 0.01 * (X2.min() - X.min()), rtol=1e-6
    )
    np.testing.assert_allclose(
        float(stats["max"]), X.max() + 0.01 * (X2.max() - X.max()), rtol=1e-6
    )
    assert int(stats["num_batches"]) == 2


def test_calibrate_false_freezes_the_observer():
    calibrating = qat_linear(calibrate=True)
    variables = init(calibrating, X)
    _, updates = calibrating.apply(variables, X, mutable=["quant_stats"])
    variables = {**variables, **updates}
    _, frozen = qat_linear().apply(variables, X2 * 10, mutable=["quant_stats"])
    jax.tree.map(np.testing.assert_array_equal, frozen["quant_stats"], variables["quant_stats"])


def test_calibrated_forward_matches_numpy_fake_quantization_of_both_operands():
    calibrating = qat_linear(calibrate=True)
    variables = init(calibrating, X)
    _, updates = calibrating.apply(variables, X, mutable=["quant_stats"])
    variables = {**variables, **updates}
    x_quantized, _, _ = reference_activation(X2, X.min(), X.max())
    kernel = np.asarray(variables["params"]["kernel"])
    expected = x_quantized @ reference_weight(kernel, 0) + np.asarray(variables["params"]["bias"])
    np.testing.assert_allclose(
        np.asarray(qat_linear().apply(variables, X2)), expected, rtol=1e-5, atol=1e-6
    )


def test_known_input_bounds_quantize_from_the_start_and_keep_no_observer():
    module = qat_linear(input_bounds=(-1.0, 1.0))
    x = np.tanh(X2)
    variables = init(module, x)
    assert set(variables) == {"params", "quant_stats"}
    # Only the bit-width marker by which convert finds the layer.
    assert jax.tree.map(int, variables["quant_stats"]) == {"dot_general": {"bits": 8}}
    x_quantized, _, _ = reference_activation(x, -1.0, 1.0)
    kernel = np.asarray(variables["params"]["kernel"])
    expected = x_quantized @ reference_weight(kernel, 0) + np.asarray(variables["params"]["bias"])
    np.testing.assert_allclose(
        np.asarray(module.apply(variables, x)), expected, rtol=1e-5, atol=1e-6
    )


def test_learnable_step_size_lives_outside_params_and_gets_the_lsq_gradient():
    cfg = QATConfig(learnable_scale=True)
    variables = init(qat_linear(cfg, calibrate=True), X)
    plain = init(Linear(4), X)
    assert jax.tree.structure(variables["params"]) == jax.tree.structure(plain["params"])
    assert float(variables["quant_params"]["dot_general"]["scale_offset"]) == 0.0
    _, updates = qat_linear(cfg, calibrate=True).apply(variables, X, mutable=["quant_stats"])
    variables = {**variables, **updates}
    cotangent = RNG.normal(size=(3, 4)).astype(np.float32)

    def loss(quant_params):
        return jnp.sum(
            qat_linear(cfg).apply({**variables, "quant_params": quant_params}, X2) * cotangent
        )

    grad = jax.jit(jax.grad(loss))(variables["quant_params"])["dot_general"]["scale_offset"]
    _, scale, zero_point = reference_activation(X2, X.min(), X.max())
    kernel_quantized = reference_weight(np.asarray(variables["params"]["kernel"]), 0)
    d_activation = cotangent @ kernel_quantized.T
    expected = reference_gradients(
        X2, scale, zero_point, 0, 255, d_activation, 1 / np.sqrt(X2.size * 255)
    )[1]
    np.testing.assert_allclose(float(grad), expected, rtol=1e-4, atol=1e-6)
    assert float(grad) != 0.0


def test_bfloat16_layer_stays_bfloat16_and_finite():
    module = qat_linear(dtype=jnp.bfloat16)
    variables = init(module, X)
    y = module.apply(variables, X)
    assert y.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(y, np.float32)))


@pytest.mark.parametrize(
    ("lhs_shape", "rhs_shape", "dimension_numbers"),
    [
        ((3, 5), (5, 4), (((1,), (0,)), ((), ()))),
        ((2, 3, 5), (3, 5, 4), (((2,), (1,)), ((1,), (0,)))),
        ((3, 2, 5), (4, 5, 3), (((2,), (1,)), ((0,), (2,)))),
        ((2, 6, 5), (5, 4, 7), (((2,), (0,)), ((), ()))),
    ],
)
def test_kernel_channel_values_broadcast_onto_the_right_output_axes(
    lhs_shape, rhs_shape, dimension_numbers
):
    lhs = RNG.normal(size=lhs_shape).astype(np.float32)
    rhs = RNG.normal(size=rhs_shape).astype(np.float32)
    contracting = dimension_numbers[0][1]
    channel_shape = tuple(n for axis, n in enumerate(rhs_shape) if axis not in contracting)
    values = RNG.uniform(0.5, 2.0, channel_shape).astype(np.float32)
    scaled_rhs = rhs * np.expand_dims(values, contracting)
    expected = lax.dot_general(lhs, scaled_rhs, dimension_numbers)
    got = lax.dot_general(lhs, rhs, dimension_numbers) * rhs_channels_to_output(
        values, dimension_numbers, lhs.ndim, rhs.ndim
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)


def int8_variables(variables, contracting_axis):
    kernel, scale = quantize_weight(variables["params"]["kernel"], (contracting_axis,), 8)
    return {
        **variables,
        "params": {**variables["params"], "kernel": kernel},
        "int8": {"dot_general": {"weight_scale": jnp.squeeze(scale, contracting_axis)}},
    }


def power_of_two_setup(module, x, kernel_shape, contracting_axis):
    """Variables whose weight and activation scales are powers of two (exact arithmetic)."""
    variables = init(module, x)
    codes = RNG.integers(-127, 128, kernel_shape)
    # Every channel reaches |code| = 127, so its scale is exactly 2^-e.
    first = [slice(None)] * len(kernel_shape)
    first[contracting_axis] = 0
    codes[tuple(first)] = 127
    exponents = RNG.integers(2, 6, codes.max(axis=contracting_axis, keepdims=True).shape)
    kernel = (codes * 2.0**-exponents).astype(np.float32)
    stats = {
        "min": np.float32(-8.0),
        "max": np.float32(7.9375),
        "num_batches": np.int32(1),
    }  # scale 1/16
    return {
        **variables,
        "params": {**variables["params"], "kernel": kernel},
        "quant_stats": {"dot_general": stats},
    }


@pytest.mark.parametrize("variable", [False, True])
def test_int8_matmul_equals_fake_quant_exactly_with_power_of_two_scales(variable):
    int8_cls = functools.partial(Int8DotGeneral, config=QATConfig())
    if variable:
        module, x, shape, axis = qat_variable_linear(), XV * 3, (3, 5, 4), 1
        integer_module = VariableLinear(3, 4, dot_general_cls=int8_cls)
    else:
        module, x, shape, axis = qat_linear(), X * 3, (5, 4), 0
        integer_module = Linear(4, dot_general_cls=int8_cls)
    variables = power_of_two_setup(module, x, shape, axis)
    fake = module.apply(variables, x)
    integer = integer_module.apply(int8_variables(variables, axis), x)
    np.testing.assert_array_equal(np.asarray(integer), np.asarray(fake))


@pytest.mark.parametrize("calibrated", [False, True])
def test_int8_matmul_agrees_with_fake_quant_on_random_weights(calibrated):
    module = qat_linear(calibrate=True)
    variables = init(module, X)
    if calibrated:
        _, updates = module.apply(variables, X, mutable=["quant_stats"])
        variables = {**variables, **updates}
    fake = qat_linear().apply(variables, X2)
    integer_module = Linear(
        4, dot_general_cls=functools.partial(Int8DotGeneral, config=QATConfig())
    )
    integer = integer_module.apply(int8_variables(variables, 0), X2)
    np.testing.assert_allclose(np.asarray(integer), np.asarray(fake), rtol=1e-5, atol=1e-5)


def test_int8_contraction_multiplies_int8_by_int8_into_int32():
    module = qat_linear(calibrate=True)
    variables = init(module, X)
    _, updates = module.apply(variables, X, mutable=["quant_stats"])
    converted = int8_variables({**variables, **updates}, 0)
    integer_module = Linear(
        4, dot_general_cls=functools.partial(Int8DotGeneral, config=QATConfig())
    )
    jaxpr = jax.make_jaxpr(integer_module.apply)(converted, X2)
    dots = [
        eqn
        for eqn in _all_equations(jaxpr.jaxpr)
        if eqn.primitive.name == "dot_general"
        and [v.aval.dtype for v in eqn.invars] == [jnp.int8, jnp.int8]
    ]
    assert dots and all(eqn.outvars[0].aval.dtype == jnp.int32 for eqn in dots)


def _all_equations(jaxpr):
    """Every equation of a jaxpr, including those of nested jaxprs (cond branches, pjit)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in _sub_jaxprs(eqn):
            yield from _all_equations(sub)


def _sub_jaxprs(eqn):
    """The jaxprs held in an equation's parameters."""
    for value in eqn.params.values():
        values = value if isinstance(value, tuple | list) else (value,)
        for item in values:
            if hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                yield item.jaxpr
            elif hasattr(item, "eqns"):
                yield item


def test_int8_layer_rejects_a_wide_integer_kernel():
    variables = init(qat_linear(), X)
    integer_module = Linear(
        4, dot_general_cls=functools.partial(Int8DotGeneral, config=QATConfig())
    )
    kernel = jnp.asarray(variables["params"]["kernel"] * 100, jnp.int32)
    params = {**variables["params"], "kernel": kernel}
    with pytest.raises(TypeError, match=r"int8 kernel made by qat\.convert"):
        integer_module.apply({**variables, "params": params, "int8": {}}, X)


@pytest.mark.parametrize("bounds", [(0.0, np.inf), (-np.inf, 1.0)])
@pytest.mark.parametrize("use_jit", [False, True])
def test_non_finite_input_bounds_are_refused_naming_them(bounds, use_jit):
    # Before: an infinite bound made the activation scale inf and, under jit,
    # every output NaN (outside jit a "scale must be finite" from deep inside).
    module = qat_linear(input_bounds=bounds)
    initialize = jax.jit(module.init) if use_jit else module.init
    with pytest.raises(ValueError, match=r"lhs_bounds must be finite with low < high"):
        initialize(jax.random.key(0), X)


def test_int8_layer_refuses_non_finite_input_bounds():
    converted = int8_variables(init(qat_linear(), X), 0)
    int8_cls = functools.partial(Int8DotGeneral, config=QATConfig())
    module = Linear(4, dot_general_cls=int8_cls, input_bounds=(-1.0, np.inf))
    with pytest.raises(ValueError, match=r"lhs_bounds must be finite with low < high"):
        jax.jit(module.apply)(converted, X)


@pytest.mark.parametrize("flag", ["yes", "", 1, None])
def test_qat_dot_general_refuses_a_calibrate_flag_that_is_not_a_bool(flag):
    # Before: any value was kept, and a truthy one (the string "False" too) calibrated.
    from qat import qat_dot_general

    with pytest.raises(TypeError, match=r"qat_dot_general: calibrate must be a bool, got "):
        qat_dot_general(INT8_CONFIG, calibrate=flag)
    for accepted in (True, False, np.True_, np.bool_(False)):
        assert qat_dot_general(INT8_CONFIG, calibrate=accepted) is not None


def test_a_traced_calibrate_flag_is_refused_naming_it():
    # It passed the check, then failed reading its truth with JAX's
    # TracerBoolConversionError, which does not name the argument.
    from qat import qat_dot_general

    def build(flag):
        qat_dot_general(INT8_CONFIG, calibrate=flag)
        return flag

    with pytest.raises(TypeError, match=r"calibrate must be a concrete bool, got a traced value"):
        jax.jit(build)(True)
