"""Data-pipeline benchmark: time and peak memory of each stage of `prepare_dataset` on a table.

The table is synthetic, shaped like the paper's data: `electricity` is 370
hourly series of 26,304 steps (9.7 M rows), `retail` 4,000 daily series of
500 steps (thousands of short series), `tiny` a few hundred rows for tests;
`--series` and `--rows` scale any of them. Each has text series ids, two
real known columns and a text known column (a holiday flag), an observed
column, a text static categorical, a few rows missing from the grid and a
few empty target cells.

Stages, in the order `prepare_dataset` runs them:

* `read`: `read_announced` (missing-value texts) and `infer_categorical`;
* `validate`: `validate_table` (parse, check, sort);
* `grid`: `empty_input_cells`, `to_regular_grid`, `check_density`,
  `check_missing_fraction`;
* `fit`: `Preprocessor.fit` (target and feature scalers, vocabularies);
* `transform`: `Preprocessor.transform` (the panel of model inputs);
* `windows`: `window_starts` of the three splits (train stride `--stride`);
* `batches`: `--batches` shuffled training batches of `--batch-size` (`WindowSet.batches`);
* `prepare_dataset`: the whole call, end to end (time only).

Time is the median over `--steps` runs of the pipeline; peak memory is
`tracemalloc`'s peak of each stage in one further run (NumPy and pandas
report their buffers to it), skipped with `--no-memory`.

Usage::

    python -m benchmarks.data_pipeline --size tiny [--json]
    python -m benchmarks.data_pipeline --size electricity --series 370 --rows 2630
    python -m benchmarks.data_pipeline --size retail --no-memory
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import tracemalloc
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from benchmarks import common
from tft_jax.allocator import relaunch_with_tuned_allocator
from tft_jax.data import prepare_dataset, split_times
from tft_jax.data.preprocessing import Preprocessor, missing_column
from tft_jax.data.tables import (
    TableSpec,
    check_density,
    check_missing_fraction,
    empty_input_cells,
    infer_categorical,
    read_announced,
    to_regular_grid,
    validate_table,
)
from tft_jax.data.windows import WindowSet, window_starts

STAGES = ("read", "validate", "grid", "fit", "transform", "windows", "batches")
TOTAL = "prepare_dataset"


@dataclasses.dataclass(frozen=True)
class Size:
    """A table shape and the windows cut from it."""

    name: str
    series: int
    rows: int
    freq: str
    history: int
    horizon: int


SIZES = {
    "tiny": Size("tiny", series=6, rows=200, freq="h", history=24, horizon=6),
    "electricity": Size("electricity", series=370, rows=26304, freq="h", history=168, horizon=24),
    "retail": Size("retail", series=4000, rows=500, freq="D", history=56, horizon=14),
}

REQUIRED_FIELDS = {
    "stage": str,
    "series": int,
    "rows": int,
    "table_rows": int,
    "median_s": float,
    "peak_bytes": (int, type(None)),
}

COLUMNS = (
    ("config", "config", ""),
    ("stage", "stage", ""),
    ("table rows", "table_rows", ""),
    ("median s", "median_s", ".3f"),
    ("peak MiB", "peak_mib", ".1f"),
)


def make_table(series: int, rows: int, freq: str, seed: int = 0) -> pd.DataFrame:
    """A long-format table of `series` series of `rows` steps each, shaped as the module says.

    About 0.1% of the rows are dropped (gridding inserts them back, flagged)
    and 0.1% of the targets are empty; the first row of each series is kept,
    so every series starts where its grid does.
    """
    rng = np.random.default_rng(seed)
    times = pd.date_range("2012-01-01", periods=rows, freq=freq)
    total = series * rows
    step = np.tile(np.arange(rows), series)
    level = np.repeat(rng.gamma(2.0, 50.0, series), rows)
    table = pd.DataFrame(
        {
            "id": np.repeat(np.array([f"MT_{i:05d}" for i in range(series)], dtype=object), rows),
            "time": np.tile(times.to_numpy(), series),
            "load": level * (1.2 + np.sin(2 * np.pi * step / 24)) + rng.normal(0, 1, total),
            "temperature": rng.normal(15.0, 5.0, total),
            "price": rng.gamma(3.0, 10.0, total),
            "holiday": np.where(rng.random(total) < 0.03, "holiday", "workday").astype(object),
            "humidity": rng.normal(60.0, 10.0, total),
            "region": np.repeat(
                np.array([f"region_{i % 7}" for i in range(series)], dtype=object), rows
            ),
        }
    )
    table.loc[rng.random(total) < 1e-3, "load"] = np.nan
    drop = (rng.random(total) < 1e-3) & (step > 0) & (step < rows - 1)
    return table[~drop].reset_index(drop=True)


def _spec(freq: str) -> dict[str, Any]:
    return {
        "id_col": "id",
        "time_col": "time",
        "target": "load",
        "freq": freq,
        "static_cols": ("region",),
        "known_cols": ("temperature", "price", "holiday"),
        "observed_cols": ("humidity",),
    }


def run_stages(
    table: pd.DataFrame,
    size: Size,
    stride: int,
    batches: int,
    batch_size: int,
    measure: Callable[[str, Callable[[], Any]], Any],
) -> None:
    """Runs the stages of `prepare_dataset` on `table` in order, each as `measure(name, fn)`."""
    spec = TableSpec(**_spec(size.freq))
    missing_col = missing_column(spec)

    def read() -> tuple[pd.DataFrame, TableSpec]:
        raw, _ = read_announced(table, spec)
        return raw, infer_categorical(raw, spec)

    raw, read_spec = measure("read", read)
    clean = measure(
        "validate",
        lambda: validate_table(raw, read_spec, size.history, size.horizon, drop_short=True),
    )

    def grid_stage() -> pd.DataFrame:
        empty_input_cells(clean, read_spec)
        grid = to_regular_grid(clean, read_spec, missing_col)
        check_density(clean, grid, read_spec)
        check_missing_fraction(grid, read_spec, missing_col, 0.5)
        return grid

    grid = measure("grid", grid_stage)
    times = pd.DatetimeIndex(grid["time"])
    end = times.max() + pd.tseries.frequencies.to_offset(size.freq)
    cut_validation, cut_test = split_times(times, end, 0.1, 0.1)
    preprocessor = measure(
        "fit", lambda: Preprocessor.fit(grid, read_spec, cut_validation, "standard")
    )
    panel = measure("transform", lambda: preprocessor.transform(grid).panel)
    periods = {
        "train": (times.min(), cut_validation, stride),
        "validation": (cut_validation, cut_test, 1),
        "test": (cut_test, end, 1),
    }
    starts = measure(
        "windows",
        lambda: {
            name: window_starts(panel, size.history, size.horizon, begin, stop, every)
            for name, (begin, stop, every) in periods.items()
        },
    )
    train = WindowSet(panel, starts["train"], size.history, size.horizon)

    def batch_stage() -> int:
        gathered = 0
        for count, batch in enumerate(train.batches(batch_size, seed=0), start=1):
            gathered += int(batch["target"].shape[0])
            if count == batches:
                break
        return gathered

    measure("batches", batch_stage)


def _timed_pass(run: Callable[[Callable[[str, Callable[[], Any]], Any]], None]) -> dict[str, float]:
    seconds: dict[str, float] = {}

    def measure(name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        result = fn()
        seconds[name] = time.perf_counter() - start
        return result

    run(measure)
    return seconds


def _memory_pass(run: Callable[[Callable[[str, Callable[[], Any]], Any]], None]) -> dict[str, int]:
    peaks: dict[str, int] = {}

    def measure(name: str, fn: Callable[[], Any]) -> Any:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        peaks[name] = tracemalloc.get_traced_memory()[1] - before
        return result

    tracemalloc.start()
    try:
        run(measure)
    finally:
        tracemalloc.stop()
    return peaks


def bench(
    size: Size,
    steps: int,
    warmup: int,
    memory: bool = True,
    stride: int = 1,
    batches: int = 20,
    batch_size: int = 256,
) -> list[dict[str, Any]]:
    """One record per stage of the pipeline on the table of `size`, then one for the whole call."""
    table = make_table(size.series, size.rows, size.freq)

    def run(measure: Callable[[str, Callable[[], Any]], Any]) -> None:
        run_stages(table, size, stride, batches, batch_size, measure)

    def whole() -> None:
        prepare_dataset(
            table, **_spec(size.freq), history=size.history, horizon=size.horizon,
            train_stride=stride,
        )  # fmt: skip

    runs: list[dict[str, float]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the filled rows and cells, announced every run
        for index in range(warmup + steps):
            seconds = _timed_pass(run)
            start = time.perf_counter()
            whole()
            seconds[TOTAL] = time.perf_counter() - start
            if index >= warmup:
                runs.append(seconds)
        peaks = _memory_pass(run) if memory else {}
    config = f"{size.name}:{size.series}x{size.rows}"
    return [
        common.make_record(
            "data_pipeline",
            config,
            stage=stage,
            series=size.series,
            rows=size.rows,
            table_rows=len(table),
            median_s=float(statistics.median(run[stage] for run in runs)),
            steps=len(runs),
            peak_bytes=peaks.get(stage),
            stride=stride,
            history=size.history,
            horizon=size.horizon,
            peak_rss_bytes=common.peak_rss_bytes(),
        )
        for stage in (*STAGES, TOTAL)
    ]


def table_view(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its peak in MiB for the table."""
    peak = record.get("peak_bytes")
    return {**record, "peak_mib": peak / 2**20 if peak is not None else None}


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.data_pipeline [--size ...] [--series N] [--rows N]`."""
    parser = common.base_parser(__doc__.splitlines()[0], steps=1)
    parser.set_defaults(warmup=0)
    parser.add_argument("--size", default="tiny", choices=list(SIZES))
    parser.add_argument("--series", type=common.positive_int, help="override the series count")
    parser.add_argument("--rows", type=common.positive_int, help="override the steps per series")
    parser.add_argument(
        "--stride", type=common.positive_int, default=1, help="train_stride of the windows"
    )
    parser.add_argument(
        "--batches", type=common.positive_int, default=20, help="training batches gathered"
    )
    parser.add_argument("--batch-size", type=common.positive_int, default=256)
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the tracemalloc pass (time only)"
    )
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        size = SIZES[args.size]
        size = dataclasses.replace(
            size, series=args.series or size.series, rows=args.rows or size.rows
        )
        if size.rows < size.history + size.horizon:
            raise ValueError(
                f"--rows must be at least history + horizon = {size.history + size.horizon} "
                f"for --size {args.size}, got {size.rows}"
            )
        common.setup(args)
    records = bench(
        size,
        args.steps,
        args.warmup,
        memory=not args.no_memory,
        stride=args.stride,
        batches=args.batches,
        batch_size=args.batch_size,
    )
    common.emit(records, COLUMNS, args.json, args.output, title="data_pipeline", view=table_view)
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()  # as every benchmark script: the same process setup
    main()
