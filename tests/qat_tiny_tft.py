"""A tiny QAT TFT (hidden 4, T=3, H=2, batch 4, every input kind) and its calibration,
shared by the QAT model tests and the forecaster's predictor tests."""

from __future__ import annotations

import functools

import jax
import numpy as np

from qat import QATConfig, QATTemporalFusionTransformer, calibrate, from_fp32
from tft_jax import TemporalFusionTransformer, TFTConfig

CONFIG = TFTConfig(
    num_static_features=1,
    num_known_features=1,
    num_observed_features=2,
    hidden_dim=4,
    num_heads=2,
    sequence_length=3,
    prediction_horizon=2,
    dropout_rate=0.1,
    static_categorical_cardinalities=(3,),
    use_known_history=True,
)
QAT_CONFIG = QATConfig(calibration_batches=2, averaging_constant=0.1)
BATCH = 4


def make_inputs(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    return dict(
        static=normal(BATCH, 1),
        historical=normal(BATCH, 3, 2),
        future=normal(BATCH, 2, 1),
        known_history=normal(BATCH, 3, 1),
        static_categorical=rng.integers(0, 3, size=(BATCH, 1)).astype(np.int32),
    )


INPUTS = [make_inputs(seed) for seed in range(3)]


@functools.cache
def fp32_variables():
    model = TemporalFusionTransformer(CONFIG)
    return jax.jit(model.init)({"params": jax.random.key(0)}, **INPUTS[0])


def shape_args(inputs):
    return (inputs["static"], inputs["historical"], inputs["future"]), {
        "known_history": inputs["known_history"],
        "static_categorical": inputs["static_categorical"],
    }


@functools.cache
def qat_setup(qat_config: QATConfig = QAT_CONFIG):
    """`(model, fresh variables, calibrated variables)`; three batches offered, two used."""
    model = QATTemporalFusionTransformer(CONFIG, qat_config)
    args, kwargs = shape_args(INPUTS[0])
    fresh = from_fp32(fp32_variables(), model, *args, **kwargs)
    return model, fresh, calibrate(model, fresh, INPUTS)
