"""Observed activation ranges holding NaN or inf are refused by convert, int8_apply and eager QAT.

A jitted calibration step cannot refuse a batch holding one NaN or inf, and
its moving average then keeps the NaN or inf for good: the QAT forward gave
zeros (an inf range caps the scale) or NaN, `convert` accepted it and
`int8_apply` gave zeros or NaN on clean inputs. Each refusal names the layer
and the way out (fresh observers, `qat.calibrate`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
import pytest
from flax import linen as nn

from qat import QATConfig, QATModel, calibrate, convert, from_fp32, int8_apply
from qat.dot_general import observed_range_finite

AVERAGING = 0.01


class TwoLayers(nn.Module):
    """A hooked layer reading the input itself, then a float head."""

    dot_general_cls: Any = None

    @nn.compact
    def __call__(self, x):
        hidden = nn.relu(nn.Dense(16, dot_general_cls=self.dot_general_cls)(x))
        return nn.Dense(1)(hidden)


def batch(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(8, 4)).astype(np.float32)


@functools.cache
def setup():
    """`(qat_model, fp32 variables, fresh QAT variables)`."""
    model = TwoLayers()
    fp32 = model.init(jax.random.key(0), batch(0))
    qat_model = QATModel(model, QATConfig(bits=8, averaging_constant=AVERAGING))
    return qat_model, fp32, from_fp32(fp32, qat_model, batch(0))


def jitted_calibration(bad: float) -> dict[str, Any]:
    """The README's jitted calibration step over four batches, the second holding `bad`."""
    qat_model, _, variables = setup()
    step = jax.jit(functools.partial(qat_model.apply, calibrate=True, mutable=["quant_stats"]))
    poisoned = batch(2).copy()
    poisoned[0, 0] = bad
    for x in (batch(1), poisoned, batch(3), batch(4)):
        _, updates = step(variables, x)
        variables = {**variables, **updates}
    return variables


def observer(variables: dict[str, Any]) -> dict[str, Any]:
    return variables["quant_stats"]["Dense_0"]["dot_general"]


ADVICE = r"a calibration batch held a non-finite value.*qat\.from_fp32.*qat\.calibrate"


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_convert_refuses_a_range_a_jitted_calibration_made_non_finite(bad):
    variables = jitted_calibration(bad)
    stats = observer(variables)
    # The premise: the moving average kept the NaN or inf over the two clean batches after it.
    assert int(stats["num_batches"]) == 4
    assert not (np.isfinite(stats["min"]) and np.isfinite(stats["max"]))
    message = r"qat_variables: the activation observers of 1 layer\(s\) \(Dense_0/dot_general\) "
    with pytest.raises(ValueError, match=message + r"hold a NaN or inf .*" + ADVICE):
        convert(variables)


@pytest.mark.parametrize(("field", "bad"), [("min", np.nan), ("max", np.inf), ("min", -np.inf)])
def test_int8_apply_refuses_int8_variables_whose_range_is_non_finite(field, bad):
    qat_model, _, fresh = setup()
    int8 = convert(calibrate(qat_model, fresh, [batch(1)]))
    stats = {**observer(int8), field: np.float32(bad)}
    poisoned = {**int8, "quant_stats": {"Dense_0": {"dot_general": stats}}}
    message = r"int8_variables: the activation observers of 1 layer\(s\) \(Dense_0/dot_general\) "
    with pytest.raises(ValueError, match=message + r"hold a NaN or inf .*" + ADVICE):
        int8_apply(qat_model, poisoned, batch(5))


@pytest.mark.parametrize(("field", "bad"), [("max", np.inf), ("min", -np.inf), ("max", np.nan)])
def test_the_eager_qat_forward_names_the_layer_whose_range_is_non_finite(field, bad):
    # Before: zeros for an inf range (its scale capped), NaN or a bare "scale must be
    # finite" for a NaN one.
    qat_model, _, fresh = setup()
    calibrated = calibrate(qat_model, fresh, [batch(1)])
    stats = {**observer(calibrated), field: np.float32(bad)}
    poisoned = {**calibrated, "quant_stats": {"Dense_0": {"dot_general": stats}}}
    message = r"the activation observer of layer '.*Dense_0/dot_general' holds a NaN or inf "
    with pytest.raises(ValueError, match=message + ".*" + ADVICE):
        qat_model.apply(poisoned, batch(5))


def test_calibrate_names_variables_that_arrive_with_a_non_finite_range():
    # Blaming "calibration batch 0" would mislead: the range was poisoned before.
    qat_model, _, _ = setup()
    with pytest.raises(ValueError, match=r"qat_variables: the activation observers of 1 layer"):
        calibrate(qat_model, jitted_calibration(np.inf), [batch(1)])


def test_fresh_observers_calibrated_on_clean_batches_give_the_numpy_moving_average():
    # The way out the message gives: fresh observers, then qat.calibrate on clean batches.
    qat_model, _, _ = setup()
    poisoned = jitted_calibration(np.inf)
    clean = [batch(1), batch(3), batch(4)]
    fresh = from_fp32({"params": poisoned["params"]}, qat_model, batch(0))
    recalibrated = calibrate(qat_model, fresh, clean)
    # Dense_0 reads the batch itself: its moving-average range in float64.
    low, high = float(clean[0].min()), float(clean[0].max())
    for x in clean[1:]:
        low += AVERAGING * (float(x.astype(np.float64).min()) - low)
        high += AVERAGING * (float(x.astype(np.float64).max()) - high)
    stats = observer(recalibrated)
    np.testing.assert_allclose([float(stats["min"]), float(stats["max"])], [low, high], rtol=1e-6)
    output = int8_apply(qat_model, convert(recalibrated), batch(5))
    assert np.all(np.isfinite(np.asarray(output)))


def test_a_fresh_observer_is_no_non_finite_range_and_lifted_copies_are_checked_each():
    # +inf/-inf with num_batches 0 is the empty range of an observer that saw nothing.
    assert observed_range_finite(np.float32(np.inf), np.float32(-np.inf), np.int32(0))
    assert not observed_range_finite(np.float32(-1.0), np.float32(np.inf), np.int32(1))
    # One observer per copy of a layer under nn.scan/nn.vmap: (L,) leaves.
    low = np.array([-1.0, np.inf, -2.0], np.float32)
    high = np.array([1.0, -np.inf, np.nan], np.float32)
    assert observed_range_finite(low[:2], high[:2], np.array([3, 0], np.int32))
    assert not observed_range_finite(low, high, np.array([3, 0, 3], np.int32))
