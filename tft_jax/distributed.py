"""Data-parallel placement over devices and hosts with `jax.sharding`.

Training runs as one jitted program over a 1-D `Mesh` whose axis is named
`data`: the global batch is split along its leading axis, parameters and
optimizer state are replicated (or, with `fsdp=True`, split along one axis
each), and XLA's partitioner inserts the gradient all-reduce. The same code
serves one device (a mesh of size 1) and many hosts (after
`initialize_multihost`, each process contributes its own slice of the batch).

Because the batch is one global array, every reduction over it is global:
quantization observers calibrated inside the step see the min/max of the
whole batch, so every replica holds the same ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"

PyTree = Any


def data_mesh(num_devices: int | None = None, devices: Sequence[Any] | None = None) -> Mesh:
    """A 1-D mesh named `data` over the first `num_devices` devices (default: all of them)."""
    available = list(jax.devices() if devices is None else devices)
    count = len(available) if num_devices is None else num_devices
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"num_devices must be a positive int, got {num_devices!r}")
    if count > len(available):
        raise ValueError(
            f"num_devices={count} asks for a mesh larger than the {len(available)} "
            f"available device(s) ({available[0].platform})"
        )
    return Mesh(np.asarray(available[:count]), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over `data`, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def check_divisible(global_batch_size: int, mesh: Mesh) -> None:
    """Raises `ValueError` unless the global batch splits evenly over the mesh."""
    if global_batch_size % mesh.size:
        raise ValueError(
            f"the global batch size {global_batch_size} is not divisible by the "
            f"{mesh.size} devices of the mesh; use a multiple of {mesh.size}"
        )


def shard_batch(batch: PyTree, mesh: Mesh) -> PyTree:
    """Places a batch pytree (leaves `(B, ...)`, None allowed) split over `data`.

    In a single process `batch` is the global batch. With several processes
    each passes its own `(B / num_processes, ...)` slice and the result is
    the global array assembled from them.
    """
    sharding = batch_sharding(mesh)
    leaves = [leaf for leaf in jax.tree.leaves(batch) if leaf is not None]
    if not leaves:
        raise ValueError("shard_batch: the batch has no arrays")
    local_size = np.shape(leaves[0])[0]
    check_divisible(local_size * jax.process_count(), mesh)
    if jax.process_count() == 1:
        return jax.device_put(batch, sharding)
    return jax.tree.map(
        lambda leaf: jax.make_array_from_process_local_data(sharding, np.asarray(leaf)), batch
    )


def fsdp_spec(shape: tuple[int, ...], mesh_size: int, min_size: int = 2**14) -> PartitionSpec:
    """Splits the largest axis divisible by the mesh size; small or indivisible leaves replicate."""
    if int(np.prod(shape, dtype=np.int64)) < min_size:
        return PartitionSpec()
    candidates = [axis for axis, size in enumerate(shape) if size % mesh_size == 0]
    if not candidates:
        return PartitionSpec()
    axis = max(candidates, key=lambda a: shape[a])
    return PartitionSpec(*([None] * axis + [DATA_AXIS]))


def state_shardings(tree: PyTree, mesh: Mesh, fsdp: bool = False) -> PyTree:
    """Shardings for parameters / optimizer state: replicated, or FSDP-style split."""

    def sharding_for(leaf: Any) -> NamedSharding:
        shape = tuple(np.shape(leaf))
        spec = fsdp_spec(shape, mesh.size) if fsdp else PartitionSpec()
        return NamedSharding(mesh, spec)

    return jax.tree.map(sharding_for, tree)


def place_state(tree: PyTree, mesh: Mesh, fsdp: bool = False) -> PyTree:
    """Puts a train state (or any pytree of arrays) on the mesh."""
    return jax.device_put(tree, state_shardings(tree, mesh, fsdp))


def initialize_multihost(coordinator: str, num_processes: int, process_id: int) -> None:
    """Joins a multi-host run (`jax.distributed.initialize`) after checking the arguments."""
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator must be HOST:PORT, got {coordinator!r}")
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}")
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )


def process_slice(num_items: int) -> slice:
    """The contiguous share of `num_items` windows that this process reads."""
    count, index = jax.process_count(), jax.process_index()
    per_process = num_items // count
    return slice(index * per_process, (index + 1) * per_process)
