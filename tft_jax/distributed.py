"""Data-parallel placement over devices and hosts with `jax.sharding`.

Training runs as one jitted program over a 1-D `Mesh` whose axis is named
`data`: the global batch is split along its leading axis, parameters and
optimizer state are replicated (or, with `fsdp=True`, split along one axis
each), and XLA's partitioner inserts the gradient all-reduce. The same code
serves one device (a mesh of size 1) and many hosts (after
`initialize_multihost`, each process contributes its own slice of the batch).

On a mesh of the default device alone (one device, one process), placement
leaves arrays uncommitted, as `jax.device_put` without a device and NumPy
inputs are: `jax.jit` keys its programs by whether inputs are committed, so
the programs `fit` compiles are then the ones a direct `train_step`,
`evaluate` or `predict` on its result runs, not a second set.

Because the batch is one global array, every reduction over it is global:
quantization observers calibrated inside the step see the min/max of the
whole batch, so every replica holds the same ranges.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from tft_jax.data.listing import repeated

DATA_AXIS = "data"

PyTree = Any


def data_mesh(num_devices: int | None = None, devices: Sequence[Any] | None = None) -> Mesh:
    """A 1-D mesh named `data` over the first `num_devices` devices (default: all of them).

    Without `devices` they are ordered by process, then id, so that each
    process owns one contiguous block of the batch (`process_rows`).

    Raises:
      TypeError: `num_devices` is not an int (a string, a float, a bool), or
        `devices` is not a sequence of JAX devices (one device alone, a string).
      ValueError: `num_devices` below 1 or above the device count, or
        `devices` empty or listing a device twice.
    """
    if num_devices is not None and (
        isinstance(num_devices, bool) or not isinstance(num_devices, int | np.integer)
    ):
        raise TypeError(
            f"data_mesh: num_devices must be an int (or None for every device), got "
            f"{type(num_devices).__name__} {num_devices!r}"
        )
    if devices is None:
        available = sorted(jax.devices(), key=lambda device: (device.process_index, device.id))
    else:
        if isinstance(devices, str | bytes):  # read character by character otherwise
            raise TypeError(
                f"data_mesh: devices must be a sequence of JAX devices, got {devices!r}"
            )
        if isinstance(devices, jax.Device):  # `list(device)`: "'Device' object is not iterable"
            raise TypeError(
                f"data_mesh: devices must be a sequence of JAX devices, got one Device "
                f"{devices!r}: pass [device]"
            )
        available = list(devices)
        if not available:
            raise ValueError("data_mesh: devices is empty; pass at least one device, or None")
        for index, device in enumerate(available):
            if not isinstance(device, jax.Device):
                raise TypeError(
                    f"data_mesh: devices[{index}] must be a JAX device (e.g. from "
                    f"jax.devices()), got {type(device).__name__} {device!r}"
                )
        twice = repeated(available)
        if twice:
            raise ValueError(
                f"data_mesh: devices lists {twice[0]} more than once; a mesh holds each device once"
            )
    count = len(available) if num_devices is None else int(num_devices)
    if count < 1:
        raise ValueError(f"num_devices must be a positive int, got {num_devices!r}")
    if count > len(available):
        raise ValueError(
            f"num_devices={count} asks for a mesh larger than the {len(available)} "
            f"available device(s) ({available[0].platform})"
        )
    return Mesh(np.asarray(available[:count]), (DATA_AXIS,))


def check_mesh(owner: str, mesh: Any) -> None:
    """Raises unless `mesh` is a `jax.sharding.Mesh` with a `data` axis (as `data_mesh` makes).

    Training is data-parallel only: other axes must have size 1, since the
    batch is split over `data` alone while its divisibility, and FSDP's
    split of the parameters, go by the mesh's size.

    Raises:
      TypeError: `mesh` is not a `Mesh` (a string, a device list).
      ValueError: it has no `data` axis to split the batch over, or another
        axis longer than 1.
    """
    if not isinstance(mesh, Mesh | AbstractMesh):
        raise TypeError(
            f"{owner}: mesh must be a jax.sharding.Mesh with a {DATA_AXIS!r} axis "
            f"(tft_jax.distributed.data_mesh()), got {type(mesh).__name__} {mesh!r}"
        )
    if DATA_AXIS not in mesh.axis_names:
        raise ValueError(
            f"{owner}: mesh must have a {DATA_AXIS!r} axis to split the batch over, got axes "
            f"{tuple(mesh.axis_names)} (tft_jax.distributed.data_mesh() makes one)"
        )
    others = {name: size for name, size in mesh.shape.items() if name != DATA_AXIS and size != 1}
    if others:
        raise ValueError(
            f"{owner}: mesh axes other than {DATA_AXIS!r} must have size 1 (training is "
            f"data-parallel only), got {dict(mesh.shape)}; use a 1-D mesh "
            "(tft_jax.distributed.data_mesh())"
        )


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

    On a mesh of the default device alone, NumPy and uncommitted leaves are
    placed uncommitted (the module's docstring says why), committed ones
    on the mesh's device.

    In a single process `batch` is the global batch. With several processes
    each passes its own `(B / num_processes, ...)` slice, rows
    `process_rows(B, process_index, num_processes)` of the global batch, and
    the result is the global array assembled from them.
    """
    check_mesh("shard_batch", mesh)
    sharding = batch_sharding(mesh)
    leaves = jax.tree_util.tree_flatten_with_path(batch)[0]
    if not leaves:
        raise ValueError("shard_batch: the batch has no arrays")
    local_size = _batch_rows(leaves)
    processes = jax.process_count()
    global_size = local_size * processes
    check_divisible(global_size, mesh)
    if default_device_only(mesh):
        # NumPy leaves go uncommitted, as a direct call's do; committed ones to the mesh.
        return jax.tree.map(lambda leaf: _placed_leaf(leaf, sharding), batch)
    if processes == 1:
        return jax.device_put(batch, sharding)

    def assemble(leaf: Any) -> jax.Array:
        local = np.asarray(leaf)
        return jax.make_array_from_process_local_data(
            sharding, local, (global_size, *local.shape[1:])
        )

    return jax.tree.map(assemble, batch)


def _batch_rows(leaves: list[tuple[Any, Any]]) -> int:
    """The common leading size of the `(path, leaf)` pairs of a batch, checked.

    Every leaf is split along its first axis, so every leaf needs one, of one
    common, positive size: otherwise `jax.device_put` failed deep inside with
    a sharding error about one leaf (or the first leaf's size was taken for
    all, and a 0-d leaf raised `IndexError`).
    """
    first_path, first = leaves[0]
    for path, leaf in leaves:
        shape = np.shape(leaf)
        if not shape:
            raise ValueError(
                f"shard_batch: batch{jax.tree_util.keystr(path)} is a scalar; every leaf "
                "needs a leading batch axis"
            )
        if shape[0] != np.shape(first)[0]:
            raise ValueError(
                f"shard_batch: batch{jax.tree_util.keystr(path)} has {shape[0]} rows "
                f"(shape {shape}), expected {np.shape(first)[0]} as "
                f"batch{jax.tree_util.keystr(first_path)}"
            )
    rows = int(np.shape(first)[0])
    if rows < 1:
        raise ValueError("shard_batch: the batch has 0 rows")
    return rows


def fsdp_spec(shape: tuple[int, ...], mesh_size: int, min_size: int = 2**14) -> PartitionSpec:
    """Splits the largest axis divisible by the mesh size; small or indivisible leaves replicate.

    Raises:
      TypeError: `mesh_size` is not an int.
      ValueError: `mesh_size` is below 1.
    """
    if isinstance(mesh_size, bool) or not isinstance(mesh_size, int | np.integer):
        raise TypeError(
            f"fsdp_spec: mesh_size must be an int (the mesh's device count), got "
            f"{type(mesh_size).__name__} {mesh_size!r}"
        )
    if mesh_size < 1:
        raise ValueError(f"fsdp_spec: mesh_size must be a positive int, got {mesh_size}")
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
    """Puts a train state (or any pytree of arrays) on the mesh.

    On a mesh of the default device alone the arrays are left uncommitted
    (see the module's docstring); a committed one (a restored checkpoint's)
    is copied through the host, JAX having no call that uncommits in place.
    """
    if default_device_only(mesh):
        return jax.tree.map(_uncommitted, tree)
    return jax.device_put(tree, state_shardings(tree, mesh, fsdp))


def default_device_only(mesh: Mesh) -> bool:
    """Whether `mesh` is this single process's default device alone.

    Arrays there need not be committed: an uncommitted array lives on that
    device, and a one-device mesh splits nothing (FSDP included).
    """
    if not isinstance(mesh, Mesh) or mesh.size != 1 or jax.process_count() != 1:
        return False
    return bool(mesh.devices.flat[0] == _default_device())


def _default_device() -> jax.Device:
    """The device that uncommitted arrays live on (`jax_default_device`, else the first)."""
    chosen = jax.config.jax_default_device  # type: ignore[attr-defined]  # added at runtime
    if chosen is None:
        return jax.local_devices()[0]
    if isinstance(chosen, str):  # a platform name
        return jax.local_devices(backend=chosen)[0]
    return chosen


def _placed_leaf(leaf: Any, sharding: NamedSharding) -> Any:
    """A batch leaf on a mesh of the default device alone: committed ones onto it (one
    committed to another device moves), the others uncommitted."""
    if isinstance(leaf, jax.Array) and leaf.committed:
        return jax.device_put(leaf, sharding)
    return jax.device_put(leaf)


def _uncommitted(leaf: Any) -> Any:
    """`leaf` on the default device, uncommitted (a typed PRNG key through its data)."""
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(
            _uncommitted(jax.random.key_data(leaf)), impl=jax.random.key_impl(leaf)
        )
    if isinstance(leaf, jax.Array) and leaf.committed:
        return jax.device_put(np.asarray(leaf))
    return jax.device_put(leaf)


class MultihostArgumentError(ValueError):
    """A bad multi-host argument: `argument` names it, `detail` says what is wrong with it."""

    def __init__(self, argument: str, detail: str) -> None:
        super().__init__(f"{argument} {detail}")
        self.argument, self.detail = argument, detail


def check_multihost_arguments(coordinator: str, num_processes: int, process_id: int) -> None:
    """Raises unless `coordinator` is HOST:PORT and `0 <= process_id < num_processes`.

    HOST is a name or an IPv4 address, or an IPv6 address in brackets; no
    scheme (`http://`), spaces or path.

    Pure (JAX is not touched), so a command line can check its flags first.
    A wrong type raises `TypeError`; a wrong value `MultihostArgumentError`
    (a `ValueError`), whose `argument` names the parameter at fault.
    """
    for name, value in (("num_processes", num_processes), ("process_id", process_id)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an int, got {value!r}")
    host, _, port = str(coordinator).rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    if (
        not host
        or not (port.isascii() and port.isdigit())  # '²' and '٣' are digits to str.isdigit
        or not 0 < int(port) < 2**16
        or any(c.isspace() or c in "/@" for c in host)
        or (any(c in host for c in ":[]") and not bracketed)  # IPv6 goes in brackets
    ):
        raise MultihostArgumentError(
            "coordinator",
            f"must be HOST:PORT with a port in 1..65535, got {coordinator!r} (HOST: a name or "
            "an IPv4 address, or an IPv6 address in brackets, [::1]:1234; no scheme or spaces)",
        )
    if num_processes < 1:
        raise MultihostArgumentError("num_processes", f"must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise MultihostArgumentError(
            "process_id",
            f"must be in [0, {num_processes}) for {num_processes} processes, got {process_id}",
        )


# How long a process waits for every process of a multi-host run to join it; JAX then
# ends the process (a coordinator that nobody started, a process that never came).
JOIN_TIMEOUT_SECONDS = 300


def initialize_multihost(
    coordinator: str, num_processes: int, process_id: int, *, preemption_service: bool = False
) -> None:
    """Joins a multi-host run (`jax.distributed.initialize`) after checking the arguments.

    Call it before any other JAX computation, in every process, with the same
    `coordinator` (process 0's HOST:PORT) and `num_processes`. A process
    whose peers have not all joined within `JOIN_TIMEOUT_SECONDS` is ended
    by JAX (it cannot be caught).

    JAX's preemption service (`jax_enable_preemption_service`) catches
    SIGTERM so that a training loop polling
    `multihost_utils.reached_preemption_sync_point` can checkpoint first;
    nothing in tft_jax polls it, so a joined process ignored SIGTERM
    (`timeout`, `kill`) and only SIGKILL ended it. It is left off unless
    `preemption_service=True`, so SIGTERM ends the process as usual.
    """
    check_multihost_arguments(coordinator, num_processes, process_id)
    if not isinstance(preemption_service, bool):
        raise TypeError(f"preemption_service must be a bool, got {preemption_service!r}")
    previous = jax.config.jax_enable_preemption_service  # type: ignore[attr-defined]  # a flag jax adds at runtime
    jax.config.update("jax_enable_preemption_service", preemption_service)
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=int(num_processes),
            process_id=int(process_id),
            initialization_timeout=JOIN_TIMEOUT_SECONDS,
        )
    finally:  # read once, by initialize
        jax.config.update("jax_enable_preemption_service", previous)


# How many settings `differing_settings` compares one by one; further settings share its
# last slot. The slots are a fixed number, so that its one collective has the same shape in
# every process whatever each was given.
SETTINGS_SLOTS = 256


def _digest(text: str) -> int:
    """32 bits of the SHA-256 of `text`."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def settings_digests(settings: Mapping[str, str]) -> tuple[np.ndarray, list[list[str]]]:
    """The `(SETTINGS_SLOTS,)` uint32 digests `differing_settings` gathers, and each slot's names.

    Slot 0 digests the sorted names, slot `1 + i` the `i`-th name with its
    value; names past the last slot share it. Unused slots hold 0.
    """
    if not isinstance(settings, Mapping):
        raise TypeError(f"settings must be a mapping of names to str, got {settings!r}")
    for name, value in settings.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"settings must map str names to str values, got {name!r}: {value!r}")
    names = sorted(settings)
    groups = [[name] for name in names[: SETTINGS_SLOTS - 2]]
    if names[SETTINGS_SLOTS - 2 :]:
        groups.append(names[SETTINGS_SLOTS - 2 :])
    digests = np.zeros(SETTINGS_SLOTS, np.uint32)
    digests[0] = _digest(json.dumps(names))
    for slot, group in enumerate(groups, start=1):
        digests[slot] = _digest(json.dumps([[name, settings[name]] for name in group]))
    return digests, [[], *groups]


def differing_settings(settings: Mapping[str, str]) -> dict[str | None, tuple[int, ...]]:
    """Which of this process's `settings` (name -> value) other processes hold otherwise.

    Returns `{name: indices of the processes whose value differs}` for each
    differing name; `{None: indices}` alone when some processes have other
    names (then no value is compared); `{}` when all agree, and always in a
    single process.

    A collective: every process of a multi-host run must call it (right after
    joining, before any computation whose shapes depend on the settings). It
    gathers one fixed-size array of 32-bit digests (`SETTINGS_SLOTS`) with
    `multihost_utils.process_allgather`, so it cannot hang on settings that
    differ in number, names or values: each process learns which differ,
    though not the other processes' values. Processes with different numbers
    of local devices, which `process_allgather` cannot serve ("cannot reshape
    array of size 4 into shape (2,1)"), raise `LocalDevicesDisagreeError`
    first (`check_local_devices_agree`, no communication).
    """
    digests, groups = settings_digests(settings)
    if jax.process_count() == 1:
        return {}
    check_local_devices_agree()
    gathered = np.asarray(multihost_utils.process_allgather(digests))
    this = jax.process_index()
    others = [index for index in range(len(gathered)) if index != this]
    if names_differ := tuple(i for i in others if gathered[i][0] != digests[0]):
        return {None: names_differ}
    differing: dict[str | None, tuple[int, ...]] = {}
    for slot, group in enumerate(groups[1:], start=1):
        processes = tuple(i for i in others if gathered[i][slot] != digests[slot])
        if processes:
            differing.update((name, processes) for name in group)
    return differing


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, in hex; why not, for a file that cannot be read.

    What processes compare of a table given by path (`check_settings_agree`):
    hosts may mount one file at different paths. A file that cannot be read
    is reported by whoever reads it, once the processes agree.
    """
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
    except OSError as error:
        return f"unreadable ({error.strerror or type(error).__name__})"
    return digest.hexdigest()


class ProcessesDisagreeError(ValueError):
    """The processes of a multi-process run were given other settings (`check_settings_agree`).

    `differing` maps each differing setting to the indices of the processes
    holding another value (`{None: indices}`: other sets of names), as
    `differing_settings` returns it.
    """

    def __init__(self, message: str, differing: Mapping[str | None, tuple[int, ...]]) -> None:
        super().__init__(message)
        self.differing = dict(differing)


def other_processes(indices: tuple[int, ...]) -> str:
    """'process 2: differs' or 'processes 1, 3: differ', for the messages of disagreement."""
    if len(indices) == 1:
        return f"process {indices[0]}: differs"
    return f"processes {', '.join(map(str, indices))}: differ"


def check_settings_agree(settings: Mapping[str, tuple[str, str]], owner: str, advice: str) -> None:
    """Raises `ProcessesDisagreeError`, in every process, unless all hold the same `settings`.

    `settings` maps a name to `(compared, shown)`: the text compared between
    the processes (a digest for a table) and the value the message shows. The
    error names each differing setting with this process's shown value and the
    processes that hold another, led by `owner` (`"fit"`; none when empty)
    and followed by `advice`. One fixed-size collective (`differing_settings`), so every process
    must call it, before any collective whose shapes depend on the settings;
    nothing is gathered in a single process.
    """
    differing = differing_settings({name: compared for name, (compared, _) in settings.items()})
    if not differing:
        return
    this, count, lead = jax.process_index(), jax.process_count(), f"{owner}: " if owner else ""
    if None in differing:
        message = (
            f"{lead}the processes hold different sets of settings (this process, {this} of "
            f"{count}: {len(settings)} settings; {other_processes(differing[None])}): {advice}"
        )
        raise ProcessesDisagreeError(message, differing)
    parts = [
        f"{name} differs between the processes (this process, {this} of {count}: "
        f"{settings[name][1]}; {other_processes(indices)})"
        for name, indices in differing.items()
        if name is not None  # a differing set of names was raised above
    ]
    raise ProcessesDisagreeError(lead + "; ".join(parts) + f": {advice}", differing)


def local_device_counts() -> dict[int, int]:
    """The number of devices of each process, by process index, from `jax.devices()`.

    No communication: after joining, every process lists every process's
    devices (each with its `process_index`), so all read the same counts.
    """
    counts = dict.fromkeys(range(jax.process_count()), 0)
    for device in jax.devices():
        counts[device.process_index] = counts.get(device.process_index, 0) + 1
    return counts


class LocalDevicesDisagreeError(ValueError):
    """The processes of a multi-process run have different numbers of local devices."""

    def __init__(self, message: str, counts: Mapping[int, int]) -> None:
        super().__init__(message)
        self.counts = dict(counts)


def check_local_devices_agree(owner: str | None = None) -> None:
    """Raises `LocalDevicesDisagreeError` unless every process has as many devices as this one.

    `data_mesh` and `process_rows` give each process an equal block of every
    global batch, one row block per device: processes with 1 and 3 devices
    failed deep inside JAX ("cannot reshape array of size 4 into shape (2,1)").
    Call it after joining (`initialize_multihost`), before any mesh is made;
    it needs no communication (`local_device_counts`), so every process raises
    the same error at once, each naming its own count. Nothing to check in a
    single process. `owner` ("fit") leads the message.
    """
    if jax.process_count() == 1:
        return
    counts = local_device_counts()
    this = jax.process_index()
    mine = counts.get(this, 0)
    others = [f"process {index} has {count}" for index, count in counts.items() if count != mine]
    if not others:
        return
    lead = f"{owner}: " if owner else ""
    raise LocalDevicesDisagreeError(
        f"{lead}every process of a multi-process run needs the same number of local devices: "
        f"this process ({this} of {len(counts)}) has {mine}, {', '.join(others)} (devices per "
        f"process: {', '.join(str(counts[i]) for i in sorted(counts))}); give each process as "
        "many (CUDA_VISIBLE_DEVICES; on CPU XLA_FLAGS=--xla_force_host_platform_device_count)",
        counts,
    )


def process_rows(global_size: int, process_index: int, process_count: int) -> slice:
    """The rows `[i·B/P, (i+1)·B/P)` of a global batch of `B` that process `i` of `P` holds.

    `shard_batch` assembles the global batch from these blocks in process
    order, which is the layout of `data_mesh` (devices ordered by process).

    Raises:
      ValueError: `B` not divisible by `P`, or `i` outside `[0, P)`.
    """
    for name, value in (
        ("global_size", global_size),
        ("process_index", process_index),
        ("process_count", process_count),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"process_rows: {name} must be an int, got {value!r}")
    if process_count < 1:
        raise ValueError(f"process_rows: process_count must be >= 1, got {process_count}")
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"process_rows: process_index must be in [0, {process_count}), got {process_index}"
        )
    if global_size < 1 or global_size % process_count:
        raise ValueError(
            f"process_rows: the global batch size {global_size} must be a positive multiple "
            f"of the {process_count} processes"
        )
    per_process = global_size // process_count
    return slice(process_index * per_process, (process_index + 1) * per_process)


def local_rows(global_size: int) -> slice:
    """`process_rows` of this process (all rows in a single-process run)."""
    return process_rows(global_size, jax.process_index(), jax.process_count())


def is_primary() -> bool:
    """True in process 0, the one that writes a run's files (always True in one process)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier `name` (nothing in one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def to_host(tree: PyTree) -> PyTree:
    """Every leaf of `tree` as a NumPy array holding its whole (global) value.

    A typed PRNG key array (`jax.random.key`) has no NumPy form: it comes
    back as its key data (`jax.random.key_data`, uint32 with the key's own
    trailing axis), which `jax.random.wrap_key_data` turns back into keys.
    A fully addressable leaf is copied from its device; a replicated leaf that
    spans other processes' devices is read from this process's replica (no
    communication); a leaf split across processes (FSDP) is gathered with
    `multihost_utils.process_allgather`, a collective, so in a multi-process
    run every process must call `to_host` on the same tree.
    """

    def fetch(leaf: Any) -> np.ndarray:
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
            return np.asarray(jax.device_get(leaf))
        if leaf.is_fully_replicated:
            return np.asarray(leaf.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))

    return jax.tree.map(fetch, tree)
