"""JAX's default backend, probed in a child process so that the caller never holds the chip.

Imports no JAX: the test suite's `conftest.py` probes before it sets
`XLA_FLAGS` for its own process, and `benchmarks.device_check` before it
hands the accelerator to the stages it runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

__all__ = ["probe_default_backend"]

# Starts the backend (one array on it): a backend that is found but fails to start
# (a GPU plugin without a usable device, an XLA flag it refuses) counts as none.
_PROBE = (
    "import jax, jax.numpy as jnp; jnp.zeros(2).block_until_ready(); print(jax.default_backend())"
)


def probe_default_backend(
    environment: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
) -> str | None:
    """The default backend a fresh JAX process starts with (`"cpu"`, `"gpu"`, ...), or None.

    Args:
      environment: variables set for the child on top of this process's
        (`XLA_FLAGS`, say). The child never preallocates a GPU's memory.
      cwd: the child's working directory (what it imports from).

    Returns:
      The backend's name, or None when JAX cannot start with these settings.
    """
    env = {**os.environ, **(environment or {}), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    child = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, cwd=cwd
    )
    lines = child.stdout.split()
    return lines[-1] if child.returncode == 0 and lines else None
