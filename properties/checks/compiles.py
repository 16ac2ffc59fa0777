"""Counting compilations: `count_compiles`, `assert_max_compiles`."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import jax

_LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"


@dataclasses.dataclass
class CompileLog:
    """Names of the computations lowered for compilation while a `count_compiles` block ran.

    Every `jax.jit` trace that reaches XLA is one entry, persistent-cache hits
    included (those skip only the backend compile), and so is every eager
    primitive run on a new shape.
    """

    names: list[str] = dataclasses.field(default_factory=list)

    @property
    def count(self) -> int:
        """Number of lowerings."""
        return len(self.names)

    def summary(self) -> str:
        """`name xN` per computation, most frequent first."""
        counts = collections.Counter(self.names).most_common()
        return ", ".join(f"{name} x{count}" for name, count in counts)


@contextlib.contextmanager
def count_compiles() -> Iterator[CompileLog]:
    """Context manager recording every computation JAX lowers inside the block.

    Example::

        with checks.count_compiles() as log:
            for config in configs:
                step(config)
        print(log.count, log.summary())
    """
    log = CompileLog()

    def listener(event: str, duration_secs: float, **kwargs: Any) -> None:
        del duration_secs
        if event == _LOWERING_EVENT:
            log.names.append(str(kwargs.get("fun_name", "<unknown>")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield log
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


@contextlib.contextmanager
def assert_max_compiles(max_compiles: int) -> Iterator[CompileLog]:
    """Context manager asserting that at most `max_compiles` computations are lowered inside it.

    Raises:
      AssertionError: on exit, listing what was compiled and how often.
    """
    if isinstance(max_compiles, bool) or not isinstance(max_compiles, int) or max_compiles < 0:
        raise ValueError(f"max_compiles must be an int >= 0, got {max_compiles!r}")
    with count_compiles() as log:
        yield log
    if log.count > max_compiles:
        raise AssertionError(
            f"{log.count} computations compiled, expected at most {max_compiles}: {log.summary()}"
        )
