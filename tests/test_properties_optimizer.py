"""Hypothesis properties of the optimizer chain (`make_optimizer`), on every platform.

Each test runs one check function of `properties.suite.optimizer` on drawn
parameters and gradient sequences whose norms straddle the clipping threshold.
"""

from __future__ import annotations

from hypothesis import given

from properties import backends
from properties.suite import optimizer as suite

PROPERTIES = {prop.name: prop for prop in suite.PROPERTIES}


def _strategy(name: str):
    return PROPERTIES[name].strategy


@backends.parametrize()
@given(_strategy("optimizer: clipped first"))
def test_adam_sees_the_gradient_clipped_to_the_global_norm_bound(platform, case):
    with backends.on_platform(platform):
        suite.check_clipping_precedes_adam(case)


@backends.parametrize()
@given(_strategy("optimizer: reference"))
def test_updates_equal_numpy_clip_then_adamw_over_several_steps(platform, case):
    with backends.on_platform(platform):
        suite.check_matches_reference(case)


@backends.parametrize()
@given(_strategy("optimizer: finite"))
def test_finite_gradients_of_any_magnitude_give_finite_updates(platform, case):
    with backends.on_platform(platform):
        suite.check_finite_updates(case)


@backends.parametrize()
@given(_strategy("optimizer: jit == eager"))
def test_compiled_update_equals_op_by_op_update(platform, case):
    with backends.on_platform(platform):
        suite.check_jit_matches_eager(case)
