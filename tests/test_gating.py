"""The gating blocks: the GRN against the paper's equations, its context checks, and the
`deterministic` flag of `GatedLinearUnit` (a bool, static under `jit`).

The GRN reference is float64 NumPy written here: LayerNorm(skip(x) + GLU(W1
ELU(W2 x + W3 c + b2) + b1)), with random LayerNorm parameters too.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.block_inputs import _CONTEXT, _X
from tft_jax import GatedResidualNetwork
from tft_jax.gating import GatedLinearUnit

# ---------------------------------------------------------------------------
# GatedResidualNetwork with and without a context


def _numpy_grn(params: dict, x: np.ndarray, context: np.ndarray | None) -> np.ndarray:
    """The paper's GRN in float64: LayerNorm(skip(x) + GLU(W1 ELU(W2 x + W3 c + b2) + b1))."""

    def dense(name: str, z: np.ndarray, tree: dict = params) -> np.ndarray:
        layer = tree[name]
        out = z @ np.asarray(layer["kernel"], np.float64)
        return out + np.asarray(layer["bias"], np.float64) if "bias" in layer else out

    x = np.asarray(x, np.float64)
    skip = dense("skip", x) if "skip" in params else x
    eta = dense("input", x)
    if context is not None:
        eta = eta + dense("context", np.asarray(context, np.float64))[:, None, :]
    eta = dense("hidden", np.where(eta > 0, eta, np.expm1(np.minimum(eta, 0.0))))
    gate_add_norm = params["gate_add_norm"]
    value, gate = np.split(dense("projection", eta, gate_add_norm["glu"]), 2, axis=-1)
    z = skip + value / (1.0 + np.exp(-gate))
    mean = z.mean(-1, keepdims=True)
    variance = ((z - mean) ** 2).mean(-1, keepdims=True)
    norm = gate_add_norm["layer_norm"]
    return (z - mean) / np.sqrt(variance + 1e-6) * np.asarray(
        norm["scale"], np.float64
    ) + np.asarray(norm["bias"], np.float64)


# Inits, random variables and the forwards checked against NumPy run jitted: op by op each
# compiled every primitive apart. The refusals are called as before, op by op.
@functools.partial(jax.jit, static_argnums=0)
def _init(module: Any, key: Any, *args: Any) -> dict:
    return module.init(key, *args)


@functools.partial(jax.jit, static_argnums=0)
def _apply(module: Any, variables: dict, *args: Any) -> Any:
    return module.apply(variables, *args)


@pytest.fixture(scope="module")
def grn_with_context() -> tuple[GatedResidualNetwork, dict]:
    """A GRN `(2, 3, 4) -> (2, 3, 6)` with a `(2, 5)` context; random LayerNorm parameters too."""
    grn = GatedResidualNetwork(6, hidden_features=3)
    return grn, _random_variables(grn, _X, _CONTEXT)


def test_grn_with_context_and_a_learned_skip_matches_the_paper_equations(grn_with_context):
    grn, variables = grn_with_context
    got = _apply(grn, variables, _X, _CONTEXT)
    expected = _numpy_grn(variables["params"], _X, _CONTEXT)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_grn_initialized_with_a_context_refuses_a_call_without_one(grn_with_context):
    # Flax skips parameters a call does not use: the context term was dropped silently.
    grn, variables = grn_with_context
    with pytest.raises(ValueError, match="context is None, but the parameters hold a context"):
        grn.apply(variables, _X)


def test_grn_refuses_a_context_of_another_width_or_none_at_init(grn_with_context):
    grn, variables = grn_with_context
    wider = np.ones((*_CONTEXT.shape[:-1], _CONTEXT.shape[-1] + 2), np.float32)
    with pytest.raises(ValueError, match=r"context has width \d+ \(its last axis\), but the "):
        grn.apply(variables, _X, wider)
    without = _init(grn, jax.random.key(1), _X)
    with pytest.raises(ValueError, match=r"a context was given, but the network was initialized "):
        grn.apply(without, _X, _CONTEXT)


def test_grn_initialized_without_a_context_still_runs_without_one():
    grn = GatedResidualNetwork(4)
    variables = _init(grn, jax.random.key(0), _X)
    np.testing.assert_allclose(
        _apply(grn, variables, _X), _numpy_grn(variables["params"], _X, None), rtol=1e-5, atol=1e-5
    )


# ---------------------------------------------------------------------------
# `deterministic` must be a bool


@pytest.mark.parametrize("value", ["False", "True", 0.0, [False]])
def test_deterministic_that_is_not_a_bool_raises_type_error_naming_it(value: Any) -> None:
    # "False" is truthy: it used to switch dropout off without a word.
    module = GatedLinearUnit(4, dropout_rate=0.5)
    x = jnp.ones((2, 3))
    variables = _init(module, jax.random.key(0), x)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        module.apply(variables, x, deterministic=value, rngs={"dropout": jax.random.key(1)})


def test_traced_deterministic_raises_type_error_naming_it_and_is_ignored_without_dropout() -> None:
    x = jnp.ones((2, 3))
    module = GatedLinearUnit(4, dropout_rate=0.5)
    variables = _init(module, jax.random.key(0), x)
    apply = jax.jit(
        lambda d: module.apply(variables, x, deterministic=d, rngs={"dropout": jax.random.key(1)})
    )
    with pytest.raises(TypeError, match=r"deterministic.*static"):
        apply(False)
    plain = GatedLinearUnit(4)
    plain_variables = _init(plain, jax.random.key(0), x)
    traced = jax.jit(lambda d: plain.apply(plain_variables, x, deterministic=d))(False)
    want = plain.apply(plain_variables, x, deterministic=True)
    np.testing.assert_allclose(traced, want, rtol=1e-6, atol=1e-7)


def test_numpy_and_array_bools_and_zero_or_one_are_accepted_as_deterministic() -> None:
    module = GatedLinearUnit(4, dropout_rate=0.5)
    x = jnp.ones((2, 3))
    variables = module.init(jax.random.key(0), x)
    rngs = {"dropout": jax.random.key(1)}
    on = module.apply(variables, x, deterministic=False, rngs=rngs)
    off = module.apply(variables, x, deterministic=True, rngs=rngs)
    for value, want in [(np.bool_(False), on), (jnp.array(True), off), (0, on), (1, off)]:
        got = module.apply(variables, x, deterministic=value, rngs=rngs)
        np.testing.assert_array_equal(got, want)


def test_an_input_of_another_width_than_at_init_is_named():
    # Flax said "Could not find parameter named "kernel" in scope "/skip"" (an input as
    # wide as the output skips the learned skip) or named an initializer at "/input".
    network = GatedResidualNetwork(8, dropout_rate=0.0)
    variables = _init(network, jax.random.key(0), jnp.ones((2, 5)))
    for width in (6, 8):
        with pytest.raises(ValueError, match=rf"x has width {width} .* inputs of width 5"):
            network.apply(variables, jnp.ones((2, width)))


# ---------------------------------------------------------------------------
# Per-variable networks: variable-major inputs with a context, and the batch axis


@functools.partial(jax.jit, static_argnums=0)
def _random_variables(module: Any, *args: Any) -> dict:
    """`module`'s variables at init, each drawn again from a standard normal."""
    variables = module.init(jax.random.key(0), *args)
    leaves, tree = jax.tree.flatten(variables)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    return jax.tree.unflatten(
        tree,
        [
            jax.random.normal(k, leaf.shape, leaf.dtype)
            for k, leaf in zip(keys, leaves, strict=True)
        ],
    )


def test_variable_major_grn_with_a_context_and_a_narrowing_skip_is_one_grn_per_variable():
    # x (V, B, T, I) with V != B and I > features (a learned skip): variable v is the
    # paper's GRN with its own weights on x[v], the context (B, C) shared by all.
    num_variables, batch, steps, inputs, features = 3, 2, 4, 5, 3
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_variables, batch, steps, inputs)).astype(np.float32)
    context = rng.normal(size=(batch, 6)).astype(np.float32)
    grn = GatedResidualNetwork(
        features, hidden_features=2, num_variables=num_variables, variable_major=True
    )
    variables = _random_variables(grn, x, context)
    got = np.asarray(_apply(grn, variables, x, context))
    params = jax.tree.map(np.asarray, variables["params"])  # sliced on the host below
    assert got.shape == (num_variables, batch, steps, features)
    for v in range(num_variables):
        mine = {
            name: {key: value[v] for key, value in params[name].items()}
            for name in ("input", "hidden", "skip")
        }
        mine["context"] = params["context"]
        glu = params["gate_add_norm"]["glu"]["projection"]
        norm = params["gate_add_norm"]["layer_norm"]
        mine["gate_add_norm"] = {
            "glu": {"projection": {key: value[v] for key, value in glu.items()}},
            "layer_norm": {key: value[v] for key, value in norm.items()},
        }
        expected = _numpy_grn(mine, x[v], context)
        np.testing.assert_allclose(got[v], expected, rtol=1e-5, atol=1e-5, err_msg=f"v={v}")


def test_per_variable_grn_with_a_context_refuses_an_input_without_a_batch_axis():
    # (V, I) has no batch axis: with V equal to the context's rows, the variables were
    # taken for the batch, silently.
    grn = GatedResidualNetwork(3, num_variables=3)
    variables = _init(grn, jax.random.key(0), np.ones((2, 3, 5), np.float32), np.ones((2, 4)))
    with pytest.raises(ValueError, match="must have a batch axis"):
        grn.apply(variables, np.ones((3, 5), np.float32), np.ones((3, 4), np.float32))


# ---------------------------------------------------------------------------
# Input-validation gaps: scalar and zero-width inputs, dtypes that are not floating


def _gate_add_norm() -> Any:
    from tft_jax.gating import GateAddNorm

    return GateAddNorm(4)


def test_glu_and_gate_add_norm_refuse_a_scalar_x() -> None:
    # Before: IndexError reading x.shape[-1] (check_input_width in linear.py).
    glu = GatedLinearUnit(4)
    variables = _init(glu, jax.random.key(0), np.ones((2, 3), np.float32))
    with pytest.raises(
        ValueError,
        match=r"GatedLinearUnit: x must have a feature axis \(\.\.\., I\), got shape \(\)",
    ):
        glu.apply(variables, np.float32(1.0))
    with pytest.raises(ValueError, match=r"GatedLinearUnit: x must have a feature axis"):
        glu.init(jax.random.key(0), np.float32(1.0))
    gan = _gate_add_norm()
    variables = _init(gan, jax.random.key(0), np.ones((2, 3), np.float32), np.ones((2, 4)))
    with pytest.raises(
        ValueError, match=r"GateAddNorm: x must have a feature axis \(\.\.\., I\), got shape \(\)"
    ):
        gan.apply(variables, np.float32(1.0), np.ones((4,), np.float32))


@pytest.mark.parametrize("block", ["glu", "gate_add_norm", "grn"])
def test_gating_blocks_refuse_a_zero_width_x_at_init(block: str) -> None:
    # Before: ZeroDivisionError from the kernel initializer (its fan-in).
    x = jnp.ones((2, 4, 0))
    owner, init = {
        "glu": ("GatedLinearUnit", lambda: GatedLinearUnit(4).init(jax.random.key(0), x)),
        "gate_add_norm": (
            "GateAddNorm",
            lambda: _gate_add_norm().init(jax.random.key(0), x, jnp.ones((2, 4, 4))),
        ),
        "grn": ("GatedResidualNetwork", lambda: GatedResidualNetwork(4).init(jax.random.key(0), x)),
    }[block]
    with pytest.raises(
        ValueError,
        match=rf"{owner}: x must have a positive width \(its last axis\), got shape \(2, 4, 0\)",
    ):
        init()


@pytest.mark.parametrize("block", [GatedLinearUnit, GatedResidualNetwork])
def test_gating_blocks_refuse_dtypes_that_are_not_floating(block: Any) -> None:
    # Before: accepted; "floaty" failed deep in JAX at the first call, int32 parameters
    # were initialized as integers.
    owner = block.__name__
    with pytest.raises(TypeError, match=rf"{owner}: dtype must be a floating dtype, got 'floaty'"):
        block(4, dtype="floaty")
    with pytest.raises(
        ValueError, match=rf"{owner}: param_dtype must be one of \[.*'float32'.*\], got 'int32'"
    ):
        block(4, param_dtype=jnp.int32)
    assert block(4, dtype=jnp.bfloat16, param_dtype="float32").dtype == jnp.bfloat16
    assert block(4, dtype=None).dtype is None
