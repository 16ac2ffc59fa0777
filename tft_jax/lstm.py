"""A single-layer LSTM over time, scanned with `nn.scan`, seeded with a given state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import lax

from tft_jax.linear import Linear, check_floating, check_input_width, check_positive_int

Array = Any
Dtype = Any

# Collections read (never written) inside the scanned step: parameters, and the
# quantization state that `qat` may attach to the recurrent projection.
_BROADCAST_COLLECTIONS = ("params", "quant_stats", "int8")


def _lstm_bias_init(key: Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> Array:
    """Zero biases except the forget gate's, set to 1 (Jozefowicz et al. 2015; Keras' default)."""
    del key
    features = shape[0] // 4
    return jnp.zeros(shape, dtype).at[features : 2 * features].set(1.0)


def _orthogonal(key: Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> Array:
    """Flax's orthogonal initializer, computed in at least float32 and cast to `dtype`.

    Its QR decomposition has no bfloat16 or float16 kernel, so half-precision
    parameters are drawn in float32; float32 and float64 values are Flax's own.
    """
    wide = jnp.promote_types(dtype, jnp.float32)
    return nn.initializers.orthogonal()(key, shape, wide).astype(dtype)


class _LSTMStep(nn.Module):
    """One LSTM step given the precomputed input projection of that step."""

    features: int
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    dot_general_cls: Callable[..., nn.Module] | None = None

    @nn.compact
    def __call__(self, carry: tuple[Array, ...], input_gates: Array):
        # A quantized model carries (h / scale, c, scale), see `_scaled_into_unit_range`.
        hidden, cell, *scale = carry
        projected = Linear(
            4 * self.features,
            use_bias=False,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=_orthogonal,
            dot_general_cls=self.dot_general_cls,
            # h = o · tanh(c) lies in [-1, 1]: a quantizer needs no observer for it.
            input_bounds=(-1.0, 1.0),
            name="recurrent",
        )(hidden)
        gates = input_gates + (projected * scale[0] if scale else projected)
        input_gate, forget_gate, candidate, output_gate = jnp.split(gates, 4, axis=-1)
        cell = nn.sigmoid(forget_gate) * cell + nn.sigmoid(input_gate) * jnp.tanh(candidate)
        hidden = nn.sigmoid(output_gate) * jnp.tanh(cell)
        if scale:  # every later h is in [-1, 1]
            return (hidden, cell, jnp.ones_like(scale[0])), hidden
        return (hidden, cell), hidden


def _scaled_into_unit_range(hidden: Array) -> tuple[Array, Array]:
    """`(hidden / scale, scale)`: each row scaled by a power of two into `[-1, 1]`.

    The quantized recurrent projection reads h on a fixed `[-1, 1]` grid, which
    holds every h = o · tanh(c) the LSTM computes but not a given initial state
    (the TFT's is a static encoder's LayerNorm output): beyond it, h would be
    clipped. A power of two (1 for rows already within the range) scales
    exactly, so `projection(h / scale) * scale` equals `projection(h)` in float
    and quantizes such rows on a grid `scale` times as wide. `(B, F) -> (B, F), (B, 1)`.
    """
    largest = jnp.max(jnp.abs(hidden), axis=-1, keepdims=True)
    # frexp: largest = m * 2**e with m in [0.5, 1): the smallest power of two at least
    # `largest` is 2**e, or 2**(e - 1) when m is 0.5; a row within [-1, 1] keeps the
    # scale 1. A NaN or infinite row keeps it too (and stays non-finite).
    mantissa, exponent = jnp.frexp(largest)
    exponent = jnp.where(mantissa == 0.5, exponent - 1, exponent)
    exponent = jnp.where(largest <= 1.0, 0, exponent)
    scale = lax.stop_gradient(jnp.ldexp(jnp.ones_like(largest), exponent))
    return hidden / scale, scale


class LSTM(nn.Module):
    """LSTM over `(B, T, I) -> (B, T, features)` from an initial `(h, c)`, each `(B, features)`.

    The input projection of all steps is one matmul outside the loop; only the
    recurrent projection runs inside `nn.scan`. Gate order: input, forget,
    candidate, output. Returns `(outputs, (h_T, c_T))`.
    """

    features: int
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    dot_general_cls: Callable[..., nn.Module] | None = None

    def __post_init__(self) -> None:
        check_positive_int("LSTM", "features", self.features)
        super().__post_init__()

    @nn.compact
    def __call__(
        self, inputs: Array, initial_state: tuple[Array, Array] | None = None
    ) -> tuple[Array, tuple[Array, Array]]:
        # Nested lists as arrays: `inputs.dtype` and `state.astype` below need arrays.
        inputs = jnp.asarray(inputs)
        if isinstance(initial_state, tuple | list) and len(initial_state) == 2:
            initial_state = (jnp.asarray(initial_state[0]), jnp.asarray(initial_state[1]))
        self._check_inputs(inputs, initial_state)
        params = self.variables.get("params", {})
        check_input_width("LSTM", inputs, params, ("input", "kernel"), name="inputs")
        dtype = self.dtype or inputs.dtype
        input_gates = Linear(
            4 * self.features,
            dtype=dtype,
            param_dtype=self.param_dtype,
            bias_init=_lstm_bias_init,
            dot_general_cls=self.dot_general_cls,
            name="input",
        )(inputs)
        if initial_state is None:
            zeros = jnp.zeros((inputs.shape[0], self.features), dtype)
            initial_state = (zeros, zeros)
        carry = jax.tree.map(lambda t: t.astype(dtype), tuple(initial_state))
        if self.dot_general_cls is not None:
            hidden, cell = carry
            scaled, scale = _scaled_into_unit_range(hidden)
            carry = (scaled, cell, scale)
        scan = nn.scan(
            _LSTMStep,
            variable_broadcast=_BROADCAST_COLLECTIONS,
            split_rngs={"params": False},
            in_axes=1,
            out_axes=1,
        )
        final_state, outputs = scan(
            self.features,
            dtype=dtype,
            param_dtype=self.param_dtype,
            dot_general_cls=self.dot_general_cls,
            name="cell",
        )(carry, input_gates)
        if len(final_state) == 3:  # h / scale, c, scale (the scale is 1 after a step)
            hidden, cell, scale = final_state
            final_state = (hidden * scale, cell)
        return outputs, final_state

    def _check_inputs(self, inputs: Array, initial_state: tuple[Array, Array] | None) -> None:
        """Raises `ValueError`/`TypeError` naming the argument before the scan can fail.

        A 2-D input would be scanned over its feature axis, and a state of the
        wrong shape fails inside the scan as a broadcasting error about gates.
        """
        shape = tuple(jnp.shape(inputs))
        if len(shape) != 3:
            raise ValueError(f"LSTM: inputs must be 3-D (B, T, I), got shape {shape}")
        check_floating("LSTM", "inputs", inputs)
        if initial_state is None:
            return
        expected = (shape[0], self.features)
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
            raise ValueError(
                f"LSTM: initial_state must be a pair (h, c), each of shape {expected}, got "
                f"{type(initial_state).__name__} {jax.tree.map(jnp.shape, initial_state)}"
            )
        for name, state in zip(("h", "c"), initial_state, strict=True):
            if tuple(jnp.shape(state)) != expected:
                raise ValueError(
                    f"LSTM: initial_state {name} must have shape (B, features) = {expected} for "
                    f"inputs of shape {shape}, got {tuple(jnp.shape(state))}"
                )
