"""Test-session setup: the JAX persistent compilation cache and Hypothesis profiles."""

from __future__ import annotations

import os
import pathlib

# Compile time dominates a JAX test suite, and most of it is LLVM optimising
# the generated CPU code. Tests check values, not speed: LLVM's level 1 compiles
# a TFT train step ~1.7x faster than the default on 2 cores (the values agree to
# float tolerance). Set before JAX starts, so the subprocesses that some tests
# launch inherit it; a level already in XLA_FLAGS wins.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=1"
    ).strip()

import jax
from hypothesis import HealthCheck, settings

_ROOT = pathlib.Path(__file__).resolve().parent.parent

# Cache every executable, however small.
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
