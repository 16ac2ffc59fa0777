"""Short batches filled up with unobserved rows, so that one program runs every batch.

A jitted step compiles one program per batch shape, so the short last batch
of an epoch (`WindowSet.batches(..., drop_last=False)` yields one) compiled a
train step and a forward of its own, seconds each. Filled up to the full
size with copies of its last row whose `target_mask` is 0, it runs the full
batches' programs and gives the same loss and gradient up to rounding (a
wider sum adds in another order): `batch_loss` averages over the observed
targets only, and the model computes each row from that row alone.

Only a host (NumPy) batch that carries a `target_mask` is filled: without
one, a mask added to the filled batch would change the batch's pytree and
key a program anyway. What the filled batch cannot keep exactly is dropout's
draw (drawn for the filled shape) and an observer's calibration (it would
see the copies), so `fit` does not fill the batches of calibration steps.
`ShortBatchFiller` is the rule `fit`, its mesh check and `evaluate` share:
each batch filled up to the widest one yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from tft_jax.train_state import Batch


def fillable(batch: Batch) -> bool:
    """Whether `filled_to` can fill `batch`: every array on the host, a `target_mask` among them."""
    if not isinstance(batch.target_mask, np.ndarray):
        return False
    return all(
        value is None or isinstance(value, np.ndarray)
        for value in (getattr(batch, field.name) for field in dataclasses.fields(batch))
    )


def filled_to(batch: Batch, rows: int) -> Batch:
    """`batch` of `B` rows and `rows - B` copies of its last row, their targets unobserved.

    Every field becomes `(rows, ...)`; `target_mask` is 0 on the copies. A
    batch of `rows` rows or more is returned as it is.

    Raises:
      ValueError: `batch` is not `fillable` (a field off the host, or no
        `target_mask`).
    """
    if not fillable(batch):
        raise ValueError(
            "filled_to: the batch needs NumPy arrays and a target_mask (the filled rows are "
            "marked unobserved in it)"
        )
    extra = rows - batch.batch_size
    if extra <= 0:
        return batch

    def fill(value: np.ndarray | None) -> np.ndarray | None:
        if value is None:
            return None
        return np.concatenate([value, np.repeat(value[-1:], extra, axis=0)])

    changes = {field.name: fill(getattr(batch, field.name)) for field in dataclasses.fields(batch)}
    mask = np.asarray(changes["target_mask"])
    mask[batch.batch_size :] = 0
    return batch.replace(**changes)


def widest(batches: Sequence[Batch]) -> int:
    """The most rows of a batch of `batches` (0 for none), read by index."""
    return max((batches[index].batch_size for index in range(len(batches))), default=0)


def fill_setting(owner: str, value: Any) -> bool:
    """`owner`'s (`fit`, `evaluate`) `fill_short_batches` as a bool, `TypeError` if not one."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(
            f"{owner}: fill_short_batches must be a bool, got {type(value).__name__} {value!r}"
        )
    return bool(value)


class ShortBatchFiller:
    """`batch -> batch`: each short batch filled up to the widest one yet (`filled_to`).

    `widest` starts at what is known before the first batch (`fit`: the
    widest of a list of batches, and a resumed run's widest so far). Not
    `enabled` (`fill_short_batches` off), or in a run of several processes,
    which pass their own rows and would have to agree on the filling, it
    fills nothing.
    """

    def __init__(self, widest: int = 0, enabled: bool = True) -> None:
        self.widest = widest
        self.enabled = enabled and jax.process_count() == 1

    def saw(self, batch: Batch) -> None:
        """Counts `batch` toward the widest."""
        self.widest = max(self.widest, batch.batch_size)

    def fills(self, batch: Batch) -> bool:
        """Whether `batch` is filled up (to `widest`), once counted."""
        return self.enabled and batch.batch_size < self.widest and fillable(batch)

    def __call__(self, batch: Batch, fill: bool = True) -> Batch:
        """`batch` counted toward the widest, and filled up to it if short and `fill`
        (`fit` counts but does not fill a calibration step's batch)."""
        self.saw(batch)
        return filled_to(batch, self.widest) if fill and self.fills(batch) else batch
