"""`QATConfig` validation and `QuantizationObserver` against numpy and closed forms.

Includes the range updates of each observer kind (moving averages near float32's
maximum too), constant and non-finite batches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qat import FakeQuantize, QATConfig, QuantizationObserver
from qat.observers import compute_qparams

FLOAT32_MAX = float(np.finfo(np.float32).max)

EPS = np.finfo(np.float32).eps
RNG = np.random.default_rng(4)


def reference_qparams(low, high, qmin, qmax, symmetric):
    """PyTorch's observer formulas in numpy float32 (as PyTorch computes them)."""
    f32 = np.float32
    low, high = min(f32(low), f32(0)), max(f32(high), f32(0))
    if symmetric:
        return max(max(-low, high) / f32((qmax - qmin) / 2), f32(EPS)), 0
    scale = max((high - low) / f32(qmax - qmin), f32(EPS))
    return scale, int(np.clip(qmin - np.round(low / scale), qmin, qmax))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(bits=1), ValueError, r"bits must be in 2\.\.8 or None, got 1"),
        (dict(bits=9), ValueError, "got 9"),
        (dict(bits=8.0), TypeError, "bits must be an int"),
        (dict(bits=True), TypeError, "bits must be an int"),
        (dict(averaging_constant=0.0), ValueError, r"averaging_constant must be in \(0, 1\]"),
        (dict(averaging_constant=1.5), ValueError, "averaging_constant"),
        (dict(calibration_batches=0), ValueError, "calibration_batches must be >= 1"),
        (dict(observer="histogram"), ValueError, "observer must be one of"),
        (dict(symmetric=1), TypeError, "symmetric must be a bool"),
        (dict(channel_axis=0.5), TypeError, "channel_axis must be an int"),
        (
            dict(learnable_scale=True, lsq_clip_from="paper"),
            ValueError,
            r"QATConfig\.lsq_clip_from must be one of \('rounded', 'unrounded'\), got 'paper'",
        ),
        (dict(learnable_scale=True, lsq_clip_from=None), TypeError, "lsq_clip_from must be one"),
        # It chooses the gradient of a learned step size: without one it would do nothing.
        (dict(lsq_clip_from="unrounded"), ValueError, r"learnable_scale=False learns none"),
    ],
)
def test_config_rejects_invalid_fields_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        QATConfig(**kwargs)


@pytest.mark.parametrize(
    ("bits", "symmetric", "grid"),
    [(8, True, (-128, 127)), (8, False, (0, 255)), (4, True, (-8, 7)), (2, False, (0, 3))],
)
def test_config_integer_grid(bits, symmetric, grid):
    cfg = QATConfig(bits=bits, symmetric=symmetric)
    assert (cfg.qmin, cfg.qmax) == grid


def test_disabled_config_has_no_grid_and_no_observer():
    cfg = QATConfig(bits=None)
    assert not cfg.enabled
    with pytest.raises(ValueError, match="quantization disabled"):
        _ = cfg.qmax
    with pytest.raises(ValueError, match="quantization disabled"):
        QuantizationObserver.create(cfg)


def test_minmax_observer_keeps_the_running_extremes():
    rng = np.random.default_rng(0)
    batches = [rng.normal(scale=s, size=(3, 5)).astype(np.float32) for s in (1.0, 4.0, 0.5)]
    observer = QuantizationObserver.create(QATConfig())
    for batch in batches:
        observer = observer.observe(batch)
    everything = np.stack(batches)
    assert float(observer.min_val) == everything.min()
    assert float(observer.max_val) == everything.max()
    assert int(observer.num_batches) == 3


@given(
    st.lists(
        st.tuples(st.floats(-50, 0, width=32), st.floats(0, 50, width=32)), min_size=1, max_size=6
    ),
    st.sampled_from([0.01, 0.1, 0.5, 1.0]),
)
def test_moving_average_matches_its_closed_form(ranges, constant):
    observer = QuantizationObserver.create(
        QATConfig(observer="moving_average", averaging_constant=constant)
    )
    for low, high in ranges:
        observer = observer.observe(np.array([low, high, (low + high) / 2], np.float32))
    # m_n = (1-c)^(n-1) m_1 + sum_{k=2..n} c (1-c)^(n-k) m_k
    n = len(ranges)
    for index, value in ((0, observer.min_val), (1, observer.max_val)):
        series = np.array([r[index] for r in ranges], np.float64)
        weights = np.array(
            [(1 - constant) ** (n - 1)]
            + [constant * (1 - constant) ** (n - k) for k in range(2, n + 1)]
        )
        np.testing.assert_allclose(float(value), weights @ series, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("kind", ["minmax", "moving_average"])
def test_per_channel_observer_reduces_every_other_axis(axis, kind):
    rng = np.random.default_rng(1)
    first, second = rng.normal(size=(2, 2, 3, 4)).astype(np.float32)
    cfg = QATConfig(per_channel=True, channel_axis=axis, observer=kind, averaging_constant=0.25)
    observer = QuantizationObserver.create(cfg).observe(first).observe(second)
    others = tuple(i for i in range(3) if i != axis % 3)
    lows = [b.min(axis=others) for b in (first, second)]
    highs = [b.max(axis=others) for b in (first, second)]
    if kind == "minmax":
        expected = np.minimum(*lows), np.maximum(*highs)
    else:
        expected = lows[0] + 0.25 * (lows[1] - lows[0]), highs[0] + 0.25 * (highs[1] - highs[0])
    np.testing.assert_allclose(np.asarray(observer.min_val), expected[0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(observer.max_val), expected[1], rtol=1e-6)


@given(
    hnp.arrays(np.float32, st.integers(1, 8), elements=st.floats(-1e4, 1e4, width=32)),
    st.sampled_from([2, 4, 8]),
    st.booleans(),
)
@example(np.array([-1.0, 1.0], np.float32), 8, False)  # low / scale is a near-tie at -127.5
def test_qparams_follow_the_standard_formulas(x, bits, symmetric):
    cfg = QATConfig(bits=bits, symmetric=symmetric)
    scale, zero_point = QuantizationObserver.create(cfg).observe(x).qparams()
    expected_scale, expected_zero_point = reference_qparams(
        x.min(), x.max(), cfg.qmin, cfg.qmax, symmetric
    )
    np.testing.assert_allclose(float(scale), expected_scale, rtol=1e-6)
    assert int(zero_point) == expected_zero_point
    assert zero_point.dtype == jnp.int32


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize(
    "x",
    [
        np.full((4, 3), 2.5, np.float32),
        np.full((4, 3), -7.0, np.float32),
        np.zeros((5,), np.float32),
        np.array([3.0], np.float32),
        np.array([-3.0e38, 3.0e38], np.float32),
        # The formulas' grid end -128 * max / 127.5 passed float32's max: fq gave -inf.
        np.array([-FLOAT32_MAX, FLOAT32_MAX], np.float32),
        np.array([0.0, FLOAT32_MAX], np.float32),
        np.array([1.0e-30, 2.0e-30], np.float32),
    ],
    ids=[
        "constant",
        "negative-constant",
        "all-zero",
        "single",
        "huge",
        "float32-max",
        "float32-max-positive",
        "tiny",
    ],
)
def test_degenerate_inputs_give_finite_positive_qparams(x, symmetric):
    for kind in ("minmax", "moving_average"):
        cfg = QATConfig(symmetric=symmetric, observer=kind)
        observer = QuantizationObserver.create(cfg).observe(x)
        scale, zero_point = observer.qparams()
        assert np.isfinite(float(scale)) and float(scale) >= EPS
        assert cfg.qmin <= int(zero_point) <= cfg.qmax
        assert np.all(np.isfinite(np.asarray(FakeQuantize.from_observer(observer)(x))))


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_range_at_float32_max_keeps_every_value_within_a_step(symmetric):
    x = np.array([-FLOAT32_MAX, -1e38, 0.0, 1e38, FLOAT32_MAX], np.float32)
    observer = QuantizationObserver.create(QATConfig(symmetric=symmetric)).observe(x)
    scale, _ = observer.qparams()
    error = np.abs(np.asarray(FakeQuantize.from_observer(observer)(x), np.float64) - x)
    # A step, and the margin the capped scale keeps below float32's max (its 2**-20,
    # times the 128 steps from 0 to the grid's end).
    assert np.all(error <= float(scale) * (1 + 2**-12)), (error, float(scale))


def test_fresh_observer_is_uncalibrated_with_finite_qparams():
    for cfg in (QATConfig(), QATConfig(symmetric=False), QATConfig(per_channel=True)):
        observer = QuantizationObserver.create(cfg)
        assert not bool(observer.is_calibrated)
        scale, zero_point = observer.qparams()
        assert np.all(np.asarray(scale) == np.float32(EPS))
        assert np.all(np.asarray(zero_point) == 0)
    assert bool(QuantizationObserver.create(QATConfig()).observe(np.ones(2)).is_calibrated)


def test_constant_input_is_represented_exactly():
    x = np.full((6,), 2.5, np.float32)
    observer = QuantizationObserver.create(QATConfig(symmetric=False)).observe(x)
    np.testing.assert_allclose(np.asarray(FakeQuantize.from_observer(observer)(x)), x, rtol=1e-6)


def test_observe_is_pure_and_runs_inside_jit_and_scan():
    cfg = QATConfig(per_channel=True, channel_axis=0, observer="moving_average")
    batches = jnp.arange(24.0).reshape(4, 3, 2)
    start = QuantizationObserver.create(cfg, num_channels=3)

    @jax.jit
    def run(observer, batches):
        return jax.lax.scan(lambda obs, batch: (obs.observe(batch), None), observer, batches)[0]

    scanned = run(start, batches)
    eager = start
    for batch in batches:
        eager = eager.observe(batch)
    assert not bool(start.is_calibrated)  # the input observer is unchanged
    np.testing.assert_allclose(np.asarray(scanned.min_val), np.asarray(eager.min_val))
    np.testing.assert_allclose(np.asarray(scanned.max_val), np.asarray(eager.max_val))
    assert int(scanned.num_batches) == 4


def test_observed_values_carry_no_gradient():
    def loss(x):
        observer = QuantizationObserver.create(QATConfig()).observe(x)
        return observer.qparams()[0]

    assert float(jax.grad(loss)(jnp.array([1.0, -2.0]))[0]) == 0.0


@pytest.mark.parametrize(
    ("cfg", "x", "error", "match"),
    [
        (QATConfig(), np.zeros((0, 3), np.float32), ValueError, "at least one element"),
        (QATConfig(), np.arange(3), TypeError, "floating"),
        (QATConfig(per_channel=True, channel_axis=2), np.ones((2, 2)), ValueError, "out of range"),
    ],
)
def test_observe_rejects_bad_input(cfg, x, error, match):
    with pytest.raises(error, match=match):
        QuantizationObserver.create(cfg).observe(x)


def test_per_channel_observer_rejects_a_channel_count_change():
    observer = QuantizationObserver.create(QATConfig(per_channel=True)).observe(np.ones((2, 3)))
    with pytest.raises(ValueError, match="4 channels on axis -1, the observer has 3"):
        observer.observe(np.ones((2, 4)))


def test_moving_average_of_ranges_near_float32_max_stays_finite():
    # min_val + c * (new - min_val) overflowed to +inf for new - min_val > 3.4e38, and a
    # min_val of +inf reads as "nothing observed": the negative side of the range vanished.
    cfg = QATConfig(symmetric=False, observer="moving_average", averaging_constant=0.01)
    observer = QuantizationObserver.create(cfg)
    observer = observer.observe(np.array([-3e38, 3e38], np.float32))
    observer = observer.observe(np.array([3e38, 3e38], np.float32))
    expected_min = -3e38 + 0.01 * (3e38 - -3e38)
    np.testing.assert_allclose(float(observer.min_val), expected_min, rtol=1e-6)
    np.testing.assert_allclose(float(observer.max_val), 3e38, rtol=1e-6)
    scale, zero_point = observer.qparams()
    expected_scale = (3e38 - expected_min) / 255
    np.testing.assert_allclose(float(scale), expected_scale, rtol=1e-5)
    assert int(zero_point) == round(-expected_min / expected_scale)


def test_moving_average_of_ordinary_ranges_keeps_the_difference_form():
    # The overflow branch must not change ordinary updates: m + c * (new - m) in float32.
    cfg = QATConfig(symmetric=False, observer="moving_average", averaging_constant=0.3)
    observer = QuantizationObserver.create(cfg)
    batches = [RNG.normal(size=(5, 3)).astype(np.float32) * (i + 1) for i in range(4)]
    low = high = None
    for batch in batches:
        observer = observer.observe(batch)
        new_low, new_high = np.float32(batch.min()), np.float32(batch.max())
        if low is None:
            low, high = new_low, new_high
        else:
            low = np.float32(low + np.float32(0.3) * (new_low - low))
            high = np.float32(high + np.float32(0.3) * (new_high - high))
    assert float(observer.min_val) == pytest.approx(float(low), rel=1e-6)
    assert float(observer.max_val) == pytest.approx(float(high), rel=1e-6)


def test_observer_first_update_sets_the_range_then_each_kind_follows_its_rule():
    first, second = jnp.array([-1.0, 2.0]), jnp.array([-3.0, 1.0])
    minmax = QuantizationObserver.create(QATConfig(symmetric=False)).observe(first)
    average = QuantizationObserver.create(
        QATConfig(symmetric=False, observer="moving_average", averaging_constant=0.25)
    ).observe(first)
    for observer in (minmax, average):
        assert (float(observer.min_val), float(observer.max_val)) == (-1.0, 2.0)
        assert int(observer.num_batches) == 1
    minmax, average = minmax.observe(second), average.observe(second)
    assert (float(minmax.min_val), float(minmax.max_val)) == (-3.0, 2.0)
    assert float(average.min_val) == pytest.approx(-1.0 + 0.25 * (-3.0 + 1.0))
    assert float(average.max_val) == pytest.approx(2.0 + 0.25 * (1.0 - 2.0))


@pytest.mark.parametrize("value", [0.0, -3.0, 2.5])
def test_observer_of_a_constant_tensor_gives_a_finite_scale_that_keeps_the_value(value):
    for symmetric in (True, False):
        observer = QuantizationObserver.create(QATConfig(symmetric=symmetric))
        observer = observer.observe(jnp.full((3, 2), value))
        scale, _ = observer.qparams()
        assert np.isfinite(float(scale)) and float(scale) > 0
        quantizer = FakeQuantize.from_observer(observer)
        np.testing.assert_allclose(
            np.asarray(quantizer(jnp.full((4,), value))), value, atol=float(scale)
        )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_observer_refuses_a_non_finite_batch_by_name(bad):
    observer = QuantizationObserver.create(QATConfig(observer="moving_average"))
    with pytest.raises(ValueError, match="finite"):
        observer.observe(jnp.array([0.0, bad]))


# ---------------------------------------------------------------------------
# observe(x, mask): padding never enters the range


def masked_reference(batches, masks, kind, constant, channel_axis):
    """Float64 `(min, max, num_batches)` of the selected elements, from the observer rules.

    Per slice (the tensor, or each channel): min-max keeps the extremes of
    every selected element; the moving average takes the first batch that
    selects anything in the slice, then `m += c * (batch_m - m)` for each
    later batch that does. Batches selecting nothing at all are not counted.
    """
    low = high = None
    count = 0
    for x, mask in zip(batches, masks, strict=True):
        x = np.asarray(x, np.float64)
        mask = np.broadcast_to(mask, x.shape)
        if channel_axis is None:
            slices = [(x[mask], None)]
        else:
            moved_x = np.moveaxis(x, channel_axis, 0)
            moved_mask = np.moveaxis(mask, channel_axis, 0)
            slices = [(moved_x[c][moved_mask[c]], c) for c in range(moved_x.shape[0])]
        if low is None:
            low = np.full(len(slices), np.inf)
            high = np.full(len(slices), -np.inf)
        count += int(mask.any())
        for index, (values, _) in enumerate(slices):
            if values.size == 0:
                continue
            if kind == "minmax" or not np.isfinite(low[index]):
                low[index] = min(low[index], values.min()) if kind == "minmax" else values.min()
                high[index] = max(high[index], values.max()) if kind == "minmax" else values.max()
            else:
                low[index] += constant * (values.min() - low[index])
                high[index] += constant * (values.max() - high[index])
    if channel_axis is None:
        return low[0], high[0], count
    return low, high, count


@pytest.mark.parametrize("kind", ["minmax", "moving_average"])
@pytest.mark.parametrize("channel_axis", [None, 1, -1])
def test_masked_observe_matches_numpy_over_several_batches(kind, channel_axis):
    rng = np.random.default_rng(11)
    shape = (5, 3, 4)
    batches, masks = [], []
    for index, mask_shape in enumerate([shape, (5, 1, 4), (5, 3, 1), shape, shape]):
        x = rng.normal(scale=1.0 + index, size=shape).astype(np.float32)
        mask = rng.uniform(size=mask_shape) < 0.6
        if index == 1:
            mask[:, :, 2] = False  # one channel of the last axis unselected in a batch
        if index == 3:
            mask[:] = False  # a batch of padding only: not counted
        x[~np.broadcast_to(mask, shape)] = np.where(index % 2, np.nan, 1e6)  # padding values
        batches.append(x)
        masks.append(mask)
    cfg = QATConfig(
        per_channel=channel_axis is not None,
        channel_axis=-1 if channel_axis is None else channel_axis,
        observer=kind,
        averaging_constant=0.3,
    )
    observer = QuantizationObserver.create(cfg)
    for x, mask in zip(batches, masks, strict=True):
        observer = observer.observe(x, mask=mask)
    low, high, count = masked_reference(batches, masks, kind, 0.3, channel_axis)
    np.testing.assert_allclose(np.asarray(observer.min_val), low, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(observer.max_val), high, rtol=1e-6)
    assert int(observer.num_batches) == count == 4
    # Under jax.jit too, where nothing is checked on the host.
    step = jax.jit(lambda obs, x, mask: obs.observe(x, mask=mask))
    jitted = QuantizationObserver.create(cfg)
    for x, mask in zip(batches, masks, strict=True):
        jitted = step(jitted, x, np.broadcast_to(mask, x.shape))
    # (XLA may fuse the average's multiply-add: the same to float32 rounding.)
    np.testing.assert_allclose(np.asarray(jitted.min_val), low, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jitted.max_val), high, rtol=1e-6)
    assert int(jitted.num_batches) == count


def test_a_channel_first_selected_late_starts_its_moving_average_there():
    # Channel 1 is padding in the first batch: its range is set by the second, not
    # averaged from the empty (+inf, -inf) range.
    cfg = QATConfig(per_channel=True, channel_axis=1, observer="moving_average")
    first = np.float32([[-1.0, 99.0], [2.0, 99.0]])
    second = np.float32([[-3.0, -5.0], [4.0, 6.0]])
    observer = QuantizationObserver.create(cfg).observe(first, mask=np.array([True, False]))
    np.testing.assert_array_equal(np.asarray(observer.min_val), [-1.0, np.inf])
    observer = observer.observe(second, mask=np.array([True, True]))
    np.testing.assert_allclose(np.asarray(observer.min_val), [-1.0 + 0.01 * (-3.0 + 1.0), -5.0])
    np.testing.assert_allclose(np.asarray(observer.max_val), [2.0 + 0.01 * (4.0 - 2.0), 6.0])


def test_a_mask_of_all_true_observes_exactly_as_no_mask():
    x = np.random.default_rng(12).normal(size=(4, 3)).astype(np.float32)
    for kind in ("minmax", "moving_average"):
        cfg = QATConfig(observer=kind)
        plain = QuantizationObserver.create(cfg).observe(x).observe(x * 2)
        masked = QuantizationObserver.create(cfg).observe(x, mask=np.ones_like(x, bool))
        masked = masked.observe(x * 2, mask=np.ones_like(x, bool))
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(masked), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    ("x", "mask", "error", "match"),
    [
        (np.ones((2, 3), np.float32), np.ones(3, np.int32), TypeError, "mask must be a boolean"),
        (
            np.ones((2, 3), np.float32),
            np.ones(2, bool),
            ValueError,
            r"mask of shape \(2,\) must broadcast to x's shape \(2, 3\)",
        ),
        (
            np.float32([np.nan, 1.0, np.inf]),
            np.array([True, True, False]),
            ValueError,
            r"x must be finite where mask is True: it holds 1 NaN or inf",
        ),
    ],
)
def test_masked_observe_names_a_bad_mask_and_selected_non_finite_values(x, mask, error, match):
    with pytest.raises(error, match=match):
        QuantizationObserver.create(QATConfig()).observe(x, mask=mask)


@pytest.mark.parametrize(("qmin", "qmax"), [(0, 255), (-128, 127), (0, 15)])
def test_affine_qparams_of_ranges_reaching_float32_max_keep_both_grid_ends_finite(qmin, qmax):
    # Every grid point `(q - zero_point) * scale` must be a finite float32 (the module
    # docstring), for any zero point the range gives: checked in NumPy float32 products.
    top = np.float32(FLOAT32_MAX)
    for fraction in np.linspace(0.0, 1.0, 41):
        far = np.float32(top * fraction)
        for low, high in ((-far, top), (-top, far)):
            scale, zero_point = compute_qparams(low, high, qmin, qmax, symmetric=False)
            scale, zero_point = np.float32(scale), int(zero_point)
            with np.errstate(over="ignore"):
                ends = np.float32([qmin - zero_point, qmax - zero_point]) * scale
            assert np.all(np.isfinite(ends)), (qmin, qmax, float(low), float(high), zero_point)
