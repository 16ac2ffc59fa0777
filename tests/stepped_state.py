"""A dict pytree with a `.step`: the smallest state a `TrainingCheckpointer` saves."""

from __future__ import annotations

import jax


class _Stepped(dict):
    """A dict pytree with a `.step`, as `save_latest` reads it."""

    @property
    def step(self):
        return self["step"]


jax.tree_util.register_pytree_node(
    _Stepped,
    lambda tree: (tuple(tree.values()), tuple(tree.keys())),
    lambda keys, values: _Stepped(zip(keys, values, strict=True)),
)
