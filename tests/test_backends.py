"""`properties.backends`: the platforms JAX finds, and running a test on each of them."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from properties import backends


def test_cpu_is_always_available_and_platforms_keep_their_order():
    present = backends.available_platforms()
    assert present[0] == "cpu"
    assert set(present) <= set(backends.PLATFORMS)
    assert list(present) == [p for p in backends.PLATFORMS if p in present]


def test_parametrize_gives_one_case_per_platform_and_skips_absent_ones_with_a_reason():
    mark = backends.parametrize()
    argname, params = mark.args
    assert argname == "platform"
    assert [param.values[0] for param in params] == list(backends.PLATFORMS)
    present = backends.available_platforms()
    for param in params:
        (skip,) = param.marks
        assert skip.name == "skipif"
        assert skip.args[0] is (param.values[0] not in present)
        assert param.values[0] in skip.kwargs["reason"]


@backends.parametrize()
def test_on_platform_runs_jitted_code_on_that_platform(platform):
    with backends.on_platform(platform) as device:
        y = jax.jit(lambda x: x * 2)(np.arange(3.0))
        assert backends.current_platform() == platform
    assert y.devices() == {device}
    np.testing.assert_array_equal(np.asarray(y), [0.0, 2.0, 4.0])


def test_unknown_platform_and_empty_selection_are_rejected_naming_them():
    with pytest.raises(ValueError, match="'npu'"):
        backends.device("npu")
    with pytest.raises(ValueError, match="'npu'"):
        backends.parametrize(platforms=("cpu", "npu"))
    with pytest.raises(ValueError, match="at least one"):
        backends.parametrize(platforms=())
    absent = [p for p in backends.PLATFORMS if p not in backends.available_platforms()]
    for platform in absent:
        with pytest.raises(ValueError, match=f"no {platform} device"):
            backends.device(platform)


def test_a_bare_platform_name_is_rejected_not_read_letter_by_letter():
    with pytest.raises(TypeError, match="the string 'cpu'"):
        backends.parametrize(platforms="cpu")
