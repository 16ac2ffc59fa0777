"""The processes of a multi-process `Forecaster.fit` are checked to agree before training.

Before: a different table in one process trained silently on a mix of both; a
different batch size ended in a gloo abort, a different learning rate in a JAX
AssertionError naming no setting; processes with different device counts
failed inside `process_allgather` ("cannot reshape array of size 4 into shape
(2,1)"). Most cases fake a second process (`jax.process_count`, the gathered
digests, the device list); one launches two real processes.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import types

import jax
import numpy as np
import pandas as pd
import pytest

from tft_jax import distributed
from tft_jax.distributed import (
    LocalDevicesDisagreeError,
    ProcessesDisagreeError,
    check_local_devices_agree,
    check_settings_agree,
    file_digest,
    local_device_counts,
    settings_digests,
)
from tft_jax.forecaster import (
    DataConfig,
    Forecaster,
    ModelConfig,
    TrainingConfig,
    process_agreement,
)
from tft_jax.forecaster import forecaster as forecaster_module
from tft_jax.forecaster.config import QATTrainingConfig
from tft_jax.forecaster.process_agreement import fit_settings, table_digest

DATA = DataConfig(id_col="store", time_col="day", target="sales", freq="D", history=8, horizon=2)


def _table(seed: int = 0) -> pd.DataFrame:
    days = pd.date_range("2024-01-01", periods=60, freq="D")
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "store": np.repeat(["a", "b"], len(days)),
            "day": np.tile(days, 2),
            "sales": rng.normal(10.0, 1.0, 2 * len(days)),
        }
    )


def _devices(counts: list[int]) -> list[types.SimpleNamespace]:
    return [
        types.SimpleNamespace(process_index=index, id=10 * index + k)
        for index, count in enumerate(counts)
        for k in range(count)
    ]


def _as_process(monkeypatch, this: int, counts: list[int]) -> None:
    """Makes this process `this` of `len(counts)`, process i holding `counts[i]` devices."""
    monkeypatch.setattr(jax, "process_count", lambda: len(counts))
    monkeypatch.setattr(jax, "process_index", lambda: this)
    monkeypatch.setattr(jax, "devices", lambda *args: _devices(counts))


def _gathered(monkeypatch, rows: list[dict[str, tuple[str, str]]]) -> None:
    """Makes the settings gather return the digests of `rows[i]` as process i's."""
    gathered = np.stack(
        [settings_digests({k: compared for k, (compared, _) in r.items()})[0] for r in rows]
    )
    monkeypatch.setattr(distributed.multihost_utils, "process_allgather", lambda x: gathered)


# --- local device counts ----------------------------------------------------------------


def test_devices_per_process_are_read_from_the_global_device_list(monkeypatch):
    assert local_device_counts() == {0: jax.device_count()}
    check_local_devices_agree()  # one process: nothing to compare
    _as_process(monkeypatch, 1, [1, 3])
    assert local_device_counts() == {0: 1, 1: 3}
    with pytest.raises(LocalDevicesDisagreeError) as caught:
        check_local_devices_agree()
    assert "this process (1 of 2) has 3, process 0 has 1" in str(caught.value)
    assert caught.value.counts == {0: 1, 1: 3}
    _as_process(monkeypatch, 0, [2, 2, 2])
    check_local_devices_agree()
    _as_process(monkeypatch, 0, [2, 0])  # a process without devices of the backend
    with pytest.raises(ValueError, match=r"this process \(0 of 2\) has 2, process 1 has 0"):
        check_local_devices_agree()


def test_fit_names_the_device_counts_of_processes_that_hold_different_numbers(monkeypatch):
    # Before: "cannot reshape array of size 4 into shape (2,1)" from place_state.
    _as_process(monkeypatch, 1, [1, 3])
    forecaster = Forecaster(DATA, training=TrainingConfig(batch_size=8))
    with pytest.raises(ValueError, match=r"fit: every process .* same number of local devices: "):
        forecaster.fit(_table())
    with pytest.raises(ValueError, match=r"this process \(1 of 2\) has 3, process 0 has 1"):
        forecaster.fit(_table())


# --- settings -----------------------------------------------------------------------------


def test_fit_settings_name_every_config_field_the_table_and_the_arguments():
    settings = fit_settings(Forecaster(DATA).config, _table(), "runs/x", False)
    for name in (
        "training.batch_size",
        "training.learning_rate",
        "data.history",
        "model.hidden_dim",
        "qat.steps",
        "table",
        "resume",
        "checkpoint_dir",
        "tft_jax version",
        "jax version",
    ):
        assert name in settings, name
    with_qat = Forecaster(DATA, qat=QATTrainingConfig()).config
    # The same names with QAT or without, so that a difference is named field by field.
    assert set(fit_settings(with_qat, _table(), None, False)) == set(settings)
    assert settings["qat.steps"][1] == "no QAT (qat=None)"
    # A checkpoint folder may be mounted at other paths: only whether one is given counts.
    moved = fit_settings(Forecaster(DATA).config, _table(), "/mnt/runs/x", False)
    assert moved["checkpoint_dir"][0] == settings["checkpoint_dir"][0]
    none = fit_settings(Forecaster(DATA).config, _table(), None, False)
    assert none["checkpoint_dir"][0] != settings["checkpoint_dir"][0]
    numpy_int = Forecaster(DATA, training=TrainingConfig(batch_size=np.int64(64))).config
    plain = Forecaster(DATA, training=TrainingConfig(batch_size=64)).config
    assert (
        fit_settings(numpy_int, _table(), None, False)["training.batch_size"][0]
        == fit_settings(plain, _table(), None, False)["training.batch_size"][0]
    )


def test_a_table_is_compared_by_its_content(tmp_path):
    table = _table()
    # The index is not read by fit: only the columns count.
    assert table_digest(table)[0] == table_digest(table.set_axis(range(120, 240)))[0]
    assert table_digest(table)[0] != table_digest(table.iloc[::-1])[0]
    changed = table.copy()
    changed.loc[5, "sales"] += 1.0
    assert table_digest(changed)[0] != table_digest(table)[0]
    assert table_digest(table.astype({"sales": "float32"}))[0] != table_digest(table)[0]
    assert table_digest(table.rename(columns={"sales": "units"}))[0] != table_digest(table)[0]
    assert "120 rows x 3 columns" in table_digest(table)[1]
    listed = table.assign(tags=[["x"]] * len(table))  # unhashable cells: digested as text
    assert table_digest(listed)[0] != table_digest(table)[0]
    # pandas hashes object cells as text, and names were compared as text: 1 was '1'.
    texts = table.assign(code=["1"] * len(table))
    numbers = table.assign(code=pd.Series([1] * len(table), dtype=object))
    assert table_digest(texts)[0] != table_digest(numbers)[0]
    assert table_digest(texts)[0] == table_digest(texts.copy())[0]
    named = pd.DataFrame({1: [1.0]}), pd.DataFrame({"1": [1.0]})
    assert table_digest(named[0])[0] != table_digest(named[1])[0]
    listed_numbers = listed.assign(code=numbers["code"])
    assert table_digest(listed.assign(code=texts["code"]))[0] != table_digest(listed_numbers)[0]
    one, two, other = tmp_path / "one.csv", tmp_path / "two.csv", tmp_path / "other.csv"
    table.to_csv(one, index=False)
    table.to_csv(two, index=False)
    changed.to_csv(other, index=False)
    assert table_digest(one)[0] == table_digest(str(two))[0] == file_digest(one)
    assert table_digest(other)[0] != table_digest(one)[0]
    assert str(one) in table_digest(one)[1]
    assert file_digest(tmp_path / "missing.csv").startswith("unreadable")


def test_check_settings_agree_names_each_setting_its_value_and_the_processes(monkeypatch):
    mine = {"training.batch_size": ("8", "8"), "table": ("ab", "t.csv (sha256 ab)")}
    _as_process(monkeypatch, 1, [1, 1, 1])
    other = {**mine, "training.batch_size": ("16", "16")}
    _gathered(monkeypatch, [other, mine, {**other, "table": ("cd", "u.csv")}])
    with pytest.raises(ProcessesDisagreeError) as caught:
        check_settings_agree(mine, "fit", "use the same")
    assert str(caught.value) == (
        "fit: table differs between the processes (this process, 1 of 3: t.csv (sha256 ab); "
        "process 2: differs); training.batch_size differs between the processes (this "
        "process, 1 of 3: 8; processes 0, 2: differ): use the same"
    )
    assert caught.value.differing == {"training.batch_size": (0, 2), "table": (2,)}
    _gathered(monkeypatch, [mine, mine, {**mine, "new": ("1", "1")}])
    with pytest.raises(ProcessesDisagreeError, match=r"different sets of settings .* process 2"):
        check_settings_agree(mine, "fit", "use the same")
    _gathered(monkeypatch, [mine, mine, mine])
    check_settings_agree(mine, "fit", "use the same")


def test_fit_refuses_processes_given_other_settings_or_tables_before_training(monkeypatch):
    # Before: an other table trained silently on a mix of both; another batch size ended in
    # a gloo abort and another learning rate in JAX's "not the same on each process".
    training = TrainingConfig(batch_size=8, learning_rate=1e-3)
    forecaster = Forecaster(DATA, ModelConfig(hidden_dim=8, num_heads=2), training)
    theirs = Forecaster(
        DATA, ModelConfig(hidden_dim=8, num_heads=2), TrainingConfig(batch_size=16)
    ).config
    table = _table()
    _as_process(monkeypatch, 0, [1, 1])
    _gathered(
        monkeypatch,
        [
            fit_settings(forecaster.config, table, None, False),
            fit_settings(theirs, _table(seed=1), None, True),
        ],
    )
    with pytest.raises(ValueError) as caught:
        forecaster.fit(table)
    message = str(caught.value)
    assert message.startswith("fit: ")
    for part in (
        "training.batch_size differs between the processes (this process, 0 of 2: 8; "
        "process 1: differs)",
        "table differs between the processes (this process, 0 of 2: a DataFrame of 120 rows",
        "resume differs between the processes (this process, 0 of 2: False; process 1",
        "every process must call Forecaster.fit with the same settings",
    ):
        assert part in message, message
    _gathered(
        monkeypatch,
        [fit_settings(forecaster.config, table, None, False)] * 2,
    )
    forecaster.config = Forecaster(
        DATA, training=TrainingConfig(batch_size=8, learning_rate=1e-1)
    ).config
    with pytest.raises(ValueError, match=r"training.learning_rate differs .*: 0.1; process 1"):
        forecaster.fit(table)


def test_a_single_process_fit_gathers_and_hashes_nothing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("called in a single process")

    monkeypatch.setattr(distributed.multihost_utils, "process_allgather", refuse)
    monkeypatch.setattr(forecaster_module, "fit_settings", refuse)
    monkeypatch.setattr(process_agreement, "table_digest", refuse)
    # The table's own error, found after the (skipped) check.
    with pytest.raises(ValueError, match="sales"):
        Forecaster(DATA).fit(_table().drop(columns="sales"))


# --- two real processes -------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np, pandas as pd
    from tft_jax.distributed import initialize_multihost
    coordinator, index = sys.argv[1], int(sys.argv[2])
    initialize_multihost(coordinator, 2, index)
    from tft_jax.forecaster import DataConfig, Forecaster, ModelConfig, TrainingConfig
    days = pd.date_range("2024-01-01", periods=60, freq="D")
    table = pd.DataFrame({"store": np.repeat(["a", "b"], 60), "day": np.tile(days, 2),
                          "sales": np.arange(120.0) % 17 + 100 * index})
    data = DataConfig(id_col="store", time_col="day", target="sales", freq="D",
                      history=8, horizon=2)
    training = TrainingConfig(batch_size=8 * (index + 1), learning_rate=10.0 ** -(3 - 2 * index),
                              max_steps=2, eval_every=2, validation_windows=16,
                              eval_batch_size=16, time_budget=None)
    model = ModelConfig(hidden_dim=8, num_heads=2)
    try:
        Forecaster(data, model, training).fit(table, quiet=True)
    except ValueError as error:
        print("REFUSED:", error, flush=True)
        sys.exit(0)
    print("TRAINED", flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def test_two_processes_given_other_settings_and_tables_are_each_refused_naming_them(tmp_path):
    env = dict(os.environ)
    flags = [flag for flag in env.get("XLA_FLAGS", "").split() if "device_count" not in flag]
    env.update(XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")]
    )
    coordinator = f"localhost:{_free_port()}"
    logs = [(tmp_path / f"process{index}.log").open("w") for index in range(2)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, coordinator, str(index)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        for index, log in enumerate(logs)
    ]
    try:
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=240)
    finally:
        for process, log in zip(processes, logs, strict=True):
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    outputs = [(tmp_path / f"process{index}.log").read_text() for index in range(2)]
    assert [p.returncode for p in processes] == [0, 0], "\n".join(outputs)
    for index, output in enumerate(outputs):
        refused = [line for line in output.splitlines() if line.startswith("REFUSED: fit: ")]
        assert len(refused) == 1, output
        other = 1 - index
        for name, value in (
            ("training.batch_size", 8 * (index + 1)),
            ("training.learning_rate", 10.0 ** -(3 - 2 * index)),
        ):
            part = (
                f"{name} differs between the processes (this process, {index} of 2: "
                f"{value!r}; process {other}: differs)"
            )
            assert part in refused[0], output
        assert f"table differs between the processes (this process, {index} of 2: " in refused[0]
        assert "training.epochs" not in refused[0]
