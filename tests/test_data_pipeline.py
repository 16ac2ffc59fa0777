"""The data pipeline benchmark script (`benchmarks.data_pipeline`) at its smallest size:
one valid record per stage, and a table too short for a window refused by option."""

from __future__ import annotations

import json

import pytest

from benchmarks import common, data_pipeline


def test_data_pipeline_benchmark_writes_one_record_per_stage(capsys):
    records = data_pipeline.main(["--size", "tiny", "--json", "--batches", "2"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines == records
    assert [r["stage"] for r in records] == [*data_pipeline.STAGES, data_pipeline.TOTAL]
    tiny = data_pipeline.SIZES["tiny"]
    table = data_pipeline.make_table(tiny.series, tiny.rows, tiny.freq)
    for record in records:
        common.validate_record(record, data_pipeline.REQUIRED_FIELDS)
        assert record["benchmark"] == "data_pipeline" and record["config"] == "tiny:6x200"
        assert record["table_rows"] == len(table) and record["median_s"] > 0
    assert all(r["peak_bytes"] > 0 for r in records[:-1]) and records[-1]["peak_bytes"] is None


def test_data_pipeline_benchmark_refuses_rows_shorter_than_a_window(capsys):
    with pytest.raises(SystemExit):
        data_pipeline.main(["--size", "tiny", "--rows", "10"])
    assert "--rows" in capsys.readouterr().err
