"""The Temporal Fusion Transformer (Lim et al. 2021) as a Flax Linen module."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import struct

from tft_jax._dropout import resolve_deterministic
from tft_jax.attention import causal_mask
from tft_jax.config import TFTConfig
from tft_jax.embeddings import CategoricalEmbedding, RealEmbedding, concatenate_variables
from tft_jax.gating import GateAddNorm, GatedResidualNetwork
from tft_jax.interpretable_attention import InterpretableMultiHeadAttention
from tft_jax.linear import Linear
from tft_jax.lstm import LSTM
from tft_jax.variable_selection import VariableSelectionNetwork

Array = Any

STATIC_CONTEXTS = ("selection", "enrichment", "state_h", "state_c")


@struct.dataclass
class TFTOutput:
    """What the TFT returns: forecasts and every interpretability weight.

    Attributes:
      quantiles: `(B, H, Q)` forecasts on the model's (scaled) output scale.
      attention: `(B, heads, H, T+H)` weights of the decoder queries over the window.
      static_weights: `(B, S+C)` static variable selection weights; columns: the
        real statics, then the categorical statics.
      history_weights: `(B, T, U+Uc[+K+Kc])` history variable selection
        weights; columns: the observed reals, the observed categoricals, then
        (with `use_known_history`) the known reals and the known categoricals.
      future_weights: `(B, H, K+Kc)` future variable selection weights;
        columns: the known reals, then the known categoricals.

    Within each group the columns follow the input's last axis.

    Dtypes: `quantiles` in the compute dtype (`TFTConfig.dtype`); every weight
    in at least float32 (float32 under bfloat16 compute), as its softmax
    computed it, so each row sums to 1 to float32 precision (rounded to
    bfloat16, rows were off by up to a few thousandths). The same for the QAT
    model and `int8_apply`.
    """

    quantiles: Array
    attention: Array
    static_weights: Array
    history_weights: Array
    future_weights: Array

    if TYPE_CHECKING:  # added by `flax.struct.dataclass` at runtime; declared for type checkers

        def replace(self, **changes: Any) -> Self:
            """A copy with the given fields replaced (`dataclasses.replace`)."""
            ...


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(np.shape(value))


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_float32_range(owner: str, name: str, value: Any, observed: Any = None) -> None:
    """Raises `ValueError` when a NumPy `value` holds finite values beyond float32's range.

    Cast to float32 (by `jax.jit` without `jax_enable_x64`, or by a model
    computing in float32) such a value becomes ±inf, and the output or the
    loss NaN or inf with no error; the wording is `tft_jax.losses`'. Only
    float dtypes wider than float32 are read (no other can hold such a
    value), and only NumPy arrays and scalars: a JAX array would be read back
    from the device, and a traced one cannot be read. With `observed` (a
    mask of `value`'s shape), only where it is nonzero.
    """
    if not isinstance(value, np.ndarray | np.generic):
        return
    if value.dtype.kind != "f" or value.dtype.itemsize <= 4:
        return
    values = np.asarray(value)
    too_large = np.isfinite(values) & (np.abs(values) > _FLOAT32_MAX)
    if observed is not None:
        too_large &= np.asarray(observed) != 0
    if too_large.any():
        first = tuple(int(i) for i in np.argwhere(too_large)[0])
        raise ValueError(
            f"{owner}: {name} holds {int(too_large.sum())} finite value(s) beyond float32's "
            f"range (|x| > {_FLOAT32_MAX:.7g}), the first {float(values[first])!r} at index "
            f"{first}; rescale them, or compute in float64 (jax_enable_x64, and "
            "TFTConfig(dtype='float64') for the TFT)"
        )


def check_x64_dtypes(config: TFTConfig) -> None:
    """Raises `ValueError` for a float64 `config.dtype` or `param_dtype` without `jax_enable_x64`.

    JAX then makes every float64 array float32, with one truncation warning
    per parameter and cast: the model would run in float32 while its config
    says float64. Checked when the model runs, not when the config is built:
    a config may be built before x64 is enabled.
    """
    if jax.config.jax_enable_x64:  # type: ignore[attr-defined]  # a flag jax adds at runtime
        return
    for field in ("dtype", "param_dtype"):
        if getattr(config, field) == "float64":
            raise ValueError(
                f"TemporalFusionTransformer: TFTConfig.{field} is 'float64', which needs "
                "jax_enable_x64 (without it JAX computes in float32): call "
                "jax.config.update('jax_enable_x64', True) at startup, or use 'float32'"
            )


class IntegerCodesError(TypeError, ValueError):
    """Categorical codes of a non-integer dtype (a `TypeError` and a `ValueError`)."""


def _check_array(name: str, value: Any, expected: tuple[Any, ...], integer: bool = False) -> None:
    """Raises `ValueError` naming `name` unless `value` has the `expected` shape.

    `expected` holds ints or None (any size); the message shows both shapes.
    A list or tuple, or an array of other than real numbers (integers with
    `integer`), raises `TypeError` (`IntegerCodesError` with `integer`).
    """
    if value is None:
        raise ValueError(
            f"TemporalFusionTransformer: {name} is required, expected shape {expected}"
        )
    kind = "integer codes in a" if integer else "a real-valued"
    error = IntegerCodesError if integer else TypeError
    # Before `np.shape`: under `jax.jit` a list is a pytree of tracers, which
    # `np.shape` cannot read (a TracerArrayConversionError naming no argument).
    if isinstance(value, list | tuple):
        raise error(
            f"TemporalFusionTransformer: {name} must be {kind} NumPy or JAX array, got "
            f"{type(value).__name__}"
        )
    shape = _shape(value)
    if len(shape) != len(expected) or any(
        want is not None and got != want for got, want in zip(shape, expected, strict=True)
    ):
        pretty = "(" + ", ".join("B" if want is None else str(want) for want in expected) + ")"
        raise ValueError(f"TemporalFusionTransformer: {name} must have shape {pretty}, got {shape}")
    try:
        dtype = jnp.result_type(value)
    except TypeError:
        # An array of strings or objects: JAX's message names no argument.
        got = type(value).__name__ + (f" of dtype {value.dtype}" if hasattr(value, "dtype") else "")
        raise error(
            f"TemporalFusionTransformer: {name} must be {kind} NumPy or JAX array, got {got}"
        ) from None
    if integer and not jnp.issubdtype(dtype, jnp.integer):
        raise IntegerCodesError(
            f"TemporalFusionTransformer: {name} must be integer codes, got {dtype}"
        )
    if not integer and not (
        jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)
    ):
        raise TypeError(f"TemporalFusionTransformer: {name} must be real-valued, got {dtype}")


def validate_inputs(
    config: TFTConfig,
    static: Any,
    historical: Any,
    future: Any,
    known_history: Any = None,
    static_categorical: Any = None,
    known_categorical_history: Any = None,
    future_categorical: Any = None,
    observed_categorical: Any = None,
) -> int:
    """Checks every input against `config` and returns the batch size `B`.

    Raises `ValueError` naming the argument (shape, range of categorical
    codes, an input the config does not take or lacks, a NumPy float64 real
    input holding finite values beyond float32's range when the model does
    not compute in float64: its first cast would make them ±inf); a float
    array given as categorical codes raises `IntegerCodesError` (a
    `ValueError` and a `TypeError`), a list or another non-array `TypeError`.
    NaN inputs are left to the caller: they show as NaN in the output.
    """
    cfg = config
    _check_array("historical", historical, (None, cfg.sequence_length, cfg.num_observed_features))
    batch = _shape(historical)[0]
    if batch == 0:
        raise ValueError("TemporalFusionTransformer: the batch is empty (historical has B = 0)")
    _check_array("future", future, (batch, cfg.prediction_horizon, cfg.num_known_features))
    if static is None and cfg.num_static_features == 0:
        pass
    else:
        _check_array("static", static, (batch, cfg.num_static_features))
    if cfg.use_known_history:
        _check_array(
            "known_history", known_history, (batch, cfg.sequence_length, cfg.num_known_features)
        )
    elif known_history is not None:
        raise ValueError(
            "TemporalFusionTransformer: known_history was given but "
            "TFTConfig.use_known_history is False; set it to True to use known inputs "
            f"over the history (got shape {_shape(known_history)})"
        )
    if cfg.dtype != "float64":
        reals = {"static": static, "historical": historical, "future": future}
        for name, value in {**reals, "known_history": known_history}.items():
            check_float32_range("TemporalFusionTransformer", name, value)
    steps, horizon = cfg.sequence_length, cfg.prediction_horizon
    known_cardinalities = cfg.known_categorical_cardinalities
    _check_codes(
        "static_categorical",
        static_categorical,
        (batch,),
        cfg.static_categorical_cardinalities,
        "static_categorical_cardinalities",
    )
    _check_codes(
        "future_categorical",
        future_categorical,
        (batch, horizon),
        known_cardinalities,
        "known_categorical_cardinalities",
    )
    _check_codes(
        "observed_categorical",
        observed_categorical,
        (batch, steps),
        cfg.observed_categorical_cardinalities,
        "observed_categorical_cardinalities",
    )
    if known_cardinalities and not cfg.use_known_history:
        if known_categorical_history is not None:
            raise ValueError(
                "TemporalFusionTransformer: known_categorical_history was given but "
                "TFTConfig.use_known_history is False; set it to True to use known inputs "
                f"over the history (got shape {_shape(known_categorical_history)})"
            )
    else:
        _check_codes(
            "known_categorical_history",
            known_categorical_history,
            (batch, steps),
            known_cardinalities,
            "known_categorical_cardinalities",
        )
    return batch


def _check_codes(
    name: str,
    codes: Any,
    leading: tuple[int, ...],
    cardinalities: Sequence[int],
    field: str,
) -> None:
    """Checks categorical `codes (*leading, len(cardinalities))`: shape, integer dtype, range.

    The range is checked for concrete inputs only: a traced value (inside
    `jax.jit`) cannot be inspected, and the embedding then clips an
    out-of-range code to the nearest row of its table.
    Without `cardinalities`, `codes` must be None (or have a last axis of 0).
    """
    if not cardinalities:
        if codes is not None and _shape(codes)[-1:] != (0,):
            raise ValueError(
                f"TemporalFusionTransformer: {name} was given but the config has no "
                f"{field} (got shape {_shape(codes)})"
            )
        return
    _check_array(name, codes, (*leading, len(cardinalities)), integer=True)
    if isinstance(codes, jax.core.Tracer):
        return
    values = np.asarray(codes).reshape(-1, len(cardinalities))
    for index, cardinality in enumerate(cardinalities):
        column = values[:, index]
        if column.min() < 0 or column.max() >= cardinality:
            where = ", ".join([":"] * len(leading) + [str(index)])
            raise ValueError(
                f"TemporalFusionTransformer: {name}[{where}] must lie in "
                f"[0, {cardinality}) (TFTConfig.{field}[{index}]), got values in "
                f"[{column.min()}, {column.max()}]"
            )


class TemporalFusionTransformer(nn.Module):
    """Multi-horizon quantile forecaster with interpretable attention (Lim et al. 2021).

    Inputs: `static (B, S)`, `historical (B, T, U)`, `future (B, H, K)`,
    optional `known_history (B, T, K)` (with `use_known_history`) and
    `static_categorical (B, C)` integer codes. Categorical inputs over time
    (integer codes, one entity embedding table per column, width
    `variable_width`): `future_categorical (B, H, Kc)` and, with
    `use_known_history`, `known_categorical_history (B, T, Kc)` (the
    categorical known inputs), `observed_categorical (B, T, Uc)`; they join
    the variable selection after the real inputs of their kind (see
    `TFTOutput` for the order). Returns a `TFTOutput`.

    Categorical codes outside `[0, cardinality)` raise `ValueError` naming
    the argument only where they are concrete: an `apply` outside `jax.jit`,
    and `tft_jax.train`'s steps, which check NumPy batches before their
    jitted step (the `Forecaster` and the CLI make codes from their
    vocabularies, in range by construction). Inside `jax.jit` the codes are
    traced and cannot be inspected: an out-of-range code is clipped to the
    nearest row of its embedding table (a negative code embeds as category
    0, one past the end as the last category), silently. Check codes before
    jitting the call: apply the model once without `jax.jit` on the batch, or
    check `0 <= codes < cardinality` in NumPy.

    Data flow: variable selection networks (statics unconditioned; history and
    future conditioned on the static selection context) -> LSTM encoder over
    the history seeded with the static state contexts `(h, c)` -> LSTM decoder
    over the horizon -> gated skip + LayerNorm -> static enrichment -> causal
    interpretable multi-head attention with the horizon steps as queries over
    all `T + H` steps -> gated skip -> position-wise GRN -> gated skip over the
    whole attention block (without dropout, as in the paper's code and
    pytorch-forecasting) -> linear quantile head.

    A float64 `TFTConfig.dtype` or `param_dtype` needs `jax_enable_x64`: the
    model raises `ValueError` when it runs (init or apply) without it, rather
    than compute in float32 with a truncation warning per array. Without
    `jax_enable_x64`, a `jax.jit` of the caller's own makes an int64 input
    int32 as it enters, wrapping values beyond int32's range before the model
    sees them: pass such inputs as float32 (`tft_jax.train`'s steps convert
    NumPy integers themselves). A NumPy float64 input beyond float32's range
    raises `ValueError` outside `jax.jit` (the float32 model would see ±inf).

    `dot_general_cls` replaces every weight matmul (see `tft_jax.linear`); it
    is how `qat` quantizes this very model. Dropout uses the `'dropout'` RNG;
    with `dropout_rate > 0` every `apply` must say `deterministic=True`
    (inference) or `False` (training), or it raises `ValueError` (`init` may
    leave it out).
    """

    config: TFTConfig
    dot_general_cls: Callable[..., nn.Module] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.config, TFTConfig):
            raise TypeError(
                f"TemporalFusionTransformer: config must be a TFTConfig, got "
                f"{type(self.config).__name__}"
            )
        super().__post_init__()

    @nn.compact
    def __call__(
        self,
        static: Array | None,
        historical: Array,
        future: Array,
        known_history: Array | None = None,
        static_categorical: Array | None = None,
        deterministic: bool | None = None,
        known_categorical_history: Array | None = None,
        future_categorical: Array | None = None,
        observed_categorical: Array | None = None,
    ) -> TFTOutput:
        cfg = self.config
        check_x64_dtypes(cfg)
        batch = validate_inputs(
            cfg,
            static,
            historical,
            future,
            known_history,
            static_categorical,
            known_categorical_history,
            future_categorical,
            observed_categorical,
        )
        deterministic = resolve_deterministic(
            "TemporalFusionTransformer", deterministic, cfg.dropout_rate, self.is_initializing()
        )
        dtype = cfg.compute_dtype
        width = cfg.variable_width
        hidden = cfg.hidden_dim
        steps = cfg.sequence_length
        common = dict(
            dtype=dtype, param_dtype=cfg.parameter_dtype, dot_general_cls=self.dot_general_cls
        )
        gated = dict(dropout_rate=cfg.dropout_rate, **common)

        def grn(name: str) -> GatedResidualNetwork:
            return GatedResidualNetwork(hidden, name=name, **gated)

        def categorical_embedding(cardinalities: Sequence[int], name: str) -> nn.Module:
            return CategoricalEmbedding(
                cardinalities, width, dtype=dtype, param_dtype=cfg.parameter_dtype, name=name
            )

        # Static covariate encoders: four contexts, each routed to one place.
        contexts: dict[str, Array | None] = dict.fromkeys(STATIC_CONTEXTS)
        if cfg.num_static_inputs:
            parts: list[Array] = []  # arrays: the static RealEmbedding is not lazy
            if cfg.num_static_features:
                parts.append(
                    RealEmbedding(
                        cfg.num_static_features, width, name="static_embedding", **common
                    )(jnp.asarray(static, dtype))
                )
            if cfg.num_static_categoricals:
                parts.append(
                    categorical_embedding(
                        cfg.static_categorical_cardinalities, "static_categorical_embedding"
                    )(jnp.asarray(static_categorical))
                )
            static_encoding, static_weights = VariableSelectionNetwork(
                cfg.num_static_inputs,
                hidden,
                selection_hidden_features=cfg.selection_hidden_dim(cfg.num_static_inputs),
                name="static_selection",
                **gated,
            )(jnp.concatenate(parts, axis=1), None, deterministic)
            for context in STATIC_CONTEXTS:
                contexts[context] = grn(f"static_context_{context}")(
                    static_encoding, None, deterministic
                )
        else:
            static_weights = jnp.zeros((batch, 0), jnp.float32)

        # Variable selection over the history and the horizon: reals, then categoricals.
        # Lazy: the selection networks fold the real embeddings into their first layers
        # (when every variable is real; categoricals materialize them).
        real_known = RealEmbedding(
            cfg.num_known_features, width, name="known_embedding", lazy=True, **common
        )
        categorical_known = (
            categorical_embedding(
                cfg.known_categorical_cardinalities, "known_categorical_embedding"
            )
            if cfg.num_known_categoricals
            else None
        )

        def known_embedding(reals: Array, codes: Array | None) -> Array:
            embedded = real_known(jnp.asarray(reals, dtype))
            if categorical_known is None:
                return embedded
            return concatenate_variables([embedded, categorical_known(jnp.asarray(codes))])

        history_parts = [
            RealEmbedding(
                cfg.num_observed_features, width, name="observed_embedding", lazy=True, **common
            )(jnp.asarray(historical, dtype))
        ]
        if cfg.num_observed_categoricals:
            history_parts.append(
                categorical_embedding(
                    cfg.observed_categorical_cardinalities, "observed_categorical_embedding"
                )(jnp.asarray(observed_categorical))
            )
        if cfg.use_known_history:
            history_parts.append(known_embedding(known_history, known_categorical_history))
        history_embedded = (
            concatenate_variables(history_parts) if len(history_parts) > 1 else history_parts[0]
        )
        history_encoding, history_weights = VariableSelectionNetwork(
            cfg.num_history_inputs,
            hidden,
            selection_hidden_features=cfg.selection_hidden_dim(cfg.num_history_inputs),
            name="history_selection",
            **gated,
        )(history_embedded, contexts["selection"], deterministic)
        future_encoding, future_weights = VariableSelectionNetwork(
            cfg.num_future_inputs,
            hidden,
            selection_hidden_features=cfg.selection_hidden_dim(cfg.num_future_inputs),
            name="future_selection",
            **gated,
        )(known_embedding(future, future_categorical), contexts["selection"], deterministic)

        # Sequence-to-sequence LSTM seeded with the static state.
        initial_state = (
            None if contexts["state_h"] is None else (contexts["state_h"], contexts["state_c"])
        )
        encoded, state = LSTM(hidden, name="encoder", **common)(history_encoding, initial_state)
        decoded, _ = LSTM(hidden, name="decoder", **common)(future_encoding, state)
        temporal = GateAddNorm(hidden, name="lstm_gate", **gated)(
            jnp.concatenate([encoded, decoded], axis=1),
            jnp.concatenate([history_encoding, future_encoding], axis=1),
            deterministic,
        )

        # Static enrichment, then attention of the horizon steps over the whole window.
        enriched = grn("static_enrichment")(temporal, contexts["enrichment"], deterministic)
        mask = causal_mask(
            cfg.prediction_horizon, steps + cfg.prediction_horizon, cfg.attend_to_self
        )
        attended, attention = InterpretableMultiHeadAttention(
            cfg.num_heads, hidden, name="attention", **gated
        )(enriched[:, steps:], enriched, mask, deterministic)
        attended = GateAddNorm(hidden, name="attention_gate", **gated)(
            attended, enriched[:, steps:], deterministic
        )
        decoded_features = grn("positionwise_grn")(attended, None, deterministic)
        # The last gated skip has no dropout, as in the paper's code and pytorch-forecasting.
        decoded_features = GateAddNorm(hidden, name="output_gate", **common)(
            decoded_features, temporal[:, steps:], deterministic
        )
        quantiles = Linear(cfg.num_quantiles, name="quantile_head", **common)(decoded_features)
        return TFTOutput(
            quantiles=quantiles,
            attention=attention,
            static_weights=static_weights,
            history_weights=history_weights,
            future_weights=future_weights,
        )
