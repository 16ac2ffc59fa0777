"""A tangent that reverse mode transposes and forward mode refuses, with a clear error.

The straight-through estimators are surrogate gradients: meant for training
with `jax.grad`. They are written as `jax.custom_jvp` rules whose tangent
passes through `reverse_mode_only`, the identity for JAX's transposition
(so `jax.grad`/`jax.vjp` give exactly the estimator), that raises
`ForwardModeError` when a tangent is actually computed: `jax.jvp`,
`jax.jacfwd`, or calling the function returned by `jax.linearize`.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

Array = Any


class ForwardModeError(TypeError):
    """Forward-mode autodiff through a straight-through estimator."""


def _message(name: str) -> str:
    return (
        f"{name} has a straight-through gradient (a surrogate, not the derivative), defined for "
        f"reverse mode only: use reverse mode (jax.grad/vjp) instead of forward mode "
        f"(jax.jvp, jax.jacfwd, jax.linearize)"
    )


def _refuse(*args: Any, name: str) -> Any:
    raise ForwardModeError(_message(name))


_reverse_mode_only_p = Primitive("reverse_mode_only")
_reverse_mode_only_p.def_impl(_refuse)
_reverse_mode_only_p.def_abstract_eval(lambda tangent, *, name: tangent)


def _transpose(cotangent: Any, tangent: Any, *, name: str) -> list[Any]:
    del tangent, name
    return [cotangent]


def _batch(args: Any, dims: Any, *, name: str) -> tuple[Array, int]:
    (tangent,), (dim,) = args, dims
    return _reverse_mode_only_p.bind(tangent, name=name), dim


def _jvp(primals: Any, tangents: Any, *, name: str) -> Any:
    raise ForwardModeError(_message(name))


def _lowering(ctx: Any, tangent: Any, *, name: str) -> Any:
    raise ForwardModeError(_message(name))


ad.primitive_transposes[_reverse_mode_only_p] = _transpose
ad.primitive_jvps[_reverse_mode_only_p] = _jvp
batching.primitive_batchers[_reverse_mode_only_p] = _batch
mlir.register_lowering(_reverse_mode_only_p, _lowering)


def reverse_mode_only(tangent: Array, name: str) -> Array:
    """`tangent` itself for `jax.grad`/`jax.vjp`; a `ForwardModeError` naming `name` otherwise."""
    return _reverse_mode_only_p.bind(jax.numpy.asarray(tangent), name=name)
