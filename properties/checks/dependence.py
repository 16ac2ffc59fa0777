"""Checks of what an output depends on: causality, padding, batch independence and order.

`assert_causal`, `assert_ignores_padding`, `assert_batch_independent` and
`assert_batch_order_equivariant` perturb inputs the output must ignore (in
NumPy) and pull cotangents back through `jax.vjp`: a leak shows in the value
or in the gradient.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from properties.checks._support import (
    _UNTRACEABLE,
    _as_float64,
    _flag,
    _float_array,
    _index,
    _integers,
    _is_axis,
    _is_inexact,
    _is_key,
    _mismatch,
    _named_leaves,
    _path_name,
    _require_function,
    _require_no_nan,
    _require_outputs,
    _seed,
    _short_repr,
    _summarize,
    _to_numpy,
    _tolerance,
)

PyTree = Any


# Default atol of assert_batch_order_equivariant, times the output's magnitude.
_BATCH_ORDER_ATOL = 1e-6


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


def _samples(samples: Sequence[int] | None, batch: int) -> Sequence[int]:
    """The samples to test: all of a batch of `batch` for None, else ints in `[0, batch)`."""
    if samples is None:
        return range(batch)
    chosen = _integers("samples", samples)
    bad = [i for i in chosen if not 0 <= i < batch]
    if bad:
        raise ValueError(f"samples must lie in [0, {batch}), got {bad}")
    return chosen


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


def _perturb(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Adds noise at least as large as each value (so saturating functions still see a change).

    Kept within the dtype's finite range: float16 values of 3e4 became inf,
    and a correct masked function then read `0 * inf = NaN` at its masked steps.
    """
    wide = _as_float64(values)
    noise = rng.standard_normal(wide.shape) * (1.0 + np.abs(wide))
    perturbed = wide + noise
    if not np.iscomplexobj(perturbed):
        largest = float(jnp.finfo(values.dtype).max)
        perturbed = np.clip(perturbed, -largest, largest)
    return perturbed.astype(values.dtype)


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


def _selected(fn: Callable[[Any], PyTree], select: Callable[[PyTree], PyTree] | None) -> Any:
    """`fn` followed by `select` (the outputs to check), or `fn` itself."""
    if select is None:
        return fn
    if not callable(select):
        raise TypeError(f"select must be a function of fn's output, got {select!r}")
    return lambda x: select(fn(x))


class _LeafShape:
    """Stands for an output leaf in messages: `float32[4, 64, 32]`, never its values."""

    def __init__(self, leaf: Any) -> None:
        dtype = getattr(leaf, "dtype", None)
        self.text = f"{dtype if dtype is not None else type(leaf).__name__}{list(np.shape(leaf))}"

    def __repr__(self) -> str:
        return self.text


# The longest part of JAX's structure error quoted in a message (it reprs the whole output).
_STRUCTURE_ERROR_LENGTH = 300


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
            f"{_short_repr(out_axis)}"
        )
    try:
        subtrees = treedef.flatten_up_to(output)  # type: ignore[attr-defined]  # no jaxlib stub
    except (TypeError, ValueError):
        # JAX's error quotes the whole output, arrays and all (6,000 characters for
        # a (4, 64, 32) pair): say it again on leaves shown by dtype and shape.
        shapes = jax.tree_util.tree_map(_LeafShape, output)
        try:
            treedef.flatten_up_to(shapes)  # type: ignore[attr-defined]  # no jaxlib stub
            detail = ""
        except (TypeError, ValueError) as error:
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            if len(detail) > _STRUCTURE_ERROR_LENGTH:
                detail = detail[: _STRUCTURE_ERROR_LENGTH - 3] + "..."
            detail = f" ({detail})"
        raise ValueError(
            f"out_axis {_short_repr(out_axis)} must be a prefix of fn's output structure "
            f"{jax.tree_util.tree_structure(output)}{detail}"
        ) from None
    axes = []
    for axis, subtree in zip(axes_leaves, subtrees, strict=True):
        axes += [int(axis)] * len(jax.tree_util.tree_leaves(subtree))
    return axes


# The output leaves whose shapes a message lists.
_SHAPES_SHOWN = 8


def _require_unambiguous_time_axes(
    outputs: list[tuple[str, np.ndarray]], x_shape: tuple[int, ...], axis: int
) -> None:
    """Refuses the default `out_axis` (x's time `axis` for every output leaf) where the shapes
    leave the output's time axis in doubt.

    In doubt: a leaf of another shape than `x` has length `T` on more than
    one axis (`weights (B, heads, T, T)`, whose axis 1 is the heads, `(B, T,
    T)`, or `(B, T, Q)` with `Q == T`), not counting axis 0 (the batch)
    unless `axis` is 0. Judged on the wrong axis, a correct function failed
    (heads == T) or a leak could pass: `out_axis` must then be given. Leaves
    of other ranks with `T` on one axis only (`(y (B, T, D), score (B, T))`)
    leave no doubt.
    One step (`T = 1`) is not refused: a leaf whose default axis has length 1
    holds that step whichever of its length-1 axes is the time axis, and any
    other leaf fails the checks' length test.
    """
    length = x_shape[axis]
    if length == 1:
        return
    reason = None
    for path, leaf in outputs:
        if leaf.shape == tuple(x_shape):
            continue
        candidates = [
            a for a, size in enumerate(leaf.shape) if size == length and (a != 0 or axis == 0)
        ]
        if len(candidates) > 1:
            reason = (
                f"leaf {path} has length T = {length} on axes {', '.join(map(str, candidates))}"
            )
            break
    if reason is None:
        return
    shapes = ", ".join(f"{path} {leaf.shape}" for path, leaf in outputs[:_SHAPES_SHOWN])
    if len(outputs) > _SHAPES_SHOWN:
        shapes += f", ... ({len(outputs) - _SHAPES_SHOWN} more)"
    raise ValueError(
        f"out_axis must be given: the time axis of fn's outputs cannot be taken to be x's "
        f"axis {axis} (x has shape {tuple(x_shape)}) without guessing, as {reason} (output "
        f"leaves: {shapes}); pass out_axis, an int for every leaf or a pytree with one per "
        "part of the output, e.g. out_axis=(1, 2) for fn -> (y (B, T, D), weights (B, "
        "heads, T, T))"
    )


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
      out_axis: the time axis of the output leaves: an int for every leaf, or
        a pytree with an int per part of the output (a prefix of its
        structure), e.g. `out_axis=(1, 2)` for `fn -> (y (B, T, D), weights
        (B, heads, T, T))`: one call checks both. Default (None): `axis`,
        where the output's shapes leave no doubt; a `ValueError` asks for
        `out_axis` where they do: a leaf of
        another shape than `x` with length `T` on two axes (attention weights
        `(B, heads, T, T)`: judged on axis 1, the heads, a correct block
        failed when heads == T), axis 0 (the batch) not counted unless `axis`
        is 0.
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
      ValueError: for outputs whose time axis needs an explicit `out_axis`
        (see `out_axis`), or that do not have `T` steps along it.
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

    if out_axis is None:
        _require_unambiguous_time_axes(baseline, x.shape, axis)
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
    A batch of zero samples is refused: the check would pass having compared nothing.
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
    for name, leaf in named:
        _require_finite(f"x{name}", leaf)
        leaf_axis = _normalize_axis(f"axis for input leaf {name}", axis, leaf.ndim)
        sizes[name] = leaf.shape[leaf_axis]
    if len(set(sizes.values())) != 1:
        raise ValueError(
            f"every leaf of x must have the same batch size along axis {axis}, got {sizes}"
        )
    batch = next(iter(sizes.values()))
    if batch == 0:
        shapes = [leaf.shape for _, leaf in named]
        raise ValueError(
            f"x must hold at least one sample along axis {axis}, got leaf shapes {shapes}: "
            "there would be nothing to check"
        )
    return named, jax.tree_util.tree_structure(x), batch


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
    nan_padding: bool = False,
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
    `atol`). The outputs at padded steps are free in value but must be
    finite for it: their cotangent is 0, and `0 * NaN` is NaN, so NaN/inf
    there (an all-padded row whose masked logits were filled with `-inf`
    has a softmax of 0/0) makes that gradient NaN, as it does for a model
    trained with a masked loss. The check then fails saying so, not as a
    leak; `check_gradients=False` checks the forward values alone.

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
      out_axis: the time axis of the output leaves: an int or a pytree with
        an int per part of the output, e.g. `(1, 2)` for `fn -> (y (B, T, D),
        weights (B, heads, T, T))`. Default (None): `axis`, where the
        output's shapes leave no doubt; otherwise a `ValueError` asks for it,
        as in `assert_causal`.
      select: a function of `fn`'s output picking the parts to check.
      check_gradients: also run the backward check (one `jax.vjp`); it needs
        finite outputs at padded steps too (see above).
      nan_padding: also set the padded inputs to NaN, for a module fed data
        whose padding is NaN: the outputs at real steps must stay as they
        are, so a mask applied by multiplication (`x * valid`, where
        `NaN * 0` is NaN) or a sum over the time axis before masking fails.
        Off by default: a module whose inputs are always finite may mask by
        multiplication.
      atol, rtol: tolerance (finite, >= 0); the backward check uses `atol`.
      seed: seed of the noise and of the cotangents.

    Raises:
      AssertionError: naming the output leaves, the samples and steps whose
        values changed, and the padded steps that the gradient reaches (or,
        NaN there, the NaN/inf outputs at padded steps that make it NaN).
      ValueError: for outputs whose time axis needs an explicit `out_axis`.
    """
    _require_function(fn)
    seed = _seed(seed)
    check_gradients = _flag("check_gradients", check_gradients)
    nan_padding = _flag("nan_padding", nan_padding)
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

    if out_axis is None:
        _require_unambiguous_time_axes(baseline, x.shape, axis)
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
    if nan_padding:
        not_a_number = padded.copy()
        not_a_number[~mask] = np.nan
        changes.append((" (padded inputs set to NaN)", not_a_number))
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
    nonfinite = None
    if check_gradients:
        leaks, nonfinite = _padding_gradient_leaks(
            fn, x, axis, mask, baseline, leaf_axes, atol, seed
        )
        problems += leaks
    if problems:
        header = (
            f"fn's outputs at real steps depend on the padded inputs ({int((~mask).sum())} padded "
            f"of {mask.size} steps along axis {axis}; their values change, or their gradient "
            "reaches those inputs):"
        )
        also = f"\n(besides, {nonfinite})" if nonfinite else ""
        raise AssertionError(_summarize(header, problems) + also)
    if nonfinite:
        raise AssertionError(f"fn's gradient at the padded inputs is NaN: {nonfinite}")


def _padding_gradient_leaks(
    fn: Callable[[Any], PyTree],
    x: np.ndarray,
    axis: int,
    mask: np.ndarray,
    baseline: list[tuple[str, np.ndarray]],
    leaf_axes: Sequence[int],
    atol: float,
    seed: int,
) -> tuple[list[str], str | None]:
    """Where the gradient of the outputs at real steps reaches `x` at padded steps.

    Returns the leaks, and a note (else None) for NaN gradients that non-finite
    outputs at padded steps explain: their cotangent is 0, and `0 * NaN` (the
    softmax of an all-padded row of `-inf` logits) is NaN. That is no leak,
    but the same NaN reaches a model trained with a masked loss, and it hides
    whether the padded inputs leak there; without NaN/inf at the padded
    outputs a NaN gradient counts as a leak.
    """
    outputs, pullback = _vjp(_float_outputs(fn), x)
    if not outputs:
        return [], None
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
    problems, nan_steps = [], []
    for b, t in np.argwhere(~mask):
        with np.errstate(invalid="ignore"):
            nan = np.isnan(values[b, t])
        leak = _gradient_leak(np.where(nan, 0.0, values[b, t]), atol)
        if leak is not None:
            nan_count = f", {int(nan.sum())} NaN" if nan.any() else ""
            problems.append(
                f"gradient of the outputs at real steps w.r.t. x[sample {b}, step {t}] (padded) "
                f"is nonzero ({leak}{nan_count})"
            )
        elif nan.any():
            nan_steps.append((int(b), int(t), int(nan.sum())))
    if not nan_steps:
        return problems, None
    nonfinite = _nonfinite_at_padding(baseline, leaf_axes, mask)
    if not nonfinite:
        problems += [
            f"gradient of the outputs at real steps w.r.t. x[sample {b}, step {t}] (padded) "
            f"is NaN at {count} of {values[b, t].size} elements"
            for b, t, count in nan_steps
        ]
        return problems, None
    b, t, _ = nan_steps[0]
    note = (
        f"the outputs at padded steps contain NaN/inf ({'; '.join(nonfinite)}), so the gradient "
        "through a loss masked to the real steps is NaN (their cotangent 0 times NaN) at "
        f"{len(nan_steps)} padded steps of x, first x[sample {b}, step {t}]: a model trained "
        "with a masked loss gets NaN gradients too, and a leak there cannot be seen. Keep the "
        "padded outputs finite (fill masked logits with a large finite negative number, not "
        "-inf, so that the softmax of an all-padded row is not 0/0), or pass "
        "check_gradients=False to check the forward values only"
    )
    return problems, note


def _nonfinite_at_padding(
    baseline: list[tuple[str, np.ndarray]], leaf_axes: Sequence[int], mask: np.ndarray
) -> list[str]:
    """`path: n NaN, m inf of k elements at padded steps (first at [sample b, step t])` per float
    output leaf that is not finite somewhere at a padded step."""
    positions = np.argwhere(~mask)
    found = []
    for (path, leaf), leaf_axis in zip(baseline, leaf_axes, strict=True):
        if not _is_inexact(leaf):
            continue
        padded = _at_positions(leaf, leaf_axis, ~mask)
        with np.errstate(invalid="ignore"):
            nan, inf = np.isnan(padded), np.isinf(padded)
        bad = (nan | inf).reshape(len(positions), -1).any(axis=1)
        if bad.any():
            b, t = positions[np.argmax(bad)]
            found.append(
                f"output {path}: {int(nan.sum())} NaN, {int(inf.sum())} inf of {padded.size} "
                f"elements at padded steps, first at [sample {b}, step {t}]"
            )
    return found


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
    either pass. A batch of one passes trivially (there is no other sample);
    a batch of zero is refused (`ValueError`). Float inputs must be finite,
    and the tested samples' outputs must not be NaN (NaN equals NaN here, so
    a NaN output would hide any mixing).

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
    times each sample's largest finite `|fn(x)|` over the output's float
    leaves (1 if all are zero), so a wrong order is caught in outputs of
    magnitude 1e-8 too, and beside a sample of magnitude 1e6; an explicit
    `atol` is absolute. `out_axis` and `select` work as in
    `assert_batch_independent` (the output's batch axes; the parts to check).
    A batch of one passes trivially (there is nothing to permute); a batch of
    zero is refused (`ValueError`). Float inputs must be finite and the
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
    output_axes = _check_output_batch(baseline, _leaf_axes(out_axis, output, axis), batch)
    _require_no_nan("fn(x) is NaN (NaN == NaN here, so a wrong order would not show):", baseline)
    sample_atol = None if atol is not None else _per_sample_atol(baseline, output_axes, batch)
    for permutation in _permutations(batch, seed):
        permuted = [_take(leaf, permutation, axis) for leaf in leaves]
        outputs = _named_leaves("fn(x)", fn(jax.tree_util.tree_unflatten(treedef, permuted)))
        problems = []
        for (path, before), (_, after), out in zip(baseline, outputs, output_axes, strict=True):
            expected = _take(before, permutation, out)
            leaf_atol = (
                # atol is a float whenever sample_atol is None (set just above the loop).
                cast(float, atol)
                if sample_atol is None
                else _along(sample_atol[permutation], out, before)
            )
            problem = _mismatch(after, expected, leaf_atol, rtol)
            if problem is not None:
                problems.append(f"output {path}: {problem}")
        if problems:
            header = (
                f"fn(x[perm]) != fn(x)[perm] along axis {axis} for perm {permutation.tolist()}:"
            )
            raise AssertionError(_summarize(header, problems))


def _per_sample_atol(
    baseline: list[tuple[str, np.ndarray]], axes: Sequence[int], batch: int
) -> np.ndarray:
    """`(batch,)`: `_BATCH_ORDER_ATOL` times each sample's largest finite `|fn(x)|` over the
    float leaves (1 for an all-zero sample).

    Per sample: by the whole output's largest value, one sample in units of 1e6
    gave every sample an absolute tolerance of 1, and a wrong order among the
    others went unseen. Over all leaves of a sample, not each leaf alone: a
    leaf that is zero by symmetry holds rounding noise of the sample's scale.
    """
    scale = np.zeros(batch)
    for (_, leaf), axis in zip(baseline, axes, strict=True):
        if not _is_inexact(leaf) or not leaf.size:
            continue
        magnitude = np.abs(_as_float64(leaf))
        magnitude = np.moveaxis(np.where(np.isfinite(magnitude), magnitude, 0.0), axis, 0)
        scale = np.maximum(scale, magnitude.reshape(batch, -1).max(axis=1))
    return _BATCH_ORDER_ATOL * np.where(scale > 0.0, scale, 1.0)


def _along(values: np.ndarray, axis: int, like: np.ndarray) -> np.ndarray:
    """`(batch,)` values shaped to broadcast along `like`'s batch `axis`."""
    shape = [1] * like.ndim
    shape[axis % like.ndim] = values.shape[0]
    return values.reshape(shape)


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
