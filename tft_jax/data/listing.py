"""The first few items of a long list, and the items it repeats, as messages quote them.

A warning or error about many series, columns or parameters names the first
few and counts the rest, the same way everywhere: 'a, b, c and 4 more'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def first_few(texts: Sequence[str], limit: int = 5, separator: str = ", ") -> str:
    """The first `limit` of `texts` joined by `separator`, then ' and N more' if any are left.

    Args:
      texts: the items, already written as they should read.
      limit: how many to show, >= 1.
      separator: what goes between two shown items.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    shown = separator.join(texts[:limit])
    left = len(texts) - limit
    return shown + (f" and {left} more" if left > 0 else "")


def repeated(values: Sequence[Any]) -> list[Any]:
    """The values that `values` holds more than once, each once, in the order first seen.

    Compared with `==`, so unhashable values and ids of mixed types (1 and '1'
    differ) work; the lists checked are short (flags, levels, series named).
    """
    return [
        value
        for index, value in enumerate(values)
        if values.count(value) > 1 and value not in values[:index]
    ]
