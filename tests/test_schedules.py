"""Tests of the warmup + cosine schedule as data (`tft_jax.schedules.WarmupCosine`).

References: optax's `warmup_cosine_decay_schedule` (the closure that
`warmup_cosine_schedule` returned before, which `WarmupCosine` must reproduce
bit for bit), float64 NumPy closed forms written here (also at step 0, the
warmup's end, the total and beyond), and `flat_adamw` with the same schedule
compiled in (the in-state schedule must give its updates).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.schedule_reference import warmup_cosine
from tft_jax.flat_optimizer import FlatAdamWState, flat_adamw
from tft_jax.schedules import WarmupCosine, continued_to
from tft_jax.train import warmup_cosine_schedule

# (peak_lr, total_steps, warmup_steps, end_lr): with and without warmup and end
# value, a one-step cosine, and the Forecaster's usual shape.
SETTINGS = [
    (1e-3, 100, 10, 0.0),
    (3e-3, 600, 30, 1e-5),
    (0.1, 7, 0, 0.01),
    (2e-2, 50, 49, 0.0),
    (5e-4, 1, 0, 0.0),
]


@pytest.mark.parametrize("setting", SETTINGS)
def test_warmup_cosine_equals_optax_warmup_cosine_decay_schedule_bit_for_bit(setting) -> None:
    peak, total, warmup, end = setting
    schedule = warmup_cosine_schedule(peak, total, warmup, end)
    optax_schedule = optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total, end)
    counts = jnp.arange(total + 20, dtype=jnp.int32)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(jax.vmap(schedule))(counts)),
        np.asarray(jax.jit(jax.vmap(optax_schedule))(counts)),
    )
    for count in (0, warmup // 2, warmup, (warmup + total) // 2, total - 1, total, total + 5):
        assert float(schedule(count)) == float(optax_schedule(count)), count


@pytest.mark.parametrize("setting", SETTINGS)
def test_warmup_cosine_matches_the_float64_closed_form(setting) -> None:
    peak, total, warmup, end = setting
    schedule = WarmupCosine(peak, total, warmup, end)
    for count in range(total + 5):
        want = warmup_cosine(count, peak, total, warmup, end)
        np.testing.assert_allclose(float(schedule(count)), want, rtol=2e-6, atol=1e-7 * peak)


@pytest.mark.parametrize("setting", SETTINGS)
def test_float32_numbers_under_jit_give_the_python_numbers_schedule(setting) -> None:
    schedule = warmup_cosine_schedule(*setting)
    counts = jnp.arange(setting[1] + 5, dtype=jnp.int32)
    in_state = jax.jit(lambda numbers, c: jax.vmap(numbers)(c))(schedule.as_arrays(), counts)
    # float32 rounding of the numbers: relative, and absolute where the cosine nears 0.
    np.testing.assert_allclose(
        np.asarray(in_state),
        np.asarray(jax.vmap(schedule)(counts)),
        rtol=1e-6,
        atol=1e-7 * setting[0],
    )


def test_warmup_cosine_schedule_returns_a_frozen_hashable_pytree_of_its_numbers() -> None:
    schedule = warmup_cosine_schedule(1e-3, total_steps=100, warmup_steps=10, end_lr=1e-5)
    assert schedule == WarmupCosine(1e-3, 100, 10, 1e-5)
    assert hash(schedule) == hash(WarmupCosine(1e-3, 100, 10, 1e-5))
    assert jax.tree.leaves(schedule) == [1e-3, 100, 10, 1e-5]
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.total_steps = 50  # type: ignore[misc]
    arrays = schedule.as_arrays()
    assert all(leaf.dtype == jnp.float32 and leaf.shape == () for leaf in jax.tree.leaves(arrays))
    as32 = [float(np.float32(value)) for value in (1e-3, 1e-5)]
    assert arrays.as_numbers() == WarmupCosine(as32[0], 100, 10, as32[1])
    with pytest.raises(TypeError, match="total_steps must be an int"):
        warmup_cosine_schedule(1e-3, total_steps=10.0, warmup_steps=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="end_lr"):
        warmup_cosine_schedule(1e-3, total_steps=10, warmup_steps=1, end_lr=-1.0)


# ---------------------------------------------------------------------------
# The schedule in flat_adamw's state


def _tree(rng: np.random.Generator, scale: float = 1.0) -> dict[str, Any]:
    return {
        "params": {
            "kernel": (scale * rng.standard_normal((3, 4))).astype(np.float32),
            "bias": (scale * rng.standard_normal(4)).astype(np.float32),
        }
    }


def test_in_state_schedule_updates_equal_the_compiled_in_schedule_over_several_steps() -> None:
    peak, total, warmup, end = 0.05, 6, 2, 1e-3
    in_state = flat_adamw(
        warmup_cosine_schedule(peak, total, warmup, end), clip_norm=1.0, weight_decay=0.1
    )
    compiled_in = flat_adamw(
        optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total, end),
        clip_norm=1.0,
        weight_decay=0.1,
    )
    rng = np.random.default_rng(0)
    params = _tree(rng)
    state_a, state_b = in_state.init(params), compiled_in.init(params)
    assert isinstance(state_a.schedule, WarmupCosine) and state_b.schedule is None
    params_a = params_b = params
    # Through the warmup, the cosine and past its end.
    for step in range(total + 2):
        grads = _tree(rng, 3.0 if step % 2 else 0.1)
        updates_a, state_a = jax.jit(in_state.update)(grads, state_a, params_a)
        updates_b, state_b = jax.jit(compiled_in.update)(grads, state_b, params_b)
        for got, want in zip(jax.tree.leaves(updates_a), jax.tree.leaves(updates_b), strict=True):
            np.testing.assert_allclose(
                np.asarray(got), np.asarray(want), rtol=2e-6, atol=1e-9, err_msg=f"step {step}"
            )
        params_a = optax.apply_updates(params_a, updates_a)
        params_b = optax.apply_updates(params_b, updates_b)
    assert int(state_a.count) == total + 2
    np.testing.assert_allclose(float(state_a.schedule.total_steps), total)


def test_the_compiled_update_does_not_depend_on_the_schedule_numbers() -> None:
    params = _tree(np.random.default_rng(1))
    texts, equal = [], []
    for setting in [(1e-3, 100, 10, 0.0), (0.3, 7, 0, 1e-2)]:
        tx = flat_adamw(warmup_cosine_schedule(*setting), clip_norm=1.0)
        state = tx.init(params)
        texts.append(jax.jit(tx.update).lower(params, state, params).as_text())
        equal.append(tx.update)
    assert texts[0] == texts[1]
    assert equal[0] == equal[1] and hash(equal[0]) == hash(equal[1])
    # A float learning rate is a constant of the step: another value, another step.
    other = flat_adamw(1e-3, clip_norm=1.0).update, flat_adamw(2e-3, clip_norm=1.0).update
    assert other[0] != other[1]


def test_init_puts_the_numbers_in_the_state_as_float32_scalars() -> None:
    params = _tree(np.random.default_rng(2))
    states = [
        jax.jit(flat_adamw(warmup_cosine_schedule(peak, 100, 10)).init)(params)
        for peak in (1e-3, 2e-3)
    ]
    # Two inits that differ only in the numbers: no trace serves both.
    assert [float(state.schedule.peak_lr) for state in states] == [
        float(np.float32(1e-3)),
        float(np.float32(2e-3)),
    ]
    leaves = jax.tree.leaves(states[0].schedule)
    assert [(leaf.dtype, leaf.shape) for leaf in leaves] == [(jnp.float32, ())] * 4
    assert flat_adamw(1e-3).init(params).schedule is None


def test_update_without_the_schedule_in_its_state_raises_value_error() -> None:
    params = _tree(np.random.default_rng(3))
    tx = flat_adamw(warmup_cosine_schedule(1e-3, 10, 1))
    state = tx.init(params)
    bare = FlatAdamWState(state.count, state.mu, state.nu)
    with pytest.raises(ValueError, match=r"state\.schedule is None"):
        tx.update(params, bare, params)


@pytest.mark.parametrize("end", [0.0, 1e-2])
def test_a_zero_peak_gives_optax_rates_with_the_numbers_as_arrays_too(end: float) -> None:
    # optax takes a peak of 0 as alpha 0 (rate 0 throughout); the numbers as
    # float32 arrays (a schedule in an optimizer state) once divided end by it:
    # NaN from the end of the warmup on.
    schedule = WarmupCosine(0.0, 10, 2, end)
    want = optax.warmup_cosine_decay_schedule(0.0, 0.0, 2, 10, end)
    counts = jnp.arange(14, dtype=jnp.int32)
    in_state = jax.jit(lambda numbers, c: jax.vmap(numbers)(c))(schedule.as_arrays(), counts)
    np.testing.assert_array_equal(np.asarray(in_state), np.asarray(jax.vmap(want)(counts)))
    np.testing.assert_array_equal(np.asarray(jax.vmap(schedule)(counts)), np.zeros(14))


@pytest.mark.parametrize(
    "numbers",
    [(1e-3, 10, 10, 0.0), (1e-3, 10, 12, 0.0), (math.nan, 10, 2, 0.0), (1e-3, 10, 2, -1.0)],
    ids=["no_cosine", "warmup_past_total", "nan_peak", "negative_end"],
)
def test_flat_adamw_refuses_a_warmup_cosine_whose_rate_would_be_nan_or_negative(numbers) -> None:
    # Built directly (not by warmup_cosine_schedule), such a schedule once went
    # into the state unchecked: with total <= warmup every rate after the
    # warmup is 0 / 0 = NaN. optax refuses to build the same schedule.
    schedule = WarmupCosine(*numbers)
    if numbers[1] <= numbers[2]:
        with pytest.raises(ValueError):
            optax.warmup_cosine_decay_schedule(0.0, numbers[0], numbers[2], numbers[1], 0.0)
    with pytest.raises(ValueError, match="flat_adamw: learning_rate must be a WarmupCosine"):
        flat_adamw(schedule, clip_norm=1.0)


# ---------------------------------------------------------------------------
# Schedules at their boundaries, against the closed form


@pytest.mark.parametrize(
    "numbers", [(1e-3, 100, 10, 0.0), (0.1, 7, 0, 0.01), (2.0, 7, 6, 0.5), (0.5, 1, 0, 0.7)]
)
def test_schedule_at_step_zero_warmup_end_total_and_beyond_is_the_closed_form(numbers) -> None:
    peak, total, warmup, end = numbers
    schedule = WarmupCosine(*numbers)
    in_state = jax.jit(lambda count, schedule: schedule(count))
    counts = sorted({0, 1, warmup - 1, warmup, warmup + 1, total - 1, total, total + 1, 10 * total})
    for count in (c for c in counts if c >= 0):
        want = warmup_cosine(count, peak, total, warmup, end)
        for label, got in [
            ("int", schedule(count)),
            ("float", schedule(float(count))),
            ("int32", schedule(jnp.int32(count))),
            ("in state", in_state(jnp.int32(count), schedule.as_arrays())),
            ("in state, float count", in_state(jnp.float32(count), schedule.as_arrays())),
        ]:
            assert got.dtype == jnp.float32, label
            np.testing.assert_allclose(
                float(got), want, rtol=2e-6, atol=1e-9, err_msg=f"{label} count {count}"
            )


# ---------------------------------------------------------------------------
# A cosine whose end moves mid-decay (`continued_to`, the time budget's pace)


@pytest.mark.parametrize(
    ("numbers", "count", "new_total"),
    [
        ((1e-3, 100, 10, 0.0), 40, 160),  # moved later
        ((1e-3, 100, 10, 0.0), 40, 55),  # moved earlier
        ((3e-3, 600, 30, 1e-5), 500, 900),  # with an end rate, late in the decay
        ((0.1, 7, 0, 0.01), 3, 4),  # no warmup, one update left
        ((1e-3, 200_000, 100, 0.0), 50_000, 50_002),  # a far end moved close
    ],
)
def test_a_moved_cosine_goes_on_from_the_rate_it_had_to_its_end_rate(
    numbers, count, new_total
) -> None:
    peak, total, warmup, end = numbers
    moved = continued_to(WarmupCosine(*numbers), count, new_total)
    assert (moved.total_steps, moved.end_lr) == (new_total, end)
    # The float64 closed form: a cosine from the old schedule's rate at `count` to the
    # end rate at the new end (half a cosine over the updates left), then the end rate.
    start = warmup_cosine(count, peak, total, warmup, end)
    want = [
        end
        + (start - end)
        * 0.5
        * (1 + math.cos(math.pi * (min(c, new_total) - count) / (new_total - count)))
        for c in range(count, new_total + 2)
    ]
    # As the optimizer state holds it (float32 scalars, under jit) and as Python numbers.
    in_state = jax.jit(lambda c, schedule: schedule(c))
    for label, schedule in [("numbers", moved), ("in state", moved.as_arrays())]:
        got = [float(in_state(jnp.int32(c), schedule)) for c in range(count, new_total + 2)]
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6 * start, err_msg=label)
    assert all(later <= earlier for earlier, later in itertools.pairwise(want))


def test_a_cosine_moved_within_its_warmup_only_ends_elsewhere() -> None:
    schedule = WarmupCosine(1e-3, 100, 10, 0.0)
    assert continued_to(schedule, 4, 30) == dataclasses.replace(schedule, total_steps=30)


@pytest.mark.parametrize(
    ("count", "new_total", "match"),
    [(100, 150, r"ended at update 100, before count 100"), (40, 40, r"got 40"), (5, 10, r"got 10")],
)
def test_a_cosine_cannot_move_past_its_end_or_onto_the_count_or_warmup(
    count, new_total, match
) -> None:
    with pytest.raises(ValueError, match=match):
        continued_to(WarmupCosine(1e-3, 100, 10, 0.0), count, new_total)
