"""`tft_jax.fit_progress`: the durations and the ETA of `fit`'s plain progress lines."""

from __future__ import annotations

import pytest

from tft_jax.fit_progress import Progress, duration_text


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(4.24, "4.2s"), (59.9, "59.9s"), (185.0, "3m05s"), (3599.4, "59m59s"), (3725.0, "1h02m")],
)
def test_durations_read_as_seconds_minutes_or_hours_with_two_digit_parts(seconds, expected):
    assert duration_text(seconds) == expected


def _progress(now: list[float], total: int, time_budget: float | None) -> Progress:
    return Progress(
        enabled=True, label="fit", total=total, clock=lambda: now[0], elapsed=lambda: now[0],
        time_budget=time_budget, log_every=1, log_seconds=0.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("time_budget", "eta"),
    # 10 steps in 10 s: 90 steps left take 90 s; a budget of 30 s ends the run in 20 s
    # (the sooner of the two), one of 1000 s leaves the 90 s.
    [(30.0, "20.0s"), (1000.0, "1m30s"), (None, "1m30s")],
)
def test_the_eta_is_the_sooner_of_the_steps_left_and_the_time_budget_left(capsys, time_budget, eta):
    now = [0.0]
    progress = _progress(now, 100, time_budget)
    progress.start(0)
    now[0] = 10.0
    progress.stepped(10, 0.5)
    line = capsys.readouterr().err.strip()
    assert line == f"fit: step 10/100  loss 0.5000  elapsed 10.0s  ETA {eta}"
