"""Boundary checks of the training and checkpoint API: bad input fails early and clearly.

Each test here failed before its fix: an input that reached a deep or
misleading error, trained silently on nothing, returned a silent NaN, or wrote
into a directory it only read. Nearly all of them fail before anything
compiles; one tiny train state, built once, serves every test (its model
init is the only compilation besides one evaluation).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import tft_jax.train as train
import tft_jax.train_state as train_state
from tft_jax.checkpoint import TrainingCheckpointer, load_state
from tft_jax.config import TFTConfig
from tft_jax.model import TemporalFusionTransformer
from tft_jax.train import (
    Batch,
    TrainState,
    create_train_state,
    eval_step,
    evaluate,
    fit,
    lower_train_step,
    make_optimizer,
    train_step,
)

B, T, H, S, U, K = 4, 4, 2, 2, 3, 2
CONFIG = TFTConfig(
    num_static_features=S,
    num_known_features=K,
    num_observed_features=U,
    hidden_dim=8,
    num_heads=2,
    sequence_length=T,
    prediction_horizon=H,
    dropout_rate=0.0,
)


def make_batch(seed: int = 0, **fields: Any) -> Batch:
    rng = np.random.default_rng(seed)
    values: dict[str, Any] = dict(
        static=rng.normal(size=(B, S)).astype(np.float32),
        historical=rng.normal(size=(B, T, U)).astype(np.float32),
        future=rng.normal(size=(B, H, K)).astype(np.float32),
        known_history=None,
        static_categorical=None,
        target=rng.normal(size=(B, H)).astype(np.float32),
    )
    return Batch(**{**values, **fields})


@jax.jit
def copied(state: TrainState) -> TrainState:
    """A copy of `state` with buffers of its own, to donate: one program, not one per leaf."""
    return jax.tree.map(jnp.copy, state)


@pytest.fixture(scope="module")
def state() -> TrainState:
    """One tiny train state for the module (never donated: no test here runs a step)."""
    model = TemporalFusionTransformer(CONFIG)
    return create_train_state(model, make_optimizer(1e-2), jax.random.key(0), make_batch())


# ---------------------------------------------------------------------------
# TFTConfig


@pytest.mark.parametrize(
    "quantiles",
    [0.5, "0.5", ("0.1", "0.5"), (0.1j, 0.5), (None,), ([0.1],), (True,)],
    ids=["float", "str", "strings", "complex", "none", "nested", "bool"],
)
def test_config_quantiles_that_are_not_real_levels_raise_naming_the_field(quantiles: Any) -> None:
    # Before: "'float' object is not iterable", "could not convert string to
    # float: '.'" (a string read character by character), or strings taken as numbers.
    with pytest.raises(TypeError, match=r"TFTConfig\.quantiles"):
        TFTConfig(quantiles=quantiles)


def test_config_quantiles_accept_numpy_and_jax_levels() -> None:
    assert TFTConfig(quantiles=np.array([0.1, 0.9])).quantiles == (0.1, 0.9)
    assert TFTConfig(quantiles=jnp.array([0.5])).quantiles == (0.5,)


@pytest.mark.parametrize("field", ["dtype", "param_dtype"])
def test_config_dtype_none_is_refused(field: str) -> None:
    # Before: None was read by NumPy as float64.
    with pytest.raises(TypeError, match=rf"TFTConfig\.{field} must be a floating dtype, got None"):
        TFTConfig(**{field: None})


def test_config_numpy_integers_are_stored_as_python_ints() -> None:
    # Before: the np.int64 stayed, and `json.dumps(dataclasses.asdict(config))`
    # (how a Forecaster saves its config) raised.
    config = TFTConfig(
        hidden_dim=np.int64(16),
        num_heads=np.int32(2),
        variable_hidden_dim=np.int64(4),
        static_categorical_cardinalities=(np.int64(3),),
    )
    assert type(config.hidden_dim) is int and type(config.variable_hidden_dim) is int
    assert type(config.static_categorical_cardinalities[0]) is int
    json.dumps(dataclasses.asdict(config))


# ---------------------------------------------------------------------------
# Steps


@pytest.mark.parametrize("dtype", [np.bool_, np.complex64])
def test_a_target_that_is_not_real_raises_before_tracing(state: TrainState, dtype: Any) -> None:
    # Before: cast to float32 silently (a complex target losing its imaginary part).
    batch = make_batch(target=np.ones((B, H), dtype))
    with pytest.raises(TypeError, match=r"train_step: batch\.target must hold real numbers"):
        train_step(state, batch, jax.random.key(1))
    with pytest.raises(TypeError, match=r"eval_step: batch\.target must hold real numbers"):
        eval_step(state, batch)


@pytest.mark.parametrize("field", ["historical", "target"])
def test_a_batch_field_that_is_a_list_raises_naming_it(state: TrainState, field: str) -> None:
    # Before: a nested list entered jax.jit as a pytree of scalars and failed in the trace.
    batch = make_batch()
    batch = dataclasses.replace(batch, **{field: np.asarray(getattr(batch, field)).tolist()})
    with pytest.raises(
        TypeError, match=rf"train_step: batch\.{field} must be an array .* got list"
    ):
        train_step(state, batch, jax.random.key(1))
    with pytest.raises(TypeError, match=rf"eval_step: batch\.{field} must be an array"):
        eval_step(state, batch)


@pytest.mark.parametrize(
    "rng", [0, None, np.zeros(2, np.float32), np.zeros(3, np.uint32)], ids=repr
)
def test_an_rng_that_is_not_a_key_raises_naming_rng(state: TrainState, rng: Any) -> None:
    # Before: Flax's error about an `rngs` argument (int, or uint32 data of another
    # length than a key's), or accepted (None).
    with pytest.raises(TypeError, match="train_step: rng must be one PRNG key"):
        train_step(state, make_batch(), rng)
    with pytest.raises(TypeError, match="lower_train_step: rng must be one PRNG key"):
        lower_train_step(state, make_batch(), rng)


def test_fit_names_a_mesh_that_is_not_a_data_mesh(state: TrainState) -> None:
    # Before: "AttributeError: 'str' object has no attribute 'size'" deep in a check.
    with pytest.raises(TypeError, match=r"fit: mesh must be a jax.sharding.Mesh .* got str"):
        fit(state, [make_batch()], epochs=1, mesh="data", quiet=True)
    other_axis = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("batch",))
    with pytest.raises(ValueError, match=r"fit: mesh must have a 'data' axis .* \('batch',\)"):
        fit(state, [make_batch()], epochs=1, mesh=other_axis, quiet=True)


def test_create_train_state_names_an_rng_that_is_not_a_key() -> None:
    # Before: JAX's "invalid PRNG key data" from inside `jax.random.split`.
    with pytest.raises(TypeError, match="create_train_state: rng must be one PRNG key"):
        create_train_state(TemporalFusionTransformer(CONFIG), make_optimizer(1e-2), 0, make_batch())


def test_evaluate_raises_on_a_nan_target_naming_the_batch(state: TrainState) -> None:
    # Before: returned NaN, which `fit` then kept as its best validation loss for good.
    target = make_batch().target.copy()
    target[1, 0] = np.nan
    message = r"evaluate: batch 1 holds 1 NaN or inf targets \(the first at window 1, horizon"
    with pytest.raises(ValueError, match=message):
        evaluate(state, [make_batch(), make_batch(target=target)])
    # A gap the mask excludes is not an error.
    mask = np.ones((B, H), np.float32)
    mask[1, 0] = 0.0
    loss = evaluate(state, [make_batch(target=target, target_mask=mask)])
    assert np.isfinite(loss)


def test_evaluate_raises_on_a_nan_target_under_any_nonzero_mask_value(state: TrainState) -> None:
    # The mask is "nonzero where observed" and the loss reads it so; before, the
    # target check read only values > 0, and a NaN under -1 came back as a NaN loss.
    target = make_batch().target.copy()
    target[2, 1] = np.nan
    mask = np.ones((B, H), np.float32)
    mask[2, 1] = -1.0
    with pytest.raises(ValueError, match=r"evaluate: batch 0 holds 1 NaN or inf targets"):
        evaluate(state, [make_batch(target=target, target_mask=mask)])


def test_a_nan_input_is_named_by_evaluate_and_predict_not_returned_as_nan(
    state: TrainState,
) -> None:
    # Before: predict's quantiles and evaluate's loss were NaN, without a word.
    historical = make_batch().historical.copy()
    historical[2, 1, 0] = np.inf
    bad = make_batch(historical=historical)
    message = r"batch.historical holds 1 NaN or inf values \(the first at index \(2, 1, 0\)\)"
    with pytest.raises(ValueError, match=r"evaluate: batch 1: " + message):
        evaluate(state, [make_batch(), jax.tree.map(jnp.asarray, bad)])  # device arrays too
    with pytest.raises(ValueError, match=r"predict: " + message):
        train.predict(state, bad)


def test_a_nan_target_mask_is_refused_not_read_as_observed(state: TrainState) -> None:
    # NaN is nonzero: the loss counted the step as observed.
    mask = np.ones((B, H), np.float32)
    mask[3, 1] = np.nan
    message = r"batch.target_mask must be finite .* at window 3, horizon step 1"
    for call in (lambda b: evaluate(state, [b]), lambda b: train_step(state, b, jax.random.key(0))):
        with pytest.raises(ValueError, match=message):
            call(make_batch(target_mask=mask))


@pytest.mark.parametrize("field", ["historical", "target_mask"])
def test_a_batch_array_of_text_is_refused_naming_it(state: TrainState, field: str) -> None:
    # Before: JAX's "Error interpreting argument to <function _train_step ...>".
    shape = {"historical": (B, T, U), "target_mask": (B, H)}[field]
    with pytest.raises(TypeError, match=rf"train_step: batch.{field} must hold numbers, got dtype"):
        train_step(state, make_batch(**{field: np.full(shape, "1")}), jax.random.key(0))


def test_calibrate_on_a_model_without_calibration_says_none(state: TrainState) -> None:
    # `calibrate=True` was refused with "must be None or False", and False then failed
    # inside the jitted forward: "__call__() got an unexpected keyword argument".
    with pytest.raises(ValueError, match=r"predict: calibrate must be None, the model is frozen"):
        train.predict(state, make_batch(), calibrate=True)
    message = r"calibrate must be None for a model without calibration \(TemporalFusionTran"
    with pytest.raises(ValueError, match="evaluate: " + message):
        evaluate(state, [make_batch()], calibrate=False)
    with pytest.raises(ValueError, match="train_step: " + message):
        train_step(state, make_batch(), jax.random.key(0), calibrate=False)


class _ArrayOutputModel(nn.Module):
    """A user's model that returns its `(B, H, 3)` quantiles as a bare array."""

    @nn.compact
    def __call__(self, static: Any, historical: Any, future: Any, **unused: Any) -> Any:
        return nn.Dense(3)(future)


def test_a_model_output_without_quantiles_is_named_not_a_tracer_attribute_error() -> None:
    # It failed in the loss's trace: "AttributeError: LinearizeTracer has no attribute quantiles".
    model_state = create_train_state(
        _ArrayOutputModel(),
        make_optimizer(1e-2),
        jax.random.key(0),
        make_batch(),
        quantiles=(0.1, 0.5, 0.9),
    )
    message = r"must return an object with an array field \.quantiles .*array of shape \(4, 2, 3\)"
    with pytest.raises(TypeError, match=message):
        train_step(model_state, make_batch(), jax.random.key(0))
    with pytest.raises(TypeError, match=message):
        evaluate(model_state, [make_batch()])


class _InputOnly(nn.Module):
    """Takes one input and `deterministic`: not the forecaster call."""

    @nn.compact
    def __call__(self, x: Any, deterministic: bool = True) -> Any:
        return nn.Dense(3)(x)


class _WithoutKnownHistory(nn.Module):
    """Takes the three inputs and `deterministic`, but not `known_history`/`static_categorical`."""

    @nn.compact
    def __call__(self, static: Any, historical: Any, future: Any, deterministic: bool = True):
        return nn.Dense(3)(future)


class _WithoutDeterministic(nn.Module):
    @nn.compact
    def __call__(self, static: Any, historical: Any, future: Any, known_history: Any = None,
                 static_categorical: Any = None) -> Any:  # fmt: skip
        return nn.Dense(3)(future)


@pytest.mark.parametrize(
    "model, cause",
    [
        (
            _InputOnly(),
            r"_InputOnly\.__call__\(x, deterministic=True\) is not: too many positional",
        ),
        (
            _WithoutKnownHistory(),
            r"_WithoutKnownHistory\.__call__\(static, historical, future, deterministic=True\) "
            r"is not: got an unexpected keyword argument 'known_history'",
        ),
    ],
    ids=["one_input", "without_known_history"],
)
def test_a_model_of_another_call_signature_is_named_before_init(model: Any, cause: str) -> None:
    # Before: "the model must take a `deterministic` keyword ... got multiple values for
    # argument 'deterministic'" for the first (it takes the keyword), and Python's raw
    # "unexpected keyword argument 'known_history'" from inside init for the second.
    documented = (
        r"create_train_state: the model must be callable as model\(static, historical, future, "
        r"known_history=None, static_categorical=None, deterministic=True\) "
    )
    with pytest.raises(TypeError, match=documented + r".*" + cause):
        create_train_state(model, make_optimizer(1e-2), jax.random.key(0), make_batch(),
                           quantiles=(0.1, 0.5, 0.9))  # fmt: skip
    # A model lacking only the keyword is still told so.
    with pytest.raises(TypeError, match=r"must take a `deterministic` keyword .*_WithoutDeterm"):
        create_train_state(_WithoutDeterministic(), make_optimizer(1e-2), jax.random.key(0),
                           make_batch(), quantiles=(0.1, 0.5, 0.9))  # fmt: skip


class _HookedInputOnly(nn.Module):
    """Hands its QAT hook to its layer, but takes one input."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x: Any, deterministic: bool = True) -> Any:
        return nn.Dense(3, dot_general_cls=self.dot_general_cls)(x)


def test_a_qat_model_wrapping_a_model_of_another_call_signature_is_named_before_init() -> None:
    # Before: QATModel's `__call__(*args, **kwargs)` took anything, and Python's raw
    # "takes from 2 to 3 positional arguments" came from inside init.
    from qat import QATConfig, QATModel

    with pytest.raises(
        TypeError,
        match=r"create_train_state: the model must be callable as model\(static, .* but "
        r"QATModel's _HookedInputOnly\.__call__\(x, deterministic=True\) does not take it",
    ):
        create_train_state(QATModel(_HookedInputOnly(), QATConfig(bits=8)), make_optimizer(1e-2),
                           jax.random.key(0), make_batch(), quantiles=(0.1, 0.5, 0.9))  # fmt: skip


def test_a_donated_state_is_named_not_an_xla_buffer_error(state: TrainState) -> None:
    copy = copied(state)
    train_step(copy, make_batch(), jax.random.key(0))
    message = r"state was donated to an earlier train_step or fit, which deleted its buffers"
    with pytest.raises(ValueError, match="train_step: " + message):
        train_step(copy, make_batch(), jax.random.key(0))
    with pytest.raises(ValueError, match="evaluate: " + message):
        evaluate(copy, [make_batch()])


def test_a_state_shows_its_counts_and_size_donated_or_traced_not_its_arrays(
    state: TrainState,
) -> None:
    # Its dataclass repr printed every array (112,000 characters for a tiny model), and
    # raised for a state a step had donated.
    size = sum(leaf.size for leaf in jax.tree.leaves(state.params))
    count = len(jax.tree.leaves(state.params))
    described = (
        f"{size:,} trained values in {count} arrays; quantiles (0.1, 0.5, 0.9), clip_norm "
        f"{state.clip_norm}; model TemporalFusionTransformer)"
    )
    assert repr(state) == f"TrainState(step 0, skipped 0; {described}"
    copy = copied(state)
    train_step(copy, make_batch(), jax.random.key(0))
    assert repr(copy) == (
        f"TrainState(step (donated to a step), skipped (donated to a step); {described}"
    )
    shown = []
    jax.jit(lambda traced: shown.append(repr(traced)) or traced.step)(state)
    assert shown == [f"TrainState(step (traced), skipped (traced); {described}"]


def test_fit_names_a_bad_batch_found_during_training(state: TrainState) -> None:
    # Before: "quantile_loss: target must have shape (4, 2) ..., got (4, 3)", no batch named.
    wide = make_batch(target=np.zeros((B, H + 1), np.float32))
    with pytest.raises(
        ValueError,
        match=r"^fit: train batch 1 of epoch 0: train_step: batch.target must have shape "
        r"\(B, 2\) \(the model's prediction_horizon\), got \(4, 3\)",
    ):
        fit(
            copied(state), (make_batch(), wide), epochs=1, quiet=True,
            checkpoint_every_seconds=None,
        )  # fmt: skip


def test_with_schedule_steps_names_itself_for_a_state_of_another_type() -> None:
    with pytest.raises(TypeError, match=r"^with_schedule_steps: state must be a TrainState"):
        train.with_schedule_steps({}, 5)


def test_checkpoint_saves_name_a_state_and_an_rng_of_another_kind(
    state: TrainState, tmp_path: pathlib.Path
) -> None:
    checkpointer = TrainingCheckpointer(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"save_latest: rng must be one PRNG key .* got int 3"):
        checkpointer.save_latest(state, 3, {})
    with pytest.raises(TypeError, match=r"save_latest: state must have a step .* got dict"):
        checkpointer.save_latest({}, jax.random.key(0), {})


def template(state: TrainState, batch: Batch, **fields: Any) -> TrainState:
    """A train state of the model of CONFIG with `fields` replaced, holding `state`'s params.

    A restore checks the template's settings and shapes, not its values: the module
    state's params (every model here has their shapes) spare an init per template.
    """
    model = TemporalFusionTransformer(dataclasses.replace(CONFIG, **fields))
    return create_train_state(
        model, make_optimizer(1e-2), jax.random.key(0), batch, variables={"params": state.params}
    )


def test_a_checkpoint_of_other_quantile_levels_is_refused_at_restore(
    state: TrainState, tmp_path: pathlib.Path
) -> None:
    # The levels shape no array: a run of (0.1, 0.5, 0.9) resumed as (0.1, 0.5, 0.8).
    checkpointer = TrainingCheckpointer(tmp_path / "ckpt")
    checkpointer.save_latest(state, jax.random.key(0), {"epoch": 0})
    other = template(state, make_batch(), quantiles=(0.1, 0.5, 0.8))
    with pytest.raises(
        ValueError,
        match=r"was trained for quantile levels \(0.1, 0.5, 0.9\), the template's model "
        r"predicts \(0.1, 0.5, 0.8\)",
    ):
        checkpointer.restore_latest(other)
    with pytest.raises(ValueError, match=r"trained for quantile levels"):
        load_state(tmp_path / "ckpt", other, prefer="latest")
    assert checkpointer.restore_latest(state).step == 0


def test_a_checkpoint_of_a_model_of_other_settings_is_refused_at_restore(
    state: TrainState, tmp_path: pathlib.Path
) -> None:
    # History length, horizon and self-attention shape no array: a checkpoint of
    # attend_to_self=True resumed as False, or loaded into a model of 6 history and 3
    # horizon steps, ran as another model without a word.
    checkpointer = TrainingCheckpointer(tmp_path / "ckpt")
    checkpointer.save_latest(state, jax.random.key(0), {"epoch": 0})
    rng = np.random.default_rng(1)
    longer = make_batch(
        historical=rng.normal(size=(B, T + 2, U)).astype(np.float32),
        future=rng.normal(size=(B, H + 1, K)).astype(np.float32),
        target=rng.normal(size=(B, H + 1)).astype(np.float32),
    )
    cases = [
        (
            dict(attend_to_self=False),
            make_batch(),
            r"attend_to_self=True \(the template's: False\)",
        ),
        (
            dict(sequence_length=T + 2, prediction_horizon=H + 1),
            longer,
            rf"sequence_length={T} \(the template's: {T + 2}\), prediction_horizon={H} "
            rf"\(the template's: {H + 1}\)",
        ),
    ]
    for fields, batch, message in cases:
        other = template(state, batch, **fields)
        with pytest.raises(ValueError, match=rf"trained as a model of other settings: {message}"):
            checkpointer.restore_latest(other)
        with pytest.raises(ValueError, match=r"trained as a model of other settings"):
            load_state(tmp_path / "ckpt", other, prefer="latest")
    # The dropout rate and the compute dtype are the template's to choose.
    for fields in (dict(dropout_rate=0.2), dict(dtype="bfloat16")):
        assert checkpointer.restore_latest(template(state, make_batch(), **fields)).step == 0


@jax.jit
def diverged(state: TrainState) -> TrainState:
    """A copy of `state` with every parameter NaN: a run that diverged (`fit` may donate it)."""
    copy = jax.tree.map(jnp.copy, state)  # every buffer its own (jit forwards bare inputs)
    return copy.replace(params=jax.tree.map(lambda p: jnp.full_like(p, jnp.nan), copy.params))


def test_evaluate_returns_the_nan_loss_of_a_diverged_model(state: TrainState) -> None:
    # Clean data, NaN model: the loss is reported (the clipping experiment records
    # diverged runs this way), not blamed on the data.
    assert np.isnan(evaluate(diverged(state), [make_batch()]))


def test_fit_never_keeps_a_nan_validation_loss_as_its_best(state: TrainState) -> None:
    # Every step of the NaN model is skipped (non-finite gradients) and every
    # evaluation is NaN: with patience 2, training stops after the second. Before,
    # the first NaN became the best loss, and 'completed' came first.
    start = diverged(state)
    # Even quiet, returning the initial state as the best is said.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(
            start, [make_batch()] * 4, [make_batch()],
            epochs=1, max_steps=4, eval_every=2, patience=2, quiet=True,
            checkpoint_every_seconds=None,
        )  # fmt: skip
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert [text.split(" since")[0] for text in said if "evaluation skipped" in text] == [
        "fit: step 2: 2 step(s)", "fit: step 4: 2 step(s)"
    ]  # fmt: skip
    assert any(
        text.startswith("fit: no validation loss was finite in 4 steps; best_state is the "
                        "initial state") for text in said
    )  # fmt: skip
    assert result.stop_reason == "early_stopping"
    assert np.isnan(result.history["val_loss"]).all()


# ---------------------------------------------------------------------------
# fit


def test_equal_models_share_one_compiled_init(state: TrainState) -> None:
    # The module fixture initialized CONFIG's model once; another instance of it,
    # with another seed, reuses that executable (before: traced and compiled again).
    compiled = train_state._jitted_init()._cache_size()
    other = create_train_state(
        TemporalFusionTransformer(CONFIG), make_optimizer(1e-2), jax.random.key(1), make_batch()
    )
    assert train_state._jitted_init()._cache_size() == compiled >= 1
    assert not np.array_equal(
        np.asarray(other.params["static_selection"]["selection_grn"]["hidden"]["kernel"]),
        np.asarray(state.params["static_selection"]["selection_grn"]["hidden"]["kernel"]),
    )


def test_init_compiles_with_its_options_to_the_values_of_plain_o0() -> None:
    # LLVM's cheap passes and XLA:CPU's loop emitters only make init compile faster: the
    # initial variables are bit for bit those of -O0 alone with XLA's default emitters.
    model = TemporalFusionTransformer(CONFIG)
    args, kwargs = train_state.model_inputs(make_batch())
    rngs = {"params": jax.random.key(5)}
    got = train_state._jitted_init()(model, rngs, args, kwargs)
    defaults = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": True}
    reference = jax.jit(train_state._init, static_argnums=0, compiler_options=defaults)
    want = reference(model, rngs, args, kwargs)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_init_compiles_without_an_option_this_jaxlib_lacks(monkeypatch) -> None:
    # A jaxlib that drops an option (XLA:CPU's loop emitters are being retired) refuses
    # it at compile: init then compiles with the others instead of failing every model.
    assert train_state.init_compile_options() == train_state.INIT_COMPILE_OPTIONS
    known = dict(train_state.INIT_COMPILE_OPTIONS)
    unknown = {**known, "xla_no_such_option_of_the_tests": True}
    monkeypatch.setattr(train_state, "INIT_COMPILE_OPTIONS", unknown)
    train_state.init_compile_options.cache_clear()
    try:
        assert train_state.init_compile_options() == known
    finally:
        train_state.init_compile_options.cache_clear()


@pytest.mark.parametrize(
    "schedule, shown",
    [
        (lambda count: jnp.nan, "nan"),
        (lambda count: -1e-3 + 0.0 * count, "-0.001"),
        (lambda count: jnp.full(2, 1e-3), "[0.001"),
    ],
    ids=["nan", "negative", "not_scalar"],
)
def test_a_schedule_without_a_valid_first_rate_is_refused(schedule: Any, shown: str) -> None:
    # Before: accepted; the steps then made every parameter NaN or climbed the loss.
    with pytest.raises(ValueError, match=rf"learning_rate schedule .* got {re.escape(shown)}"):
        make_optimizer(schedule)
    make_optimizer(lambda count: 1e-3 * jnp.minimum(1.0, count / 10.0))  # 0 at step 0: fine


def _one_shot(batches: list[Batch]) -> Iterator[Batch]:
    yield from batches


def test_fit_refuses_a_one_shot_iterator_for_several_epochs(state: TrainState) -> None:
    # Before: epoch 0 used the generator up, epochs 1.. were empty, and the
    # result said 'completed' after one epoch.
    with pytest.raises(ValueError, match=r"one-shot iterator \(generator\).*epochs=3"):
        fit(state, _one_shot([make_batch()]), epochs=3, quiet=True)


@pytest.mark.parametrize("source", [[], lambda epoch: []], ids=["list", "callable"])
def test_fit_refuses_train_batches_without_a_batch(state: TrainState, source: Any) -> None:
    # Before: 'completed' at step 0 with a NaN training loss.
    with pytest.raises(ValueError, match="fit: train_batches holds no batch"):
        fit(state, source, epochs=1, quiet=True)


def test_fit_refuses_an_epoch_of_unknown_size_without_a_batch(state: TrainState) -> None:
    # Before: 'completed' at step 0 (e.g. fewer windows than one batch with drop_last).
    with pytest.raises(ValueError, match="fit: train_batches yielded no batch in epoch 0"):
        fit(state, lambda epoch: _one_shot([]), epochs=2, quiet=True)


@pytest.mark.parametrize("val", [[], iter([])], ids=["list", "iterator"])
def test_fit_refuses_empty_val_batches_before_training(state: TrainState, val: Any) -> None:
    # Before: a whole epoch trained, then `evaluate` raised and the work was lost.
    with pytest.raises(ValueError, match="fit: val_batches is empty; pass None"):
        fit(state, [make_batch()], val, epochs=1, quiet=True)


# ---------------------------------------------------------------------------
# Checkpoints


def test_load_state_writes_nothing_where_there_is_no_checkpoint(
    state: TrainState, tmp_path: pathlib.Path
) -> None:
    # Before: it created `latest/` and `best/` in the directory it only read.
    with pytest.raises(FileNotFoundError, match="no intact checkpoint"):
        load_state(tmp_path, state)
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_directory_that_is_a_file_raises_value_error(
    state: TrainState, tmp_path: pathlib.Path
) -> None:
    # Before: NotADirectoryError on `<file>/latest`, a path the caller never gave.
    file = tmp_path / "run"
    file.write_text("not a directory")
    with pytest.raises(ValueError, match=r"directory .*run is a file, expected a directory"):
        TrainingCheckpointer(file)
    with pytest.raises(ValueError, match=r"lies under .*run, which is a file"):
        TrainingCheckpointer(file / "sub")
    with pytest.raises(ValueError, match="is a file, expected a directory"):
        fit(state, [make_batch()], epochs=1, checkpoint_dir=file, quiet=True)


def test_checkpointer_takes_numpy_max_to_keep_and_names_a_bad_kind(
    tmp_path: pathlib.Path,
) -> None:
    # Before: "max_to_keep must be an int >= 2, got np.int64(3)", and KeyError for the kind.
    with TrainingCheckpointer(tmp_path, max_to_keep=np.int64(3)) as checkpointer:
        assert checkpointer.steps() == []
        with pytest.raises(ValueError, match="kind must be 'latest' or 'best', got 'newest'"):
            checkpointer.steps("newest")


# T02: train_state.py __repr__: the size counted over `params` only, not every trained
# collection (a QAT state's quant_params are trained too, `trainables()`).
def test_a_state_counts_the_values_of_its_extra_trained_collections(state: TrainState) -> None:
    extra = {"quant_params": {"scale": jnp.ones((2, 3)), "zero": jnp.zeros(())}}
    size = sum(leaf.size for leaf in jax.tree.leaves(state.params)) + 7
    count = len(jax.tree.leaves(state.params)) + 2
    shown = repr(state.replace(extra_params=extra))
    assert f"; {size:,} trained values in {count} arrays, extra ['quant_params']; " in shown
