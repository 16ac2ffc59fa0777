"""`recorded_traces()`: the functions JAX traces inside a `with` block, by name.

The tests that check that a refit or a reload reuses the compiled programs
read JAX's own monitoring events, so they hold whatever the caching
mechanism is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax

_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
_active: list[list[str]] = []


def _record(event: str, duration: float, **kwargs: object) -> None:
    if event == _TRACE_EVENT:
        for names in _active:
            names.append(str(kwargs.get("fun_name")))


jax.monitoring.register_event_duration_secs_listener(_record)


@contextlib.contextmanager
def recorded_traces() -> Iterator[list[str]]:
    """Yields a list that collects the name of every function traced in the block."""
    names: list[str] = []
    _active.append(names)
    try:
        yield names
    finally:
        _active.remove(names)
