"""A leading `~` in a path the user gives is the home folder, for every component alike.

Kept as typed, some components expanded it (pandas, orbax) and others read it
as a folder named `~` in the current one: `tft-jax train --out=~/x` (the shell
leaves a `~` after `=`) split its run between the two, and
`Forecaster.fit(checkpoint_dir="~/ck")` checked a resume against the records
of an empty `./~/ck`. Each boundary expands it once: the CLI's path flags,
`Forecaster.fit`'s `checkpoint_dir`, a table's path, `replaced_atomically`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib

import pandas as pd
import pytest

from tft_jax import cli
from tft_jax.atomic_files import replaced_atomically, temporary_sibling
from tft_jax.cli_parser import build_parser, compile_cache_value, path_argument
from tft_jax.data.tables import read_table
from tft_jax.forecaster import DataConfig, Forecaster, ModelConfig
from tft_jax.forecaster import forecaster as forecaster_module
from tft_jax.forecaster.forecaster import BATCH_STREAM_FILE
from tft_jax.paths import expanded

from .cli_tables import (
    HISTORY,
    HORIZON,
    TINY_TRAINING,
    saved_tiny_run,
    stores_files,
    write_table,
)

# Every path flag of every command, each given as `--flag=~/NAME` (dest, NAME).
PATH_FLAGS = {
    "train": {"--csv": "t.csv", "--out": "run", "--compile-cache": "cache"},
    "predict": {
        "--run": "run", "--csv": "h.csv", "--future-csv": "f.csv", "--out": "p.csv",
        "--compile-cache": "cache",
    },
    "evaluate": {"--run": "run", "--csv": "t.csv", "--output": "m.json", "--compile-cache": "c"},
    "forecast": {"--run": "run", "--csv": "t.csv", "--output": "f.csv", "--compile-cache": "c"},
    "plot": {"--run": "run", "--csv": "t.csv", "--future-csv": "f.csv", "--compile-cache": "c"},
    "demo": {"--out": "demo", "--compile-cache": "cache"},
    "experiment clipping": {"--csv": "t.csv", "--out": "clip", "--compile-cache": "cache"},
}  # fmt: skip


def _typed_path_flags(parser: argparse.ArgumentParser, command: str = "") -> set[tuple[str, str]]:
    """(command, flag) of every flag whose parser type expands `~`, in every subcommand."""
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _typed_path_flags(sub, f"{command} {name}".strip())
        elif getattr(action.type, "__wrapped__", action.type) in (
            path_argument,
            compile_cache_value,
        ):
            found.add((command, action.option_strings[0]))
    return found


def home_and_cwd(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[pathlib.Path, pathlib.Path]:
    """`(home, cwd)`: two folders under `tmp_path`, made the home folder and the current one."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    return home, cwd


def test_every_path_flag_expands_a_leading_tilde(tmp_path, monkeypatch):
    # `--out=~/x`: the shell leaves the `~`; pandas wrote ~/x/forecasts.csv.PID.tmp in the
    # home folder, and the rename looked for it in ./~/x.
    monkeypatch.setenv("HOME", str(tmp_path))
    for command, flags in PATH_FLAGS.items():
        argv = [*command.split(), *(f"{flag}=~/{name}" for flag, name in flags.items())]
        args = build_parser().parse_args(argv)
        for flag, name in flags.items():
            value = getattr(args, flag.lstrip("-").replace("-", "_"))
            assert pathlib.Path(value) == tmp_path / name, (command, flag, value)
    # A path flag added later is typed to expand, and listed above.
    covered = {(command, flag) for command, flags in PATH_FLAGS.items() for flag in flags}
    assert _typed_path_flags(build_parser()) == covered


def test_compile_cache_none_and_an_unknown_users_home():
    assert compile_cache_value("none") == "none"
    # pathlib raised a bare RuntimeError (a traceback); the shell leaves it as typed.
    args = build_parser().parse_args(["demo", "--out=~no_such_user_tft_jax/x"])
    assert args.out == pathlib.Path.cwd() / "~no_such_user_tft_jax/x"


def test_replaced_atomically_writes_and_renames_in_the_home_folder(tmp_path, monkeypatch):
    # pandas expanded the temporary file's `~`, the rename did not: FileNotFoundError.
    home, cwd = home_and_cwd(tmp_path, monkeypatch)
    assert temporary_sibling("~/p.csv") == home / f"p.csv.{os.getpid()}.tmp"
    with replaced_atomically("~/p.csv") as temporary:
        pd.DataFrame({"a": [1]}).to_csv(temporary, index=False)
    assert (home / "p.csv").read_text() == "a\n1\n"
    assert sorted(os.listdir(home)) == ["p.csv"] and not os.listdir(cwd)


def test_read_table_checks_and_names_the_home_folders_file(tmp_path, monkeypatch):
    # "~/t.csv: no such file" was said of a file pandas reads.
    monkeypatch.setenv("HOME", str(tmp_path))
    write_table(tmp_path / "t.csv")
    assert len(read_table("~/t.csv", id_col="store")) == 300
    with pytest.raises(ValueError, match=f"^{tmp_path / 'none.csv'}: no such file"):
        read_table(pathlib.Path("~/none.csv"))


class _Stopped(Exception):
    """Raised in place of FP32 training: the tests need only what `fit` did before it."""


def test_fit_keeps_its_checkpoint_records_where_orbax_keeps_the_checkpoints(tmp_path, monkeypatch):
    # The batch-stream record went to ./~/ck, orbax's checkpoints to $HOME/ck: a resume with
    # another learning rate found no checkpoints beside the record, and was accepted.
    home, cwd = home_and_cwd(tmp_path, monkeypatch)
    given = []

    def stop(model, dataset, training, val_batches, checkpoints, *rest):
        given.append(checkpoints)
        raise _Stopped

    monkeypatch.setattr(forecaster_module, "train_fp32", stop)
    data = DataConfig(
        id_col="store", time_col="day", target="sales", freq="D", static_cols=("size",),
        known_cols=("promo",), observed_cols=("temperature",), history=HISTORY,
        horizon=HORIZON, validation_fraction=0.15, test_fraction=0.15,
    )  # fmt: skip
    model = ModelConfig(hidden_dim=8, num_heads=2)
    table = pd.read_csv(write_table(tmp_path / "stores.csv"))
    with pytest.raises(_Stopped):
        Forecaster(data, model, TINY_TRAINING).fit(table, checkpoint_dir="~/ck", quiet=True)
    assert given == [home / "ck"]
    assert (home / "ck" / BATCH_STREAM_FILE).is_file()
    assert not os.listdir(cwd)
    # As if the run had saved a step there (orbax expands `~` itself).
    monkeypatch.setattr(forecaster_module, "_holds_checkpoints", lambda at: at == home / "ck")
    other = dataclasses.replace(TINY_TRAINING, learning_rate=5 * TINY_TRAINING.learning_rate)
    with pytest.raises(ValueError, match="trained with other settings"):
        Forecaster(data, model, other).fit(table, checkpoint_dir="~/ck", resume=True, quiet=True)


def test_predict_with_every_path_under_a_tilde(capsys, tmp_path, monkeypatch):
    # `--out=~/p.csv` failed renaming ~/p.csv.PID.tmp, left behind in the home folder.
    # The one test here that trains: the tiny saved run of the CLI tests (cached steps).
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    saved_tiny_run(stores_files(home))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    argv = ["predict", "--run=~/run", "--csv=~/history.csv", "--future-csv=~/future.csv",
            "--out=~/p.csv", "--compile-cache=none", "--quiet"]  # fmt: skip
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 0, err
    assert len(pd.read_csv(home / "p.csv")) == 3 * HORIZON
    assert not [name for name in os.listdir(home) if name.endswith(".tmp")]
    assert not os.listdir(cwd)


def test_a_tilde_left_as_typed_is_anchored_so_a_second_expansion_keeps_it(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `pathlib` drops the './' of './~/x': the path left as typed read as the home
    # folder's when expanded again (replaced_atomically wrote in one, renamed into the other).
    home, cwd = home_and_cwd(tmp_path, monkeypatch)
    for typed in ("./~/x", "~no_such_user_tft_jax/x"):
        once = expanded(typed)
        assert once == cwd / typed.removeprefix("./") and expanded(once) == once
    assert expanded("~/x") == home / "x" == expanded(expanded("~/x"))
    with replaced_atomically("./~/p.csv") as temporary:
        (cwd / "~").mkdir()
        temporary.write_text("a\n1\n")
    assert (cwd / "~" / "p.csv").read_text() == "a\n1\n" and not list(home.iterdir())
