"""Which kernel the flash path of `TemporalSelfAttention` asks `jax.nn.dot_product_attention` for.

`jax.nn.dot_product_attention` at its default `implementation=None` runs
XLA's attention on every backend, GPU included; cuDNN's fused kernel runs
only when asked for by name, and refuses (raises) outside its envelope. The
flash path asks for it exactly where it applies: a CUDA GPU of compute
capability 8.0 or later, bfloat16 or float16 operands, a head width that is a
multiple of 8 up to 128, a temperature known when the function is traced (the
kernel's scale is a compile-time constant), and an even number of steps when
a mask is given (the mask becomes an additive bias, whose gradient kernel
needs even lengths). Everywhere else it runs XLA's kernel. The two compute the
same function up to rounding (their bfloat16 results differ in the last bits),
so the choice is one of speed.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

import jax
import jax.numpy as jnp

from tft_jax.caller_frame import user_stacklevel

Array = Any
Implementation = Literal["cudnn"] | None

CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 128  # every GPU from compute capability 8.0; Hopper allows 256
CUDNN_MIN_COMPUTE_CAPABILITY = (8, 0)


def concrete_scale(head_dim: int, temperature: Any) -> float | None:
    """`1 / (sqrt(head_dim) · temperature)` as a Python float; None for a traced temperature."""
    if isinstance(temperature, jax.core.Tracer):
        return None
    return 1.0 / (math.sqrt(head_dim) * float(temperature))


def _compute_capability(device: Any) -> tuple[int, int] | None:
    """`(major, minor)` of a CUDA device, None for any other device (ROCm's `gfx...` too)."""
    if device.platform != "gpu":
        return None
    try:
        major, minor = str(device.compute_capability).split(".")[:2]
        return int(major), int(minor)
    except (AttributeError, ValueError):
        return None


def cudnn_unsupported_reason(
    device: Any,
    dtype: Any,
    head_dim: int,
    scale: float | None,
    masked: bool,
    steps: int,
) -> str | None:
    """Why cuDNN's fused attention does not apply to these operands, or None when it does.

    Args:
      device: the JAX device the attention runs on.
      dtype: the dtype of query, key and value.
      head_dim: the width of one head.
      scale: the logits' scale as a Python float, None when it is only known
        at run time.
      masked: a boolean mask is given (it becomes an additive bias).
      steps: `T`, the number of query and key steps.
    """
    capability = _compute_capability(device)
    if capability is None:
        return f"not a CUDA GPU ({device.platform})"
    if capability < CUDNN_MIN_COMPUTE_CAPABILITY:
        return f"compute capability {capability[0]}.{capability[1]} is below 8.0"
    if jnp.dtype(dtype).name not in CUDNN_DTYPES:
        return f"dtype {jnp.dtype(dtype).name} is not bfloat16 or float16"
    if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
        return f"head_dim {head_dim} is not a multiple of 8 up to {CUDNN_MAX_HEAD_DIM}"
    if scale is None:
        return "the temperature is traced (cuDNN's scale is a compile-time constant)"
    if masked and steps % 2:
        return f"a mask with an odd number of steps ({steps})"
    return None


def default_device() -> Any:
    """The device JAX places new computations on: `jax.default_device`'s, else the first."""
    chosen = jax.config.jax_default_device  # type: ignore[attr-defined]  # a flag jax adds at runtime
    if chosen is None:
        return jax.devices()[0]
    if isinstance(chosen, str):
        return jax.devices(chosen)[0]
    return chosen


def flash_implementation(
    dtype: Any, head_dim: int, scale: float | None, masked: bool, steps: int
) -> Implementation:
    """`"cudnn"` where cuDNN's fused attention applies on the default device, else None (XLA's).

    The default device honours `jax.default_device` (a CPU chosen on a GPU
    host runs XLA's kernel).
    """
    device = default_device()
    if cudnn_unsupported_reason(device, dtype, head_dim, scale, masked, steps) is None:
        return "cudnn"
    return None


def dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    *,
    scale: float | Array,
    implementation: Implementation,
    is_causal: bool = False,
    mask: Array | None = None,
) -> Array:
    """`jax.nn.dot_product_attention` on `(B, T, heads, head_dim)` operands with the chosen kernel.

    cuDNN may still refuse operands that pass `cudnn_unsupported_reason` (an
    older cuDNN library, a GPU it does not know): the call then warns, naming
    cuDNN's reason, and runs XLA's kernel, which computes the same function.
    """
    if implementation == "cudnn":
        try:
            return jax.nn.dot_product_attention(
                query,
                key,
                value,
                scale=scale,
                is_causal=is_causal,
                mask=mask,
                implementation="cudnn",
            )
        except (NotImplementedError, RuntimeError, ValueError) as error:
            warnings.warn(
                f"TemporalSelfAttention: cuDNN's fused attention refused these operands "
                f"({error}); XLA's attention runs instead (same function)",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )
    return jax.nn.dot_product_attention(
        query, key, value, scale=scale, is_causal=is_causal, mask=mask
    )
