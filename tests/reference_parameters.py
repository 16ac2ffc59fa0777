"""Random float32 parameters in a module's layout, for comparisons with `tests/reference_tft.py`.

Not the initializer's values: LayerNorm scales away from 1, kernels of unit
variance per input and other leaves away from 0, so a swapped scale and bias
or a dropped term shows.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import linen as nn


def random_parameters(module: nn.Module, *args: Any, seed: int = 0) -> Any:
    """Random float32 parameters with the shapes `module.init(key, *args)` would give."""
    shapes = jax.eval_shape(module.init, jax.random.key(0), *args)["params"]
    rng = np.random.default_rng(seed)

    def draw(path: tuple[Any, ...], leaf: Any) -> np.ndarray:
        key = str(path[-1].key)
        if key == "scale":
            value = 1.0 + 0.3 * rng.normal(size=leaf.shape)
        elif key == "kernel":
            value = rng.normal(size=leaf.shape) / np.sqrt(leaf.shape[-2])
        else:
            value = 0.5 * rng.normal(size=leaf.shape)
        return value.astype(np.float32)

    return jax.tree_util.tree_map_with_path(draw, shapes)
