"""Quantile levels given by a caller, read as numbers or refused naming `quantiles`."""

from __future__ import annotations

from typing import Any

import numpy as np


def numeric_levels(quantiles: Any) -> np.ndarray:
    """`quantiles` as a 1-D float64 array; `TypeError` naming `quantiles` unless it holds numbers.

    `float('a')` failed with a bare "could not convert string to float"
    naming no argument, a string of one level was read character by
    character, and texts ('0.5') would convert: real numbers only (no bools,
    no complex), one level per element, one axis. The range is the caller's
    to check.
    """
    message = f"quantiles must be a sequence of numbers in (0, 1), got {quantiles!r}"
    if quantiles is None or isinstance(quantiles, str | bytes):
        raise TypeError(message)
    try:
        levels = np.asarray(quantiles)
    except (TypeError, ValueError) as error:  # ragged nesting
        raise TypeError(message) from error
    numeric = np.issubdtype(levels.dtype, np.number) and not np.issubdtype(levels.dtype, np.bool_)
    if levels.ndim != 1 or not numeric or np.iscomplexobj(levels):
        raise TypeError(message)
    return levels.astype(np.float64)
