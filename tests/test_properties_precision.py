"""The suite's float64-reference checks run the code under test with full float32 matmuls.

A GPU multiplies float32 matrices in TF32 by default; on an H200 that made
three reference checks fail by 2e-4 to 7e-4 (tolerance 1e-4) although the
formulas were right. CPUs ignore the precision setting, so these tests
record the setting in force while the code under test runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from properties import strategies as st_tft
from properties.suite import attention, full_float32_matmuls, quantization, tft


def _recording(fn: Callable[..., Any], seen: list[Any]) -> Callable[..., Any]:
    def wrapped(*args: Any) -> Any:
        seen.append(jax.config.jax_default_matmul_precision)
        return fn(*args)

    return wrapped


def _record_pullback(monkeypatch: Any, module: Any, name: str, seen: list[Any]) -> None:
    """Makes `module.name(...)`'s functions record the precision whenever `pullback` runs."""
    real = getattr(module, name)

    def patched(*args: Any) -> Any:
        functions = real(*args)
        return functions._replace(pullback=_recording(functions.pullback, seen))

    monkeypatch.setattr(module, name, patched)


def test_full_float32_matmuls_sets_the_highest_precision_and_restores_the_default():
    before = jax.config.jax_default_matmul_precision
    with full_float32_matmuls():
        assert jax.config.jax_default_matmul_precision == "highest"
    assert jax.config.jax_default_matmul_precision == before


def test_attention_reference_check_runs_the_block_at_full_precision(monkeypatch):
    seen: list[Any] = []
    _record_pullback(monkeypatch, attention, "_block", seen)
    config = st_tft.AttentionConfig(
        hidden_dim=8, num_heads=2, sequence_length=3, batch_size=2, dropout_rate=0.0
    )
    x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype(np.float32)
    attention.check_matches_reference(attention.BlockCase(config, x, seed=0))
    assert seen == ["highest"]


def test_interpretable_attention_reference_check_runs_at_full_precision(monkeypatch):
    seen: list[Any] = []
    real = tft._attention_functions

    def functions(num_heads: int, features: int) -> Any:
        params, apply = real(num_heads, features)
        return params, _recording(apply, seen)

    monkeypatch.setattr(tft, "_attention_functions", functions)
    rng = np.random.default_rng(1)
    case = tft.AttentionCase(
        num_heads=2,
        queries=rng.normal(size=(2, 2, 8)).astype(np.float32),
        keys_values=rng.normal(size=(2, 4, 8)).astype(np.float32),
    )
    tft.check_attention_matches_reference(case)
    assert seen == ["highest"]


def test_qat_layer_reference_check_runs_at_full_precision(monkeypatch):
    seen: list[Any] = []
    _record_pullback(monkeypatch, quantization, "_layer_functions", seen)
    x = np.random.default_rng(2).normal(size=quantization.LAYER_INPUT_SHAPE).astype(np.float32)
    quantization.check_qat_layer_gradients(quantization.LayerCase(8, x, seed=0))
    assert seen == ["highest"]
