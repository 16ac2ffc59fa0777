"""The one rule for `deterministic` in every module with dropout (Flax's convention)."""

from __future__ import annotations

import numbers
from typing import Any

import jax
import numpy as np


def resolve_deterministic(
    owner: str, deterministic: Any, dropout_rate: float, initializing: bool = False
) -> bool:
    """`deterministic` as a bool, or a `ValueError` if it is needed and was not given.

    With `dropout_rate > 0` the caller must say whether dropout is on
    (`deterministic=False`, training, with a `'dropout'` RNG) or off
    (`deterministic=True`, inference): a forgotten argument would otherwise
    silently train without dropout, or evaluate with it. Without dropout the
    argument changes nothing and may be left out. During `init` it may be left
    out too (the parameters do not depend on it); the init forward then runs
    without dropout.

    Args:
      owner: the module's name, for the message.
      deterministic: the value the caller gave (None: not given): a bool, a
        NumPy bool, 0 or 1, or a concrete boolean scalar array.
      dropout_rate: the module's dropout rate.
      initializing: whether the module is running `init`.

    Raises:
      ValueError: `deterministic` was not given and `dropout_rate > 0`.
      TypeError: `deterministic` is not a boolean (a string such as
        `"False"` is truthy and would silently switch dropout off), or is a
        traced value with `dropout_rate > 0` (it selects a different
        computation, so it must be static under `jax.jit`).
    """
    if deterministic is None:
        if dropout_rate > 0.0 and not initializing:
            raise ValueError(
                f"{owner}: dropout_rate={dropout_rate} > 0, so deterministic must be given: "
                "deterministic=False to train with dropout (needs a 'dropout' RNG), "
                "deterministic=True for inference"
            )
        return True
    if isinstance(deterministic, jax.core.Tracer):
        if dropout_rate == 0.0:
            return True  # without dropout the value changes nothing
        raise TypeError(
            f"{owner}: deterministic must be a concrete Python bool, got a traced value; "
            "under jax.jit pass it as a static argument (static_argnames=...)"
        )
    if isinstance(deterministic, bool | np.bool_):
        return bool(deterministic)
    if isinstance(deterministic, numbers.Integral) and deterministic in (0, 1):
        return bool(deterministic)
    if (
        hasattr(deterministic, "dtype")
        and np.ndim(deterministic) == 0
        and np.dtype(deterministic.dtype) == np.bool_
    ):
        return bool(deterministic)
    raise TypeError(
        f"{owner}: deterministic must be a bool, got {type(deterministic).__name__} "
        f"{deterministic!r}"
    )
