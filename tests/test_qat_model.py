"""The quantization-aware TFT: FP32 parameter tree, calibration, gradients, int8 inference."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from qat import (
    QATConfig,
    QATTemporalFusionTransformer,
    calibrate,
    convert,
    from_fp32,
    int8_apply,
    model_size,
)
from qat.model import tree_bytes
from tft_jax import TemporalFusionTransformer
from tft_jax.losses import quantile_loss

from .qat_tiny_tft import BATCH, CONFIG, INPUTS, QAT_CONFIG, fp32_variables, qat_setup, shape_args

TARGET = np.random.default_rng(9).normal(size=(BATCH, 2)).astype(np.float32)


@functools.partial(jax.jit, static_argnums=0)
def forward(model, variables, inputs):
    return model.apply(variables, **inputs, deterministic=True)


@functools.partial(jax.jit, static_argnums=0, static_argnames="numpy_bool")
def forward_at_calibrate_false(model, variables, inputs, *, numpy_bool):
    """The deterministic forward given `calibrate=np.False_` or `calibrate=False`, jitted.

    The flag goes to `apply` as written: `numpy_bool` (not the flag, which equals False
    and hashes as it does) keys the trace, so each form of the flag is traced by itself.
    """
    return model.apply(
        variables, **inputs, deterministic=True, calibrate=np.False_ if numpy_bool else False
    )


@functools.partial(jax.jit, static_argnums=0)
def loss_and_grads(qat_model, variables, inputs):
    """Quantile loss, output, quant_stats after the call, grads w.r.t. params (+ quant_params)."""
    trainable = {k: v for k, v in variables.items() if k in ("params", "quant_params")}

    def loss(trainable):
        output, state = qat_model.apply(
            {**variables, **trainable},
            **inputs,
            deterministic=True,
            calibrate=False,
            mutable=["quant_stats"],
        )
        return quantile_loss(output.quantiles, TARGET, CONFIG.quantiles), (output, state)

    (value, (output, state)), grads = jax.value_and_grad(loss, has_aux=True)(trainable)
    return value, output, state, grads


@functools.partial(jax.jit, static_argnums=0)
def step_size_grads(qat_model, variables, inputs):
    """Grads of the quantile loss w.r.t. `'quant_params'` alone (no weight gradients to compile)."""

    def loss(quant_params):
        output = qat_model.apply(
            {**variables, "quant_params": quant_params}, **inputs, deterministic=True
        )
        return quantile_loss(output.quantiles, TARGET, CONFIG.quantiles)

    return jax.grad(loss)(variables["quant_params"])


@functools.partial(jax.jit, static_argnums=0)
def int8_forward(qat_model, int8_variables, inputs):
    return int8_apply(qat_model, int8_variables, **inputs)


def flat(tree):
    return traverse_util.flatten_dict(tree, sep="/")


def test_qat_params_tree_is_the_fp32_tree_and_from_fp32_keeps_the_values():
    model, fresh, _ = qat_setup()
    fp32 = fp32_variables()["params"]
    qat_shapes = jax.eval_shape(
        model.init,
        {"params": jax.random.key(1)},
        *shape_args(INPUTS[0])[0],
        **shape_args(INPUTS[0])[1],
    )["params"]
    assert jax.tree.map(lambda leaf: leaf.shape, qat_shapes) == jax.tree.map(jnp.shape, fp32)
    assert set(fresh) == {"params", "quant_stats"}
    for path, leaf in flat(fp32).items():
        np.testing.assert_array_equal(np.asarray(flat(fresh["params"])[path]), np.asarray(leaf))
    stats = flat(fresh["quant_stats"])
    assert stats and all(
        int(value) == 0 for path, value in stats.items() if path.endswith("num_batches")
    )


def test_observers_sit_on_every_unbounded_dense_layer_and_not_on_the_lstm_recurrence():
    _, fresh, _ = qat_setup()
    kernels = {path[: -len("/kernel")] for path in flat(fresh["params"]) if path.endswith("kernel")}
    observed = {
        path[: -len("/dot_general/num_batches")]
        for path in flat(fresh["quant_stats"])
        if path.endswith("num_batches")
    }
    marked = {
        path[: -len("/dot_general/bits")]
        for path, value in flat(fresh["quant_stats"]).items()
        if path.endswith("bits") and int(value) == QAT_CONFIG.bits
    }
    recurrent = {path for path in kernels if path.endswith("cell/recurrent")}
    assert recurrent and observed == kernels - recurrent
    # Every quantized layer, the bounded recurrence included, carries its bit width.
    assert marked == kernels


def test_disabled_quantization_reproduces_fp32_outputs_exactly():
    model = QATTemporalFusionTransformer(CONFIG, QATConfig(bits=None))
    args, kwargs = shape_args(INPUTS[1])
    variables = from_fp32(fp32_variables(), model, *args, **kwargs)
    expected = forward(TemporalFusionTransformer(CONFIG), fp32_variables(), INPUTS[1])
    got = forward(model, variables, INPUTS[1])
    jax.tree.map(np.testing.assert_array_equal, got, expected)


def test_disabled_quantization_variables_make_a_train_state_of_the_fp32_params():
    # from_fp32 gives an empty 'quant_stats', which the model's init does not make:
    # create_train_state refused the variables for holding it.
    from tft_jax.train import Batch, create_train_state, make_optimizer

    model = QATTemporalFusionTransformer(CONFIG, QATConfig(bits=None))
    args, kwargs = shape_args(INPUTS[1])
    variables = from_fp32(fp32_variables(), model, *args, **kwargs)
    batch = Batch(*args, **kwargs, target=TARGET)
    state = create_train_state(
        model, make_optimizer(1e-3), jax.random.key(0), batch, variables=variables
    )
    jax.tree.map(np.testing.assert_array_equal, state.params, fp32_variables()["params"])
    with pytest.raises(ValueError, match=r"must hold the collections \['params'\], got \['par"):
        create_train_state(  # a collection that holds something is still refused
            model, make_optimizer(1e-3), jax.random.key(0), batch,
            variables={**variables, "quant_stats": {"x": np.zeros(1)}},
        )  # fmt: skip


def test_calibrate_true_without_mutable_quant_stats_raises_naming_it():
    model, fresh, _ = qat_setup()
    with pytest.raises(ValueError, match="mutable=\\['quant_stats'\\]"):
        model.apply(fresh, **INPUTS[0], calibrate=True)


def test_calibration_stops_after_calibration_batches_and_tracks_the_moving_average():
    _, _, calibrated = qat_setup()
    stats = calibrated["quant_stats"]["quantile_head"]["dot_general"]
    assert int(stats["num_batches"]) == QAT_CONFIG.calibration_batches
    for path, value in flat(calibrated["quant_stats"]).items():
        if path.endswith("num_batches"):
            # One update per forward, the known-input embedding's too, though it runs
            # twice (history and horizon): it counted 4 and averaged the two ranges.
            assert int(value) == QAT_CONFIG.calibration_batches, path
    # The static prescaler sees the raw static input: its range is the closed form.
    static = calibrated["quant_stats"]["static_embedding"]["prescaler"]["dot_general"]
    first, second = INPUTS[0]["static"], INPUTS[1]["static"]
    c = QAT_CONFIG.averaging_constant
    np.testing.assert_allclose(
        float(static["min"]), first.min() + c * (second.min() - first.min()), rtol=1e-6
    )
    np.testing.assert_allclose(
        float(static["max"]), first.max() + c * (second.max() - first.max()), rtol=1e-6
    )
    # The known prescaler sees the known inputs of the history and of the horizon: the
    # range of both, as one batch per forward.
    known = calibrated["quant_stats"]["known_embedding"]["prescaler"]["dot_general"]
    first, second = (
        np.concatenate([inputs["known_history"].ravel(), inputs["future"].ravel()])
        for inputs in INPUTS[:2]
    )
    np.testing.assert_allclose(
        float(known["min"]), first.min() + c * (second.min() - first.min()), rtol=1e-6
    )
    np.testing.assert_allclose(
        float(known["max"]), first.max() + c * (second.max() - first.max()), rtol=1e-6
    )


def test_training_forward_freezes_observers_and_every_param_gets_a_nonzero_gradient():
    model, _, calibrated = qat_setup()
    loss, output, state, grads = loss_and_grads(model, calibrated, INPUTS[2])
    assert np.isfinite(float(loss))
    for leaf in jax.tree.leaves(output):
        assert np.all(np.isfinite(np.asarray(leaf)))
    jax.tree.map(np.testing.assert_array_equal, state["quant_stats"], calibrated["quant_stats"])
    # Norms on the host (op by op, each leaf shape would compile its own kernels).
    norms = {
        path: float(np.linalg.norm(np.asarray(g))) for path, g in flat(grads["params"]).items()
    }
    assert norms.keys() == flat(calibrated["params"]).keys()
    zero = [path for path, norm in norms.items() if not norm > 0.0]
    assert not zero, f"zero gradient through the fake quantizers: {zero}"


def test_calibrated_fake_quantization_stays_close_to_fp32_on_the_calibration_data():
    model, fresh, _ = qat_setup()
    calibrated = calibrate(model, fresh, [INPUTS[2]])
    fp32 = np.asarray(
        forward(TemporalFusionTransformer(CONFIG), fp32_variables(), INPUTS[2]).quantiles
    )
    _, output, _, _ = loss_and_grads(model, calibrated, INPUTS[2])
    difference = np.abs(np.asarray(output.quantiles) - fp32)
    # Quantization changes the output, by a few percent of its range at 8 bits.
    assert 0.0 < difference.max() < 0.05 * np.ptp(fp32)


def test_convert_stores_int8_kernels_and_per_channel_scales():
    _, _, calibrated = qat_setup()
    converted = convert(calibrated)
    params, new_params = flat(calibrated["params"]), flat(converted["params"])
    scales = flat(converted["int8"])
    assert params.keys() == new_params.keys()
    for path, leaf in params.items():
        new, leaf = new_params[path], np.asarray(leaf)  # host arithmetic: no per-shape compiles
        if not path.endswith("kernel"):
            np.testing.assert_array_equal(np.asarray(new), np.asarray(leaf))
            continue
        assert new.dtype == jnp.int8 and new.shape == leaf.shape
        scale = scales[path[: -len("kernel")] + "dot_general/weight_scale"]
        assert scale.shape == leaf.shape[:-2] + leaf.shape[-1:]
        dequantized = np.asarray(new, np.float32) * np.expand_dims(np.asarray(scale), -2)
        # Symmetric rounding: within half a step, and the largest weight is exact.
        assert np.all(np.abs(dequantized - leaf) <= np.expand_dims(scale, -2) / 2 + 1e-7)
        assert np.all(np.abs(np.asarray(new)).max(axis=-2) == 127)
    jax.tree.map(np.testing.assert_array_equal, converted["quant_stats"], calibrated["quant_stats"])


def test_int8_apply_agrees_with_fake_quant_within_one_output_step():
    model, _, calibrated = qat_setup()
    _, fake, _, _ = loss_and_grads(model, calibrated, INPUTS[2])
    integer = int8_forward(model, convert(calibrated), INPUTS[2])
    step = np.ptp(np.asarray(fake.quantiles)) / 255  # an 8-bit affine step of the output range
    assert np.max(np.abs(np.asarray(integer.quantiles) - np.asarray(fake.quantiles))) <= step
    np.testing.assert_allclose(np.asarray(integer.attention), np.asarray(fake.attention), atol=1e-3)


def test_int8_apply_contracts_int8_by_int8_into_int32_for_every_kernel():
    model, _, calibrated = qat_setup()
    converted = convert(calibrated)
    # The trace `int8_forward` made for the test above (jit caches it): no second trace.
    jaxpr = int8_forward.trace(model, converted, INPUTS[2]).jaxpr
    integer_dots = [
        eqn
        for eqn in all_equations(jaxpr.jaxpr)
        if eqn.primitive.name == "dot_general"
        and [v.aval.dtype for v in eqn.invars] == [jnp.int8, jnp.int8]
        and eqn.outvars[0].aval.dtype == jnp.int32
    ]
    kernels = [path for path in flat(converted["params"]) if path.endswith("kernel")]
    assert len(integer_dots) >= len(kernels)


def all_equations(jaxpr):
    """Every equation of a jaxpr, including those of nested jaxprs (scan, cond, pjit)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(item, "jaxpr", item)
                if hasattr(inner, "eqns"):
                    yield from all_equations(inner)


def test_int8_model_is_smaller_with_kernels_at_a_quarter_of_their_size():
    _, _, calibrated = qat_setup()
    converted = convert(calibrated)
    sizes = model_size(calibrated, converted)
    assert sizes["int8_bytes"] < sizes["fp32_bytes"]
    assert sizes["ratio"] == sizes["int8_bytes"] / sizes["fp32_bytes"]

    def kernel_bytes(variables):
        return tree_bytes([v for p, v in flat(variables["params"]).items() if p.endswith("kernel")])

    assert 4 * kernel_bytes(converted) == kernel_bytes(calibrated)


def test_learnable_step_sizes_keep_the_fp32_params_and_receive_gradients():
    model, fresh, calibrated = qat_setup(QATConfig(learnable_scale=True, calibration_batches=2))
    assert jax.tree.structure(fresh["params"]) == jax.tree.structure(fp32_variables()["params"])
    offsets = flat(fresh["quant_params"])
    assert offsets.keys() == {
        p.replace("num_batches", "scale_offset")
        for p in flat(fresh["quant_stats"])
        if p.endswith("num_batches")
    }
    assert all(float(v) == 0.0 for v in offsets.values())
    step_grads = np.array(
        [float(g) for g in flat(step_size_grads(model, calibrated, INPUTS[2])).values()]
    )
    assert np.all(np.isfinite(step_grads)) and np.count_nonzero(step_grads) > len(step_grads) // 2


def test_from_fp32_rejects_params_of_another_shape():
    model, _, _ = qat_setup()
    params = flat(fp32_variables()["params"])
    path = next(p for p in params if p.endswith("quantile_head/kernel"))
    params[path] = jnp.zeros((params[path].shape[0] + 1, params[path].shape[1]))
    args, kwargs = shape_args(INPUTS[0])
    with pytest.raises(ValueError, match="does not match the QAT model's parameter tree"):
        from_fp32({"params": traverse_util.unflatten_dict(params, sep="/")}, model, *args, **kwargs)


def test_int8_apply_needs_converted_variables_and_enabled_quantization():
    model, _, calibrated = qat_setup()
    with pytest.raises(ValueError, match="'int8' collection"):
        int8_apply(model, calibrated, **INPUTS[0])
    with pytest.raises(ValueError, match="not int8: convert"):
        int8_apply(model, {**calibrated, "int8": convert(calibrated)["int8"]}, **INPUTS[0])
    disabled = QATTemporalFusionTransformer(CONFIG, QATConfig(bits=None))
    with pytest.raises(ValueError, match="bits is None"):
        int8_apply(disabled, convert(calibrated), **INPUTS[0])


def test_calibrate_refuses_a_tft_batch_given_as_a_plain_tuple():
    # Before: the tuple was read as an object without attributes, and the TFT
    # answered "historical is required" although historical was in the tuple.
    model, fresh, _ = qat_setup()
    inputs = INPUTS[0]
    batch = (inputs["static"], inputs["historical"], inputs["future"])
    with pytest.raises(TypeError, match=r"mapping or an object .* got a tuple of 3 items"):
        calibrate(model, fresh, [batch])


@pytest.mark.parametrize("flag", ["yes", "False", 1, None])
def test_apply_refuses_a_calibrate_flag_that_is_not_a_bool(flag):
    # Before: any truthy value (the string "False" too) switched calibration on silently.
    model, fresh, _ = qat_setup()
    with pytest.raises(TypeError, match=r"QATTemporalFusionTransformer: calibrate must be a bool"):
        model.apply(fresh, **INPUTS[0], deterministic=True, calibrate=flag, mutable=["quant_stats"])
    # A NumPy bool is a bool: the same forward as with False.
    output = forward_at_calibrate_false(model, fresh, INPUTS[0], numpy_bool=True)
    expected = forward_at_calibrate_false(model, fresh, INPUTS[0], numpy_bool=False)
    np.testing.assert_array_equal(output.quantiles, expected.quantiles)
