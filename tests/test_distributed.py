"""Data parallelism on 8 simulated CPU devices (in a subprocess) and its argument checks."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import jax
import pytest

from tft_jax.distributed import data_mesh, fsdp_spec, initialize_multihost, process_slice

SCRIPT = pathlib.Path(__file__).with_name("multidevice_checks.py")


@pytest.mark.multidevice
def test_sharded_training_matches_single_device_on_8_simulated_devices():
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=1800
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    passed = [line for line in result.stdout.splitlines() if line.startswith("passed ")]
    assert len(passed) == 5, result.stdout


def test_mesh_larger_than_the_devices_is_rejected():
    with pytest.raises(ValueError, match=rf"num_devices={jax.device_count() + 1} .* available"):
        data_mesh(jax.device_count() + 1)


def test_fsdp_splits_the_largest_divisible_axis_and_replicates_small_leaves():
    assert fsdp_spec((160, 640), 8) == jax.sharding.PartitionSpec(None, "data")
    assert fsdp_spec((644, 160), 8) == jax.sharding.PartitionSpec(None, "data")
    assert fsdp_spec((7, 9), 8) == jax.sharding.PartitionSpec()
    assert fsdp_spec((161, 163), 8, min_size=1) == jax.sharding.PartitionSpec()


@pytest.mark.parametrize(
    "coordinator, processes, index, message",
    [("localhost", 2, 0, "HOST:PORT"), ("h:1", 0, 0, "num_processes"), ("h:1", 2, 2, "process_id")],
)
def test_multihost_arguments_are_checked_before_jax_distributed(
    coordinator, processes, index, message
):
    with pytest.raises(ValueError, match=message):
        initialize_multihost(coordinator, processes, index)


def test_a_single_process_reads_every_window():
    assert process_slice(10) == slice(0, 10)
