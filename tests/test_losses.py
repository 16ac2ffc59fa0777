"""Tests of the quantile loss and the paper's q-risk (`tft_jax.losses`).

Reference: the TFT paper's equations written here in float64 NumPy (Lim et
al. 2021): `QL(y, ŷ, q) = q (y - ŷ)_+ + (1 - q) (ŷ - y)_+` and the normalized
`q-Risk = 2 Σ QL(y, ŷ, q) / Σ |y|`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tft_jax.losses import q_risk, quantile_loss

QUANTILES = (0.1, 0.5, 0.9)


def numpy_ql(pred: np.ndarray, target: np.ndarray, q: float) -> np.ndarray:
    """The paper's quantile loss per element, in float64."""
    error = target.astype(np.float64) - pred.astype(np.float64)
    return q * np.maximum(error, 0.0) + (1.0 - q) * np.maximum(-error, 0.0)


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    pred = rng.standard_normal((3, 5, len(QUANTILES))).astype(np.float32)
    target = rng.standard_normal((3, 5)).astype(np.float32)
    return pred, target


def test_quantile_loss_and_q_risk_equal_the_papers_float64_formulas() -> None:
    pred, target = _data()
    want = np.mean([numpy_ql(pred[..., i], target, q) for i, q in enumerate(QUANTILES)])
    np.testing.assert_allclose(float(quantile_loss(pred, target, QUANTILES)), want, rtol=1e-6)
    for i, q in enumerate(QUANTILES):
        risk = 2.0 * numpy_ql(pred[..., i], target, q).sum() / np.abs(target).sum()
        np.testing.assert_allclose(float(q_risk(pred[..., i], target, q)), risk, rtol=1e-6)


def test_quantile_loss_of_no_values_raises_instead_of_returning_nan() -> None:
    # The mean over an empty batch was 0 / 0: a NaN loss, silently.
    with pytest.raises(ValueError, match=r"quantile_loss: pred and target hold no values"):
        quantile_loss(np.zeros((0, 3), np.float32), np.zeros((0,), np.float32), QUANTILES)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["pred", "target"])
def test_a_non_finite_concrete_input_raises_naming_it_and_its_index(bad: float, name: str) -> None:
    # Before: a NaN (or inf) loss and risk, silently.
    pred, target = _data()
    if name == "pred":
        pred[1, 2, 0] = bad
        loss_index, risk_index = r"\(1, 2, 0\)", r"\(1, 2\)"
    else:
        target[1, 2] = bad
        loss_index = risk_index = r"\(1, 2\)"
    with pytest.raises(
        ValueError, match=rf"quantile_loss: {name} holds 1 non-finite.*{loss_index}"
    ):
        quantile_loss(pred, target, QUANTILES)
    with pytest.raises(ValueError, match=rf"q_risk: {name} holds 1 non-finite.*{risk_index}"):
        q_risk(pred[..., 0], target, 0.1)
    # Traced values are not checked (no host round trip inside a compiled step).
    assert not np.isfinite(
        float(jax.jit(lambda p, t: quantile_loss(p, t, QUANTILES))(pred, target))
    )


def test_a_traced_level_under_jit_raises_type_error_naming_it() -> None:
    pred, target = _data()
    # Before: a ConcretizationTypeError / TracerArrayConversionError from deep in JAX.
    with pytest.raises(TypeError, match=r"q_risk: q must be concrete.*static argument"):
        jax.jit(lambda q: q_risk(pred[..., 1], target, q))(0.5)
    with pytest.raises(TypeError, match=r"quantile_loss: quantiles must be concrete"):
        jax.jit(lambda levels: quantile_loss(pred, target, levels))(jnp.asarray(QUANTILES))
    # Concrete levels inside a jitted function are fine.
    jitted = jax.jit(lambda p, t: q_risk(p, t, 0.5))(pred[..., 1], target)
    np.testing.assert_allclose(float(jitted), float(q_risk(pred[..., 1], target, 0.5)), rtol=1e-6)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p, t: q_risk(p[..., 1], t, "0.5"), r"q_risk: q must be numbers"),
        (lambda p, t: q_risk(p[..., 1], t, None), r"q_risk: q must be numbers"),
        (lambda p, t: quantile_loss(p, t, "abc"), r"quantile_loss: quantiles must be numbers"),
        (
            lambda p, t: q_risk(p[..., 1] + 1j, t, 0.5),
            r"q_risk: pred must be a real-valued array, got dtype complex",
        ),
        (
            lambda p, t: quantile_loss(p, t.astype(str), QUANTILES),
            r"quantile_loss: target must be a real-valued array",
        ),
    ],
    ids=["q_string", "q_none", "quantiles_string", "complex_pred", "string_target"],
)
def test_inputs_that_are_not_real_numbers_raise_type_error_naming_them(
    call: Any, message: str
) -> None:
    # A complex prediction lost its imaginary part silently (q-risk 0.0 for a
    # wrong forecast); strings and None failed deep in NumPy or JAX.
    pred, target = _data()
    with pytest.raises(TypeError, match=message):
        call(pred, target)


def test_integer_and_boolean_targets_are_taken_as_float32() -> None:
    pred, _ = _data()
    counts = np.arange(15).reshape(3, 5)
    want = np.mean([numpy_ql(pred[..., i], counts, q) for i, q in enumerate(QUANTILES)])
    np.testing.assert_allclose(float(quantile_loss(pred, counts, QUANTILES)), want, rtol=1e-6)
    flags = counts % 2 == 0
    risk = 2.0 * numpy_ql(pred[..., 2], flags, 0.9).sum() / flags.sum()
    np.testing.assert_allclose(float(q_risk(pred[..., 2], flags, 0.9)), risk, rtol=1e-6)


def test_q_risk_of_no_values_says_so_instead_of_a_zero_target_sum() -> None:
    with pytest.raises(ValueError, match=r"q_risk: pred and target hold no values \(shape \(0,"):
        q_risk(np.zeros((0, 3)), np.zeros((0, 3)), 0.5)


def _large_targets() -> tuple[np.ndarray, np.ndarray]:
    """Targets near 1e8 (a meter reading) with predictions a few units off, in float64."""
    rng = np.random.default_rng(3)
    target = 1e8 + rng.uniform(0.0, 1000.0, (4, 50))
    pred = target[..., None] + rng.normal(0.0, 3.0, (4, 50, len(QUANTILES)))
    return pred, target


def test_float64_numpy_inputs_keep_errors_far_below_float32_spacing() -> None:
    # Rounded to float32 before subtracting (a spacing of 8 at 1e8), errors of a few
    # units were lost: the q-risk was 13% off and the loss 8%.
    pred, target = _large_targets()
    expected = np.mean([numpy_ql(pred[..., i], target, q) for i, q in enumerate(QUANTILES)])
    got = quantile_loss(pred, target, QUANTILES)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    median = pred[..., 1]
    risk = 2.0 * numpy_ql(median, target, 0.5).sum() / np.abs(target).sum()
    np.testing.assert_allclose(float(q_risk(median, target, 0.5)), risk, rtol=1e-5)


def test_float64_inputs_under_x64_give_a_float64_loss() -> None:
    pred, target = _large_targets()
    expected = np.mean([numpy_ql(pred[..., i], target, q) for i, q in enumerate(QUANTILES)])
    with jax.enable_x64(True):
        got = quantile_loss(jnp.asarray(pred), jnp.asarray(target), QUANTILES)
        risk = q_risk(jnp.asarray(pred[..., 1]), jnp.asarray(target), 0.5)
    assert got.dtype == jnp.float64 and risk.dtype == jnp.float64
    np.testing.assert_allclose(float(got), expected, rtol=1e-12)
    reference = 2.0 * numpy_ql(pred[..., 1], target, 0.5).sum() / np.abs(target).sum()
    np.testing.assert_allclose(float(risk), reference, rtol=1e-12)


def test_int64_targets_beyond_int32_are_not_wrapped() -> None:
    # jnp.asarray of an int64 NumPy array (x64 off) wrapped 3e9 to -1.29e9: the q-risk's
    # denominator was 4x off, and a JAX pred's loss was ~2e9 instead of 1.
    target = np.array([3_000_000_001, 5_000_000_000], np.int64)
    pred = target.astype(np.float64) - 1.0  # exactly 1 below each target
    risk = 2.0 * numpy_ql(pred, target, 0.5).sum() / np.abs(target.astype(np.float64)).sum()
    np.testing.assert_allclose(float(q_risk(pred, target, 0.5)), risk, rtol=1e-6)
    levels = (0.5,)
    device_pred = jnp.asarray(target, jnp.float32)[:, None]  # float32: 3e9 and 5e9 exactly
    expected = np.mean(numpy_ql(np.asarray(device_pred)[:, 0], target, 0.5))
    got = quantile_loss(device_pred, target, levels)
    np.testing.assert_allclose(float(got), expected, rtol=1e-6)


def _pinball64(pred: np.ndarray, target: np.ndarray, levels: np.ndarray) -> np.ndarray:
    error = target[..., None].astype(np.float64) - pred.astype(np.float64)
    return np.maximum(levels * error, (levels - 1.0) * error)


def test_quantile_loss_with_unsorted_levels_equals_float64_numpy() -> None:
    rng = np.random.default_rng(3)
    levels = np.array([0.9, 0.02, 0.5, 0.25])
    pred = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    target = rng.standard_normal((2, 3, 5)).astype(np.float32)
    want = _pinball64(pred, target, levels).mean()
    np.testing.assert_allclose(float(quantile_loss(pred, target, levels)), want, rtol=1e-6)


def test_quantile_loss_gradient_is_the_pinball_slope_and_a_subgradient_at_zero_error() -> None:
    levels = (0.1, 0.9)
    target = jnp.zeros(3)
    pred = jnp.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    grad = np.asarray(jax.grad(lambda p: quantile_loss(p, target, levels))(pred))
    count = pred.size
    # d/dŷ of max(q e, (q - 1) e), e = y - ŷ: -q where e > 0, 1 - q where e < 0.
    np.testing.assert_allclose(grad[0, 0], -0.1 / count, rtol=1e-6)
    np.testing.assert_allclose(grad[1, 0], 0.9 / count, rtol=1e-6)
    np.testing.assert_allclose(grad[2, 1], 0.1 / count, rtol=1e-6)
    # At zero error any slope in [-q, 1 - q] is a subgradient; JAX's max splits the tie.
    for row, column, q in ((0, 1, 0.9), (1, 1, 0.9), (2, 0, 0.1)):
        assert -q / count - 1e-9 <= grad[row, column] <= (1.0 - q) / count + 1e-9


def test_q_risk_is_float32_under_x64_with_a_numpy_float64_level() -> None:
    rng = np.random.default_rng(4)
    pred = rng.standard_normal(6).astype(np.float32)
    target = rng.standard_normal(6).astype(np.float32)
    with jax.enable_x64(True):
        risk = q_risk(pred, target, np.float64(0.9))
    assert risk.dtype == jnp.float32
    want = 2.0 * _pinball64(pred[:, None], target, np.array([0.9])).sum() / np.abs(target).sum()
    np.testing.assert_allclose(float(risk), want, rtol=1e-6)


def test_numpy_inputs_near_float32_max_are_summed_in_float64() -> None:
    # The float32 sums of 1000 values of 3e37 overflowed: q_risk was NaN (inf / inf)
    # and quantile_loss inf. Closed form: e = y, QL_0.5 = y / 2, risk = 2 Σ(y/2) / Σ y = 1.
    target = np.full(1000, 3e37)
    pred = np.zeros(1000)
    risk = q_risk(pred, target, 0.5)
    loss = quantile_loss(pred[:, None], target, [0.5])
    assert risk.dtype == jnp.float32 and loss.dtype == jnp.float32
    np.testing.assert_allclose(float(risk), 1.0, rtol=1e-6)
    np.testing.assert_allclose(float(loss), 1.5e37, rtol=1e-6)
    # float32 NumPy inputs take the same host path.
    np.testing.assert_allclose(
        float(q_risk(pred.astype(np.float32), target.astype(np.float32), 0.5)), 1.0, rtol=1e-6
    )


@pytest.mark.parametrize("name", ["pred", "target"])
def test_finite_inputs_beyond_float32_are_refused_as_out_of_range_not_non_finite(
    name: str,
) -> None:
    pred, target = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    if name == "pred":
        pred[1] = 1e39
    else:
        target[1] = -1e39
    for call, function in (
        (lambda: q_risk(pred, target, 0.5), "q_risk"),
        (lambda: quantile_loss(pred[:, None], target, [0.5]), "quantile_loss"),
    ):
        with pytest.raises(ValueError, match=rf"{function}: {name} holds 1 finite") as caught:
            call()
        message = str(caught.value)
        assert "beyond float32's range" in message and "index (1," in message
        assert "non-finite" not in message


def test_a_result_beyond_float32_is_refused_instead_of_inf() -> None:
    # Each input fits float32, but the loss 0.9 * 6e38 does not.
    with pytest.raises(
        ValueError, match=r"quantile_loss: the result 5.40*\d*e\+38 .* float32's range"
    ):
        quantile_loss(np.array([[-3e38]]), np.array([3e38]), [0.9])
    # A risk over a tiny denominator, likewise.
    with pytest.raises(ValueError, match=r"q_risk: the result .* float32's range"):
        q_risk(np.array([3e38]), np.array([1e-30]), 0.5)


def test_a_concrete_jax_float32_sum_that_overflows_raises() -> None:
    # On the device the float32 sum overflows; a concrete result says so instead of NaN.
    target = jnp.full(1000, 3e37, jnp.float32)
    pred = jnp.zeros(1000, jnp.float32)
    with pytest.raises(ValueError, match=r"q_risk: the float32 sum overflowed"):
        q_risk(pred, target, 0.5)
    with pytest.raises(ValueError, match=r"quantile_loss: the float32 sum overflowed"):
        quantile_loss(jnp.full((1000, 1), -3e38, jnp.float32), target, [0.5])
    # A finite numerator over an overflowed denominator: a ratio of 0 (0.001 in float64).
    with pytest.raises(ValueError, match=r"q_risk: the float32 sum overflowed"):
        q_risk(0.999 * target, target, 0.5)
    # Under jit the documented float32 semantics hold (not checked, no host round trip).
    assert not np.isfinite(float(jax.jit(lambda p, t: q_risk(p, t, 0.5))(pred, target)))


def test_device_q_risk_of_mixed_sign_targets_divides_by_the_sum_of_their_magnitudes() -> None:
    # Reference: 2·Σ QL / Σ|y| in float64 NumPy; on JAX arrays (the device path, eager and
    # under jit). The targets sum to 0.6 while their magnitudes sum to 23.4.
    target = np.array([[3.0, -5.0, 2.0, 0.5], [-1.0, 4.0, -6.0, 1.9]], np.float32)
    pred = target + np.array([[0.5, -1.0, 2.5, 0.0], [1.0, -0.75, 0.25, -2.0]], np.float32)
    jitted = jax.jit(q_risk, static_argnums=2)
    for q in QUANTILES:
        reference = 2.0 * numpy_ql(pred, target, q).sum() / np.abs(target.astype(np.float64)).sum()
        eager = q_risk(jnp.asarray(pred), jnp.asarray(target), q)
        traced = jitted(jnp.asarray(pred), jnp.asarray(target), q)
        np.testing.assert_allclose([float(eager), float(traced)], reference, rtol=1e-6)


# ---------------------------------------------------------------------------
# Input-validation gaps: a boolean prediction


def test_a_boolean_prediction_is_refused() -> None:
    # Before: cast to 0.0/1.0 silently (the docstring promised TypeError for non-reals).
    pred, target = _data()
    flags = pred > 0
    with pytest.raises(
        TypeError, match=r"quantile_loss: pred must hold real numbers .*, got dtype bool"
    ):
        quantile_loss(flags, target, QUANTILES)
    with pytest.raises(TypeError, match=r"q_risk: pred must hold real numbers .*, got dtype bool"):
        q_risk(jnp.asarray(flags[..., 0]), target, 0.5)
    # A NumPy float level is a level.
    assert np.isfinite(float(q_risk(pred[..., 0], target, np.float32(0.5))))
