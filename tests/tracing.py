"""`recorded_traces()` and `recorded_compiles()`: what JAX traces and compiles in a block.

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
_active: dict[str, list[list[str]]] = {_TRACE_EVENT: [], _COMPILE_EVENT: []}


def _record(event: str, duration: float, **kwargs: object) -> None:
    for names in _active.get(event, ()):
        names.append(str(kwargs.get("fun_name")))


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
    return _collected(_active[_TRACE_EVENT])


def recorded_compiles() -> contextlib.AbstractContextManager[list[str]]:
    """Yields a list that collects the name of every program compiled in the block
    (`jit(_train_step)`; a persistent-cache hit counts, an in-memory one does not)."""
    return _collected(_active[_COMPILE_EVENT])
