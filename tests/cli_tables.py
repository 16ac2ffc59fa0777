"""A tiny long-format table and the CLI arguments that read it, shared by the CLI tests."""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd

from tft_jax import cli
from tft_jax.forecaster import TrainingConfig

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HISTORY, HORIZON = 14, 7


def write_table(path: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """Three daily stores, 100 days each: weekly pattern, promotions, a static size."""
    rng = np.random.default_rng(seed)
    frames = []
    for code, store in enumerate(("alpha", "beta", "gamma")):
        days = pd.date_range("2024-01-01", periods=100, freq="D")
        promo = (rng.random(100) < 0.2).astype(float)
        weekend = (days.day_of_week >= 5).astype(float)
        sales = 10 + 3 * code + 2 * weekend + 4 * promo + rng.normal(scale=0.5, size=100)
        frames.append(
            pd.DataFrame(
                {
                    "store": store,
                    "day": days.strftime("%Y-%m-%d"),
                    "sales": sales,
                    "size": 1.0 + code,
                    "promo": promo,
                    "temperature": rng.normal(size=100),
                }
            )
        )
    pd.concat(frames).to_csv(path, index=False)
    return path


def table_args(csv: pathlib.Path) -> list[str]:
    return [
        "--csv", str(csv),
        "--id-col", "store",
        "--time-col", "day",
        "--target", "sales",
        "--static-cols", "size",
        "--known-cols", "promo",
        "--observed-cols", "temperature",
        "--freq", "D",
        "--history", str(HISTORY),
        "--horizon", str(HORIZON),
        "--validation-fraction", "0.15",
        "--test-fraction", "0.15",
    ]  # fmt: skip


TINY_MODEL = ["--hidden-dim", "8", "--heads", "2", "--compile-cache", "none", "--quiet"]

# Every end-to-end run on this table trains with exactly these settings (the
# `Forecaster` tests through `TINY_TRAINING`): the learning-rate schedule and
# the batch shapes are compiled into the steps, so identical settings let one
# test's compiled train, evaluation and prediction steps serve the others from
# the persistent compilation cache.
TINY_RUN = [
    "--batch-size", "8", "--max-steps", "4", "--eval-every", "2", "--val-windows", "16",
    "--eval-batch-size", "32",
]  # fmt: skip
TINY_QAT = ["--qat", "--qat-steps", "3", "--qat-calibration-batches", "2"]
TINY_TRAINING = TrainingConfig(
    batch_size=8, max_steps=4, eval_every=2, validation_windows=16, eval_batch_size=32
)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err
