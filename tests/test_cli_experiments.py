"""The experiment settings `tft-jax experiment` makes from its flags (`tft_jax.cli_experiments`)."""

from __future__ import annotations

import argparse

import pytest

from tft_jax.cli_experiments import _clipping_settings
from tft_jax.cli_parser import build_parser


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
