"""`properties.strategies` draws valid configs and inputs, reaches edge cases, shrinks small."""

from __future__ import annotations

import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import find, given, settings

from properties import strategies as st_tft
from qat.config import QATConfig
from tft_jax.config import TFTConfig


@given(st_tft.attention_configs(), st_tft.data())
def test_attention_configs_use_buckets_and_heads_divide_hidden(config, data):
    assert config.hidden_dim in st_tft.ATTENTION_HIDDEN_DIMS
    assert config.hidden_dim % config.num_heads == 0
    assert config.sequence_length in st_tft.SEQUENCE_LENGTHS
    assert config.batch_size in st_tft.BATCH_SIZES
    x = data.draw(st_tft.attention_inputs(config))
    assert isinstance(x, np.ndarray)
    assert x.shape == config.input_shape
    assert x.dtype == np.float32
    assert np.isfinite(x).all()


_BOUNDS = {
    "large": st_tft.LARGE_MAGNITUDE,
    "tiny": st_tft.TINY_MAGNITUDE,
    "elements": st_tft.LARGE_MAGNITUDE,
    "zeros": 0.0,
}


@given(
    st.sampled_from(["normal", "large", "tiny", "constant", "zeros", "huge", "elements"]),
    st.sampled_from([np.float32, jnp.bfloat16]),
    st.data(),
)
def test_each_input_kind_has_its_magnitude_and_dtype(kind, dtype, data):
    x = data.draw(st_tft.float_arrays((2, 5, 3), kinds=(kind,), dtype=dtype))
    assert x.dtype == np.dtype(dtype)
    wide = x.astype(np.float64)
    assert np.isfinite(wide).all()
    if kind in _BOUNDS:
        assert np.abs(wide).max() <= _BOUNDS[kind] * (1 + 1e-2)
    if kind == "constant":
        assert (wide == wide[:, :1]).all()
    if kind == "huge":
        assert np.abs(wide).min() >= st_tft.HUGE_MAGNITUDE / 100 * (1 - 1e-2)
        assert np.isfinite(np.float32(wide.max()) - np.float32(wide.min()))


@given(st_tft.tft_configs(), st_tft.data())
def test_tft_inputs_match_the_config_shapes(config, data):
    inputs = data.draw(st_tft.tft_inputs(config))
    batch = inputs.batch_size
    steps, horizon = config.sequence_length, config.prediction_horizon
    assert inputs.static.shape == (batch, config.num_static_features)
    assert inputs.historical.shape == (batch, steps, config.num_observed_features)
    assert inputs.future.shape == (batch, horizon, config.num_known_features)
    assert inputs.target.shape == (batch, horizon)
    if config.use_known_history:
        assert inputs.known_history.shape == (batch, steps, config.num_known_features)
    else:
        assert inputs.known_history is None
    if config.num_static_categoricals:
        assert inputs.static_categorical.shape == (batch, config.num_static_categoricals)
        assert inputs.static_categorical.dtype == np.int32
        cardinalities = np.array(config.static_categorical_cardinalities)
        assert (
            (inputs.static_categorical >= 0) & (inputs.static_categorical < cardinalities)
        ).all()
    else:
        assert inputs.static_categorical is None
    time_codes = {
        "future_categorical": (horizon, config.known_categorical_cardinalities),
        "known_categorical_history": (
            steps,
            config.known_categorical_cardinalities if config.use_known_history else (),
        ),
        "observed_categorical": (steps, config.observed_categorical_cardinalities),
    }
    for name, (length, cardinalities) in time_codes.items():
        codes = getattr(inputs, name)
        if not cardinalities:
            assert codes is None, name
            continue
        assert codes.shape == (batch, length, len(cardinalities)), name
        assert codes.dtype == np.int32
        assert ((codes >= 0) & (codes < np.array(cardinalities))).all(), name


def test_tft_configs_reach_zero_statics_categoricals_prescalers_and_seven_quantiles():
    assert find(st_tft.tft_configs(), lambda c: c.num_static_features == 0).num_static_inputs == 0
    assert find(st_tft.tft_configs(), lambda c: c.num_static_categoricals == 2)
    assert find(st_tft.tft_configs(), lambda c: c.variable_width < c.hidden_dim)
    assert find(st_tft.tft_configs(), lambda c: c.num_quantiles == 7)
    assert find(st_tft.tft_configs(), lambda c: c.num_known_categoricals == 2)
    assert find(st_tft.tft_configs(), lambda c: c.num_observed_categoricals == 2)


@given(st_tft.tft_configs(use_known_history=(True,), dtypes=("bfloat16",)), st_tft.data())
def test_bfloat16_configs_get_bfloat16_inputs(config, data):
    assert config.compute_dtype == jnp.bfloat16
    inputs = data.draw(st_tft.tft_inputs(config))
    for array in (inputs.static, inputs.historical, inputs.future, inputs.known_history):
        assert array.dtype == jnp.bfloat16


def test_presets_cover_every_edge_of_tft_configs():
    presets = st_tft.TFT_PRESETS
    assert {c.num_static_features for c in presets} >= {0, 2}
    assert {c.num_static_categoricals for c in presets} >= {0, 1, 2}
    assert {c.num_quantiles for c in presets} == {1, 3, 7}
    assert {c.use_known_history for c in presets} == {False, True}
    assert {c.attend_to_self for c in presets} == {False, True}
    assert {c.dropout_rate > 0 for c in presets} == {False, True}
    assert any(c.variable_width < c.hidden_dim for c in presets)
    assert {c.num_known_categoricals for c in presets} >= {0, 1, 2}
    assert {c.num_observed_categoricals for c in presets} >= {0, 1}
    assert any(c.num_known_categoricals and c.use_known_history for c in presets)
    bf16 = find(st_tft.tft_config_presets(dtype="bfloat16"), lambda c: c.hidden_dim == 16)
    assert bf16.dtype == "bfloat16"
    assert bf16.num_quantiles == 7


def test_configs_shrink_to_the_first_bucket_of_every_field():
    assert find(st_tft.attention_configs(), lambda c: True) == st_tft.AttentionConfig(8, 1, 1, 1)
    minimal = find(st_tft.tft_configs(), lambda c: c.hidden_dim == 16)
    assert minimal == TFTConfig(
        num_static_features=0,
        num_known_features=1,
        num_observed_features=1,
        hidden_dim=16,
        num_heads=1,
        sequence_length=4,
        prediction_horizon=1,
        quantiles=(0.5,),
        dropout_rate=0.0,
        static_categorical_cardinalities=(),
        variable_hidden_dim=None,
        attend_to_self=True,
        use_known_history=False,
    )


@given(st_tft.qat_configs())
def test_qat_configs_are_valid_and_per_tensor_ones_keep_the_default_axis(config):
    assert isinstance(config, QATConfig)
    assert config.bits in (8, 4)
    if not config.per_channel:
        assert config.channel_axis == -1


@given(st_tft.observer_batches())
def test_observer_batches_are_finite_float32(batch):
    assert batch.dtype == np.float32
    assert batch.size >= 1
    assert np.isfinite(batch).all()
    assert np.isfinite(batch.max() - batch.min())


def test_observer_batches_reach_degenerate_ranges():
    assert find(st_tft.observer_batches(), lambda b: b.size == 1 and b.ndim == 2).shape == (1, 1)
    assert find(st_tft.observer_batches(), lambda b: b.size > 1 and (b == 0).all()) is not None
    constant = find(st_tft.observer_batches(), lambda b: b.size > 1 and b.min() == b.max() != 0)
    assert constant.min() == constant.max()
    assert find(st_tft.observer_batches(), lambda b: np.abs(b).max() > 1e25) is not None


@settings(max_examples=10, deadline=None, database=None)
@given(
    st_tft.observer_batches(kinds=("constant",), shapes=((4, 8), (2, 3, 4))),
    st_tft.observer_batch_sequences(kinds=("constant",), shapes=((4, 8),)),
)
def test_constant_observer_batches_hold_one_value_whatever_their_shape(batch, batches):
    # The documented degenerate range min == max, also for batches of several axes.
    for array in (batch, *batches):
        assert array.size > 1
        assert array.min() == array.max()


@given(st_tft.observer_batch_sequences())
def test_observer_batch_sequences_share_one_shape(batches):
    assert len(batches) in (1, 3)
    assert len({batch.shape for batch in batches}) == 1


@given(st_tft.fake_quantize_cases())
def test_fake_quantize_cases_hit_both_bounds_ties_and_saturation(case):
    assert case.x.dtype == np.float32
    codes = np.round(case.x / case.scale).astype(np.float64) + case.zero_point
    assert codes.min() < case.qmin and codes.max() > case.qmax
    assert case.qmin in codes and case.qmax in codes
    if case.qmin < 0:  # symmetric grid
        assert case.zero_point == 0
    assert case.qmin <= case.zero_point <= case.qmax


def test_strategy_arguments_are_validated_at_the_boundary():
    with pytest.raises(ValueError, match="hidden_dims must hold at least one bucket"):
        st_tft.attention_configs(hidden_dims=())
    with pytest.raises(ValueError, match="unknown \\['gaussian'\\]"):
        st_tft.float_arrays((2,), kinds=("gaussian",))
    with pytest.raises(TypeError, match="config must be a TFTConfig"):
        st_tft.tft_inputs({"hidden_dim": 8})
    with pytest.raises(TypeError, match="floating dtype"):
        st_tft.float_arrays((2,), dtype=np.int32)


def test_head_counts_come_from_the_num_heads_buckets_or_are_refused():
    # A hidden dim that no bucket divides used to get 1 head silently, a count
    # outside num_heads=(3,).
    with pytest.raises(ValueError, match=r"num_heads \(3,\) and hidden dims \[8, 16\]"):
        st_tft.attention_configs(num_heads=(3,))
    with pytest.raises(ValueError, match=r"num_heads \(3,\) and hidden dims \[8\]"):
        st_tft.tft_configs(hidden_dims=(8, 12), num_heads=(3,))
    config = find(st_tft.attention_configs(hidden_dims=(12,), num_heads=(3,)), lambda c: True)
    assert config.num_heads == 3


def test_constant_axis_is_validated_when_the_strategy_is_built():
    # These failed only when an example was drawn, with an IndexError/TypeError from inside.
    with pytest.raises(ValueError, match=r"constant_axis=-3 is out of range for shape \(2, 3\)"):
        st_tft.float_arrays((2, 3), kinds=("constant",), constant_axis=-3)
    with pytest.raises(TypeError, match=r"constant_axis must be an int or None, got 1\.0"):
        st_tft.float_arrays((2, 3), kinds=("constant",), constant_axis=1.0)
    last = find(st_tft.float_arrays((2, 3), kinds=("constant",), constant_axis=-1), lambda a: True)
    assert (last == last[:, :1]).all()


# Mutants T4 (strategies.py:202, "large" drawn from uniform(0, 1e4): one-signed) and
# T5 (strategies.py:211, "huge" signs drawn from (1.0, 1.0): all positive). The docstring
# promises "uniform in ±1e4" and "random signs"; 64 draws of one sign have probability 2^-63.
@settings(max_examples=5, deadline=None, database=None)
@given(st.sampled_from(["large", "huge"]), st.data())
def test_large_and_huge_kinds_take_both_signs(kind, data):
    x = data.draw(st_tft.float_arrays((64,), kinds=(kind,), dtype=np.float64))
    assert x.min() < 0 < x.max()
    magnitude = st_tft.LARGE_MAGNITUDE if kind == "large" else st_tft.HUGE_MAGNITUDE
    assert np.abs(x).max() > magnitude / 10  # spread over the range, not near 0


# Mutant T6 (strategies.py:213, `len(shape) <= constant_axis` -> `<`): an axis one past the
# last (documented: "an axis beyond the shape's last: one value for the whole array") raised
# IndexError when drawn.
@pytest.mark.parametrize(("shape", "axis"), [((3,), 1), ((2, 3), 2), ((2, 3), 5)])
def test_a_constant_axis_beyond_the_last_gives_one_value_everywhere(shape, axis):
    x = find(st_tft.float_arrays(shape, kinds=("constant",), constant_axis=axis), lambda a: True)
    assert x.shape == shape
    assert (x == x.flat[0]).all()


# Mutant T7 (strategies.py:258, `constant_axis < -len(shape)` -> `<=`): the first axis given
# as -ndim was refused.
def test_a_constant_axis_of_minus_ndim_is_the_first_axis():
    x = find(st_tft.float_arrays((2, 3), kinds=("constant",), constant_axis=-2), lambda a: True)
    assert (x == x[:1]).all()  # constant along axis 0 ...
    y = find(
        st_tft.float_arrays((2, 3), kinds=("constant",), constant_axis=-2),
        lambda a: a[0, 0] != a[0, 1],
    )
    assert (y == y[:1]).all()  # ... and not merely one value everywhere


# Mutants T10 (strategies.py:434, right: `steps < n` -> `steps <= n`: never an empty row),
# T11 (strategies.py:436, left: `steps >= T - n` -> `steps > T - n`: never a full row) and
# T12 (strategies.py:438, one: position drawn in [0, T] -> may be no real step). Reference:
# the documented shapes -- right is a real prefix of length in [0, T], left a real suffix of
# length in [0, T], one exactly one real step.
_MASK_CONFIG = st_tft.AttentionConfig(hidden_dim=8, num_heads=1, sequence_length=4, batch_size=1)


def _real_steps(kind):
    return st_tft.padding_masks(_MASK_CONFIG, kinds=(kind,)).map(lambda m: m[0])


@pytest.mark.parametrize("kind", ["right", "left"])
def test_right_and_left_padding_reach_every_length_from_none_to_all(kind):
    for length in range(5):
        row = find(_real_steps(kind), lambda r, n=length: r.sum() == n)
        expected = np.arange(4) < length if kind == "right" else np.arange(4) >= 4 - length
        np.testing.assert_array_equal(row, expected)


@settings(max_examples=30, deadline=None, database=None)
@given(st_tft.padding_masks(st_tft.AttentionConfig(8, 1, 4, 3), kinds=("one",)))
def test_one_kind_masks_hold_exactly_one_real_step_per_row(mask):
    np.testing.assert_array_equal(mask.sum(axis=1), np.ones(3))


# Mutant T16 (strategies.py:868, `max(bits) > 16` -> `>= 16`): 16 bits, documented as
# allowed ("bits lie in [1, 16]"), was refused.
def test_fake_quantize_cases_take_16_bits_with_every_grid_point():
    case = find(st_tft.fake_quantize_cases(bits=(16,), symmetric=(True,)), lambda c: True)
    assert (case.qmin, case.qmax, case.zero_point) == (-(2**15), 2**15 - 1, 0)
    codes = np.round(case.x.astype(np.float64) / np.float64(case.scale))
    assert np.isin(np.arange(-(2**15), 2**15), codes).all()


# Mutant T17 (strategies.py:889, affine zero point drawn from [qmin, qmax - 1]): the
# docstring's "a drawn zero point in the grid" includes qmax (a grid entirely below zero).
def test_affine_fake_quantize_cases_reach_a_zero_point_at_either_end_of_the_grid():
    cases = st_tft.fake_quantize_cases(bits=(2,), symmetric=(False,))
    assert find(cases, lambda c: c.zero_point == c.qmax).qmax == 3
    assert find(cases, lambda c: c.zero_point == c.qmin).qmin == 0
