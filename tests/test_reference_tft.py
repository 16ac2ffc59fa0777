"""The whole TFT against an independent float64 NumPy reference written from the paper.

`tests/reference_tft.py` computes the forward pass from the equations of Lim
et al. (2021), reading the model's parameters by name. Here the Flax model
must equal it in every output (quantiles, attention, all selection weights):
in float32 to float32 accuracy, in float64 (under `jax.enable_x64`) to
~1e-12. Its gradients must equal central finite differences of the
reference. And four faults of the equations that leave the model's shapes,
causality and gradient flow intact (`properties.faults.REFERENCE_FAULTS`)
must each make the comparison fail.

Categorical known and observed inputs over time are checked against a forward
composed here from the reference's blocks (variable selection, GRN, LSTM,
interpretable attention): the column order of the selection weights and the
known tables shared between history and horizon.

Parameters are random (not the initializer's values: LayerNorm scales of 1
and biases of 0 would hide a swapped scale and bias), drawn with NumPy from
the shapes `model.init` would give (`jax.eval_shape`, no compile).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from properties import faults
from tests import reference_tft as ref
from tft_jax import TemporalFusionTransformer
from tft_jax.config import TFTConfig

BATCH = 2

# Small configs covering every branch of the architecture.
CONFIGS = {
    # Real and categorical statics (a 4-variable static VSN), known inputs over the history,
    # narrower per-variable GRNs (a learned skip), the compact weight GRN, self-attention on.
    "full": dict(
        num_static_features=2,
        static_categorical_cardinalities=(3, 4),
        num_known_features=2,
        num_observed_features=3,
        hidden_dim=8,
        num_heads=2,
        sequence_length=4,
        prediction_horizon=2,
        use_known_history=True,
        variable_hidden_dim=4,
        compact_selection=True,
        attend_to_self=True,
    ),
    # No statics at all (zero-seeded LSTM, no contexts), a one-variable future VSN without a
    # context, wider per-variable GRNs than the model, no self-attention, one quantile.
    "bare": dict(
        num_static_features=0,
        num_known_features=1,
        num_observed_features=2,
        hidden_dim=8,
        num_heads=4,
        sequence_length=5,
        prediction_horizon=3,
        variable_hidden_dim=12,
        quantiles=(0.5,),
        attend_to_self=False,
    ),
    # One variable everywhere: a categorical static alone (its VSN has no context) and the
    # history and future VSNs, whose context conditions their only variable's GRN.
    "single": dict(
        num_static_features=0,
        static_categorical_cardinalities=(5,),
        num_known_features=1,
        num_observed_features=1,
        hidden_dim=8,
        num_heads=2,
        sequence_length=3,
        prediction_horizon=2,
        attend_to_self=True,
    ),
}

# float32 model vs float64 reference (on the same float32 inputs and parameters): the largest
# error seen is 4.8e-7 on quantiles of size ~2.5, 3.4e-7 on attention weights.
F32_TOLERANCE = dict(rtol=1e-5, atol=5e-6)
# float64 model (jax.enable_x64) vs float64 reference: the largest error seen is 1.3e-15. The
# LayerNorm-epsilon fault moves the outputs by only ~1e-6, below float32's tolerance: the
# float64 comparison is what catches it.
F64_TOLERANCE = dict(rtol=1e-12, atol=1e-12)


def config(name: str, x64: bool = False) -> TFTConfig:
    dtype = "float64" if x64 else "float32"
    return TFTConfig(dropout_rate=0.1, dtype=dtype, param_dtype=dtype, **CONFIGS[name])


def inputs(cfg: TFTConfig, seed: int = 0) -> dict[str, Any]:
    """Random model inputs for `cfg` (float64; cast by `cast`)."""
    rng = np.random.default_rng(seed)
    steps, horizon = cfg.sequence_length, cfg.prediction_horizon
    values: dict[str, Any] = dict(
        static=rng.normal(size=(BATCH, cfg.num_static_features))
        if cfg.num_static_features
        else None,
        historical=rng.normal(size=(BATCH, steps, cfg.num_observed_features)),
        future=rng.normal(size=(BATCH, horizon, cfg.num_known_features)),
        known_history=rng.normal(size=(BATCH, steps, cfg.num_known_features))
        if cfg.use_known_history
        else None,
        static_categorical=None,
    )
    if cfg.static_categorical_cardinalities:
        values["static_categorical"] = np.stack(
            [rng.integers(0, n, BATCH) for n in cfg.static_categorical_cardinalities], axis=1
        ).astype(np.int32)
    return values


def cast(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda a: a if a.dtype.kind == "i" else np.asarray(a, dtype), tree)


def random_parameters(cfg: TFTConfig, values: dict[str, Any], rng: np.random.Generator) -> Any:
    """Random float64 parameters in the layout `model.init` gives for `cfg` and inputs
    `values` (shapes by `eval_shape`): LayerNorm scales away from 1, kernels and
    embeddings of unit variance per input, other leaves away from 0."""
    model = TemporalFusionTransformer(cfg)
    rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    shapes = jax.eval_shape(model.init, rngs, **cast(values, np.float32))["params"]

    def draw(path: tuple[Any, ...], leaf: Any) -> np.ndarray:
        key = str(path[-1].key)
        if key == "scale":  # LayerNorm
            return 1.0 + 0.3 * rng.normal(size=leaf.shape)
        if key == "kernel" or key.startswith("embedding_"):
            fan_in = leaf.shape[-2] if key == "kernel" else 1
            return rng.normal(size=leaf.shape) / np.sqrt(fan_in)
        return 0.3 * rng.normal(size=leaf.shape)

    return jax.tree_util.tree_map_with_path(draw, shapes)


@functools.cache
def parameters(name: str, seed: int = 0) -> Any:
    """Random float64 parameters of the named configuration (`random_parameters`)."""
    cfg = config(name)
    return random_parameters(cfg, inputs(cfg), np.random.default_rng(1000 + seed))


def model_function(name: str, x64: bool = False):
    """A fresh jitted `(params, inputs) -> TFTOutput` (fresh: traces the code as patched now)."""
    model = TemporalFusionTransformer(config(name, x64))

    def forward(params, values):
        return model.apply({"params": params}, **values, deterministic=True)

    return jax.jit(forward)


@functools.cache
def cached_model_function(name: str, x64: bool = False):
    return model_function(name, x64)


def reference(name: str, params: Any, values: dict[str, Any]) -> dict[str, np.ndarray]:
    return ref.tft_forward(params, **values, attend_to_self=CONFIGS[name]["attend_to_self"])


def errors(output: Any, expected: dict[str, np.ndarray]) -> dict[str, float]:
    """Max absolute error per output field."""
    result = {}
    for field in ref.OUTPUT_FIELDS:
        got = np.asarray(getattr(output, field), np.float64)
        assert got.shape == expected[field].shape, (field, got.shape, expected[field].shape)
        result[field] = float(np.max(np.abs(got - expected[field]), initial=0.0))
    return result


def assert_matches_reference(output: Any, expected: dict[str, np.ndarray], tolerance) -> None:
    for field in ref.OUTPUT_FIELDS:
        np.testing.assert_allclose(
            np.asarray(getattr(output, field), np.float64),
            expected[field],
            err_msg=f"{field} differs from the float64 reference",
            **tolerance,
        )


def run_float64(name: str, function=None, seed: int = 0):
    """The model in float64 under `enable_x64` on `parameters(name)`, and the reference."""
    cfg = config(name)
    values = inputs(cfg, seed)
    params = parameters(name)
    with jax.enable_x64(True):
        function = function or cached_model_function(name, x64=True)
        output = jax.device_get(function(cast(params, np.float64), cast(values, np.float64)))
    return output, reference(name, params, values)


# ---------------------------------------------------------------------------
# Forward values


@pytest.mark.parametrize("name", ["full", "bare"])  # "single": in float64, for the faults
def test_float32_model_equals_the_float64_reference(name):
    cfg = config(name)
    values = inputs(cfg)
    params32 = cast(parameters(name), np.float32)
    output = cached_model_function(name)(params32, cast(values, np.float32))
    # The reference on exactly the float32 values the model saw.
    expected = reference(name, params32, cast(values, np.float32))
    assert_matches_reference(output, expected, F32_TOLERANCE)
    # Not trivially equal: the outputs vary across the batch and the weights are not uniform.
    assert np.ptp(expected["quantiles"][:, 0, 0]) > 1e-3
    assert np.ptp(expected["history_weights"]) > 1e-3 or cfg.num_history_inputs == 1


def test_float64_model_equals_the_reference_to_rounding():
    """The fault tests' config, without a fault (the "full" config: in the gradient test)."""
    output, expected = run_float64("single")
    assert_matches_reference(output, expected, F64_TOLERANCE)


def test_reference_mask_and_weights_are_well_formed():
    """The reference's own sanity: rows are distributions, masked keys get zero weight."""
    for name in ("full", "bare"):
        cfg = config(name)
        expected = reference(name, parameters(name), inputs(cfg))
        for field in ("static_weights", "history_weights", "future_weights"):
            if expected[field].size:
                np.testing.assert_allclose(expected[field].sum(-1), 1.0, rtol=1e-12)
        np.testing.assert_allclose(expected["attention"].sum(-1), 1.0, rtol=1e-12)
        steps, horizon = cfg.sequence_length, cfg.prediction_horizon
        inner = ref.tft_forward(
            parameters(name), **inputs(cfg), attend_to_self=cfg.attend_to_self, intermediates=True
        )
        np.testing.assert_array_equal(inner["encoded"][:, -1], inner["encoder_h"])
        assert inner["enriched"].shape == (BATCH, steps + horizon, cfg.hidden_dim)
        for query in range(horizon):
            first_hidden = steps + query + (1 if cfg.attend_to_self else 0)
            assert np.all(expected["attention"][..., query, first_hidden:] == 0.0)


# ---------------------------------------------------------------------------
# Gradients: jax.grad of the model against central differences of the reference


def _cotangents(name: str) -> dict[str, np.ndarray]:
    cfg = config(name)
    expected = reference(name, parameters(name), inputs(cfg))
    rng = np.random.default_rng(7)
    return {field: rng.normal(size=expected[field].shape) for field in ref.OUTPUT_FIELDS}


def _reference_loss(name: str, params: Any, values: dict[str, Any], weights) -> float:
    expected = reference(name, params, values)
    return float(sum(np.sum(expected[f] * weights[f]) for f in ref.OUTPUT_FIELDS))


def _model_outputs_and_gradient(name: str, x64: bool):
    """A jitted `(params, values, weights) -> (TFTOutput, gradient of the weighted outputs)`."""
    model = TemporalFusionTransformer(config(name, x64))

    def loss(params, values, weights):
        output = model.apply({"params": params}, **values, deterministic=True)
        return sum(jnp.sum(getattr(output, f) * weights[f]) for f in ref.OUTPUT_FIELDS), output

    def outputs_and_gradient(params, values, weights):
        gradient, output = jax.grad(loss, has_aux=True)(params, values, weights)
        return output, gradient

    return jax.jit(outputs_and_gradient)


def _directions(params: Any, rng: np.random.Generator) -> list[tuple[str, Any]]:
    """One random direction over all parameters, and one confined to each top-level layer.

    The per-layer directions make a layer whose gradient is wrong or missing stand out
    instead of drowning in the others.
    """
    directions = [("all", jax.tree.map(lambda a: rng.normal(size=a.shape), params))]
    for layer in sorted(params):
        direction = jax.tree.map(np.zeros_like, params)
        direction[layer] = jax.tree.map(lambda a: rng.normal(size=a.shape), params[layer])
        directions.append((layer, direction))
    return directions


def _check_directional_derivatives(name, gradient, params, values, weights, rtol, floor):
    rng = np.random.default_rng(3)
    step = 1e-5
    failures = []
    for label, direction in _directions(params, rng):

        def shifted(sign, direction=direction):
            return jax.tree.map(lambda a, b: a + sign * step * b, params, direction)

        finite_difference = (
            _reference_loss(name, shifted(1.0), values, weights)
            - _reference_loss(name, shifted(-1.0), values, weights)
        ) / (2 * step)
        analytic = float(
            sum(
                np.sum(np.asarray(g, np.float64) * d)
                for g, d in zip(jax.tree.leaves(gradient), jax.tree.leaves(direction), strict=True)
            )
        )
        if abs(analytic - finite_difference) > rtol * abs(finite_difference) + floor:
            failures.append(
                f"{label}: jax.grad {analytic:.9g}, reference FD {finite_difference:.9g}"
            )
        assert label == "all" or abs(finite_difference) > 10 * floor, (
            f"{label}: the reference's derivative along this direction is ~0"
        )
    assert not failures, "\n".join(failures)


def test_float64_outputs_and_gradient_equal_the_reference():
    """The float64 model's outputs equal the reference to rounding, and `jax.grad` along one
    random direction over all parameters and one per top-level layer equals central
    differences (step 1e-5) of the reference.

    float64 makes the check sharp (relative 1e-7); the float32 model runs the same graph.
    Outputs and gradient come from one compiled function.
    """
    name = "full"
    cfg = config(name)
    values = inputs(cfg)
    params = parameters(name)
    weights = _cotangents(name)
    with jax.enable_x64(True):
        output, gradient = jax.device_get(
            _model_outputs_and_gradient(name, x64=True)(
                cast(params, np.float64), cast(values, np.float64), cast(weights, np.float64)
            )
        )
    assert_matches_reference(output, reference(name, params, values), F64_TOLERANCE)
    _check_directional_derivatives(name, gradient, params, values, weights, rtol=1e-7, floor=1e-8)


# ---------------------------------------------------------------------------
# Faults of the equations: each must make the comparison fail on its own


@pytest.mark.parametrize("fault", faults.REFERENCE_FAULTS, ids=lambda f: f.name)
def test_the_reference_catches_the_fault(fault, capsys):
    """Under the fault (parameters from the real code) the float64 model leaves the reference.

    The config has statics (so the decoder's two seeds differ) and one-variable history and
    future VSNs with a context. The error is reported; it must be far above the tolerance.
    """
    name = "single"
    with fault.patch():
        output, expected = run_float64(name, function=model_function(name, x64=True))
    with pytest.raises(AssertionError):
        assert_matches_reference(output, expected, F64_TOLERANCE)
    found = errors(output, expected)
    with capsys.disabled():
        print(f"\n{fault.name}: max |model - reference| {found}")
    assert max(found.values()) > 1e3 * F64_TOLERANCE["atol"], found


# ---------------------------------------------------------------------------
# Categorical known and observed inputs over time

B, T, H = 2, 4, 3

CATEGORICAL_CONFIG = dict(
    num_static_features=1,
    static_categorical_cardinalities=(3,),
    num_known_features=2,
    known_categorical_cardinalities=(4, 5),
    num_observed_features=2,
    observed_categorical_cardinalities=(3,),
    hidden_dim=8,
    num_heads=2,
    sequence_length=T,
    prediction_horizon=H,
    variable_hidden_dim=4,
    dropout_rate=0.1,
)


def _config(use_known_history: bool, dtype: str = "float32") -> TFTConfig:
    return TFTConfig(
        **CATEGORICAL_CONFIG,
        use_known_history=use_known_history,
        dtype=dtype,
        param_dtype=dtype,
    )


def _inputs(cfg: TFTConfig) -> dict[str, Any]:
    rng = np.random.default_rng(0)

    def codes(leading: tuple[int, ...], cardinalities: tuple[int, ...]) -> np.ndarray:
        return np.stack([rng.integers(0, n, leading) for n in cardinalities], -1).astype(np.int32)

    values: dict[str, Any] = dict(
        static=rng.normal(size=(B, cfg.num_static_features)),
        historical=rng.normal(size=(B, T, cfg.num_observed_features)),
        future=rng.normal(size=(B, H, cfg.num_known_features)),
        static_categorical=codes((B,), cfg.static_categorical_cardinalities),
        future_categorical=codes((B, H), cfg.known_categorical_cardinalities),
        observed_categorical=codes((B, T), cfg.observed_categorical_cardinalities),
    )
    if cfg.use_known_history:
        values["known_history"] = rng.normal(size=(B, T, cfg.num_known_features))
        values["known_categorical_history"] = codes((B, T), cfg.known_categorical_cardinalities)
    return values


@functools.cache
def _parameters(use_known_history: bool) -> Any:
    """Random float64 parameters in the model's layout (LayerNorms away from 1 and 0)."""
    cfg = _config(use_known_history)
    return random_parameters(cfg, _inputs(cfg), np.random.default_rng(11))


def _embed_codes(codes: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
    """Column `i` of `codes (..., C)` looks up `embedding_i`: `(..., C, width)`."""
    return np.stack(
        [tables[f"embedding_{i}"][codes[..., i]] for i in range(codes.shape[-1])], axis=-2
    )


def _reference_forward(params: Any, values: dict[str, Any]) -> dict[str, np.ndarray]:
    """The paper's TFT with categorical inputs over time, from `reference_tft`'s blocks.

    Variables, in the documented order: history = observed reals, observed
    categoricals, then (with known history) known reals and known
    categoricals; horizon = known reals, known categoricals. The known tables
    (real prescalers and categorical embeddings) are the same over the
    history and the horizon.
    """
    p = ref.to_float64(params)
    steps = values["historical"].shape[1]
    static_embedded = np.concatenate(
        [
            ref.real_embedding(values["static"], p["static_embedding"]),
            _embed_codes(values["static_categorical"], p["static_categorical_embedding"]),
        ],
        axis=-2,
    )
    static_encoding, static_weights = ref.variable_selection(static_embedded, p["static_selection"])
    contexts = {
        name: ref.grn(static_encoding, p[f"static_context_{name}"]) for name in ref.CONTEXTS
    }

    def known(reals: np.ndarray, codes: np.ndarray) -> list[np.ndarray]:
        return [
            ref.real_embedding(reals, p["known_embedding"]),
            _embed_codes(codes, p["known_categorical_embedding"]),
        ]

    history_parts = [
        ref.real_embedding(values["historical"], p["observed_embedding"]),
        _embed_codes(values["observed_categorical"], p["observed_categorical_embedding"]),
    ]
    if "known_history" in values:
        history_parts += known(values["known_history"], values["known_categorical_history"])
    history, history_weights = ref.variable_selection(
        np.concatenate(history_parts, axis=-2), p["history_selection"], contexts["selection"]
    )
    horizon, future_weights = ref.variable_selection(
        np.concatenate(known(values["future"], values["future_categorical"]), axis=-2),
        p["future_selection"],
        contexts["selection"],
    )
    encoded, state = ref.lstm(history, p["encoder"], (contexts["state_h"], contexts["state_c"]))
    decoded, _ = ref.lstm(horizon, p["decoder"], state)
    temporal = ref.gate_add_norm(
        np.concatenate([encoded, decoded], axis=1),
        np.concatenate([history, horizon], axis=1),
        p["lstm_gate"],
    )
    enriched = ref.grn(temporal, p["static_enrichment"], contexts["enrichment"])
    attended, attention = ref.interpretable_attention(
        enriched[:, steps:], enriched, p["attention"], attend_to_self=True
    )
    gated = ref.gate_add_norm(attended, enriched[:, steps:], p["attention_gate"])
    features = ref.gate_add_norm(
        ref.grn(gated, p["positionwise_grn"]), temporal[:, steps:], p["output_gate"]
    )
    return dict(
        quantiles=ref.dense(features, p["quantile_head"]),
        attention=attention,
        static_weights=static_weights,
        history_weights=history_weights,
        future_weights=future_weights,
    )


@pytest.mark.parametrize("use_known_history", [True, False])
def test_categorical_inputs_over_time_equal_the_float64_reference(use_known_history):
    params = _parameters(use_known_history)
    values = _inputs(_config(use_known_history))
    expected = _reference_forward(params, values)
    model = TemporalFusionTransformer(_config(use_known_history, "float64"))
    with jax.enable_x64(True):
        output = jax.device_get(
            jax.jit(lambda v, x: model.apply({"params": v}, **x, deterministic=True))(
                cast(params, np.float64), cast(values, np.float64)
            )
        )
    for field in ref.OUTPUT_FIELDS:
        np.testing.assert_allclose(
            np.asarray(getattr(output, field), np.float64),
            expected[field],
            rtol=1e-10,
            atol=1e-10,
            err_msg=f"{field} differs from the float64 reference",
        )
    # Every categorical column carries weight that depends on its codes.
    assert np.ptp(expected["history_weights"][..., 2]) > 1e-3
    assert np.ptp(expected["future_weights"][..., 3]) > 1e-3
