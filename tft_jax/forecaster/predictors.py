"""The three forms of a trained TFT as predictors: `Batch -> TFTOutput`, jitted.

`fp32` is the trained model; `qat` the fine-tuned model with fake
quantization (observers frozen); `int8` the converted model with integer
matmuls (`qat.int8_apply`). Each compiles once per batch shape.
"""

from __future__ import annotations

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


def _jitted(forward: Callable[..., Any], variables: Any) -> Predictor:
    variables = jax.device_put(variables)  # once, not at every call

    @jax.jit
    def apply(variables: Any, batch: Batch) -> Any:
        args, kwargs = batch_inputs(batch)
        return forward(variables, *args, **kwargs)

    return lambda batch: apply(variables, batch)


def make_predictor(name: str, config: TFTConfig, variables: Any, bits: int = 8) -> Predictor:
    """The predictor of model `name` ('fp32', 'qat' or 'int8') with its variables."""
    if name == "fp32":
        model = TemporalFusionTransformer(config)
        return _jitted(lambda v, *a, **k: model.apply(v, *a, **k, deterministic=True), variables)
    qat_model = qat_model_for(config, bits)
    if name == "qat":
        return _jitted(
            lambda v, *a, **k: qat_model.apply(v, *a, **k, calibrate=False, deterministic=True),
            variables,
        )
    if name == "int8":
        return _jitted(lambda v, *a, **k: qat.int8_apply(qat_model, v, *a, **k), variables)
    raise ValueError(f"model must be one of {MODEL_NAMES}, got {name!r}")
