"""Hypothesis properties of quantization: fake quantizer, LSQ, observers, QAT layer and QAT-TFT.

Each test runs one check function of `properties.suite.quantization` or
`properties.suite.qat_tft` on drawn cases, on every platform JAX finds.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from properties import backends
from properties.suite import examples, qat_tft
from properties.suite import quantization as suite

PROPERTIES = {prop.name: prop for prop in (*suite.PROPERTIES, *qat_tft.PROPERTIES)}


def _strategy(name: str):
    return PROPERTIES[name].strategy


@backends.parametrize()
@given(_strategy("fake quant: STE"))
def test_fake_quantize_gradient_is_exactly_the_clipped_ste_mask(platform, case):
    with backends.on_platform(platform):
        suite.check_ste_gradient(case)


@backends.parametrize()
@given(_strategy("fake quant: error bound"))
def test_fake_quantize_error_is_half_a_step_inside_and_saturates_outside(platform, case):
    with backends.on_platform(platform):
        suite.check_error_bounded(case)


@backends.parametrize()
@given(_strategy("fake quant: nearest grid point"))
def test_fake_quantize_and_lsq_round_to_the_nearest_grid_point_ties_to_even(platform, case):
    with backends.on_platform(platform):
        suite.check_rounds_to_grid(case)


@backends.parametrize()
@given(_strategy("fake quant: idempotent"))
def test_fake_quantize_is_idempotent(platform, case):
    with backends.on_platform(platform):
        suite.check_idempotent(case)


@backends.parametrize()
@given(_strategy("fake quant: jit == eager"))
def test_fake_quantize_value_and_gradient_equal_op_by_op_execution(platform, case):
    with backends.on_platform(platform):
        suite.check_jit_matches_eager(case)


@backends.parametrize()
@given(_strategy("lsq: STE"))
def test_lsq_passes_the_clipped_ste_to_its_input(platform, case):
    with backends.on_platform(platform):
        suite.check_lsq_ste_gradient(case)


@backends.parametrize()
@given(_strategy("lsq: gradient scale"))
def test_lsq_step_gradient_grows_as_sqrt_of_the_tensor_size(platform, case):
    with backends.on_platform(platform):
        suite.check_lsq_gradient_scale(case)


@backends.parametrize()
@given(_strategy("observer: valid qparams"))
def test_observer_qparams_are_finite_positive_and_on_the_grid_for_any_batch(platform, case):
    with backends.on_platform(platform):
        suite.check_qparams_valid(case)


@backends.parametrize()
@given(_strategy("observer: first batch"))
def test_first_batch_sets_the_observed_range_exactly(platform, case):
    with backends.on_platform(platform):
        suite.check_first_batch_sets_range(case)


@backends.parametrize()
@given(_strategy("observer: represents data"))
def test_minmax_observer_represents_every_value_it_has_seen(platform, case):
    with backends.on_platform(platform):
        suite.check_observed_values_representable(case)


@backends.parametrize()
@given(_strategy("observer: order invariant"))
def test_observer_ignores_element_order_and_minmax_ignores_batch_order(platform, case):
    with backends.on_platform(platform):
        suite.check_observer_order_invariant(case)


@backends.parametrize()
@given(_strategy("observer: jit == eager"))
def test_observer_update_and_qparams_equal_op_by_op_execution(platform, case):
    with backends.on_platform(platform):
        suite.check_observer_jit_matches_eager(case)


@backends.parametrize()
@given(_strategy("qat layer: STE reference"))
def test_qat_dense_layer_gradients_are_straight_through_the_fake_quantized_operands(platform, case):
    with backends.on_platform(platform):
        suite.check_qat_layer_gradients(case)


def test_qat_dense_layer_reference_rounds_a_near_tie_as_the_quantizer_documents():
    # A `thorough` draw: x[1, 1] * (1/s) is exactly 11.5 in float32 (code 125, as in PyTorch)
    # where float64 x / s is 11.4999995; the reference divided and missed by a step.
    x = np.array(
        [[0.44562247, -0.98160326, -0.23565668, -0.17298059, 0.3231563],
         [2.2218354, 0.18208675, -0.85945952, -1.7863457, 1.4056245],
         [0.25666809, 0.40342781, -0.70975935, 6.7793729e-4, 2.2512302]], np.float32
    )  # fmt: skip
    suite.check_qat_layer_gradients(suite.LayerCase(bits=8, x=x, seed=0))


@backends.parametrize()
@given(_strategy("qat-tft: finite"))
def test_qat_tft_outputs_and_gradients_are_finite_for_inputs_of_every_scale(platform, case):
    with backends.on_platform(platform):
        qat_tft.check_finite(case)


@backends.parametrize()
@given(_strategy("qat-tft: live gradients"))
def test_qat_tft_straight_through_gradient_reaches_every_parameter_and_input(platform, case):
    with backends.on_platform(platform):
        qat_tft.check_live_gradients(case)


@backends.parametrize()
@given(_strategy("qat-tft: causal"))
def test_qat_tft_forecast_at_step_i_ignores_known_inputs_after_step_i(platform, case):
    with backends.on_platform(platform):
        qat_tft.check_causal(case)


@backends.parametrize()
@given(_strategy("qat-tft: batch independent"))
def test_frozen_qat_tft_samples_do_not_interact(platform, case):
    with backends.on_platform(platform):
        qat_tft.check_batch_independent(case)


@backends.parametrize()
@given(_strategy("qat-tft: batch order"))
def test_qat_calibration_and_outputs_follow_the_batch_order(platform, case):
    with backends.on_platform(platform):
        qat_tft.check_batch_order_equivariant(case)


@backends.parametrize()
@settings(max_examples=examples(3))
@given(_strategy("qat-tft: gate dropout is inverted"))
def test_frozen_qat_tft_gates_apply_inverted_dropout_at_the_configured_rate_in_training(
    platform, case
):
    with backends.on_platform(platform):
        qat_tft.check_gate_dropout_is_inverted(case)
