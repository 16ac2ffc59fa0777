"""`tft_jax.forecaster.predictors`: the forms' predictors apply the model of their name at the
run's integer width, against the QAT TFT applied directly."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from qat import QATConfig, QATTemporalFusionTransformer, convert, int8_apply
from tft_jax.forecaster.predictors import MODEL_NAMES, make_predictor, qat_model_for
from tft_jax.train import Batch

from .qat_tiny_tft import BATCH, CONFIG, INPUTS, qat_setup

# Frozen forwards do not depend on the observer settings, only on `bits`.
_QAT4 = QATConfig(bits=4, calibration_batches=2, averaging_constant=0.1)


def _batch(inputs: dict) -> Batch:
    return Batch(**inputs, target=np.zeros((BATCH, CONFIG.prediction_horizon), np.float32))


# Mutant P1 (predictors.py:45, `if name not in MODEL_NAMES:` -> dropped): an unknown name
# built a QAT predictor instead of failing.
@pytest.mark.parametrize("name", ["fp16", "FP32", "int4", ""])
def test_make_predictor_refuses_an_unknown_model_name(name):
    with pytest.raises(ValueError, match=r"model must be one of \('fp32', 'qat', 'int8'\)"):
        make_predictor(name, CONFIG, {})
    assert MODEL_NAMES == ("fp32", "qat", "int8")


# Mutant P4 (predictors.py:28, `QATConfig(bits=bits)` -> `QATConfig()`).
@pytest.mark.parametrize("bits", [4, 8])
def test_qat_model_for_builds_the_qat_tft_of_the_config_at_the_given_bits(bits):
    model = qat_model_for(CONFIG, bits)
    assert isinstance(model, QATTemporalFusionTransformer)
    assert model.config == CONFIG and model.qat_config.bits == bits


# Mutants P3 (predictors.py:47, `qat_model_for(config, bits)` -> `qat_model_for(config, 8)`)
# and P2 (`if name == "fp32"` -> `if name != "qat"`: int8 applied with the FP32 TFT), and P8
# (predictors.py:35, int8_apply without the keyword inputs known_history/static_categorical).
# Reference: the QAT model applied directly by flax / qat.int8_apply at 4 bits, each under
# one `jax.jit` (op by op they compiled ~600 single-primitive programs).
def test_qat_and_int8_predictors_apply_the_qat_tft_at_the_given_bits():
    _, _, calibrated = qat_setup(_QAT4)
    inputs = INPUTS[2]
    reference_model = QATTemporalFusionTransformer(CONFIG, QATConfig(bits=4))
    qat_apply = functools.partial(reference_model.apply, deterministic=True, calibrate=False)
    want_qat = jax.jit(qat_apply)(calibrated, **inputs).quantiles
    got_qat = make_predictor("qat", CONFIG, calibrated, bits=4)(_batch(inputs)).quantiles
    np.testing.assert_allclose(np.asarray(got_qat), np.asarray(want_qat), rtol=1e-5, atol=1e-6)
    # The check can tell the bit widths apart: at 8 bits the same variables forecast otherwise.
    at_8 = make_predictor("qat", CONFIG, calibrated, bits=8)(_batch(inputs)).quantiles
    assert np.abs(np.asarray(at_8) - np.asarray(want_qat)).max() > 1e-4

    integer = convert(calibrated)
    want_int8 = jax.jit(int8_apply, static_argnums=0)(reference_model, integer, **inputs).quantiles
    got_int8 = make_predictor("int8", CONFIG, integer, bits=4)(_batch(inputs)).quantiles
    np.testing.assert_allclose(np.asarray(got_int8), np.asarray(want_int8), rtol=1e-5, atol=1e-6)
