"""`TFTConfig`: the hyperparameters of a Temporal Fusion Transformer, validated once."""

from __future__ import annotations

import dataclasses
import itertools
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

# float64 is for gradient checks under `jax.enable_x64` only (the model refuses it otherwise).
_FLOAT_DTYPES = {
    "float32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "float16": jnp.float16,
    "float64": jnp.float64,
}


def _require_int(name: str, value: Any, minimum: int) -> int:
    """`value` as a Python int, or raises naming `TFTConfig.{name}`.

    A NumPy integer is taken as its Python value, so that the config stays
    JSON-serialisable (`dataclasses.asdict` is how configs are saved).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"TFTConfig.{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"TFTConfig.{name} must be >= {minimum}, got {value}")
    return int(value)


# Each gate, add & norm normalizes over the model's D features: one feature normalizes to
# 0 and two to +-1, so a TFT of width 1 forecasts one value whatever its inputs and one of
# width 2 at most two values.
MIN_HIDDEN_DIM = 3


def check_hidden_dim(hidden_dim: int, owner: str) -> None:
    """Raises `ValueError` naming `{owner}.hidden_dim` when it is below `MIN_HIDDEN_DIM`."""
    if hidden_dim < MIN_HIDDEN_DIM:
        raise ValueError(
            f"{owner}.hidden_dim must be >= {MIN_HIDDEN_DIM}, got {hidden_dim}: every gate, "
            f"add & norm normalizes over the {hidden_dim} feature(s), so the forecasts would "
            f"take at most {hidden_dim} value(s) whatever the inputs"
        )


def _is_real_scalar(value: Any) -> bool:
    """Whether `value` is a real number: Python, NumPy or a 0-d array; not a bool or a string."""
    # Checked first: `result_type` would read a string as a dtype name.
    if value is None or isinstance(value, str | bytes | bool | np.bool_):
        return False
    try:
        dtype = jnp.result_type(value)
    except TypeError:
        return False
    real = jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)
    return real and np.ndim(value) == 0


def _quantile_levels(value: Any) -> tuple[float, ...]:
    """`TFTConfig.quantiles` as a tuple of Python floats, or raises naming the field.

    A string or a lone number is not a sequence of levels (a string would be
    read character by character), nor is a level that is not a real number.
    """
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(
            f"TFTConfig.quantiles must be a sequence of floats in (0, 1), got "
            f"{type(value).__name__} {value!r}"
        )
    levels = []
    for index, level in enumerate(value):
        if not _is_real_scalar(level):
            raise TypeError(
                f"TFTConfig.quantiles[{index}] must be a float, got {type(level).__name__} "
                f"{level!r}"
            )
        levels.append(float(level))
    return tuple(levels)


def canonical_dtype(name: str, value: Any) -> str:
    """Returns the name of a supported floating dtype, or raises naming the field.

    None is refused: NumPy reads it as float64, which is no default here.
    """
    if value is None:
        raise TypeError(f"{name} must be a floating dtype, got None")
    try:
        dtype_name = jnp.dtype(value).name
    except TypeError as error:
        raise TypeError(f"{name} must be a floating dtype, got {value!r}") from error
    if dtype_name not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be one of {sorted(_FLOAT_DTYPES)}, got {dtype_name!r}")
    return dtype_name


@dataclasses.dataclass(frozen=True)
class TFTConfig:
    """Hyperparameters of `TemporalFusionTransformer` (Lim et al. 2021).

    Attributes:
      num_static_features: real-valued static inputs `S` (may be 0).
      num_known_features: known-future inputs `K` (at least 1).
      num_observed_features: observed-only past inputs `U`, the target included
        by the caller (at least 1).
      hidden_dim: model width `D`, >= 3 (`MIN_HIDDEN_DIM`).
      num_heads: attention heads; must divide `hidden_dim`.
      sequence_length: history length `T`.
      prediction_horizon: forecast horizon `H`.
      quantiles: strictly increasing levels in (0, 1); any sequence (a list
        too), stored as a tuple of floats, as are the cardinalities as ints.
      dropout_rate: dropout probability in [0, 1).
      static_categorical_cardinalities: one cardinality per categorical static,
        each embedded into `variable_width` dimensions.
      known_categorical_cardinalities: one cardinality per categorical known
        input `Kc` (codes `(B, H, Kc)` over the horizon, and `(B, T, Kc)` over
        the history with `use_known_history`), each embedded by its own table
        of width `variable_width` (an entity embedding, as in the paper).
      observed_categorical_cardinalities: one cardinality per categorical
        observed input `Uc` (codes `(B, T, Uc)`), embedded the same way.
      variable_hidden_dim: width of each input variable's own GRN in the
        variable selection networks; None means `hidden_dim` (the paper).
      compact_selection: size the hidden layer of each variable selection
        network's weight GRN (the one over the flattened embeddings) at
        `min(hidden_dim, V)` for its `V` variables, as pytorch-forecasting
        does, instead of `hidden_dim` (the paper and its reference code).
        Fewer parameters and FLOPs; the same parameter names.
      attend_to_self: whether a time step may attend to itself (the paper and
        neuralforecast: True; pytorch-forecasting: False).
      use_known_history: whether the model takes the known inputs over the
        history too (`known_history (B, T, K)`, as in the paper); they then
        join the observed inputs in the history's variable selection.
      dtype: compute dtype: `float32`; `bfloat16` or `float16` for half
        precision (float16 keeps more digits than bfloat16 but holds only
        |x| <= 65504: inputs of that size, or activations that grow to it,
        become inf and the forecasts NaN, so scale the inputs); `float64`
        for finite-difference checks, which needs `jax_enable_x64` (the model
        raises `ValueError` when it runs without it: JAX would compute in
        float32). Parameters stay `param_dtype`.
      param_dtype: parameter dtype, from the same four; `float64` needs
        `jax_enable_x64` as well.
    """

    num_static_features: int = 5
    num_known_features: int = 10
    num_observed_features: int = 15
    hidden_dim: int = 32
    num_heads: int = 4
    sequence_length: int = 10
    prediction_horizon: int = 5
    quantiles: Sequence[float] = (0.1, 0.5, 0.9)
    dropout_rate: float = 0.1
    static_categorical_cardinalities: Sequence[int] = ()
    variable_hidden_dim: int | None = None
    compact_selection: bool = False
    attend_to_self: bool = True
    use_known_history: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    known_categorical_cardinalities: Sequence[int] = ()
    observed_categorical_cardinalities: Sequence[int] = ()

    def __post_init__(self) -> None:
        for field, minimum in (
            ("num_static_features", 0),
            ("num_known_features", 1),
            ("num_observed_features", 1),
            ("hidden_dim", 1),
            ("num_heads", 1),
            ("sequence_length", 1),
            ("prediction_horizon", 1),
        ):
            object.__setattr__(self, field, _require_int(field, getattr(self, field), minimum))
        check_hidden_dim(self.hidden_dim, "TFTConfig")
        if self.hidden_dim % self.num_heads:
            raise ValueError(
                f"TFTConfig.hidden_dim ({self.hidden_dim}) must be divisible by "
                f"TFTConfig.num_heads ({self.num_heads})"
            )
        if isinstance(self.dropout_rate, bool) or not isinstance(self.dropout_rate, numbers.Real):
            raise TypeError(f"TFTConfig.dropout_rate must be a float, got {self.dropout_rate!r}")
        if not 0.0 <= float(self.dropout_rate) < 1.0:
            raise ValueError(f"TFTConfig.dropout_rate must be in [0, 1), got {self.dropout_rate}")
        object.__setattr__(self, "dropout_rate", float(self.dropout_rate))

        quantiles = _quantile_levels(self.quantiles)
        if not quantiles:
            raise ValueError("TFTConfig.quantiles must hold at least one level, got ()")
        if any(not 0.0 < q < 1.0 for q in quantiles):
            raise ValueError(f"TFTConfig.quantiles must lie in (0, 1), got {quantiles}")
        if any(b <= a for a, b in itertools.pairwise(quantiles)):
            raise ValueError(f"TFTConfig.quantiles must be strictly increasing, got {quantiles}")
        object.__setattr__(self, "quantiles", quantiles)

        for field in (
            "static_categorical_cardinalities",
            "known_categorical_cardinalities",
            "observed_categorical_cardinalities",
        ):
            value = getattr(self, field)
            if isinstance(value, str | bytes) or not isinstance(value, Iterable):
                raise TypeError(f"TFTConfig.{field} must be a tuple of ints, got {value!r}")
            cardinalities = tuple(
                _require_int(f"{field}[{index}]", cardinality, 1)
                for index, cardinality in enumerate(value)
            )
            object.__setattr__(self, field, cardinalities)

        if self.variable_hidden_dim is not None:
            object.__setattr__(
                self,
                "variable_hidden_dim",
                _require_int("variable_hidden_dim", self.variable_hidden_dim, 1),
            )
        for flag in ("compact_selection", "attend_to_self", "use_known_history"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"TFTConfig.{flag} must be a bool, got {getattr(self, flag)!r}")
        object.__setattr__(self, "dtype", canonical_dtype("TFTConfig.dtype", self.dtype))
        object.__setattr__(
            self, "param_dtype", canonical_dtype("TFTConfig.param_dtype", self.param_dtype)
        )

    @property
    def num_quantiles(self) -> int:
        """Number of predicted quantiles `Q`."""
        return len(self.quantiles)

    @property
    def num_static_categoricals(self) -> int:
        """Number of categorical statics `C`."""
        return len(self.static_categorical_cardinalities)

    @property
    def num_static_inputs(self) -> int:
        """Variables seen by the static selection network: `S + C`."""
        return self.num_static_features + self.num_static_categoricals

    @property
    def num_known_categoricals(self) -> int:
        """Number of categorical known inputs `Kc`."""
        return len(self.known_categorical_cardinalities)

    @property
    def num_observed_categoricals(self) -> int:
        """Number of categorical observed inputs `Uc`."""
        return len(self.observed_categorical_cardinalities)

    @property
    def num_future_inputs(self) -> int:
        """Variables seen by the future's selection network: `K + Kc`."""
        return self.num_known_features + self.num_known_categoricals

    @property
    def input_dim(self) -> int:
        """Total number of input variables: `S + C + K + Kc + U + Uc`."""
        return (
            self.num_static_inputs
            + self.num_future_inputs
            + self.num_observed_features
            + self.num_observed_categoricals
        )

    @property
    def num_history_inputs(self) -> int:
        """Variables seen by the history's selection network.

        `U + Uc`, plus `K + Kc` with `use_known_history`.
        """
        observed = self.num_observed_features + self.num_observed_categoricals
        return observed + (self.num_future_inputs if self.use_known_history else 0)

    @property
    def variable_width(self) -> int:
        """Width of each per-variable GRN (`variable_hidden_dim` or `hidden_dim`)."""
        return self.variable_hidden_dim or self.hidden_dim

    def selection_hidden_dim(self, num_variables: int) -> int:
        """Hidden width of the weight GRN of a selection network over `num_variables`."""
        if self.compact_selection:
            return min(self.hidden_dim, num_variables)
        return self.hidden_dim

    @property
    def compute_dtype(self) -> Any:
        return _FLOAT_DTYPES[self.dtype]

    @property
    def parameter_dtype(self) -> Any:
        return _FLOAT_DTYPES[self.param_dtype]
