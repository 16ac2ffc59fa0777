"""Properties of the quantization-aware TFT, calibrated on the drawn batch and then frozen.

Cases are `tft.ModelCase`s of the smallest preset (the QAT model compiles
more than the FP32 one). The QAT model starts from the FP32 preset's
parameters (`qat.from_fp32`), `qat.calibrate` runs its observers over the
case's batch, and a jitted pullback of the frozen model (`calibrate=False`)
serves every property: three compiles per config (fresh observers,
calibration step, pullback).

Properties: finite outputs and gradients; the straight-through gradient
reaches every parameter and input; causality; batch independence (forward
and backward); batch-order equivariance of the frozen model and of the
calibration itself; and, on a preset with dropout, that the frozen model's
gates apply inverted dropout in training as the FP32 model's do.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from properties import checks
from properties import strategies as st_tft
from properties.suite import (
    Property,
    assert_gradient_stays_causal,
    assert_gradient_stays_in_sample,
    platform_cache,
    random_cotangent,
)
from properties.suite import tft as tft_suite
from qat import model as qat_model
from qat.config import QATConfig
from tft_jax.config import TFTConfig

__all__ = [
    "PROPERTIES",
    "QAT_CONFIG",
    "check_batch_independent",
    "check_batch_order_equivariant",
    "check_causal",
    "check_finite",
    "check_gate_dropout_is_inverted",
    "check_live_gradients",
    "qat_cases",
]

QAT_CONFIG = QATConfig(bits=8)
PRESET = st_tft.TFT_PRESETS[0]
QUANT_STATS = "quant_stats"


def qat_cases(
    kinds: tuple[str, ...] = st_tft.INPUT_KINDS, presets: tuple[TFTConfig, ...] = (PRESET,)
) -> Any:
    """`tft.ModelCase`s of the smallest preset (or of `presets`): only the data varies."""
    return tft_suite.model_cases(presets, kinds=kinds)


class _QATFunctions(NamedTuple):
    model: Any
    variables: dict[str, Any]
    pullback: Any


@platform_cache
def qat_functions(config: TFTConfig, qat_config: QATConfig) -> _QATFunctions:
    """The QAT model, its variables from the FP32 preset, and the frozen model's jitted pullback."""
    model = qat_model.QATTemporalFusionTransformer(config, qat_config)
    fp32 = tft_suite.model_functions(config)
    variables = qat_model.from_fp32({"params": fp32.params}, model, **_zero_inputs(config))

    @jax.jit
    def pullback(params: Any, stats: Any, floats: Any, integers: Any, cotangent: Any) -> Any:
        def forward(params: Any, floats: Any) -> Any:
            return model.apply(
                {"params": params, QUANT_STATS: stats},
                **floats,
                **integers,
                deterministic=True,
                calibrate=False,
            )

        outputs, vjp = jax.vjp(forward, params, floats)
        param_grads, input_grads = vjp(cotangent)
        return outputs, param_grads, input_grads

    return _QATFunctions(model, variables, pullback)


def _zero_inputs(config: TFTConfig) -> dict[str, np.ndarray]:
    """All-zero model inputs of batch size 1 (they fix shapes only).

    Every input the config takes, the categorical ones over time included
    (`tft.model_cases` draws them for any preset, so the QAT model must be
    built for all of them).
    """
    return tft_suite._sample_inputs(config, 1)


def calibrated_stats(case: tft_suite.ModelCase, inputs: st_tft.TFTInputs | None = None) -> Any:
    """The observers' state after `qat.calibrate` over one batch (the case's by default)."""
    functions = qat_functions(case.config, QAT_CONFIG)
    batch = case.inputs if inputs is None else inputs
    return qat_model.calibrate(functions.model, functions.variables, [batch])[QUANT_STATS]


def _frozen(case: tft_suite.ModelCase) -> tuple[_QATFunctions, Any]:
    return qat_functions(case.config, QAT_CONFIG), calibrated_stats(case)


def _run(case: tft_suite.ModelCase, stats: Any, cotangent: Any) -> tuple[Any, Any, Any]:
    functions = qat_functions(case.config, QAT_CONFIG)
    floats, integers = tft_suite.split_inputs(case.inputs)
    return functions.pullback(functions.variables["params"], stats, floats, integers, cotangent)


def _forward_of(case: tft_suite.ModelCase, stats: Any) -> Any:
    functions = qat_functions(case.config, QAT_CONFIG)
    zero = tft_suite.output_like(case.config, case.inputs.batch_size)

    def forward(inputs: dict[str, np.ndarray]) -> Any:
        integers = {k: v for k, v in inputs.items() if k in tft_suite.INTEGER_INPUTS}
        floats = {k: v for k, v in inputs.items() if k not in tft_suite.INTEGER_INPUTS}
        params = functions.variables["params"]
        return functions.pullback(params, stats, floats, integers, zero)[0]

    return forward


def _all_inputs(case: tft_suite.ModelCase) -> dict[str, np.ndarray]:
    floats, integers = tft_suite.split_inputs(case.inputs)
    return {**floats, **integers}


def check_finite(case: tft_suite.ModelCase) -> None:
    """Calibrated on the batch, the frozen QAT model's outputs and gradients are finite."""
    _, stats = _frozen(case)
    checks.assert_finite(stats, name="quant_stats")
    like = tft_suite.output_like(case.config, case.inputs.batch_size)
    outputs, param_grads, input_grads = _run(case, stats, random_cotangent(like, case.seed))
    checks.assert_finite(outputs, name="outputs")
    checks.assert_finite({"params": param_grads, "inputs": input_grads}, name="gradients")


def check_live_gradients(case: tft_suite.ModelCase) -> None:
    """Through every fake quantizer the straight-through gradient reaches each parameter and input.

    Needs non-degenerate inputs (`kinds=("normal",)`).
    """
    _, stats = _frozen(case)
    like = tft_suite.output_like(case.config, case.inputs.batch_size)
    cotangent = like.replace(quantiles=random_cotangent(like.quantiles, case.seed))
    _, param_grads, input_grads = _run(case, stats, cotangent)
    checks.assert_nonzero_grads(param_grads, name="parameter gradients")
    checks.assert_nonzero_grads(input_grads, name="input gradients")


def check_causal(case: tft_suite.ModelCase) -> None:
    """The frozen QAT forecast at horizon step `i` ignores known inputs after `i`.

    The backward too: the straight-through gradient of the forecasts up to
    step `i` is exactly zero at the known inputs after `i`.
    """
    _, stats = _frozen(case)
    like = tft_suite.output_like(case.config, case.inputs.batch_size)
    assert_gradient_stays_causal(
        lambda quantiles: {
            "future": _run(case, stats, like.replace(quantiles=quantiles))[2]["future"]
        },
        like.quantiles,
        seed=case.seed,
    )
    inputs = _all_inputs(case)
    forward = _forward_of(case, stats)

    def by_horizon_step(future: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        outputs = forward({**inputs, "future": future})
        return np.asarray(outputs.quantiles), np.swapaxes(np.asarray(outputs.attention), 1, 2)

    checks.assert_causal(by_horizon_step, inputs["future"], out_axis=1, check_gradients=False)


def check_batch_independent(case: tft_suite.ModelCase) -> None:
    """Frozen, sample `i`'s outputs and their input gradients ignore sample `j`.

    (While calibrating, the observed range is a batch statistic by design.)
    """
    _, stats = _frozen(case)
    checks.assert_batch_independent(
        _forward_of(case, stats), _all_inputs(case), check_gradients=False
    )
    like = tft_suite.output_like(case.config, case.inputs.batch_size)
    assert_gradient_stays_in_sample(
        lambda cotangent: _run(case, stats, cotangent)[2], like, seed=case.seed
    )


def check_batch_order_equivariant(case: tft_suite.ModelCase) -> None:
    """Calibration ignores the batch order, and the frozen model's outputs follow it."""
    _, stats = _frozen(case)
    permutation = np.roll(np.arange(case.inputs.batch_size), 1)
    permuted = st_tft.TFTInputs._make(
        None if array is None else np.asarray(array)[permutation] for array in case.inputs
    )
    permuted_stats = calibrated_stats(case, permuted)
    expected = jax.tree_util.tree_flatten_with_path(stats)[0]
    actual = jax.tree.leaves(permuted_stats)
    for (path, before), after in zip(expected, actual, strict=True):
        leaf = jax.tree_util.keystr(path)
        np.testing.assert_allclose(
            np.asarray(after),
            np.asarray(before),
            rtol=1e-6,
            err_msg=f"a permuted batch calibrates quant_stats{leaf} differently",
        )
    checks.assert_batch_order_equivariant(_forward_of(case, stats), _all_inputs(case), atol=1e-5)


@platform_cache
def _gate_dropout_recorder(config: TFTConfig, qat_config: QATConfig) -> Any:
    """`tft.gate_dropout_recorder` of the frozen QAT TFT: `params` are `(params, quant_stats)`."""
    model = qat_functions(config, qat_config).model

    def run_model(params: Any, floats: Any, integers: Any, key: Any) -> Any:
        params, stats = params
        return model.apply(
            {"params": params, QUANT_STATS: stats},
            **floats,
            **integers,
            deterministic=False,
            calibrate=False,
            rngs={"dropout": key},
        )

    return tft_suite.gate_dropout_recorder(run_model)


def check_gate_dropout_is_inverted(case: tft_suite.ModelCase) -> None:
    """Calibrated and frozen, the QAT model's gates apply inverted dropout in training.

    `tft.check_gate_dropout_is_inverted` on the QAT model: every gate (GLU)
    it runs as a module zeroes its input at the config's rate or scales it
    by `1 / (1 - rate)` before the fake-quantized projection. The variable
    selection's chunked path is compared with the module path by the tests.
    Needs a config with `dropout_rate > 0`.
    """
    rate = case.config.dropout_rate
    if rate <= 0.0:
        raise ValueError(
            f"check_gate_dropout_is_inverted needs a config with dropout_rate > 0, got {rate}"
        )
    functions, stats = _frozen(case)
    floats, integers = tft_suite.split_inputs(case.inputs)
    recorded = _gate_dropout_recorder(case.config, QAT_CONFIG)(
        (functions.variables["params"], stats), floats, integers, np.uint32(case.seed)
    )
    tft_suite.assert_gate_dropout_inverted(recorded, rate, "the QAT TFT")


# The smallest preset with dropout: the QAT model compiles more than the FP32 one.
WITH_DROPOUT = tft_suite.WITH_DROPOUT[:1]

PROPERTIES = (
    Property("qat-tft: finite", qat_cases(), check_finite),
    Property("qat-tft: live gradients", qat_cases(("normal",)), check_live_gradients),
    Property("qat-tft: causal", qat_cases(), check_causal),
    Property("qat-tft: batch independent", qat_cases(), check_batch_independent),
    Property("qat-tft: batch order", qat_cases(), check_batch_order_equivariant),
    Property(
        "qat-tft: gate dropout is inverted",
        qat_cases(("normal",), WITH_DROPOUT),
        check_gate_dropout_is_inverted,
    ),
)
