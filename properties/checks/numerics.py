"""Checks of the computation: `jit` against op by op, gradients against finite differences."""

from __future__ import annotations

import contextlib
import math
import numbers
import re
from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads

from properties.checks._support import (
    _UNTRACEABLE,
    _as_float64,
    _compare_trees,
    _flag,
    _index,
    _is_inexact,
    _named_leaves,
    _real,
    _require_elements,
    _require_function,
    _require_outputs,
    _short_repr,
    _summarize,
    _tolerance,
)

PyTree = Any


# Finite-difference step that passes reliably in float32 (1e-2 and <= 1e-5 fail often).
FLOAT32_FINITE_DIFFERENCE_EPS = 1e-4
# The default step in float64: truncation error (eps**2 / 6 times the third derivative)
# 1e4 times below float32's step, round-off over it still far below float64's tolerance.
FLOAT64_FINITE_DIFFERENCE_EPS = 1e-6
# With the default step, a mismatch is confirmed at this many times the step before it is
# reported: round-off over the step shrinks 10x there (truncation grows 100x), so a correct
# function whose differences are round-off-bound at the first step (a nearly constant one)
# passes at the second, while a wrong derivative differs at both.
_CONFIRMING_STEP_FACTOR = 10.0


# Default (rtol, atol) for comparing a jitted result with the op-by-op one, by dtype.
_JIT_TOLERANCE = {
    "float64": (1e-10, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (5e-3, 5e-3),
    "bfloat16": (2e-2, 2e-2),
}


def assert_jit_matches_eager(
    fn: Callable[..., PyTree],
    *args: Any,
    rtol: float | None = None,
    atol: float | None = None,
    compute_dtype: Any = None,
    allow_nonfinite: bool = False,
) -> None:
    """Asserts that `jax.jit(fn)(*args)` equals `fn(*args)` run op by op (`jax.disable_jit`).

    Both results must have the same structure, shapes and dtypes. Default
    tolerances follow each leaf's dtype (float32: rtol 1e-5, atol 1e-6;
    bfloat16: 2e-2) since XLA may fuse and reassociate. A function that
    computes in a lower precision than it returns (a Flax module with
    `dtype=jnp.bfloat16, param_dtype=jnp.float32` returns float32 outputs and
    gradients) differs by that precision's rounding, which the outputs'
    dtype cannot show: pass `compute_dtype=jnp.bfloat16` (or `jnp.float16`),
    and every default tolerance is at least that dtype's. The default `atol` is
    relative to the output's magnitude: it is multiplied by the largest finite
    `|value|` of the op-by-op output over all its float leaves (1 if all are
    zero), so outputs of magnitude 1e6 are not failed at their elements near 0
    and outputs of magnitude 1e-8 are compared at their own scale. The scale
    is the whole output's, not each leaf's: a leaf that is zero by symmetry
    (the gradient of an attention key bias) holds rounding noise of the other
    leaves' scale. So a leaf far smaller than the others (probabilities
    beside a sum of 1e6) is compared at their scale: check it on its own, or
    pass an `atol`, to compare it at its own. An explicit
    `atol` is absolute, in `fn`'s units. If `fn` is already a
    `jax.jit` function it is used as the compiled side as is, so a module-level
    jitted function is not traced again. On a GPU or TPU both sides multiply
    float32 matrices at full precision (`jax.default_matmul_precision
    ("highest")`) unless a default matmul precision is set: in TF32 the two
    sides may choose kernels that differ near 1e-3, which is not what this
    check looks for.

    The op-by-op outputs must be finite: NaN matches NaN and inf matches inf
    here, so a function that is NaN everywhere (or wherever jit could
    differ) would pass having compared nothing; as the other checks refuse
    NaN outputs, this one fails on them. Pass `allow_nonfinite=True` where
    NaN/inf outputs are intended (`-inf` at masked logits): the compiled
    side must then be NaN, or the same infinity, at exactly those elements.

    Args:
      fn: the function to compile; called as `fn(*args)`.
      *args: its arguments.
      rtol, atol: tolerances, finite and >= 0 (None: by dtype, as above).
      compute_dtype: the lowest float dtype `fn` computes in, if lower than
        its outputs' (float64, float32, float16 or bfloat16; None: the
        outputs' own). It sets the default tolerances only: an explicit
        `rtol` or `atol` is used as given.
      allow_nonfinite: accept NaN/inf in the op-by-op outputs (matched
        element by element) instead of failing on them.

    Raises:
      AssertionError: naming each differing leaf, its largest difference and
        first differing index; or each leaf of the op-by-op output holding
        NaN/inf (unless `allow_nonfinite`).
    """
    _require_function(fn)
    allow_nonfinite = _flag("allow_nonfinite", allow_nonfinite)
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None:
            _tolerance(name, value)
    default_tolerance = _jit_tolerance(compute_dtype)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    with _full_float32_matmuls_off_cpu():
        compiled, eager = _jitted_and_eager(fn, jitted, args)
    chex.assert_trees_all_equal_shapes_and_dtypes(compiled, eager)
    if not allow_nonfinite:
        _require_finite_outputs(eager)
    problems = _compare_trees(compiled, eager, atol, rtol, default_tolerance)
    if problems:
        defaults = compute_dtype is None and (rtol is None or atol is None)
        hint = _compute_dtype_hint(eager) if defaults else ""
        raise AssertionError(_summarize("jit(fn) differs from fn run op by op:", problems) + hint)


def _require_finite_outputs(eager: PyTree) -> None:
    """Fails on NaN/inf in the op-by-op outputs: there, any compiled NaN or equal inf matches."""
    problems = []
    for path, leaf in _named_leaves("fn(*args)", eager):
        if not _is_inexact(leaf):
            continue
        with np.errstate(invalid="ignore"):
            nan, inf = np.isnan(leaf), np.isinf(leaf)
        if nan.any() or inf.any():
            where = (
                "the scalar" if leaf.ndim == 0 else f"first at {_index(np.argwhere(nan | inf)[0])}"
            )
            problems.append(
                f"{path}: {int(nan.sum())} NaN, {int(inf.sum())} inf of {leaf.size} elements "
                f"({where})"
            )
    if problems:
        header = (
            "fn(*args) run op by op is not finite (NaN matches NaN and inf matches inf here, so "
            "jit(fn) could differ there unseen; pass allow_nonfinite=True if these are intended, "
            "e.g. -inf at masked logits):"
        )
        raise AssertionError(_summarize(header, problems))


def _jit_tolerance(compute_dtype: Any) -> dict[str, tuple[float, float]]:
    """`_JIT_TOLERANCE` with every entry at least as loose as `compute_dtype`'s."""
    if compute_dtype is None:
        return _JIT_TOLERANCE
    try:
        name = np.dtype(compute_dtype).name
    except TypeError:
        name = None
    if name not in _JIT_TOLERANCE:
        raise ValueError(
            f"compute_dtype must be one of {', '.join(_JIT_TOLERANCE)} (or None), "
            f"got {compute_dtype!r}"
        )
    floor_rtol, floor_atol = _JIT_TOLERANCE[name]
    return {
        dtype: (max(rtol, floor_rtol), max(atol, floor_atol))
        for dtype, (rtol, atol) in _JIT_TOLERANCE.items()
    }


def _compute_dtype_hint(eager: PyTree) -> str:
    """The "fn may compute in bfloat16 inside" hint, for outputs in float32 or float64."""
    wide = sorted(
        {
            leaf.dtype.name
            for leaf in jax.tree_util.tree_leaves(eager)
            if getattr(leaf, "dtype", None) is not None
            and leaf.dtype.name in ("float32", "float64")
        }
    )
    if not wide:
        return ""
    bf16_rtol, bf16_atol = _JIT_TOLERANCE["bfloat16"]
    f16_rtol, f16_atol = _JIT_TOLERANCE["float16"]
    return (
        f"\n(the default tolerances follow the outputs' dtype, {', '.join(wide)}: if fn computes "
        "in a lower precision than it returns, e.g. a Flax module with dtype=jnp.bfloat16 and "
        "param_dtype=jnp.float32, pass compute_dtype=jnp.bfloat16 (rtol "
        f"{bf16_rtol:g}, atol {bf16_atol:g} times the output's scale; float16: {f16_rtol:g}, "
        f"{f16_atol:g}), or rtol and atol for that precision)"
    )


def _full_float32_matmuls_off_cpu() -> contextlib.AbstractContextManager[Any]:
    """Full-precision float32 products on a GPU/TPU, unless the user chose a precision.

    Such backends multiply float32 matrices in TF32 or bfloat16 passes by
    default (relative errors near 1e-3), and the compiled and op-by-op sides
    may pick different kernels for one product: a correct `fn` would differ
    by far more than the float32 tolerance. CPUs compute float32 in full.
    """
    chosen = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]  # a flag jax adds at runtime
    if jax.default_backend() == "cpu" or chosen is not None:
        return contextlib.nullcontext()
    return jax.default_matmul_precision("highest")


def _jitted_and_eager(
    fn: Callable[..., PyTree], jitted: Callable[..., PyTree], args: tuple[Any, ...]
) -> tuple[PyTree, PyTree]:
    """`jitted(*args)` and `fn(*args)` op by op, with a clear `TypeError` if jit cannot trace fn."""
    try:
        compiled = jitted(*args)
    except jax.errors.TracerArrayConversionError as error:
        raise TypeError(
            "jax.jit(fn) cannot trace fn: it converts a traced array to NumPy (np.asarray or "
            "another np.* function); compute with jax.numpy and return jax arrays"
        ) from error
    except _UNTRACEABLE as error:
        raise TypeError(
            f"jax.jit(fn) cannot trace fn ({type(error).__name__}): an argument fn uses as a "
            "Python value (a flag such as `deterministic`, a size) is traced under jit; close "
            "over it (functools.partial(fn, deterministic=True)) or pass a function jitted "
            "with static_argnums"
        ) from error
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
    return compiled, eager


def _enable_x64() -> contextlib.AbstractContextManager[Any]:
    """The 64-bit context manager (`jax.enable_x64` in JAX >= 0.7, else `jax.experimental`)."""
    if callable(getattr(jax, "enable_x64", None)):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # type: ignore[attr-defined]  # JAX < 0.7 only

    return enable_x64()


def _to_float64(leaf: Any) -> Any:
    array = np.asarray(leaf)
    if jnp.issubdtype(array.dtype, jnp.complexfloating):
        return array.astype(np.complex128)
    if jnp.issubdtype(array.dtype, jnp.floating):
        return array.astype(np.float64)
    return leaf


_RELATIVE_ERROR = re.compile(r"Max relative difference[^:]*:\s*([-+0-9.eE]+|inf|nan)")


def _float32_hint(
    report: str, fn: Callable[..., PyTree], args: tuple[Any, ...], step: float
) -> str:
    """The "fn computes in float32" hint, where the evidence points to it, else "".

    It applies when `fn` returns a lower precision than float64 for float64
    inputs, or when the reported relative error is the size that float32
    round-off divided by the finite-difference step gives (1e-5 to 1e-2 at
    a step of 1e-4, 100 times more at 1e-6, but never above 0.1), not when
    the derivative is plainly wrong: past 0.1 the two cannot be told apart,
    and a wrong derivative is the likelier.
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
    # Round-off over the step grows as the step shrinks: the range is 1e-5 to 1e-2 at 1e-4;
    # past 0.1 a derivative is plainly wrong (20% off read as a cast at 1e-6 otherwise).
    ratio = FLOAT32_FINITE_DIFFERENCE_EPS / step
    low, high = 1e-5 * ratio, min(1e-2 * ratio, 0.1)
    if errors and all(low <= error <= high for error in errors):
        return (
            f"\n(a relative error of {max(errors):.3g} in float64 means fn casts to float32 "
            "inside, e.g. a hard-coded dtype: float32 round-off divided by eps; or fn is "
            "sharply curved at this point, e.g. a LayerNorm of a vector near 0: the error of "
            "central differences shrinks 100x for each 10x smaller eps)"
        )
    return ""


def _require_float_outputs(fn: Callable[..., PyTree], point: tuple[Any, ...]) -> list[Any]:
    """Raises `TypeError` naming an output leaf that is not a float (it has no derivative).

    `check_grads` failed on one with a bare `AssertionError`, which read as
    wrong derivatives of a correct function. Returns the output leaves'
    `ShapeDtypeStruct`s.
    """
    shapes = jax.eval_shape(fn, *point)
    flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
    for path, leaf in flat:
        if not jnp.issubdtype(leaf.dtype, jnp.inexact):
            raise TypeError(
                f"fn's output {jax.tree_util.keystr(path) or '<root>'} has dtype {leaf.dtype}, "
                "which has no derivative: return only the float outputs (e.g. "
                "lambda *a: fn(*a)[0])"
            )
    if not any(math.prod(leaf.shape) for _, leaf in flat):
        raise ValueError(
            f"fn must return at least one non-empty array, got leaf shapes "
            f"{[leaf.shape for _, leaf in flat]}: there would be nothing to check"
        )
    return [leaf for _, leaf in flat]


def _default_step(point: tuple[Any, ...], outputs: Sequence[Any]) -> float:
    """`FLOAT64_FINITE_DIFFERENCE_EPS` if `fn` takes and returns only 64-bit floats, else float32's.

    The step suits the precision the differences are taken in: float64's
    (1e-6) would measure float32 round-off (1e-7 over 1e-6) of a function
    that takes or returns float32, and float32's (1e-4) leaves a truncation
    error above float64's tolerance on a sharply curved function.
    """
    dtypes = [jnp.result_type(leaf) for leaf in jax.tree_util.tree_leaves(point)]
    dtypes += [leaf.dtype for leaf in outputs]
    wide = all(
        jnp.finfo(dtype).bits >= 64 for dtype in dtypes if jnp.issubdtype(dtype, jnp.inexact)
    )
    return FLOAT64_FINITE_DIFFERENCE_EPS if wide else FLOAT32_FINITE_DIFFERENCE_EPS


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
    (`FLOAT64_FINITE_DIFFERENCE_EPS` = 1e-6) and tolerance (1e-5) are sound:
    central differences err by `eps**2 / 6` times the third derivative
    (relative to the first), which at a step of 1e-4 failed correct, sharply
    curved functions (a third derivative 1e4 times the first: `sin(100 x)`,
    a LayerNorm of a vector near 0), and by float64 round-off over the step,
    which stays far below the tolerance at 1e-6. Pass parameters through `args`:
    closed-over float32 arrays stay float32 and the check then works at
    float32 precision (`check_grads` picks its tolerance from the output dtype).

    The default step follows the dtypes the differences are taken in: 1e-6
    when every float argument (after the cast) and every output of `fn` is
    a 64-bit float, else `FLOAT32_FINITE_DIFFERENCE_EPS` = 1e-4 (a function
    that returns float32 for float64 inputs computes at float32 precision,
    where a step of 1e-6 would measure its round-off).

    With the default step, a mismatch is reported only if it persists at 10
    times the step (1e-5 in float64), and the report gives both. Round-off
    over the step is relative to the function's value, not to its change: a
    nearly constant function (a block ending in a LayerNorm, squared and
    summed) can differ from its correct derivatives at the first step by
    about the tolerance, and more at order 2, where the differenced function
    is its gradient computed by cancellation. At 10 times the step round-off
    is 10x smaller and truncation 100x larger, while a wrong derivative
    differs at both steps; a float32 cast inside, whose round-off is far
    larger, is still caught at both. A yet flatter function can fail at
    both: pass a larger `eps`. An explicit `eps` is used alone, as given.

    Float32 fallback (`use_x64=False`): `eps` defaults to
    `FLOAT32_FINITE_DIFFERENCE_EPS` = 1e-4 for float32 arguments, which
    passes reliably on small functions; 1e-2 (truncation error) and 1e-5 or
    below (cancellation) fail often. On a whole block float32 round-off can
    still exceed the default float32 tolerance (2e-3): prefer float64, or
    pass `rtol`/`atol`. The
    fallback refuses float arguments narrower than float32 (bfloat16,
    float16) with a `ValueError`: it differentiates in the arguments' own
    dtypes, where `x + eps` rounds back to `x` (bfloat16 resolves 0.0078
    near 1), so a correct function would fail on differences of rounding.
    It does not cast them for you, which would check another function than
    the one given: keep `use_x64=True` (the arguments become float64), or
    cast them to float32 yourself.
    64-bit mode is `jax.enable_x64(True)` (JAX >= 0.7; older JAX:
    `jax.experimental.enable_x64()`).

    Functions built on `jax.custom_vjp` (a straight-through estimator) have no
    forward mode: pass `modes=("rev",)`. An STE gradient is a surrogate, not
    the derivative, so check it with `assert_ste_gradient`, never here.

    Args:
      fn: a function of `*args` returning an array or pytree.
      args: the point at which to differentiate: a non-empty sequence of
        arguments (`(x,)`, not `x`), every leaf a float array, not all of
        them empty.
      order: derivative order (1 or more).
      modes: any of `"fwd"`, `"rev"`.
      eps: finite-difference step, finite and > 0 (None: 1e-6 in float64,
        else 1e-4, confirmed at 10 times it, as above).
      atol, rtol: tolerances, finite and >= 0 (None: by dtype, `check_grads`' defaults).
        With `atol=None` each output leaf whose derivatives are below 1 is
        first divided by a power of two near their size, so that the
        default absolute tolerance (1e-5 in float64) does not pass any
        gradient of a function whose derivatives are that small; an explicit
        `atol` is in `fn`'s units and nothing is divided.
      use_x64: run in float64.
      jit: wrap `fn` in `jax.jit` (unless it already is one), so that each of
        `check_grads`' evaluations compiles once instead of primitive by
        primitive (several times faster for a Flax block on a CPU).

    Raises:
      AssertionError: with `check_grads`' report of the differing derivative.
      ValueError: if `args` or `fn`'s output holds no element (nothing to check),
        or, with `use_x64=False`, a float argument is narrower than float32.
      TypeError: for arguments that are not float arrays, or a
        `jax.custom_vjp` function checked in forward mode (pass `modes=("rev",)`).
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
    named = _named_leaves("args", args)
    if not named:
        raise ValueError(
            f"args must hold at least one float array to differentiate fn at, got "
            f"{_short_repr(args)}: there would be nothing to check"
        )
    _require_elements("args", named)
    for path, leaf in named:
        if not _is_inexact(leaf):
            raise TypeError(
                f"args{path} has dtype {leaf.dtype}: every argument is differentiated, so pass "
                "only float arrays (close over integer arguments with functools.partial)"
            )
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None:
            _tolerance(name, value)
    explicit = None if eps is None else _real("eps", eps)
    if explicit is not None and not (math.isfinite(explicit) and explicit > 0):
        raise ValueError(f"eps must be finite and > 0, got {explicit}")
    if not use_x64:
        # Narrower than float32 never gets the float64 step: the message shows float32's.
        _require_float32_or_wider(named, explicit or FLOAT32_FINITE_DIFFERENCE_EPS)
    precision = "float64" if use_x64 else "the given dtypes"
    context = _enable_x64() if use_x64 else contextlib.nullcontext()
    try:
        with context:
            point = jax.tree_util.tree_map(_to_float64, args) if use_x64 else args
            checked = jax.jit(fn) if jit and not hasattr(fn, "lower") else fn
            outputs = _require_float_outputs(checked, point)
            step = explicit if explicit is not None else _default_step(point, outputs)
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
                confirmed = ""
                if explicit is None:  # an explicit eps is used as given, alone
                    wider = step * _CONFIRMING_STEP_FACTOR
                    try:
                        check_grads(
                            compared, point, order, modes=modes, eps=wider, atol=atol, rtol=rtol
                        )
                    except AssertionError as again:
                        confirmed = (
                            f"\n(and at {_CONFIRMING_STEP_FACTOR:g} times the step, eps "
                            f"{wider:g}, where round-off over the step is "
                            f"{_CONFIRMING_STEP_FACTOR:g}x smaller: a wrong derivative differs "
                            f"at both steps, the error of finite differences changes with the "
                            f"step):\n{again}"
                        )
                    else:
                        return  # round-off over the first step, not a wrong derivative
                hint = _float32_hint(str(error), checked, point, step) if use_x64 else ""
                raise AssertionError(
                    f"derivatives of fn differ from central finite differences "
                    f"(order {order}, modes {modes}, eps {step:g}, in {precision}):\n{error}"
                    f"{confirmed}{hint}{scaled}"
                ) from error
    except TypeError as error:
        text = str(error)
        if "fwd" in modes and "forward-mode autodiff" in text and "custom_vjp" in text:
            raise TypeError(
                f"{text}\n(fn is built on jax.custom_vjp, which has no forward mode, and modes "
                f"is {modes}: pass modes=('rev',). A custom_vjp that defines a surrogate "
                "gradient, such as a straight-through estimator, is not the derivative: check "
                "it with assert_ste_gradient instead)"
            ) from error
        if not (use_x64 and "float32" in text and "float64" in text):
            raise
        raise TypeError(
            f"{text}\n(the check casts fn's float arguments to float64, and fn made float32 "
            "values of its own that met them: an RNN carry created in the cell's "
            "param_dtype, a hard-coded dtype; build the module with "
            "param_dtype=jnp.float64, or pass use_x64=False with rtol and atol)"
        ) from error


def _require_float32_or_wider(named: list[tuple[str, np.ndarray]], step: float) -> None:
    """Refuses float arguments narrower than float32 for finite differences in their own dtype."""
    for path, leaf in named:
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            continue
        info = jnp.finfo(leaf.dtype)
        if info.bits < 32:
            raise ValueError(
                f"args{path} has dtype {leaf.dtype}: with use_x64=False the finite differences "
                f"run in the arguments' own dtypes, and {leaf.dtype} cannot resolve a step of "
                f"eps={step:g} (its resolution near 1 is {float(info.eps):g}: x + eps rounds "
                "back to x), so a correct function would fail; keep use_x64=True (the "
                "default: the arguments are cast to float64), or cast them to float32"
            )


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
