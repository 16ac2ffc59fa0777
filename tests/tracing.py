"""`recorded_traces()` and `recorded_programs()`: what JAX traces and compiles in a block.

The tests that check that a refit or a reload reuses the compiled programs
read JAX's own monitoring events, so they hold whatever the caching
mechanism is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax

_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
# Reported for a compile, and for a persistent-cache hit (an in-memory one reports nothing).
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_traces: list[list[str]] = []
_programs: list[list[str]] = []


def _record(event: str, duration: float, **kwargs: object) -> None:
    name = str(kwargs.get("fun_name"))
    if event == _TRACE_EVENT:
        for names in _traces:
            names.append(name)
    if event in (_TRACE_EVENT, _COMPILE_EVENT):
        for names in _programs:
            names.append(f"{event.rsplit('/', 1)[-1]}: {name}")


jax.monitoring.register_event_duration_secs_listener(_record)


@contextlib.contextmanager
def _collected(active: list[list[str]]) -> Iterator[list[str]]:
    names: list[str] = []
    active.append(names)
    try:
        yield names
    finally:
        active.remove(names)


def recorded_traces() -> contextlib.AbstractContextManager[list[str]]:
    """Yields a list that collects the name of every function traced in the block."""
    return _collected(_traces)


def recorded_programs() -> contextlib.AbstractContextManager[list[str]]:
    """Yields a list of `'<event>: <function>'`, one per trace and per compile in the block
    (`jaxpr_trace_duration: _train_step`, `backend_compile_duration: jit(_train_step)`)."""
    return _collected(_programs)
