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
from tft_jax.distributed import data_mesh, place_state, shard_batch
from tft_jax.model import TemporalFusionTransformer
from tft_jax.train import Batch, ModelApply, deterministic_output, model_inputs

MODEL_NAMES = ("fp32", "qat", "int8")
Predictor = Callable[[Batch], Any]


def qat_model_for(config: TFTConfig, bits: int) -> qat.QATTemporalFusionTransformer:
    """The QAT TFT of `config` at `bits` bits: the model a run trains and its predictors apply."""
    return qat.QATTemporalFusionTransformer(config, qat.QATConfig(bits=bits))


@functools.partial(jax.jit, static_argnums=0)
def _int8_predict(model: Any, variables: Any, batch: Batch) -> Any:
    """The int8 model's forecast of `batch`; equal models share one compiled function per shape."""
    args, kwargs = model_inputs(batch)
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
    if name == "int8":
        variables = jax.device_put(variables)  # once, not at every call
        return lambda batch: _int8_predict(model, variables, batch)
    apply_fn, calibrate = ModelApply(model), (None if name == "fp32" else False)
    return _placed_as_in_training(apply_fn, calibrate, variables)


def _placed_as_in_training(
    apply_fn: ModelApply, calibrate: bool | None, variables: Any
) -> Predictor:
    """`deterministic_output` of `variables` with arguments laid out as `fit` validates.

    Then the forward that validated the model in training, compiled for
    batches of the evaluation batch size, serves the forecasts of batches of
    that size: a jitted function compiles again for arguments placed
    differently. In one process: the variables replicated over the devices
    of `data_mesh()` and a batch split over them; a batch they cannot split
    evenly runs on one device. With several processes each predicts its
    batches on its own devices.
    """
    if jax.process_count() > 1:
        local = jax.device_put(variables)
        return lambda batch: deterministic_output(apply_fn, calibrate, local, batch)
    mesh = data_mesh()
    on_mesh = place_state(variables, mesh)
    on_one_device = functools.cache(lambda: jax.device_put(variables))

    def predict(batch: Batch) -> Any:
        if batch.batch_size % mesh.size == 0:
            return deterministic_output(apply_fn, calibrate, on_mesh, shard_batch(batch, mesh))
        return deterministic_output(apply_fn, calibrate, on_one_device(), batch)

    return predict
