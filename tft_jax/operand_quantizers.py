"""Operand quantizers: what a `dot_general_cls` does to each operand, handed out as pure functions.

The `dot_general_cls` protocol (`tft_jax.linear`) hides what a contraction
does to its operands. Code that contracts one activation in pieces (the
chunked variable selection, `tft_jax.quantized_selection`, runs its GRNs over
chunks of rows inside `lax.scan`) cannot call the module once per piece: a
Flax module does not run inside the loop, and a quantizer that derives its
parameters from the operand it sees would derive them from the piece. This
optional extension of the protocol lets such code ask for the operands'
quantization once, outside the loop:

* the factory passed as `dot_general_cls` has an attribute
  `supports_operand_quantizers` that is true;
* the module it builds (`dot_general_cls(name="dot_general",
  lhs_bounds=None)`, at the path the layer's contraction uses) has a method
  `operand_quantizers(rhs, dimension_numbers, lhs_shape) -> (rhs',
  quantize_lhs)` such that the module's call on an activation `lhs` of shape
  `lhs_shape` equals `lax.dot_general(quantize_lhs(lhs), rhs',
  dimension_numbers)`, and `quantize_lhs` is elementwise with fixed
  parameters: applied to any subset of `lhs`'s rows it gives those rows of
  `quantize_lhs(lhs)`.

A quantizer whose parameters depend on the activation it sees (an observer
being calibrated) must not announce the extension; the layer-by-layer path
then runs, one call per layer on the whole activation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Array = Any


def supports_operand_quantizers(dot_general_cls: Callable[..., Any] | None) -> bool:
    """Whether `dot_general_cls` announces operand quantizers (None, plain `dot_general`: False)."""
    return bool(getattr(dot_general_cls, "supports_operand_quantizers", False))


def identity(x: Array) -> Array:
    """The activation quantizer of a float layer: `x` unchanged."""
    return x
