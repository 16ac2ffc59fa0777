"""Checks of an optimizer's updates: `assert_clipped`."""

from __future__ import annotations

import math
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from properties.checks._support import (
    _as_float64,
    _compare_trees,
    _is_inexact,
    _named_leaves,
    _real,
    _summarize,
    _tolerance,
)

PyTree = Any


def _global_norm(named: list[tuple[str, np.ndarray]]) -> float:
    return math.sqrt(sum(float(np.sum(np.abs(_as_float64(leaf)) ** 2)) for _, leaf in named))


def assert_clipped(
    updates: PyTree, max_norm: float, *, grads: PyTree | None = None, rtol: float | None = None
) -> None:
    """Asserts that the global L2 norm of `updates` is at most `max_norm`.

    With `grads`, also asserts the exact rescaling of
    `optax.clip_by_global_norm`: `updates == grads * min(1, max_norm / ||grads||)`
    element by element, within `rtol` of each expected element (the
    rescaling is one product per element, so its rounding is relative;
    values below the dtype's smallest normal number, which a CPU may flush
    to zero, are compared absolutely). Clipping that changes the direction,
    shrinks gradients already inside the ball, or clips per leaf instead of
    globally fails too, however small the leaf: an absolute tolerance of
    `rtol` times the norm left every element below it unchecked.

    Args:
      updates: pytree after clipping.
      max_norm: the bound, finite and > 0.
      grads: optional pytree before clipping, same structure.
      rtol: relative slack of the bound and of the comparison (None: 1e-5, or
        4 machine epsilons of the least precise float dtype of `updates` when
        wider: 3.1e-2 for bfloat16, 3.9e-3 for float16).

    Raises:
      AssertionError: with the norm found and the largest leaves.
    """
    max_norm = _real("max_norm", max_norm)
    if not (math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"max_norm must be finite and > 0, got {max_norm}")
    named = [(path, leaf) for path, leaf in _named_leaves("updates", updates) if _is_inexact(leaf)]
    if not any(leaf.size for _, leaf in named):
        raise ValueError(
            f"updates must hold at least one non-empty float leaf, got "
            f"{jax.tree_util.tree_structure(updates)}: there would be no norm to bound"
        )
    if rtol is None:
        widest_eps = max(float(jnp.finfo(leaf.dtype).eps) for _, leaf in named)
        rtol = max(1e-5, 4.0 * widest_eps)
    rtol = _tolerance("rtol", rtol)
    norm = _global_norm(named)
    if not math.isfinite(norm) or norm > max_norm * (1 + rtol):
        leaf_norms = sorted(
            ((float(np.linalg.norm(_as_float64(leaf).ravel())), path) for path, leaf in named),
            reverse=True,
        )
        largest = [f"{path}: norm {value:.4g}" for value, path in leaf_norms]
        header = f"global norm of updates is {norm:.6g} > max_norm {max_norm:g}; largest leaves:"
        raise AssertionError(_summarize(header, largest))
    if grads is None:
        return
    try:
        chex.assert_trees_all_equal_shapes(updates, grads)
    except AssertionError as error:
        raise ValueError(
            f"grads must have the structure and shapes of updates (the gradients they were "
            f"clipped from): {error}"
        ) from None
    gradient_norm = _global_norm(_named_leaves("grads", grads))
    factor = 1.0 if gradient_norm <= max_norm else max_norm / gradient_norm
    expected = jax.tree_util.tree_map(lambda g: _as_float64(np.asarray(g)) * factor, grads)
    actual = jax.tree_util.tree_map(lambda u: _as_float64(np.asarray(u)), updates)
    smallest_normal = max(float(jnp.finfo(leaf.dtype).tiny) for _, leaf in named)
    problems = _compare_trees(actual, expected, smallest_normal, rtol)
    if problems:
        header = (
            f"updates are not grads * min(1, max_norm / ||grads||) = grads * {factor:.6g} "
            f"(||grads|| = {gradient_norm:.6g}, max_norm = {max_norm:g}):"
        )
        raise AssertionError(_summarize(header, problems))
