"""Hypothesis strategies and chex-based checks for JAX modules, and proof that they catch bugs.

- `properties.strategies`: configs and NumPy inputs drawn from a few shape buckets.
- `properties.checks`: assertions on any JAX function (finite, live gradients,
  causal, batch-independent, jit == eager, finite differences, STE, ...).
- `properties.backends`: run the same properties on every platform JAX finds.
- `properties.suite`: the properties of this project's modules, shared by the
  tests and the fault catalogue.
- `properties.faults`: `python -m properties.faults` applies deliberate faults to
  the real code and reports which property catches each.

The submodules are imported on demand, so `properties.checks` works without Hypothesis.
"""

__all__ = ["backends", "checks", "faults", "strategies", "suite"]
