"""The one rule for `deterministic` in every module with dropout (Flax's convention)."""

from __future__ import annotations


def resolve_deterministic(
    owner: str, deterministic: bool | None, dropout_rate: float, initializing: bool = False
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
      deterministic: the value the caller gave (None: not given).
      dropout_rate: the module's dropout rate.
      initializing: whether the module is running `init`.
    """
    if deterministic is not None:
        return bool(deterministic)
    if dropout_rate > 0.0 and not initializing:
        raise ValueError(
            f"{owner}: dropout_rate={dropout_rate} > 0, so deterministic must be given: "
            "deterministic=False to train with dropout (needs a 'dropout' RNG), "
            "deterministic=True for inference"
        )
    return True
