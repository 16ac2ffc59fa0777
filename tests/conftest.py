"""Test-session setup: the JAX persistent compilation cache and Hypothesis profiles."""

from __future__ import annotations

import os
import pathlib

import jax
from hypothesis import HealthCheck, settings

_ROOT = pathlib.Path(__file__).resolve().parent.parent

# Compile time dominates a JAX test suite; cache every executable, however small.
jax.config.update("jax_compilation_cache_dir", str(_ROOT / ".jax_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

_COMMON = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("dev", max_examples=5, **_COMMON)
settings.register_profile("ci", max_examples=15, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=200, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
