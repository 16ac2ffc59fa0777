"""Properties of the optimizer chain `make_optimizer`: clip by global norm, then AdamW.

An `OptimizerCase` holds parameters, a sequence of gradients whose global
norms range from 1e-3 to 1e3 (so clipping switches on and off between
steps) and the optimizer's settings. `make_optimizer` is looked up at call
time, and its `init`/`update` are jitted once per setting.

Properties: clipping comes first and bounds what Adam sees (its first moment
after one step is exactly `clip_by_global_norm(g)`); several steps equal a
float64 NumPy clip-then-AdamW; updates are finite for finite gradients of
any magnitude (1e30 included); jit == eager.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import hypothesis.strategies as st
import jax
import numpy as np
import optax

from properties import checks
from properties import strategies as st_tft
from properties.suite import Property, platform_cache
from tft_jax import flat_optimizer, train

__all__ = [
    "ADAM_B1",
    "PROPERTIES",
    "OptimizerCase",
    "check_clipping_precedes_adam",
    "check_finite_updates",
    "check_jit_matches_eager",
    "check_matches_reference",
    "optimizer_cases",
]

# optax.adamw's defaults, which make_optimizer keeps.
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8
SHAPES = {"dense": {"kernel": (3, 4), "bias": (4,)}, "scale": (2,)}
MAGNITUDES = (1e-3, 0.1, 1.0, 10.0, 1e3)


class OptimizerCase(NamedTuple):
    """Parameters, gradients of several steps, and `make_optimizer`'s arguments."""

    params: Any
    grads: list[Any]
    learning_rate: float
    clip_norm: float
    weight_decay: float


def _tree(draw: st.DrawFn, kinds: tuple[str, ...], magnitude: float) -> Any:
    return jax.tree.map(
        lambda shape: draw(st_tft.float_arrays(shape, kinds=kinds)) * np.float32(magnitude),
        SHAPES,
        is_leaf=lambda node: isinstance(node, tuple),
    )


def optimizer_cases(
    *,
    steps: int = 3,
    kinds: tuple[str, ...] = ("normal",),
    magnitudes: Sequence[float] = MAGNITUDES,
) -> st.SearchStrategy[OptimizerCase]:
    """`OptimizerCase`s: each step's gradient gets its own magnitude, so clipping comes and goes."""

    @st.composite
    def draw(draw_: st.DrawFn) -> OptimizerCase:
        params = _tree(draw_, ("normal",), 1.0)
        grads = [_tree(draw_, kinds, draw_(st.sampled_from(magnitudes))) for _ in range(steps)]
        return OptimizerCase(
            params,
            grads,
            draw_(st.sampled_from((1e-3, 0.1))),
            draw_(st.sampled_from((0.01, 1.0))),
            draw_(st.sampled_from((0.0, 0.01))),
        )

    return draw()


class _Chain(NamedTuple):
    init: Any
    update: Any


@platform_cache
def _chain(learning_rate: float, clip_norm: float, weight_decay: float) -> _Chain:
    tx = train.make_optimizer(learning_rate, clip_norm=clip_norm, weight_decay=weight_decay)
    return _Chain(jax.jit(tx.init), jax.jit(tx.update))


def _chain_of(case: OptimizerCase) -> _Chain:
    return _chain(case.learning_rate, case.clip_norm, case.weight_decay)


def _adam_first_moments(state: Any, params: Any) -> list[Any]:
    """Adam's first moment, shaped like `params`, of each Adam state inside `state`.

    The optimizer keeps its moments as one flat vector (`FlatAdamWState`);
    optax's per-leaf `ScaleByAdamState` is read as well.
    """
    kinds = (flat_optimizer.FlatAdamWState, optax.ScaleByAdamState)
    nodes = jax.tree.leaves(state, is_leaf=lambda n: isinstance(n, kinds))
    return [
        flat_optimizer.unflatten(node.mu, params)
        if isinstance(node, flat_optimizer.FlatAdamWState)
        else node.mu
        for node in nodes
        if isinstance(node, kinds)
    ]


def check_clipping_precedes_adam(case: OptimizerCase) -> None:
    """After one step Adam's first moment is `(1 - b1) · clip_by_global_norm(g)`: clipped first.

    So the gradient Adam sees has global norm `<= clip_norm` and is `g`
    rescaled as a whole (`checks.assert_clipped` with `grads`).
    """
    chain = _chain_of(case)
    gradient = case.grads[0]
    _, state = chain.update(gradient, chain.init(case.params), case.params)
    moments = _adam_first_moments(state, case.params)
    if len(moments) != 1:
        raise AssertionError(
            f"expected one Adam state in the optimizer state, found {len(moments)}"
        )
    seen = jax.tree.map(lambda mu: np.asarray(mu, np.float64) / (1 - ADAM_B1), moments[0])
    checks.assert_clipped(seen, case.clip_norm, grads=gradient, rtol=1e-5)


def _numpy_clip(grads: list[np.ndarray], max_norm: float) -> list[np.ndarray]:
    norm = math.sqrt(sum(float(np.sum(g**2)) for g in grads))
    return grads if norm < max_norm else [g * (max_norm / norm) for g in grads]


def check_matches_reference(case: OptimizerCase) -> None:
    """Over several steps the updates equal float64 NumPy clip-by-global-norm, then AdamW.

    AdamW: `m ← b1 m + (1-b1) g`, `v ← b2 v + (1-b2) g²`, `u = m̂ / (sqrt(v̂) + eps)
    + wd · params`, update `-lr · u` (Loshchilov & Hutter 2019; optax.adamw).
    """
    chain = _chain_of(case)
    params, treedef = jax.tree.flatten(case.params)
    state = chain.init(case.params)
    reference = [np.asarray(p, np.float64) for p in params]
    current = jax.tree.unflatten(treedef, params)
    first = [np.zeros_like(p) for p in reference]
    second = [np.zeros_like(p) for p in reference]
    for step, gradient in enumerate(case.grads, start=1):
        updates, state = chain.update(gradient, state, current)
        grads = _numpy_clip(
            [np.asarray(g, np.float64) for g in jax.tree.leaves(gradient)], case.clip_norm
        )
        expected = []
        for index, g in enumerate(grads):
            first[index] = ADAM_B1 * first[index] + (1 - ADAM_B1) * g
            second[index] = ADAM_B2 * second[index] + (1 - ADAM_B2) * g**2
            m_hat = first[index] / (1 - ADAM_B1**step)
            v_hat = second[index] / (1 - ADAM_B2**step)
            direction = m_hat / (np.sqrt(v_hat) + ADAM_EPS) + case.weight_decay * reference[index]
            expected.append(-case.learning_rate * direction)
        for index, (got, want) in enumerate(zip(jax.tree.leaves(updates), expected, strict=True)):
            np.testing.assert_allclose(
                np.asarray(got, np.float64),
                want,
                rtol=1e-4,
                atol=1e-6 * case.learning_rate,
                err_msg=f"step {step}, leaf {index}: update differs from clip-then-AdamW",
            )
            reference[index] = reference[index] + want
        current = optax.apply_updates(current, updates)


def check_finite_updates(case: OptimizerCase) -> None:
    """Finite gradients of any magnitude (1e-6 to 1e30) give finite updates, step after step."""
    chain = _chain_of(case)
    state = chain.init(case.params)
    params = case.params
    for step, gradient in enumerate(case.grads, start=1):
        updates, state = chain.update(gradient, state, params)
        checks.assert_finite(updates, name=f"updates of step {step}")
        params = optax.apply_updates(params, updates)


def check_jit_matches_eager(case: OptimizerCase) -> None:
    """A compiled update equals the op-by-op one."""
    chain = _chain_of(case)
    tx = train.make_optimizer(
        case.learning_rate, clip_norm=case.clip_norm, weight_decay=case.weight_decay
    )
    state = chain.init(case.params)
    for gradient in case.grads:
        checks.assert_jit_matches_eager(chain.update, gradient, state, case.params)
        with jax.disable_jit():
            _, state = tx.update(gradient, state, case.params)


PROPERTIES = (
    Property(
        "optimizer: clipped first",
        # Large gradients first: the clipping regime is the interesting one here.
        optimizer_cases(steps=1, magnitudes=MAGNITUDES[::-1]),
        check_clipping_precedes_adam,
    ),
    Property("optimizer: reference", optimizer_cases(), check_matches_reference),
    Property(
        "optimizer: finite",
        optimizer_cases(kinds=("normal", "large", "tiny", "huge", "elements")),
        check_finite_updates,
    ),
    Property("optimizer: jit == eager", optimizer_cases(steps=2), check_jit_matches_eager),
)
