"""Hypothesis strategies and chex-based checks for JAX modules, and proof that they catch bugs.

- `properties.strategies`: configs and NumPy inputs drawn from a few shape buckets.
- `properties.checks`: assertions on any JAX function (finite, live gradients,
  causal, batch-independent, jit == eager, finite differences, STE, ...).
- `properties.backends`: run the same properties on every platform JAX finds.
- `properties.suite`: the properties of this project's modules, shared by the
  tests and the fault catalogue.
- `properties.faults`: `python -m properties.faults` applies deliberate faults to
  the real code and reports which property catches each.
- `properties.profiles`: the Hypothesis profiles `dev`, `ci` and `thorough`
  (import it in a `conftest.py`).

The submodules are imported on first access (`import properties;
properties.checks` works), so `properties.checks` works without Hypothesis.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["backends", "checks", "faults", "profiles", "strategies", "suite"]

if TYPE_CHECKING:  # what a type checker reads: the submodules, each with its own types
    from properties import backends, checks, faults, profiles, strategies, suite
else:  # what runs: each imported on first access

    def __getattr__(name: str) -> ModuleType:
        if name not in __all__:
            raise AttributeError(f"module 'properties' has no attribute {name!r}")
        return importlib.import_module(f"properties.{name}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
