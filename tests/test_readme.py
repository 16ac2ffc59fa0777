"""The README's Python examples run as written, in order, in one namespace."""

from __future__ import annotations

import pathlib
import re

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
