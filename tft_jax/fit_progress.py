"""`fit`'s progress report: a bar on a terminal, one line per evaluation elsewhere."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

Array = Any


class Progress:
    """What `fit` shows on process 0; nothing at all when not `enabled`.

    On a terminal (or in a notebook) a tqdm bar named by the label, opened
    once the train step has compiled, so that its rate and ETA leave the
    compilation out. Elsewhere (a log file, a pipe) plain lines instead, so a
    log holds no carriage returns: one at least every `log_seconds`, and one
    per evaluation. Notes (resume, compilation, the end) are lines in both.
    Everything goes to `sys.stderr`, as tqdm's bar does.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        label: str | None,
        total: int | None,
        clock: Callable[[], float],
        elapsed: Callable[[], float],
        time_budget: float | None,
        log_every: int,
        log_seconds: float,
    ) -> None:
        self.enabled, self.label, self.total = enabled, label, total
        self.clock, self.elapsed, self.time_budget = clock, elapsed, time_budget
        self.log_every, self.log_seconds = log_every, log_seconds
        self.stream = sys.stderr
        self.interactive = enabled and _interactive(self.stream)
        self.bar: Any = None
        self.postfix: dict[str, str] = {}
        self.first_step: int | None = None  # where the rate is measured from (the last compile)
        self.first_time = 0.0
        self.last_line = -math.inf

    def note(self, text: str) -> None:
        """One line, prefixed with the label."""
        if not self.enabled:
            return
        line = f"{self.label}: {text}" if self.label else text
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def start(self, step: int) -> None:
        """A newly compiled step has run (up to `step`): the rate is measured from here."""
        if not self.enabled:
            return
        self.first_step, self.first_time = step, self.clock()
        self.last_line = self.first_time
        if self.interactive and self.bar is None:
            self.bar = tqdm(
                total=self.total,
                initial=step,
                desc=self.label,
                unit="step",
                dynamic_ncols=True,
                file=self.stream,
            )

    def stepped(self, step: int, loss: Array) -> None:
        """Step `step` has been dispatched; `loss` is read only when shown."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            if step % self.log_every == 0:
                self.postfix["loss"] = f"{float(loss):.4f}"
                self.bar.set_postfix(self.postfix)
        elif self.clock() - self.last_line >= self.log_seconds:
            self._line(step, f"loss {float(loss):.4f}")

    def evaluated(
        self, step: int, train_loss: float, val_loss: float | None, seconds: float
    ) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.postfix.update(train_loss=f"{train_loss:.4f}", val_loss=_format(val_loss))
            self.bar.set_postfix(self.postfix)
            return
        text = f"train_loss {train_loss:.4f}"
        if val_loss is not None:
            text += f"  val_loss {val_loss:.4f} (evaluated in {duration_text(seconds)})"
        self._line(step, text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _line(self, step: int, text: str) -> None:
        now = self.clock()
        self.last_line = now
        parts = [
            f"step {step_text(step, self.total)}",
            text,
            f"elapsed {duration_text(self.elapsed())}",
        ]
        eta = self._eta(step, now)
        if eta is not None:
            parts.append(f"ETA {duration_text(eta)}")
        self.note("  ".join(parts))

    def _eta(self, step: int, now: float) -> float | None:
        """Seconds left: at the rate since the compiled step first ran, within the budget."""
        left = []
        if self.time_budget is not None:
            left.append(max(0.0, self.time_budget - self.elapsed()))
        if (
            self.total is not None
            and self.first_step is not None
            and step > self.first_step
            and now > self.first_time
        ):
            rate = (step - self.first_step) / (now - self.first_time)
            left.append(max(0, self.total - step) / rate)
        return min(left) if left else None


def _interactive(stream: Any) -> bool:
    """Whether `stream` shows a live bar: a terminal, or tqdm's notebook widget."""
    if any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__):
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


def step_text(step: int, total: int | None) -> str:
    """`step/total`, or `step` when the total is not known."""
    return f"{step}" if total is None else f"{step}/{total}"


def duration_text(seconds: float) -> str:
    """`4.2s`, `3m05s` or `1h02m`."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    seconds = round(seconds)
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _format(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
