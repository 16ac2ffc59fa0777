"""Properties of the fake quantizer, LSQ, the range observers and the QAT dense layer.

Cases: `strategies.fake_quantize_cases` (grids of 2 to 8 bits with every grid
point, every tie and saturating values), observer configs with batch
sequences (degenerate batches included), and small dense-layer inputs.

Properties: the straight-through gradient is the clipped mask times g, up to
4 ulps of rounding (for `fake_quantize` and LSQ, never checked by finite
differences); error at most
half a step inside the range, saturation outside; the output is the nearest
grid point with ties to even (LSQ's too); idempotence; jit ==
eager; the LSQ step-size gradient is Esser et al.'s eq. 3 times `1/sqrt(N·qmax)`
(so it grows as `sqrt(N)`); observers give finite positive qparams on the grid for any batch,
set the range from the first batch, represent every value they have seen,
ignore element and (min-max) batch order; the QAT layer's gradients are
straight through its fake-quantized operands.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np

from properties import checks
from properties import strategies as st_tft
from properties.suite import (
    Property,
    full_float32_matmuls,
    param_key,
    platform_cache,
    random_cotangent,
)
from qat import dot_general, fake_quant, lsq, observers
from qat.config import QATConfig, integer_range
from tft_jax import linear

__all__ = [
    "PROPERTIES",
    "LayerCase",
    "ObserverCase",
    "check_error_bounded",
    "check_first_batch_sets_range",
    "check_idempotent",
    "check_jit_matches_eager",
    "check_lsq_gradient_scale",
    "check_lsq_ste_gradient",
    "check_observed_values_representable",
    "check_observer_jit_matches_eager",
    "check_observer_order_invariant",
    "check_qat_layer_gradients",
    "check_qparams_valid",
    "check_rounds_to_grid",
    "check_ste_gradient",
    "layer_cases",
    "observer_cases",
]

LSQ_TILES = 4


@platform_cache
def _quantizers() -> tuple[Any, Any]:
    """Jitted `fake_quantize` and `lsq_fake_quantize`, grids static (looked up when traced)."""
    fq = jax.jit(
        lambda x, scale, zero_point, qmin, qmax: fake_quant.fake_quantize(
            x, scale, zero_point, qmin, qmax
        ),
        static_argnums=(3, 4),
    )
    learned = jax.jit(
        lambda x, scale, zero_point, qmin, qmax: lsq.lsq_fake_quantize(
            x, scale, zero_point, qmin, qmax
        ),
        static_argnums=(3, 4),
    )
    return fq, learned


def _grid_args(case: st_tft.FakeQuantizeCase) -> tuple[Any, ...]:
    return case.scale, case.zero_point, case.qmin, case.qmax


def check_ste_gradient(case: st_tft.FakeQuantizeCase) -> None:
    """`d fake_quantize / dx` is exactly `1[qmin <= round(x/s) + zp <= qmax]`, bounds included."""
    fq, _ = _quantizers()
    checks.assert_ste_gradient(fq, case.x, *_grid_args(case))


def check_error_bounded(case: st_tft.FakeQuantizeCase) -> None:
    """`|fq(x) - x| <= scale/2` inside the representable range; the nearest end outside it."""
    fq, _ = _quantizers()
    checks.assert_quantization_error_bounded(fq, case.x, *_grid_args(case))


def check_rounds_to_grid(case: st_tft.FakeQuantizeCase) -> None:
    """`fake_quantize` and LSQ return the nearest grid point, ties to even, the ends outside.

    The error bound holds for a quantizer that only clips, or rounds ties
    away from zero; this fails both.
    """
    fq, learned = _quantizers()
    checks.assert_rounds_to_grid(fq, case.x, *_grid_args(case))
    checks.assert_rounds_to_grid(learned, case.x, *_grid_args(case))


@platform_cache
def _value_and_gradient(qmin: int, qmax: int) -> Any:
    """Jitted `(x, scale, zero_point, dy) -> (fake_quantize(x), its pullback of dy)`."""

    def value_and_gradient(x: Any, scale: Any, zero_point: Any, dy: Any) -> tuple[Any, Any]:
        y, pullback = jax.vjp(
            lambda v: fake_quant.fake_quantize(v, scale, zero_point, qmin, qmax), x
        )
        return y, pullback(dy)[0]

    return jax.jit(value_and_gradient)


def _off_ties(case: st_tft.FakeQuantizeCase) -> np.ndarray:
    """`case.x` with the ties `x / s = k + 1/2` (and values within 1e-3 of one) scaled by 0.75.

    XLA may compute `x / s` as `x * (1 / s)`, which rounds a tie either way.
    """
    codes = case.x.astype(np.float64) / np.float64(case.scale)
    return np.where(np.abs(codes - np.floor(codes) - 0.5) < 1e-3, case.x * 0.75, case.x)


def check_jit_matches_eager(case: st_tft.FakeQuantizeCase) -> None:
    """The compiled value and straight-through gradient equal op-by-op execution, exactly.

    Ties `x / s = k + 1/2` are moved off the tie: XLA may compute `x / s` as
    `x * (1 / s)` in either mode, which rounds a tie either way.
    """
    x = _off_ties(case)
    checks.assert_jit_matches_eager(
        _value_and_gradient(case.qmin, case.qmax),
        x,
        case.scale,
        np.float32(case.zero_point),
        random_cotangent(x, 0),
        rtol=0.0,
        atol=0.0,
    )


@platform_cache
def _apply_quantizer() -> Any:
    return jax.jit(lambda quantizer, x: quantizer(x))


def check_idempotent(case: ObserverCase) -> None:
    """A `FakeQuantize` made from an observer, applied twice, equals it applied once, exactly."""
    quantizer = fake_quant.FakeQuantize.from_observer(_observe(case.config, case.batches))
    apply = _apply_quantizer()
    for batch in case.batches:
        checks.assert_idempotent(lambda x: apply(quantizer, x), batch)


def check_lsq_ste_gradient(case: st_tft.FakeQuantizeCase) -> None:
    """LSQ passes the same clipped straight-through gradient to `x` as `fake_quantize`."""
    _, learned = _quantizers()
    checks.assert_ste_gradient(learned, case.x, *_grid_args(case))


@platform_cache
def _lsq_step_gradient(qmin: int, qmax: int) -> Any:
    """Jitted `(x, scale, zero_point, g) -> d sum(g * lsq(x)) / d scale`."""

    def weighted(scale: Any, x: Any, zero_point: Any, upstream: Any) -> Any:
        return jnp.sum(upstream * lsq.lsq_fake_quantize(x, scale, zero_point, qmin, qmax))

    return jax.jit(jax.grad(weighted))


def _lsq_reference_step_gradient(
    x: np.ndarray, upstream: np.ndarray, case: st_tft.FakeQuantizeCase
) -> float:
    """Esser et al. 2020, eq. 3, in PyTorch's rounded-position form, in float64.

    `g · Σ upstream · dy/ds`, `g = 1/sqrt(N·qmax)`; `dy/ds` is
    `round(x/s) - x/s` where `round(x/s) + zp` is on the grid, `qmin - zp`
    below it, `qmax - zp` above it (`x` off the rounding ties).
    """
    ratio = x.astype(np.float64) / np.float64(case.scale)
    rounded = np.round(ratio)
    position = rounded + case.zero_point
    d_step = np.where(
        position < case.qmin,
        case.qmin - case.zero_point,
        np.where(position > case.qmax, case.qmax - case.zero_point, rounded - ratio),
    )
    grad_scale = 1.0 / math.sqrt(x.size * max(case.qmax, 1))
    return float(grad_scale * np.sum(upstream.astype(np.float64) * d_step))


def check_lsq_gradient_scale(case: st_tft.FakeQuantizeCase) -> None:
    """The LSQ step-size gradient is Esser et al.'s, scaled by `1/sqrt(N·qmax)`.

    Against a float64 reference of eq. 3 (section 2.2's scale included), and
    repeating a tensor `k` times multiplies it by `sqrt(k)`: the sum over
    elements grows `k`-fold and the gradient scale shrinks `sqrt(k)`-fold, so
    the step size learns at a rate independent of the tensor size. The
    rounding ties of `x` are moved off (`_off_ties`).
    """
    gradient = _lsq_step_gradient(case.qmin, case.qmax)
    x = _off_ties(case)
    upstream = random_cotangent(x, 1)
    scale = np.float32(case.scale)
    single = float(gradient(scale, x, np.float32(case.zero_point), upstream))
    magnitude = (
        np.abs(upstream).sum() * (case.qmax - case.qmin) / math.sqrt(x.size * max(case.qmax, 1))
    )
    reference = _lsq_reference_step_gradient(x, upstream, case)
    if not abs(single - reference) <= 1e-4 * abs(reference) + 1e-6 * magnitude:
        raise AssertionError(
            f"the LSQ step gradient is {single:.6g}, Esser et al.'s eq. 3 with the gradient "
            f"scale 1/sqrt(N qmax) = 1/sqrt({x.size} x {case.qmax}) gives {reference:.6g} "
            f"(ratio {single / reference if reference else float('nan'):.4g})"
        )
    tiled = float(
        gradient(
            scale,
            np.tile(x, LSQ_TILES),
            np.float32(case.zero_point),
            np.tile(upstream, LSQ_TILES),
        )
    )
    expected = math.sqrt(LSQ_TILES) * single
    if not abs(tiled - expected) <= 1e-4 * abs(expected) + 1e-6 * magnitude:
        raise AssertionError(
            f"the LSQ step gradient of x repeated {LSQ_TILES} times is {tiled:.6g}, expected "
            f"sqrt({LSQ_TILES}) x {single:.6g} = {expected:.6g} (ratio "
            f"{tiled / single if single else float('nan'):.4g}): the gradient scale is not "
            "1/sqrt(N qmax)"
        )


class ObserverCase(NamedTuple):
    """An observer config and a sequence of same-shaped batches."""

    config: QATConfig
    batches: list[np.ndarray]


def observer_cases(
    *,
    shapes: Sequence[tuple[int, ...]] = st_tft.OBSERVER_SHAPES,
    lengths: Sequence[int] = (1, 3),
) -> st.SearchStrategy[ObserverCase]:
    """`ObserverCase`s from `strategies.qat_configs` and `observer_batch_sequences`."""
    batches = st_tft.observer_batch_sequences(shapes=shapes, lengths=lengths)
    return st.builds(ObserverCase, st_tft.qat_configs(), batches)


def _observe(config: QATConfig, batches: list[np.ndarray]) -> Any:
    observer = observers.QuantizationObserver.create(config)
    for batch in batches:
        observer = observer.observe(batch)
    return observer


def _channel_axis(config: QATConfig, ndim: int) -> int | None:
    return config.channel_axis % ndim if config.per_channel else None


def check_qparams_valid(case: ObserverCase) -> None:
    """Any batches (constant, zero, 1e30, 1e-6) give a finite scale > 0, zero point on the grid."""
    observer = _observe(case.config, case.batches)
    scale, zero_point = (np.asarray(a) for a in observer.qparams())
    problems = []
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        problems.append(f"scale {scale} is not finite and positive")
    if not ((zero_point >= observer.qmin) & (zero_point <= observer.qmax)).all():
        problems.append(f"zero point {zero_point} leaves [{observer.qmin}, {observer.qmax}]")
    if case.config.symmetric and (zero_point != 0).any():
        problems.append(f"symmetric zero point {zero_point} is not 0")
    if problems:
        raise AssertionError(f"invalid qparams for {case.config}: " + "; ".join(problems))


def _batch_range(batch: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    if axis is None:
        return batch.min(), batch.max()
    axes = tuple(i for i in range(batch.ndim) if i != axis)
    return batch.min(axis=axes), batch.max(axis=axes)


def check_first_batch_sets_range(case: ObserverCase) -> None:
    """After one batch, both observer kinds hold exactly that batch's min and max."""
    first = case.batches[0]
    observer = _observe(case.config, [first])
    low, high = _batch_range(first, _channel_axis(case.config, first.ndim))
    for name, got, expected in (("min", observer.min_val, low), ("max", observer.max_val, high)):
        if not np.array_equal(np.asarray(got), np.asarray(expected, np.float32)):
            raise AssertionError(
                f"{case.config.observer} observer after its first batch has {name} {got}, "
                f"the batch's {name} is {expected}"
            )


def check_observed_values_representable(case: ObserverCase) -> None:
    """A min-max observer's qparams quantize every value it has seen within half a step."""
    config = dataclasses.replace(case.config, observer="minmax")
    observer = _observe(config, case.batches)
    fq, _ = _quantizers()
    scale, zero_point = observer.qparams()
    for index, batch in enumerate(case.batches):
        axis = _channel_axis(config, batch.ndim)
        step = np.asarray(fake_quant.channel_broadcast(scale, batch.ndim, axis))
        offset = np.asarray(fake_quant.channel_broadcast(zero_point, batch.ndim, axis))
        quantized = np.asarray(fq(batch, step, offset, observer.qmin, observer.qmax), np.float64)
        error = np.abs(quantized - batch.astype(np.float64))
        slack = 4 * np.finfo(np.float32).eps * (np.abs(batch) + step)
        bad = ~(error <= np.asarray(step, np.float64) / 2 + slack)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])  # plain ints, not np.int64(0)
            raise AssertionError(
                f"batch {index} value {batch[where]:.7g} at {list(where)} quantizes to "
                f"{quantized[where]:.7g}, more than half a step "
                f"({float(np.broadcast_to(step, batch.shape)[where]):.3g}) away, after observing "
                f"{len(case.batches)} batches with {config}"
            )


def _permute_elements(batch: np.ndarray, axis: int | None, seed: int) -> np.ndarray:
    """`batch` with its elements shuffled, within each channel along `axis` when given."""
    rng = np.random.default_rng(seed)
    if axis is None:
        return rng.permutation(batch.ravel()).reshape(batch.shape)
    moved = np.moveaxis(batch, axis, 0)
    flat = moved.reshape(moved.shape[0], -1)
    shuffled = np.stack([rng.permutation(row) for row in flat]).reshape(moved.shape)
    return np.moveaxis(shuffled, 0, axis)


def _state(observer: Any) -> dict[str, np.ndarray]:
    return {
        "min": np.asarray(observer.min_val),
        "max": np.asarray(observer.max_val),
        "num_batches": np.asarray(observer.num_batches),
    }


def check_observer_order_invariant(case: ObserverCase) -> None:
    """Shuffling elements within batches never changes an observer; min-max ignores batch order."""
    expected = _state(_observe(case.config, case.batches))
    shuffled = [
        _permute_elements(batch, _channel_axis(case.config, batch.ndim), seed)
        for seed, batch in enumerate(case.batches)
    ]
    problems = []
    for name, value in _state(_observe(case.config, shuffled)).items():
        if not np.array_equal(value, expected[name]):
            problems.append(f"shuffled elements change {name}: {value} != {expected[name]}")
    minmax = dataclasses.replace(case.config, observer="minmax")
    forward = _state(_observe(minmax, case.batches))
    for name, value in _state(_observe(minmax, case.batches[::-1])).items():
        if not np.array_equal(value, forward[name]):
            problems.append(f"reversed batches change min-max {name}: {value} != {forward[name]}")
    if problems:
        raise AssertionError(
            f"observer ({case.config}) depends on order:\n  " + "\n  ".join(problems)
        )


@platform_cache
def _observe_qparams(config: QATConfig) -> Any:
    return jax.jit(lambda batches: _observe(config, batches).qparams())


def check_observer_jit_matches_eager(case: ObserverCase) -> None:
    """Observing the batches and computing qparams compiled equals op-by-op execution.

    To float32 rounding: XLA may turn the scale's division by a constant into
    a multiplication by its reciprocal (one ulp apart); zero points are integers.
    """
    checks.assert_jit_matches_eager(_observe_qparams(case.config), case.batches)


class LayerCase(NamedTuple):
    """A QAT dense layer's bit width and input `x (B, I)`; `seed` drives cotangents."""

    bits: int
    x: np.ndarray
    seed: int


LAYER_INPUT_SHAPE = (3, 5)
LAYER_FEATURES = 4


def layer_cases(bits: Sequence[int] = (8, 4)) -> st.SearchStrategy[LayerCase]:
    """`LayerCase`s: inputs `(3, 5)` of moderate, large, tiny or one-signed values."""
    kinds = ("normal", "large", "tiny", "positive")
    return st.builds(
        LayerCase,
        st.sampled_from(bits),
        st_tft.float_arrays(LAYER_INPUT_SHAPE, kinds=kinds),
        st.integers(0, 2**16),
    )


class _LayerFunctions(NamedTuple):
    params: Any
    calibrate: Any
    pullback: Any


@platform_cache
def _layer_functions(bits: int) -> _LayerFunctions:
    """A `Linear` with `QATDotGeneral`: params, a jitted calibration and a frozen pullback."""

    def layer(calibrate: bool) -> Any:
        factory = functools.partial(
            dot_general.QATDotGeneral, config=QATConfig(bits=bits), calibrate=calibrate
        )
        return linear.Linear(LAYER_FEATURES, dot_general_cls=factory)

    sample = np.zeros(LAYER_INPUT_SHAPE, np.float32)
    variables = jax.jit(layer(False).init)(param_key(), sample)

    @jax.jit
    def calibrate(variables: Any, x: Any) -> Any:
        _, updates = layer(True).apply(variables, x, mutable=[dot_general.QUANT_STATS])
        return updates[dot_general.QUANT_STATS]

    @jax.jit
    def pullback(params: Any, stats: Any, x: Any, dy: Any) -> Any:
        def forward(params: Any, x: Any) -> Any:
            return layer(False).apply({"params": params, dot_general.QUANT_STATS: stats}, x)

        y, vjp = jax.vjp(forward, params, x)
        return y, *vjp(dy)

    return _LayerFunctions(variables, calibrate, pullback)


def _numpy_fake_quantize(x: np.ndarray, scale: Any, zero_point: Any, qmin: int, qmax: int):
    """`(fq(x), inside)` in float64, the codes computed as documented: `x * (1/s)` in float32.

    `qat.fake_quantize` and PyTorch multiply by the float32 reciprocal of the
    scale; float64 `x / s` rounds a near-tie the other way (11.4999995 against
    exactly 11.5 for one drawn input: a code, and the output, one step apart).
    """
    reciprocal = np.float32(1) / np.asarray(scale, np.float32)
    quotient = np.asarray(x, np.float32) * reciprocal
    codes = np.round(quotient.astype(np.float64)) + np.asarray(zero_point, np.float64)
    scale = np.asarray(scale, np.float32).astype(np.float64)
    return (np.clip(codes, qmin, qmax) - zero_point) * scale, (codes >= qmin) & (codes <= qmax)


def check_qat_layer_gradients(case: LayerCase) -> None:
    """Calibrated on `x`, the QAT layer is `fq(x) @ fq(W) + b` with straight-through gradients.

    Reference (float64 NumPy, the documented layout): weights per output
    channel symmetric with scale `max|w| / qmax`; the activation per tensor
    affine with the observer's qparams. Gradients: `dW = fq(x)ᵀ dy`,
    `db = Σ dy`, `dx = mask(x) ⊙ (dy fq(W)ᵀ)`. Matrix products run in full
    float32 (`full_float32_matmuls`).
    """
    functions = _layer_functions(case.bits)
    stats = functions.calibrate(functions.params, case.x)
    params = functions.params["params"]
    dy = random_cotangent(np.zeros((LAYER_INPUT_SHAPE[0], LAYER_FEATURES), np.float32), case.seed)
    with full_float32_matmuls():
        y, param_grads, x_grad = functions.pullback(params, stats, case.x, dy)

    kernel = np.asarray(params["kernel"], np.float64)
    weight_qmin, weight_qmax = integer_range(case.bits, symmetric=True)
    weight_scale = np.maximum(np.abs(kernel).max(0, keepdims=True) / weight_qmax, observers.EPS)
    kernel_q, _ = _numpy_fake_quantize(kernel, weight_scale, 0, weight_qmin, weight_qmax)
    qmin, qmax = integer_range(case.bits, symmetric=False)
    stat = stats["dot_general"]
    scale, zero_point = observers.compute_qparams(stat["min"], stat["max"], qmin, qmax, False)
    x = case.x.astype(np.float64)
    x_q, inside = _numpy_fake_quantize(x, np.float64(scale), np.float64(zero_point), qmin, qmax)
    dy64 = dy.astype(np.float64)
    expected = {
        "y": x_q @ kernel_q + np.asarray(params["bias"], np.float64),
        "kernel gradient": x_q.T @ dy64,
        "bias gradient": dy64.sum(0),
        "input gradient": np.where(inside, dy64 @ kernel_q.T, 0.0),
    }
    actual = {
        "y": y,
        "kernel gradient": param_grads["kernel"],
        "bias gradient": param_grads["bias"],
        "input gradient": x_grad,
    }
    for name, value in expected.items():
        magnitude = np.abs(value).max(initial=0.0)
        np.testing.assert_allclose(
            np.asarray(actual[name], np.float64),
            value,
            rtol=1e-4,
            atol=1e-5 * (1.0 + magnitude),
            err_msg=f"QAT layer {name} differs from the straight-through reference",
        )


PROPERTIES = (
    Property("fake quant: STE", st_tft.fake_quantize_cases(), check_ste_gradient),
    Property("fake quant: error bound", st_tft.fake_quantize_cases(), check_error_bounded),
    Property("fake quant: nearest grid point", st_tft.fake_quantize_cases(), check_rounds_to_grid),
    Property("fake quant: idempotent", observer_cases(), check_idempotent),
    Property("fake quant: jit == eager", st_tft.fake_quantize_cases(), check_jit_matches_eager),
    Property("lsq: STE", st_tft.fake_quantize_cases(), check_lsq_ste_gradient),
    Property("lsq: gradient scale", st_tft.fake_quantize_cases(), check_lsq_gradient_scale),
    Property("observer: valid qparams", observer_cases(), check_qparams_valid),
    Property("observer: first batch", observer_cases(), check_first_batch_sets_range),
    Property("observer: represents data", observer_cases(), check_observed_values_representable),
    Property("observer: order invariant", observer_cases(), check_observer_order_invariant),
    Property("observer: jit == eager", observer_cases(), check_observer_jit_matches_eager),
    Property("qat layer: STE reference", layer_cases(), check_qat_layer_gradients),
)
