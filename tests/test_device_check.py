"""`benchmarks.device_check`: stages time-boxed, their records and pytest summaries, `--only`."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from benchmarks import device_check


def test_pytest_summary_is_the_last_summary_line():
    log = "collected 3 items\n...\n=== 2 passed, 1 skipped in 1.50s ===\n"
    assert device_check.pytest_summary(log) == "2 passed, 1 skipped in 1.50s"
    assert device_check.pytest_summary("1 failed, 3 passed in 9.1s") == "1 failed, 3 passed in 9.1s"
    assert device_check.pytest_summary("Traceback ...\nKilled") is None


def test_a_stage_records_its_status_and_output_and_is_stopped_at_its_time_box(tmp_path):
    done = device_check.run_stage("ok", [sys.executable, "-c", "print('hello')"], 60, tmp_path)
    assert done["returncode"] == 0 and not done["timed_out"] and done["summary"] == "hello"
    assert (tmp_path / "ok.log").read_text() == "hello\n"
    slow = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"]
    stopped = device_check.run_stage("slow", slow, 1.5, tmp_path)
    assert stopped["timed_out"] and stopped["returncode"] is None
    assert stopped["elapsed_s"] < 10 and stopped["summary"] == "started"


def test_the_accelerator_gets_what_the_other_stages_leave_of_the_budget(tmp_path):
    planned = {
        name: (command, limit) for name, command, limit in device_check.stages(tmp_path, 600)
    }
    assert list(planned) == ["environment", "device_tests", "properties", "accelerator"]
    others = sum(device_check.STAGE_LIMITS_S.values())
    command, limit = planned["accelerator"]
    budget = float(command[command.index("--budget") + 1])
    assert budget == pytest.approx(600 - others - device_check.ACCELERATOR_MARGIN_S, abs=1)
    assert limit == pytest.approx(budget + device_check.ACCELERATOR_MARGIN_S, abs=1)
    assert "gpu or tpu" in planned["properties"][0]


def test_only_names_known_stages_and_runs_just_those(tmp_path, capsys):
    with pytest.raises(SystemExit):
        device_check.main(["--out", str(tmp_path / "new"), "--only", "enviroment"])
    assert "--only must be a comma-separated subset of" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # refused before anything is created
    records = device_check.main(["--out", str(tmp_path), "--only", "environment"])
    assert [record["stage"] for record in records] == ["environment"]
    assert records[0]["returncode"] == 0
    assert "devices" in (tmp_path / "environment.log").read_text()
    assert (tmp_path / "device_check.jsonl").read_text().count("\n") == 1


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (an orphan's may linger unreaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_stage_past_its_time_box_is_stopped_with_the_processes_it_started(tmp_path):
    # Only the stage's own process was killed: pytest-xdist's workers ran on.
    script = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
        "print(child.pid, flush=True); time.sleep(30)"
    )
    record = device_check.run_stage("slow", [sys.executable, "-c", script], 1.0, tmp_path)
    assert record["timed_out"]
    child = int((tmp_path / "slow.log").read_text().split()[0])
    try:
        deadline = time.monotonic() + 1.0
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child)
    finally:
        if _running(child):
            os.kill(child, signal.SIGKILL)
