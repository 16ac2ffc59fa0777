"""The three forms of a trained TFT as predictors: `Batch -> TFTOutput`, jitted.

`fp32` is the trained model; `qat` the fine-tuned model with fake
quantization (observers frozen); `int8` the converted model with integer
matmuls (`qat.int8_apply`). Each compiles once per batch shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

import qat
from tft_jax.config import TFTConfig
from tft_jax.model import TemporalFusionTransformer
from tft_jax.train import CATEGORICAL_INPUTS, Batch

MODEL_NAMES = ("fp32", "qat", "int8")
Predictor = Callable[[Batch], Any]


def batch_inputs(batch: Batch) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The model's positional and keyword inputs in a `Batch` (time categoricals if present)."""
    kwargs = {"known_history": batch.known_history, "static_categorical": batch.static_categorical}
    for name in CATEGORICAL_INPUTS:
        if getattr(batch, name) is not None:
            kwargs[name] = getattr(batch, name)
    return (batch.static, batch.historical, batch.future), kwargs


def qat_model_for(
    config: TFTConfig, bits: int, calibration_batches: int | None = None
) -> qat.QATTemporalFusionTransformer:
    """The QAT TFT of `config` at `bits` bits (observers calibrated on `calibration_batches`)."""
    settings = {} if calibration_batches is None else {"calibration_batches": calibration_batches}
    return qat.QATTemporalFusionTransformer(config, qat.QATConfig(bits=bits, **settings))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _predict(name: str, model: Any, variables: Any, batch: Batch) -> Any:
    """Model `name`'s forecast of `batch`; equal models share one compiled function per shape."""
    args, kwargs = batch_inputs(batch)
    if name == "fp32":
        return model.apply(variables, *args, **kwargs, deterministic=True)
    if name == "qat":
        return model.apply(variables, *args, **kwargs, calibrate=False, deterministic=True)
    return qat.int8_apply(model, variables, *args, **kwargs)


def make_predictor(name: str, config: TFTConfig, variables: Any, bits: int = 8) -> Predictor:
    """The predictor of model `name` ('fp32', 'qat' or 'int8') with its variables.

    The forward is compiled once per model configuration and batch shape in a
    process: a refitted or reloaded `Forecaster` of the same configuration
    reuses it.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"model must be one of {MODEL_NAMES}, got {name!r}")
    model = TemporalFusionTransformer(config) if name == "fp32" else qat_model_for(config, bits)
    variables = jax.device_put(variables)  # once, not at every call
    return lambda batch: _predict(name, model, variables, batch)
