"""Range observers as pure pytrees, and the qparams formulas they feed.

An observer tracks the `[min, max]` range of the tensors it sees; `qparams()`
turns that range into a scale and zero point with PyTorch's observer formulas:
the range is widened to include 0, then

  symmetric: `scale = max(-min, max) / ((qmax - qmin) / 2)`, `zero_point = 0`;
  affine:    `scale = (max - min) / (qmax - qmin)`,
             `zero_point = clip(qmin - round(min / scale), qmin, qmax)`;

with the scale floored at float32 eps, so a constant or all-zero tensor (or an
observer that has seen nothing) still gives a finite positive scale. Each
division is correctly rounded on every backend (`qat.division`), so a GPU
gives the qparams a CPU and PyTorch give.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import struct

from qat.config import QATConfig, integer_range
from qat.division import divide

if TYPE_CHECKING:
    from typing import Self

Array = Any
EPS = float(jnp.finfo(jnp.float32).eps)
FLOAT32_MAX = float(jnp.finfo(jnp.float32).max)


def compute_qparams(
    min_val: Array, max_val: Array, qmin: int, qmax: int, symmetric: bool
) -> tuple[Array, Array]:
    """Scale (float32) and zero point (int32) of the grid `[qmin, qmax]` for a range.

    `min_val` and `max_val` may be scalars or per-channel arrays; `+inf`/`-inf`
    (nothing observed) behave as 0. Huge ranges do not overflow: the scale is
    capped so that every grid point `(q - zero_point) * scale` is a finite
    float32 (a range reaching float32's largest values, where the formulas'
    end points pass it, loses under a step at that end), so a finite input
    is never fake-quantized to an infinity.
    """
    low = jnp.minimum(jnp.asarray(min_val, jnp.float32), 0.0)
    high = jnp.maximum(jnp.asarray(max_val, jnp.float32), 0.0)
    levels = float(qmax - qmin)
    if symmetric:
        scale = divide(jnp.maximum(-low, high), levels / 2)
        scale = jnp.maximum(scale, EPS)
        return _finite_grid(scale, None, qmin, qmax), jnp.zeros(scale.shape, jnp.int32)
    width = high - low
    # (high - low) overflows past float32 max; the split form does not.
    split = divide(high, levels) - divide(low, levels)
    scale = jnp.where(jnp.isfinite(width), divide(width, levels), split)
    scale = jnp.maximum(scale, EPS)
    zero_point = jnp.clip(qmin - jnp.round(divide(low, scale)), qmin, qmax).astype(jnp.int32)
    return _finite_grid(scale, zero_point, qmin, qmax), zero_point


def _finite_grid(scale: Array, zero_point: Array | None, qmin: int, qmax: int) -> Array:
    """`scale`, lowered where a grid end `(qmin|qmax - zero_point) * scale` would overflow.

    `zero_point` None: symmetric (0), whose cap is a constant. Only ranges near
    float32's largest values reach the cap (it is above `FLOAT32_MAX / (qmax -
    qmin + 1)`): every other scale is returned unchanged, bit for bit on every
    backend. The cap stays a few ulps below the quotient, however the backend
    rounds a division (a GPU's float32 division is approximate), so `extent *
    cap` cannot round up past the max; it is no `qat.division` site, whose
    correct rounding costs compile time, as the cap binds at the largest
    ranges only.
    """
    margin = FLOAT32_MAX * (1.0 - 2.0**-20)
    if zero_point is None:
        return jnp.minimum(scale, jnp.float32(margin / max(-qmin, qmax)))
    offset = zero_point.astype(jnp.float32)  # in [qmin, qmax]
    extent = jnp.maximum(offset - qmin, qmax - offset)
    return jnp.minimum(scale, jnp.float32(margin) / extent)


def batch_range(x: Array, channel_axis: int | None) -> tuple[Array, Array]:
    """`(min, max)` of `x` as float32: scalars, or `(C,)` over every axis but `channel_axis`."""
    x = jax.lax.stop_gradient(jnp.asarray(x)).astype(jnp.float32)
    if channel_axis is None:
        return jnp.min(x), jnp.max(x)
    axis = channel_axis % x.ndim
    axes = tuple(i for i in range(x.ndim) if i != axis)
    return jnp.min(x, axis=axes), jnp.max(x, axis=axes)


def masked_batch_range(
    x: Array, mask: Array, channel_axis: int | None
) -> tuple[Array, Array, Array]:
    """`(min, max, seen)` of the elements of `x` where `mask` holds, as `batch_range`.

    `mask` has `x`'s shape. Where no element is selected (the whole tensor,
    or a channel) the range is the empty one, `(+inf, -inf)`, and `seen` is
    False; a masked-out element (padding, NaN included) never enters it.
    """
    x = jax.lax.stop_gradient(jnp.asarray(x)).astype(jnp.float32)
    low = jnp.where(mask, x, jnp.inf)
    high = jnp.where(mask, x, -jnp.inf)
    if channel_axis is None:
        return jnp.min(low), jnp.max(high), jnp.any(mask)
    axis = channel_axis % x.ndim
    axes = tuple(i for i in range(x.ndim) if i != axis)
    return jnp.min(low, axis=axes), jnp.max(high, axis=axes), jnp.any(mask, axis=axes)


def moving_average_update(
    old: Array, new: Array, num_batches: Array, averaging_constant: float
) -> Array:
    """`new` on the first batch, then `old + c * (new - old)`.

    Where `new - old` overflows float32 (ranges near +-3.4e38 of opposite
    signs) the same average is taken as `(1 - c) * old + c * new`: the
    difference form gave `+-inf`, and a `min_val` of `+inf` reads as
    "nothing observed", silently dropping that side of the range.
    """
    previous = jnp.where(num_batches == 0, new, old)
    difference = new - previous
    return jnp.where(
        jnp.isfinite(difference),
        previous + averaging_constant * difference,
        (1.0 - averaging_constant) * previous + averaging_constant * new,
    )


@struct.dataclass
class QuantizationObserver:
    """A min-max or moving-average min-max range observer; `observe` returns a new one.

    Fields `min_val`/`max_val` are float32 scalars (per tensor) or `(C,)` (per
    channel; shape `()` until the first batch when `create` is not told `C`),
    starting at `+inf`/`-inf`; `num_batches` counts the batches observed.
    """

    min_val: Array
    max_val: Array
    num_batches: Array
    bits: int = struct.field(pytree_node=False)
    symmetric: bool = struct.field(pytree_node=False)
    per_channel: bool = struct.field(pytree_node=False)
    channel_axis: int = struct.field(pytree_node=False)
    kind: str = struct.field(pytree_node=False)
    averaging_constant: float = struct.field(pytree_node=False)

    if TYPE_CHECKING:

        def replace(self, **changes: Any) -> Self: ...

    @classmethod
    def create(cls, cfg: QATConfig, num_channels: int | None = None) -> QuantizationObserver:
        """An observer that has seen nothing, configured by `cfg`.

        `num_channels` fixes the per-channel state shape `(C,)` up front (useful
        when the observer is a `jax.lax.scan` carry); otherwise the first batch sets it.
        """
        if not isinstance(cfg, QATConfig):
            raise TypeError(f"cfg must be a QATConfig, got {type(cfg).__name__}")
        if not cfg.enabled:
            raise ValueError("QATConfig.bits is None (quantization disabled): nothing to observe")
        shape: tuple[int, ...] = ()
        if num_channels is not None:
            if not cfg.per_channel:
                raise ValueError("num_channels is only meaningful with QATConfig.per_channel=True")
            if isinstance(num_channels, bool) or not isinstance(num_channels, numbers.Integral):
                raise TypeError(
                    f"num_channels must be a positive int, got {type(num_channels).__name__} "
                    f"{num_channels!r}"
                )
            if num_channels < 1:
                raise ValueError(f"num_channels must be a positive int, got {num_channels!r}")
            shape = (int(num_channels),)
        return cls(
            min_val=jnp.full(shape, jnp.inf, jnp.float32),
            max_val=jnp.full(shape, -jnp.inf, jnp.float32),
            num_batches=jnp.zeros((), jnp.int32),
            bits=cfg._required_bits(),
            symmetric=cfg.symmetric,
            per_channel=cfg.per_channel,
            channel_axis=cfg.channel_axis,
            kind=cfg.observer,
            averaging_constant=cfg.averaging_constant,
        )

    @property
    def qmin(self) -> int:
        """Lowest integer of the grid."""
        return integer_range(self.bits, self.symmetric)[0]

    @property
    def qmax(self) -> int:
        """Highest integer of the grid."""
        return integer_range(self.bits, self.symmetric)[1]

    @property
    def is_calibrated(self) -> Array:
        """Whether at least one batch has been observed (a boolean array)."""
        return self.num_batches > 0

    def _check_input(self, x: Array, mask: Array | None = None) -> None:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"x must be a floating array, got dtype {x.dtype}")
        if x.size == 0:
            raise ValueError(f"x must hold at least one element, got shape {tuple(x.shape)}")
        if not isinstance(x, jax.core.Tracer) and not isinstance(mask, jax.core.Tracer):
            # Reduced where x lives: one scalar, not the whole array, comes to the host.
            non_finite = ~jnp.isfinite(x.astype(jnp.float32))
            selected = "" if mask is None else " where mask is True"
            if mask is not None:
                non_finite = non_finite & mask
            count = int(jnp.sum(non_finite))
            if count:
                raise ValueError(
                    f"x must be finite{selected}: it holds {count} NaN or inf value(s) of "
                    f"{x.size} there, which would make the observed range and so the scale "
                    "NaN or inf"
                )
        if not self.per_channel:
            return
        if not -x.ndim <= self.channel_axis < x.ndim:
            raise ValueError(
                f"channel_axis {self.channel_axis} is out of range for x of shape {tuple(x.shape)}"
            )
        channels = x.shape[self.channel_axis]
        if self.min_val.ndim == 1 and self.min_val.shape[0] != channels:
            raise ValueError(
                f"x has {channels} channels on axis {self.channel_axis}, the observer has "
                f"{self.min_val.shape[0]}"
            )

    def observe(self, x: Array, mask: Array | None = None) -> QuantizationObserver:
        """The observer after seeing `x` (any finite float array; no gradient flows).

        A concrete `x` holding NaN or inf raises `ValueError` (the range, and
        every later scale, would be NaN or inf); a traced one (inside
        `jax.jit`) is not checked: `qat.calibrate` checks the observers after
        its jitted steps instead.

        `mask`, a boolean array broadcastable to `x`, selects the elements
        observed (True), so that padding never enters the range; only the
        selected elements must be finite. A batch (or, per channel, a
        channel) with no element selected leaves the range as it was, and a
        batch with none at all is not counted in `num_batches`; with a moving
        average, a channel's first selected elements set its range. A channel
        never selected keeps the empty range, whose scale is the eps floor.
        None (the default) observes every element.
        """
        x = jnp.asarray(x)
        if mask is not None:
            return self._observe_masked(x, mask)
        self._check_input(x)
        low, high = batch_range(x, self.channel_axis if self.per_channel else None)
        if self.kind == "moving_average":
            low = moving_average_update(
                self.min_val, low, self.num_batches, self.averaging_constant
            )
            high = moving_average_update(
                self.max_val, high, self.num_batches, self.averaging_constant
            )
        else:
            low = jnp.minimum(self.min_val, low)
            high = jnp.maximum(self.max_val, high)
        return self.replace(min_val=low, max_val=high, num_batches=self.num_batches + 1)

    def _observe_masked(self, x: Array, mask: Array) -> QuantizationObserver:
        """`observe(x, mask)`: the range of the selected elements only."""
        mask = _broadcast_mask(mask, x.shape)
        self._check_input(x, mask)
        low, high, seen = masked_batch_range(
            x, mask, self.channel_axis if self.per_channel else None
        )
        if self.kind == "moving_average":
            constant = self.averaging_constant
            low = _masked_average(self.min_val, low, seen, self.num_batches, constant, jnp.inf)
            high = _masked_average(self.max_val, high, seen, self.num_batches, constant, -jnp.inf)
        else:
            low = jnp.minimum(self.min_val, low)
            high = jnp.maximum(self.max_val, high)
        counted = jnp.any(seen).astype(self.num_batches.dtype)
        return self.replace(min_val=low, max_val=high, num_batches=self.num_batches + counted)

    def qparams(self) -> tuple[Array, Array]:
        """`(scale, zero_point)` for the range seen so far (see the module docstring)."""
        return compute_qparams(self.min_val, self.max_val, self.qmin, self.qmax, self.symmetric)


def _broadcast_mask(mask: Array, shape: tuple[int, ...]) -> Array:
    """`mask` broadcast to `shape`; `TypeError` unless boolean, `ValueError` unless it fits."""
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"mask must be a boolean array, got dtype {mask.dtype}")
    try:
        fits = jnp.broadcast_shapes(mask.shape, shape) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} must broadcast to x's shape {tuple(shape)}"
        )
    return jnp.broadcast_to(mask, shape)


def _masked_average(
    old: Array,
    new: Array,
    seen: Array,
    num_batches: Array,
    averaging_constant: float,
    empty: float,
) -> Array:
    """The moving average where `seen`, `old` elsewhere; a first sighting takes `new`.

    `empty` is the range's value before anything was observed (`+inf` for a
    min, `-inf` for a max): a channel still at it (no batch has selected it
    yet) is set by its first selected elements, as the first batch sets the
    range. A NaN or the other infinity is no empty range and stays as it is.
    """
    averaged = moving_average_update(old, new, num_batches, averaging_constant)
    return jnp.where(seen, jnp.where(old == empty, new, averaged), old)
