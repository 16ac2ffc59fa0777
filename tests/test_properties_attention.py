"""Hypothesis properties of the temporal self-attention block and its kernel, on every platform.

Cases come from `properties.suite.attention` (block configs from a few shape
buckets, inputs of every kind); each test runs one check function of that
module, so `python -m properties.faults` exercises exactly these properties.
"""

from __future__ import annotations

from hypothesis import given, settings

from properties import backends
from properties.suite import attention as suite
from properties.suite import examples

PROPERTIES = {prop.name: prop for prop in suite.PROPERTIES}


def _strategy(name: str):
    return PROPERTIES[name].strategy


@backends.parametrize()
@given(_strategy("attention: finite"))
def test_outputs_and_gradients_are_finite_for_inputs_of_every_scale(platform, case):
    with backends.on_platform(platform):
        suite.check_finite(case)


@backends.parametrize()
@given(_strategy("attention: live gradients"))
def test_every_parameter_head_and_the_input_receive_gradient(platform, case):
    with backends.on_platform(platform):
        suite.check_live_gradients(case)


@backends.parametrize()
@given(_strategy("attention: causal"))
def test_causal_outputs_and_weights_ignore_later_inputs(platform, case):
    with backends.on_platform(platform):
        suite.check_causal(case)


@backends.parametrize()
@given(_strategy("attention: batch independent"))
def test_samples_do_not_interact_forward_or_backward(platform, case):
    with backends.on_platform(platform):
        suite.check_batch_independent(case)


@backends.parametrize()
@given(_strategy("attention: batch order"))
def test_permuting_the_batch_permutes_the_outputs(platform, case):
    with backends.on_platform(platform):
        suite.check_batch_order_equivariant(case)


@backends.parametrize()
@settings(max_examples=examples(5))  # op-by-op execution of the backward pass is slow
@given(_strategy("attention: jit == eager"))
def test_compiled_forward_and_backward_equal_op_by_op_execution(platform, case):
    with backends.on_platform(platform):
        suite.check_jit_matches_eager(case)


@backends.parametrize()
@settings(max_examples=examples(6))
@given(_strategy("attention: finite differences"))
def test_derivatives_match_float64_finite_differences(platform, case):
    with backends.on_platform(platform):
        suite.check_grads_match_finite_differences(case)


@backends.parametrize()
@given(_strategy("attention: reference"))
def test_block_computes_the_documented_formula(platform, case):
    with backends.on_platform(platform):
        suite.check_matches_reference(case)


@backends.parametrize()
@given(_strategy("attention: positions"))
def test_constant_sequence_gets_a_different_output_at_every_step(platform, case):
    with backends.on_platform(platform):
        suite.check_positions_distinguished(case)


@backends.parametrize()
@given(_strategy("attention: layer norm bound"))
def test_output_rows_are_bounded_by_the_layer_norm_whatever_the_input_scale(platform, case):
    with backends.on_platform(platform):
        suite.check_layer_norm_bounds_output(case)


@backends.parametrize()
@settings(max_examples=examples(8))
@given(_strategy("attention: unbiased dropout"))
def test_attention_dropout_keeps_the_expected_output(platform, case):
    with backends.on_platform(platform):
        suite.check_dropout_unbiased(case)
