"""Hypothesis strategies for attention blocks, TFT configs and inputs, QAT configs and observers.

Configs come first and inputs are drawn for a config, so strategies compose::

    from hypothesis import given
    from properties import strategies as st_tft

    @given(st_tft.attention_configs(), st_tft.data())
    def test_block(config, data):
        x = data.draw(st_tft.attention_inputs(config))   # NumPy (B, T, D)

Every size is drawn with `sampled_from` over a short tuple of buckets (the
module constants below, overridable per call), so values shrink towards the
first bucket and a minimal counterexample is a small, readable config.

Keeping compiles bounded (compile time, not run time, dominates a JAX suite):

- A jitted function compiles once per distinct input shape and per distinct
  static argument (a config). A test therefore compiles at most
  ``min(max_examples, product of the bucket sizes it draws from)`` times.
  Narrow the buckets (``attention_configs(hidden_dims=(8,))``) for a test that
  must stay fast.
- A whole TFT compiles in seconds to tens of seconds on a small CPU: draw
  model-level properties from `tft_config_presets()` (three configs that
  cover every edge) with one batch size, and keep `tft_configs` for cheap
  properties (config validation, shapes, input pipelines).
- Configs are frozen and hashable: build the jitted function once per config
  at module level, e.g. ``functools.cache`` over a function of the config
  that returns ``jax.jit(model.apply)``, never a fresh ``jax.jit(lambda ...)``
  per example.
- Arrays are NumPy arrays made on the host (a seeded `numpy.random.Generator`
  or `hypothesis.extra.numpy.arrays`), never eager `jnp` ops, which compile
  once per new shape; hand them to the jitted function as they are.
- The `ci` profile is derandomized: every run draws the same examples, so the
  persistent compilation cache (see `tests/conftest.py`) serves them warm.
- `properties.checks.count_compiles` / `assert_max_compiles` measure it.

Input kinds (the ``kinds`` argument): ``"normal"`` standard normal;
``"large"`` uniform in ``±LARGE_MAGNITUDE`` (1e4); ``"tiny"`` uniform in
``±TINY_MAGNITUDE`` (1e-6); ``"constant"`` constant along the time axis;
``"zeros"``; ``"positive"`` (one-signed, |normal|); ``"huge"`` magnitudes
around ``HUGE_MAGNITUDE`` (1e30) with random signs; ``"elements"``
element-wise `hypothesis.extra.numpy.arrays` in ``±LARGE_MAGNITUDE``
(adversarial values that shrink element by element). ``observer_batches``
adds ``"single"``: a one-element batch. The seeded kinds shrink to seed 0.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
from hypothesis.strategies import data

from tft_jax.config import TFTConfig

if TYPE_CHECKING:  # imported at use: `properties.strategies` works without `qat`
    from qat.config import QATConfig

__all__ = [
    "ATTENTION_HIDDEN_DIMS",
    "BATCH_SIZES",
    "INPUT_KINDS",
    "NUM_HEADS",
    "OBSERVER_KINDS",
    "OBSERVER_SHAPES",
    "PADDING_KINDS",
    "QUANTILE_SETS",
    "SEQUENCE_LENGTHS",
    "TFT_PRESETS",
    "TIME_CATEGORICAL_CARDINALITIES",
    "AttentionConfig",
    "FakeQuantizeCase",
    "TFTInputs",
    "attention_configs",
    "attention_inputs",
    "data",
    "fake_quantize_cases",
    "float_arrays",
    "observer_batch_sequences",
    "observer_batches",
    "padding_masks",
    "qat_configs",
    "tft_config_presets",
    "tft_configs",
    "tft_inputs",
]

LARGE_MAGNITUDE = 1e4
TINY_MAGNITUDE = 1e-6
HUGE_MAGNITUDE = 1e30

ATTENTION_HIDDEN_DIMS = (8, 16)
NUM_HEADS = (1, 2, 4)
SEQUENCE_LENGTHS = (1, 4, 7)
BATCH_SIZES = (1, 3)

TFT_STATIC_FEATURES = (0, 1, 3)
TFT_KNOWN_FEATURES = (1, 2)
TFT_OBSERVED_FEATURES = (1, 3)
TFT_HIDDEN_DIMS = (8, 16)
TFT_SEQUENCE_LENGTHS = (4, 7)
TFT_HORIZONS = (1, 3)
QUANTILE_SETS = ((0.5,), (0.1, 0.5, 0.9), (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98))
TFT_DROPOUT_RATES = (0.0, 0.1)
CATEGORICAL_CARDINALITIES = ((), (3,), (2, 5))
TIME_CATEGORICAL_CARDINALITIES = ((), (3,), (2, 4))
VARIABLE_HIDDEN_DIMS = (None, 4)

INPUT_KINDS = ("normal", "large", "tiny", "constant", "elements")
OBSERVER_KINDS = ("normal", "constant", "zeros", "single", "huge", "tiny", "positive", "elements")
OBSERVER_SHAPES = ((16,), (4, 8), (2, 3, 4))
# A sequence's batches share one shape: no "single" batch among them.
_SEQUENCE_KINDS = tuple(kind for kind in OBSERVER_KINDS if kind != "single")

_SEEDED_KINDS = ("normal", "large", "tiny", "constant", "zeros", "positive", "huge")
_ALL_KINDS = (*_SEEDED_KINDS, "elements")


def _buckets(name: str, values: Sequence[Any]) -> tuple[Any, ...]:
    """Validates a non-empty tuple of bucket values, naming the argument."""
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a tuple of bucket values, e.g. (8, 16), got {values!r}")
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} must hold at least one bucket, got ()")
    return values


def _integers(name: str, values: Sequence[Any], minimum: int) -> tuple[int, ...]:
    """Validates a non-empty tuple of int buckets `>= minimum` (a size of -1 or 2.5 would
    fail deep inside NumPy, or give an impossible config, only when an example is drawn)."""
    values = _buckets(name, values)
    wrong = [v for v in values if isinstance(v, bool) or not isinstance(v, numbers.Integral)]
    if wrong:
        raise TypeError(f"{name} must hold ints, got {wrong[0]!r} in {values}")
    small = [v for v in values if v < minimum]
    if small:
        raise ValueError(f"{name} must hold ints >= {minimum}, got {small} in {values}")
    return tuple(int(v) for v in values)


def _shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """Validates an array shape: a sequence of ints >= 0 (zero-sized axes are allowed)."""
    if isinstance(shape, str) or not isinstance(shape, Sequence | np.ndarray):
        raise TypeError(f"{name} must be a sequence of ints, e.g. (2, 3), got {shape!r}")
    if len(shape) == 0:
        return ()
    return _integers(name, shape, 0)


# The magnitude each kind reaches; a dtype whose largest finite value is smaller would
# silently turn the kind into inf.
_KIND_MAGNITUDES = {"large": LARGE_MAGNITUDE, "elements": LARGE_MAGNITUDE, "huge": HUGE_MAGNITUDE}


def _check_range(kinds: Sequence[str], dtype: np.dtype) -> None:
    """Refuses kinds whose values overflow `dtype` (e.g. `"huge"` in float16 gives inf)."""
    largest = float(jnp.finfo(dtype).max)
    overflowing = [kind for kind in kinds if _KIND_MAGNITUDES.get(kind, 0.0) > largest]
    if overflowing:
        raise ValueError(
            f"kinds {overflowing} reach magnitudes up to "
            f"{max(_KIND_MAGNITUDES[kind] for kind in overflowing):g}, beyond the largest "
            f"{dtype} ({largest:g}): they would be inf; leave them out of kinds for {dtype}"
        )


def _check_kinds(name: str, kinds: Sequence[str], allowed: Sequence[str]) -> tuple[str, ...]:
    kinds = _buckets(name, kinds)
    unknown = [kind for kind in kinds if kind not in allowed]
    if unknown:
        raise ValueError(f"{name} must be drawn from {tuple(allowed)}, got unknown {unknown}")
    return kinds


def _numpy_dtype(dtype: Any) -> np.dtype:
    """A NumPy floating dtype (bfloat16 through ml_dtypes), or raises naming `dtype`."""
    try:
        resolved = np.dtype(jnp.dtype(dtype))
    except TypeError as error:
        raise TypeError(f"dtype must be a floating dtype, got {dtype!r}") from error
    if not jnp.issubdtype(resolved, jnp.floating):
        raise TypeError(f"dtype must be a floating dtype, got {resolved}")
    return resolved


def _seeded_array(
    kind: str, shape: tuple[int, ...], seed: int, constant_axis: int | None
) -> np.ndarray:
    """A float64 array of one seeded kind; `constant` repeats one slice along `constant_axis`
    (one value everywhere when it is None)."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "large":
        return rng.uniform(-LARGE_MAGNITUDE, LARGE_MAGNITUDE, shape)
    if kind == "tiny":
        return rng.uniform(-TINY_MAGNITUDE, TINY_MAGNITUDE, shape)
    if kind == "zeros":
        return np.zeros(shape)
    if kind == "positive":
        return np.abs(rng.standard_normal(shape))
    if kind == "huge":
        magnitude = HUGE_MAGNITUDE * 10.0 ** rng.uniform(-2.0, 0.0, shape)
        return magnitude * rng.choice((-1.0, 1.0), shape)
    if kind == "constant":
        if constant_axis is None or len(shape) <= constant_axis:
            return np.full(shape, rng.standard_normal())
        slice_shape = list(shape)
        slice_shape[constant_axis] = 1
        return np.broadcast_to(rng.standard_normal(slice_shape), shape).copy()
    raise ValueError(f"kind must be one of {_SEEDED_KINDS}, got {kind!r}")


def float_arrays(
    shape: Sequence[int],
    *,
    kinds: Sequence[str] = INPUT_KINDS,
    dtype: Any = np.float32,
    constant_axis: int | None = 1,
) -> st.SearchStrategy[np.ndarray]:
    """NumPy float arrays of a fixed `shape`, one drawn kind per array (see the module docstring).

    The default kinds include ``"large"`` (±1e4) and ``"elements"`` (up to
    ±1e4), which saturate tanh, sigmoid and GLU gates: their derivative is
    then exactly 0 in float32, so a correct tanh MLP has an all-zero kernel
    gradient and `checks.assert_nonzero_grads` fails on it. For
    gradient-liveness tests of saturating modules draw from unsaturating
    kinds, e.g. ``kinds=("normal", "tiny", "positive")``, and keep the
    defaults for the checks that should see large inputs (finiteness,
    causality, batch independence).

    Args:
      shape: the array shape, ints >= 0; zero-sized axes are allowed.
      kinds: the kinds to draw from; the first is the shrink target. Kinds that
        overflow `dtype` (``"huge"`` in float16) are refused.
      dtype: float32, float16, bfloat16 (values are made in float64 and cast)...
      constant_axis: the axis along which a `"constant"` array is constant
        (the time axis of `(B, T, F)` data); None, or an axis beyond the
        shape's last: one value for the whole array.

    Returns:
      A strategy of `np.ndarray` of `shape` and `dtype`.
    """
    shape = _shape("shape", shape)
    kinds = _check_kinds("kinds", kinds, _ALL_KINDS)
    resolved = _numpy_dtype(dtype)
    _check_range(kinds, resolved)
    if constant_axis is not None:
        if isinstance(constant_axis, bool) or not isinstance(constant_axis, numbers.Integral):
            raise TypeError(f"constant_axis must be an int or None, got {constant_axis!r}")
        if constant_axis < -len(shape):
            raise ValueError(
                f"constant_axis={constant_axis} is out of range for shape {shape} "
                f"({len(shape)} axes)"
            )
    elements = st.floats(
        -LARGE_MAGNITUDE, LARGE_MAGNITUDE, width=32, allow_nan=False, allow_subnormal=False
    )

    @st.composite
    def draw_array(draw: st.DrawFn) -> np.ndarray:
        kind = draw(st.sampled_from(kinds))
        if kind == "elements":
            values = draw(hnp.arrays(np.float32, shape, elements=elements))
        else:
            values = _seeded_array(kind, shape, draw(st.integers(0, 2**32 - 1)), constant_axis)
        return np.asarray(values).astype(resolved)

    return draw_array()


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Sizes of one self-attention example: input `(B, T, D)`, `num_heads` dividing `D`."""

    hidden_dim: int
    num_heads: int
    sequence_length: int
    batch_size: int
    dropout_rate: float = 0.0

    def __post_init__(self) -> None:
        # Built directly too (an `@example`): a head count that does not divide the
        # width gave a wrong `head_dim` silently, a zero one a ZeroDivisionError.
        _integers("AttentionConfig.hidden_dim", (self.hidden_dim,), 1)
        _integers("AttentionConfig.num_heads", (self.num_heads,), 1)
        _integers("AttentionConfig.sequence_length", (self.sequence_length,), 0)
        _integers("AttentionConfig.batch_size", (self.batch_size,), 0)
        if self.hidden_dim % self.num_heads:
            raise ValueError(
                f"AttentionConfig.num_heads ({self.num_heads}) must divide hidden_dim "
                f"({self.hidden_dim})"
            )

    @property
    def head_dim(self) -> int:
        """Width of one head, `D / num_heads`."""
        return self.hidden_dim // self.num_heads

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """`(B, T, D)`."""
        return (self.batch_size, self.sequence_length, self.hidden_dim)


def _divisors_in(value: int | numbers.Integral, candidates: Sequence[int]) -> list[int]:
    return [candidate for candidate in candidates if value % candidate == 0]


def _check_heads(hidden_dims: Sequence[Any], num_heads: Sequence[int]) -> None:
    """Refuses an int hidden size that no head count in `num_heads` divides: its configs
    would silently get 1 head, a count outside the `num_heads` buckets."""
    orphans = [
        dim
        for dim in hidden_dims
        if isinstance(dim, numbers.Integral)
        and not isinstance(dim, bool)
        and not _divisors_in(dim, num_heads)
    ]
    if orphans:
        raise ValueError(
            f"num_heads must hold a head count dividing every hidden dim, got num_heads "
            f"{num_heads} and hidden dims {orphans} that none of them divides"
        )


@st.composite
def _heads_for(draw: st.DrawFn, hidden_dim: int, num_heads: Sequence[int]) -> int:
    """A head count from `num_heads` dividing `hidden_dim` (1 when none does)."""
    return draw(st.sampled_from(_divisors_in(hidden_dim, num_heads) or [1]))


def attention_configs(
    *,
    hidden_dims: Sequence[int] = ATTENTION_HIDDEN_DIMS,
    num_heads: Sequence[int] = NUM_HEADS,
    sequence_lengths: Sequence[int] = SEQUENCE_LENGTHS,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    dropout_rates: Sequence[float] = (0.0,),
) -> st.SearchStrategy[AttentionConfig]:
    """`AttentionConfig`s drawn from buckets; heads always divide the hidden size.

    Every hidden dim needs a divisor in `num_heads` (`ValueError` otherwise):
    the head count is drawn among those dividing the drawn hidden dim.

    At most ``len(hidden_dims) * len(num_heads) * len(sequence_lengths) *
    len(batch_sizes) * len(dropout_rates)`` distinct configs, hence compiles.
    Sizes are ints >= 1 and dropout rates lie in `[0, 1)`.
    """
    hidden_dims = _integers("hidden_dims", hidden_dims, 1)
    num_heads = _integers("num_heads", num_heads, 1)
    sequence_lengths = _integers("sequence_lengths", sequence_lengths, 1)
    batch_sizes = _integers("batch_sizes", batch_sizes, 1)
    _check_heads(hidden_dims, num_heads)
    dropout_rates = _buckets("dropout_rates", dropout_rates)
    bad_rates = [
        rate
        for rate in dropout_rates
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0 <= float(rate) < 1
    ]
    if bad_rates:
        raise ValueError(f"dropout_rates must lie in [0, 1), got {bad_rates} in {dropout_rates}")

    @st.composite
    def draw_config(draw: st.DrawFn) -> AttentionConfig:
        hidden_dim = draw(st.sampled_from(hidden_dims))
        return AttentionConfig(
            hidden_dim=hidden_dim,
            num_heads=draw(_heads_for(hidden_dim, num_heads)),
            sequence_length=draw(st.sampled_from(sequence_lengths)),
            batch_size=draw(st.sampled_from(batch_sizes)),
            dropout_rate=draw(st.sampled_from(dropout_rates)),
        )

    return draw_config()


def attention_inputs(
    config: AttentionConfig, *, kinds: Sequence[str] = INPUT_KINDS, dtype: Any = np.float32
) -> st.SearchStrategy[np.ndarray]:
    """NumPy inputs `(B, T, D)` for an `AttentionConfig`, constant kind along `T`.

    `kinds` as in `float_arrays` (whose note on saturating modules applies:
    restrict them, e.g. ``kinds=("normal", "tiny")``, for gradient-liveness
    tests of tanh, sigmoid or GLU blocks).
    """
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
    return float_arrays(config.input_shape, kinds=kinds, dtype=dtype, constant_axis=1)


PADDING_KINDS = ("full", "right", "left", "none", "one", "random")


def padding_masks(
    config: AttentionConfig, *, kinds: Sequence[str] = PADDING_KINDS
) -> st.SearchStrategy[np.ndarray]:
    """Boolean `(B, T)` masks of real steps (True) for an `AttentionConfig`, one kind per sample.

    Kinds: ``"full"`` every step real (the shrink target); ``"right"`` a real
    prefix of drawn length in `[0, T]` (trailing padding); ``"left"`` a real
    suffix (leading padding: with a causal mask the first queries then see
    no real key); ``"none"`` every step padded (an all-masked row, where a
    softmax over nothing gives NaN); ``"one"`` a single real step at a drawn
    position; ``"random"`` element by element. Drawing the kind per sample
    mixes them within a batch. Use with `checks.assert_ignores_padding` and
    `checks.assert_finite`.
    """
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
    kinds = _check_kinds("kinds", kinds, PADDING_KINDS)
    length = config.sequence_length
    if length == 0 or config.batch_size == 0:  # nothing to draw: the one empty mask
        return st.just(np.zeros((config.batch_size, length), bool))

    @st.composite
    def draw_mask(draw: st.DrawFn) -> np.ndarray:
        rows = []
        for _ in range(config.batch_size):
            kind = draw(st.sampled_from(kinds))
            steps = np.arange(length)
            if kind == "full":
                row = np.ones(length, bool)
            elif kind == "none":
                row = np.zeros(length, bool)
            elif kind == "right":
                row = steps < draw(st.integers(0, length))
            elif kind == "left":
                row = steps >= length - draw(st.integers(0, length))
            elif kind == "one":
                row = steps == draw(st.integers(0, length - 1))
            else:
                row = draw(hnp.arrays(np.bool_, (length,)))
            rows.append(row)
        return np.stack(rows)

    return draw_mask()


def tft_configs(
    *,
    static_features: Sequence[int] = TFT_STATIC_FEATURES,
    known_features: Sequence[int] = TFT_KNOWN_FEATURES,
    observed_features: Sequence[int] = TFT_OBSERVED_FEATURES,
    hidden_dims: Sequence[int] = TFT_HIDDEN_DIMS,
    num_heads: Sequence[int] = NUM_HEADS,
    sequence_lengths: Sequence[int] = TFT_SEQUENCE_LENGTHS,
    horizons: Sequence[int] = TFT_HORIZONS,
    quantile_sets: Sequence[tuple[float, ...]] = QUANTILE_SETS,
    dropout_rates: Sequence[float] = TFT_DROPOUT_RATES,
    categorical_cardinalities: Sequence[tuple[int, ...]] = CATEGORICAL_CARDINALITIES,
    known_categorical_cardinalities: Sequence[tuple[int, ...]] = TIME_CATEGORICAL_CARDINALITIES,
    observed_categorical_cardinalities: Sequence[tuple[int, ...]] = TIME_CATEGORICAL_CARDINALITIES,
    variable_hidden_dims: Sequence[int | None] = VARIABLE_HIDDEN_DIMS,
    attend_to_self: Sequence[bool] = (True, False),
    use_known_history: Sequence[bool] = (False, True),
    dtypes: Sequence[str] = ("float32",),
) -> st.SearchStrategy[TFTConfig]:
    """Valid `TFTConfig`s drawn from buckets (0 statics included, heads dividing `hidden_dim`).

    `categorical_cardinalities` are the categorical statics';
    `known_categorical_cardinalities` and `observed_categorical_cardinalities`
    those of the categorical inputs over time.

    Each argument is the tuple of values to draw from; its first entry is the
    shrink target. Pass one-element tuples to pin a field, e.g.
    ``tft_configs(dropout_rates=(0.0,), dtypes=("bfloat16",))``. Every hidden
    dim needs a divisor in `num_heads` (`ValueError` otherwise).
    """
    fields = {
        "static_features": _buckets("static_features", static_features),
        "known_features": _buckets("known_features", known_features),
        "observed_features": _buckets("observed_features", observed_features),
        "hidden_dims": _buckets("hidden_dims", hidden_dims),
        "sequence_lengths": _buckets("sequence_lengths", sequence_lengths),
        "horizons": _buckets("horizons", horizons),
        "quantile_sets": _buckets("quantile_sets", quantile_sets),
        "dropout_rates": _buckets("dropout_rates", dropout_rates),
        "categorical_cardinalities": _buckets(
            "categorical_cardinalities", categorical_cardinalities
        ),
        "known_categorical_cardinalities": _buckets(
            "known_categorical_cardinalities", known_categorical_cardinalities
        ),
        "observed_categorical_cardinalities": _buckets(
            "observed_categorical_cardinalities", observed_categorical_cardinalities
        ),
        "variable_hidden_dims": _buckets("variable_hidden_dims", variable_hidden_dims),
        "attend_to_self": _buckets("attend_to_self", attend_to_self),
        "use_known_history": _buckets("use_known_history", use_known_history),
        "dtypes": _buckets("dtypes", dtypes),
    }
    num_heads = _integers("num_heads", num_heads, 1)  # a 0 would divide by zero in `_heads_for`
    fields["hidden_dims"] = _integers("hidden_dims", fields["hidden_dims"], 1)
    _check_heads(fields["hidden_dims"], num_heads)
    _check_config_buckets(fields, num_heads)

    @st.composite
    def draw_config(draw: st.DrawFn) -> TFTConfig:
        values = {name: draw(st.sampled_from(buckets)) for name, buckets in fields.items()}
        return _tft_config(values, draw(_heads_for(values["hidden_dims"], num_heads)))

    return draw_config()


def _tft_config(values: dict[str, Any], num_heads: int) -> TFTConfig:
    """The `TFTConfig` of one value per `tft_configs` bucket argument."""
    return TFTConfig(
        num_static_features=values["static_features"],
        num_known_features=values["known_features"],
        num_observed_features=values["observed_features"],
        hidden_dim=values["hidden_dims"],
        num_heads=num_heads,
        sequence_length=values["sequence_lengths"],
        prediction_horizon=values["horizons"],
        quantiles=tuple(values["quantile_sets"]),
        dropout_rate=values["dropout_rates"],
        static_categorical_cardinalities=tuple(values["categorical_cardinalities"]),
        variable_hidden_dim=values["variable_hidden_dims"],
        attend_to_self=values["attend_to_self"],
        use_known_history=values["use_known_history"],
        dtype=values["dtypes"],
        known_categorical_cardinalities=tuple(values["known_categorical_cardinalities"]),
        observed_categorical_cardinalities=tuple(values["observed_categorical_cardinalities"]),
    )


def _check_config_buckets(fields: dict[str, tuple[Any, ...]], num_heads: Sequence[int]) -> None:
    """Builds a config from every bucket value (the others at their defaults), naming a bad one.

    A value that makes no `TFTConfig` (quantile levels given as one float,
    cardinalities as one int) failed only when Hypothesis drew it, with an
    error that named neither the argument nor the value.
    """
    parameters = inspect.signature(tft_configs).parameters
    defaults = {name: parameters[name].default[0] for name in fields}  # a valid config
    for name, buckets in fields.items():
        for value in buckets:
            values = {**defaults, name: value}
            heads = (_divisors_in(values["hidden_dims"], num_heads) or [1])[0]
            try:
                _tft_config(values, heads)
            except (TypeError, ValueError) as error:
                raise type(error)(
                    f"tft_configs: {name} holds {value!r}, which makes no TFTConfig: {error}"
                ) from None


# Three configs that between them cover the edges of `tft_configs`: zero and
# several statics, categorical statics, categorical known inputs (over the
# history and the horizon, with known history; categorical known inputs over
# the horizon only are drawn by `tft_configs` alone) and observed inputs,
# known history, one and seven quantiles, a narrow variable GRN, both mask
# conventions, dropout on and off.
TFT_PRESETS = (
    TFTConfig(
        num_static_features=0,
        num_known_features=1,
        num_observed_features=1,
        hidden_dim=8,
        num_heads=1,
        sequence_length=4,
        prediction_horizon=1,
        quantiles=(0.5,),
        dropout_rate=0.0,
    ),
    TFTConfig(
        num_static_features=2,
        num_known_features=2,
        num_observed_features=3,
        hidden_dim=8,
        num_heads=2,
        sequence_length=5,
        prediction_horizon=3,
        quantiles=(0.1, 0.5, 0.9),
        dropout_rate=0.1,
        static_categorical_cardinalities=(3,),
        variable_hidden_dim=4,
        use_known_history=True,
        known_categorical_cardinalities=(3,),
        observed_categorical_cardinalities=(2,),
    ),
    TFTConfig(
        num_static_features=0,
        num_known_features=1,
        num_observed_features=2,
        hidden_dim=16,
        num_heads=4,
        sequence_length=4,
        prediction_horizon=2,
        quantiles=QUANTILE_SETS[2],
        dropout_rate=0.0,
        static_categorical_cardinalities=(2, 5),
        attend_to_self=False,
        use_known_history=True,
        known_categorical_cardinalities=(2, 4),
    ),
)


def tft_config_presets(
    presets: Sequence[TFTConfig] = TFT_PRESETS, *, dtype: str | None = None
) -> st.SearchStrategy[TFTConfig]:
    """One of a few fixed `TFTConfig`s: at most `len(presets)` compiles per test.

    A full TFT compiles in seconds to tens of seconds on a small CPU, so a
    property over the whole model should draw from these presets (with one
    batch size, e.g. ``tft_inputs(config, batch_sizes=(2,))``) rather than
    from `tft_configs`, which reaches thousands of distinct configs.
    `dtype` (e.g. ``"bfloat16"``) replaces every preset's compute dtype.
    """
    presets = _buckets("presets", presets)
    odd = [preset for preset in presets if not isinstance(preset, TFTConfig)]
    if odd:
        raise TypeError(f"presets must hold TFTConfigs, got {odd[0]!r}")
    if dtype is not None:
        presets = tuple(dataclasses.replace(config, dtype=dtype) for config in presets)
    return st.sampled_from(presets)


class TFTInputs(NamedTuple):
    """One batch of NumPy inputs for a `TFTConfig` (the arguments of the model, plus a target).

    Attributes:
      static: `(B, S)` float.
      historical: `(B, T, U)` float.
      future: `(B, H, K)` float.
      known_history: `(B, T, K)` float when `config.use_known_history`, else None.
      static_categorical: `(B, C)` int32 with column `c` in `[0, cardinality_c)`,
        or None when the config has no categorical statics.
      target: `(B, H)` float.
      known_categorical_history: `(B, T, Kc)` int32 codes when the config has
        categorical known inputs and `use_known_history`, else None.
      future_categorical: `(B, H, Kc)` int32 codes, or None without
        categorical known inputs.
      observed_categorical: `(B, T, Uc)` int32 codes, or None without
        categorical observed inputs.
    """

    static: np.ndarray
    historical: np.ndarray
    future: np.ndarray
    known_history: np.ndarray | None
    static_categorical: np.ndarray | None
    target: np.ndarray
    known_categorical_history: np.ndarray | None = None
    future_categorical: np.ndarray | None = None
    observed_categorical: np.ndarray | None = None

    @property
    def batch_size(self) -> int:
        """`B`."""
        return int(self.historical.shape[0])


def tft_inputs(
    config: TFTConfig,
    *,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    kinds: Sequence[str] = INPUT_KINDS,
    dtype: Any = None,
) -> st.SearchStrategy[TFTInputs]:
    """`TFTInputs` for `config`: one batch size for all arrays, one drawn kind per array.

    Args:
      config: the model config fixing `S, C, K, Kc, U, Uc, T, H` and whether
        `known_history` (and `known_categorical_history`) are given
        (`use_known_history`).
      batch_sizes: buckets for `B`, ints >= 1.
      kinds: input kinds (module docstring); `"constant"` is constant over time.
      dtype: float dtype of the float arrays; None means `config.dtype`.
    """
    if not isinstance(config, TFTConfig):
        raise TypeError(f"config must be a TFTConfig, got {type(config).__name__}")
    batch_sizes = _integers("batch_sizes", batch_sizes, 1)
    kinds = _check_kinds("kinds", kinds, _ALL_KINDS)
    resolved = _numpy_dtype(config.dtype if dtype is None else dtype)
    _check_range(kinds, resolved)

    def floats(shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
        return float_arrays(shape, kinds=kinds, dtype=resolved, constant_axis=1)

    def codes(
        draw: st.DrawFn, leading: tuple[int, ...], cardinalities: Sequence[int]
    ) -> np.ndarray | None:
        """`(*leading, len(cardinalities))` int32, column `c` in `[0, cardinality_c)`."""
        if not cardinalities:
            return None
        columns = [
            draw(hnp.arrays(np.int32, leading, elements=st.integers(0, cardinality - 1)))
            for cardinality in cardinalities
        ]
        return np.stack(columns, axis=-1)

    @st.composite
    def draw_inputs(draw: st.DrawFn) -> TFTInputs:
        batch = draw(st.sampled_from(batch_sizes))
        steps, horizon = config.sequence_length, config.prediction_horizon
        known = config.num_known_features
        categorical = codes(draw, (batch,), config.static_categorical_cardinalities)
        known_codes = config.known_categorical_cardinalities
        return TFTInputs(
            static=draw(floats((batch, config.num_static_features))),
            historical=draw(floats((batch, steps, config.num_observed_features))),
            future=draw(floats((batch, horizon, known))),
            known_history=(
                draw(floats((batch, steps, known))) if config.use_known_history else None
            ),
            static_categorical=categorical,
            target=draw(floats((batch, horizon))),
            known_categorical_history=(
                codes(draw, (batch, steps), known_codes) if config.use_known_history else None
            ),
            future_categorical=codes(draw, (batch, horizon), known_codes),
            observed_categorical=codes(
                draw, (batch, steps), config.observed_categorical_cardinalities
            ),
        )

    return draw_inputs()


def qat_configs(
    *,
    bits: Sequence[int | None] = (8, 4),
    symmetric: Sequence[bool] = (True, False),
    per_channel: Sequence[bool] = (False, True),
    channel_axes: Sequence[int] = (-1, 0),
    observers: Sequence[str] = ("minmax", "moving_average"),
    averaging_constants: Sequence[float] = (0.01, 0.5),
    calibration_batches: Sequence[int] = (100,),
    learnable_scale: Sequence[bool] = (False,),
) -> st.SearchStrategy[QATConfig]:
    """`qat.config.QATConfig`s drawn from buckets.

    `channel_axis` is drawn only for per-channel configs (per-tensor ones keep
    -1), so equivalent configs are not drawn twice. `qat` is imported here,
    not at module import, so `properties.strategies` works without it.
    """
    from qat.config import QATConfig

    fields = {
        "bits": _buckets("bits", bits),
        "symmetric": _buckets("symmetric", symmetric),
        "per_channel": _buckets("per_channel", per_channel),
        "channel_axes": _buckets("channel_axes", channel_axes),
        "observers": _buckets("observers", observers),
        "averaging_constants": _buckets("averaging_constants", averaging_constants),
        "calibration_batches": _buckets("calibration_batches", calibration_batches),
        "learnable_scale": _buckets("learnable_scale", learnable_scale),
    }

    @st.composite
    def draw_config(draw: st.DrawFn) -> QATConfig:
        def pick(name: str) -> Any:
            return draw(st.sampled_from(fields[name]))

        channel_wise = pick("per_channel")
        return QATConfig(
            bits=pick("bits"),
            symmetric=pick("symmetric"),
            per_channel=channel_wise,
            channel_axis=pick("channel_axes") if channel_wise else -1,
            observer=pick("observers"),
            averaging_constant=pick("averaging_constants"),
            calibration_batches=pick("calibration_batches"),
            learnable_scale=pick("learnable_scale"),
        )

    return draw_config()


def observer_batches(
    *,
    shapes: Sequence[tuple[int, ...]] = OBSERVER_SHAPES,
    kinds: Sequence[str] = OBSERVER_KINDS,
    dtype: Any = np.float32,
) -> st.SearchStrategy[np.ndarray]:
    """Batches for a quantization observer, degenerate ones included.

    Kinds: the module's kinds plus ``"single"`` (a one-element batch with the
    drawn shape's number of axes, so a channel axis stays valid). Constant
    batches (one value, whatever the shape) and all-zero ones give
    `min == max`; ``"huge"`` reaches ~1e30 (the range `max - min` stays
    finite in float32).
    """
    shapes = tuple(_shape("shapes", shape) for shape in _buckets("shapes", shapes))
    kinds = _check_kinds("kinds", kinds, (*_ALL_KINDS, "single"))
    _check_range(kinds, _numpy_dtype(dtype))

    @st.composite
    def draw_batch(draw: st.DrawFn) -> np.ndarray:
        shape = draw(st.sampled_from(shapes))
        kind = draw(st.sampled_from(kinds))
        if kind == "single":
            shape, kind = (1,) * len(shape), "normal"
        return draw(float_arrays(shape, kinds=(kind,), dtype=dtype, constant_axis=None))

    return draw_batch()


def observer_batch_sequences(
    *,
    shapes: Sequence[tuple[int, ...]] = OBSERVER_SHAPES,
    lengths: Sequence[int] = (1, 3),
    kinds: Sequence[str] = _SEQUENCE_KINDS,
    dtype: Any = np.float32,
) -> st.SearchStrategy[list[np.ndarray]]:
    """Lists of same-shaped observer batches (one kind drawn per batch), for running statistics.

    `lengths` (ints >= 1) are the list lengths to draw from. As in
    `observer_batches`, a `"constant"` batch holds one value (`min == max`).
    """
    shapes = tuple(_shape("shapes", shape) for shape in _buckets("shapes", shapes))
    lengths = _integers("lengths", lengths, 1)
    kinds = _check_kinds("kinds", kinds, _ALL_KINDS)
    _check_range(kinds, _numpy_dtype(dtype))

    @st.composite
    def draw_sequence(draw: st.DrawFn) -> list[np.ndarray]:
        shape = draw(st.sampled_from(shapes))
        batch = float_arrays(shape, kinds=kinds, dtype=dtype, constant_axis=None)
        return [draw(batch) for _ in range(draw(st.sampled_from(lengths)))]

    return draw_sequence()


class FakeQuantizeCase(NamedTuple):
    """Arguments of `fake_quantize(x, scale, zero_point, qmin, qmax)` with telling `x` values.

    `x (N,)` float32 holds every grid point `(k - zero_point) * scale` for `k`
    in `[qmin, qmax]` (the bounds exactly included), the half-way points
    between them (ties of the rounding) that float32 holds exactly (with a
    scale of many significant bits some are not: the grid point below each
    stands in, so every case of a bit width has one size), points beyond
    both ends, and random values over twice the range.
    """

    x: np.ndarray
    scale: np.float32
    zero_point: int
    qmin: int
    qmax: int


def fake_quantize_cases(
    *,
    bits: Sequence[int] = (8, 4, 2),
    symmetric: Sequence[bool] = (True, False),
    scales: st.SearchStrategy[float] | None = None,
) -> st.SearchStrategy[FakeQuantizeCase]:
    """`FakeQuantizeCase`s: grid, tie and saturating inputs for a drawn integer grid and scale.

    Symmetric grids are `[-2^(b-1), 2^(b-1)-1]` with zero point 0; affine grids
    `[0, 2^b-1]` with a drawn zero point in the grid. `scales` defaults to a
    few exact powers of two and 0.1, or any float32 in `[2^-10, 16]`; a custom
    `scales` strategy must draw finite floats > 0. `bits` lie in `[1, 16]`
    (the case holds every one of the `2^bits` grid points).
    """
    bits = _integers("bits", bits, 1)
    if max(bits) > 16:
        raise ValueError(
            f"bits must lie in [1, 16] (a case holds all 2^bits grid points), got {bits}"
        )
    symmetric = _buckets("symmetric", symmetric)
    if scales is not None and not isinstance(scales, st.SearchStrategy):
        raise TypeError(
            f"scales must be a Hypothesis strategy of floats (e.g. st.just({scales!r})), got "
            f"{type(scales).__name__}"
        )
    if scales is None:
        scales = st.one_of(
            st.sampled_from((1.0, 0.5, 0.1, 2.0**-7)),
            st.floats(2.0**-10, 16.0, width=32, allow_subnormal=False),
        )

    @st.composite
    def draw_case(draw: st.DrawFn) -> FakeQuantizeCase:
        width = draw(st.sampled_from(bits))
        signed = draw(st.sampled_from(symmetric))
        qmin, qmax = (-(2 ** (width - 1)), 2 ** (width - 1) - 1) if signed else (0, 2**width - 1)
        zero_point = 0 if signed else draw(st.integers(qmin, qmax))
        scale = np.float32(draw(scales))
        if not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"scales must draw finite floats > 0, drew {scale}")
        levels = np.arange(qmin, qmax + 1, dtype=np.float64) - zero_point
        beyond = np.array([qmin - 3.0, qmin - 1.0, qmin - 0.5, qmax + 0.5, qmax + 1.0, qmax + 3.0])
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        spread = rng.uniform(2 * qmin - qmax, 2 * qmax - qmin, 16)
        outside = np.concatenate([beyond, spread]) - zero_point
        # A half-way point is a tie only where float32 holds it exactly (x / scale == k + 1/2
        # in float64): with a scale of many significant bits some are not, and the grid
        # point below stands in for them (the case keeps its size: one compile per bucket).
        halves = levels[:-1] + 0.5
        exact = (halves * np.float64(scale)).astype(np.float32) / np.float64(scale) == halves
        units = np.concatenate([levels, np.where(exact, halves, levels[:-1]), outside])
        x = (units * np.float64(scale)).astype(np.float32)
        return FakeQuantizeCase(x, scale, zero_point, qmin, qmax)

    return draw_case()
