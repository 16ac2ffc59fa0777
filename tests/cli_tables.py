"""A tiny long-format table and the CLI arguments that read it, shared by the CLI tests."""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd

from tft_jax import cli
from tft_jax.forecaster import DataConfig, Forecaster, ModelConfig, TrainingConfig

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


def stores_files(folder: pathlib.Path, id_col: str = "store") -> dict[str, pathlib.Path]:
    """`write_table`'s stores (ids in `id_col`), its history, and the future of `promo`.

    The history ends HORIZON days before the table; the future holds those days.
    """
    table = pd.read_csv(write_table(folder / "stores.csv")).rename(columns={"store": id_col})
    table.to_csv(folder / "stores.csv", index=False)
    days = pd.to_datetime(table["day"])
    cut = days.max() - pd.Timedelta(days=HORIZON)
    table[days <= cut].to_csv(folder / "history.csv", index=False)
    table[days > cut][[id_col, "day", "promo"]].to_csv(folder / "future.csv", index=False)
    return {"table": folder / "stores.csv", "history": folder / "history.csv",
            "future": folder / "future.csv", "folder": folder}  # fmt: skip


def saved_tiny_run(files: dict[str, pathlib.Path], id_col: str = "store") -> pathlib.Path:
    """A tiny FP32 run of `stores_files`' table saved by `Forecaster.save`: no `source` table."""
    data = DataConfig(
        id_col=id_col, time_col="day", target="sales", freq="D", static_cols=("size",),
        known_cols=("promo",), observed_cols=("temperature",), history=HISTORY, horizon=HORIZON,
        validation_fraction=0.15, test_fraction=0.15,
    )  # fmt: skip
    forecaster = Forecaster(
        data, ModelConfig(hidden_dim=8, num_heads=2), TrainingConfig(batch_size=8, max_steps=2)
    ).fit(pd.read_csv(files["table"]), quiet=True)
    return forecaster.save(files["folder"] / "run")


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
