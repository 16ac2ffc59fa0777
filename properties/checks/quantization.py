"""Checks of a fake quantizer: its straight-through gradient, error bound, grid and idempotence."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from properties.checks._support import (
    _UNTRACEABLE,
    _as_float64,
    _compare_trees,
    _float_array,
    _index,
    _is_inexact,
    _named_leaves,
    _require_function,
    _require_no_nan,
    _require_outputs,
    _seed,
    _summarize,
    _to_numpy,
    _tolerance,
)

PyTree = Any

_QUANTIZE_CALL = "a function called as quantize_fn(x, scale, zero_point, qmin, qmax)"

# Rounding the STE's gradient may carry, in ulps of its dtype: an STE applied in code
# space computes (g / s) * s, which can be an ulp or two off g.
_STE_ULPS = 4


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


def _fail_at(
    wrong: np.ndarray, header: str, describe: Callable[[tuple[int, ...]], str]
) -> NoReturn:
    """Raises `AssertionError`: `header`, then `describe(index)` of the first wrong elements."""
    raise AssertionError(_summarize(header, [describe(i) for i in map(tuple, np.argwhere(wrong))]))


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


_TIES: dict[str, Callable[[np.ndarray], np.ndarray]] = {"even": np.round, "away": _round_half_away}


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
    """Asserts that the gradient of `quantize_fn` w.r.t. `x` is the clipped-STE mask times `g`.

    The surrogate (PyTorch's `fake_quantize_per_tensor_affine`) passes the
    upstream gradient `g` where the rounded code lies in the grid, inclusive
    at both ends, and zero elsewhere::

        dL/dx = g * (qmin <= round(x / scale) + zero_point <= qmax)

    The check pulls back a random nonzero `g` (`|g|` in [0.5, 1.5]) and
    demands this up to 4 ulps of rounding: `|dL/dx - mask * g| <= 4 * eps *
    |g|`, with `eps` the machine epsilon of the gradient's dtype. A
    quantizer that applies the STE in code space (`q = x / s`, the STE on
    `q`, then `* s`) computes `(g / s) * s`, which may be an ulp off `g`. A
    half gradient at a bound (`jnp.clip`'s), a gradient blocked at a
    saturated bound (`>` for `>=`) or a missing mask are off by at least
    half of `g`, and fail. Include grid bounds and ties in `x`
    (`strategies.fake_quantize_cases` does).

    One ambiguity is allowed: XLA computes `x / s` for a scalar `s` as
    `x * (1 / s)`, which can round a tie `x / s = qmax + 0.5` to the other
    side of the grid's edge than IEEE division does. For a float16 or
    bfloat16 `x` the codes are computed in float32 with the scale as given
    (as `qat.fake_quantize` does), and a quantizer computing in `x`'s own
    dtype is allowed too. Where these roundings disagree on the mask, the
    gradient may be `g` or `0` (still one of them, up to the same 4 ulps);
    everywhere else it must be the mask's.

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
    _require_function(quantize_fn, "quantize_fn", _QUANTIZE_CALL)
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
    try:
        output, pullback = jax.vjp(lambda v: quantize_fn(v, scale, zero_point, qmin, qmax), x)
    except _UNTRACEABLE as error:
        raise TypeError(
            "quantize_fn cannot be differentiated with jax.vjp for the STE check (it turns a "
            f"traced array into a concrete value: {type(error).__name__}): return jax arrays "
            "from quantize_fn, computed with jax.numpy"
        ) from error
    if output.shape != x.shape:
        raise AssertionError(f"quantize_fn changed the shape: {x.shape} -> {output.shape}")
    rng = np.random.default_rng(seed)
    # Representable in both `x`'s and the output's dtype: a quantizer computing in
    # float32 for a float16 `x` returns float32, and its gradient, cast back to
    # float16, is then `g` itself, with no rounding of the cast.
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
    slack = _STE_ULPS * float(np.finfo(gradient.dtype).eps) * np.abs(_as_float64(upstream))
    got = _as_float64(gradient)

    def near(target: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.abs(got - _as_float64(target)) <= slack

    wrong = ~(near(expected) | (ambiguous & (near(upstream) | near(np.zeros_like(upstream)))))
    if not wrong.any():
        return
    at_bound = (codes == qmin) | (codes == qmax)
    regions = {
        "inside the grid": wrong & mask & ~at_bound,
        "at qmin or qmax": wrong & at_bound,
        "outside the grid": wrong & ~mask,
    }
    counts = ", ".join(f"{int(region.sum())} {label}" for label, region in regions.items())
    ratio = got / _as_float64(upstream)
    # Enough digits to tell the gradient's dtype's neighbours apart (9 for float32).
    digits = min(np.finfo(gradient.dtype).precision + 3, 17)
    _fail_at(
        wrong,
        f"gradient of quantize_fn is not the clipped STE mask on [{qmin}, {qmax}] at "
        f"{int(wrong.sum())} of {x.size} elements ({counts}), beyond {_STE_ULPS} ulps of "
        f"{gradient.dtype}:",
        lambda index: (
            f"x{_index(index)} = {float(x[index]):.{digits}g}: code {codes[index]:g}, "
            f"gradient / g = {ratio[index]:.{digits}g}, expected {int(mask[index])}"
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
    _require_function(quantize_fn, "quantize_fn", _QUANTIZE_CALL)
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
    _require_function(quantize_fn, "quantize_fn", _QUANTIZE_CALL)
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
