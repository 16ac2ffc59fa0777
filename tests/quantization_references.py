"""NumPy references shared by the quantization tests: LSQ gradients and rounding-tie filters."""

from __future__ import annotations

import numpy as np

EPS = np.finfo(np.float32).eps


def reference_gradients(x, scale, zero_point, qmin, qmax, cotangent, grad_scale):
    """Numpy LSQ gradients (Esser et al. 2020, eq. 3, with a zero point) of sum(cotangent * y)."""
    x = np.asarray(x, np.float32)
    step = max(abs(np.float32(scale)), EPS)
    # The grid position in float32, as the forward: x times the reciprocal (PyTorch's).
    ratio = (x * (np.float32(1) / np.float32(step))).astype(np.float64)
    rounded = np.round(ratio)
    position = rounded + zero_point
    below, above = position < qmin, position > qmax
    inside = ~(below | above)
    d_step = np.where(below, qmin - zero_point, np.where(above, qmax - zero_point, rounded - ratio))
    sign = -1.0 if scale < 0 else 1.0
    return (
        cotangent * inside,
        np.sum(cotangent * d_step) * grad_scale * sign,
        np.sum(cotangent * np.where(inside, 0.0, -step)) * grad_scale,
    )


def away_from_ties(x, scale, margin=1e-3):
    """Elements whose `x / s` is not within `margin` of a rounding tie (`k + 0.5`).

    XLA divides by a broadcast scale as a multiplication by its reciprocal
    (as PyTorch does), which can differ from float64 division by an ulp:
    exactly at a tie that is one code either way.
    """
    ratio = np.asarray(x, np.float64) / np.asarray(scale, np.float64)
    return np.abs(ratio - np.floor(ratio) - 0.5) > margin
