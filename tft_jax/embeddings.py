"""Input embeddings: every input variable becomes a vector before variable selection."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import struct

from tft_jax.linear import VariableLinear, _cast_operands, check_positive_int
from tft_jax.operand_quantizers import supports_operand_quantizers

Array = Any
Dtype = Any


@struct.dataclass
class AffineEmbedding:
    """Real inputs with their per-variable affine embedding not yet applied.

    Stands for the `(..., V, width)` embeddings `values[..., v] * slope[v] +
    intercept[v]`; `materialize()` computes them. A variable selection network
    that receives one folds the embedding into its first layers instead (see
    `tft_jax.folded_selection`).

    Attributes:
      values: `(..., V)` the inputs, in the compute dtype.
      slope: `(V, width)` the prescaler kernels.
      intercept: `(V, width)` the prescaler biases.
    """

    values: Array
    slope: Array
    intercept: Array

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the embeddings it stands for, `(..., V, width)`."""
        return (*tuple(self.values.shape), self.slope.shape[-1])

    def materialize(self) -> Array:
        """The embeddings `(..., V, width)`, exactly as `RealEmbedding` computes them."""
        return self.values[..., None] * self.slope + self.intercept

    @staticmethod
    def concatenate(parts: Sequence[AffineEmbedding]) -> AffineEmbedding:
        """The variables of several embeddings side by side (same leading shape and width)."""
        return AffineEmbedding(
            values=jnp.concatenate([part.values for part in parts], axis=-1),
            slope=jnp.concatenate([part.slope for part in parts], axis=0),
            intercept=jnp.concatenate([part.intercept for part in parts], axis=0),
        )


def concatenate_variables(parts: Sequence[Array | AffineEmbedding]) -> Array | AffineEmbedding:
    """Embeddings `(..., V_i, width)` joined along the variable axis.

    Stays an `AffineEmbedding` when every part is one, else materializes.
    """
    if all(isinstance(part, AffineEmbedding) for part in parts):
        return AffineEmbedding.concatenate(parts)
    arrays = [part.materialize() if isinstance(part, AffineEmbedding) else part for part in parts]
    return jnp.concatenate(arrays, axis=-2)


class _Prescaler(nn.Module):
    """The prescaler as an `AffineEmbedding`: `VariableLinear(V, width)`'s parameters, not applied.

    The parameters (and, with `dot_general_cls`, its quantizer) are declared
    at `VariableLinear`'s paths. A quantizer hands out the fake-quantized
    kernel and the input's quantizer (`tft_jax.operand_quantizers`), so
    `materialize()` equals the quantized `VariableLinear`: its contraction
    has one term, a product.
    """

    num_variables: int
    width: int
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    dot_general_cls: Callable[..., nn.Module] | None = None

    @nn.compact
    def __call__(self, x: Array) -> AffineEmbedding:
        kernel = self.param(
            "kernel",
            VariableLinear.kernel_init,
            (self.num_variables, 1, self.width),
            self.param_dtype,
        )
        bias = self.param(
            "bias", nn.initializers.zeros_init(), (self.num_variables, self.width), self.param_dtype
        )
        values, kernel, bias = _cast_operands(x, kernel, bias, self.dtype)
        if self.dot_general_cls is not None:
            # VariableLinear's contraction of x[..., None] (..., V, 1) with kernel (V, 1, width).
            lhs = values[..., None]
            dimension_numbers = (((lhs.ndim - 1,), (1,)), ((lhs.ndim - 2,), (0,)))
            quantizer = self.dot_general_cls(name="dot_general", lhs_bounds=None)
            kernel, quantize_input = quantizer.operand_quantizers(
                kernel, dimension_numbers, lhs.shape
            )
            values = quantize_input(lhs)[..., 0]
        return AffineEmbedding(values, kernel[:, 0, :], bias)


class RealEmbedding(nn.Module):
    """Embeds each real-valued variable by its own linear map: `(..., V) -> (..., V, width)`.

    The per-variable "prescaler" of the paper (and pytorch-forecasting's
    `hidden_continuous_size`), computed as one batched contraction.

    With `lazy=True` it returns an `AffineEmbedding` (the inputs and the same
    parameters, not yet multiplied out) for a variable selection network to
    fold into its first layers (FP32) or to multiply out chunk by chunk
    (quantized: the input and kernel already fake-quantized, so the product
    is the quantized contraction's). That needs no `dot_general_cls` or one
    with operand quantizers (`tft_jax.operand_quantizers`); with any other
    (an observer being calibrated sees the whole input at once) it returns
    the computed embeddings.
    """

    num_variables: int
    width: int
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    dot_general_cls: Callable[..., nn.Module] | None = None
    lazy: bool = False

    def __post_init__(self) -> None:
        for name in ("num_variables", "width"):
            check_positive_int("RealEmbedding", name, getattr(self, name))
        super().__post_init__()

    @nn.compact
    def __call__(self, x: Array) -> Array | AffineEmbedding:
        x = jnp.asarray(x)  # nested lists have no `.ndim`
        # Checked here for both paths: VariableLinear would report the (..., V, 1) it is given.
        if x.ndim < 1 or x.shape[-1] != self.num_variables:
            raise ValueError(
                f"RealEmbedding expects x of shape (..., {self.num_variables}), "
                f"got {tuple(x.shape)}"
            )
        if self.lazy and (
            self.dot_general_cls is None or supports_operand_quantizers(self.dot_general_cls)
        ):
            return _Prescaler(
                self.num_variables,
                self.width,
                self.dtype,
                self.param_dtype,
                self.dot_general_cls,
                name="prescaler",
            )(x)
        return VariableLinear(
            self.num_variables,
            self.width,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            dot_general_cls=self.dot_general_cls,
            name="prescaler",
        )(x[..., None])


class CategoricalEmbedding(nn.Module):
    """Embeds integer categorical variables: `(..., C) int -> (..., C, width)`.

    One table per variable (entity embeddings); statics are `(B, C)`, inputs
    over time `(B, T, C)`. Codes outside `[0, cardinality)` raise
    `ValueError` for concrete inputs; under `jit` they cannot be inspected (a
    gather cannot raise there) and are clipped to the nearest row of their
    table (a negative code embeds as row 0, one past the end as the last
    row), silently: check them before jitting the call (apply the module once
    without `jax.jit`, or check `0 <= codes < cardinality` in NumPy).
    """

    cardinalities: Sequence[int]
    width: int
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    def __post_init__(self) -> None:
        # A zero width would silently give empty embeddings.
        check_positive_int("CategoricalEmbedding", "width", self.width)
        super().__post_init__()

    @nn.compact
    def __call__(self, codes: Array) -> Array:
        if not hasattr(codes, "dtype"):
            # Nested lists: their dtype could not be read and they cannot be indexed per column.
            codes = np.asarray(codes)
        self._check_codes(codes)
        columns = []
        for index, cardinality in enumerate(self.cardinalities):
            table = self.param(
                f"embedding_{index}",
                nn.initializers.normal(stddev=1.0),
                (cardinality, self.width),
                self.param_dtype,
            )
            columns.append(jnp.take(table, codes[..., index], axis=0, mode="clip"))
        embedded = jnp.stack(columns, axis=-2)
        return embedded.astype(self.dtype or embedded.dtype)

    def _check_codes(self, codes: Array) -> None:
        """Raises unless `codes` is integer `(..., C)` with one column per cardinality.

        A static index past the last column is clamped by JAX, so too few
        columns would silently embed the last one again, and extra columns
        would be ignored; a float code cannot index a table.

        Raises:
          ValueError: no cardinalities, a cardinality below 1, the wrong column
            count, or (concrete codes only) a code outside `[0, cardinality)`,
            which the gather would clip silently to the first or last row.
          TypeError: `codes` is not of an integer dtype.
        """
        cardinalities = tuple(self.cardinalities)
        if not cardinalities:
            raise ValueError("CategoricalEmbedding: cardinalities must not be empty")
        for index, cardinality in enumerate(cardinalities):
            check_positive_int("CategoricalEmbedding", f"cardinalities[{index}]", cardinality)
        shape = tuple(jnp.shape(codes))
        if len(shape) < 1 or shape[-1] != len(cardinalities):
            raise ValueError(
                f"CategoricalEmbedding: codes must have shape (..., {len(cardinalities)}) (one "
                f"column per cardinality), got {shape}"
            )
        if not jnp.issubdtype(jnp.result_type(codes), jnp.integer):
            raise TypeError(
                f"CategoricalEmbedding: codes must be integers, got {jnp.result_type(codes)}"
            )
        if isinstance(codes, jax.core.Tracer) or not np.size(codes):
            return
        columns = np.asarray(codes).reshape(-1, len(cardinalities))
        for index, cardinality in enumerate(cardinalities):
            low, high = columns[:, index].min(), columns[:, index].max()
            if low < 0 or high >= cardinality:
                raise ValueError(
                    f"CategoricalEmbedding: codes[..., {index}] must lie in [0, {cardinality}) "
                    f"(cardinalities[{index}]), got values in [{low}, {high}]"
                )
