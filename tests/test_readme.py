"""The README's Python examples run as written, in order, in one namespace."""

from __future__ import annotations

import pathlib
import re

import pandas as pd

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 4
    namespace: dict = {}
    for index, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {index}", "exec"), namespace)
    assert namespace["out"].quantiles.shape == (8, 5, 3)
    assert namespace["out8"].quantiles.shape == (8, 5, 3)
    assert set(namespace["metrics"]) >= {"loss", "grad_norm", "clipped_grad_norm"}
    forecast = namespace["forecast"]
    assert forecast.columns.tolist() == ["store", "day", "q0.1", "q0.5", "q0.9"]
    assert forecast.groupby("store")["day"].min().eq(pd.Timestamp("2024-04-30")).all()
    assert set(namespace["scores"]["models"]) == {"seasonal_naive", "best_baseline", "fp32"}
    assert namespace["cutoffs"]["cutoff"].nunique() == 3
    # Quantizing your own model: int8 output, hooked layers int8, the float head untouched.
    assert namespace["mlp_out8"].shape == (256, 1)
    int8_params = namespace["mlp_int8"]["params"]
    assert int8_params["Dense_0"]["kernel"].dtype == "int8"
    assert int8_params["Dense_2"]["kernel"].dtype == "float32"
