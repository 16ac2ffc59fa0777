"""Learning-rate schedules whose numbers can live in the optimizer state.

`WarmupCosine` is the warmup + cosine schedule of
`tft_jax.train.warmup_cosine_schedule` as a frozen dataclass of its four
numbers, callable as an optax schedule `count -> lr`. Why a dataclass and not
optax's closure: a closure's numbers are compiled into the train step as
constants, so two runs that differ only in their schedule compile two steps.
`tft_jax.flat_optimizer.flat_adamw` given a `WarmupCosine` keeps the numbers in
its state as float32 scalars (the class is a pytree whose four fields are
leaves) and evaluates the same formula from there: one compiled step serves
every schedule, and a schedule can be changed between steps
(`tft_jax.train.with_schedule_steps`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
from flax import serialization

Array = jax.Array
Scalar = Any  # a Python number or a scalar array

__all__ = ["WarmupCosine", "continued_to", "warmup_cosine"]


def _is_python_number(value: Any) -> bool:
    return isinstance(value, numbers.Number)


def warmup_cosine(
    count: Scalar, peak_lr: Scalar, total_steps: Scalar, warmup_steps: Scalar, end_lr: Scalar
) -> Array:
    """The learning rate after `count` updates: linear warmup, then cosine decay to `end_lr`.

    With `W = warmup_steps`, `N = total_steps`, `a = end_lr / peak_lr`:

        lr(c) = peak_lr · c / W                                   for c < W
        lr(c) = peak_lr · ((1 - a) · (1 + cos(π · min(c - W, N - W) / (N - W))) / 2 + a)
                                                                  for c >= W

    the values of `optax.warmup_cosine_decay_schedule(0, peak_lr, W, N,
    end_lr)`, computed by the same operations in the same order, so that
    with Python numbers the result is optax's to the bit. The numbers may
    also be float32 scalar arrays (traced ones included): then nothing about
    them is a compile-time constant.

    Args:
      count: the number of updates so far (an int or an int32 scalar array).
      peak_lr, total_steps, warmup_steps, end_lr: the schedule (Python
        numbers or scalar arrays), as `tft_jax.train.warmup_cosine_schedule`
        checks them: `peak_lr > 0`, `0 <= warmup_steps < total_steps`.

    Returns:
      The learning rate, a float32 scalar array.
    """
    python = all(_is_python_number(v) for v in (peak_lr, total_steps, warmup_steps, end_lr))
    # Linear warmup from 0 (optax's polynomial schedule with power 1); a
    # warmup of 0 steps gives 0 here, which the `where` below never selects.
    rising = jnp.clip(count, 0, warmup_steps)
    steps = max(warmup_steps, 1) if python else jnp.maximum(warmup_steps, 1)
    warm = (0.0 - peak_lr) * (1 - rising / steps) + peak_lr
    # Cosine decay over the steps after the warmup (optax's cosine schedule,
    # which takes Python ints as floats to avoid int32 overflow).
    decay_steps = total_steps - warmup_steps
    since = count - warmup_steps
    if python:
        decay_steps = float(decay_steps)
    if isinstance(since, numbers.Integral):
        since = float(since)
    since = jnp.minimum(since, decay_steps)
    cosine = 0.5 * (1 + jnp.cos(jnp.pi * since / decay_steps))
    # (optax takes a peak of 0 as alpha 0 rather than divide by it; the numbers
    # as arrays must too, or a schedule in an optimizer state gives 0 / 0 = NaN)
    if python:
        alpha = 0.0 if peak_lr == 0.0 else end_lr / peak_lr
    else:
        alpha = jnp.where(peak_lr == 0.0, 0.0, end_lr / jnp.where(peak_lr == 0.0, 1.0, peak_lr))
    cooled = peak_lr * ((1 - alpha) * cosine + alpha)
    return jnp.where(count < warmup_steps, warm, cooled)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WarmupCosine:
    """Linear warmup from 0 to `peak_lr` over `warmup_steps`, then cosine decay to `end_lr`.

    An optax schedule (`count -> lr`, see `warmup_cosine`) that is also a
    pytree of its four numbers. Build it with
    `tft_jax.train.warmup_cosine_schedule`, which checks them; the fields are
    Python numbers there, float32 scalars in an optimizer state. Built
    directly it is not checked (JAX rebuilds it on every unflatten, from
    arrays, tracers, or whatever a `jax.tree.map` over a state returns);
    `flat_adamw` refuses one whose rate would be NaN or negative.

    Attributes:
      peak_lr: the learning rate at the end of the warmup.
      total_steps: the step where the cosine reaches `end_lr` (it stays there).
      warmup_steps: the length of the linear warmup (0: none).
      end_lr: the final learning rate.

    Example:
      >>> schedule = WarmupCosine(peak_lr=1e-3, total_steps=100, warmup_steps=10, end_lr=0.0)
      >>> print(f"{float(schedule(5)):.2e} {float(schedule(100)):.2e}")
      5.00e-04 0.00e+00
    """

    peak_lr: Scalar
    total_steps: Scalar
    warmup_steps: Scalar
    end_lr: Scalar = 0.0

    def __call__(self, count: Scalar) -> Array:
        """The learning rate after `count` updates (a float32 scalar)."""
        return warmup_cosine(count, self.peak_lr, self.total_steps, self.warmup_steps, self.end_lr)

    def as_arrays(self) -> WarmupCosine:
        """The same schedule with its numbers as float32 scalar arrays (an optimizer state)."""
        return jax.tree.map(lambda value: jnp.asarray(value, jnp.float32), self)

    def as_numbers(self) -> WarmupCosine:
        """The same schedule with Python numbers (steps as ints), read from arrays if need be."""
        return WarmupCosine(
            peak_lr=float(self.peak_lr),
            total_steps=round(float(self.total_steps)),
            warmup_steps=round(float(self.warmup_steps)),
            end_lr=float(self.end_lr),
        )


def _schedule_state_dict(schedule: WarmupCosine) -> dict[str, Any]:
    """`flax.serialization`'s state dict of a `WarmupCosine`: its four numbers by name."""
    return {
        field.name: serialization.to_state_dict(getattr(schedule, field.name))
        for field in dataclasses.fields(schedule)
    }


def _schedule_from_state_dict(target: WarmupCosine, state: dict[str, Any]) -> WarmupCosine:
    """`target` with the numbers of `state` (a train state restored by `flax.serialization`)."""
    names = [field.name for field in dataclasses.fields(target)]
    if sorted(state) != sorted(names):
        raise ValueError(
            f"WarmupCosine: the state dict holds {sorted(state)}, expected {sorted(names)} at "
            f"path {serialization.current_path()}"
        )
    return dataclasses.replace(
        target,
        **{
            name: serialization.from_state_dict(getattr(target, name), state[name], name=name)
            for name in names
        },
    )


def continued_to(schedule: WarmupCosine, count: int, total_steps: int) -> WarmupCosine:
    """`schedule` ending at `total_steps` instead, its rate going on from update `count`.

    Moving a cosine's end mid-decay changes the rate at once (a later end
    raises it, an earlier one drops it). Past the warmup, the schedule
    returned is a cosine from the rate of update `count` to `end_lr` at
    `total_steps`: its "warmup" ends at `count` (the count never goes back,
    so the warmup's rates are never read again) and its peak is that rate.
    Written so, the rates are as exact in float32 as any cosine's (a peak
    rescaled to stretch the old cosine's phase would need `1 + cos` near
    -1, which float32 loses). Within the warmup only the end moves (the
    warmup's rates do not depend on it).

    Args:
      schedule: the schedule the updates so far followed.
      count: the update count (the next update's index), below `schedule`'s end.
      total_steps: the new end, above `count` and the warmup.

    Returns:
      A `WarmupCosine` of Python numbers.
    """
    numbers_ = schedule.as_numbers()
    warmup, total = numbers_.warmup_steps, numbers_.total_steps
    if not warmup < total_steps or not count < total_steps:
        raise ValueError(
            f"continued_to: total_steps must be above the warmup ({warmup}) and the update "
            f"count ({count}), got {total_steps}"
        )
    if count >= total:
        raise ValueError(
            f"continued_to: the schedule ended at update {total}, before count {count}: its "
            "rate cannot go on along a cosine"
        )
    moved = dataclasses.replace(numbers_, total_steps=int(total_steps))
    if count <= warmup or numbers_.peak_lr == 0.0:
        return moved
    progress = (count - warmup) / (total - warmup)
    end_lr = numbers_.end_lr
    rate = end_lr + (numbers_.peak_lr - end_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return dataclasses.replace(moved, peak_lr=rate, warmup_steps=int(count))


# A train state holding a schedule (the default optimizer's) serializes with flax as
# its other leaves do: flax knows flax.struct dataclasses, not JAX-registered ones.
serialization.register_serialization_state(
    WarmupCosine, _schedule_state_dict, _schedule_from_state_dict
)
