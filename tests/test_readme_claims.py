"""The README's prose claims (flags, defaults, shapes, counts, file names) hold for the code.

`tests/test_readme.py` runs the README's Python examples; these tests read
the README's text (before its changelog) and check what it states against
the code it describes, without training anything.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import pathlib
import re

import jax
import numpy as np
from hypothesis import settings

from properties import faults
from tft_jax import TemporalFusionTransformer, TFTConfig, cli, plots
from tft_jax.baselines import candidate_periods
from tft_jax.cli_parser import build_parser
from tft_jax.experiments import ClippingSettings
from tft_jax.forecaster import DEMO, DataConfig, QATTrainingConfig, TrainingConfig
from tft_jax.forecaster.run_folder import CONFIG_FILE, HISTORY_FILE, model_path
from tft_jax.train import fit

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def readme_text() -> str:
    """The README without its changelog (which records past behaviour), one space per blank."""
    text = README.read_text().split("## Changelog")[0]
    return re.sub(r"\s+", " ", text)


def parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of `parser` and of its subcommands, recursively."""
    flags = set()
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= parser_flags(sub)
    return flags


# Flags the README gives to other programs: pytest, XLA, `python -m benchmarks.*`.
OTHER_PROGRAMS = {
    "--hypothesis-profile",
    "--xla",
    "--tables",
    "--variants",
    "--config",
    "--devices",
    "--budget",
}


def test_every_flag_the_readme_names_is_an_option_of_tft_jax():
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*", readme_text()))
    unknown = named - OTHER_PROGRAMS - parser_flags(build_parser())
    assert not unknown, f"README names flags tft-jax does not have: {sorted(unknown)}"


def test_stated_training_defaults_are_the_configs_and_fits():
    text = readme_text()
    assert TrainingConfig().time_budget == 180.0
    assert "`TrainingConfig.time_budget=180`" in text
    assert QATTrainingConfig().time_budget == 60.0
    assert "`QATTrainingConfig.time_budget=60`" in text
    defaults = {name: p.default for name, p in inspect.signature(fit).parameters.items()}
    assert defaults["checkpoint_every_seconds"] == 120.0
    assert "`checkpoint_every_seconds` (default 120)" in text
    assert defaults["log_seconds"] == 10.0
    assert "every `log_seconds` (10)" in text
    assert DataConfig.__dataclass_fields__["max_missing_fraction"].default == 0.5
    assert "`max_missing_fraction` (default 0.5)" in text
    assert DataConfig.__dataclass_fields__["window_normalization"].default is True
    assert "`window_normalization` (on by default;" in text
    assert TFTConfig().dropout_rate == 0.1
    assert "(`dropout_rate > 0`, the default 0.1)" in text
    assert plots.MAX_FAN_SERIES == 6


def test_the_demo_settings_are_those_the_readme_states():
    text = readme_text()
    assert "`make demo` (history 72 h, horizon 24 h, hidden 32, 1200 FP32 steps, then 300" in text
    assert (DEMO.data.history, DEMO.data.horizon, DEMO.model.hidden_dim) == (72, 24, 32)
    assert DEMO.training.max_steps == 1200 and DEMO.qat is not None and DEMO.qat.steps == 300
    # "the demo turns it off" (window normalization) and the QAT budget "the demo now turns off".
    assert DEMO.data.window_normalization is False
    assert DEMO.qat.time_budget is None


def test_baseline_periods_are_those_that_fit_in_the_history():
    # The README: hourly 1, 24 and 168 steps, 168 only when the history holds it.
    assert candidate_periods("h", 168) == (1, 24, 168)
    assert candidate_periods("h", 72) == (1, 24)
    assert "periods that fit in the history (hourly: 1, 24 and 168 steps;" in readme_text()


def test_model_example_shapes_in_the_readme_comments_are_the_models():
    text = README.read_text()
    stated = {
        name: tuple(int(n) for n in dims.split(","))
        for name, dims in re.findall(r"out\.(\w+)\.shape\s+# \(([\d, ]+)\)", text)
    }
    assert set(stated) == {"quantiles", "attention", "history_weights"}
    cfg = TFTConfig(
        num_static_features=5, num_known_features=10, num_observed_features=15,
        hidden_dim=32, num_heads=4, sequence_length=10, prediction_horizon=5,
    )  # fmt: skip
    model = TemporalFusionTransformer(cfg)
    inputs = (
        np.zeros((8, 5), np.float32),
        np.zeros((8, 10, 15), np.float32),
        np.zeros((8, 5, 10), np.float32),
    )
    init = functools.partial(model.init, {"params": jax.random.key(0)})
    variables = jax.eval_shape(init, *inputs)
    out = jax.eval_shape(functools.partial(model.apply, deterministic=True), variables, *inputs)
    for name, shape in stated.items():
        assert getattr(out, name).shape == shape, name


def test_fault_catalogue_size_and_hypothesis_profiles_are_as_stated():
    text = readme_text()
    stated = re.search(r"`python -m properties\.faults` applies (\d+) deliberate", text)
    assert stated is not None and int(stated.group(1)) == len(faults.CATALOGUE)
    assert f"all {len(faults.CATALOGUE)} are caught" in text
    assert "`pytest --hypothesis-profile=dev` (5 examples) or `thorough` (200)" in text
    assert settings.get_profile("dev").max_examples == 5
    assert settings.get_profile("thorough").max_examples == 200


def test_clipping_experiment_settings_are_as_stated():
    text = readme_text()
    assert "constant lr 0.2, 5 seeds per arm, 150 steps, `clip_by_global_norm(0.05)`" in text
    clipping = ClippingSettings()
    assert (clipping.learning_rate, len(clipping.seeds), clipping.steps, clipping.clip_norm) == (
        0.2,
        5,
        150,
        0.05,
    )
    assert build_parser().parse_args(["experiment", "clipping"]).out == pathlib.Path(
        "runs/clipping"
    )
    assert "`clipping.png` in `--out` (default `runs/clipping`)" in text


def test_run_folder_files_the_readme_lists_are_those_the_cli_writes_and_clears(tmp_path):
    text = readme_text()
    for name in (CONFIG_FILE, HISTORY_FILE, "metrics.json", "forecasts.csv", "checkpoints/"):
        assert f"`{name}`" in text, name
    for name in ("fp32", "qat", "int8"):
        path = model_path(tmp_path, name).relative_to(tmp_path)
        assert path.parent.name == "models" and path.name == f"{name}.msgpack"
        assert f"{name}.msgpack`" in text
    # The plots the README lists are those `--overwrite` knows as the run's own.
    for pattern in cli.RUN_FOLDERS["plots"]:
        if not pattern.endswith(".png"):  # plot's folders and partial files
            continue
        shown = re.sub(r"^(forecasts|future)_\*", r"\1_<model>", pattern)
        assert f"`{shown}`" in text, pattern
    assert "`plots/<split>/`" in text and "`plots/<split>_<CSV name>/`" in text
    # evaluate's and forecast's default outputs.
    run = tmp_path / "run"
    args = argparse.Namespace(output=None, split="test", csv=None, run=run)
    assert cli.metrics_output(args, {}) == run / "metrics.json"
    args.split = "validation"
    assert cli.metrics_output(args, {}) == run / "metrics_validation.json"
    other = tmp_path / "other.csv"
    other.write_text("x\n")
    args.csv = other
    assert cli.metrics_output(args, {"source": {"csv": None}}) == (
        run / "metrics_validation_other.json"
    )
    assert "`metrics_<split>.json`" in text and "`metrics_<split>_<CSV name>.json`" in text
    assert "`forecasts_<model>_<split>.csv`" in text
