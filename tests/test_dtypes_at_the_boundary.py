"""Dtypes where data enters the library: the jitted steps, the model, the gating blocks.

Without `jax_enable_x64` (as in this suite) `jax.jit` makes an int64 NumPy
array int32 and a float64 one float32 as it enters: values beyond int32's
range wrapped around silently, and finite values beyond float32's range became
inf. The steps now take NumPy integers as float32 on the host and refuse
float64 values beyond float32's range by name. The references are float64
NumPy: the linear model's pinball loss (`tests/linear_quantile_model.py`).
Most checks fail before anything compiles; x64 is switched on only inside
`jax.enable_x64` blocks (thread-local, restored on exit).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.fast_path_configs import small_config
from tests.linear_quantile_model import MODEL, QUANTILES, LinearOutput, _host, linear_batch
from tft_jax.gating import GateAddNorm, GatedLinearUnit
from tft_jax.model import TemporalFusionTransformer
from tft_jax.train import (
    Batch,
    TrainState,
    batch_loss,
    copy_state,
    create_train_state,
    eval_step,
    evaluate,
    fit,
    lower_train_step,
    make_optimizer,
    predict,
    train_step,
)

BEYOND_INT32 = 3_000_000_000  # > 2**31 - 1: wrapped to int32 it was 3e9 - 2**32 = -1294967296


@pytest.fixture(scope="module")
def linear_state() -> TrainState:
    """The linear model's state (never donated: steps run on copies)."""
    return create_train_state(MODEL, make_optimizer(0.05), jax.random.key(0), linear_batch(0))


def large_integer_batch() -> Batch:
    """`linear_batch(0)`'s shapes with int64 `future` and `target` well beyond int32's range."""
    rng = np.random.default_rng(1)
    batch = linear_batch(0)
    future = rng.choice([-2, -1, 1, 3], size=np.shape(batch.future)) * BEYOND_INT32
    target = rng.integers(-5 * BEYOND_INT32, 5 * BEYOND_INT32, size=np.shape(batch.target))
    return batch.replace(future=future.astype(np.int64), target=target.astype(np.int64))


def numpy_pinball_loss(params: dict[str, np.ndarray], batch: Batch) -> float:
    """The linear model's mean pinball loss in float64: `exp(s) · future @ w + bias` vs target."""
    future = np.asarray(batch.future, np.float64)
    pred = math.exp(float(params["log_scale"])) * (future @ params["w"]) + params["bias"]
    error = np.asarray(batch.target, np.float64)[..., None] - pred
    levels = np.asarray(QUANTILES, np.float64)
    return float(np.mean(np.maximum(levels * error, (levels - 1.0) * error)))


def as_float32(batch: Batch) -> Batch:
    return batch.replace(
        future=np.asarray(batch.future, np.float32), target=np.asarray(batch.target, np.float32)
    )


# ---------------------------------------------------------------------------
# int64 values beyond int32 through the jitted steps


def test_int64_values_beyond_int32_give_the_float64_pinball_loss(linear_state: TrainState) -> None:
    # Before: the wrapped values gave losses off by billions.
    batch = large_integer_batch()
    want = numpy_pinball_loss(_host(linear_state), batch)
    np.testing.assert_allclose(float(eval_step(linear_state, batch)), want, rtol=1e-5)
    np.testing.assert_allclose(evaluate(linear_state, [batch]), want, rtol=1e-5)


def test_int64_train_step_equals_the_float32_batch_step(linear_state: TrainState) -> None:
    batch = large_integer_batch()
    state, metrics = train_step(copy_state(linear_state), batch, jax.random.key(1))
    float_state, float_metrics = train_step(
        copy_state(linear_state), as_float32(batch), jax.random.key(1)
    )
    want = numpy_pinball_loss(_host(linear_state), batch)
    np.testing.assert_allclose(float(metrics["loss"]), want, rtol=1e-5)
    assert int(metrics["skipped"]) == 0
    assert float(metrics["loss"]) == float(float_metrics["loss"])
    for got, expected in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(float_state.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_int64_inputs_predict_as_their_float32_values(linear_state: TrainState) -> None:
    batch = large_integer_batch()
    got = np.asarray(predict(linear_state, batch).quantiles)
    np.testing.assert_array_equal(
        got, np.asarray(predict(linear_state, as_float32(batch)).quantiles)
    )


def test_an_int64_mask_beyond_int32_still_marks_its_steps_observed(
    linear_state: TrainState,
) -> None:
    # 2**32 wrapped to int32 is 0: the step was read as unobserved.
    batch = linear_batch(0)
    mask = np.full(np.shape(batch.target), 2**32, np.int64)
    loss = float(eval_step(linear_state, batch.replace(target_mask=mask)))
    np.testing.assert_allclose(loss, numpy_pinball_loss(_host(linear_state), batch), rtol=1e-5)


def test_lower_train_step_lowers_the_float32_step_that_train_step_runs(
    linear_state: TrainState,
) -> None:
    lowered = lower_train_step(linear_state, large_integer_batch(), jax.random.key(1))
    batch_avals = lowered.in_avals[0][1]
    assert batch_avals.future.dtype == jnp.float32 and batch_avals.target.dtype == jnp.float32


def test_int64_historical_beyond_int32_reaches_the_tft_as_its_float32_values() -> None:
    config = small_config(dropout_rate=0.0)
    rng = np.random.default_rng(0)
    rows, steps, horizon = 2, config.sequence_length, config.prediction_horizon
    historical = rng.choice([-1, 1, 2], size=(rows, steps, config.num_observed_features))
    batch = Batch(
        static=rng.normal(size=(rows, config.num_static_features)).astype(np.float32),
        historical=(historical * BEYOND_INT32).astype(np.int64),
        future=rng.normal(size=(rows, horizon, config.num_known_features)).astype(np.float32),
        known_history=rng.normal(size=(rows, steps, config.num_known_features)).astype(np.float32),
        static_categorical=None,
        target=np.zeros((rows, horizon), np.float32),
    )
    state = create_train_state(
        TemporalFusionTransformer(config), make_optimizer(1e-3), jax.random.key(0), batch
    )
    as_floats = batch.replace(historical=np.asarray(batch.historical, np.float32))
    got = np.asarray(predict(state, batch).quantiles)
    np.testing.assert_array_equal(got, np.asarray(predict(state, as_floats).quantiles))


# ---------------------------------------------------------------------------
# Finite float64 values beyond float32's range

BEYOND_FLOAT32 = 1e39
RANGE_MESSAGE = r"holds 1 finite value\(s\) beyond float32's range \(\|x\| > 3.402823e\+38\)"


def with_beyond_float32(batch: Batch, field: str) -> Batch:
    """`batch` with its `field` as float64, `BEYOND_FLOAT32` at the last element."""
    values = np.asarray(getattr(batch, field), np.float64).copy()
    values.reshape(-1)[-1] = BEYOND_FLOAT32
    return batch.replace(**{field: values})


@pytest.mark.parametrize("field", ["historical", "future", "target"])
@pytest.mark.parametrize("step", ["eval_step", "evaluate", "train_step"])
def test_float64_values_beyond_float32_are_refused_naming_the_field(
    linear_state: TrainState, field: str, step: str
) -> None:
    # Before: inf inside the step, a NaN or inf loss (a skipped step) and no error.
    batch = with_beyond_float32(linear_batch(0), field)
    run = {
        "eval_step": lambda: eval_step(linear_state, batch),
        "evaluate": lambda: evaluate(linear_state, [batch]),
        "train_step": lambda: train_step(copy_state(linear_state), batch, jax.random.key(0)),
    }[step]
    with pytest.raises(ValueError, match=rf"{step}.*batch\.{field} {RANGE_MESSAGE}"):
        run()


def test_predict_refuses_inputs_beyond_float32_but_not_the_target_it_does_not_read(
    linear_state: TrainState,
) -> None:
    with pytest.raises(ValueError, match=rf"predict: batch\.future {RANGE_MESSAGE}"):
        predict(linear_state, with_beyond_float32(linear_batch(0), "future"))
    output = predict(linear_state, with_beyond_float32(linear_batch(0), "target"))
    assert np.isfinite(np.asarray(output.quantiles)).all()


@pytest.mark.parametrize("on_device", [False, True], ids=["numpy_mask", "jax_mask"])
def test_a_target_beyond_float32_where_the_mask_says_missing_is_no_error(
    linear_state: TrainState, on_device: bool
) -> None:
    # A JAX mask is not read on the host: its target was refused where unobserved.
    batch = with_beyond_float32(linear_batch(0), "target")
    mask = np.ones(np.shape(batch.target), np.float32)
    mask.reshape(-1)[-1] = 0.0
    given = jnp.asarray(mask) if on_device else mask
    loss = float(eval_step(linear_state, batch.replace(target_mask=given)))
    observed = np.ones(np.shape(mask), bool)
    observed.reshape(-1)[-1] = False
    params = _host(linear_state)
    future = np.asarray(batch.future, np.float64)
    pred = math.exp(float(params["log_scale"])) * (future @ params["w"]) + params["bias"]
    error = np.asarray(batch.target, np.float64)[observed][:, None] - pred[observed]
    levels = np.asarray(QUANTILES)
    want = float(np.mean(np.maximum(levels * error, (levels - 1.0) * error)))
    np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_fit_refuses_validation_targets_beyond_float32_before_training(
    linear_state: TrainState,
) -> None:
    bad = with_beyond_float32(linear_batch(1), "target")
    with pytest.raises(ValueError, match=rf"val_batches: batch 0: batch\.target {RANGE_MESSAGE}"):
        fit(copy_state(linear_state), [linear_batch(0)], val_batches=[bad], epochs=1, quiet=True)


def test_fit_trains_and_validates_on_int64_values_beyond_int32_as_on_their_float32_values(
    linear_state: TrainState,
) -> None:
    # Before: `fit` placed the batches on the mesh first, which wrapped them to int32.
    batch = large_integer_batch()
    runs = [
        fit(copy_state(linear_state), [b], val_batches=[b], epochs=2, quiet=True)
        for b in (batch, as_float32(batch))
    ]
    wrapped, exact = (run.history for run in runs)
    assert wrapped["val_loss"] == exact["val_loss"] and wrapped["train_loss"] == exact["train_loss"]
    want = numpy_pinball_loss(_host(runs[1].state), batch)
    np.testing.assert_allclose(float(eval_step(runs[0].state, batch)), want, rtol=1e-5)


def tft_inputs(config: Any, rows: int = 2) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    return (
        rng.normal(size=(rows, config.num_static_features)).astype(np.float32),
        rng.normal(size=(rows, config.sequence_length, config.num_observed_features)),
        rng.normal(size=(rows, config.prediction_horizon, config.num_known_features)),
        rng.normal(size=(rows, config.sequence_length, config.num_known_features)),
    )


def test_the_model_refuses_a_float64_input_beyond_float32_outside_jit() -> None:
    # Before: the float32 model saw inf and returned NaN forecasts.
    config = small_config()
    static, historical, future, known_history = tft_inputs(config)
    historical[0, 1, 2] = -BEYOND_FLOAT32
    model = TemporalFusionTransformer(config)
    with pytest.raises(ValueError, match=rf"historical {RANGE_MESSAGE}, the first -1e\+39 at "):
        model.init(jax.random.key(0), static, historical, future, known_history)


# ---------------------------------------------------------------------------
# The model's dtypes and inputs


@pytest.mark.parametrize("name", ["historical", "future", "known_history"])
def test_a_list_input_under_jit_raises_the_type_error_naming_it(name: str) -> None:
    # Before: a TracerArrayConversionError from np.shape, naming no argument.
    config = small_config(dropout_rate=0.0)
    names = ("static", "historical", "future", "known_history")
    inputs = dict(zip(names, tft_inputs(config), strict=True))
    inputs[name] = inputs[name].tolist()
    model = TemporalFusionTransformer(config)
    with pytest.raises(
        TypeError, match=rf"{name} must be a real-valued NumPy or JAX array, got list"
    ):
        jax.jit(model.init)(jax.random.key(0), **inputs)


@pytest.mark.parametrize("field", ["dtype", "param_dtype"])
def test_a_float64_config_without_x64_is_refused_when_the_model_runs(field: str) -> None:
    # Before: it ran in float32, with a truncation warning per parameter and cast.
    config = small_config(**{field: "float64"})  # building the config is fine
    model = TemporalFusionTransformer(config)
    static, historical, future, known_history = tft_inputs(config)
    with pytest.raises(
        ValueError, match=rf"TFTConfig\.{field} is 'float64', which needs jax_enable_x64"
    ):
        model.init(jax.random.key(0), static, historical, future, known_history)
    with jax.enable_x64(True):
        shapes = jax.eval_shape(
            model.init, jax.random.key(0), static, historical, future, known_history
        )
    dtypes = {leaf.dtype for leaf in jax.tree.leaves(shapes["params"])}
    assert dtypes == {jnp.dtype(jnp.float64 if field == "param_dtype" else jnp.float32)}


@pytest.mark.parametrize("masked", [False, True])
def test_batch_loss_of_float64_targets_under_x64_is_a_float32_scalar(masked: bool) -> None:
    # Before: float64 without a mask, float32 with one (the documented dtype).
    rng = np.random.default_rng(0)
    pred = rng.normal(size=(3, 2, len(QUANTILES))).astype(np.float32)
    target = rng.normal(size=(3, 2))
    mask = np.ones((3, 2)) if masked else None
    batch = linear_batch(0).replace(target=target, target_mask=mask)
    error = target[..., None] - pred.astype(np.float64)
    levels = np.asarray(QUANTILES)
    want = float(np.mean(np.maximum(levels * error, (levels - 1.0) * error)))
    with jax.enable_x64(True):
        output = LinearOutput(jnp.asarray(pred))
        eager = batch_loss(output, batch, QUANTILES)
        jitted = jax.jit(batch_loss, static_argnums=2)(output, batch, QUANTILES)
    for loss, count in (eager, jitted):
        assert loss.dtype == jnp.float32 and count.dtype == jnp.float32
        np.testing.assert_allclose(float(loss), want, rtol=1e-6)


# ---------------------------------------------------------------------------
# The gating blocks


@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_gated_linear_unit_refuses_non_floating_input(dtype: Any) -> None:
    # Before: cast to float32 silently, as the GRN, attention and selection refuse.
    x = np.ones((2, 3, 4), dtype)
    with pytest.raises(TypeError, match=r"GatedLinearUnit: x must be floating point"):
        GatedLinearUnit(4).init(jax.random.key(0), x)


@pytest.mark.parametrize("name", ["x", "skip"])
def test_gate_add_norm_refuses_non_floating_input(name: str) -> None:
    inputs = {"x": np.ones((2, 3, 4), np.float32), "skip": np.ones((2, 3, 4), np.float32)}
    inputs[name] = inputs[name].astype(np.int32)
    with pytest.raises(TypeError, match=rf"GateAddNorm: {name} must be floating point"):
        GateAddNorm(4).init(jax.random.key(0), inputs["x"], inputs["skip"])
