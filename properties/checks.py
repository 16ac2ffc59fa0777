"""Property checks for any JAX function: plain functions that raise `AssertionError`.

Each check takes a user function and concrete inputs, evaluates it on the
host side of `jit` and raises `AssertionError` with a message that names the
offending leaves (by pytree path), positions or samples (chex asserts tree
structures and shapes; the value comparisons are NumPy, in float64). Bad arguments to a
check raise `ValueError`/`TypeError` naming the argument. Nothing here
imports `tft_jax`: the checks work for any function of arrays and pytrees.

- `assert_finite(tree)`: every float leaf is free of NaN and inf.
- `assert_nonzero_grads(grads, min_norm, per_element)`: every leaf's L2 norm
  (or, with `per_element=True`, every element) exceeds `min_norm`.
- `assert_causal(fn, x, axis)`: outputs at steps `<= t` (and their gradient) ignore
  inputs at steps `> t`.
- `assert_ignores_padding(fn, x, valid)`: outputs at real steps (and their gradient)
  ignore the inputs at padded steps (`valid (B, T)` False).
- `assert_batch_independent(fn, x)`: sample `i`'s output and gradient ignore sample `j`.
- `assert_batch_order_equivariant(fn, x)`: permuting the batch permutes the output (every
  permutation: a random one and the two that generate them all).
- `assert_jit_matches_eager(fn, *args)`: `jax.jit(fn)` equals op-by-op execution.
- `assert_grads_match_finite_differences(fn, args)`: `jax.test_util.check_grads` in float64.
- `assert_ste_gradient(quantize_fn, ...)`: the gradient is exactly the clipped-STE mask.
- `assert_quantization_error_bounded(quantize_fn, ...)`: `|fq(x) - x| <= scale/2` in range.
- `assert_rounds_to_grid(quantize_fn, ...)`: `fq(x)` is the nearest grid point (ties to even).
- `assert_idempotent(fn, x)`: `fn(fn(x)) == fn(x)`.
- `assert_clipped(updates, max_norm)`: global norm bound (and optax's exact rescaling).
- `count_compiles()` / `assert_max_compiles(n)`: how many computations were lowered.

Functions with several outputs are checked in one call: `out_axis` takes an
int per part of the output (`out_axis=(1, 2)` for `fn -> (y, weights)`), and
`select` picks the parts to check (`select=lambda out: out.quantiles`).

Keeping a property suite fast (compile time dominates, not run time):

- Pass a function that calls a jitted function built once at module level
  (``apply = jax.jit(model.apply)``; ``fn = lambda x: apply(variables, x)``).
  The checks evaluate `fn` several times on inputs of one shape, so it
  compiles once per shape bucket; `jax.vjp` of such a closure reuses the
  compiled forward and backward across examples too.
- Give NumPy inputs; the checks build perturbations and cotangents in NumPy,
  never with eager `jnp` ops (each would compile once per new shape).
- `assert_jit_matches_eager` necessarily runs `fn` op by op; pass an already
  jitted `fn` so that the compiled side is reused rather than re-traced.
- Bound compiles explicitly with ``with checks.assert_max_compiles(n): ...``
  around a loop of examples, or with `chex.assert_max_traces` on a function
  that is jitted once::

      @jax.jit
      @chex.assert_max_traces(n=1)
      def step(params, x): ...

  (`chex.clear_trace_counter()` between tests). A second trace of ``step``
  then fails loudly instead of silently recompiling.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import numbers
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads

__all__ = [
    "FLOAT32_FINITE_DIFFERENCE_EPS",
    "CompileLog",
    "assert_batch_independent",
    "assert_batch_order_equivariant",
    "assert_causal",
    "assert_clipped",
    "assert_finite",
    "assert_grads_match_finite_differences",
    "assert_idempotent",
    "assert_ignores_padding",
    "assert_jit_matches_eager",
    "assert_max_compiles",
    "assert_nonzero_grads",
    "assert_quantization_error_bounded",
    "assert_rounds_to_grid",
    "assert_ste_gradient",
    "count_compiles",
]

PyTree = Any

# Finite-difference step that passes reliably in float32 (1e-2 and <= 1e-5 fail often).
FLOAT32_FINITE_DIFFERENCE_EPS = 1e-4

# Default (rtol, atol) for comparing a jitted result with the op-by-op one, by dtype.
_JIT_TOLERANCE = {
    "float64": (1e-10, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (5e-3, 5e-3),
    "bfloat16": (2e-2, 2e-2),
}
# Default atol of assert_batch_order_equivariant, times the output's magnitude.
_BATCH_ORDER_ATOL = 1e-6
_MAX_REPORTED = 6
_LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"


def _path_name(path: tuple[Any, ...]) -> str:
    return jax.tree_util.keystr(path) or "<root>"


def _to_numpy(name: str, leaf: Any) -> np.ndarray:
    """A host copy of one numeric or boolean leaf.

    Tracers are refused (checks run outside transformations), and so are
    leaves that are not numbers (a string, an object): a check would skip
    them, or compare them as numbers, and pass without having checked them.
    A `float0` leaf (the gradient of an integer input, `jax.grad(...,
    allow_int=True)`) carries no value: it becomes a boolean array of its
    shape, all False, which the checks treat as they treat integer leaves.
    A typed PRNG key (`jax.random.key`, e.g. in a train state) becomes its
    `uint32` key data, an integer leaf: NumPy cannot hold a key.
    """
    if isinstance(leaf, jax.core.Tracer):
        raise TypeError(
            f"{name} is a traced value: call the checks outside jax.jit/grad/vmap, "
            "on concrete arrays"
        )
    if getattr(leaf, "dtype", None) == jax.dtypes.float0:
        return np.zeros(np.shape(leaf), np.bool_)
    if _is_key(leaf):
        return np.asarray(jax.random.key_data(leaf))
    array = np.asarray(leaf)
    if not (jnp.issubdtype(array.dtype, jnp.number) or array.dtype == np.bool_):
        raise TypeError(
            f"{name} must be numeric or boolean, got {type(leaf).__name__} of dtype "
            f"{array.dtype}: the checks compare numbers"
        )
    return array


def _is_key(leaf: Any) -> bool:
    """Whether `leaf` is a typed PRNG key array (`jax.random.key`, not a raw `uint32` one)."""
    return isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _named_leaves(name: str, tree: PyTree) -> list[tuple[str, np.ndarray]]:
    """`(path, numpy leaf)` pairs of a pytree, paths rendered like `['params']['out']`."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    named = []
    for path, leaf in flat:
        label = _path_name(path)
        named.append((label, _to_numpy(f"{name}{label}", leaf)))
    return named


def _is_inexact(array: np.ndarray) -> bool:
    return bool(jnp.issubdtype(array.dtype, jnp.inexact))


def _as_float64(array: np.ndarray) -> np.ndarray:
    if jnp.issubdtype(array.dtype, jnp.complexfloating):
        return np.asarray(array, np.complex128)
    return np.asarray(array, np.float64)


def _float_array(name: str, x: Any) -> np.ndarray:
    """A non-empty floating host array (an empty one would let every check pass vacuously).

    A tuple, dict or list of arrays (several model inputs) is refused: NumPy
    would stack it into one array whose axis 1 is no longer the time axis.
    """
    if isinstance(x, tuple | dict) or (
        isinstance(x, list) and any(isinstance(item, np.ndarray | jax.Array) for item in x)
    ):
        raise TypeError(
            f"{name} must be one array, got a {type(x).__name__} of inputs: close over the "
            f"others (fn = lambda {name}: model({name}, covariate)) so that the check "
            f"perturbs {name} alone"
        )
    array = _to_numpy(name, x)
    if not _is_inexact(array):
        raise TypeError(f"{name} must be a floating array, got dtype {array.dtype}")
    if array.size == 0:
        raise ValueError(
            f"{name} must hold at least one element, got shape {array.shape}: there would be "
            "nothing to check"
        )
    return array


def _require_finite(name: str, array: np.ndarray) -> None:
    """Refuses NaN/inf in a float input: perturbed NaN inputs give NaN outputs, and NaN
    outputs compare equal to NaN, so the check could not fail."""
    if not _is_inexact(array):
        return
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(_as_float64(array))
    if bad.any():
        raise ValueError(
            f"{name} must be finite, got {int(bad.sum())} NaN/inf of {array.size} elements "
            f"(first at {_index(np.argwhere(bad)[0])})"
        )


def _real(name: str, value: Any) -> float:
    """`value` as a float, refusing bools and non-numbers with a `TypeError` naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    return float(value)


def _seed(value: Any) -> int:
    """A seed: an int >= 0 (NumPy's generators take no other)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"seed must be an int >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"seed must be an int >= 0, got {value}")
    return int(value)


def _flag(name: str, value: Any) -> bool:
    """A bool (the text 'no' is truthy: the gradients would be checked)."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def _check_broadcast(name: str, value: Any, shape: tuple[int, ...]) -> None:
    """Raises `ValueError` naming `name` unless it broadcasts to `shape` (x's)."""
    value_shape = np.shape(value)
    try:
        broadcast = np.broadcast_shapes(value_shape, shape)
    except ValueError:
        broadcast = None
    if broadcast != shape:
        raise ValueError(
            f"{name} of shape {value_shape} does not broadcast to x's shape {shape} (a scalar, "
            "or e.g. (1, C) for one value per channel along the last axis)"
        )


def _tolerance(name: str, value: Any) -> float:
    """A finite tolerance >= 0 (an infinite one would make the check unable to fail)."""
    value = _real(name, value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    return value


def _integers(name: str, values: Any) -> list[int]:
    """A non-empty list of ints (no silent truncation of 1.5 to 1; an empty list tests nothing)."""
    if isinstance(values, str) or not isinstance(values, Sequence | np.ndarray):
        raise TypeError(f"{name} must be a sequence of ints, got {values!r}")
    chosen = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must hold ints, got {value!r} in {list(values)!r}")
        chosen.append(int(value))
    if not chosen:
        raise ValueError(
            f"{name} must name at least one index, got []: the check would test nothing"
        )
    return chosen


def _samples(samples: Sequence[int] | None, batch: int) -> Sequence[int]:
    """The samples to test: all of a batch of `batch` for None, else ints in `[0, batch)`."""
    if samples is None:
        return range(batch)
    chosen = _integers("samples", samples)
    bad = [i for i in chosen if not 0 <= i < batch]
    if bad:
        raise ValueError(f"samples must lie in [0, {batch}), got {bad}")
    return chosen


def _require_outputs(name: str, named: list[tuple[str, np.ndarray]], output: PyTree) -> None:
    """Refuses an output with no non-empty leaf: comparing it could never fail."""
    if not any(leaf.size for _, leaf in named):
        shapes = [leaf.shape for _, leaf in named]
        raise ValueError(
            f"{name} must return at least one non-empty array, got "
            f"{jax.tree_util.tree_structure(output)} with leaf shapes {shapes}: there would be "
            "nothing to compare"
        )


def _require_no_nan(header: str, regions: list[tuple[str, np.ndarray]]) -> None:
    """Fails where a compared output is NaN: NaN matches NaN, so any change there is invisible."""
    problems = []
    for path, region in regions:
        if not _is_inexact(region):
            continue
        with np.errstate(invalid="ignore"):
            nan = np.isnan(region)
        if nan.any():
            problems.append(
                f"{path}: {int(nan.sum())} NaN of {region.size} elements "
                f"(first at {_index(np.argwhere(nan)[0])})"
            )
    if problems:
        raise AssertionError(_summarize(header, problems))


_UNTRACEABLE = (
    jax.errors.TracerArrayConversionError,
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
)


def _vjp(fn: Callable[..., Any], *primals: Any) -> tuple[Any, Callable[..., Any]]:
    """`jax.vjp`, with a clear `TypeError` for a `fn` that leaves JAX (e.g. `np.asarray`)."""
    try:
        return jax.vjp(fn, *primals)
    except _UNTRACEABLE as error:
        raise TypeError(
            "fn cannot be differentiated with jax.vjp for the gradient check (it turns a traced "
            f"array into a concrete value: {type(error).__name__}): return jax arrays from fn, "
            "or pass check_gradients=False to check the forward pass only"
        ) from error


def _gradient_leak(values: np.ndarray, atol: float) -> str | None:
    """`max |g| ...` (and the NaN count) of a gradient block that should be zero, or None if it is.

    NaN counts as a leak: it is not zero, and `nanmax` alone would report it as `max |g| 0`.
    """
    with np.errstate(invalid="ignore"):
        nan = np.isnan(values)
        largest = float(np.max(np.where(nan, 0.0, np.abs(values)), initial=0.0))
    if not nan.any() and largest <= atol:
        return None
    return f"max |g| {largest:.3g}" + (f", {int(nan.sum())} NaN" if nan.any() else "")


def _normalize_axis(name: str, axis: int, ndim: int) -> int:
    if not _is_axis(axis):
        raise TypeError(f"{name} must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis} is out of range for an array with {ndim} axes")
    return axis % ndim


def _index(index: Sequence[Any]) -> str:
    """`[i, j]` for an element index."""
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def _fail_at(
    wrong: np.ndarray, header: str, describe: Callable[[tuple[int, ...]], str]
) -> NoReturn:
    """Raises `AssertionError`: `header`, then `describe(index)` of the first wrong elements."""
    raise AssertionError(_summarize(header, [describe(i) for i in map(tuple, np.argwhere(wrong))]))


def _summarize(header: str, problems: Sequence[str]) -> str:
    lines = [header, *(f"  {problem}" for problem in problems[:_MAX_REPORTED])]
    if len(problems) > _MAX_REPORTED:
        lines.append(f"  ... and {len(problems) - _MAX_REPORTED} more")
    return "\n".join(lines)


def _mismatch(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> str | None:
    """Describes where `actual` is not within `atol + rtol*|expected|` of `expected`, or None.

    NaN matches NaN and equal infinities match; shapes must agree exactly.
    """
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != expected {expected.shape}"
    a, e = _as_float64(actual), _as_float64(expected)
    with np.errstate(invalid="ignore", over="ignore"):
        difference = np.abs(a - e)
        close = (a == e) | (np.isnan(a) & np.isnan(e)) | (difference <= atol + rtol * np.abs(e))
    if close.all():
        return None
    bad = ~close
    first = tuple(np.argwhere(bad)[0])
    finite_difference = np.where(bad & np.isfinite(difference), difference, 0.0)
    return (
        f"{int(bad.sum())} of {bad.size} elements differ (max |diff| "
        f"{float(finite_difference.max()):.3g}); first at {_index(first)}: "
        f"{a[first]:.7g} vs expected {e[first]:.7g}"
    )


def _output_scale(named: list[tuple[str, np.ndarray]]) -> float:
    """The largest finite `|value|` over the float leaves of an output (1 when there is none).

    A default absolute tolerance is this times the dtype's `atol`: rounding
    differences grow with the magnitude of the values computed, so a fixed
    `atol` fails correct outputs of magnitude 1e6 at their elements near 0 and
    accepts any result, even a wrong one, whose values are all below it (1e-8).
    """
    scale = 0.0
    for _, leaf in named:
        if _is_inexact(leaf) and leaf.size:
            magnitude = np.abs(_as_float64(leaf))
            finite = magnitude[np.isfinite(magnitude)]
            if finite.size:
                scale = max(scale, float(finite.max()))
    return scale if scale > 0.0 else 1.0


def _compare_trees(
    actual: PyTree,
    expected: PyTree,
    atol: float | None,
    rtol: float | None,
    default_tolerance: dict[str, tuple[float, float]] | None = None,
) -> list[str]:
    """Per-leaf mismatch descriptions of two pytrees (structure, shape, dtype and values).

    `None` tolerances come from `default_tolerance` by dtype; a default `atol`
    is scaled by the largest `|expected|` of the whole tree (`_output_scale`).
    """
    actual_structure = jax.tree_util.tree_structure(actual)
    expected_structure = jax.tree_util.tree_structure(expected)
    if actual_structure != expected_structure:
        return [f"tree structure {actual_structure} != expected {expected_structure}"]
    problems = []
    expected_leaves = _named_leaves("expected", expected)
    scale = _output_scale(expected_leaves) if atol is None else 1.0
    pairs = zip(_named_leaves("actual", actual), expected_leaves, strict=True)
    for (path, a), (_, e) in pairs:
        if a.dtype != e.dtype:
            problems.append(f"{path}: dtype {a.dtype} != expected {e.dtype}")
            continue
        leaf_rtol, leaf_atol = (default_tolerance or {}).get(e.dtype.name, (0.0, 0.0))
        leaf_rtol = leaf_rtol if rtol is None else rtol
        leaf_atol = leaf_atol * scale if atol is None else atol
        problem = _mismatch(a, e, leaf_atol, leaf_rtol)
        if problem is not None:
            problems.append(f"{path}: {problem}")
    return problems


def assert_finite(tree: PyTree, *, name: str = "tree") -> None:
    """Asserts that no float leaf of `tree` holds NaN or inf, naming every leaf that does.

    Integer, boolean and PRNG key leaves are always finite. A tree with no leaf at all
    (`None`, `{}`: a function that forgot to return) is refused, since
    nothing in it could fail. Example::

        checks.assert_finite(jax.grad(loss)(params, batch), name="grads")

    Raises:
      AssertionError: listing each non-finite leaf's path, NaN and inf counts
        and the first offending index.
      ValueError: if `tree` has no leaves.
    """
    named = _named_leaves(name, tree)
    if not named:
        raise ValueError(
            f"{name} must hold at least one array, got {jax.tree_util.tree_structure(tree)}: "
            "there would be nothing to check"
        )
    problems = []
    for path, leaf in named:
        if not _is_inexact(leaf):
            continue
        with np.errstate(invalid="ignore"):
            nan, inf = np.isnan(leaf), np.isinf(leaf)
        if nan.any() or inf.any():
            first = np.argwhere(nan | inf)[0]
            problems.append(
                f"{path}: {int(nan.sum())} NaN, {int(inf.sum())} inf of {leaf.size} "
                f"elements (first at {_index(first)})"
            )
    if problems:
        raise AssertionError(_summarize(f"{name} has non-finite leaves:", problems))


def assert_nonzero_grads(
    grads: PyTree, min_norm: float = 0.0, *, per_element: bool = False, name: str = "grads"
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

    Args:
      grads: a pytree of gradients (e.g. `jax.grad(loss)(params)`).
      min_norm: the norm (per leaf) or magnitude (per element) to exceed, >= 0.
      per_element: check every element instead of every leaf's norm.
      name: how the tree is called in the message.

    Raises:
      AssertionError: naming every dead leaf and its norm, or with
        `per_element` every leaf with dead elements, how many, and their
        first indices.
    """
    min_norm = _tolerance("min_norm", min_norm)
    per_element = _flag("per_element", per_element)
    checked, dead = 0, []
    for path, leaf in _named_leaves(name, grads):
        if not _is_inexact(leaf) or leaf.size == 0:
            continue
        checked += 1
        if per_element:
            magnitude = np.abs(_as_float64(leaf))
            with np.errstate(invalid="ignore"):
                alive = np.isfinite(magnitude) & (magnitude > min_norm)
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
        norm = float(np.linalg.norm(_as_float64(leaf).ravel()))
        if not (math.isfinite(norm) and norm > min_norm):
            dead.append(f"{path}: norm {norm:.3g}")
    if checked == 0:
        raise AssertionError(f"{name} has no non-empty float leaves: nothing has a gradient")
    if dead:
        what = (
            f"elements with |g| <= {min_norm:g} or not finite"
            if per_element
            else f"a norm <= {min_norm:g} or not finite"
        )
        header = f"{len(dead)} of {checked} leaves of {name} have {what}:"
        raise AssertionError(_summarize(header, dead))


def _perturb(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Adds noise at least as large as each value (so saturating functions still see a change)."""
    wide = _as_float64(values)
    noise = rng.standard_normal(wide.shape) * (1.0 + np.abs(wide))
    return (wide + noise).astype(values.dtype)


def _causal_positions(
    length: int, positions: Sequence[int] | None, max_positions: int | None, seed: int
) -> list[int]:
    """The steps `t` to test: given ones, or every `t < length - 1`, optionally subsampled.

    The last step has no later inputs to change, so testing it could not fail:
    given positions must lie in `[0, length - 1)`.
    """
    if positions is not None:
        chosen = _integers("positions", positions)
        bad = [t for t in chosen if not 0 <= t < length - 1]
        if bad:
            raise ValueError(
                f"positions must lie in [0, {length - 1}) for {length} steps (step {length - 1} "
                f"has no later inputs to change), got {bad}"
            )
        return chosen
    chosen = list(range(length - 1))
    if max_positions is not None:
        if isinstance(max_positions, bool) or not isinstance(max_positions, numbers.Integral):
            raise TypeError(f"max_positions must be an int, got {max_positions!r}")
        if max_positions < 2:
            raise ValueError(
                f"max_positions must be >= 2 (the first step and the last, t = T - 2, are always "
                f"tested: only the last compares step T - 2 with a change at step T - 1), got "
                f"{max_positions}"
            )
        if len(chosen) > max_positions:
            rng = np.random.default_rng(seed)
            middle = rng.choice(chosen[1:-1], size=max(max_positions - 2, 0), replace=False)
            chosen = sorted({chosen[0], chosen[-1], *(int(t) for t in middle)})[:max_positions]
    return chosen


def _require_function(fn: Any) -> None:
    """Raises `TypeError` unless `fn` is callable (checked first: some checks never call it)."""
    if not callable(fn):
        raise TypeError(f"fn must be a function of x, got {type(fn).__name__} {fn!r}")


def _selected(fn: Callable[[Any], PyTree], select: Callable[[PyTree], PyTree] | None) -> Any:
    """`fn` followed by `select` (the outputs to check), or `fn` itself."""
    if select is None:
        return fn
    if not callable(select):
        raise TypeError(f"select must be a function of fn's output, got {select!r}")
    return lambda x: select(fn(x))


def _is_axis(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _leaf_axes(out_axis: Any, output: PyTree, default: int) -> list[int]:
    """One axis per output leaf (in `tree_leaves` order).

    `out_axis` is None (`default` everywhere), an int (every leaf), or a
    pytree that is a prefix of the output's structure with an int per
    subtree, e.g. `(1, 2)` for `fn -> (y, weights)`.
    """
    if out_axis is None:
        out_axis = default
    if _is_axis(out_axis):
        return [int(out_axis)] * len(jax.tree_util.tree_leaves(output))
    axes_leaves, treedef = jax.tree_util.tree_flatten(out_axis)
    bad = [axis for axis in axes_leaves if not _is_axis(axis)]
    if bad or not axes_leaves:
        raise TypeError(
            f"out_axis must be an int or a pytree of ints (a prefix of fn's output), got "
            f"{out_axis!r}"
        )
    try:
        subtrees = treedef.flatten_up_to(output)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"out_axis {out_axis!r} must be a prefix of fn's output structure "
            f"{jax.tree_util.tree_structure(output)}: {error}"
        ) from None
    axes = []
    for axis, subtree in zip(axes_leaves, subtrees, strict=True):
        axes += [int(axis)] * len(jax.tree_util.tree_leaves(subtree))
    return axes


def assert_causal(
    fn: Callable[[Any], PyTree],
    x: Any,
    *,
    axis: int = 1,
    out_axis: int | PyTree | None = None,
    select: Callable[[PyTree], PyTree] | None = None,
    positions: Sequence[int] | None = None,
    max_positions: int | None = None,
    check_gradients: bool = True,
    atol: float = 0.0,
    rtol: float = 0.0,
    seed: int = 0,
) -> None:
    """Asserts that `fn`'s outputs at steps `<= t` do not change when inputs at steps `> t` do.

    For each tested step `t`, the inputs after `t` along `axis` are replaced by
    noisy copies (noise as large as the values), and then by zeros; every
    output leaf, sliced to `[:t+1]` along `out_axis`, must stay equal in both
    cases. The zeros catch a leak through padding: a mask or a count of valid
    steps inferred from which steps are nonzero over the whole window, which
    noise (never exactly zero) leaves as it was. With the default `atol = rtol
    = 0` equality is exact: a masked softmax gives exactly zero weight to
    masked steps, so any leak, however small, is caught. (A leak below the
    output's float resolution changes nothing and cannot be seen: in float32
    a change smaller than about `1e-7 * |output|` rounds away.)

    Backward (`check_gradients`): the gradient of a random weighting of the
    outputs at steps `<= t` w.r.t. the inputs after `t` must be zero (within
    `atol`). This catches a leak that the forward values hide, e.g. a
    `custom_vjp` attention whose backward forgets the causal mask, or
    `y + (f(x_future) - stop_gradient(f(x_future)))`: training on such a
    model uses the future. It needs `fn` differentiable by `jax.vjp`.

    A sequence of one step passes trivially: there is no later input. `x`
    must be finite and non-empty, and the compared outputs must not be NaN
    (NaN equals NaN here, so a NaN output would hide any leak).

    Args:
      fn: `x -> pytree`; every output leaf must have length `T` along `out_axis`.
      x: float array with time axis `axis`, e.g. `(B, T, D)`.
      axis: the time axis of `x`.
      out_axis: the time axis of the output leaves (default: `axis`): an int
        for every leaf, or a pytree with an int per part of the output (a
        prefix of its structure), e.g. `out_axis=(1, 2)` for
        `fn -> (y (B, T, D), weights (B, heads, T, T))`: one call checks both.
      select: a function of `fn`'s output picking the parts to check (e.g.
        `lambda out: out.quantiles`); `out_axis` then refers to its result.
      positions: the steps `t` to test, in `[0, T - 1)` (default: every `t < T - 1`).
      max_positions: subsample that many steps, >= 2 (first and last always in).
      check_gradients: also run the backward check (one `jax.vjp`).
      atol, rtol: tolerance of the comparison (finite, >= 0); the backward
        check uses `atol`.
      seed: seed of the perturbation noise and of the cotangents.

    Raises:
      AssertionError: naming the steps, output leaves and positions that changed.
    """
    _require_function(fn)
    seed = _seed(seed)
    check_gradients = _flag("check_gradients", check_gradients)
    x = _float_array("x", x)
    _require_finite("x", x)
    atol, rtol = _tolerance("atol", atol), _tolerance("rtol", rtol)
    axis = _normalize_axis("axis", axis, x.ndim)
    length = x.shape[axis]
    fn = _selected(fn, select)
    steps = _causal_positions(length, positions, max_positions, seed)
    output, baseline = _output_leaves(fn, x)

    def has_the_input_length(path: str, leaf: np.ndarray, leaf_axis: int, axis: int) -> None:
        if leaf.shape[leaf_axis] != length:
            raise ValueError(
                f"output leaf {path} has shape {leaf.shape}: length {leaf.shape[leaf_axis]} along "
                f"out_axis={axis}, expected the input length {length}"
            )

    leaf_axes = _checked_axes(baseline, _leaf_axes(out_axis, output, axis), has_the_input_length)
    if steps:
        compared = np.arange(max(steps) + 1)
        _require_no_nan(
            "fn(x) is NaN where causality is checked (NaN == NaN here, so a leak would not show):",
            [
                (path, _take(leaf, compared, a))
                for (path, leaf), a in zip(baseline, leaf_axes, strict=True)
            ],
        )
    rng = np.random.default_rng(seed)
    problems = []
    for t in steps:
        future = (slice(None),) * axis + (slice(t + 1, None),)
        noisy = x.copy()
        noisy[future] = _perturb(x[future], rng)
        changes = [("", noisy)]
        zeroed = x.copy()
        zeroed[future] = 0
        if not np.array_equal(zeroed, x):
            changes.append((" (later inputs set to 0)", zeroed))
        for label, perturbed in changes:
            outputs = _named_leaves("fn(x)", fn(perturbed))
            if len(outputs) != len(baseline):
                raise AssertionError(
                    f"fn returned a different pytree for the perturbed input at t={t}"
                )
            for (path, before), (_, after), leaf_axis in zip(
                baseline, outputs, leaf_axes, strict=True
            ):
                past = (slice(None),) * leaf_axis + (slice(0, t + 1),)
                problem = _mismatch(after[past], before[past], atol, rtol)
                if problem is not None:
                    problems.append(
                        f"t={t}, output {path}[:{t + 1} along axis {leaf_axis}]{label}: {problem}"
                    )
    if check_gradients and steps:
        float_axes = [
            a for (_, leaf), a in zip(baseline, leaf_axes, strict=True) if _is_inexact(leaf)
        ]
        problems += _causal_gradient_leaks(fn, x, axis, steps, float_axes, atol, seed)
    if problems:
        header = (
            f"fn is not causal along axis {axis}: outputs at steps <= t depend on inputs at "
            f"steps > t (their values change, or their gradient reaches those inputs):"
        )
        raise AssertionError(_summarize(header, problems))


def _cotangents(
    outputs: Sequence[Any],
    output_axes: Sequence[int],
    index: int | slice,
    rng: np.random.Generator,
) -> tuple[np.ndarray, ...]:
    """Cotangents for `outputs`: random in `[0.5, 1.5)` at `index` along each output's axis, else 0.

    Pulled back, they give the gradient of (a random weighting of) the outputs
    at those positions only: one time step range, or one batch sample.
    """
    cotangents = []
    for output, output_axis in zip(outputs, output_axes, strict=True):
        cotangent = np.zeros(output.shape, output.dtype)
        moved = np.moveaxis(cotangent, output_axis, 0)
        moved[index] = rng.uniform(0.5, 1.5, moved[index].shape)
        cotangents.append(cotangent)
    return tuple(cotangents)


def _float_outputs(fn: Callable[..., PyTree]) -> Callable[..., tuple[Any, ...]]:
    """`fn` returning only its float output leaves (in `tree_leaves` order), for `jax.vjp`."""

    def outputs(*args: Any) -> tuple[Any, ...]:
        leaves = jax.tree_util.tree_leaves(fn(*args))
        return tuple(o for o in leaves if jnp.issubdtype(jnp.result_type(o), jnp.inexact))

    return outputs


def _causal_gradient_leaks(
    fn: Callable[[Any], PyTree],
    x: np.ndarray,
    axis: int,
    steps: Sequence[int],
    output_axes: Sequence[int],
    atol: float,
    seed: int,
) -> list[str]:
    """Where the gradient of `fn`'s outputs at steps `<= t` reaches `x` at steps `> t`.

    `output_axes` holds the time axis of each float output leaf, in order.
    """
    outputs, pullback = _vjp(_float_outputs(fn), x)
    if not outputs:
        return []
    return _causal_pullback_leaks(
        lambda cotangents: pullback(cotangents)[0], outputs, output_axes, axis, steps, atol, seed
    )


def _causal_pullback_leaks(
    pullback: Callable[[tuple[np.ndarray, ...]], PyTree],
    outputs: Sequence[Any],
    output_axes: Sequence[int],
    axis: int,
    steps: Sequence[int],
    atol: float,
    seed: int,
    name: str = "x",
) -> list[str]:
    """Where a pullback carries the outputs at steps `<= t` to the inputs at steps `> t`.

    The backward half of causality, shared by `assert_causal` (a `jax.vjp`)
    and the property suite (compiled pullbacks). `pullback` maps a tuple of
    cotangents, one per entry of `outputs` (arrays, time on `output_axes`),
    to the input gradients (a pytree, time on `axis`, named `name` + path).
    For each `t` in `steps` the cotangents are random on steps `<= t` and
    zero after; a gradient above `atol` (or NaN) after `t` is a leak.
    """
    rng = np.random.default_rng(seed)
    problems = []
    for t in steps:
        gradients = pullback(_cotangents(outputs, output_axes, slice(t + 1), rng))
        for path, gradient in jax.tree_util.tree_flatten_with_path(gradients)[0]:
            values = _as_float64(_to_numpy(f"{name}{jax.tree_util.keystr(path)}", gradient))
            future = np.moveaxis(values, axis, 0)[t + 1 :]
            leak = _gradient_leak(future, atol)
            if leak is None:
                continue
            with np.errstate(invalid="ignore"):
                live = np.isnan(future) | (np.abs(future) > atol)
            first = t + 1 + int(np.argwhere(live)[0][0])
            problems.append(
                f"t={t}, gradient of outputs[:{t + 1}] w.r.t. {name}{jax.tree_util.keystr(path)}"
                f"[{t + 1}:] along axis {axis} is nonzero ({leak}; first at step {first})"
            )
    return problems


def _batched_leaves(x: PyTree, axis: int) -> tuple[list[tuple[str, np.ndarray]], Any, int]:
    """Named numpy leaves of `x`, its treedef and the common batch size along `axis`.

    Typed PRNG keys are refused: the numpy leaves (key data) go back into `fn`.
    """
    for path, leaf in jax.tree_util.tree_flatten_with_path(x)[0]:
        if isinstance(leaf, numbers.Number) and isinstance(x, list | tuple):
            raise TypeError(
                f"x{_path_name(path)} is a Python {type(leaf).__name__}: a list or tuple x is a "
                "pytree whose leaves must be arrays; for a nested list of numbers pass "
                "np.asarray(x)"
            )
        if _is_key(leaf):
            raise TypeError(
                f"x{_path_name(path)} is a PRNG key array: the batch checks change the inputs' "
                "samples and cannot change keys; close over it (fn = lambda x: f(x, key))"
            )
    named = _named_leaves("x", x)
    if not named:
        raise ValueError("x must hold at least one array")
    sizes = {}
    for path, leaf in named:
        _require_finite(f"x{path}", leaf)
        leaf_axis = _normalize_axis(f"axis for input leaf {path}", axis, leaf.ndim)
        sizes[path] = leaf.shape[leaf_axis]
    if len(set(sizes.values())) != 1:
        raise ValueError(
            f"every leaf of x must have the same batch size along axis {axis}, got {sizes}"
        )
    return named, jax.tree_util.tree_structure(x), next(iter(sizes.values()))


def _perturb_other_samples(
    leaf: np.ndarray, sample: int, axis: int, rng: np.random.Generator | None
) -> np.ndarray:
    """Changes every sample but `sample` along `axis`.

    Float samples get noise (zeros when `rng` is None); integer and boolean
    samples become copies of `sample` (always valid values, e.g. category ids).
    """
    moved = np.moveaxis(leaf, axis, 0).copy()
    others = np.arange(moved.shape[0]) != sample
    if _is_inexact(leaf):
        moved[others] = 0 if rng is None else _perturb(moved[others], rng)
    else:
        moved[others] = moved[sample]
    return np.moveaxis(moved, 0, axis)


def _take(leaf: np.ndarray, index: Any, axis: int) -> np.ndarray:
    return np.take(leaf, index, axis=axis % leaf.ndim)


def _output_leaves(
    fn: Callable[[Any], PyTree], x: Any
) -> tuple[PyTree, list[tuple[str, np.ndarray]]]:
    """`fn(x)` and its named leaves; a `ValueError` when it has none."""
    output = fn(x)
    baseline = _named_leaves("fn(x)", output)
    _require_outputs("fn", baseline, output)
    return output, baseline


def _checked_axes(
    outputs: list[tuple[str, np.ndarray]],
    axes: Sequence[int],
    check: Callable[[str, np.ndarray, int, int], None],
) -> list[int]:
    """The normalized axis of every output leaf, leaf by leaf.

    `check(path, leaf, leaf_axis, axis)` raises for a leaf whose shape does not
    fit the check (`axis` as requested, `leaf_axis` normalized).
    """
    normalized = []
    for (path, leaf), axis in zip(outputs, axes, strict=True):
        leaf_axis = _normalize_axis(f"out_axis for output leaf {path}", axis, leaf.ndim)
        check(path, leaf, leaf_axis, axis)
        normalized.append(leaf_axis)
    return normalized


def _check_output_batch(
    outputs: list[tuple[str, np.ndarray]], axes: Sequence[int], batch: int
) -> list[int]:
    """The normalized batch axis of every output leaf, checked to hold `batch` samples."""

    def holds_the_batch(path: str, leaf: np.ndarray, leaf_axis: int, axis: int) -> None:
        if leaf.shape[leaf_axis] != batch:
            raise ValueError(
                f"output leaf {path} has shape {leaf.shape}: batch size {leaf.shape[leaf_axis]} "
                f"along axis {axis}, expected {batch}"
            )

    return _checked_axes(outputs, axes, holds_the_batch)


def _gradient_leaks(
    fn: Callable[[Any], PyTree],
    named: list[tuple[str, np.ndarray]],
    treedef: Any,
    samples: Sequence[int],
    axis: int,
    output_axes: Sequence[int],
    atol: float,
    seed: int,
) -> list[str]:
    """Where the gradient of sample `i`'s outputs reaches another sample's inputs.

    `output_axes` holds the batch axis of each float output leaf, in order.
    """
    float_index = [k for k, (_, leaf) in enumerate(named) if _is_inexact(leaf)]
    if not float_index:
        return []
    leaves = [leaf for _, leaf in named]

    def with_float_leaves(*float_leaves: Any) -> PyTree:
        full = list(leaves)
        for k, value in zip(float_index, float_leaves, strict=True):
            full[k] = value
        return fn(jax.tree_util.tree_unflatten(treedef, full))

    outputs, pullback = _vjp(_float_outputs(with_float_leaves), *(leaves[k] for k in float_index))
    if not outputs:
        return []

    def input_gradients(cotangents: tuple[np.ndarray, ...]) -> PyTree:
        # The float leaves' gradients at their places in `x` (None elsewhere),
        # so that they are named by their paths in `x`.
        full: list[Any] = [None] * len(leaves)
        for k, gradient in zip(float_index, pullback(cotangents), strict=True):
            full[k] = gradient
        return jax.tree_util.tree_unflatten(treedef, full)

    return _sample_pullback_leaks(input_gradients, outputs, output_axes, axis, samples, atol, seed)


def _sample_pullback_leaks(
    pullback: Callable[[tuple[np.ndarray, ...]], PyTree],
    outputs: Sequence[Any],
    output_axes: Sequence[int],
    axis: int,
    samples: Sequence[int],
    atol: float,
    seed: int,
    name: str = "x",
) -> list[str]:
    """Where a pullback carries sample `i`'s outputs to another sample's inputs.

    The backward half of batch independence, shared by `assert_batch_independent`
    (a `jax.vjp`) and the property suite (compiled pullbacks). `pullback` maps
    a tuple of cotangents, one per entry of `outputs` (arrays, batch on
    `output_axes`), to the input gradients (a pytree, batch on `axis`, named
    `name` + path). For each `i` in `samples` the cotangents are random on
    sample `i` and zero elsewhere; a gradient above `atol` (or NaN) at any
    other sample is a leak.
    """
    rng = np.random.default_rng(seed)
    problems = []
    for sample in samples:
        gradients = pullback(_cotangents(outputs, output_axes, sample, rng))
        for path, gradient in jax.tree_util.tree_flatten_with_path(gradients)[0]:
            values = _as_float64(_to_numpy(f"{name}{_path_name(path)}", gradient))
            moved = np.moveaxis(values, axis % values.ndim, 0)
            for other in range(moved.shape[0]):
                if other == sample:
                    continue
                leak = _gradient_leak(moved[other], atol)
                if leak is not None:
                    problems.append(
                        f"gradient of outputs[sample {sample}] w.r.t. {name}{_path_name(path)}"
                        f"[sample {other}] is nonzero ({leak})"
                    )
    return problems


def _padding_mask(valid: Any, x: np.ndarray, axis: int) -> np.ndarray:
    """`valid` as a boolean `(B, T)` array matching `x`'s batch (axis 0) and time (`axis`) sizes."""
    mask = _to_numpy("valid", valid)
    if mask.dtype != np.bool_:
        raise TypeError(f"valid must be a boolean array (True = a real step), got {mask.dtype}")
    expected = (x.shape[0], x.shape[axis])
    if mask.shape != expected:
        raise ValueError(
            f"valid must have shape (B, T) = {expected} (x's axis 0 and axis {axis}), got "
            f"{mask.shape}"
        )
    return mask


def _at_positions(leaf: np.ndarray, leaf_axis: int, mask: np.ndarray) -> np.ndarray:
    """The elements of `leaf` (batch on axis 0, time on `leaf_axis`) at the `(b, t)` where
    `mask` is True, flattened to `(number of True, ...)`."""
    return np.moveaxis(leaf, leaf_axis, 1)[mask]


def assert_ignores_padding(
    fn: Callable[[Any], PyTree],
    x: Any,
    valid: Any,
    *,
    axis: int = 1,
    out_axis: int | PyTree | None = None,
    select: Callable[[PyTree], PyTree] | None = None,
    check_gradients: bool = True,
    atol: float = 0.0,
    rtol: float = 0.0,
    seed: int = 0,
) -> None:
    """Asserts that `fn`'s outputs at real steps ignore the inputs at padded steps.

    `valid (B, T)` marks the real steps of `x` (batch on axis 0, time on
    `axis`); `fn` closes over the same mask (``fn = lambda x: apply(params,
    x, valid)``). The inputs at padded steps (`valid` False) are replaced by
    noise as large as the values, then by zeros; every output leaf, at the
    `(b, t)` where `valid` is True, must stay equal (exact by default).
    Outputs at padded steps are free. This catches a padding mask applied
    after the softmax (the padded keys' logits still enter the
    normalization), a mean or a LayerNorm over the time axis that counts the
    padding, a mask missing in one head, or a recurrence that runs through
    trailing padding into a bidirectional read-out. `assert_causal` cannot:
    padding is not in the future.

    Backward (`check_gradients`): the gradient of a random weighting of the
    outputs at real steps w.r.t. `x` at padded steps must be zero (within
    `atol`).

    A mask with no padded step (nothing to change) or no real step (nothing
    to compare) passes trivially, as a sequence of one step does in
    `assert_causal`. `x` must be finite and the compared outputs free of NaN
    (NaN equals NaN here).

    Args:
      fn: `x -> pytree`; every output leaf has the batch on axis 0 and length
        `T` along `out_axis`.
      x: float array, e.g. `(B, T, D)`.
      valid: boolean `(B, T)`, True at real steps.
      axis: the time axis of `x` (not 0, the batch axis).
      out_axis: the time axis of the output leaves (default `axis`): an int or
        a pytree with an int per part of the output, e.g. `(1, 2)` for
        `fn -> (y (B, T, D), weights (B, heads, T, T))`.
      select: a function of `fn`'s output picking the parts to check.
      check_gradients: also run the backward check (one `jax.vjp`).
      atol, rtol: tolerance (finite, >= 0); the backward check uses `atol`.
      seed: seed of the noise and of the cotangents.

    Raises:
      AssertionError: naming the output leaves, the samples and steps whose
        values changed, and the padded steps that the gradient reaches.
    """
    _require_function(fn)
    seed = _seed(seed)
    check_gradients = _flag("check_gradients", check_gradients)
    x = _float_array("x", x)
    _require_finite("x", x)
    atol, rtol = _tolerance("atol", atol), _tolerance("rtol", rtol)
    axis = _normalize_axis("axis", axis, x.ndim)
    if axis == 0:
        raise ValueError("axis must be the time axis of x, not 0 (the batch axis)")
    mask = _padding_mask(valid, x, axis)
    if mask.all() or not mask.any():
        return
    fn = _selected(fn, select)
    output, baseline = _output_leaves(fn, x)

    def has_the_mask_shape(path: str, leaf: np.ndarray, leaf_axis: int, axis: int) -> None:
        if (
            leaf_axis == 0
            or leaf.shape[0] != mask.shape[0]
            or leaf.shape[leaf_axis] != mask.shape[1]
        ):
            raise ValueError(
                f"output leaf {path} has shape {leaf.shape}: expected the batch size "
                f"{mask.shape[0]} on axis 0 and the input length {mask.shape[1]} along "
                f"out_axis={axis}"
            )

    leaf_axes = _checked_axes(baseline, _leaf_axes(out_axis, output, axis), has_the_mask_shape)
    _require_no_nan(
        "fn(x) is NaN at real steps (NaN == NaN here, so a dependence on padding would not show):",
        [
            (path, _at_positions(leaf, a, mask))
            for (path, leaf), a in zip(baseline, leaf_axes, strict=True)
        ],
    )
    rng = np.random.default_rng(seed)
    padded = np.moveaxis(x, axis, 1).copy()
    noisy, zeroed = padded.copy(), padded.copy()
    noisy[~mask] = _perturb(padded[~mask], rng)
    zeroed[~mask] = 0
    changes = [("", noisy)]
    if not np.array_equal(zeroed, padded):
        changes.append((" (padded inputs set to 0)", zeroed))
    problems = []
    for label, changed in changes:
        outputs = _named_leaves("fn(x)", fn(np.moveaxis(changed, 1, axis)))
        for (path, before), (_, after), leaf_axis in zip(baseline, outputs, leaf_axes, strict=True):
            moved_after = np.moveaxis(after, leaf_axis, 1)
            moved_before = np.moveaxis(before, leaf_axis, 1)
            for b, t in np.argwhere(mask):
                problem = _mismatch(moved_after[b, t], moved_before[b, t], atol, rtol)
                if problem is not None:
                    problems.append(f"output {path}[sample {b}, step {t}]{label}: {problem}")
    if check_gradients:
        problems += _padding_gradient_leaks(fn, x, axis, mask, baseline, leaf_axes, atol, seed)
    if problems:
        header = (
            f"fn's outputs at real steps depend on the padded inputs ({int((~mask).sum())} padded "
            f"of {mask.size} steps along axis {axis}; their values change, or their gradient "
            "reaches those inputs):"
        )
        raise AssertionError(_summarize(header, problems))


def _padding_gradient_leaks(
    fn: Callable[[Any], PyTree],
    x: np.ndarray,
    axis: int,
    mask: np.ndarray,
    baseline: list[tuple[str, np.ndarray]],
    leaf_axes: Sequence[int],
    atol: float,
    seed: int,
) -> list[str]:
    """Where the gradient of the outputs at real steps reaches `x` at padded steps."""
    outputs, pullback = _vjp(_float_outputs(fn), x)
    if not outputs:
        return []
    float_axes = [a for (_, leaf), a in zip(baseline, leaf_axes, strict=True) if _is_inexact(leaf)]
    rng = np.random.default_rng(seed)
    cotangents = []
    for output, leaf_axis in zip(outputs, float_axes, strict=True):
        cotangent = np.zeros(output.shape, output.dtype)
        moved = np.moveaxis(cotangent, leaf_axis, 1)  # a view: writes reach `cotangent`
        moved[mask] = rng.uniform(0.5, 1.5, moved[mask].shape)
        cotangents.append(cotangent)
    (gradient,) = pullback(tuple(cotangents))
    values = np.moveaxis(_as_float64(_to_numpy("gradient", gradient)), axis, 1)
    problems = []
    for b, t in np.argwhere(~mask):
        leak = _gradient_leak(values[b, t], atol)
        if leak is not None:
            problems.append(
                f"gradient of the outputs at real steps w.r.t. x[sample {b}, step {t}] (padded) "
                f"is nonzero ({leak})"
            )
    return problems


def assert_batch_independent(
    fn: Callable[[Any], PyTree],
    x: PyTree,
    *,
    axis: int = 0,
    out_axis: int | PyTree | None = None,
    select: Callable[[PyTree], PyTree] | None = None,
    samples: Sequence[int] | None = None,
    check_gradients: bool = True,
    atol: float = 0.0,
    rtol: float = 0.0,
    seed: int = 0,
) -> None:
    """Asserts that sample `i`'s output and its gradient ignore every other sample `j`.

    Forward: for each tested sample `i`, all other samples of every input
    leaf are changed (floats get noise, and then zeros; integer leaves get
    copies of sample `i`); every output leaf's sample `i` must stay equal.
    The zeros catch a count of "real" (nonzero, unpadded) samples in the
    batch, which noise leaves as it was. Backward: the
    gradient of a random weighting of sample `i`'s outputs w.r.t. the float
    inputs must be zero at every other sample. This catches batch statistics
    (a mean over the batch, BatchNorm, a per-batch quantization range) in
    either pass. A batch of one passes trivially (there is no other sample).
    Float inputs must be finite, and the tested samples' outputs must not be
    NaN (NaN equals NaN here, so a NaN output would hide any mixing).

    Args:
      fn: `x -> pytree`, every float output leaf batched along `axis`.
      x: an array or a pytree of arrays (e.g. a tuple of model inputs), every
        leaf batched along `axis`.
      axis: the batch axis of every input leaf.
      out_axis: the batch axis of the output leaves (default: `axis`): an int,
        or a pytree with an int per part of the output (a prefix of its
        structure), as in `assert_causal`.
      select: a function of `fn`'s output picking the parts to check.
      samples: the samples `i` to test (default: all); a non-empty sequence of ints.
      check_gradients: also run the backward check (one `jax.vjp`; `fn` must
        be differentiable by JAX).
      atol, rtol: tolerance (exact by default; finite, >= 0).
      seed: seed of the perturbations and cotangents.

    Raises:
      AssertionError: naming the output leaves and the sample `i` whose output changed
        when the others did (forward), and the pair `(i, j)` whose gradient
        interacts (backward).
    """
    _require_function(fn)
    seed = _seed(seed)
    check_gradients = _flag("check_gradients", check_gradients)
    named, treedef, batch = _batched_leaves(x, axis)
    atol, rtol = _tolerance("atol", atol), _tolerance("rtol", rtol)
    tested = _samples(samples, batch)
    if batch < 2:
        return
    fn = _selected(fn, select)
    leaves = [leaf for _, leaf in named]
    output, baseline = _output_leaves(fn, jax.tree_util.tree_unflatten(treedef, leaves))
    output_axes = _check_output_batch(baseline, _leaf_axes(out_axis, output, axis), batch)
    _require_no_nan(
        "fn(x) is NaN at the tested samples (NaN == NaN here, so mixing would not show):",
        [
            (path, _take(leaf, list(tested), a))
            for (path, leaf), a in zip(baseline, output_axes, strict=True)
        ],
    )
    rng = np.random.default_rng(seed)
    problems = []
    for sample in tested:
        perturbed = [_perturb_other_samples(leaf, sample, axis, rng) for leaf in leaves]
        if all(np.array_equal(a, b) for a, b in zip(perturbed, leaves, strict=True)):
            raise ValueError(
                f"changing every sample but {sample} changed no element of x (its float leaves "
                f"are empty and its integer samples all equal sample {sample}): the check "
                "could not fail"
            )
        changes = [("", perturbed)]
        zeroed = [_perturb_other_samples(leaf, sample, axis, None) for leaf in leaves]
        if not all(np.array_equal(a, b) for a, b in zip(zeroed, leaves, strict=True)):
            changes.append((" (other samples set to 0)", zeroed))
        for label, changed in changes:
            outputs = _named_leaves("fn(x)", fn(jax.tree_util.tree_unflatten(treedef, changed)))
            for (path, before), (_, after), out in zip(baseline, outputs, output_axes, strict=True):
                problem = _mismatch(
                    _take(after, sample, out), _take(before, sample, out), atol, rtol
                )
                if problem is not None:
                    problems.append(f"output {path}[sample {sample}] changed{label}: {problem}")
    if check_gradients:
        float_axes = [
            out for (_, leaf), out in zip(baseline, output_axes, strict=True) if _is_inexact(leaf)
        ]
        problems += _gradient_leaks(fn, named, treedef, tested, axis, float_axes, atol, seed)
    if problems:
        header = f"fn mixes samples along batch axis {axis} (batch size {batch}):"
        raise AssertionError(_summarize(header, problems))


def assert_batch_order_equivariant(
    fn: Callable[[Any], PyTree],
    x: PyTree,
    *,
    axis: int = 0,
    out_axis: int | PyTree | None = None,
    select: Callable[[PyTree], PyTree] | None = None,
    atol: float | None = None,
    rtol: float = 1e-6,
    seed: int = 0,
) -> None:
    """Asserts that permuting the batch of every input leaf permutes every output leaf alike.

    Checked for a random permutation (`seed`) and for the two permutations
    that generate all others, the cyclic shift by one and the swap of the
    first two samples: a function equivariant under both is equivariant
    under every permutation. (One random permutation alone may fix a
    sample: with 4 samples and seed 0 it fixed the last one, so a function
    that treats the last sample as padding passed.)

    A small tolerance is the default: a matmul may sum a row in a different
    order when it moves within the batch. The default `atol` (None) is 1e-6
    times the largest finite `|fn(x)|` over the output's float leaves (1 if
    all are zero), so a wrong order is caught in outputs of magnitude 1e-8
    too; an explicit `atol` is absolute. `out_axis` and `select` work as in
    `assert_batch_independent` (the output's batch axes; the parts to check).
    A batch of one passes trivially; float inputs must be finite and the
    outputs free of NaN (which would match NaN wherever it moved).

    Raises:
      AssertionError: naming the output leaves that do not follow a
        permutation, and the permutation.
    """
    _require_function(fn)
    seed = _seed(seed)
    named, treedef, batch = _batched_leaves(x, axis)
    rtol = _tolerance("rtol", rtol)
    atol = None if atol is None else _tolerance("atol", atol)
    if batch < 2:
        return
    fn = _selected(fn, select)
    leaves = [leaf for _, leaf in named]
    output, baseline = _output_leaves(fn, jax.tree_util.tree_unflatten(treedef, leaves))
    if atol is None:
        atol = _BATCH_ORDER_ATOL * _output_scale(baseline)
    output_axes = _check_output_batch(baseline, _leaf_axes(out_axis, output, axis), batch)
    _require_no_nan("fn(x) is NaN (NaN == NaN here, so a wrong order would not show):", baseline)
    for permutation in _permutations(batch, seed):
        permuted = [_take(leaf, permutation, axis) for leaf in leaves]
        outputs = _named_leaves("fn(x)", fn(jax.tree_util.tree_unflatten(treedef, permuted)))
        problems = []
        for (path, before), (_, after), out in zip(baseline, outputs, output_axes, strict=True):
            problem = _mismatch(after, _take(before, permutation, out), atol, rtol)
            if problem is not None:
                problems.append(f"output {path}: {problem}")
        if problems:
            header = (
                f"fn(x[perm]) != fn(x)[perm] along axis {axis} for perm {permutation.tolist()}:"
            )
            raise AssertionError(_summarize(header, problems))


def _permutations(batch: int, seed: int) -> list[np.ndarray]:
    """A random permutation of `range(batch)` (never the identity), then the generators of all
    permutations not already listed: the cyclic shift by one and the swap of samples 0 and 1."""
    identity = np.arange(batch)
    permutation = np.random.default_rng(seed).permutation(batch)
    if np.array_equal(permutation, identity):
        permutation = np.roll(permutation, 1)
    swap = identity.copy()
    swap[[0, 1]] = [1, 0]
    chosen = [permutation]
    for generator in (np.roll(identity, 1), swap):
        if not any(np.array_equal(generator, seen) for seen in chosen):
            chosen.append(generator)
    return chosen


def assert_jit_matches_eager(
    fn: Callable[..., PyTree], *args: Any, rtol: float | None = None, atol: float | None = None
) -> None:
    """Asserts that `jax.jit(fn)(*args)` equals `fn(*args)` run op by op (`jax.disable_jit`).

    Both results must have the same structure, shapes and dtypes. Default
    tolerances follow each leaf's dtype (float32: rtol 1e-5, atol 1e-6;
    bfloat16: 2e-2) since XLA may fuse and reassociate; the default `atol` is
    relative to the output's magnitude: it is multiplied by the largest finite
    `|value|` of the op-by-op output over all its float leaves (1 if all are
    zero), so outputs of magnitude 1e6 are not failed at their elements near 0
    and outputs of magnitude 1e-8 are compared at their own scale. An explicit
    `atol` is absolute, in `fn`'s units. If `fn` is already a
    `jax.jit` function it is used as the compiled side as is, so a module-level
    jitted function is not traced again.

    Raises:
      AssertionError: naming each differing leaf, its largest difference and
        first differing index.
    """
    _require_function(fn)
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None:
            _tolerance(name, value)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    compiled = jitted(*args)
    _require_outputs("fn", _named_leaves("jit(fn)(*args)", compiled), compiled)
    # Op by op on JAX arrays, as jit sees them: on NumPy arrays a user's `x @ y` or
    # `x.mean()` would run in NumPy, with NumPy's dtype rules (bfloat16 @ -> float32).
    on_device = jax.tree_util.tree_map(
        lambda leaf: jnp.asarray(leaf) if isinstance(leaf, np.ndarray | np.generic) else leaf, args
    )
    with jax.disable_jit():
        eager = fn(*on_device)
    # A Python number among the outputs (a count, a constant) is a weakly typed
    # array under jit: compared as the array JAX makes of it.
    eager = jax.tree_util.tree_map(
        lambda leaf: jnp.asarray(leaf) if isinstance(leaf, numbers.Number) else leaf, eager
    )
    chex.assert_trees_all_equal_shapes_and_dtypes(compiled, eager)
    problems = _compare_trees(compiled, eager, atol, rtol, _JIT_TOLERANCE)
    if problems:
        raise AssertionError(_summarize("jit(fn) differs from fn run op by op:", problems))


def _enable_x64() -> contextlib.AbstractContextManager[Any]:
    """The 64-bit context manager (`jax.enable_x64` in JAX >= 0.7, else `jax.experimental`)."""
    if callable(getattr(jax, "enable_x64", None)):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64

    return enable_x64()


def _to_float64(leaf: Any) -> Any:
    array = np.asarray(leaf)
    if jnp.issubdtype(array.dtype, jnp.complexfloating):
        return array.astype(np.complex128)
    if jnp.issubdtype(array.dtype, jnp.floating):
        return array.astype(np.float64)
    return leaf


_RELATIVE_ERROR = re.compile(r"Max relative difference[^:]*:\s*([-+0-9.eE]+|inf|nan)")


def _float32_hint(report: str, fn: Callable[..., PyTree], args: tuple[Any, ...]) -> str:
    """The "fn computes in float32" hint, where the evidence points to it, else "".

    It applies when `fn` returns a lower precision than float64 for float64
    inputs, or when the reported relative error is the size that float32
    round-off divided by the finite-difference step gives (1e-5 to 1e-2),
    not when the derivative is plainly wrong (a relative error near 1).
    """
    try:
        outputs = jax.tree_util.tree_leaves(jax.eval_shape(fn, *args))
    except Exception:  # the report itself is what matters; the hint is a bonus
        outputs = []
    narrow = [
        str(leaf.dtype)
        for leaf in outputs
        if jnp.issubdtype(leaf.dtype, jnp.floating) and jnp.finfo(leaf.dtype).bits < 64
    ]
    if narrow:
        return (
            f"\n(fn returns {', '.join(sorted(set(narrow)))} for float64 inputs: it casts to a "
            "lower precision inside, e.g. a hard-coded dtype; finite differences then measure "
            "its round-off)"
        )
    errors = [float(value) for value in _RELATIVE_ERROR.findall(report)]
    if errors and all(1e-5 <= error <= 1e-2 for error in errors):
        return (
            f"\n(a relative error of {max(errors):.3g} in float64 usually means fn casts to "
            "float32 inside, e.g. a hard-coded dtype: float32 round-off divided by eps)"
        )
    return ""


def assert_grads_match_finite_differences(
    fn: Callable[..., PyTree],
    args: Sequence[Any],
    *,
    order: int = 1,
    modes: Sequence[str] = ("fwd", "rev"),
    eps: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    use_x64: bool = True,
    jit: bool = True,
) -> None:
    """Asserts that JAX's derivatives of `fn` match central finite differences.

    Runs `jax.test_util.check_grads(fn, args, order, modes)`, which compares
    forward- and reverse-mode derivatives with finite differences along a
    random direction. With `use_x64` (default) it runs under 64-bit mode and
    every float leaf of `args` is cast to float64, where the default step
    (1e-4) and tolerance (1e-5) are sound. Pass parameters through `args`:
    closed-over float32 arrays stay float32 and the check then works at
    float32 precision (`check_grads` picks its tolerance from the output dtype).

    Float32 fallback (`use_x64=False`): `eps` defaults to
    `FLOAT32_FINITE_DIFFERENCE_EPS` = 1e-4, which passes reliably on small
    functions; 1e-2 (truncation error) and 1e-5 or below (cancellation) fail
    often. On a whole block float32 round-off can still exceed the default
    float32 tolerance (2e-3): prefer float64, or pass `rtol`/`atol`.
    64-bit mode is `jax.enable_x64(True)` (JAX >= 0.7; older JAX:
    `jax.experimental.enable_x64()`).

    Functions built on `jax.custom_vjp` (a straight-through estimator) have no
    forward mode: pass `modes=("rev",)`. An STE gradient is a surrogate, not
    the derivative, so check it with `assert_ste_gradient`, never here.

    Args:
      fn: a function of `*args` returning an array or pytree.
      args: the point at which to differentiate: a sequence of arguments
        (`(x,)`, not `x`), every leaf a float array.
      order: derivative order (1 or more).
      modes: any of `"fwd"`, `"rev"`.
      eps: finite-difference step, finite and > 0 (None: 1e-4).
      atol, rtol: tolerances, finite and >= 0 (None: by dtype, `check_grads`' defaults).
        With `atol=None` each output leaf whose derivatives are below 1 is
        first divided by a power of two near their size, so that the
        default absolute tolerance (1e-5 in float64) does not pass any
        gradient of a function whose derivatives are that small; an explicit
        `atol` is in `fn`'s units and nothing is divided.
      use_x64: run in float64.
      jit: wrap `fn` in `jax.jit` (unless it already is one), so that each of
        `check_grads`' evaluations compiles once instead of primitive by
        primitive (a Flax block: ~6 s instead of ~19 s on a small CPU).

    Raises:
      AssertionError: with `check_grads`' report of the differing derivative.
    """
    _require_function(fn)
    if isinstance(order, bool) or not isinstance(order, int) or order < 1:
        raise ValueError(f"order must be an int >= 1, got {order!r}")
    modes = tuple(modes)
    if not modes or any(mode not in ("fwd", "rev") for mode in modes):
        raise ValueError(f"modes must be a non-empty subset of ('fwd', 'rev'), got {modes}")
    if isinstance(args, np.ndarray | jax.Array) or not isinstance(args, Sequence):
        shape = getattr(args, "shape", None)
        raise TypeError(
            f"args must be a sequence of fn's arguments, e.g. (x,), got {type(args).__name__}"
            + (f" of shape {shape} (it would be split along its first axis)" if shape else "")
        )
    args = tuple(args)
    for path, leaf in _named_leaves("args", args):
        if not _is_inexact(leaf):
            raise TypeError(
                f"args{path} has dtype {leaf.dtype}: every argument is differentiated, so pass "
                "only float arrays (close over integer arguments with functools.partial)"
            )
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None:
            _tolerance(name, value)
    step = FLOAT32_FINITE_DIFFERENCE_EPS if eps is None else _real("eps", eps)
    if not (math.isfinite(step) and step > 0):
        raise ValueError(f"eps must be finite and > 0, got {step}")
    precision = "float64" if use_x64 else "the given dtypes"
    context = _enable_x64() if use_x64 else contextlib.nullcontext()
    try:
        with context:
            point = jax.tree_util.tree_map(_to_float64, args) if use_x64 else args
            checked = jax.jit(fn) if jit and not hasattr(fn, "lower") else fn
            compared, scaled = checked, ""
            if atol is None:
                divisors = _derivative_divisors(checked, point, step)
                if any(divisor != 1.0 for divisor in divisors):
                    compared = _divided(checked, divisors, jit)
                    scaled = (
                        f"\n(each output leaf was divided by its derivative's scale, "
                        f"{', '.join(f'{divisor:.3g}' for divisor in divisors)}, so that the "
                        "default absolute tolerance is relative to it)"
                    )
            try:
                check_grads(compared, point, order, modes=modes, eps=step, atol=atol, rtol=rtol)
            except AssertionError as error:
                hint = _float32_hint(str(error), checked, point) if use_x64 else ""
                raise AssertionError(
                    f"derivatives of fn differ from central finite differences "
                    f"(order {order}, modes {modes}, eps {step:g}, in {precision}):\n{error}{hint}"
                    f"{scaled}"
                ) from error
    except TypeError as error:
        text = str(error)
        if not (use_x64 and "float32" in text and "float64" in text):
            raise
        raise TypeError(
            f"{text}\n(the check casts fn's float arguments to float64, and fn made float32 "
            "values of its own that met them: an RNN carry created in the cell's "
            "param_dtype, a hard-coded dtype; build the module with "
            "param_dtype=jnp.float64, or pass use_x64=False with rtol and atol)"
        ) from error


# The smallest derivative scale the default tolerance is made relative to (2**-60 ~ 9e-19).
_SMALLEST_DERIVATIVE_SCALE = -60


def _derivative_divisors(
    fn: Callable[..., PyTree], point: tuple[Any, ...], step: float
) -> list[float]:
    """Per output leaf of `fn`, a power of two `<= 1` near its largest finite-difference slope.

    `check_grads`' default tolerance is absolute as well as relative (1e-5
    in float64): a function whose derivatives are 1e-6 passes with any
    gradient, zero or negated included. Dividing each output leaf by the
    largest central difference `|f(x + h v) - f(x - h v)| / 2h` along a
    random direction `v` (a power of two: the division is exact) makes that
    tolerance relative to the derivative's size. Leaves whose slope is >= 1,
    zero or not finite keep 1 (the check is never loosened); integer leaves keep 1.
    """
    rng = np.random.default_rng(0)
    leaves, treedef = jax.tree_util.tree_flatten(point)
    arrays = [np.asarray(leaf) for leaf in leaves]
    directions = [rng.standard_normal(array.shape) for array in arrays]

    def moved(sign: float) -> tuple[Any, ...]:
        shifted = [
            (_as_float64(array) + sign * step * direction).astype(array.dtype)
            for array, direction in zip(arrays, directions, strict=True)
        ]
        return jax.tree_util.tree_unflatten(treedef, shifted)

    ahead = jax.tree_util.tree_leaves(fn(*moved(1.0)))
    behind = jax.tree_util.tree_leaves(fn(*moved(-1.0)))
    divisors = []
    for a, b in zip(ahead, behind, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        divisor = 1.0
        if _is_inexact(a) and a.size:
            with np.errstate(invalid="ignore", over="ignore"):
                slope = np.abs(_as_float64(a) - _as_float64(b)) / (2 * step)
                largest = float(np.max(np.where(np.isfinite(slope), slope, 0.0)))
            if 0.0 < largest < 1.0:
                divisor = 2.0 ** max(math.floor(math.log2(largest)), _SMALLEST_DERIVATIVE_SCALE)
        divisors.append(divisor)
    return divisors


def _divided(fn: Callable[..., PyTree], divisors: Sequence[float], jit: bool) -> Callable[..., Any]:
    """`fn` with output leaf `k` divided by `divisors[k]` (jitted when `jit`)."""

    def divided(*args: Any) -> PyTree:
        leaves, treedef = jax.tree_util.tree_flatten(fn(*args))
        scaled = [
            leaf if divisor == 1.0 else leaf / divisor
            for leaf, divisor in zip(leaves, divisors, strict=True)
        ]
        return jax.tree_util.tree_unflatten(treedef, scaled)

    return jax.jit(divided) if jit else divided


def _integer_grid(qmin: Any, qmax: Any) -> tuple[int, int]:
    for name, value in (("qmin", qmin), ("qmax", qmax)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if qmin >= qmax:
        raise ValueError(f"qmin must be < qmax, got qmin={qmin}, qmax={qmax}")
    return int(qmin), int(qmax)


def _round_half_away(values: np.ndarray) -> np.ndarray:
    """Rounding with ties away from zero (C's `round`): 0.5 -> 1, -2.5 -> -3."""
    return np.copysign(np.floor(np.abs(values) + 0.5), values)


_TIES = {"even": np.round, "away": _round_half_away}


def _quantization_ways(
    x: np.ndarray,
    scale: Any,
    zero_point: Any,
    rounding: Callable[[np.ndarray], np.ndarray] = np.round,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """`(round(x / scale) + zero_point, scale)` as every sound quantizer may compute them.

    In `x`'s dtype widened to at least float32 (the precision
    `qat.fake_quantize` and PyTorch compute in, with the scale as given):
    IEEE division, and multiplication by the rounded reciprocal, which is
    what PyTorch's fake quantization kernels and `qat.fake_quantize` compute
    (and what XLA emits for a division by a broadcast scalar: its algebraic
    simplifier rewrites `x / s` to `x * (1 / s)`); for float16 or bfloat16
    `x`, the same two in `x`'s own dtype (scale cast to it, unless it is 0
    there) as well. A correct quantizer may compute any of them: the codes
    differ only where `x / s` is within a few ulps (of `x`'s dtype) of a
    tie. Each way's scale is the one it computes with. All float64.
    `rounding` rounds the quotients (`np.round`: half to even).
    """
    _check_broadcast("scale", scale, x.shape)
    _check_broadcast("zero_point", zero_point, x.shape)
    wide = np.promote_types(x.dtype, np.float32)
    if np.any(~(_as_float64(np.asarray(scale, wide)) > 0)):
        raise ValueError(f"scale must be positive, got {scale}")
    dtypes = [wide]
    if wide != x.dtype and np.all(_as_float64(np.asarray(scale, x.dtype)) > 0):
        dtypes.append(x.dtype)
    offset = np.asarray(zero_point, np.float64)
    ways = []
    for dtype in dtypes:
        step = np.asarray(scale, dtype)
        values = x.astype(dtype)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            divided = rounding(values / step)
            reciprocal = rounding(values * (np.ones_like(step) / step))
        for codes in (divided, reciprocal):
            ways.append((_as_float64(codes) + offset, _as_float64(step)))
    return ways


def _quantization_codes(x: np.ndarray, scale: Any, zero_point: Any) -> list[np.ndarray]:
    """The codes of `_quantization_ways` (half to even)."""
    return [codes for codes, _ in _quantization_ways(x, scale, zero_point)]


def assert_ste_gradient(
    quantize_fn: Callable[..., Any],
    x: Any,
    scale: Any,
    zero_point: Any,
    qmin: int,
    qmax: int,
    *,
    seed: int = 0,
) -> None:
    """Asserts that the gradient of `quantize_fn` w.r.t. `x` is exactly the clipped-STE mask.

    The surrogate (PyTorch's `fake_quantize_per_tensor_affine`) passes the
    upstream gradient `g` where the rounded code lies in the grid, inclusive
    at both ends, and zero elsewhere::

        dL/dx = g * (qmin <= round(x / scale) + zero_point <= qmax)

    The check pulls back a random nonzero `g` and demands bitwise equality,
    so a half gradient at a bound (`jnp.clip`'s), a gradient blocked at a
    saturated bound (`>` for `>=`) or a missing mask all fail. Include grid
    bounds and ties in `x` (`strategies.fake_quantize_cases` does).

    One ambiguity is allowed: XLA computes `x / s` for a scalar `s` as
    `x * (1 / s)`, which can round a tie `x / s = qmax + 0.5` to the other
    side of the grid's edge than IEEE division does. For a float16 or
    bfloat16 `x` the codes are computed in float32 with the scale as given
    (as `qat.fake_quantize` does), and a quantizer computing in `x`'s own
    dtype is allowed too. Where these roundings disagree on the mask, the
    gradient may be `g` or `0` (still exactly one of them); everywhere else
    it must be exact.

    Args:
      quantize_fn: called as `quantize_fn(x, scale, zero_point, qmin, qmax)`.
      x: float array.
      scale: positive step, scalar or broadcastable to `x` (per channel).
      zero_point: integer offset, scalar or broadcastable to `x`.
      qmin, qmax: the inclusive integer grid.
      seed: seed of the upstream gradient.

    Raises:
      AssertionError: with counts per region (inside, at a bound, outside)
        and examples showing `x`, its code, and the gradient ratio `got / g`.
    """
    seed = _seed(seed)
    x = _float_array("x", x)
    qmin, qmax = _integer_grid(qmin, qmax)
    codes, *alternatives = (
        np.broadcast_to(way, x.shape) for way in _quantization_codes(x, scale, zero_point)
    )
    mask = (codes >= qmin) & (codes <= qmax)
    ambiguous = np.zeros(x.shape, bool)
    for alternative in alternatives:
        ambiguous |= mask != ((alternative >= qmin) & (alternative <= qmax))
    output, pullback = jax.vjp(lambda v: quantize_fn(v, scale, zero_point, qmin, qmax), x)
    if output.shape != x.shape:
        raise AssertionError(f"quantize_fn changed the shape: {x.shape} -> {output.shape}")
    rng = np.random.default_rng(seed)
    # Representable in both `x`'s and the output's dtype: a quantizer computing in
    # float32 for a float16 `x` returns float32, and its gradient, cast back to
    # float16, must still equal `g` bit for bit.
    upstream = (
        (rng.uniform(0.5, 1.5, x.shape) * rng.choice((-1.0, 1.0), x.shape))
        .astype(x.dtype)
        .astype(output.dtype)
    )
    (gradient,) = pullback(upstream)
    gradient = _to_numpy("gradient", gradient)
    expected = np.where(mask, upstream, np.zeros_like(upstream))
    if gradient.shape != x.shape:
        raise AssertionError(f"gradient has shape {gradient.shape}, expected {x.shape}")
    zero = np.zeros_like(upstream)
    wrong = ~((gradient == expected) | (ambiguous & ((gradient == upstream) | (gradient == zero))))
    if not wrong.any():
        return
    at_bound = (codes == qmin) | (codes == qmax)
    regions = {
        "inside the grid": wrong & mask & ~at_bound,
        "at qmin or qmax": wrong & at_bound,
        "outside the grid": wrong & ~mask,
    }
    counts = ", ".join(f"{int(region.sum())} {label}" for label, region in regions.items())
    ratio = _as_float64(gradient) / _as_float64(upstream)
    _fail_at(
        wrong,
        f"gradient of quantize_fn is not the clipped STE mask on [{qmin}, {qmax}] at "
        f"{int(wrong.sum())} of {x.size} elements ({counts}):",
        lambda index: (
            f"x{_index(index)} = {float(x[index]):.7g}: code {codes[index]:g}, "
            f"gradient / g = {ratio[index]:.6g}, expected {int(mask[index])}"
        ),
    )


def assert_quantization_error_bounded(
    quantize_fn: Callable[..., Any],
    x: Any,
    scale: Any,
    zero_point: Any,
    qmin: int,
    qmax: int,
    *,
    ulps: float = 4.0,
) -> None:
    """Asserts `|fq(x) - x| <= scale / 2` inside the range and saturation to the ends outside it.

    The representable range is `[(qmin - zp) * scale, (qmax - zp) * scale]`.
    Inside it the rounding error is at most half a step; below or above it
    the output must equal the nearest end. Both allow a float slack of `ulps`
    units of `x`'s dtype relative to `|x| + scale`.

    Args:
      quantize_fn: called as `quantize_fn(x, scale, zero_point, qmin, qmax)`.
      x: float array.
      scale, zero_point: scalars or broadcastable to `x` (per channel).
      qmin, qmax: the inclusive integer grid.
      ulps: float slack in units of `x`'s machine epsilon.

    Raises:
      AssertionError: with examples of violations and their error in steps.
    """
    x = _float_array("x", x)
    qmin, qmax = _integer_grid(qmin, qmax)
    ulps = _tolerance("ulps", ulps)
    _quantization_codes(x, scale, zero_point)  # validates scale and zero_point
    output = _as_float64(_to_numpy("quantize_fn(x)", quantize_fn(x, scale, zero_point, qmin, qmax)))
    if output.shape != x.shape:
        raise AssertionError(f"quantize_fn changed the shape: {x.shape} -> {output.shape}")
    values = _as_float64(x)
    # The scale as given (in at least float32, as `_quantization_ways` computes):
    # cast to float16, a scale below its normal range (6.1e-5) moves the grid.
    wide = np.promote_types(x.dtype, np.float32)
    step = np.broadcast_to(_as_float64(np.asarray(scale, wide)), x.shape)
    offset = np.broadcast_to(np.asarray(zero_point, np.float64), x.shape)
    low, high = (qmin - offset) * step, (qmax - offset) * step
    slack = ulps * float(jnp.finfo(x.dtype).eps) * (np.abs(values) + step)
    inside = (values >= low) & (values <= high)
    with np.errstate(invalid="ignore"):
        error = np.abs(output - values)
        nearest_end = np.where(values < low, low, high)
        violations = ~np.isfinite(output) | np.where(
            inside, error > step / 2 + slack, np.abs(output - nearest_end) > slack
        )
    if not violations.any():
        return
    examples = []
    for index in map(tuple, np.argwhere(violations)):
        where = "inside the range" if inside[index] else "outside the range"
        examples.append(
            f"x{_index(index)} = {values[index]:.7g} ({where}): fq(x) = "
            f"{output[index]:.7g}, |fq(x) - x| = {error[index] / step[index]:.4g} steps"
        )
    header = (
        f"quantization error out of bounds at {int(violations.sum())} of {x.size} elements "
        f"(range [{float(np.min(low)):g}, {float(np.max(high)):g}], inside: |fq(x) - x| <= "
        f"scale/2, outside: fq(x) = nearest end):"
    )
    raise AssertionError(_summarize(header, examples))


def assert_rounds_to_grid(
    quantize_fn: Callable[..., Any],
    x: Any,
    scale: Any,
    zero_point: Any,
    qmin: int,
    qmax: int,
    *,
    ties: str = "even",
    ulps: float = 0.0,
) -> None:
    """Asserts `fq(x) = (clip(round(x / scale) + zp, qmin, qmax) - zp) * scale` element by element.

    Every output must be the grid point nearest `x`, the nearest end of the
    grid outside it, with ties `x / scale = k + 1/2` rounded as `ties` says:
    'even' (`jnp.round`, PyTorch's `nearbyint`) or 'away' from zero (C's
    `round`). The bound of `assert_quantization_error_bounded` is met by a
    quantizer that only clips (`fq(x) = x` in range: error 0) and by either
    tie rule; this check fails both where they differ. Include ties and
    off-grid values in `x` (`strategies.fake_quantize_cases` does).

    The codes may be computed as `assert_ste_gradient` allows (IEEE division
    or the reciprocal of the scale, in float32 with the scale as given or in
    `x`'s own dtype): where these roundings differ (within an ulp of a tie),
    either grid point passes. The output must be the grid point `(q - zp) *
    scale` rounded to its dtype, directly or through float32 (a float32
    computation cast to bfloat16), exactly: with 8 significant bits, a
    bfloat16 output one code off at the top of an 8-bit grid is a single ulp
    away. `ulps` admits other orders of arithmetic (`q * s - zp * s`); a
    subnormal point may come out as 0 (flushed).

    Args:
      quantize_fn: called as `quantize_fn(x, scale, zero_point, qmin, qmax)`.
      x: float array.
      scale, zero_point: scalars or broadcastable to `x` (per channel).
      qmin, qmax: the inclusive integer grid.
      ties: 'even' or 'away'.
      ulps: slack in units of the output dtype's machine epsilon relative to
        the point (0: exactly the rounded point).

    Raises:
      AssertionError: with examples: `x`, `x / scale`, the output in steps
        and the grid point expected.
    """
    if ties not in _TIES:
        raise ValueError(f"ties must be one of {sorted(_TIES)}, got {ties!r}")
    x = _float_array("x", x)
    qmin, qmax = _integer_grid(qmin, qmax)
    ulps = _tolerance("ulps", ulps)
    ways = _quantization_ways(x, scale, zero_point, _TIES[ties])
    output = _to_numpy("quantize_fn(x)", quantize_fn(x, scale, zero_point, qmin, qmax))
    if output.shape != x.shape:
        raise AssertionError(f"quantize_fn changed the shape: {x.shape} -> {output.shape}")
    if not _is_inexact(output):
        raise AssertionError(f"quantize_fn returned dtype {output.dtype}, not a float array")
    info = jnp.finfo(output.dtype)
    offset = np.broadcast_to(np.asarray(zero_point, np.float64), x.shape)
    got = _as_float64(output)
    matches = np.zeros(x.shape, bool)
    points = []
    for codes, step in ways:
        point = (np.clip(np.broadcast_to(codes, x.shape), qmin, qmax) - offset) * step
        points.append((point, np.broadcast_to(step, x.shape)))
        # The point rounded to the output dtype, directly or through float32.
        for rounded in (point.astype(output.dtype), point.astype(np.float32).astype(output.dtype)):
            candidate = _as_float64(rounded)
            slack = ulps * float(info.eps) * np.abs(candidate)
            # A subnormal result may be flushed to zero (GPUs, XLA's fast math).
            flushed = (np.abs(candidate) < float(info.tiny)) & (got == 0.0)
            with np.errstate(invalid="ignore"):
                matches |= (np.abs(got - candidate) <= slack) | flushed
    wrong = ~matches
    if not wrong.any():
        return
    expected, step = points[0]
    _fail_at(
        wrong,
        f"quantize_fn does not round to the nearest point of the [{qmin}, {qmax}] grid "
        f"(ties {'to even' if ties == 'even' else 'away from zero'}) at {int(wrong.sum())} "
        f"of {x.size} elements:",
        lambda index: (
            f"x{_index(index)} = {float(x[index]):.7g} (x / scale = "
            f"{float(x[index]) / step[index]:.7g}): fq(x) = {got[index]:.7g} "
            f"({got[index] / step[index]:.7g} steps), expected {expected[index]:.7g} "
            f"({expected[index] / step[index]:.7g} steps)"
        ),
    )


def assert_idempotent(
    fn: Callable[[Any], PyTree], x: Any, *, atol: float = 0.0, rtol: float = 0.0
) -> None:
    """Asserts `fn(fn(x)) == fn(x)` leaf by leaf (exact by default), e.g. for a fake quantizer.

    `fn(x)` must not be NaN: NaN equals NaN here, so a NaN output (a scale of
    0 gives `0 / 0`) would pass whatever the second application does.

    Raises:
      AssertionError: naming the leaves where a second application changes the
        result, or where `fn(x)` is NaN.
    """
    _require_function(fn)
    atol, rtol = _tolerance("atol", atol), _tolerance("rtol", rtol)
    once = fn(x)
    named = _named_leaves("fn(x)", once)
    _require_outputs("fn", named, once)
    _require_no_nan("fn(x) is NaN (NaN == NaN here, so fn(fn(x)) could not differ):", named)
    twice = fn(once)
    problems = _compare_trees(twice, once, atol, rtol)
    if problems:
        raise AssertionError(_summarize("fn(fn(x)) != fn(x):", problems))


def _global_norm(named: list[tuple[str, np.ndarray]]) -> float:
    return math.sqrt(sum(float(np.sum(np.abs(_as_float64(leaf)) ** 2)) for _, leaf in named))


def assert_clipped(
    updates: PyTree, max_norm: float, *, grads: PyTree | None = None, rtol: float | None = None
) -> None:
    """Asserts that the global L2 norm of `updates` is at most `max_norm`.

    With `grads`, also asserts the exact rescaling of
    `optax.clip_by_global_norm`: `updates == grads * min(1, max_norm / ||grads||)`
    leaf by leaf (tolerance `rtol`, and `rtol` times the norm of the expected
    updates absolute, not `rtol * max_norm`: gradients far inside the ball
    would all fit in that), so clipping that changes the direction, shrinks
    gradients already inside the ball, or clips per leaf instead of globally
    fails too.

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
    # The expected updates' norm (max_norm when ||grads|| is not finite).
    expected_norm = min(max_norm, gradient_norm * factor)
    problems = _compare_trees(actual, expected, rtol * expected_norm, rtol)
    if problems:
        header = (
            f"updates are not grads * min(1, max_norm / ||grads||) = grads * {factor:.6g} "
            f"(||grads|| = {gradient_norm:.6g}, max_norm = {max_norm:g}):"
        )
        raise AssertionError(_summarize(header, problems))


@dataclasses.dataclass
class CompileLog:
    """Names of the computations lowered for compilation while a `count_compiles` block ran.

    Every `jax.jit` trace that reaches XLA is one entry, persistent-cache hits
    included (those skip only the backend compile), and so is every eager
    primitive run on a new shape.
    """

    names: list[str] = dataclasses.field(default_factory=list)

    @property
    def count(self) -> int:
        """Number of lowerings."""
        return len(self.names)

    def summary(self) -> str:
        """`name xN` per computation, most frequent first."""
        counts = collections.Counter(self.names).most_common()
        return ", ".join(f"{name} x{count}" for name, count in counts)


@contextlib.contextmanager
def count_compiles() -> Iterator[CompileLog]:
    """Context manager recording every computation JAX lowers inside the block.

    Example::

        with checks.count_compiles() as log:
            for config in configs:
                step(config)
        print(log.count, log.summary())
    """
    log = CompileLog()

    def listener(event: str, duration_secs: float, **kwargs: Any) -> None:
        del duration_secs
        if event == _LOWERING_EVENT:
            log.names.append(str(kwargs.get("fun_name", "<unknown>")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield log
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


@contextlib.contextmanager
def assert_max_compiles(max_compiles: int) -> Iterator[CompileLog]:
    """Context manager asserting that at most `max_compiles` computations are lowered inside it.

    Raises:
      AssertionError: on exit, listing what was compiled and how often.
    """
    if isinstance(max_compiles, bool) or not isinstance(max_compiles, int) or max_compiles < 0:
        raise ValueError(f"max_compiles must be an int >= 0, got {max_compiles!r}")
    with count_compiles() as log:
        yield log
    if log.count > max_compiles:
        raise AssertionError(
            f"{log.count} computations compiled, expected at most {max_compiles}: {log.summary()}"
        )
