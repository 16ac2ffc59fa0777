"""What the checks share: leaves by pytree path, argument checks, float64 comparisons, reports."""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


_MAX_REPORTED = 6


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
        raise TypeError(
            f"{name} must be a floating array, got dtype {array.dtype}: the check perturbs "
            f"{name} with noise; for a model of integer codes (token ids), check what follows "
            f"the lookup on float inputs (fn = lambda e: body(e), {name} = embed(ids))"
        )
    if array.size == 0:
        raise ValueError(
            f"{name} must hold at least one element, got shape {array.shape}: there would be "
            "nothing to check"
        )
    return array


def _require_elements(name: str, named: list[tuple[str, np.ndarray]]) -> None:
    """Raises `ValueError` unless some leaf of `named` (`_named_leaves`) holds an element."""
    if not any(leaf.size for _, leaf in named):
        shapes = [leaf.shape for _, leaf in named]
        raise ValueError(
            f"{name} must hold at least one element, got leaf shapes {shapes}: there would be "
            "nothing to check"
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


def _index(index: Sequence[Any]) -> str:
    """`[i, j]` for an element index."""
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def _summarize(header: str, problems: Sequence[str]) -> str:
    lines = [header, *(f"  {problem}" for problem in problems[:_MAX_REPORTED])]
    if len(problems) > _MAX_REPORTED:
        lines.append(f"  ... and {len(problems) - _MAX_REPORTED} more")
    return "\n".join(lines)


def _mismatch(
    actual: np.ndarray, expected: np.ndarray, atol: float | np.ndarray, rtol: float
) -> str | None:
    """Describes where `actual` is not within `atol + rtol*|expected|` of `expected`, or None.

    `atol` may be an array that broadcasts against `expected` (one tolerance per sample).

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
    Not by each leaf's: a leaf that is zero by symmetry (an attention key
    bias's gradient) holds rounding noise of the tree's scale, which its own
    scale would fail.
    """
    actual_structure = jax.tree_util.tree_structure(actual)
    expected_structure = jax.tree_util.tree_structure(expected)
    if actual_structure != expected_structure:  # type: ignore[operator]  # no jaxlib stub
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


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxdict, _SHORT_REPR.maxlist, _SHORT_REPR.maxother = 2, 3, 3, 40
_SHORT_REPR_LENGTH = 80


def _short_repr(value: Any) -> str:
    """`repr(value)` cut to a line: the repr of a parameter tree would fill the screen."""
    text = _SHORT_REPR.repr(value)
    if len(text) > _SHORT_REPR_LENGTH:
        text = text[: _SHORT_REPR_LENGTH - 3] + "..."
    return text


def _require_function(fn: Any, name: str = "fn", called_as: str = "a function of x") -> None:
    """Raises `TypeError` unless `fn` is callable (checked first: some checks never call it)."""
    if not callable(fn):
        raise TypeError(f"{name} must be {called_as}, got {type(fn).__name__} {_short_repr(fn)}")


def _is_axis(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)
