"""Values as static `jax.jit` arguments: by value when they hash, else by identity.

A static argument must hash. Flax modules and most settings hash by value, so
equal ones share a compiled program; one with an unhashable field (a list of
features, an array, a pytree mask) is wrapped to compare by the identity of
its object instead: calls with that object share one trace, an equal object
built anew traces again.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ByIdentity", "from_static_argument", "is_hashable", "static_argument"]


def is_hashable(value: Any) -> bool:
    """Whether `value` can be hashed (a static jit argument, shared by equal values)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


class ByIdentity:
    """An unhashable value that compares and hashes by the identity of its object."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByIdentity) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def static_argument(value: Any) -> Any:
    """`value` if it hashes, else `ByIdentity(value)`."""
    return value if is_hashable(value) else ByIdentity(value)


def from_static_argument(static: Any) -> Any:
    """The value `static_argument` was given."""
    return static.value if isinstance(static, ByIdentity) else static
