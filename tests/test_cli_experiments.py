"""`tft-jax experiment` (`tft_jax.cli_experiments`): the settings it makes from its flags and the
JSON it writes."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from tft_jax import cli_experiments
from tft_jax.cli_experiments import _clipping_settings
from tft_jax.cli_parser import build_parser

from .cli_tables import TINY_MODEL, run, table_args, write_table


def _clipping_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["experiment", "clipping", *flags])


def test_clipping_eval_every_above_steps_is_announced_and_recorded_as_steps():
    with pytest.warns(UserWarning, match=r"--eval-every 50 is more than --steps 4"):
        settings = _clipping_settings(_clipping_args("--steps", "4", "--eval-every", "50"))
    assert settings.eval_every == 4


def test_clipping_eval_every_within_steps_is_kept_without_a_warning(recwarn):
    settings = _clipping_settings(_clipping_args("--steps", "4", "--eval-every", "2"))
    assert settings.eval_every == 2
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


def test_clipping_json_tells_nan_from_inf_and_stays_strict_json(capsys, tmp_path, monkeypatch):
    """A run whose loss overflowed and whose norm went NaN: null for both said neither."""

    def fake_experiment(model, train, validation, settings, *, on_run=None):
        diverged = {
            "clip": False, "seed": 0, "step_loss": [0.5, math.inf],
            "step_grad_norm": [1.0, math.nan], "final_val_loss": -math.inf, "diverged": True,
        }  # fmt: skip
        healthy = {
            "clip": True, "seed": 0, "step_loss": [0.5, 0.4],
            "step_grad_norm": [1.0, 0.5], "final_val_loss": 0.4, "diverged": False,
        }  # fmt: skip
        summary = {
            "runs": 1, "diverged": 0, "final_val_loss_median": None,
            "final_val_loss_min": None, "final_val_loss_max": None,
        }  # fmt: skip
        return {
            "settings": {"learning_rate": 0.2, "clip_norm": 0.05},
            "runs": [healthy, diverged],
            "summary": {"with_clipping": summary, "without_clipping": summary},
        }

    monkeypatch.setattr(cli_experiments, "clipping_experiment", fake_experiment)
    csv = write_table(tmp_path / "stores.csv")
    code, _, _ = run(
        capsys, "experiment", "clipping", *table_args(csv), *TINY_MODEL,
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0

    def refuse(constant):
        raise AssertionError(f"not strict JSON: {constant}")

    text = (tmp_path / "out" / "clipping.json").read_text()
    saved = json.loads(text, parse_constant=refuse)["runs"][1]
    assert saved["step_loss"] == [0.5, "inf"]
    assert saved["step_grad_norm"] == [1.0, "nan"]
    assert saved["final_val_loss"] == "-inf"
    summary = json.loads(text)["summary"]["with_clipping"]
    assert summary["final_val_loss_median"] is None  # no value, not a non-finite one
