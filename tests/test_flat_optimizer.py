"""Tests of the flat-vector clip + AdamW (`tft_jax.flat_optimizer`) behind `make_optimizer`.

Two references: optax's own per-leaf chain `optax.chain(clip_by_global_norm,
adamw(mask=...))`, which the flat transformation must reproduce step after
step to float32 rounding, and float64 NumPy AdamW steps from the paper's
equations (one written here, one in `tests/linear_quantile_model.py`). A
checkpointed flat state is restored only with the parameters it was built for.
"""

from __future__ import annotations

import functools
import math
import pathlib
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import serialization

from tests.linear_quantile_model import NumpyClipAdamW
from tft_jax.checkpoint import TrainingCheckpointer
from tft_jax.flat_optimizer import (
    FlatAdamWState,
    flat_adamw,
    flat_updates,
    flatten,
    global_norm,
    is_flat_adamw,
    scheduled_learning_rate,
    unflatten,
)
from tft_jax.schedules import WarmupCosine
from tft_jax.train import (
    Optimizer,
    decay_model_params_only,
    make_optimizer,
    warmup_cosine_schedule,
)

# Several shapes (a scalar included) and two collections, so the default mask
# decays `params` and leaves `quant_params` alone.
SHAPES = {
    "params": {"dense": {"kernel": (3, 4), "bias": (4,)}, "norm": {"scale": (2, 1, 3)}},
    "quant_params": {"step": (), "offset": (2,)},
}
STEPS = 4
LR = 0.05


def _tree(rng: np.random.Generator, scale: float = 1.0) -> Any:
    return jax.tree.map(
        lambda shape: (scale * rng.standard_normal(shape)).astype(np.float32),
        SHAPES,
        is_leaf=lambda node: isinstance(node, tuple),
    )


def _schedule(count: jax.Array) -> jax.Array:
    return LR * (1.0 + count) / (1.0 + 2.0 * count)


def _kernels_only(tree: Any) -> Any:
    """A user mask: decay weight matrices, not biases, scales or quantizer parameters."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: jax.tree_util.keystr(path).endswith("['kernel']"), tree
    )


MASKS = {"model params only": decay_model_params_only, "kernels only": _kernels_only}


def _chains(
    clip_norm: float | None, weight_decay: float, schedule: bool, mask: str
) -> tuple[optax.GradientTransformation, optax.GradientTransformation]:
    """`(flat, optax)`: the same clip + AdamW on one vector and per leaf."""
    learning_rate = _schedule if schedule else LR
    adamw = optax.adamw(learning_rate, weight_decay=weight_decay, mask=MASKS[mask])
    tree = adamw if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), adamw)
    flat = flat_adamw(
        learning_rate, clip_norm=clip_norm, weight_decay=weight_decay, mask=MASKS[mask]
    )
    return flat, tree


@functools.partial(jax.jit, static_argnames=("clip_norm", "weight_decay", "schedule", "mask"))
def _trajectories(
    params: Any,
    grads: list[Any],
    *,
    clip_norm: float | None,
    weight_decay: float,
    schedule: bool,
    mask: str,
) -> tuple[list[Any], list[Any], Any, Any]:
    """Both optimizers' updates over the gradient sequence, each applied to its own params."""
    flat, tree = _chains(clip_norm, weight_decay, schedule, mask)
    results = []
    for tx in (flat, tree):
        current, state, updates = params, tx.init(params), []
        for gradient in grads:
            update, state = tx.update(gradient, state, current)
            updates.append(update)
            current = optax.apply_updates(current, update)
        results.append((updates, state))
    (flat_updates, flat_state), (tree_updates, tree_state) = results
    return flat_updates, tree_updates, flat_state, tree_state


def _adam_state(state: Any) -> optax.ScaleByAdamState:
    nodes = jax.tree.leaves(state, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
    (adam,) = [node for node in nodes if isinstance(node, optax.ScaleByAdamState)]
    return adam


# Gradient scales per step: with clip_norm=1 the first two steps clip, the last two do not.
ACTIVE_THEN_INACTIVE = (30.0, 5.0, 0.01, 0.1)


@pytest.mark.parametrize(
    ("clip_norm", "weight_decay", "schedule", "mask"),
    [
        (1.0, 0.1, False, "model params only"),  # clipping on, then off
        (1e6, 0.1, False, "model params only"),  # clipping never triggers
        (None, 0.1, True, "kernels only"),  # no clipping, a schedule, a user mask
        (1.0, 0.0, True, "model params only"),  # no decay at all
    ],
)
def test_updates_equal_optax_per_leaf_chain_over_several_steps(
    clip_norm: float | None, weight_decay: float, schedule: bool, mask: str
) -> None:
    rng = np.random.default_rng(0)
    params = _tree(rng)
    grads = [_tree(rng, scale) for scale in ACTIVE_THEN_INACTIVE]
    if clip_norm == 1.0:
        norms = [float(np.sqrt(sum(np.sum(g**2) for g in jax.tree.leaves(t)))) for t in grads]
        assert norms[0] > 1.0 and norms[-1] < 1.0  # the clip switches off in between
    flat_updates, tree_updates, flat_state, tree_state = _trajectories(
        params, grads, clip_norm=clip_norm, weight_decay=weight_decay, schedule=schedule, mask=mask
    )
    for step, (got, want) in enumerate(zip(flat_updates, tree_updates, strict=True)):
        for path_got, want_leaf in zip(
            jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want), strict=True
        ):
            path, got_leaf = path_got
            np.testing.assert_allclose(
                np.asarray(got_leaf),
                np.asarray(want_leaf),
                rtol=2e-6,
                atol=1e-7 * LR,
                err_msg=f"step {step}, leaf {jax.tree_util.keystr(path)}",
            )
    adam = _adam_state(tree_state)
    assert int(flat_state.count) == int(adam.count) == STEPS
    for moment, want in (("mu", adam.mu), ("nu", adam.nu)):
        np.testing.assert_allclose(
            np.asarray(getattr(flat_state, moment)),
            np.asarray(flatten(want)),
            rtol=2e-6,
            atol=1e-12,
            err_msg=moment,
        )


def test_masked_parameters_are_never_decayed() -> None:
    params = {"params": {"w": jnp.ones(3)}, "quant_params": {"step": jnp.ones(2)}}
    zero = jax.tree.map(jnp.zeros_like, params)
    tx = flat_adamw(0.1, weight_decay=0.5, mask=decay_model_params_only)
    updates, _ = tx.update(zero, tx.init(params), params)
    np.testing.assert_allclose(np.asarray(updates["params"]["w"]), -0.05 * np.ones(3), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(updates["quant_params"]["step"]), np.zeros(2))


def test_one_step_from_a_given_state_equals_float64_numpy_clip_then_adamw() -> None:
    """Clip to the global norm, Adam with bias correction, decay where masked.

    From moments of two earlier steps, so that the clipping scale does not
    cancel in `m / sqrt(v)` as it does on a first step (Kingma & Ba 2015;
    Loshchilov & Hutter 2019).
    """
    b1, b2, eps, lr, clip, decay, count = 0.9, 0.999, 1e-8, 1e-2, 0.5, 0.1, 2
    rng = np.random.default_rng(3)
    params = {"b": rng.standard_normal(3), "w": rng.standard_normal((2, 3))}
    grads = {"b": 4.0 * rng.standard_normal(3), "w": 4.0 * rng.standard_normal((2, 3))}
    mu = {"b": 0.1 * rng.standard_normal(3), "w": 0.1 * rng.standard_normal((2, 3))}
    nu = {"b": 0.01 * rng.random(3), "w": 0.01 * rng.random((2, 3))}
    decays = {"b": False, "w": True}

    norm = math.sqrt(sum(float(np.sum(g**2)) for g in grads.values()))
    assert norm > clip
    expected = {}
    for name, g in grads.items():
        g = g * (clip / norm)
        m_hat = (b1 * mu[name] + (1 - b1) * g) / (1 - b1 ** (count + 1))
        v_hat = (b2 * nu[name] + (1 - b2) * g**2) / (1 - b2 ** (count + 1))
        direction = m_hat / (np.sqrt(v_hat) + eps) + (decay * params[name] if decays[name] else 0)
        expected[name] = -lr * direction

    as32 = functools.partial(jax.tree.map, lambda x: jnp.asarray(x, jnp.float32))
    tx = flat_adamw(lr, clip_norm=clip, weight_decay=decay, mask=decays)
    state = FlatAdamWState(jnp.asarray(count, jnp.int32), flatten(as32(mu)), flatten(as32(nu)))
    updates, state = tx.update(as32(grads), state, as32(params))
    for name in params:
        # float32 `1 - 0.999**3` alone is off by ~1e-5 relative.
        np.testing.assert_allclose(np.asarray(updates[name]), expected[name], rtol=3e-5)
    assert int(state.count) == count + 1


def test_make_optimizer_keeps_adam_moments_as_two_flat_float32_vectors() -> None:
    params = _tree(np.random.default_rng(1))
    size = sum(
        math.prod(shape) for shape in jax.tree.leaves(SHAPES, is_leaf=tuple.__instancecheck__)
    )
    tx = make_optimizer(1e-3, clip_norm=1.0)
    assert isinstance(tx, Optimizer) and isinstance(tx, optax.GradientTransformationExtraArgs)
    assert tx.clip_norm == 1.0
    state = tx.init(params)
    assert isinstance(state, FlatAdamWState)
    assert state.mu.shape == state.nu.shape == (size,)
    assert state.mu.dtype == state.nu.dtype == jnp.float32
    assert state.count.dtype == jnp.int32 and state.count.shape == ()


def test_flat_optimizer_composes_with_other_optax_transformations() -> None:
    params = {"a": jnp.ones((2, 2)), "b": jnp.zeros(3)}
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    chained = optax.chain(flat_adamw(0.1), optax.scale(2.0))
    updates, _ = chained.update(grads, chained.init(params), params)
    alone, _ = flat_adamw(0.1).update(grads, flat_adamw(0.1).init(params), params)
    for got, want in zip(jax.tree.leaves(updates), jax.tree.leaves(alone), strict=True):
        np.testing.assert_allclose(np.asarray(got), 2.0 * np.asarray(want), rtol=1e-6)


def test_flatten_then_unflatten_restores_shapes_and_dtypes() -> None:
    tree = {"a": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(2, jnp.bfloat16), "c": jnp.zeros(())}
    vector = flatten(tree)
    assert vector.shape == (9,) and vector.dtype == jnp.float32
    back = unflatten(vector, tree)
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(tree), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_bfloat16_leaves_get_updates_in_bfloat16_from_float32_moments() -> None:
    params = {"w": jnp.ones(4, jnp.bfloat16), "v": jnp.ones(2)}
    tx = flat_adamw(0.1, clip_norm=1.0)
    updates, state = tx.update(params, tx.init(params), params)
    assert updates["w"].dtype == jnp.bfloat16 and updates["v"].dtype == jnp.float32
    assert state.mu.dtype == jnp.float32


def test_global_norm_equals_the_float64_norm_of_all_leaves() -> None:
    tree = _tree(np.random.default_rng(4), 3.0)
    want = math.sqrt(
        sum(float(np.sum(np.asarray(x, np.float64) ** 2)) for x in jax.tree.leaves(tree))
    )
    np.testing.assert_allclose(float(global_norm(tree)), want, rtol=1e-6)
    assert float(global_norm({})) == 0.0


def test_non_float_leaf_raises_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"\['count'\].*int32"):
        flat_adamw(0.1).init({"w": jnp.ones(2), "count": jnp.zeros((), jnp.int32)})


def test_gradients_of_another_size_than_the_state_raise_value_error() -> None:
    tx = flat_adamw(0.1)
    state = tx.init({"w": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"4 scalars.*\(3,\)"):
        tx.update({"w": jnp.ones(4)}, state)


@pytest.mark.parametrize(
    "other", [{"w": jnp.ones((4, 3))}, {"w": jnp.ones(5)}], ids=["transposed", "other_size"]
)
def test_params_of_other_shapes_than_the_gradients_raise_value_error(other: Any) -> None:
    # Same structure, other shapes: the flat vectors misalign. With equal sizes
    # each scalar was silently decayed by another parameter's value; with
    # other sizes the step failed with a broadcasting error deep inside JAX.
    tx = flat_adamw(0.1, weight_decay=0.1)
    grads = {"w": jnp.ones((3, 4))}
    with pytest.raises(ValueError, match=r"params must have the shapes.*\(3, 4\)"):
        tx.update(grads, tx.init(grads), other)


def test_weight_decay_without_params_raises_value_error() -> None:
    tx = flat_adamw(0.1, weight_decay=0.1)
    params = {"w": jnp.ones(3)}
    with pytest.raises(ValueError, match="needs params"):
        tx.update(params, tx.init(params))


def test_traced_mask_flags_raise_type_error() -> None:
    params = {"w": jnp.ones(3)}
    tx = flat_adamw(0.1, weight_decay=0.1, mask=lambda tree: {"w": jnp.any(tree["w"] > 0)})
    with pytest.raises(TypeError, match="concrete booleans"):
        jax.jit(tx.update)(params, tx.init(params), params)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"learning_rate": math.nan}, "learning_rate"),
        ({"learning_rate": -0.1}, "learning_rate"),
        ({"learning_rate": 0.1, "eps": 0.0}, "eps"),
        ({"learning_rate": 0.1, "b1": 1.0}, "b1"),
        ({"learning_rate": 0.1, "b2": -0.5}, "b2"),
        ({"learning_rate": 0.1, "clip_norm": 0.0}, "clip_norm"),
        ({"learning_rate": 0.1, "weight_decay": math.inf}, "weight_decay"),
    ],
)
def test_settings_that_would_make_updates_non_finite_are_refused_by_name(
    kwargs: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ValueError, match=f"flat_adamw: {fragment} must be"):
        flat_adamw(**kwargs)


def test_numpy_and_jax_scalars_are_accepted_as_settings() -> None:
    params = {"w": jnp.ones(3)}
    for tx in (
        flat_adamw(np.float32(0.1), clip_norm=np.float64(1.0), eps=np.float32(1e-8)),
        flat_adamw(jnp.asarray(0.1), b1=jnp.asarray(0.9)),
    ):
        updates, _ = tx.update(params, tx.init(params), params)
        assert np.all(np.isfinite(np.asarray(updates["w"])))


def _inject_optax_chain(
    learning_rate: Any,
    weight_decay: Any,
    clip_norm: Any,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
) -> optax.GradientTransformation:
    """optax's clip + AdamW with `flat_adamw`'s numeric settings, all of them injectable.

    `optax.inject_hyperparams` injects every numeric default too, as float32
    (`b2` of 0.999 becomes 0.99900001): the reference must see the same numbers.
    """
    adamw = optax.adamw(learning_rate, b1, b2, eps, weight_decay=weight_decay)
    return optax.chain(optax.clip_by_global_norm(clip_norm), adamw)


def test_inject_hyperparams_traces_the_settings_under_jit_as_optax_does() -> None:
    # The docstring says usable anywhere optax expects one: under jit the injected
    # settings are tracers, and flat_adamw raised "learning_rate must be a finite
    # float >= 0 or a schedule, got JitTracer(float32[])".
    rng = np.random.default_rng(4)
    params = _tree(rng)
    settings = {"learning_rate": LR, "weight_decay": 0.1, "clip_norm": 1.0}
    flat = optax.inject_hyperparams(flat_adamw)(**settings)
    tree = optax.inject_hyperparams(_inject_optax_chain)(**settings)

    step = jax.jit(
        lambda tx, state, grads, params: tx.update(grads, state, params), static_argnums=0
    )
    states, current = [flat.init(params), tree.init(params)], params
    # Changed between steps: a new rate, clipping switched off, decay switched off.
    changes = [{}, {"learning_rate": 0.5 * LR}, {"clip_norm": 1e6}, {"weight_decay": 0.0}]
    for index, (scale, change) in enumerate(zip(ACTIVE_THEN_INACTIVE, changes, strict=True)):
        grads, updates = _tree(rng, scale), []
        for which, tx in enumerate((flat, tree)):
            for name, value in change.items():
                states[which].hyperparams[name] = jnp.asarray(value, jnp.float32)
            update, states[which] = step(tx, states[which], grads, current)
            updates.append(update)
        for got, want in zip(*(jax.tree.leaves(update) for update in updates), strict=True):
            np.testing.assert_allclose(
                np.asarray(got), np.asarray(want), rtol=2e-6, atol=1e-7 * LR, err_msg=f"{index}"
            )
        current = optax.apply_updates(current, updates[1])
    adam = _adam_state(states[1])
    np.testing.assert_allclose(states[0].inner_state.mu, flatten(adam.mu), rtol=2e-6, atol=1e-12)


def test_a_traced_setting_must_be_a_real_scalar() -> None:
    params = {"w": jnp.ones(3)}
    with pytest.raises(ValueError, match=r"flat_adamw: eps must be .*traced array of shape \(2,\)"):
        jax.jit(lambda eps: flat_adamw(0.1, eps=eps).update(params, flat_adamw(0.1).init(params)))(
            jnp.ones(2)
        )


def test_a_state_round_trips_through_flax_serialization() -> None:
    # A parameter layout recorded in the state (tried, withdrawn) made
    # `flax.serialization.to_bytes` of every default train state fail.
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    tx = flat_adamw(warmup_cosine_schedule(0.1, 10, 2))
    _, state = tx.update(params, tx.init(params), params)
    restored = serialization.from_bytes(tx.init(params), serialization.to_bytes(state))
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(got, want)


def test_scheduled_learning_rate_is_the_next_updates_rate_and_none_when_constant() -> None:
    params = {"w": jnp.ones(3)}
    schedule = WarmupCosine(peak_lr=0.1, total_steps=10, warmup_steps=4, end_lr=0.0)
    for rate in (schedule, lambda count: 0.5 ** count.astype(jnp.float32)):
        tx = flat_adamw(rate)
        state = tx.init(params)
        for count in range(3):
            assert float(scheduled_learning_rate(tx, state)) == pytest.approx(
                float(rate(jnp.asarray(count))), rel=1e-6
            )
            _, state = tx.update(params, state, params)
    constant = flat_adamw(0.1)
    assert scheduled_learning_rate(constant, constant.init(params)) is None
    adam = optax.adam(lambda count: 0.1)
    assert scheduled_learning_rate(adam, adam.init(params)) is None


def test_flat_updates_are_the_updates_before_the_split_into_the_tree() -> None:
    params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.asarray([0.5, -0.25])}
    grads = jax.tree.map(lambda p: jnp.cos(3.0 * p), params)
    tx = make_optimizer(0.1, clip_norm=0.5, weight_decay=0.01)
    state = tx.init(params)
    updates, new_state = tx.update(grads, state, params)
    vector, flat_state = flat_updates(tx, grads, state, params)
    np.testing.assert_array_equal(np.asarray(vector), np.asarray(flatten(updates)))
    for got, want in zip(jax.tree.leaves(flat_state), jax.tree.leaves(new_state), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert is_flat_adamw(tx) and not is_flat_adamw(optax.adam(0.1))
    with pytest.raises(TypeError, match="flat_updates: tx must be a flat_adamw"):
        flat_updates(optax.chain(tx), grads, state, params)


def test_float64_scalar_settings_keep_the_state_and_update_float32_under_x64() -> None:
    # NumPy / JAX float64 scalars were kept as given: under x64 they promoted the
    # moments and the update vector to float64 after one step (the state's dtypes
    # then differ from `init`'s, and a JAX array setting made `update` unhashable).
    params = {"w": jnp.ones(3, jnp.float32), "b": jnp.ones(2, jnp.bfloat16)}
    with jax.enable_x64(True):
        tx = flat_adamw(
            np.float64(0.1),
            clip_norm=np.float64(0.5),
            weight_decay=np.float64(0.1),
            b1=jnp.asarray(0.9, jnp.float64),
            b2=np.float64(0.999),
            eps=np.float64(1e-8),
        )
        state = tx.init(params)
        vector, state = flat_updates(tx, params, state, params)
        updates, state = tx.update(params, state, params)
    assert vector.dtype == state.mu.dtype == state.nu.dtype == jnp.float32
    assert updates["w"].dtype == jnp.float32 and updates["b"].dtype == jnp.bfloat16
    assert hash(tx.update) == hash(flat_adamw(0.1, clip_norm=0.5, weight_decay=0.1).update)


def test_a_mask_over_the_params_alone_is_refused_at_init_with_the_wrapping_named() -> None:
    # The optimizer sees {'params': params}; a params-shaped mask passed init and failed
    # at the first update, inside the trace, with a bare structure error.
    params = {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones(2)}}
    mask = {"dense": {"kernel": True, "bias": False}}
    tx = make_optimizer(1e-2, clip_norm=None, weight_decay=0.1, weight_decay_mask=mask)
    with pytest.raises(ValueError, match=r"top-level keys \['params'\].*\{'params': mask\}"):
        tx.init({"params": params})
    wrapped = make_optimizer(1e-2, None, weight_decay=0.1, weight_decay_mask={"params": mask})
    state = wrapped.init({"params": params})
    grads = jax.tree.map(jnp.zeros_like, {"params": params})
    updates, _ = wrapped.update(grads, state, {"params": params})
    # Zero gradients: Adam's direction is 0, so a decayed leaf moves by exactly -lr * wd * p.
    np.testing.assert_allclose(updates["params"]["dense"]["kernel"], np.full((3, 2), -1e-3))
    np.testing.assert_array_equal(updates["params"]["dense"]["bias"], np.zeros(2))


def test_a_given_flat_gradient_and_norm_are_what_the_update_clips_with() -> None:
    """`flat_updates(..., flat_grads=, grad_norm=)`: the caller's vector and norm are used.

    Equal to the update that flattens and measures itself when they are
    `flatten(grads)` and its norm; with a norm twice the true one the
    clipped gradient (and so Adam's first moment) is half as large, which
    shows the given norm is the one clipping reads; the negated vector with
    the same norm gives the negated first moment, which shows the given
    vector is the one the moments read.
    """
    rng = np.random.default_rng(5)
    params, grads = _tree(rng), _tree(rng, scale=10.0)
    tx = flat_adamw(LR, clip_norm=1.0)
    state = tx.init(params)
    vector = flatten(grads)
    norm = jnp.sqrt(jnp.sum(jnp.square(vector)))
    assert float(norm) > 1.0
    plain, plain_state = flat_updates(tx, grads, state, params)
    given, given_state = flat_updates(tx, grads, state, params, flat_grads=vector, grad_norm=norm)
    np.testing.assert_allclose(np.asarray(given), np.asarray(plain), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(given_state.mu), np.asarray(plain_state.mu), rtol=1e-6)
    _, doubled_state = flat_updates(tx, grads, state, params, flat_grads=vector, grad_norm=2 * norm)
    np.testing.assert_allclose(
        np.asarray(doubled_state.mu), 0.5 * np.asarray(plain_state.mu), rtol=1e-6
    )
    _, negated_state = flat_updates(tx, grads, state, params, flat_grads=-vector, grad_norm=norm)
    np.testing.assert_allclose(np.asarray(negated_state.mu), -np.asarray(plain_state.mu), rtol=1e-6)
    with pytest.raises(ValueError, match=r"flat_grads must be flatten\(grads\) of shape \(\d+,\)"):
        flat_updates(tx, grads, state, params, flat_grads=vector[:-1], grad_norm=norm)
    with pytest.raises(ValueError, match=r"grad_norm must be a scalar, got shape \(\d+,\)"):
        flat_updates(tx, grads, state, params, flat_grads=vector, grad_norm=jnp.abs(vector))


def test_flat_adamw_without_a_mask_decays_every_leaf_as_optax_adamw_does() -> None:
    """optax's `adamw(mask=None)` decays all leaves; so must `flat_adamw(mask=None)`."""
    rng = np.random.default_rng(5)
    params = {"a": rng.standard_normal((2, 3)), "b": rng.standard_normal(4)}
    grads = [{k: 2.0 * rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(3)]
    as32 = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)  # noqa: E731
    tx = flat_adamw(0.03, clip_norm=1.0, weight_decay=0.3)
    reference = NumpyClipAdamW(params, 0.03, 1.0, 0.3, {"a", "b"})
    current, opt_state = as32(params), tx.init(as32(params))
    for gradient in grads:
        updates, opt_state = tx.update(as32(gradient), opt_state, current)
        current = optax.apply_updates(current, updates)
        reference.step(gradient)
    for name in params:
        np.testing.assert_allclose(np.asarray(current[name]), reference.params[name], rtol=2e-5)
    assert flatten(current).shape == (10,)


# ---------------------------------------------------------------------------
# A flat optimizer state is restored only with the parameters it was built for


@flax.struct.dataclass
class _State:
    step: Any
    params: Any
    opt_state: FlatAdamWState


def _state(params: dict[str, Any]) -> _State:
    tx = flat_adamw(0.1)
    opt_state = tx.init(params)
    _, opt_state = tx.update(params, opt_state)
    return _State(step=jnp.ones((), jnp.int32), params=params, opt_state=opt_state)


def test_checkpoint_refuses_a_flat_state_of_parameters_laid_out_otherwise_with_equal_size(
    tmp_path: pathlib.Path,
) -> None:
    # Moments are matched to parameters by position in one (N,) vector: the
    # checkpoint's per-leaf layout check is what keeps them with their own leaves.
    saved = _state({"a": jnp.ones((2, 3)), "b": jnp.ones(4)})
    other = _state({"a": jnp.ones(4), "b": jnp.ones((2, 3))})
    assert saved.opt_state.mu.shape == other.opt_state.mu.shape
    with TrainingCheckpointer(tmp_path) as checkpointer:
        checkpointer.save_latest(saved, jax.random.key(0), {})
        with pytest.raises(ValueError, match="does not fit the template"):
            checkpointer.restore_latest(other)
        restored = checkpointer.restore_latest(saved)
    assert restored is not None
    np.testing.assert_array_equal(restored.state.opt_state.mu, saved.opt_state.mu)


@pytest.mark.parametrize(
    ("mask", "where"),
    [
        ({"params": {"w": True, "b": "no"}, "extra": False}, r"\['params'\]\['b'\]"),
        ({"params": {"w": 1, "b": False}, "extra": False}, r"\['params'\]\['w'\]"),
        ({"params": {"w": jnp.array(1.0), "b": False}, "extra": False}, r"\['params'\]\['w'\]"),
        ({"params": np.array([True, False]), "extra": False}, r"\['params'\]"),
        (lambda tree: 5, r"\(the whole mask\) returned by the mask callable"),
        (lambda tree: {"params": "yes", "extra": True}, r"\['params'\] returned by the mask"),
    ],
    ids=["string", "int", "jax_float", "numpy_array", "callable_int", "callable_string"],
)
def test_mask_leaves_that_are_not_booleans_raise_type_error_naming_their_path(
    mask: Any, where: str
) -> None:
    # bool(flag) took any truthy leaf as "decay": a leaf "no" decayed its parameters,
    # a callable returning 5 decayed everything, without a word.
    params = {"params": {"w": jnp.ones(3), "b": jnp.ones(2)}, "extra": jnp.ones(1)}
    tx = flat_adamw(0.1, weight_decay=0.1, mask=mask)
    with pytest.raises(TypeError, match=rf"mask leaves must be concrete booleans.* at {where}"):
        tx.init(params)


@pytest.mark.parametrize(
    ("decay", "keep"),
    [(np.bool_(True), np.False_), (jnp.array(True), jnp.array(False)), (np.array(True), False)],
    ids=["numpy_bool", "jax_0d", "numpy_0d"],
)
def test_concrete_booleans_are_accepted_as_mask_leaves_and_select_the_decay(
    decay: Any, keep: Any
) -> None:
    # As optax.adamw(mask=...) takes them: one flag each, NumPy or JAX.
    params = {"w": jnp.ones(3), "b": jnp.ones(2)}
    grads = jax.tree.map(jnp.zeros_like, params)
    tx = flat_adamw(1.0, weight_decay=0.5, mask={"w": decay, "b": keep})
    updates, _ = tx.update(grads, tx.init(params), params)
    # Zero gradients: the update is -lr · wd · p where decayed, 0 elsewhere.
    np.testing.assert_allclose(np.asarray(updates["w"]), -0.5 * np.ones(3))
    np.testing.assert_allclose(np.asarray(updates["b"]), np.zeros(2))
