"""The full TFT: shapes, interpretability weights, context routing, causality, gradients, dtypes."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tft_jax import TemporalFusionTransformer, TFTConfig
from tft_jax.linear import Linear, VariableLinear

CONFIG = TFTConfig(
    num_static_features=2,
    num_known_features=2,
    num_observed_features=3,
    hidden_dim=8,
    num_heads=2,
    sequence_length=6,
    prediction_horizon=3,
    dropout_rate=0.1,
    static_categorical_cardinalities=(3,),
    use_known_history=True,
)
BATCH = 4


def make_inputs(cfg: TFTConfig = CONFIG, batch: int = BATCH, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    inputs = dict(
        static=normal(batch, cfg.num_static_features),
        historical=normal(batch, cfg.sequence_length, cfg.num_observed_features),
        future=normal(batch, cfg.prediction_horizon, cfg.num_known_features),
    )
    if cfg.use_known_history:
        inputs["known_history"] = normal(batch, cfg.sequence_length, cfg.num_known_features)
    if cfg.static_categorical_cardinalities:
        inputs["static_categorical"] = np.stack(
            [rng.integers(0, c, size=batch) for c in cfg.static_categorical_cardinalities], 1
        ).astype(np.int32)
    return inputs


@functools.cache
def init_variables(cfg: TFTConfig = CONFIG) -> dict:
    model = TemporalFusionTransformer(cfg)
    return jax.jit(model.init)({"params": jax.random.key(0)}, **make_inputs(cfg))


@functools.partial(jax.jit, static_argnames=("cfg", "deterministic", "capture"))
def apply(variables, inputs, rng, cfg=CONFIG, deterministic=True, capture=False):
    model = TemporalFusionTransformer(cfg)
    if capture:
        names = {"encoder", "static_enrichment", "lstm_gate"}
        return model.apply(
            variables,
            **inputs,
            deterministic=deterministic,
            rngs={"dropout": rng},
            capture_intermediates=lambda module, _: module.name in names,
            mutable=["intermediates"],
        )
    return model.apply(variables, **inputs, deterministic=deterministic, rngs={"dropout": rng})


def test_output_shapes_follow_the_config():
    out = apply(init_variables(), make_inputs(), jax.random.key(0))
    t, h = CONFIG.sequence_length, CONFIG.prediction_horizon
    assert out.quantiles.shape == (BATCH, h, 3)
    assert out.attention.shape == (BATCH, CONFIG.num_heads, h, t + h)
    assert out.static_weights.shape == (BATCH, 3)
    assert out.history_weights.shape == (BATCH, t, 3 + 2)
    assert out.future_weights.shape == (BATCH, h, 2)


def test_every_weight_row_sums_to_one():
    out = apply(init_variables(), make_inputs(), jax.random.key(0))
    for name in ("attention", "static_weights", "history_weights", "future_weights"):
        weights = np.asarray(getattr(out, name))
        assert np.all(weights >= 0), name
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5, err_msg=name)


def test_attention_is_causal_and_includes_the_current_step_by_default():
    out = apply(init_variables(), make_inputs(), jax.random.key(0))
    t = CONFIG.sequence_length
    w = np.asarray(out.attention)
    for i in range(CONFIG.prediction_horizon):
        np.testing.assert_array_equal(w[:, :, i, t + i + 1 :], 0.0)
        assert np.all(w[:, :, i, t + i] > 0)


def test_attend_to_self_false_forbids_the_diagonal():
    cfg = dataclasses.replace(CONFIG, attend_to_self=False)
    # The flag only masks: its init is CONFIG's bit for bit, compiled once already.
    out = apply(init_variables(), make_inputs(cfg), jax.random.key(0), cfg=cfg)
    t = cfg.sequence_length
    w = np.asarray(out.attention)
    for i in range(cfg.prediction_horizon):
        np.testing.assert_array_equal(w[:, :, i, t + i :], 0.0)
        np.testing.assert_allclose(w[:, :, i].sum(-1), 1.0, rtol=1e-5)


def test_forecast_at_step_i_ignores_known_inputs_after_step_i():
    inputs = make_inputs()
    base = np.asarray(apply(init_variables(), inputs, jax.random.key(0)).quantiles)
    for i in range(CONFIG.prediction_horizon - 1):
        changed = dict(inputs, future=inputs["future"].copy())
        changed["future"][:, i + 1 :] += 3.0
        out = np.asarray(apply(init_variables(), changed, jax.random.key(0)).quantiles)
        np.testing.assert_array_equal(out[:, : i + 1], base[:, : i + 1])
        assert not np.allclose(out[:, i + 1 :], base[:, i + 1 :])


def test_samples_in_a_batch_do_not_interact():
    inputs = make_inputs()
    base = np.asarray(apply(init_variables(), inputs, jax.random.key(0)).quantiles)
    changed = {k: v.copy() for k, v in inputs.items()}
    changed["historical"][1:] += 4.0
    changed["static_categorical"][1:] = (changed["static_categorical"][1:] + 1) % 3
    out = np.asarray(apply(init_variables(), changed, jax.random.key(0)).quantiles)
    np.testing.assert_allclose(out[0], base[0], rtol=1e-6, atol=1e-6)
    assert not np.allclose(out[1:], base[1:])


def perturbed(variables: dict, module: str, seed: int = 1) -> dict:
    """A copy of `variables` with every parameter of `module` randomly moved."""
    params = dict(variables["params"])
    leaves, treedef = jax.tree.flatten(params[module])
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    params[module] = jax.tree.unflatten(
        treedef, [x + jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    )
    return {"params": params}


def intermediates(variables):
    out, state = apply(variables, make_inputs(), jax.random.key(0), capture=True)
    captured = state["intermediates"]
    return {
        "static_weights": out.static_weights,
        "history_weights": out.history_weights,
        "future_weights": out.future_weights,
        "encoder": captured["encoder"]["__call__"][0][0],
        "lstm_gate": captured["lstm_gate"]["__call__"][0],
        "static_enrichment": captured["static_enrichment"]["__call__"][0],
        "quantiles": out.quantiles,
    }


@pytest.mark.parametrize(
    "context, reaches, leaves_alone",
    [
        ("selection", {"history_weights", "future_weights"}, {"static_weights"}),
        ("state_h", {"encoder"}, {"static_weights", "history_weights", "future_weights"}),
        ("state_c", {"encoder"}, {"static_weights", "history_weights", "future_weights"}),
        (
            "enrichment",
            {"static_enrichment", "quantiles"},
            {"static_weights", "history_weights", "future_weights", "encoder", "lstm_gate"},
        ),
    ],
)
def test_each_static_context_reaches_its_own_destination(context, reaches, leaves_alone):
    # A context routed to the wrong block (the enrichment context fed to variable
    # selection, say) changes something upstream of its destination.
    base = intermediates(init_variables())
    moved = intermediates(perturbed(init_variables(), f"static_context_{context}"))
    for name in reaches:
        assert not np.allclose(moved[name], base[name], atol=1e-6), (
            f"the {context} context does not reach {name}"
        )
    for name in leaves_alone:
        np.testing.assert_array_equal(
            moved[name], base[name], err_msg=f"the {context} context leaks into {name}"
        )


@functools.partial(jax.jit, static_argnames=("cfg",))
def loss_grads(variables, inputs, rng, cfg=CONFIG):
    def loss(params, inputs):
        out = TemporalFusionTransformer(cfg).apply(
            {"params": params}, **inputs, deterministic=False, rngs={"dropout": rng}
        )
        return jnp.mean(out.quantiles.astype(jnp.float32) ** 2)

    float_inputs = {k: v for k, v in inputs.items() if k != "static_categorical"}
    rest = {k: v for k, v in inputs.items() if k == "static_categorical"}
    return jax.grad(lambda p, f: loss(p, {**f, **rest}), argnums=(0, 1))(
        variables["params"], float_inputs
    )


def dead_leaves(tree) -> list[str]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [jax.tree_util.keystr(p) for p, g in flat if not np.any(np.asarray(g) != 0)]


@pytest.mark.parametrize(
    "cfg",
    [
        CONFIG,
        dataclasses.replace(
            CONFIG,
            num_static_features=0,
            static_categorical_cardinalities=(),
            use_known_history=False,
            variable_hidden_dim=4,
            compact_selection=True,
        ),
    ],
    ids=["statics_known_history", "no_statics_narrow_variables_compact_selection"],
)
def test_every_parameter_and_input_receives_a_finite_nonzero_gradient(cfg):
    inputs = make_inputs(cfg)
    if cfg.num_static_features == 0:
        inputs["static"] = None
    param_grads, input_grads = loss_grads(init_variables_for(cfg), inputs, jax.random.key(3), cfg)
    assert not dead_leaves(param_grads), dead_leaves(param_grads)
    for name, g in input_grads.items():
        if g is None:
            continue
        assert np.all(np.isfinite(g)), name
        assert np.linalg.norm(g) > 0, f"no gradient reaches {name}"


def init_variables_for(cfg: TFTConfig) -> dict:
    if cfg.num_static_features:
        return init_variables(cfg)
    inputs = dict(make_inputs(cfg), static=None)
    return jax.jit(TemporalFusionTransformer(cfg).init)({"params": jax.random.key(0)}, **inputs)


def test_dropout_changes_training_outputs_only():
    variables, inputs = init_variables(), make_inputs()
    a = apply(variables, inputs, jax.random.key(0)).quantiles
    b = apply(variables, inputs, jax.random.key(1)).quantiles
    np.testing.assert_array_equal(a, b)
    c = apply(variables, inputs, jax.random.key(0), deterministic=False).quantiles
    d = apply(variables, inputs, jax.random.key(1), deterministic=False).quantiles
    assert not np.allclose(c, d)


def test_dropout_acts_in_the_gates_of_the_reference_code_and_not_before_the_head():
    # The paper's code and pytorch-forecasting apply no dropout in the gated skip
    # before the quantile head (output_gate); the LSTM and attention gates drop.
    dropping: set[str] = set()

    def record(next_fun, args, kwargs, context):
        module = context.module
        if isinstance(module, nn.Dropout) and module.rate > 0:
            dropping.add(module.path[0])
        return next_fun(*args, **kwargs)

    # The interceptor runs as the forward is traced: eval_shape traces it and compiles
    # nothing, where the op-by-op apply compiled ~300 primitives.
    variables, inputs = init_variables(), make_inputs()
    with nn.intercept_methods(record):
        jax.eval_shape(
            lambda: TemporalFusionTransformer(CONFIG).apply(
                variables, **inputs, deterministic=False, rngs={"dropout": jax.random.key(0)}
            )
        )
    assert {"lstm_gate", "attention_gate", "static_enrichment", "positionwise_grn"} <= dropping
    assert "output_gate" not in dropping


def test_bfloat16_compute_runs_end_to_end_with_float32_parameters():
    cfg = dataclasses.replace(CONFIG, dtype="bfloat16")
    inputs = make_inputs(cfg)
    # The dtypes of the bfloat16 model's own init, traced without compiling; its values
    # are CONFIG's init bit for bit (the compute dtype draws nothing), compiled already.
    init = TemporalFusionTransformer(cfg).init
    initial = jax.eval_shape(lambda: init({"params": jax.random.key(0)}, **inputs))
    assert {leaf.dtype for leaf in jax.tree.leaves(initial)} == {jnp.dtype(jnp.float32)}
    variables = init_variables()
    out = apply(variables, inputs, jax.random.key(0), cfg=cfg)
    assert out.quantiles.dtype == jnp.bfloat16
    reference = apply(variables, inputs, jax.random.key(0)).quantiles
    np.testing.assert_allclose(np.asarray(out.quantiles, np.float32), reference, atol=0.15)
    param_grads, _ = loss_grads(variables, inputs, jax.random.key(0), cfg)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(param_grads))
    assert {g.dtype for g in jax.tree.leaves(param_grads)} == {jnp.dtype(jnp.float32)}


def test_batched_variable_linear_equals_separate_linear_maps():
    x = np.random.default_rng(0).normal(size=(2, 5, 3, 4)).astype(np.float32)
    layer = VariableLinear(3, 6)
    # Jitted: op by op, each primitive compiled apart (the three maps share one program).
    variables = jax.jit(lambda: layer.init(jax.random.key(0), x))()
    y = jax.jit(layer.apply)(variables, x)
    kernel, bias = (np.asarray(variables["params"][n]) for n in ("kernel", "bias"))
    linear = jax.jit(Linear(6).apply)
    for v in range(3):
        single = linear({"params": {"kernel": kernel[v], "bias": bias[v]}}, x[:, :, v])
        np.testing.assert_allclose(y[:, :, v], single, rtol=1e-5, atol=1e-6)


# Validation at the boundary.


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("hidden_dim", 10, r"hidden_dim \(10\) must be divisible by .*num_heads \(4\)"),
        ("hidden_dim", 2, r"TFTConfig.hidden_dim must be >= 3, got 2: every gate, add & norm"),
        ("dropout_rate", 1.0, r"dropout_rate must be in \[0, 1\), got 1.0"),
        ("quantiles", (0.5, 0.1), "strictly increasing"),
        ("quantiles", (0.0, 0.5), r"must lie in \(0, 1\)"),
        ("num_observed_features", 0, "num_observed_features must be >= 1, got 0"),
        ("sequence_length", 0, "sequence_length must be >= 1, got 0"),
        ("static_categorical_cardinalities", (3, 0), r"cardinalities\[1\] must be >= 1"),
        ("dtype", "int8", "dtype must be one of"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        TFTConfig(**{field: value})


def test_config_rejects_non_integer_sizes():
    with pytest.raises(TypeError, match="hidden_dim must be an int"):
        TFTConfig(hidden_dim=32.0)


def test_derived_config_fields():
    assert CONFIG.num_quantiles == 3
    assert CONFIG.input_dim == 2 + 1 + 2 + 3
    assert CONFIG.variable_width == CONFIG.hidden_dim


@pytest.mark.parametrize("flag", ["compact_selection", "attend_to_self", "use_known_history"])
def test_config_flags_must_be_bools(flag):
    with pytest.raises(TypeError, match=f"TFTConfig.{flag} must be a bool, got 1"):
        TFTConfig(**{flag: 1})


def test_compact_selection_narrows_only_the_selection_grns_to_min_hidden_and_variables():
    wide = dataclasses.replace(CONFIG, hidden_dim=16, num_observed_features=12)
    compact = dataclasses.replace(wide, compact_selection=True)

    def shapes(cfg):
        inputs = make_inputs(cfg)
        init = TemporalFusionTransformer(cfg).init
        variables = jax.eval_shape(lambda: init({"params": jax.random.key(0)}, **inputs))
        return jax.tree.map(lambda leaf: leaf.shape, variables["params"])

    paper, small = shapes(wide), shapes(compact)
    # V = 3 statics, 12 observed + 2 known over the history, 2 known in the future.
    for name, variables in [("static", 3), ("history", 14), ("future", 2)]:
        hidden = min(16, variables)
        grn = small[f"{name}_selection"]["selection_grn"]
        assert grn["hidden"]["kernel"] == (hidden, hidden), name
        assert grn["gate_add_norm"]["glu"]["projection"]["kernel"] == (hidden, 2 * variables)
        assert paper[f"{name}_selection"]["selection_grn"]["hidden"]["kernel"] == (16, 16)
    assert small["history_selection"]["selection_grn"]["context"]["kernel"] == (16, 14)
    # Everything else, the per-variable GRNs included, is untouched.
    networks = {"static_selection", "history_selection", "future_selection"}
    assert small.keys() == paper.keys()
    for name in small.keys() - networks:
        assert small[name] == paper[name], name
    for name in networks:
        assert small[name]["variable_grns"] == paper[name]["variable_grns"], name


@pytest.mark.parametrize(
    "name, shape, message",
    [
        ("historical", (BATCH, 5, 3), r"historical must have shape \(B, 6, 3\), got \(4, 5, 3\)"),
        ("future", (BATCH, 3, 4), r"future must have shape \(4, 3, 2\), got \(4, 3, 4\)"),
        ("static", (BATCH + 1, 2), r"static must have shape \(4, 2\), got \(5, 2\)"),
        ("known_history", (BATCH, 6), r"known_history must have shape \(4, 6, 2\), got \(4, 6\)"),
    ],
)
def test_wrong_input_shapes_name_the_argument_and_both_shapes(name, shape, message):
    inputs = dict(make_inputs(), **{name: np.zeros(shape, np.float32)})
    with pytest.raises(ValueError, match=message):
        TemporalFusionTransformer(CONFIG).apply(init_variables(), **inputs)


@pytest.mark.parametrize(
    "name, convert, message",
    [
        ("historical", lambda a: a.tolist(), "historical must be a real-valued .* got list"),
        (
            "future",
            lambda a: a.astype(str),
            "future must be a real-valued .* got ndarray of dtype <U",
        ),
        ("static", lambda a: a.astype(object), "static must be a real-valued .* dtype object"),
        (
            "static_categorical",
            lambda a: a.tolist(),
            "static_categorical must be integer codes in a .* got list",
        ),
    ],
    ids=["nested_list", "strings", "objects", "codes_as_list"],
)
def test_inputs_that_are_not_numeric_arrays_raise_type_error_naming_the_argument(
    name, convert, message
):
    # JAX's own message ("Cannot determine dtype of [[...]]") named no argument.
    inputs = make_inputs()
    inputs[name] = convert(inputs[name])
    with pytest.raises(TypeError, match=f"TemporalFusionTransformer: {message}"):
        TemporalFusionTransformer(CONFIG).apply(init_variables(), **inputs)


def test_out_of_range_categorical_codes_are_rejected():
    inputs = make_inputs()
    inputs["static_categorical"] = inputs["static_categorical"] + 3
    with pytest.raises(ValueError, match=r"static_categorical\[:, 0\] must lie in \[0, 3\)"):
        TemporalFusionTransformer(CONFIG).apply(init_variables(), **inputs)


def test_known_history_without_the_config_flag_is_rejected():
    cfg = dataclasses.replace(CONFIG, use_known_history=False)
    with pytest.raises(ValueError, match="use_known_history"):
        TemporalFusionTransformer(cfg).apply(init_variables(), **make_inputs())


def test_model_works_from_flax_nnx_through_the_bridge():
    from flax import nnx
    from flax.nnx import bridge

    inputs = make_inputs()
    model = bridge.ToNNX(TemporalFusionTransformer(CONFIG), rngs=nnx.Rngs(0, dropout=1))
    # Under nnx.jit: op by op, the TFT's ~1000 primitives would each compile.
    nnx.jit(lambda m, kw: bridge.lazy_init(m, **kw))(model, inputs)
    out = nnx.jit(lambda m, kw: m(**kw, deterministic=True))(model, inputs)
    assert out.quantiles.shape == (BATCH, CONFIG.prediction_horizon, 3)
    # The NNX module holds the same parameters; the Linen apply gives the same forecast.
    linen_params = nnx.to_pure_dict(nnx.split(model, nnx.Param, ...)[1])
    # The Linen apply, deterministic: the jitted `apply` the other tests compiled for CONFIG.
    reference = apply({"params": linen_params}, inputs, jax.random.key(0))
    np.testing.assert_allclose(out.quantiles, reference.quantiles, rtol=1e-5, atol=1e-6)


# Variable-major per-variable layers: the layout the variable selection networks run in.


def test_variable_major_variable_linear_equals_the_variable_last_layout():
    x = np.random.default_rng(1).normal(size=(2, 5, 3, 4)).astype(np.float32)
    last = VariableLinear(3, 6)
    major = VariableLinear(3, 6, variable_major=True)
    # Jitted (and the shapes traced only): op by op, each primitive compiled apart.
    variables = jax.jit(lambda: last.init(jax.random.key(0), x))()
    # Same parameter names and shapes in both layouts.
    major_variables = jax.eval_shape(lambda: major.init(jax.random.key(0), np.moveaxis(x, -2, 0)))
    assert jax.tree.map(np.shape, major_variables) == jax.tree.map(np.shape, variables)
    expected = np.moveaxis(np.asarray(jax.jit(last.apply)(variables, x)), -2, 0)
    np.testing.assert_allclose(
        jax.jit(major.apply)(variables, np.moveaxis(x, -2, 0)), expected, rtol=1e-6, atol=1e-6
    )
    with pytest.raises(ValueError, match=r"\(3, \.\.\., I\), got \(2, 5, 3, 4\)"):
        major.apply(variables, x)


def variable_last_selection(variables, embedded, context, features, dot_general_cls=None):
    """The variable selection network as computed before the variable-major layout.

    Per-variable GRNs on `(B, T, V, width)` (conditioned on the context when
    V = 1), the selection GRN, softmax, and the weighted sum as an einsum over
    `V`: the reference for the current module. `variables` holds each
    submodule's collections; returns `(combined, weights, quant_stats)`.
    """
    from tft_jax.gating import GatedResidualNetwork

    num_variables, width = embedded.shape[-2:]
    common = dict(dropout_rate=0.1, dot_general_cls=dot_general_cls)
    single = num_variables == 1
    processed, stats = GatedResidualNetwork(
        features, hidden_features=width, num_variables=num_variables, **common
    ).apply(
        variables["variable_grns"],
        embedded,
        context if single else None,
        deterministic=True,
        mutable=["quant_stats"],
    )
    quant_stats = {"variable_grns": stats.get("quant_stats", {})}
    if single:
        weights = jnp.ones(embedded.shape[:-1], jnp.float32)
    else:
        flat = embedded.reshape(*embedded.shape[:-2], num_variables * width)
        logits, stats = GatedResidualNetwork(
            num_variables, hidden_features=features, **common
        ).apply(
            variables["selection_grn"], flat, context, deterministic=True, mutable=["quant_stats"]
        )
        quant_stats["selection_grn"] = stats.get("quant_stats", {})
        weights = jax.nn.softmax(logits, axis=-1)
    combined = jnp.einsum("...v,...vd->...d", weights, processed)
    return combined, weights, {name: tree for name, tree in quant_stats.items() if tree}


@pytest.mark.parametrize("num_variables, quantized", [(3, False), (3, True), (1, False)])
def test_variable_selection_equals_the_variable_last_layout_with_gradients(
    num_variables, quantized
):
    from tft_jax.variable_selection import VariableSelectionNetwork

    dot_general_cls = None
    if quantized:
        from qat import QATConfig
        from qat.dot_general import QATDotGeneral

        # Observers update in this call: their statistics must agree too.
        dot_general_cls = functools.partial(QATDotGeneral, config=QATConfig(), calibrate=True)
    features, rng = 6, np.random.default_rng(2)
    embedded = rng.normal(size=(2, 4, num_variables, 5)).astype(np.float32)  # (B, T, V, width)
    context = rng.normal(size=(2, features)).astype(np.float32)
    vsn = VariableSelectionNetwork(
        num_variables, features, dropout_rate=0.1, dot_general_cls=dot_general_cls
    )
    variables = jax.jit(vsn.init)(jax.random.key(0), embedded, context)
    stats = variables.get("quant_stats", {})

    def current(params, embedded):
        (combined, weights), updated = vsn.apply(
            {**variables, "params": params},
            embedded,
            context,
            deterministic=True,
            mutable=["quant_stats"],
        )
        return combined, weights, dict(updated.get("quant_stats", {}))

    def reference(params, embedded):
        per_module = {
            name: {"params": params[name], **({"quant_stats": stats[name]} if stats else {})}
            for name in params
        }
        return variable_last_selection(per_module, embedded, context, features, dot_general_cls)

    cotangent = rng.normal(size=(2, 4, features)).astype(np.float32)

    @functools.partial(jax.jit, static_argnames=("use_reference",))
    def value_and_grads(params, embedded, use_reference):
        def scalar(params, embedded):
            combined, weights, stats = (reference if use_reference else current)(params, embedded)
            value = jnp.sum(combined * cotangent) + jnp.sum(jnp.sin(weights))
            return value, (combined, weights, stats)

        return jax.grad(scalar, argnums=(0, 1), has_aux=True)(params, embedded)

    grads, got = value_and_grads(variables["params"], embedded, False)
    expected, want = value_and_grads(variables["params"], embedded, True)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
