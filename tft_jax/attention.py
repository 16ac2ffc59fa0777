"""Scaled dot-product attention and the temporal self-attention block.

`scaled_dot_product_attention` is the one attention kernel of the project:
`AttentionHead`, `TemporalSelfAttention` and the TFT's interpretable
multi-head attention all call it.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Literal, overload

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from tft_jax import fused_attention
from tft_jax._dropout import resolve_deterministic
from tft_jax.gating import check_dropout_rate, check_positive_int
from tft_jax.linear import check_float_dtype, check_floating

Array = Any
Dtype = Any


def causal_mask(num_queries: int, num_keys: int, attend_to_self: bool = True) -> np.ndarray:
    """Boolean `(num_queries, num_keys)` mask, True = may attend.

    Queries are the last `num_queries` of the `num_keys` steps, so query `i`
    sits at step `num_keys - num_queries + i` and may attend to every step
    before it, and to itself when `attend_to_self`.

    Raises:
      ValueError: not `0 <= num_queries <= num_keys` (more queries than steps
        would give rows with no allowed key, a negative count an empty mask,
        both silently).
    """
    for name, size in (("num_queries", num_queries), ("num_keys", num_keys)):
        if isinstance(size, bool) or not isinstance(size, numbers.Integral):
            raise TypeError(f"causal_mask: {name} must be an int, got {size!r}")
    if not 0 <= num_queries <= num_keys:
        raise ValueError(
            f"causal_mask: need 0 <= num_queries <= num_keys (the queries are the last "
            f"num_queries of the num_keys steps), got num_queries={num_queries}, "
            f"num_keys={num_keys}"
        )
    query_steps = np.arange(num_keys - num_queries, num_keys)[:, None]
    key_steps = np.arange(num_keys)[None, :]
    return key_steps <= query_steps if attend_to_self else key_steps < query_steps


def _check_concrete_positive(name: str, value: Any, scalar: bool = True) -> None:
    """Raises `ValueError` unless `value` is a positive scalar (positivity: concrete values only).

    A non-scalar temperature would broadcast silently against the key axis of
    the logits, so its shape is checked even under a trace (unless `scalar`
    is False: the kernel takes any temperature that broadcasts).
    """
    if scalar and jnp.ndim(value) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {tuple(jnp.shape(value))}")
    if isinstance(value, jax.core.Tracer):
        return
    if not np.all(np.asarray(value) > 0):
        raise ValueError(f"{name} must be positive, got {value}")


def _check_attention_shapes(query: Array, key: Array, value: Array, mask: Array | None) -> None:
    """Raises `ValueError` naming the argument unless the shapes fit together.

    Mismatched depths or step counts would otherwise fail inside `matmul`
    without naming an argument, and a mask with more leading axes than the
    logits (a `(B, 1, Tq, Tk)` mask for a 3-D query) would broadcast the
    weights and the output to a larger shape, silently.
    """
    for name, array in (("query", query), ("key", key), ("value", value)):
        if array.ndim < 2:
            raise ValueError(
                f"scaled_dot_product_attention: {name} must have at least 2 axes (..., T, d), "
                f"got shape {array.shape}"
            )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            "scaled_dot_product_attention: query (..., Tq, d) and key (..., Tk, d) must have "
            f"the same depth d, got shapes {query.shape} and {key.shape}"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            "scaled_dot_product_attention: key (..., Tk, d) and value (..., Tk, dv) must have "
            f"the same number of steps Tk, got shapes {key.shape} and {value.shape}"
        )
    try:
        leading = jnp.broadcast_shapes(query.shape[:-2], key.shape[:-2])
        jnp.broadcast_shapes(leading, value.shape[:-2])
    except ValueError:
        raise ValueError(
            "scaled_dot_product_attention: the leading axes of query, key and value must "
            f"broadcast, got shapes {query.shape}, {key.shape} and {value.shape}"
        ) from None
    if mask is None:
        return
    logits_shape = (*leading, query.shape[-2], key.shape[-2])
    try:
        fits = jnp.broadcast_shapes(mask.shape, logits_shape) == logits_shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            "scaled_dot_product_attention: mask must broadcast to the logits' shape "
            f"(..., Tq, Tk) = {logits_shape} without enlarging it, got {mask.shape}"
        )


def _check_temperature_shape(temperature: Any, logits_shape: tuple[int, ...]) -> None:
    """Raises `ValueError` unless `temperature` broadcasts to the logits without enlarging them."""
    shape = tuple(jnp.shape(temperature))
    try:
        fits = jnp.broadcast_shapes(shape, logits_shape) == logits_shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            "scaled_dot_product_attention: temperature must be a scalar or broadcast to the "
            f"logits' shape (..., Tq, Tk) = {logits_shape} without enlarging it, got {shape}"
        )


def scaled_dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None = None,
    temperature: float | Array = 1.0,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool | None = None,
) -> tuple[Array, Array]:
    """`softmax(Q Kᵀ / (sqrt(d) · temperature) + mask) V` with a NaN-free masked softmax.

    Args:
      query: `(..., Tq, d)`.
      key: `(..., Tk, d)`.
      value: `(..., Tk, dv)`; leading axes broadcast against the weights, so a
        value shared by all heads can be passed with a head axis of size 1.
      mask: boolean, broadcastable to `(..., Tq, Tk)` (the logits' shape, which
        it may not enlarge); True = may attend. A
        query row with no allowed key gets all-zero weights and a zero output.
        Blocked keys must hold finite values: a weight of 0 times a NaN or inf
        value is NaN, so a non-finite value at a blocked key still reaches the
        outputs through the weighted sum (pad with zeros, not NaN).
        Any other dtype raises `TypeError`: read as `mask != 0`, an additive
        mask (0 = attend, -inf = blocked) would be inverted silently.
      temperature: divides the logits (> 1 flattens the distribution); any
        positive value that broadcasts. Checked when concrete; a traced one is
        not (0 then gives NaN, a negative one inverts the attention).
      dropout_rate: dropout on the attention probabilities when not deterministic.
      dropout_rng: PRNG key for that dropout (needed with `deterministic=False`).
      deterministic: required when `dropout_rate > 0` (False: dropout on,
        with `dropout_rng`; True: off), as in every module with dropout
        (`tft_jax._dropout`): a default would switch dropout off, or on,
        silently; may be left out without dropout.

    Returns:
      `(output (..., Tq, dv), weights (..., Tq, Tk))` in `query`'s dtype; the
      weights are the probabilities before dropout (what interpretability
      reads), computed (logits and softmax) in at least float32 and rounded
      to `query`'s dtype only at the end.

    Raises:
      TypeError: `mask` is not boolean, `query` is not floating point (the
        weights take its dtype: cast to integers, all zero), or
        `deterministic` is not a bool (or is traced while `dropout_rate > 0`).
      ValueError: `dropout_rate` is outside [0, 1) (1 zeroes the output, a
        negative rate switches dropout off), `dropout_rate > 0` without
        `deterministic`, `deterministic=False` with a rate but no
        `dropout_rng`, a concrete `temperature` is
        not positive (0 gives NaN, a negative one inverts the attention), or
        the shapes do not fit (depths, step counts, leading axes, a mask that
        would enlarge the logits).
    """
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    check_floating("scaled_dot_product_attention", "query", query)
    check_dropout_rate("scaled_dot_product_attention", dropout_rate)
    deterministic = resolve_deterministic(
        "scaled_dot_product_attention", deterministic, dropout_rate
    )
    _check_concrete_positive("scaled_dot_product_attention: temperature", temperature, False)
    # A mask known on the host (NumPy) with an allowed key in every row needs no
    # zeroing of empty rows: left in, XLA constant-folds that reduction over the
    # mask at every compile (seconds for thousands of steps).
    every_row_attends = isinstance(mask, np.ndarray) and bool(np.any(mask, axis=-1).all())
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.dtype != jnp.bool_:
            raise TypeError(
                "scaled_dot_product_attention: mask must be boolean (True = may attend), got "
                f"dtype {mask.dtype} (read as mask != 0, an additive mask would be inverted)"
            )
    _check_attention_shapes(query, key, value, mask)
    leading = jnp.broadcast_shapes(query.shape[:-2], key.shape[:-2])
    _check_temperature_shape(temperature, (*leading, query.shape[-2], key.shape[-2]))
    dtype = query.dtype
    # The logits and the softmax in at least float32 (float64 stays float64 for finite
    # differences). Logits rounded to bfloat16 (a matmul's default output dtype) before
    # the softmax are off by up to 2^-8 of their size, 0.08 at a logit of 20: the weights
    # moved by several percent, ten times their own bfloat16 rounding.
    softmax_dtype = jnp.promote_types(jnp.result_type(query, key), jnp.float32)
    depth = query.shape[-1]
    logits = jnp.matmul(
        query, jnp.swapaxes(key, -1, -2), preferred_element_type=softmax_dtype
    ).astype(softmax_dtype)
    logits = logits / (math.sqrt(depth) * jnp.asarray(temperature, softmax_dtype))
    if mask is not None:
        # The dtype's lowest finite value, not -inf or -1e9: no inf - inf in the softmax,
        # no overflow in half precision (pytorch-forecasting issue #285).
        logits = jnp.where(mask, logits, jnp.finfo(softmax_dtype).min)
    weights = jax.nn.softmax(logits, axis=-1)
    if mask is not None and not every_row_attends:
        weights = jnp.where(jnp.any(mask, axis=-1, keepdims=True), weights, 0.0)
    weights = weights.astype(dtype)
    probabilities = weights
    if not deterministic and dropout_rate > 0.0:
        if dropout_rng is None:
            raise ValueError("scaled_dot_product_attention: dropout_rng is required for dropout")
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
        probabilities = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0).astype(dtype)
    output = jnp.matmul(probabilities, value.astype(dtype))
    return output, weights


def sinusoidal_encoding(length: int, dim: int, dtype: Dtype = np.float32) -> np.ndarray:
    """Interleaved sinusoidal positions `(length, dim)` of Vaswani et al. (2017).

    `PE[t, 2i] = sin(t / 10000^(2i/dim))`, `PE[t, 2i+1] = cos(t / 10000^(2i/dim))`,
    computed in float64 and rounded once to `dtype` (float32 by default;
    float64 keeps every digit, for float64 inputs under `jax_enable_x64`).
    Raises `ValueError` unless `length >= 0` and `dim >= 1` are ints, and
    `TypeError` unless `dtype` is a floating-point dtype.
    """
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 0:
        raise ValueError(f"sinusoidal_encoding: length must be an int >= 0, got {length!r}")
    check_positive_int("sinusoidal_encoding", "dim", dim)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"sinusoidal_encoding: dtype must be a float dtype, got {dtype!r}")
    positions = np.arange(length, dtype=np.float64)[:, None]
    even = np.arange(0, dim, 2, dtype=np.float64)
    angles = positions / np.power(10000.0, even / dim)
    encoding = np.zeros((length, dim), dtype=np.float64)
    encoding[:, 0::2] = np.sin(angles)
    encoding[:, 1::2] = np.cos(angles[:, : dim // 2])
    return encoding.astype(dtype)


class PositionalEncoding(nn.Module):
    """Adds the interleaved sinusoidal encoding: `(B, T, dim) -> (B, T, dim)`; no parameters.

    The encoding is rounded to float32 and then to `x`'s dtype, except for a
    float64 `x` (under `jax_enable_x64`), which gets it in float64.
    """

    dim: int

    def __post_init__(self) -> None:
        check_positive_int("PositionalEncoding", "dim", self.dim)
        super().__post_init__()

    def __call__(self, x: Array) -> Array:
        x = jnp.asarray(x)
        if x.ndim < 2 or x.shape[-1] != self.dim:
            raise ValueError(
                f"PositionalEncoding: x must have shape (..., T, {self.dim}), got {tuple(x.shape)}"
            )
        # An integer x would truncate the encoding to integers.
        check_floating("PositionalEncoding", "x", x)
        if x.dtype == jnp.float64:
            encoding = sinusoidal_encoding(x.shape[-2], self.dim, np.float64)
        else:  # as it always was: a float32 table, cast to x's dtype
            encoding = sinusoidal_encoding(x.shape[-2], self.dim)
        return x + jnp.asarray(encoding, x.dtype)


def _check_flag(owner: str, name: str, value: Any) -> None:
    """Raises `TypeError` unless `value` is a Python or NumPy bool.

    The flag selects the computation in Python: a string such as `"False"` is
    truthy and would silently switch it on, and a traced value fails inside
    JAX with an error that does not name the argument.
    """
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{owner}: {name} must be a concrete Python bool, got a traced value; under "
            f"jax.jit pass it as a static argument (static_argnames=...)"
        )
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{owner}: {name} must be a bool, got {type(value).__name__} {value!r}")


def _check_sequence(name: str, x: Array, hidden_dim: int) -> None:
    if x.ndim != 3:
        raise ValueError(f"{name}: x must be 3-D (B, T, {hidden_dim}), got shape {tuple(x.shape)}")
    if x.shape[-1] != hidden_dim:
        raise ValueError(
            f"{name}: x.shape[-1] must equal hidden_dim={hidden_dim}, got {x.shape[-1]} "
            f"(shape {tuple(x.shape)})"
        )
    if x.shape[1] == 0:
        raise ValueError(f"{name}: sequence length T must be > 0, got shape {tuple(x.shape)}")
    check_floating(name, "x", x)


class AttentionHead(nn.Module):
    """One attention head with its own Q/K/V projections: `(B, T, D) -> (B, T, head_dim)`.

    Returns `(output (B, T, head_dim), weights (B, T, T))`. `mask` is boolean
    `(T, T)` or `(B, T, T)`, True = may attend.
    """

    hidden_dim: int
    head_dim: int
    dtype: Dtype | None = None

    def __post_init__(self) -> None:
        for name in ("hidden_dim", "head_dim"):
            check_positive_int("AttentionHead", name, getattr(self, name))
        check_float_dtype("AttentionHead", "dtype", self.dtype, optional=True)
        super().__post_init__()

    @nn.compact
    def __call__(
        self, x: Array, mask: Array | None = None, temperature: float | Array = 1.0
    ) -> tuple[Array, Array]:
        x = jnp.asarray(x)
        _check_sequence("AttentionHead", x, self.hidden_dim)
        steps = x.shape[1]
        if mask is not None:
            mask = jnp.asarray(mask)
            if mask.dtype != jnp.bool_:
                raise TypeError(f"AttentionHead: mask must be boolean, got dtype {mask.dtype}")
            if mask.shape not in ((steps, steps), (x.shape[0], steps, steps)):
                raise ValueError(
                    f"AttentionHead: mask must have shape ({steps}, {steps}) or "
                    f"({x.shape[0]}, {steps}, {steps}), got {tuple(mask.shape)}"
                )
        _check_concrete_positive("AttentionHead: temperature", temperature)
        dtype = self.dtype or x.dtype
        query = nn.Dense(self.head_dim, dtype=dtype, name="query")(x)
        key = nn.Dense(self.head_dim, dtype=dtype, name="key")(x)
        value = nn.Dense(self.head_dim, dtype=dtype, name="value")(x)
        return scaled_dot_product_attention(query, key, value, mask, temperature)


class TemporalSelfAttention(nn.Module):
    """Multi-head self-attention over time with positional encoding, residual and LayerNorm.

    `y = LayerNorm(h + Dropout(W_o · MultiHead(h)))` with `h = x + PE`
    (`h = x` with `use_positional_encoding=False`, e.g. for every block of a
    stack but the first); head `j` uses columns `j·head_dim:(j+1)·head_dim` of
    the Q/K/V projections. Shapes: `x (B, T, D) -> y (B, T, D)`, weights
    `(B, heads, T, T)`.

    `use_flash_attention=True` computes the same function with
    `jax.nn.dot_product_attention`: cuDNN's fused kernel where it applies (a
    CUDA GPU, bfloat16/float16, a concrete temperature; the conditions are in
    `tft_jax.fused_attention`), XLA's kernel elsewhere. Fused kernels do not
    expose the probabilities, so on that path there is no dropout on them
    (dropout applies to the output projection only), and
    `return_weights=True` recomputes the weights with the explicit kernel.
    JAX's kernel computes in float32 at most: float64 inputs get float32
    accuracy there (use the default path for float64 gradient checks).
    As with the kernel, masked (padded or future) steps must hold finite
    values: 0 times NaN is NaN.

    Args (call):
      x: `(B, T, D)`.
      causal: step `t` attends to steps `s <= t` only. A bool, static under
        `jax.jit` (as are `deterministic` and `return_weights`); anything
        else raises `TypeError`.
      deterministic: required when `dropout_rate > 0` (False: dropout on,
        with the `'dropout'` RNG; True: off); may be left out without dropout.
      return_weights: also return the attention weights `(B, heads, T, T)`.
      temperature: a positive scalar dividing the logits. Checked when
        concrete; a traced one (a `jax.jit` argument) is not: 0 then gives
        NaN and a negative one inverts the attention, silently.
      mask: optional boolean user mask, combined with `causal` (both must
        allow a pair): `(B, T)` marks the valid steps (a padded step is never
        attended to; its own output row is computed but meaningless), or
        `(B, 1, T, T)` / `(B, heads, T, T)` with True = query may attend to
        key. A query with no allowed key gets zero weights and a zero
        attention output (`y = LayerNorm(h + b_out)` there), never NaN. A
        `(T, T)` pair mask (as `AttentionHead` takes) goes in as
        `mask[None, None]` broadcast to `(B, 1, T, T)`: given as it is, it is
        refused, or read as `(B, T)` valid steps when `B == T`.
    """

    hidden_dim: int
    num_heads: int
    dropout_rate: float = 0.0
    use_flash_attention: bool = False
    dtype: Dtype | None = None
    use_positional_encoding: bool = True

    def __post_init__(self) -> None:
        for name in ("hidden_dim", "num_heads"):
            check_positive_int("TemporalSelfAttention", name, getattr(self, name))
        if self.hidden_dim % self.num_heads:
            raise ValueError(
                f"TemporalSelfAttention: hidden_dim ({self.hidden_dim}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )
        check_dropout_rate("TemporalSelfAttention", self.dropout_rate)
        # Truthiness would pick the path: "no" fused, None no positional encoding.
        for name in ("use_flash_attention", "use_positional_encoding"):
            _check_flag("TemporalSelfAttention", name, getattr(self, name))
        check_float_dtype("TemporalSelfAttention", "dtype", self.dtype, optional=True)
        super().__post_init__()

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.num_heads

    @overload
    def __call__(
        self,
        x: Array,
        causal: bool = ...,
        deterministic: bool | None = ...,
        return_weights: Literal[False] = ...,
        temperature: float | Array = ...,
        mask: Array | None = ...,
    ) -> Array: ...

    @overload
    def __call__(
        self,
        x: Array,
        causal: bool,
        deterministic: bool | None,
        return_weights: Literal[True],
        temperature: float | Array = ...,
        mask: Array | None = ...,
    ) -> tuple[Array, Array]: ...

    @overload
    def __call__(
        self,
        x: Array,
        causal: bool = ...,
        deterministic: bool | None = ...,
        *,
        return_weights: Literal[True],
        temperature: float | Array = ...,
        mask: Array | None = ...,
    ) -> tuple[Array, Array]: ...

    @overload
    def __call__(
        self,
        x: Array,
        causal: bool = ...,
        deterministic: bool | None = ...,
        return_weights: bool = ...,
        temperature: float | Array = ...,
        mask: Array | None = ...,
    ) -> Array | tuple[Array, Array]: ...

    @nn.compact
    def __call__(
        self,
        x: Array,
        causal: bool = True,
        deterministic: bool | None = None,
        return_weights: bool = False,
        temperature: float | Array = 1.0,
        mask: Array | None = None,
    ) -> Array | tuple[Array, Array]:
        deterministic = resolve_deterministic(
            "TemporalSelfAttention", deterministic, self.dropout_rate, self.is_initializing()
        )
        for name, flag in (("causal", causal), ("return_weights", return_weights)):
            _check_flag("TemporalSelfAttention", name, flag)
        causal, return_weights = bool(causal), bool(return_weights)
        x = jnp.asarray(x)
        _check_sequence("TemporalSelfAttention", x, self.hidden_dim)
        _check_concrete_positive("TemporalSelfAttention: temperature", temperature)
        dtype = self.dtype or x.dtype
        batch, steps, _ = x.shape
        allowed = attention_mask(mask, batch, steps, self.num_heads, causal)
        h = x.astype(dtype)
        if self.use_positional_encoding:
            h = PositionalEncoding(self.hidden_dim)(h)

        def heads(name: str) -> Array:
            projected = nn.Dense(self.hidden_dim, dtype=dtype, name=name)(h)
            return projected.reshape(batch, steps, self.num_heads, self.head_dim)

        query, key, value = heads("query"), heads("key"), heads("value")
        weights = None
        if self.use_flash_attention:
            fixed_scale = fused_attention.concrete_scale(self.head_dim, temperature)
            implementation = fused_attention.flash_implementation(
                query.dtype, self.head_dim, fixed_scale, mask is not None, steps
            )
            scale = (
                fixed_scale
                if implementation == "cudnn"
                else 1.0 / (math.sqrt(self.head_dim) * jnp.asarray(temperature, jnp.float32))
            )
            # Without a user mask the kernel builds the causal one itself.
            user_allowed = None if mask is None else allowed  # an array when mask is given
            attended = fused_attention.dot_product_attention(
                query,
                key,
                value,
                scale=scale,
                implementation=implementation,
                is_causal=causal and mask is None,
                mask=user_allowed,
            )
            if user_allowed is not None:
                # The fused softmax spreads a fully masked row uniformly; the contract is zeros.
                any_allowed = jnp.swapaxes(jnp.any(user_allowed, axis=-1), 1, 2)[..., None]
                attended = jnp.where(any_allowed, attended, jnp.zeros((), attended.dtype))
        else:
            # (B, heads, T, head_dim) layout for the explicit kernel.
            q, k, v = (jnp.swapaxes(t, 1, 2) for t in (query, key, value))
            attended, weights = scaled_dot_product_attention(
                q,
                k,
                v,
                mask=allowed,
                temperature=temperature,
                dropout_rate=self.dropout_rate,
                dropout_rng=None
                if deterministic or self.dropout_rate == 0.0
                else self.make_rng("dropout"),
                deterministic=deterministic,
            )
            attended = jnp.swapaxes(attended, 1, 2)
        merged = attended.reshape(batch, steps, self.hidden_dim)
        projected = nn.Dense(self.hidden_dim, dtype=dtype, name="out")(merged)
        projected = nn.Dropout(self.dropout_rate)(projected, deterministic=deterministic)
        y = nn.LayerNorm(dtype=dtype, name="layer_norm")(h + projected)
        if not return_weights:
            return y
        if weights is None:
            q, k, v = (jnp.swapaxes(t, 1, 2) for t in (query, key, value))
            _, weights = scaled_dot_product_attention(
                q, k, v, mask=allowed, temperature=temperature
            )
        return y, weights


def attention_mask(
    mask: Array | None, batch: int, steps: int, num_heads: int, causal: bool
) -> Array | None:
    """The boolean mask `(B, 1|heads, T, T)` (or `(T, T)`) allowed by `mask` and `causal`.

    `mask` is None, `(B, T)` valid steps (keys outside are never attended
    to), or `(B, 1|heads, T, T)` with True = may attend. Returns None when
    nothing is masked.

    Raises:
      TypeError: `mask` is not boolean.
      ValueError: `mask` has another shape (the message shows both).
    """
    causal_part = causal_mask(steps, steps) if causal else None
    if mask is None:
        return causal_part  # NumPy: the kernel sees that every row attends
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"TemporalSelfAttention: mask must be boolean, got dtype {mask.dtype}")
    if mask.shape == (batch, steps):
        mask = mask[:, None, None, :]
    elif mask.ndim != 4 or mask.shape not in (
        (batch, 1, steps, steps),
        (batch, num_heads, steps, steps),
    ):
        raise ValueError(
            f"TemporalSelfAttention: mask must have shape (B, T) = ({batch}, {steps}) or "
            f"(B, 1|heads, T, T) = ({batch}, 1 or {num_heads}, {steps}, {steps}), "
            f"got {tuple(mask.shape)}"
        )
    if causal_part is not None:
        mask = mask & causal_part
    return jnp.broadcast_to(mask, (batch, mask.shape[1], steps, steps))
