"""`QATConfig`: how tensors are quantized, validated once on construction."""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from typing import TYPE_CHECKING, Any, Literal

from tft_jax.caller_frame import user_stacklevel

if TYPE_CHECKING:
    import numpy as np

ObserverKind = Literal["minmax", "moving_average"]
_OBSERVERS = ("minmax", "moving_average")
# Where the LSQ gradient decides clipped or not: the rounded position
# `round(x/s) + zp` (PyTorch's variant) or the unrounded `x/s + zp` (eq. 3).
ClipFrom = Literal["rounded", "unrounded"]
CLIP_FROM = ("rounded", "unrounded")
MIN_BITS = 2
MAX_BITS = 8


def _require_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"QATConfig.{name} must be a bool, got {type(value).__name__} {value!r}")


def _require_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"QATConfig.{name} must be an int, got {type(value).__name__} {value!r}")


def check_clip_from(value: Any, name: str = "clip_from") -> None:
    """Raises unless `value` is one of `CLIP_FROM` (`TypeError` for a non-string)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {CLIP_FROM}, got {type(value).__name__} {value!r}")
    if value not in CLIP_FROM:
        raise ValueError(f"{name} must be one of {CLIP_FROM}, got {value!r}")


def integer_range(bits: int, symmetric: bool) -> tuple[int, int]:
    """The integer grid `[qmin, qmax]` of a `bits`-bit quantizer.

    Symmetric quantizers use the signed range `[-2^(b-1), 2^(b-1) - 1]` (zero
    point 0); affine ones the unsigned range `[0, 2^b - 1]`.
    """
    if symmetric:
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


@dataclasses.dataclass(frozen=True)
class QATConfig:
    """Quantization settings of an observer, a fake quantizer or the QAT model.

    Attributes:
      bits: integer width in 2..8, or None to disable quantization entirely
        (the QAT model then computes exactly what the FP32 model computes).
        A NumPy integer is stored as a Python int, here and in
        `calibration_batches`.
      symmetric: signed range with zero point 0 (True) or unsigned affine range
        with a learned-from-data zero point (False).
      per_channel: one scale per slice along `channel_axis` instead of one per tensor.
      channel_axis: the channel axis for `per_channel` (any axis, negative allowed).
      observer: `'minmax'` (running min and max over every batch seen) or
        `'moving_average'` (first batch sets the range, then
        `m += averaging_constant * (batch_m - m)`).
      averaging_constant: the moving-average constant, in (0, 1].
      calibration_batches: how many batches `qat.calibrate` feeds the observers.
      learnable_scale: make the activation step size trainable with the LSQ
        gradient (Esser et al. 2020), by default in PyTorch's variant
        (`_fake_quantize_learnable_per_tensor_affine`), which decides clipped
        or not from the rounded position `round(x/s) + zp`, as the
        straight-through mask of the fake quantizer does, not from `x/s` as
        eq. 3: within half a step outside the grid the step size gets
        `round(x/s) - x/s` rather than the clipped value (`qat.lsq`;
        `lsq_clip_from='unrounded'` follows eq. 3). It is
        scaled by `1 / sqrt(N * qmax)` with `N` the elements of the
        activation one call sees (the whole tensor, PyTorch's `numel`):
        under `jax.vmap` or `nn.vmap` over the batch that is one example's,
        and the step size learns `sqrt(B)` times faster than applied to the
        batch at once.
      lsq_clip_from: with `learnable_scale`, where the LSQ gradient decides
        that an activation is clipped: `'rounded'` (the default, PyTorch's
        variant above) or `'unrounded'`, Esser et al.'s eq. 3, which decides
        from `x/s + zp` (clipped where `<= qmin` or `>= qmax`). The forward
        is the same; only the gradients within half a step outside the grid
        (and at its exact ends) differ (`qat.lsq`). Without
        `learnable_scale` there is no LSQ gradient, and `'unrounded'` is refused.

    In `QATTemporalFusionTransformer` the layout is fixed to the standard QAT
    recipe: weights per-channel symmetric, activations per-tensor affine with a
    moving-average observer; `symmetric`, `per_channel`, `channel_axis` and
    `observer` configure stand-alone observers and fake quantizers.
    """

    bits: int | np.integer | None = 8
    symmetric: bool = True
    per_channel: bool = False
    channel_axis: int = -1
    observer: ObserverKind = "minmax"
    averaging_constant: float = 0.01
    calibration_batches: int | np.integer = 100
    learnable_scale: bool = False
    lsq_clip_from: ClipFrom = "rounded"

    def __post_init__(self) -> None:
        if self.bits is not None:
            _require_int("bits", self.bits)
            if not MIN_BITS <= self.bits <= MAX_BITS:
                raise ValueError(
                    f"QATConfig.bits must be in {MIN_BITS}..{MAX_BITS} or None, got {self.bits}"
                )
            object.__setattr__(self, "bits", int(self.bits))
        _require_bool("symmetric", self.symmetric)
        _require_bool("per_channel", self.per_channel)
        _require_int("channel_axis", self.channel_axis)
        object.__setattr__(self, "channel_axis", int(self.channel_axis))
        if self.observer not in _OBSERVERS:
            raise ValueError(
                f"QATConfig.observer must be one of {_OBSERVERS}, got {self.observer!r}"
            )
        constant = self.averaging_constant
        if isinstance(constant, bool) or not isinstance(constant, numbers.Real):
            raise TypeError(f"QATConfig.averaging_constant must be a float, got {constant!r}")
        if not 0.0 < float(constant) <= 1.0:
            raise ValueError(f"QATConfig.averaging_constant must be in (0, 1], got {constant}")
        object.__setattr__(self, "averaging_constant", float(constant))
        _require_int("calibration_batches", self.calibration_batches)
        if self.calibration_batches < 1:
            raise ValueError(
                f"QATConfig.calibration_batches must be >= 1, got {self.calibration_batches}"
            )
        object.__setattr__(self, "calibration_batches", int(self.calibration_batches))
        _require_bool("learnable_scale", self.learnable_scale)
        check_clip_from(self.lsq_clip_from, "QATConfig.lsq_clip_from")
        if self.lsq_clip_from != "rounded" and not self.learnable_scale:
            raise ValueError(
                f"QATConfig.lsq_clip_from={self.lsq_clip_from!r} chooses the LSQ gradient of a "
                "learned step size, but learnable_scale=False learns none: set "
                "learnable_scale=True, or leave lsq_clip_from at 'rounded'"
            )

    @property
    def enabled(self) -> bool:
        """Whether quantization is on (`bits` is not None)."""
        return self.bits is not None

    @property
    def qmin(self) -> int:
        """Lowest integer of the grid."""
        return integer_range(self._required_bits(), self.symmetric)[0]

    @property
    def qmax(self) -> int:
        """Highest integer of the grid."""
        return integer_range(self._required_bits(), self.symmetric)[1]

    def _required_bits(self) -> int:
        if self.bits is None:
            raise ValueError("QATConfig.bits is None (quantization disabled): there is no grid")
        return int(self.bits)  # already an int (`__post_init__`); typed for the checker


# The QATConfig fields that configure stand-alone observers and fake quantizers;
# the QAT models and the `dot_general_cls` hooks quantize with their own fixed layout.
FIXED_LAYOUT_FIELDS = ("symmetric", "per_channel", "channel_axis", "observer")
# The (owner, ignored fields) announced so far: once per process, not at every
# clone Flax makes of a module or every trace that builds a hook.
_ANNOUNCED_LAYOUTS: set[tuple[str, tuple[str, ...]]] = set()


def check_fixed_layout_config(config: Any, owner: str, argument: str = "qat_config") -> None:
    """Raises `TypeError` unless `config` is a `QATConfig`; warns once if it sets a layout field.

    For the quantizers with the fixed QAT layout (`QATModel`,
    `QATTemporalFusionTransformer`, `qat_dot_general`, `int8_dot_general`):
    a `FIXED_LAYOUT_FIELDS` value away from its default would otherwise be
    ignored without a word. `owner` names the quantizer, `argument` the
    parameter `config` was given as.
    """
    if not isinstance(config, QATConfig):
        raise TypeError(f"{owner}: {argument} must be a QATConfig, got {type(config).__name__}")
    default = QATConfig()
    ignored = tuple(
        f"{name}={getattr(config, name)!r}"
        for name in FIXED_LAYOUT_FIELDS
        if getattr(config, name) != getattr(default, name)
    )
    if ignored and (owner, ignored) not in _ANNOUNCED_LAYOUTS:
        _ANNOUNCED_LAYOUTS.add((owner, ignored))
        warnings.warn(
            f"{owner} quantizes with a fixed layout (weights per-channel symmetric, "
            "activations per-tensor affine with a moving-average observer); the "
            f"{argument}'s {', '.join(ignored)} configure stand-alone observers and fake "
            "quantizers only, and change nothing here",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
