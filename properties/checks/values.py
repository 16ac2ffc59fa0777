"""Checks of a pytree's values: `assert_finite`, `assert_nonzero_grads`."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from properties.checks._support import (
    _MAX_REPORTED,
    _as_float64,
    _flag,
    _index,
    _is_inexact,
    _named_leaves,
    _require_elements,
    _summarize,
    _tolerance,
)

PyTree = Any


def assert_finite(tree: PyTree, *, name: str = "tree") -> None:
    """Asserts that no float leaf of `tree` holds NaN or inf, naming every leaf that does.

    Integer, boolean and PRNG key leaves are always finite. A tree with no leaf at all
    (`None`, `{}`: a function that forgot to return), or whose leaves are all
    empty (`np.zeros((0, 4))`), is refused, since nothing in it could fail.
    Example::

        checks.assert_finite(jax.grad(loss)(params, batch), name="grads")

    Raises:
      AssertionError: listing each non-finite leaf's path, NaN and inf counts
        and the first offending index.
      ValueError: if `tree` has no leaves, or no elements.
    """
    named = _named_leaves(name, tree)
    if not named:
        raise ValueError(
            f"{name} must hold at least one array, got {jax.tree_util.tree_structure(tree)}: "
            "there would be nothing to check"
        )
    _require_elements(name, named)
    problems = []
    for path, leaf in named:
        if not _is_inexact(leaf):
            continue
        with np.errstate(invalid="ignore"):
            nan, inf = np.isnan(leaf), np.isinf(leaf)
        if nan.any() or inf.any():
            if leaf.ndim == 0:
                problems.append(f"{path}: the scalar is {leaf.item()}")
                continue
            first = np.argwhere(nan | inf)[0]
            problems.append(
                f"{path}: {int(nan.sum())} NaN, {int(inf.sum())} inf of {leaf.size} "
                f"elements (first at {_index(first)})"
            )
    if problems:
        raise AssertionError(_summarize(f"{name} has non-finite leaves:", problems))


def assert_nonzero_grads(
    grads: PyTree,
    min_norm: float = 0.0,
    *,
    per_element: bool = False,
    min_relative: float = 0.0,
    name: str = "grads",
) -> None:
    """Asserts that every float leaf of `grads` (or every element) has a live gradient.

    By default a leaf is dead when its L2 norm is `<= min_norm` or not
    finite (an inf or NaN gradient teaches nothing either): its parameter
    does not learn. That misses a partially dead
    parameter (one row under `stop_gradient`, a masked-out slice), so with
    `per_element=True` every element must be finite with `|g| > min_norm`, and
    each dead element is named by leaf path and index. All dead leaves are
    reported at once. Empty leaves (a zero-sized axis) carry nothing and are
    skipped; integer and `float0` leaves are skipped. Inputs that legitimately
    zero a gradient (a constant sequence through a LayerNorm, a ReLU that is
    off for the whole batch) should be excluded with `hypothesis.assume`
    before calling this.

    A gradient that is zero in exact arithmetic is rarely exactly zero in
    floating point: a bias added to every logit of a softmax (invariant by
    symmetry) gets rounding noise at the loss's scale, which passes an
    absolute `min_norm` of 0. `min_relative` catches it: a leaf (element)
    is also dead when its norm (magnitude) is `<= min_relative` times the
    largest leaf norm (element magnitude) of the tree.

    A tree with nothing to check is refused, as `assert_finite` refuses it:
    no leaf at all (`None`, `{}`) or only empty float leaves (`ValueError`),
    or no float leaf (`TypeError`: integer or `float0` leaves carry no
    gradient).

    Args:
      grads: a pytree of gradients (e.g. `jax.grad(loss)(params)`).
      min_norm: the norm (per leaf) or magnitude (per element) to exceed, >= 0.
      per_element: check every element instead of every leaf's norm.
      min_relative: the fraction of the tree's largest leaf norm (largest
        element magnitude with `per_element`) to exceed too, in [0, 1).
      name: how the tree is called in the message.

    Raises:
      AssertionError: naming every dead leaf and its norm, or with
        `per_element` every leaf with dead elements, how many, and their
        first indices.
      ValueError: if `grads` has no leaf, or its float leaves are all empty.
      TypeError: if `grads` has no float leaf.
    """
    min_norm = _tolerance("min_norm", min_norm)
    per_element = _flag("per_element", per_element)
    min_relative = _tolerance("min_relative", min_relative)
    if min_relative >= 1.0:
        raise ValueError(f"min_relative must be in [0, 1), got {min_relative!r}")
    named = _named_leaves(name, grads)
    _require_float_leaves(name, grads, named)
    leaves = [(path, _as_float64(leaf)) for path, leaf in named if _is_inexact(leaf) and leaf.size]
    sizes = [
        np.abs(leaf).ravel() if per_element else np.array([np.linalg.norm(leaf.ravel())])
        for _, leaf in leaves
    ]
    finite = [size[np.isfinite(size)] for size in sizes]
    largest = max((float(size.max()) for size in finite if size.size), default=0.0)
    threshold = max(min_norm, min_relative * largest)
    checked, dead = 0, []
    for path, leaf in leaves:
        checked += 1
        if per_element:
            magnitude = np.abs(leaf)
            with np.errstate(invalid="ignore"):
                alive = np.isfinite(magnitude) & (magnitude > threshold)
            if leaf.ndim == 0 and not alive:
                dead.append(f"{path} (a scalar): |g| {float(magnitude):.3g}")
                continue
            if not alive.all():
                indices = np.argwhere(~alive)
                shown = ", ".join(_index(index) for index in indices[:_MAX_REPORTED])
                more = (
                    f", ... ({len(indices) - _MAX_REPORTED} more)"
                    if (len(indices) > _MAX_REPORTED)
                    else ""
                )
                dead.append(
                    f"{path} (shape {leaf.shape}): {len(indices)} of {leaf.size} elements dead "
                    f"at {shown}{more}"
                )
            continue
        norm = float(np.linalg.norm(leaf.ravel()))
        if not (math.isfinite(norm) and norm > threshold):
            dead.append(f"{path}: norm {norm:.3g}")
    if dead:
        bound = f"{threshold:.3g}"
        if min_relative * largest > min_norm:
            bound += f" ({min_relative:g} of the largest {'|g|' if per_element else 'norm'})"
        what = (
            f"elements with |g| <= {bound} or not finite"
            if per_element
            else f"a norm <= {bound} or not finite"
        )
        header = f"{len(dead)} of {checked} leaves of {name} have {what}:"
        raise AssertionError(_summarize(header, dead))


def _require_float_leaves(name: str, tree: PyTree, named: list[tuple[str, np.ndarray]]) -> None:
    """Refuses a gradient tree with nothing to check: no leaf, no float leaf, or only empty ones.

    Bad arguments, not dead gradients: `ValueError` / `TypeError`, as `assert_finite` raises.
    """
    if not named:
        raise ValueError(
            f"{name} must hold at least one array, got {jax.tree_util.tree_structure(tree)}: "
            "there would be nothing to check"
        )
    floats = [(path, leaf) for path, leaf in named if _is_inexact(leaf)]
    if not floats:
        dtypes = sorted({str(leaf.dtype) for _, leaf in named})
        raise TypeError(
            f"{name} must hold at least one float array (a gradient), got only leaves of dtype "
            f"{', '.join(dtypes)} (integer, boolean or float0 leaves carry no gradient): pass "
            "the gradients, e.g. jax.grad(loss)(params)"
        )
    _require_elements(f"the float leaves of {name}", floats)
