"""The warmup-cosine learning-rate schedule in float64, as its docstring states it."""

from __future__ import annotations

import math


def warmup_cosine(count: float, peak: float, total: float, warmup: float, end: float) -> float:
    """Linear from 0 to `peak` over `warmup` steps, then cosine to `end` at `total`, then `end`."""
    if count < warmup:
        return peak * count / warmup
    progress = min(count - warmup, total - warmup) / (total - warmup)
    return end + (peak - end) * 0.5 * (1.0 + math.cos(math.pi * progress))
