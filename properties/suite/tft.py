"""Properties of the full `TemporalFusionTransformer` and of its interpretable attention.

A `ModelCase` is one of a few preset configs (`strategies.TFT_PRESETS`) and a
batch of 3 drawn inputs: Hypothesis varies the data, not the shapes, since a
TFT compiles in tens of seconds on a small CPU. Per preset there are two
compiles, shared by every property: `init` and
`pullback(params, floats, integers, cotangent) -> (outputs, param_grads,
input_grads)`, whose forward half (zero cotangent) serves the forward
properties.

Properties: finite outputs and gradients; a gradient to every parameter
and input; interpretability weights are distributions; the forecast at
horizon step `i` ignores known inputs after `i`; batch independence (forward
and backward); batch-order equivariance; each categorical variable (each column
of every categorical input) reaches the forecast; each static context reaches only
its own destination; in training every gate (GLU) applies inverted dropout
at the config's rate; jit == eager and derivatives == float64 finite
differences (smallest preset); the interpretable attention's documented
formula (heads share one value projection and are averaged).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypedDict

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from properties import checks
from properties import strategies as st_tft
from properties.suite import (
    PARAM_KEY_IMPL,
    Property,
    assert_gradient_stays_causal,
    assert_gradient_stays_in_sample,
    full_float32_matmuls,
    param_key,
    parameter_cache,
    platform_cache,
    random_cotangent,
)
from tft_jax import gating, interpretable_attention
from tft_jax import model as tft_model
from tft_jax.config import TFTConfig

__all__ = [
    "BATCH_SIZE",
    "INTEGER_INPUTS",
    "PROPERTIES",
    "AttentionCase",
    "ModelCase",
    "assert_gate_dropout_inverted",
    "check_attention_matches_reference",
    "check_batch_independent",
    "check_batch_order_equivariant",
    "check_categorical_inputs_reach_the_forecast",
    "check_causal",
    "check_context_routing",
    "check_finite",
    "check_gate_dropout_is_inverted",
    "check_grads_match_finite_differences",
    "check_jit_matches_eager",
    "check_live_gradients",
    "check_weights_are_distributions",
    "gate_dropout_recorder",
    "interpretable_attention_cases",
    "model_cases",
    "model_functions",
    "model_parameters",
    "output_like",
    "split_inputs",
]


class _Tolerances(TypedDict):
    """`rtol` and `atol` keywords of a check."""

    rtol: float
    atol: float


BATCH_SIZE = 3
# The GRNs' ELU has a second-derivative jump at 0: central differences with a step of
# 1e-4 can miss by O(step) (3e-5 relative seen). With the presets' zero biases, a
# one-input selection GRN LayerNorms a vector proportional to its input, sharply curved
# for an input near 0 (-4e-5 drawn): a step of 1e-6 missed by 3e-3, 1e-7 by 3e-5.
# float64 round-off allows far smaller steps.
FINITE_DIFFERENCE_EPS = 1e-8
# Compiled and op-by-op float32 backward passes of the TFT differ by reassociation:
# a gradient element of 5e-3 was seen 2.5e-6 apart.
JIT_EAGER_TOLERANCE = _Tolerances(rtol=1e-4, atol=1e-5)
STATIC_CONTEXTS = ("selection", "enrichment", "state_h", "state_c")
# The model's integer (categorical code) inputs, in `TFTInputs` and as keywords.
INTEGER_INPUTS = (
    "static_categorical",
    "known_categorical_history",
    "future_categorical",
    "observed_categorical",
)


class ModelCase(NamedTuple):
    """A TFT config and a batch of NumPy inputs for it; `seed` drives cotangents."""

    config: TFTConfig
    inputs: st_tft.TFTInputs
    seed: int


def model_cases(
    presets: Sequence[TFTConfig] = st_tft.TFT_PRESETS,
    *,
    kinds: Sequence[str] = st_tft.INPUT_KINDS,
) -> st.SearchStrategy[ModelCase]:
    """`ModelCase`s: a preset config and a batch of `BATCH_SIZE` inputs (only the data varies)."""

    @st.composite
    def draw(draw_: st.DrawFn) -> ModelCase:
        config = draw_(st_tft.tft_config_presets(presets))
        inputs = draw_(st_tft.tft_inputs(config, batch_sizes=(BATCH_SIZE,), kinds=kinds))
        return ModelCase(config, inputs, draw_(st.integers(0, 2**16)))

    return draw()


def split_inputs(inputs: st_tft.TFTInputs) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`(float inputs, integer inputs)` as keyword dicts for the model (absent ones left out)."""
    floats = {"static": inputs.static, "historical": inputs.historical, "future": inputs.future}
    if inputs.known_history is not None:
        floats["known_history"] = inputs.known_history
    integers = {
        name: getattr(inputs, name) for name in INTEGER_INPUTS if getattr(inputs, name) is not None
    }
    return floats, integers


def _sample_inputs(config: TFTConfig, batch: int) -> dict[str, np.ndarray]:
    """All-zero inputs of the config's shapes (category 0 is always valid)."""
    dtype = np.dtype(config.compute_dtype)
    steps, horizon, known = (
        config.sequence_length,
        config.prediction_horizon,
        config.num_known_features,
    )
    inputs = {
        "static": np.zeros((batch, config.num_static_features), dtype),
        "historical": np.zeros((batch, steps, config.num_observed_features), dtype),
        "future": np.zeros((batch, horizon, known), dtype),
    }
    if config.use_known_history:
        inputs["known_history"] = np.zeros((batch, steps, known), dtype)
    if config.static_categorical_cardinalities:
        columns = len(config.static_categorical_cardinalities)
        inputs["static_categorical"] = np.zeros((batch, columns), np.int32)
    if config.num_known_categoricals:
        columns = config.num_known_categoricals
        inputs["future_categorical"] = np.zeros((batch, horizon, columns), np.int32)
        if config.use_known_history:
            inputs["known_categorical_history"] = np.zeros((batch, steps, columns), np.int32)
    if config.num_observed_categoricals:
        columns = config.num_observed_categoricals
        inputs["observed_categorical"] = np.zeros((batch, steps, columns), np.int32)
    return inputs


def output_like(config: TFTConfig, batch: int) -> tft_model.TFTOutput:
    """A `TFTOutput` of NumPy zeros with the model's output shapes and dtypes."""
    dtype = np.dtype(config.compute_dtype)
    weights_dtype = np.promote_types(dtype, np.float32)
    steps, horizon = config.sequence_length, config.prediction_horizon
    return tft_model.TFTOutput(
        quantiles=np.zeros((batch, horizon, config.num_quantiles), dtype),
        attention=np.zeros((batch, config.num_heads, horizon, steps + horizon), weights_dtype),
        static_weights=np.zeros((batch, config.num_static_inputs), weights_dtype),
        history_weights=np.zeros((batch, steps, config.num_history_inputs), weights_dtype),
        future_weights=np.zeros((batch, horizon, config.num_future_inputs), weights_dtype),
    )


class _ModelFunctions(NamedTuple):
    params: Any
    pullback: Any


@parameter_cache
def model_parameters(config: TFTConfig) -> Any:
    """The config's `'params'` from a jitted `init`, once per config."""
    model = tft_model.TemporalFusionTransformer(config)
    return jax.jit(model.init)(param_key(), **_sample_inputs(config, 1))["params"]


@platform_cache
def model_functions(config: TFTConfig) -> _ModelFunctions:
    """The config's parameters and its jitted pullback, built once per config."""
    model = tft_model.TemporalFusionTransformer(config)

    @jax.jit
    def pullback(params: Any, floats: Any, integers: Any, cotangent: Any) -> Any:
        def forward(params: Any, floats: Any) -> Any:
            return model.apply({"params": params}, **floats, **integers, deterministic=True)

        outputs, vjp = jax.vjp(forward, params, floats)
        param_grads, input_grads = vjp(cotangent)
        return outputs, param_grads, input_grads

    return _ModelFunctions(model_parameters(config), pullback)


def _run(case: ModelCase, cotangent: Any) -> tuple[Any, Any, Any]:
    functions = model_functions(case.config)
    floats, integers = split_inputs(case.inputs)
    return functions.pullback(functions.params, floats, integers, cotangent)


def _quantile_cotangent(case: ModelCase) -> tft_model.TFTOutput:
    """A random cotangent on the forecasts only (the training signal), zero on the weights."""
    like = output_like(case.config, case.inputs.batch_size)
    return like.replace(quantiles=random_cotangent(like.quantiles, case.seed))


def _forward_of(case: ModelCase) -> Any:
    """`inputs dict (floats and integers) -> TFTOutput`, the pullback's forward half."""
    functions = model_functions(case.config)
    zero = output_like(case.config, case.inputs.batch_size)

    def forward(inputs: dict[str, np.ndarray]) -> Any:
        integers = {k: v for k, v in inputs.items() if k in INTEGER_INPUTS}
        floats = {k: v for k, v in inputs.items() if k not in INTEGER_INPUTS}
        return functions.pullback(functions.params, floats, integers, zero)[0]

    return forward


def _all_inputs(case: ModelCase) -> dict[str, np.ndarray]:
    floats, integers = split_inputs(case.inputs)
    return {**floats, **integers}


def check_finite(case: ModelCase) -> None:
    """Forecasts, weights and every parameter and input gradient are finite, whatever the scale."""
    like = output_like(case.config, case.inputs.batch_size)
    outputs, param_grads, input_grads = _run(case, random_cotangent(like, case.seed))
    checks.assert_finite(outputs, name="outputs")
    checks.assert_finite({"params": param_grads, "inputs": input_grads}, name="gradients")


def check_live_gradients(case: ModelCase) -> None:
    """A loss on the forecasts gives every parameter leaf and every float input a gradient.

    Needs non-degenerate inputs (`kinds=("normal",)`).
    """
    _, param_grads, input_grads = _run(case, _quantile_cotangent(case))
    checks.assert_nonzero_grads(param_grads, name="parameter gradients")
    checks.assert_nonzero_grads(input_grads, name="input gradients")


def _rows_are_distributions(name: str, weights: np.ndarray, tolerance: float) -> list[str]:
    weights = np.asarray(weights, np.float64)
    if weights.shape[-1] == 0:
        return []
    problems = []
    if (weights < 0).any():
        problems.append(f"{name} has negative weights (min {weights.min():.3g})")
    sums = weights.sum(-1)
    worst = np.unravel_index(np.argmax(np.abs(sums - 1)), sums.shape)
    if not abs(sums[worst] - 1) <= tolerance:
        problems.append(f"{name} row {list(worst)} sums to {sums[worst]:.7g}, not 1")
    return problems


def check_weights_are_distributions(case: ModelCase) -> None:
    """Static, history, future and attention weights are non-negative rows summing to 1."""
    outputs = _forward_of(case)(_all_inputs(case))
    problems = []
    for name in ("static_weights", "history_weights", "future_weights", "attention"):
        problems += _rows_are_distributions(name, getattr(outputs, name), 1e-5)
    if problems:
        raise AssertionError(
            "interpretability weights are not distributions:\n  " + "\n  ".join(problems)
        )


def check_causal(case: ModelCase) -> None:
    """The forecast, future weights and attention at horizon step `i` ignore known inputs after `i`.

    And the history weights at step `t` ignore observed inputs after `t`;
    categorical inputs over time (their codes changed) included. The
    backward too: a loss on the forecasts up to step `i` gives the known
    inputs after `i` exactly zero gradient (through the compiled pullback).
    """
    inputs = _all_inputs(case)
    forward = _forward_of(case)
    like = output_like(case.config, case.inputs.batch_size)
    assert_gradient_stays_causal(
        lambda quantiles: {"future": _run(case, like.replace(quantiles=quantiles))[2]["future"]},
        like.quantiles,
        seed=case.seed,
    )

    def horizon_outputs(changed: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        outputs = forward({**inputs, **changed})
        attention = np.swapaxes(np.asarray(outputs.attention), 1, 2)  # (B, H, heads, T+H)
        return np.asarray(outputs.quantiles), np.asarray(outputs.future_weights), attention

    def history_outputs(changed: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        return (np.asarray(forward({**inputs, **changed}).history_weights),)

    # The forward returns NumPy (not differentiable by jax.vjp): forward values only.
    # Time is on axis 1 of every output: given, as the shapes can leave it in doubt (Q == T).
    checks.assert_causal(
        lambda future: horizon_outputs({"future": future}),
        inputs["future"],
        out_axis=1,
        check_gradients=False,
    )
    checks.assert_causal(
        lambda historical: history_outputs({"historical": historical}),
        inputs["historical"],
        out_axis=1,
        check_gradients=False,
    )
    for name, outputs_of in (
        ("future_categorical", horizon_outputs),
        ("observed_categorical", history_outputs),
    ):
        if name in inputs:
            _assert_causal_in_codes(name, outputs_of, inputs[name], _cardinalities(case, name))


def _cardinalities(case: ModelCase, name: str) -> Sequence[int]:
    """The cardinalities of integer input `name` in the case's config."""
    config = case.config
    return {
        "static_categorical": config.static_categorical_cardinalities,
        "known_categorical_history": config.known_categorical_cardinalities,
        "future_categorical": config.known_categorical_cardinalities,
        "observed_categorical": config.observed_categorical_cardinalities,
    }[name]


def _shifted_codes(codes: np.ndarray, cardinalities: Sequence[int]) -> np.ndarray:
    """Every code `c` of column `j` replaced by `(c + 1) mod cardinalities[j]`."""
    return ((codes + 1) % np.asarray(cardinalities)).astype(codes.dtype)


def _assert_causal_in_codes(
    name: str, outputs_of: Any, codes: np.ndarray, cardinalities: Sequence[int]
) -> None:
    """Outputs (time on axis 1) at steps `<= t` stay equal when the codes after `t` change."""
    baseline = outputs_of({})
    for step in range(codes.shape[1] - 1):
        changed = codes.copy()
        changed[:, step + 1 :] = _shifted_codes(codes[:, step + 1 :], cardinalities)
        after = outputs_of({name: changed})
        for index, (before_leaf, after_leaf) in enumerate(zip(baseline, after, strict=True)):
            if not np.array_equal(before_leaf[:, : step + 1], after_leaf[:, : step + 1]):
                raise AssertionError(
                    f"output {index} at steps <= {step} changed when {name} changed after "
                    f"step {step}: a categorical input reaches the past"
                )


def check_categorical_inputs_reach_the_forecast(case: ModelCase) -> None:
    """Each categorical variable is read: shifting its codes moves every sample's forecast.

    For each integer input present and each of its columns (one categorical
    variable each) whose cardinality exceeds 1, every code `c` of that
    column alone becomes `(c + 1) mod cardinality` (a different category);
    each sample's quantiles must change. Column by column: shifting every
    column at once moved the forecast through the first column alone, so a
    model that embedded column 0's codes for every column passed. Needs
    non-degenerate inputs (`kinds=("normal",)`), so that no selection
    weight underflows to 0.
    """
    inputs = _all_inputs(case)
    forward = _forward_of(case)
    baseline = np.asarray(forward(inputs).quantiles)
    problems = []
    for name in INTEGER_INPUTS:
        if name not in inputs:
            continue
        cardinalities = _cardinalities(case, name)
        for column, cardinality in enumerate(cardinalities):
            if cardinality < 2:
                continue
            codes = inputs[name].copy()
            codes[..., column] = _shifted_codes(codes[..., column], (cardinality,))
            moved = np.abs(np.asarray(forward({**inputs, name: codes}).quantiles) - baseline)
            # NaN is no move (`max` of a row with NaN is NaN, never == 0): a NaN forecast fails.
            rows = moved.reshape(moved.shape[0], -1)
            with np.errstate(invalid="ignore"):
                still = np.nonzero(~(rows > 0.0).any(axis=1) | np.isnan(rows).any(axis=1))[0]
            if still.size:
                problems.append(
                    f"{name}[..., {column}]: the forecasts of samples {still.tolist()} did not "
                    "change (or are NaN)"
                )
    if problems:
        raise AssertionError(
            "categorical inputs do not reach the forecast:\n  " + "\n  ".join(problems)
        )


def check_batch_independent(case: ModelCase) -> None:
    """Sample `i`'s outputs ignore sample `j`, and so do their gradients w.r.t. every input."""
    inputs = _all_inputs(case)
    checks.assert_batch_independent(_forward_of(case), inputs, check_gradients=False)
    like = output_like(case.config, case.inputs.batch_size)
    assert_gradient_stays_in_sample(
        lambda cotangent: _run(case, cotangent)[2], like, seed=case.seed
    )


def check_batch_order_equivariant(case: ModelCase) -> None:
    """Permuting the batch permutes every output alike."""
    checks.assert_batch_order_equivariant(_forward_of(case), _all_inputs(case), atol=1e-5)


def _subtree_norms(param_grads: Any) -> dict[str, float]:
    norms = {}
    for context in STATIC_CONTEXTS:
        name = f"static_context_{context}"
        if name not in param_grads:
            raise AssertionError(f"the model has no {name} parameters (has {sorted(param_grads)})")
        leaves = jax.tree.leaves(param_grads[name])
        norms[context] = math.sqrt(
            sum(float(np.sum(np.square(np.asarray(g, np.float64)))) for g in leaves)
        )
    return norms


def check_context_routing(case: ModelCase) -> None:
    """Each static context reaches only its destination (Lim et al. 2021, section 4.3).

    The variable selection weights (history and future) depend on the
    selection context and on no other; the attention weights (after the LSTM
    and static enrichment) depend on the enrichment and LSTM state contexts.
    Needs statics and more than one history variable (the future selection
    is checked when it has more than one variable: one variable's weight is
    the constant 1).
    """
    like = output_like(case.config, case.inputs.batch_size)
    problems = []
    for part in ("history", "future"):
        weights = getattr(like, f"{part}_weights")
        if part == "future" and weights.shape[-1] < 2:
            continue
        selection_cotangent = like.replace(
            **{f"{part}_weights": random_cotangent(weights, case.seed)}
        )
        norms = _subtree_norms(_run(case, selection_cotangent)[1])
        problems += [
            f"static context {context!r} reaches the {part} variable selection (gradient "
            f"norm {norms[context]:.3g})"
            for context in ("enrichment", "state_h", "state_c")
            if norms[context] != 0.0
        ]
        if not norms["selection"] > 0.0:
            problems.append(f"the selection context does not reach the {part} variable selection")
    attention_cotangent = like.replace(attention=random_cotangent(like.attention, case.seed))
    norms = _subtree_norms(_run(case, attention_cotangent)[1])
    problems += [
        f"static context {context!r} does not reach the attention weights"
        for context in ("enrichment", "state_h", "state_c")
        if not norms[context] > 0.0
    ]
    if problems:
        raise AssertionError("static contexts are misrouted:\n  " + "\n  ".join(problems))


def check_jit_matches_eager(case: ModelCase) -> None:
    """The compiled forward and backward equal their op-by-op execution (float32 tolerance).

    Op by op, the TFT's backward pass runs a thousand primitives, each
    compiled on first use: slow, so the `thorough` profile runs it.
    """
    functions = model_functions(case.config)
    floats, integers = split_inputs(case.inputs)
    like = output_like(case.config, case.inputs.batch_size)
    checks.assert_jit_matches_eager(
        functions.pullback,
        functions.params,
        floats,
        integers,
        random_cotangent(like, case.seed),
        **JIT_EAGER_TOLERANCE,
    )


@platform_cache
def _weighted_forecast(config: TFTConfig) -> Any:
    """`(params, floats) -> sum(quantiles * W)` in float64, `W` fixed by the shape."""
    model = tft_model.TemporalFusionTransformer(dataclasses.replace(config, dtype="float64"))

    def weighted(params: Any, floats: Any) -> Any:
        output: tft_model.TFTOutput = model.apply(  # type: ignore[assignment]  # flax: no mutable, the output alone
            {"params": params}, **floats, deterministic=True
        )
        quantiles = output.quantiles
        weights = np.cos(np.arange(math.prod(quantiles.shape))).reshape(quantiles.shape)
        return jnp.sum(quantiles * jnp.asarray(weights, quantiles.dtype))

    return weighted


def check_grads_match_finite_differences(case: ModelCase) -> None:
    """Reverse-mode derivatives w.r.t. every parameter and input match float64 differences.

    The model runs in float64 (`TFTConfig.dtype="float64"` under
    `jax.enable_x64`) with the preset's parameters. Needs a preset without
    categorical inputs (integer inputs have no derivative).
    """
    if any(
        (
            case.config.static_categorical_cardinalities,
            case.config.known_categorical_cardinalities,
            case.config.observed_categorical_cardinalities,
        )
    ):
        raise ValueError("check_grads_match_finite_differences needs a config without categoricals")
    functions = model_functions(case.config)
    floats, _ = split_inputs(case.inputs)
    checks.assert_grads_match_finite_differences(
        _weighted_forecast(case.config),
        (functions.params, floats),
        modes=("rev",),
        eps=FINITE_DIFFERENCE_EPS,
    )


# Dropout masks drawn per gate-dropout case: each multiplies the gate inputs counted.
GATE_DROPOUT_MASKS = 16
# The gates built without dropout: the last gated skip, as in the paper's code.
UNDROPPED_GATES = ("output_gate/glu",)
# Relative room for `x / (1 - rate)` computed in the compute dtype, in its epsilons.
GATE_DROPOUT_ULPS = 4.0


def _glu_path(module: Any) -> str:
    return "/".join(str(part) for part in module.path) or "<root>"


def gate_dropout_recorder(run_model: Callable[[Any, Any, Any, Any], Any]) -> Any:
    """Jitted `(params, floats, integers, seed) -> {GLU path: (inputs, dropped, rate)}`.

    `run_model(params, floats, integers, key)` runs a TFT in training mode
    with dropout key `key`; it runs under `GATE_DROPOUT_MASKS` keys. A Flax
    method interceptor reads, at every `GatedLinearUnit` call, the GLU's
    input and what its `projection` reads: the input after dropout.
    Shapes: `(masks, *input shape)` each; `rate` is the GLU's own rate.
    """

    def gate_inputs(params: Any, floats: Any, integers: Any, key: Any) -> Any:
        inputs: dict[str, Any] = {}
        dropped: dict[str, Any] = {}
        rates: dict[str, float] = {}

        def record(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
            module = context.module
            if context.method_name == "__call__":
                # A module's first argument; other modules (a quantizer's step size) may take none.
                def first() -> Any:
                    return args[0] if args else next(iter(kwargs.values()))

                if isinstance(module, gating.GatedLinearUnit):
                    path = _glu_path(module)
                    if path in inputs:
                        raise AssertionError(f"GatedLinearUnit {path} ran twice in one forward")
                    inputs[path], rates[path] = first(), module.dropout_rate
                elif module.name == "projection" and isinstance(
                    module.parent, gating.GatedLinearUnit
                ):
                    dropped[_glu_path(module.parent)] = first()
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(record):
            run_model(params, floats, integers, key)
        missing = sorted(set(inputs) - set(dropped))
        if missing:
            raise AssertionError(
                f"GatedLinearUnit {missing[0]} never called its 'projection': the gate no "
                "longer has the documented form Dropout(x) -> projection"
            )
        return {path: (inputs[path], dropped[path], jnp.float32(rates[path])) for path in inputs}

    @jax.jit
    def recorder(params: Any, floats: Any, integers: Any, seed: Any) -> Any:
        keys = jax.random.split(jax.random.key(seed, impl=PARAM_KEY_IMPL), GATE_DROPOUT_MASKS)
        return jax.vmap(lambda key: gate_inputs(params, floats, integers, key))(keys)

    return recorder


@platform_cache
def _gate_dropout_recorder(config: TFTConfig) -> Any:
    """`gate_dropout_recorder` of the FP32 TFT: `params` are its parameters."""
    model = tft_model.TemporalFusionTransformer(config)

    def run_model(params: Any, floats: Any, integers: Any, key: Any) -> Any:
        return model.apply(
            {"params": params}, **floats, **integers, deterministic=False, rngs={"dropout": key}
        )

    return gate_dropout_recorder(run_model)


def _binomial_room(rate: float, count: int) -> float:
    """6 standard deviations of a fraction of `count` Bernoulli(rate) draws, plus one draw."""
    return 6.0 * math.sqrt(rate * (1.0 - rate) / count) + 1.0 / count


def check_gate_dropout_is_inverted(case: ModelCase) -> None:
    """In training, every gate (GLU) of the TFT applies inverted dropout at the config's rate.

    The TFT drops a GLU's input before its projection: each element is
    either zeroed or scaled by `1 / (1 - rate)`, which keeps its expected
    value. Over `GATE_DROPOUT_MASKS` masks, for every `GatedLinearUnit` the
    model runs: its rate is the config's `dropout_rate` (0 for
    `UNDROPPED_GATES`, which must pass their input unchanged); every nonzero input
    element reaches the projection as exactly 0 or `x / (1 - rate)` (a
    dropout left unrescaled, rescaled twice, or replaced by noise fails);
    and the fraction zeroed, per gate and over all gates, is the rate within
    6 binomial standard deviations (dropout switched off in training fails).
    The VSNs' fused fast paths apply their GRNs' dropout without GLU
    modules and are not seen here (tests compare them with the module path).
    Needs a config with `dropout_rate > 0`.
    """
    rate = case.config.dropout_rate
    if rate <= 0.0:
        raise ValueError(
            f"check_gate_dropout_is_inverted needs a config with dropout_rate > 0, got {rate}"
        )
    floats, integers = split_inputs(case.inputs)
    recorded = _gate_dropout_recorder(case.config)(
        model_parameters(case.config), floats, integers, np.uint32(case.seed)
    )
    assert_gate_dropout_inverted(recorded, rate, "the TFT")


def assert_gate_dropout_inverted(recorded: Mapping[str, Any], rate: float, model: str) -> None:
    """`check_gate_dropout_is_inverted`'s assertions on a `gate_dropout_recorder`'s record.

    `model` names the model in the messages.
    """
    if not recorded:
        raise AssertionError(f"{model} ran no GatedLinearUnit in training mode")
    scale = 1.0 / (1.0 - rate)
    total_seen = total_zeroed = 0
    for path, (inputs, dropped, rates) in sorted(recorded.items()):
        own_rate = float(np.asarray(rates).reshape(-1)[0])
        expected_rate = 0.0 if path in UNDROPPED_GATES else rate
        if not math.isclose(own_rate, expected_rate, rel_tol=1e-6):
            raise AssertionError(
                f"GatedLinearUnit {path} has dropout_rate {own_rate:.6g}, expected "
                f"{expected_rate} (the config's dropout_rate is {rate})"
            )
        if inputs.shape != dropped.shape:
            raise AssertionError(
                f"GatedLinearUnit {path}: its projection reads shape {dropped.shape}, "
                f"its input has {inputs.shape}"
            )
        x, y = np.asarray(inputs, np.float64), np.asarray(dropped, np.float64)
        if expected_rate == 0.0:
            if not np.array_equal(x, y):
                raise AssertionError(
                    f"GatedLinearUnit {path} has no dropout, yet its projection reads another "
                    "value than its input"
                )
            continue
        room = GATE_DROPOUT_ULPS * float(np.finfo(np.dtype(inputs.dtype)).eps)
        zeroed = y == 0.0
        kept = np.abs(y - x * scale) <= room * np.abs(x * scale)
        wrong = ~(zeroed | kept)
        if np.any(wrong):
            at = np.unravel_index(np.argmax(wrong), wrong.shape)
            raise AssertionError(
                f"GatedLinearUnit {path} (dropout {rate}) turns the input {x[at]:.6g} at "
                f"{[int(i) for i in at]} into {y[at]:.6g} (ratio {y[at] / x[at]:.6g}); "
                f"inverted dropout gives 0 or {scale:.6g} times the input"
            )
        nonzero = x != 0.0
        seen, dropped_count = int(nonzero.sum()), int((zeroed & nonzero).sum())
        if seen and abs(dropped_count / seen - rate) > _binomial_room(rate, seen):
            raise AssertionError(
                f"GatedLinearUnit {path} zeroes {dropped_count} of {seen} input elements "
                f"({dropped_count / seen:.3f}) over {GATE_DROPOUT_MASKS} masks; dropout_rate "
                f"is {rate}"
            )
        total_seen, total_zeroed = total_seen + seen, total_zeroed + dropped_count
    if total_seen == 0 or abs(total_zeroed / total_seen - rate) > _binomial_room(rate, total_seen):
        raise AssertionError(
            f"{model}'s gates zero {total_zeroed} of {total_seen} input elements over "
            f"{GATE_DROPOUT_MASKS} masks; dropout_rate is {rate}"
        )


class AttentionCase(NamedTuple):
    """Interpretable attention operands: queries `(B, Tq, D)`, keys/values `(B, Tk, D)`."""

    num_heads: int
    queries: np.ndarray
    keys_values: np.ndarray


def interpretable_attention_cases(
    *,
    num_heads: Sequence[int] = (1, 2, 4),
    features: int = 8,
    query_steps: Sequence[int] = (2,),
    key_steps: Sequence[int] = (5,),
    kinds: Sequence[str] = ("normal", "constant", "tiny"),
) -> st.SearchStrategy[AttentionCase]:
    """`AttentionCase`s with batch 2 and the last `Tq` steps of the window as queries."""

    @st.composite
    def draw(draw_: st.DrawFn) -> AttentionCase:
        heads = draw_(st.sampled_from(num_heads))
        queries = draw_(st.sampled_from(query_steps))
        keys = draw_(st.sampled_from(key_steps))
        window = draw_(st_tft.float_arrays((2, keys, features), kinds=kinds))
        return AttentionCase(heads, window[:, keys - queries :], window)

    return draw()


@platform_cache
def _attention_functions(num_heads: int, features: int) -> tuple[Any, Any]:
    layer = interpretable_attention.InterpretableMultiHeadAttention(num_heads, features)
    params = jax.jit(layer.init)(
        param_key(), np.zeros((1, 1, features), np.float32), np.zeros((1, 2, features), np.float32)
    )["params"]
    return params, jax.jit(lambda params, q, kv, mask: layer.apply({"params": params}, q, kv, mask))


def check_attention_matches_reference(case: AttentionCase) -> None:
    """The TFT's attention: per-head Q/K, ONE value projection `(D, D/heads)`, heads averaged.

    Kernels: query and key `(D, D)` (head `h` uses columns `h·D/heads...`), value
    `(D, D/heads)` shared by all heads, out `(D/heads, D)` applied to the mean.

    `output = W_o · mean_h(softmax(Q_h K_hᵀ / sqrt(D/heads) + causal mask) · V)`
    (Lim et al. 2021, eq. 14-16), against float64 NumPy, with matrix
    products in full float32 (`full_float32_matmuls`); the returned weights
    are the per-head softmax rows.
    """
    features = case.queries.shape[-1]
    head_dim = features // case.num_heads
    params, apply = _attention_functions(case.num_heads, features)
    expected_shapes = {
        "query": (features, features),
        "key": (features, features),
        "value": (features, head_dim),
        "out": (head_dim, features),
    }
    shapes = {name: tuple(np.shape(p["kernel"])) for name, p in params.items() if "kernel" in p}
    if shapes != expected_shapes:
        raise AssertionError(
            f"kernel shapes {shapes} are not {expected_shapes}: the heads do not share one "
            "value projection of width D/heads"
        )
    steps_q, steps_k = case.queries.shape[1], case.keys_values.shape[1]
    query_steps = np.arange(steps_k - steps_q, steps_k)[:, None]
    mask = np.arange(steps_k)[None, :] <= query_steps
    with full_float32_matmuls():
        output, weights = apply(params, case.queries, case.keys_values, mask)

    p = {name: np.asarray(leaf["kernel"], np.float64) for name, leaf in params.items()}
    q = case.queries.astype(np.float64) @ p["query"]
    k = case.keys_values.astype(np.float64) @ p["key"]
    v = case.keys_values.astype(np.float64) @ p["value"]
    heads, expected_weights = [], []
    for head in range(case.num_heads):
        columns = slice(head * head_dim, (head + 1) * head_dim)
        logits = q[..., columns] @ np.swapaxes(k[..., columns], 1, 2) / math.sqrt(head_dim)
        logits = np.where(mask, logits, -np.inf)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        expected_weights.append(w)
        heads.append(w @ v)
    expected = np.mean(heads, axis=0) @ p["out"]
    np.testing.assert_allclose(
        np.asarray(weights, np.float64),
        np.stack(expected_weights, 1),
        rtol=1e-5,
        atol=1e-6,
        err_msg="per-head attention weights differ from softmax(Q_h K_h^T / sqrt(d) + mask)",
    )
    np.testing.assert_allclose(
        np.asarray(output, np.float64),
        expected,
        rtol=1e-4,
        atol=1e-5,
        err_msg="interpretable attention output differs from W_o mean_h(A_h V), V shared",
    )


SMALLEST = st_tft.TFT_PRESETS[0]
WITH_STATICS = tuple(config for config in st_tft.TFT_PRESETS if config.num_static_inputs)
WITH_CATEGORICALS = tuple(
    config
    for config in st_tft.TFT_PRESETS
    if config.num_static_categoricals
    or config.num_known_categoricals
    or config.num_observed_categoricals
)
WITH_DROPOUT = tuple(config for config in st_tft.TFT_PRESETS if config.dropout_rate > 0)

PROPERTIES = (
    Property("tft: finite", model_cases(), check_finite),
    Property("tft: live gradients", model_cases(kinds=("normal",)), check_live_gradients),
    Property("tft: weights are distributions", model_cases(), check_weights_are_distributions),
    Property("tft: causal", model_cases(), check_causal),
    Property(
        "tft: categorical inputs reach the forecast",
        model_cases(WITH_CATEGORICALS, kinds=("normal",)),
        check_categorical_inputs_reach_the_forecast,
    ),
    Property("tft: batch independent", model_cases(), check_batch_independent),
    Property("tft: batch order", model_cases(), check_batch_order_equivariant),
    Property(
        "tft: context routing", model_cases(WITH_STATICS, kinds=("normal",)), check_context_routing
    ),
    Property(
        "tft: gate dropout is inverted",
        model_cases(WITH_DROPOUT, kinds=("normal",)),
        check_gate_dropout_is_inverted,
    ),
    Property(
        "tft: jit == eager", model_cases((SMALLEST,), kinds=("normal",)), check_jit_matches_eager
    ),
    Property(
        "tft: finite differences",
        model_cases((SMALLEST,), kinds=("normal",)),
        check_grads_match_finite_differences,
    ),
    Property(
        "tft: interpretable attention",
        interpretable_attention_cases(),
        check_attention_matches_reference,
    ),
)
