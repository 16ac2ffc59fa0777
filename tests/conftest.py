"""Test-session setup: the JAX persistent compilation cache and Hypothesis profiles."""

from __future__ import annotations

import os
import pathlib

from benchmarks.backend_probe import probe_default_backend

# Compile time dominates a JAX test suite, and on XLA:CPU nearly all of it is
# LLVM compiling one module per fused kernel (~900 for a small TFT train step).
# Tests check values, not speed, so on a CPU they compile with LLVM at -O0 and
# XLA's classic loop emitters instead of the MLIR fusion emitters: a `seed`
# TFT step compiles ~2.5x faster (runs ~2x slower), and the whole suite takes
# 356 s instead of 874 s on 2 cores with the same results. Set before JAX
# starts, so the subprocesses that some tests launch inherit it; flags already
# in XLA_FLAGS win. A child process probes the default backend with the flags
# (a jaxlib that no longer knows the emitter flag aborts on it; the result is
# inherited too). On a GPU or TPU the suite compiles as users do: -O0 there
# skips LLVM rewrites that change results (qat.division's, found on an H200).
_TEST_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _default_backend(flags: str) -> str | None:
    """The default backend JAX starts with under `flags`, None if it cannot start."""
    return probe_default_backend({"XLA_FLAGS": flags})


# Probed once: pytest-xdist's workers and the tests' subprocesses inherit the decision.
_PROBED = "TFT_JAX_TESTS_PROBED_BACKEND"
_unset = "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")
if _unset and _PROBED not in os.environ:
    _base = os.environ.get("XLA_FLAGS", "")
    for _extra in (_TEST_FLAGS, _TEST_FLAGS[:1]):
        _flags = " ".join((_base, *_extra)).strip()
        _backend = _default_backend(_flags)
        if _backend is not None:
            break
    os.environ[_PROBED] = str(_backend)
    if _backend == "cpu":
        os.environ["XLA_FLAGS"] = _flags

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from tft_jax import inline_threefry  # noqa: E402

# The library draws every dropout mask inline (loop-free kernels: faster steps,
# same bits as JAX's rolled Threefry loop). Under the test flags above those
# kernels compile ~1.5x slower than the loops, so the tests draw JAX's way, bit
# for bit the same masks; the tests about the inline draws themselves use the
# `library_inline_threshold` fixture. Subprocesses that tests launch keep the
# library's default.
_LIBRARY_INLINE_MIN_SIZE = inline_threefry.INLINE_MIN_SIZE
inline_threefry.INLINE_MIN_SIZE = 1 << 16


@pytest.fixture
def library_inline_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropout draws at the library's inline threshold (the suite raises it)."""
    monkeypatch.setattr(inline_threefry, "INLINE_MIN_SIZE", _LIBRARY_INLINE_MIN_SIZE)


_ROOT = pathlib.Path(__file__).resolve().parent.parent

# Cache every executable, however small, in the checkout's `.jax_cache` unless
# JAX_COMPILATION_CACHE_DIR names another folder (an empty one times a cold run).
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(_ROOT / ".jax_cache"),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

import properties.profiles  # noqa: E402, F401  (registers dev, ci and thorough)

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Heaviest test files first. `make test` runs `-n 2 --dist loadfile`: each
# file goes whole to one worker, in collection order once `--no-loadscope-reorder`
# (pyproject's addopts) stops pytest-xdist from queuing files by their number of
# tests, which put the one-test README run (one of the longest files) last.
# Starting the long files first (longest processing time first) leaves the
# short ones to even out the two workers at the end. By seconds in two cold runs
# on 2 cores (2026-12-03); a file not listed runs after these, in alphabetical
# order. The order only changes when a file runs, never what it checks.
_HEAVY_FILES_FIRST = (
    "test_cli.py",  # ~100 s: the trained run fixture and the two-process run
    "test_benchmarks.py",
    "test_readme.py",
    "test_distributed.py",  # the 8-device subprocess
    "test_model.py",
    "test_train.py",
    "test_interpretable_outputs.py",
    "test_qat_model.py",
    "test_faults.py",
    "test_categorical_inputs.py",
    "test_checkpoint.py",
    "test_qat_fast_path.py",
    "test_experiments.py",
    "test_run_folder_model_files.py",
    "test_properties_tft.py",  # before the boundaries: its models come from the cache there
    "test_forecaster_flows.py",
    "test_properties_boundaries.py",
    "test_fast_path.py",
    "test_benchmarks_accelerator.py",
    "test_properties_qat.py",
)


def pytest_collection_modifyitems(items) -> None:
    rank = {name: index for index, name in enumerate(_HEAVY_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: keeps file order
