"""The optimizer `fit` and `train_step` use: clip by global norm, then AdamW.

`make_optimizer` builds it (a constant rate or a `warmup_cosine_schedule`);
`decay_model_params_only` masks the weight decay to the model's parameters.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tft_jax.flat_optimizer import (
    flat_adamw as flat_adamw,  # re-exported: code patches `tft_jax.optimizer.flat_adamw` (faults)
)
from tft_jax.schedules import WarmupCosine

Array = Any
PyTree = Any

# ---------------------------------------------------------------------------
# Optimizer


class Optimizer(optax.GradientTransformationExtraArgs):
    """An optax transformation that also records its gradient clipping threshold.

    It is the transformation built by `make_optimizer` (a plain
    `GradientTransformationExtraArgs`, usable anywhere optax expects one) with
    the attribute `clip_norm` (float or None), which `create_train_state` reads
    so that `train_step` can report the clipped gradient norm.

    Two optimizers compare equal when their `update` functions and
    thresholds do, whatever their `init`: a train state's `tx` is static in
    the jitted `train_step`, which only runs `update`. So train states whose
    optimizers differ only in the numbers of a `WarmupCosine` schedule (kept
    in the optimizer state, set there by `init`) share one compiled step.
    """

    clip_norm: float | None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Optimizer):
            return NotImplemented
        return (self.update, self.clip_norm) == (other.update, other.clip_norm)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash((self.update, self.clip_norm))


def _require_positive_float(name: str, value: Any, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0.0 or (value == 0.0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
    return value


def decay_model_params_only(trainables: PyTree) -> PyTree:
    """Weight-decay mask: the model's `'params'` decay, other trainable collections do not.

    The train state optimizes `{'params': ..., 'quant_params': ...}`; shrinking
    a quantizer's learned step size toward 0 is not regularization, it is a
    bias. A tree without a top-level `'params'` key decays everywhere.
    """
    if isinstance(trainables, Mapping) and "params" in trainables:
        return {
            name: jax.tree.map(lambda _, decay=name == "params": decay, tree)
            for name, tree in trainables.items()
        }
    return jax.tree.map(lambda _: True, trainables)


def _check_schedule_start(schedule: Callable[[Array], Array]) -> None:
    """Raises `ValueError` unless `schedule(0)` is a finite scalar >= 0.

    Inside the step a NaN learning rate turns every parameter into NaN and a
    negative one climbs the loss, both silently; the first step's rate is
    checked here, on the host, once.
    """
    if isinstance(schedule, WarmupCosine):
        # Its rate lies between 0 and its numbers: checked without running it
        # (eagerly, each of its operations would compile on its own).
        numbers = np.asarray(jax.tree.leaves(schedule), np.float64)
        if np.all(np.isfinite(numbers)) and np.all(numbers >= 0):
            return
        raise ValueError(
            f"make_optimizer: learning_rate {schedule!r} must hold finite numbers >= 0"
        )
    start = np.asarray(schedule(jnp.zeros((), jnp.int32)))
    if start.shape != () or not np.isfinite(start) or start < 0:
        raise ValueError(
            "make_optimizer: learning_rate schedule must give a finite scalar >= 0, "
            f"got {start.tolist()!r} at step 0"
        )


def make_optimizer(
    learning_rate: float | optax.Schedule = 1e-3,
    clip_norm: float | None = 1.0,
    weight_decay: float = 0.0,
    *,
    weight_decay_mask: Any = None,
) -> Optimizer:
    """Gradient clipping by global norm followed by AdamW, on one flat vector.

    The math of `optax.chain(optax.clip_by_global_norm(clip_norm),
    optax.adamw(learning_rate, weight_decay=weight_decay, mask=...))`:
    clipping sees the raw gradients only, and the decoupled weight decay that
    AdamW adds after the Adam scaling is never clipped. It is computed by
    `tft_jax.flat_optimizer.flat_adamw` on all trained scalars concatenated
    into one float32 vector `(N,)` (Adam's moments are kept as two such
    vectors, a `FlatAdamWState`), so the compiled train step has a few
    optimizer kernels instead of several per parameter leaf.

    Args:
      learning_rate: a positive float or an optax schedule `count -> lr`,
        called with the number of updates applied before this one (a step
        that `train_step` skips applies none, so it does not advance the
        schedule, as under `optax.apply_if_finite`; its rate at count 0 must
        be a finite scalar >= 0); a `WarmupCosine`
        (from `warmup_cosine_schedule`) is kept in the optimizer state, so the
        train step does not depend on its numbers.
      clip_norm: the global-norm threshold (> 0); None disables clipping.
      weight_decay: the decoupled weight decay coefficient (>= 0).
      weight_decay_mask: optional pytree of booleans or callable, as
        `optax.adamw(mask=...)` takes it, selecting which parameters are
        decayed; by default `decay_model_params_only` (quantizer step sizes
        are never decayed). It is over what the optimizer sees,
        `TrainState.trainables()` = `{'params': params, **extra_params}`: a
        mask over the model's params alone is `{'params': mask}`. A mask of
        another structure is refused by `create_train_state`.

    Returns:
      An `Optimizer` (an optax `GradientTransformationExtraArgs` with a
      `clip_norm` attribute).

    References:
      Pascanu et al., On the difficulty of training recurrent neural networks, 2013.
      Loshchilov & Hutter, Decoupled weight decay regularization, ICLR 2019.
    """
    if not callable(learning_rate):
        learning_rate = _require_positive_float("make_optimizer: learning_rate", learning_rate)
    else:
        _check_schedule_start(learning_rate)
    if clip_norm is not None:
        clip_norm = _require_positive_float("make_optimizer: clip_norm", clip_norm)
    weight_decay = _require_positive_float(
        "make_optimizer: weight_decay", weight_decay, allow_zero=True
    )
    if weight_decay_mask is None:
        weight_decay_mask = decay_model_params_only
    chain = flat_adamw(
        learning_rate, clip_norm=clip_norm, weight_decay=weight_decay, mask=weight_decay_mask
    )
    optimizer = Optimizer(chain.init, chain.update)
    optimizer.clip_norm = clip_norm
    return optimizer


def warmup_cosine_schedule(
    peak_lr: float, total_steps: int, warmup_steps: int, end_lr: float = 0.0
) -> WarmupCosine:
    """Linear warmup from 0 to `peak_lr` over `warmup_steps`, then cosine decay to `end_lr`.

    The cosine part spans steps `warmup_steps .. total_steps`. The result is a
    `tft_jax.schedules.WarmupCosine`, an optax schedule `count -> lr` with the
    values of `optax.warmup_cosine_decay_schedule(0, peak_lr, warmup_steps,
    total_steps, end_lr)`; given to `make_optimizer`, its numbers live in the
    optimizer state rather than in the compiled train step (one compiled step
    for every such schedule; `with_schedule_steps` changes the total).
    """
    peak_lr = _require_positive_float("warmup_cosine_schedule: peak_lr", peak_lr)
    end_lr = _require_positive_float("warmup_cosine_schedule: end_lr", end_lr, allow_zero=True)
    for name, value in (("total_steps", total_steps), ("warmup_steps", warmup_steps)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"warmup_cosine_schedule: {name} must be an int, got {value!r}")
    if total_steps < 1:
        raise ValueError(f"warmup_cosine_schedule: total_steps must be >= 1, got {total_steps}")
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(
            f"warmup_cosine_schedule: warmup_steps must be in [0, total_steps={total_steps}), "
            f"got {warmup_steps}"
        )
    return WarmupCosine(
        peak_lr=peak_lr, total_steps=int(total_steps), warmup_steps=int(warmup_steps), end_lr=end_lr
    )
