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

Time is the median over `--steps` runs of the pipeline after `--warmup`
untimed ones; by default one run and no warm-up (a run of the full
electricity table takes over a minute), so `median_s` is then one cold run:
each record's `timed_runs`, `warmup_runs` and `timing` say which. Peak
memory is `tracemalloc`'s peak of each stage in one further run (NumPy and
pandas report their buffers to it), skipped with `--no-memory`. Each record
also carries `batch_size`, `batches_requested` and `batches_gathered` (fewer
when one pass over the training windows holds fewer batches).

`--rows` must leave the 10% validation and 10% test periods a full horizon
each and the training period a whole window (`minimum_rows`): 60 rows for
`tiny`, 240 for `electricity`, 140 for `retail`.

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
# The fractions of the time span `prepare_dataset` (and `run_stages`) keep for
# validation and test: its defaults.
VALIDATION_FRACTION = 0.1
TEST_FRACTION = 0.1


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


def split_lengths(size: Size, rows: int) -> dict[str, int]:
    """Steps of the train, validation and test periods of a series of `rows` steps.

    The cuts are `split_times`' on that grid, as `prepare_dataset` makes them
    (fractions of the span, snapped to the grid).
    """
    times = pd.date_range("2012-01-01", periods=rows, freq=size.freq)
    end = times[-1] + pd.tseries.frequencies.to_offset(size.freq)
    cut_validation, cut_test = split_times(times, end, VALIDATION_FRACTION, TEST_FRACTION)
    validation, test = (int(times.searchsorted(cut)) for cut in (cut_validation, cut_test))
    return {"train": validation, "validation": test - validation, "test": rows - test}


def rows_fit(size: Size, rows: int) -> bool:
    """Whether each period of a series of `rows` steps holds a complete window.

    A training window lies wholly in the training period (`history +
    horizon` steps); a validation or test window needs its `horizon` steps
    inside its period (its history may reach back before it).
    """
    if rows < size.history + size.horizon:
        return False
    lengths = split_lengths(size, rows)
    return (
        lengths["train"] >= size.history + size.horizon
        and lengths["validation"] >= size.horizon
        and lengths["test"] >= size.horizon
    )


def minimum_rows(size: Size) -> int:
    """The fewest steps per series whose three periods each hold a complete window.

    Every longer series fits too (the periods only grow). The synthetic
    table's few missing targets can still empty a period of a series this
    short: its windows with a missing target step are left out.
    """
    rows = size.history + size.horizon
    while not rows_fit(size, rows):
        rows += 1
    return rows


REQUIRED_FIELDS = {
    "stage": str,
    "series": int,
    "rows": int,
    "table_rows": int,
    "median_s": float,
    "timed_runs": int,
    "warmup_runs": int,
    "timing": str,
    "peak_bytes": (int, type(None)),
    "batch_size": int,
    "batches_requested": int,
    "batches_gathered": int,
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
) -> dict[str, int]:
    """Runs the stages of `prepare_dataset` on `table` in order, each as `measure(name, fn)`.

    Returns `{"batches_gathered": ..., "samples_gathered": ...}` of the `batches` stage.
    """
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
    cut_validation, cut_test = split_times(times, end, VALIDATION_FRACTION, TEST_FRACTION)
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

    def batch_stage() -> dict[str, int]:
        gathered = {"batches_gathered": 0, "samples_gathered": 0}
        for count, batch in enumerate(train.batches(batch_size, seed=0), start=1):
            gathered["batches_gathered"] = count
            gathered["samples_gathered"] += int(batch["target"].shape[0])
            if count == batches:
                break
        return gathered

    return measure("batches", batch_stage)


_Run = Callable[[Callable[[str, Callable[[], Any]], Any]], dict[str, int]]


def _timed_pass(run: _Run) -> tuple[dict[str, float], dict[str, int]]:
    seconds: dict[str, float] = {}

    def measure(name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        result = fn()
        seconds[name] = time.perf_counter() - start
        return result

    return seconds, run(measure)


def _memory_pass(run: _Run) -> dict[str, int]:
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

    def run(measure: Callable[[str, Callable[[], Any]], Any]) -> dict[str, int]:
        return run_stages(table, size, stride, batches, batch_size, measure)

    def whole() -> None:
        prepare_dataset(
            table, **_spec(size.freq), history=size.history, horizon=size.horizon,
            train_stride=stride,
        )  # fmt: skip

    runs: list[dict[str, float]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the filled rows and cells, announced every run
        for index in range(warmup + steps):
            seconds, gathered = _timed_pass(run)
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
            timed_runs=len(runs),
            warmup_runs=warmup,
            timing=timing(len(runs), warmup),
            peak_bytes=peaks.get(stage),
            stride=stride,
            batch_size=batch_size,
            batches_requested=batches,
            **gathered,
            history=size.history,
            horizon=size.horizon,
            peak_rss_bytes=common.peak_rss_bytes(),
        )
        for stage in (*STAGES, TOTAL)
    ]


def timing(runs: int, warmup: int) -> str:
    """What `median_s` is: `"median of 5 runs after 1 warm-up"`, `"one cold run"`, ..."""
    after = f" after {warmup} warm-up{'s' if warmup > 1 else ''}" if warmup else ""
    if runs == 1:
        return f"one run{after}" if warmup else "one cold run, no warm-up"
    return f"median of {runs} runs{after}"


def table_view(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its peak in MiB for the table."""
    peak = record.get("peak_bytes")
    return {**record, "peak_mib": peak / 2**20 if peak is not None else None}


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.data_pipeline [--size ...] [--series N] [--rows N]`."""
    parser = common.base_parser(
        __doc__.splitlines()[0],
        steps=1,
        steps_help="timed runs of the pipeline (median_s is their median)",
        warmup_help="untimed runs of the pipeline before the timed ones",
        compile_cache_help="no effect here: the pipeline runs no JAX program and no compile "
        "time is reported (accepted as by the other benchmark scripts)",
    )
    parser.set_defaults(warmup=0)
    parser.add_argument(
        "--size", default="tiny", choices=list(SIZES), help="the synthetic table's shape"
    )
    parser.add_argument(
        "--series", type=common.positive_int, help="override the series count of --size"
    )
    parser.add_argument(
        "--rows",
        type=common.positive_int,
        help="override the steps per series of --size (at least what the three periods' "
        "windows need: 60 for tiny, 240 for electricity, 140 for retail)",
    )
    parser.add_argument(
        "--stride", type=common.positive_int, default=1, help="train_stride of the windows"
    )
    parser.add_argument(
        "--batches", type=common.positive_int, default=20, help="training batches gathered"
    )
    parser.add_argument(
        "--batch-size", type=common.positive_int, default=256, help="windows per batch"
    )
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the tracemalloc pass (time only)"
    )
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        size = SIZES[args.size]
        size = dataclasses.replace(
            size, series=args.series or size.series, rows=args.rows or size.rows
        )
        if not rows_fit(size, size.rows):
            lengths = split_lengths(size, size.rows)
            raise ValueError(
                f"--rows must be at least {minimum_rows(size)} for --size {args.size} "
                f"(history {size.history}, horizon {size.horizon}): the training period "
                f"needs a whole window and the {VALIDATION_FRACTION:.0%} validation and "
                f"{TEST_FRACTION:.0%} test periods a horizon each; {size.rows} rows split "
                f"{lengths['train']}/{lengths['validation']}/{lengths['test']}"
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
    title = f"data_pipeline ({records[0]['timing']})"
    common.emit(records, COLUMNS, args.json, args.output, title=title, view=table_view)
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()  # as every benchmark script: the same process setup
    common.run_command(main)
