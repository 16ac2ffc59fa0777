"""A single-layer LSTM over time, scanned with `nn.scan`, seeded with a given state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from tft_jax.linear import Linear, check_positive_int

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
    def __call__(self, carry: tuple[Array, Array], input_gates: Array):
        hidden, cell = carry
        gates = input_gates + Linear(
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
        input_gate, forget_gate, candidate, output_gate = jnp.split(gates, 4, axis=-1)
        cell = nn.sigmoid(forget_gate) * cell + nn.sigmoid(input_gate) * jnp.tanh(candidate)
        hidden = nn.sigmoid(output_gate) * jnp.tanh(cell)
        return (hidden, cell), hidden


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
        self._check_inputs(inputs, initial_state)
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
        return outputs, final_state

    def _check_inputs(self, inputs: Array, initial_state: tuple[Array, Array] | None) -> None:
        """Raises `ValueError`/`TypeError` naming the argument before the scan can fail.

        A 2-D input would be scanned over its feature axis, and a state of the
        wrong shape fails inside the scan as a broadcasting error about gates.
        """
        shape = tuple(jnp.shape(inputs))
        if len(shape) != 3:
            raise ValueError(f"LSTM: inputs must be 3-D (B, T, I), got shape {shape}")
        if not jnp.issubdtype(jnp.result_type(inputs), jnp.floating):
            raise TypeError(f"LSTM: inputs must be floating point, got {jnp.result_type(inputs)}")
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
