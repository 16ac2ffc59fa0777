"""Hypothesis strategies and chex-style checks for JAX modules, importable by any project.

- `properties.strategies`: configs drawn from a few shape buckets and NumPy
  inputs for them (needs `hypothesis`).
- `properties.checks`: assertions over any JAX function (finite, live
  gradients, causal, batch-independent, jit == eager, finite differences,
  straight-through estimator, quantization error, idempotence, clipping).

Usage: ``from properties import checks, strategies as st_tft``. The
submodules are not imported here, so `properties.checks` works without
Hypothesis installed.
"""

__all__ = ["checks", "strategies"]
