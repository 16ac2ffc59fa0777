"""Data parallelism on 8 simulated CPU devices (in a subprocess) and its argument checks."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.linear_quantile_model import LR, MODEL, linear_batch
from tft_jax import distributed
from tft_jax.distributed import (
    SETTINGS_SLOTS,
    MultihostArgumentError,
    check_mesh,
    check_multihost_arguments,
    data_mesh,
    differing_settings,
    fsdp_spec,
    initialize_multihost,
    local_rows,
    process_rows,
    settings_digests,
    shard_batch,
    to_host,
)
from tft_jax.train import create_train_state, fit, make_optimizer

SCRIPT = pathlib.Path(__file__).with_name("multidevice_checks.py")


@pytest.mark.multidevice
def test_sharded_training_matches_single_device_on_8_simulated_devices():
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=1800
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    passed = [line for line in result.stdout.splitlines() if line.startswith("passed ")]
    assert len(passed) == 8, result.stdout


def test_mesh_larger_than_the_devices_is_rejected():
    with pytest.raises(ValueError, match=rf"num_devices={jax.device_count() + 1} .* available"):
        data_mesh(jax.device_count() + 1)


def test_data_mesh_refuses_devices_that_are_not_distinct_jax_devices():
    # Before: 'cpu' made a mesh of the devices 'c', 'p', 'u'; ints were taken; a repeated
    # device failed later in shard_batch with JAX's "safe_zip() argument 1 has length 2".
    device = jax.devices()[0]
    with pytest.raises(TypeError, match=r"data_mesh: devices must be a sequence of JAX devices"):
        data_mesh(devices="cpu")
    with pytest.raises(TypeError, match=r"data_mesh: devices\[0\] must be a JAX device .* int 0"):
        data_mesh(devices=[0])
    with pytest.raises(ValueError, match=r"data_mesh: devices lists .* more than once"):
        data_mesh(devices=[device, device])
    assert data_mesh(devices=[device]).devices.tolist() == [device]


def test_a_mesh_with_another_axis_longer_than_1_is_refused_naming_its_shape():
    # Before: accepted, the batch split over 'data' (2) but its size checked against 8.
    two_axes = jax.sharding.AbstractMesh((2, 4), ("data", "model"))
    with pytest.raises(ValueError, match=r"fit: mesh axes other than 'data' must have size 1"):
        check_mesh("fit", two_axes)
    check_mesh("fit", jax.sharding.AbstractMesh((8, 1), ("data", "model")))
    with pytest.raises(TypeError, match=r"shard_batch: mesh must be a jax.sharding.Mesh"):
        shard_batch({"x": np.zeros((2, 3))}, "data")


def test_fsdp_splits_the_largest_divisible_axis_and_replicates_small_leaves():
    assert fsdp_spec((160, 640), 8) == jax.sharding.PartitionSpec(None, "data")
    assert fsdp_spec((644, 160), 8) == jax.sharding.PartitionSpec(None, "data")
    assert fsdp_spec((7, 9), 8) == jax.sharding.PartitionSpec()
    assert fsdp_spec((161, 163), 8, min_size=1) == jax.sharding.PartitionSpec()


def test_fsdp_replicates_only_leaves_below_min_size_and_splits_one_of_exactly_that_size():
    data, replicated = jax.sharding.PartitionSpec("data"), jax.sharding.PartitionSpec()
    assert fsdp_spec((2**14,), 2) == data  # the default min_size, 2**14 elements
    assert fsdp_spec((2**14 - 2,), 2) == replicated
    assert fsdp_spec((2, 3), 2, min_size=6) == data
    assert fsdp_spec((2, 2), 2, min_size=6) == replicated


@pytest.mark.parametrize(
    "coordinator, processes, index, message",
    [
        ("localhost", 2, 0, "HOST:PORT"),
        ("h:70000", 2, 0, "port in 1..65535"),
        ("h:1", 0, 0, "num_processes"),
        ("h:1", 2, 2, "process_id"),
    ],
)
def test_multihost_arguments_are_checked_before_jax_distributed(
    coordinator, processes, index, message
):
    with pytest.raises(ValueError, match=message):
        initialize_multihost(coordinator, processes, index)


def test_a_single_process_reads_every_row_of_a_batch():
    assert local_rows(10) == slice(0, 10)


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_process_rows_split_a_global_batch_into_contiguous_blocks_in_process_order(processes):
    rows = np.arange(8)
    blocks = [rows[process_rows(8, index, processes)] for index in range(processes)]
    assert all(len(block) == 8 // processes for block in blocks)
    np.testing.assert_array_equal(np.concatenate(blocks), rows)


@pytest.mark.parametrize(
    "size, index, count, message",
    [
        (6, 0, 4, "global batch size 6 must be a positive multiple of the 4 processes"),
        (8, 2, 2, r"process_index must be in \[0, 2\), got 2"),
        (8, 0, 0, "process_count must be >= 1"),
    ],
)
def test_process_rows_rejects_batches_that_do_not_split(size, index, count, message):
    with pytest.raises(ValueError, match=message):
        process_rows(size, index, count)


def test_good_multihost_arguments_pass_and_a_float_id_is_a_type_error():
    check_multihost_arguments("10.0.0.1:1234", 4, 3)
    check_multihost_arguments("[::1]:1234", 4, 3)
    check_multihost_arguments("node-7.cluster.local:8476", 2, 0)
    with pytest.raises(TypeError, match="process_id must be an int"):
        check_multihost_arguments("h:1", 2, 1.0)


@pytest.mark.parametrize(
    "coordinator, processes, index, argument, detail",
    [
        ("h", 2, 0, "coordinator", "must be HOST:PORT with a port in 1..65535, got 'h'"),
        ("h:70000", 2, 0, "coordinator", "must be HOST:PORT"),
        # Passed before, to wait up to JOIN_TIMEOUT_SECONDS in jax.distributed.initialize.
        ("::1", 2, 0, "coordinator", r"must be HOST:PORT .*got '::1' \(HOST.*\[::1\]:1234"),
        ("http://h:1234", 2, 0, "coordinator", "must be HOST:PORT"),
        (" localhost :1234", 2, 0, "coordinator", "must be HOST:PORT"),
        ("[]:1234", 2, 0, "coordinator", "must be HOST:PORT"),
        ("h:1", 0, 0, "num_processes", "must be >= 1, got 0"),
        ("h:1", 2, 2, "process_id", r"must be in \[0, 2\) for 2 processes, got 2"),
        ("h:1", 2, -1, "process_id", r"must be in \[0, 2\) for 2 processes, got -1"),
    ],
)
def test_bad_multihost_arguments_name_the_argument_without_starting_jax_distributed(
    coordinator, processes, index, argument, detail
):
    with pytest.raises(MultihostArgumentError, match=f"^{argument} {detail}") as info:
        check_multihost_arguments(coordinator, processes, index)
    assert info.value.argument == argument and isinstance(info.value, ValueError)


def test_to_host_returns_numpy_copies_of_the_values():
    tree = {"a": jnp.arange(6.0).reshape(2, 3), "b": np.int32(3)}
    host = to_host(tree)
    assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(host))
    np.testing.assert_array_equal(host["a"], np.arange(6.0).reshape(2, 3))
    assert host["b"] == 3


def test_data_mesh_orders_devices_by_process():
    mesh = data_mesh()
    order = [(device.process_index, device.id) for device in mesh.devices.flat]
    assert order == sorted(order)


@pytest.mark.parametrize(
    "batch, message",
    [
        # Accepted before on one device (the first leaf's size was taken for all).
        ({"a": np.zeros((4, 2)), "b": np.zeros((3, 1))}, r"batch\['b'\] has 3 rows .* expected 4"),
        # A deep `device_put` error about the sharding's rank, or an IndexError.
        ({"a": np.zeros((4, 2)), "b": np.float32(1.0)}, r"batch\['b'\] is a scalar"),
        ({"a": np.float32(1.0), "b": np.zeros((4, 2))}, r"batch\['a'\] is a scalar"),
        ({"a": np.zeros((0, 2)), "b": None}, "the batch has 0 rows"),
    ],
)
def test_shard_batch_names_the_leaf_that_is_not_a_batch_of_the_common_size(batch, message):
    with pytest.raises(ValueError, match=f"shard_batch: .*{message}"):
        shard_batch(batch, data_mesh(1))


def test_shard_batch_places_every_leaf_and_keeps_none():
    batch = {"a": np.arange(8.0).reshape(4, 2), "b": None, "c": np.arange(4)}
    placed = shard_batch(batch, data_mesh(1))
    assert placed["b"] is None
    np.testing.assert_array_equal(np.asarray(placed["a"]), batch["a"])
    np.testing.assert_array_equal(np.asarray(placed["c"]), batch["c"])


def test_an_empty_device_list_is_named_and_numpy_integers_are_ints():
    # An empty list said "num_devices must be a positive int, got None", or raised
    # IndexError with num_devices given.
    for count in (None, 1):
        with pytest.raises(ValueError, match="data_mesh: devices is empty"):
            data_mesh(count, devices=[])
    # NumPy integers were refused as "not an int" (process_rows accepted them).
    assert data_mesh(np.int64(1)).size == 1
    check_multihost_arguments("h:1", np.int64(2), np.int32(1))


@pytest.mark.parametrize(
    "mesh_size, error, message",
    [
        # Before: ZeroDivisionError "integer modulo by zero"; -2 split over 'data'.
        (0, ValueError, "fsdp_spec: mesh_size must be a positive int, got 0"),
        (-2, ValueError, "fsdp_spec: mesh_size must be a positive int, got -2"),
        (2.0, TypeError, "fsdp_spec: mesh_size must be an int .*got float 2.0"),
        (True, TypeError, "fsdp_spec: mesh_size must be an int .*got bool True"),
    ],
)
def test_fsdp_spec_refuses_a_mesh_size_that_is_not_a_positive_int(mesh_size, error, message):
    with pytest.raises(error, match=message):
        fsdp_spec((2**15,), mesh_size)
    assert fsdp_spec((2**15,), np.int64(2)) == jax.sharding.PartitionSpec("data")


@pytest.mark.parametrize("port", ["²", "٣٣", "１２３"])
def test_a_port_of_non_ascii_digits_is_refused_naming_the_coordinator(port):
    # Before: '²' raised int()'s "invalid literal", '٣٣' (Arabic-Indic 33) was accepted.
    with pytest.raises(MultihostArgumentError, match=r"^coordinator must be HOST:PORT"):
        check_multihost_arguments(f"h:{port}", 2, 0)


def test_data_mesh_refuses_one_device_alone_and_a_count_that_is_not_an_int():
    device = jax.devices()[0]
    # Before: "'Device' object is not iterable".
    with pytest.raises(TypeError, match=r"^data_mesh: devices must be a sequence .*one Device"):
        data_mesh(devices=device)
    # Before: ValueError, as for a count out of range.
    for count in ("2", 2.0, True):
        with pytest.raises(TypeError, match=r"^data_mesh: num_devices must be an int"):
            data_mesh(count)
    with pytest.raises(ValueError, match="num_devices must be a positive int, got 0"):
        data_mesh(0)


def test_to_host_returns_a_prng_key_array_as_its_key_data():
    # Before: JAX's "JAX array with PRNGKey dtype cannot be converted to a NumPy array".
    keys = jax.random.split(jax.random.key(3), 2)
    host = to_host({"keys": keys, "x": jnp.ones(2)})
    np.testing.assert_array_equal(host["keys"], np.asarray(jax.random.key_data(keys)))
    restored = jax.random.wrap_key_data(host["keys"])
    np.testing.assert_array_equal(
        jax.random.uniform(restored[1], (3,)), jax.random.uniform(keys[1], (3,))
    )


@pytest.mark.parametrize("fsdp", ["yes", "no", 1, None])
def test_fit_refuses_an_fsdp_that_is_not_a_bool(fsdp):
    # Before: any truthy value (even "no") turned FSDP on without a word.
    state = create_train_state(MODEL, make_optimizer(LR), jax.random.key(0), linear_batch(0))
    with pytest.raises(TypeError, match=r"^fit: fsdp must be a bool, got"):
        fit(state, [linear_batch(1)], epochs=1, quiet=True, fsdp=fsdp)


def test_initialize_multihost_refuses_a_preemption_service_that_is_not_a_bool():
    with pytest.raises(TypeError, match="preemption_service must be a bool"):
        initialize_multihost("h:1", 1, 0, preemption_service="no")
    assert jax.config.jax_enable_preemption_service  # left as it was


def test_one_process_has_no_differing_settings_and_the_digests_have_one_shape():
    assert differing_settings({"--batch-size": "8"}) == {}
    few, groups = settings_digests({"b": "1", "a": "2"})
    many, _ = settings_digests({f"--flag-{i:03}": str(i) for i in range(SETTINGS_SLOTS + 5)})
    assert few.shape == many.shape == (SETTINGS_SLOTS,) and few.dtype == np.uint32
    assert groups == [[], ["a"], ["b"]] and not few[3:].any()
    with pytest.raises(TypeError, match="settings must map str names to str values"):
        differing_settings({"--batch-size": 8})


def _gathered_as(monkeypatch, this: int, rows: list[dict[str, str]]) -> None:
    """Makes `differing_settings` see `rows[i]` as process i's settings, this being `this`."""
    monkeypatch.setattr(jax, "process_count", lambda: len(rows))
    monkeypatch.setattr(jax, "process_index", lambda: this)
    devices = [types.SimpleNamespace(process_index=index, id=index) for index in range(len(rows))]
    monkeypatch.setattr(jax, "devices", lambda *args: devices)  # one device per process
    gathered = np.stack([settings_digests(row)[0] for row in rows])
    monkeypatch.setattr(distributed.multihost_utils, "process_allgather", lambda x: gathered)


def test_differing_settings_names_each_differing_setting_with_the_processes_holding_another(
    monkeypatch,
):
    mine = {"--batch-size": "16", "--lr": "0.1", "--csv": "ab12"}
    rows = [dict(mine, **{"--batch-size": "8"}), mine, dict(mine, **{"--batch-size": "8"})]
    rows[2]["--csv"] = "cd34"
    _gathered_as(monkeypatch, 1, rows)
    assert differing_settings(mine) == {"--batch-size": (0, 2), "--csv": (2,)}
    _gathered_as(monkeypatch, 1, [mine, mine])
    assert differing_settings(mine) == {}
    # Other names (another command or version): no value is compared.
    _gathered_as(monkeypatch, 0, [mine, {**mine, "--new-flag": "1"}])
    assert differing_settings(mine) == {None: (1,)}
    # Past the slots, the settings share the last one and a difference names them all.
    many = {f"--flag-{i:03}": str(i) for i in range(SETTINGS_SLOTS + 5)}
    _gathered_as(monkeypatch, 0, [many, {**many, "--flag-259": "x"}])
    assert set(differing_settings(many)) == set(sorted(many)[SETTINGS_SLOTS - 2 :])


def test_differing_settings_names_the_device_counts_before_gathering(monkeypatch):
    # Before: process_allgather failed with "cannot reshape array of size 4 into shape
    # (2,1)" in processes holding 1 and 3 devices (the CLI's first check after joining).
    _gathered_as(monkeypatch, 0, [{"--lr": "1"}, {"--lr": "1"}])
    devices = [types.SimpleNamespace(process_index=i, id=i) for i in (0, 1, 1, 1)]
    monkeypatch.setattr(jax, "devices", lambda *args: devices)
    with pytest.raises(ValueError, match=r"same number of local devices: this process \(0 of 2\) "):
        differing_settings({"--lr": "1"})
