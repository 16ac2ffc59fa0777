"""A run folder's model files checked at load and written safely at save.

A QAT or int8 file whose observer range or weight scale is NaN or infinite is
refused naming the leaf; an observer that saw no batch keeps its fresh infinite
range. A file whose bytes differ from the SHA-256 config.json records is
refused, as is a history.json whose bytes differ from its recorded SHA-256 (a
load overlapping a save, which the message says); a `models` list or `qat`
section edited by hand is refused by name. A save cut short leaves the earlier
run loadable, and a Ctrl-C or SIGTERM during its renames waits for them. One tiny run with all three
forms is fitted once; each test edits copies.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pandas as pd
import pytest
from flax import serialization

import tft_jax
from tft_jax.config import TFTConfig
from tft_jax.forecaster import (
    DataConfig,
    Forecaster,
    ModelConfig,
    QATTrainingConfig,
    RunFolderError,
    TrainingConfig,
    run_folder,
)
from tft_jax.forecaster.run_folder import RunFolderWriteError, check_form

from .cli_tables import HISTORY, HORIZON, write_table

DATA = DataConfig(
    id_col="store", time_col="day", target="sales", freq="D", static_cols=("size",),
    known_cols=("promo",), observed_cols=("temperature",), history=HISTORY, horizon=HORIZON,
    validation_fraction=0.15, test_fraction=0.15,
)  # fmt: skip


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """The folder of a tiny run with all three forms, and its table."""
    folder = tmp_path_factory.mktemp("quantized")
    table = pd.read_csv(write_table(folder / "stores.csv"))
    forecaster = Forecaster(
        DATA,
        ModelConfig(hidden_dim=8, num_heads=2),
        TrainingConfig(batch_size=8, max_steps=1, validation_windows=8, time_budget=None),
        QATTrainingConfig(steps=1, calibration_batches=1, time_budget=None),
    ).fit(table, quiet=True)
    return forecaster.save(folder / "run"), table


def _with_leaf(folder, tmp_path, form, collection, leaf_name, value):
    """A copy of `folder` whose first `leaf_name` leaf of `collection` in `form` is `value`."""
    copy = tmp_path / f"{form}_{collection}_{leaf_name}"
    shutil.copytree(folder, copy)
    path = copy / "models" / f"{form}.msgpack"
    variables = serialization.msgpack_restore(path.read_bytes())
    edited = []

    def edit(key, leaf):
        if not edited and getattr(key[-1], "key", None) == leaf_name:
            edited.append(jax.tree_util.keystr(key))
            return np.full_like(leaf, value)
        return leaf

    variables[collection] = jax.tree_util.tree_map_with_path(edit, variables[collection])
    assert edited, f"{form} has no {leaf_name} in {collection}"
    path.write_bytes(serialization.msgpack_serialize(variables))
    return copy, edited[0]


@pytest.mark.parametrize(
    "form, collection, leaf_name, value",
    [
        ("qat", "quant_stats", "max", np.nan),
        ("qat", "quant_stats", "min", -np.inf),
        ("int8", "int8", "weight_scale", np.nan),
        ("int8", "quant_stats", "max", np.inf),
    ],
)
def test_a_non_finite_observer_range_or_weight_scale_is_refused_at_load(
    quantized, tmp_path, form, collection, leaf_name, value
):
    folder, table = quantized
    # The untouched run forecasts finite values with every form.
    loaded = Forecaster.load(folder)
    dataset = loaded.prepare(table)
    finite = loaded.predictions(dataset, dataset.test, [form])[form].quantiles
    assert np.isfinite(np.asarray(finite)).all()
    # Each of these damaged files loaded and made every forecast of the form NaN.
    copy, where = _with_leaf(folder, tmp_path, form, collection, leaf_name, value)
    message = rf"{form}\.msgpack: {collection}{re.escape(where)} holds \d+ NaN or infinite"
    with pytest.raises(RunFolderError, match=message):
        Forecaster.load(copy)


def test_an_observer_that_saw_no_batch_keeps_its_fresh_infinite_range():
    # `qat.calibrate` leaves an observer that saw no batch at min=+inf, max=-inf: not damage.
    params = {"dense": {"kernel": np.ones((2, 2), np.float32)}}

    def stats(low, high, batches):
        observer = {"min": np.float32(low), "max": np.float32(high)}
        return {"dense": {"dot_general": {**observer, "num_batches": np.int32(batches), "bits": 8}}}

    path = pathlib.Path("run/models/qat.msgpack")
    fresh = {"params": params, "quant_stats": stats(np.inf, -np.inf, 0)}
    check_form(fresh, "qat", TFTConfig(), 8, path)
    check_form({"params": params, "quant_stats": stats(-1.0, 2.0, 3)}, "qat", TFTConfig(), 8, path)
    for low, high, batches in ((np.inf, -np.inf, 3), (np.nan, np.nan, 0), (-1.0, np.nan, 3)):
        damaged = {"params": params, "quant_stats": stats(low, high, batches)}
        with pytest.raises(RunFolderError, match=r"quant_stats\['dense'\]\['dot_general'\]"):
            check_form(damaged, "qat", TFTConfig(), 8, path)


def _folder_bytes(folder: pathlib.Path) -> dict[str, bytes]:
    """Every file under `folder`, by relative path: what a save cut short must leave as it was."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _forecasts(folder: pathlib.Path, table: pd.DataFrame) -> dict[str, np.ndarray]:
    """The test-split forecasts of every form of the run in `folder`."""
    loaded = Forecaster.load(folder)
    dataset = loaded.prepare(table)
    predictions = loaded.predictions(dataset, dataset.test, list(loaded.models))
    return {name: np.asarray(predictions[name].quantiles) for name in loaded.models}


def _another_model(folder: pathlib.Path) -> Forecaster:
    """The run in `folder` with its FP32 weights moved: another model, of the same forms."""
    other = Forecaster.load(folder)
    variables = other._fitted.variables
    variables["fp32"] = jax.tree.map(lambda leaf: leaf + 0.25, variables["fp32"])
    return other


def test_a_save_cut_short_leaves_the_earlier_run_loadable_with_its_forecasts(
    quantized, tmp_path, monkeypatch
):
    # config.json was deleted before anything was written: a write that failed (a full
    # disk, a read-only models/) left the earlier run unloadable, even for the same model.
    folder, table = quantized
    earlier = tmp_path / "earlier"
    shutil.copytree(folder, earlier)
    before, forecasts = _folder_bytes(earlier), _forecasts(earlier, table)
    writes = []
    write_bytes = pathlib.Path.write_bytes

    def second_write_fails(path, data):
        writes.append(path)
        if len(writes) == 2:
            raise OSError("No space left on device")
        return write_bytes(path, data)

    monkeypatch.setattr(pathlib.Path, "write_bytes", second_write_fails)
    for forecaster in (Forecaster.load(earlier), _another_model(earlier)):
        writes.clear()
        with pytest.raises(
            RunFolderWriteError,
            match=rf"save: could not write {re.escape(str(earlier / 'models' / 'qat.msgpack'))} "
            rf"\(No space left on device\); the earlier run in {re.escape(str(earlier))} is "
            "left intact",
        ) as caught:
            forecaster.save(earlier)
        assert isinstance(caught.value, OSError)  # what the CLI's output errors catch
        assert caught.value.filename == str(earlier / "models" / "qat.msgpack")
        assert _folder_bytes(earlier) == before  # nothing replaced, no temporary file left
    monkeypatch.undo()
    after = _forecasts(earlier, table)
    for name, values in forecasts.items():
        np.testing.assert_array_equal(after[name], values)


def test_a_replace_that_fails_after_the_config_json_leaves_a_run_that_is_refused(
    quantized, tmp_path, monkeypatch
):
    # The new config.json replaces the earlier one first: model files not replaced
    # after it are refused by its digests, never loaded under the new settings.
    folder, _ = quantized
    earlier = tmp_path / "earlier"
    shutil.copytree(folder, earlier)
    replaces = []
    replace = pathlib.Path.replace

    def second_replace_fails(path, target):
        replaces.append(pathlib.Path(target))
        if len(replaces) == 2:
            raise OSError(5, "Input/output error", str(path), None, str(target))
        return replace(path, target)

    monkeypatch.setattr(pathlib.Path, "replace", second_replace_fails)
    with pytest.raises(RunFolderWriteError, match=r"the run in .* is incomplete") as caught:
        _another_model(earlier).save(earlier)
    monkeypatch.undo()
    assert replaces[0] == earlier / "config.json"
    assert caught.value.filename == str(replaces[1])
    with pytest.raises(RunFolderError, match=r"fp32.msgpack is damaged or was replaced"):
        Forecaster.load(earlier)


def test_a_ctrl_c_between_the_renames_waits_for_them_and_leaves_the_new_run_whole(
    quantized, tmp_path, monkeypatch
):
    # A SIGINT after the config.json's rename, before the model files': the remaining
    # temporary files were deleted, and the folder held the new config.json over the
    # earlier model files (refused at load: both runs were lost).
    folder, table = quantized
    earlier = tmp_path / "earlier"
    shutil.copytree(folder, earlier)
    replaces = []
    replace = pathlib.Path.replace

    def interrupted_after_the_first(path, target):
        result = replace(path, target)
        replaces.append(pathlib.Path(target))
        if len(replaces) == 1:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C, delivered by the system
        return result

    other = _another_model(earlier)
    monkeypatch.setattr(pathlib.Path, "replace", interrupted_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        other.save(earlier)
    monkeypatch.undo()
    assert replaces[0] == earlier / "config.json"
    saved = tmp_path / "saved"
    other.save(saved)  # the same model, saved without an interrupt
    files = _folder_bytes(saved)
    assert {str(path.relative_to(earlier)) for path in replaces} == set(files)  # all renamed
    assert _folder_bytes(earlier) == files  # and no temporary file left
    forecasts = _forecasts(earlier, table)
    assert not np.array_equal(forecasts["fp32"], _forecasts(folder, table)["fp32"])


# Writes a run's three files into the folder argv[1], sending itself a SIGTERM (what job
# schedulers send) right after the first rename, the config.json's.
_TERMINATED_SAVE = textwrap.dedent(
    """
    import os, pathlib, signal, sys
    from tft_jax.forecaster import run_folder
    root = pathlib.Path(sys.argv[1])
    replace = pathlib.Path.replace
    def terminated_after_the_config(path, target):
        result = replace(path, target)
        if pathlib.Path(target).name == "config.json":
            os.kill(os.getpid(), signal.SIGTERM)
        return result
    pathlib.Path.replace = terminated_after_the_config
    files = {root / "models" / "fp32.msgpack": b"new model", root / "history.json": b"new history",
             root / "config.json": b"new config"}
    run_folder.write_run_files(root, files)
    print("returned", flush=True)
    """
)


def test_a_sigterm_between_the_renames_waits_for_them_and_leaves_the_new_run_whole(tmp_path):
    # The process ended at once: config.json of the new run over the model of the old one
    # (refused as damaged), the complete new files left as `*.<pid>.tmp`.
    root = tmp_path / "run"
    (root / "models").mkdir(parents=True)
    for name in ("models/fp32.msgpack", "history.json", "config.json"):
        (root / name).write_bytes(b"old")
    ended = subprocess.run(
        [sys.executable, "-c", _TERMINATED_SAVE, str(root)],
        capture_output=True,
        text=True,
        cwd=pathlib.Path(__file__).resolve().parent.parent,
        timeout=120,
    )
    assert ended.returncode == -signal.SIGTERM, ended.stderr  # delivered once renamed
    assert "returned" not in ended.stdout
    assert _folder_bytes(root) == {
        "config.json": b"new config",
        "history.json": b"new history",
        "models/fp32.msgpack": b"new model",
    }


def test_a_history_json_that_differs_from_its_recorded_digest_is_refused(quantized, tmp_path):
    # A load overlapping a save loaded the weights and config.json of one run with the
    # history.json of another, without a word (history.json had no digest).
    folder, _ = quantized
    config = json.loads((folder / "config.json").read_text())
    recorded = config["history_sha256"]
    assert recorded == hashlib.sha256((folder / "history.json").read_bytes()).hexdigest()
    assert config["format_version"] == run_folder.FORMAT_VERSION == 4  # an optional key
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    history = json.loads((other / "history.json").read_text())
    history["fp32"]["step"] = [step + 1 for step in history["fp32"]["step"]]
    (other / "history.json").write_text(json.dumps(history))
    (other / "history.json.4242.tmp").write_text("{}")  # what a save cut short leaves
    actual = hashlib.sha256((other / "history.json").read_bytes()).hexdigest()
    with pytest.raises(
        RunFolderError,
        match=rf"{re.escape(str(other / 'history.json'))} is damaged or was replaced after the "
        rf"run was saved: its SHA-256 is {actual}, config.json's history_sha256 is {recorded}; "
        r"the folder may be being saved by another process, or a save into it was interrupted "
        r"\(it holds history.json.4242.tmp, left by a save cut short\): retry the load; if "
        "this persists, save the forecaster or train the run again",
    ):
        Forecaster.load(other)
    # Saved before the digest was recorded: loads unchecked, as it did.
    _edit_config(other, lambda config: config.pop("history_sha256"))
    assert Forecaster.load(other).history == history


def _with_one_ulp_moved(path: pathlib.Path) -> None:
    """Rewrites the model file `path` with one parameter moved by one ULP (a flipped bit)."""
    variables = serialization.msgpack_restore(path.read_bytes())
    assert serialization.msgpack_serialize(variables) == path.read_bytes()  # bytes reproduce
    kernel = np.array(variables["params"]["quantile_head"]["kernel"])
    kernel[0, 0] = np.nextafter(kernel[0, 0], np.float32(np.inf))
    variables["params"]["quantile_head"]["kernel"] = kernel
    path.write_bytes(serialization.msgpack_serialize(variables))


def _edit_config(folder: pathlib.Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def test_a_model_file_whose_bytes_differ_from_the_recorded_digest_is_refused(quantized, tmp_path):
    # A flipped bit in a weight loaded without a word and moved every forecast.
    folder, _ = quantized
    recorded = json.loads((folder / "config.json").read_text())["models_sha256"]
    assert sorted(recorded) == ["fp32", "int8", "qat"]
    for name in recorded:
        data = (folder / "models" / f"{name}.msgpack").read_bytes()
        assert recorded[name] == hashlib.sha256(data).hexdigest()
    Forecaster.load(folder)  # untouched: loads
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    path = damaged / "models" / "fp32.msgpack"
    _with_one_ulp_moved(path)
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(
        RunFolderError,
        match=rf"{re.escape(str(path))} is damaged or was replaced after the run was saved: its "
        rf"SHA-256 is {actual}, config.json's models_sha256.fp32 is {recorded['fp32']}",
    ):
        Forecaster.load(damaged)
    # A run saved before the digests were recorded (format version 1) loads as it did;
    # from version 2 on, deleting them would turn the check off: refused.
    legacy = tmp_path / "legacy"
    shutil.copytree(folder, legacy)
    _edit_config(legacy, lambda config: config.pop("models_sha256"))
    with pytest.raises(RunFolderError, match=r"models_sha256 is missing from a folder of format"):
        Forecaster.load(legacy)
    _edit_config(legacy, lambda config: config.update(format_version=1))
    assert Forecaster.load(legacy).models == ("fp32", "qat", "int8")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["models_sha256"].pop("int8"),
         r"models_sha256 records no digest of 'int8', which models lists"),
        (lambda c: c["models_sha256"].update(qat="abc"),
         r"models_sha256.qat must be a SHA-256 digest \(64 hex digits\), got 'abc'"),
        (lambda c: c.update(models_sha256=["x"]),
         r"models_sha256 must be an object of SHA-256 digests by model name"),
        # The dropped duplicate was silent; qat null (or missing) loaded with 8 bits.
        (lambda c: c.update(models=["fp32", "fp32", "qat", "int8"]),
         r"models \['fp32', 'fp32', 'qat', 'int8'\] lists \['fp32'\] more than once"),
        (lambda c: c.update(qat=None),
         r"qat is null, but models lists the quantized forms \['qat', 'int8'\]"),
        (lambda c: c.pop("qat"),
         r"qat is missing, but models lists the quantized forms \['qat', 'int8'\]"),
    ],
)  # fmt: skip
def test_a_models_list_or_record_or_qat_section_edited_by_hand_is_refused(
    quantized, tmp_path, edit, message
):
    folder, _ = quantized
    edited = tmp_path / "edited"
    shutil.copytree(folder, edited)
    _edit_config(edited, edit)
    with pytest.raises(RunFolderError, match=rf"config.json is damaged: .*{message}"):
        Forecaster.load(edited)


def test_the_fp32_form_of_a_qat_run_loads_without_its_qat_section(quantized, tmp_path):
    # What config.json holds for an FP32 run: refused only with a quantized form listed.
    folder, _ = quantized
    edited = tmp_path / "fp32_only"
    shutil.copytree(folder, edited)
    _edit_config(edited, lambda c: c.update(models=["fp32"], qat=None))
    loaded = Forecaster.load(edited)
    assert loaded.models == ("fp32",) and loaded.config.qat is None


def test_a_folder_of_a_later_format_version_is_refused_naming_both_versions(quantized, tmp_path):
    # The message named the writer's version only; every revision then said 0.1.0.
    folder, _ = quantized
    later = tmp_path / "later"
    shutil.copytree(folder, later)
    newer = run_folder.FORMAT_VERSION + 1
    _edit_config(later, lambda config: config.update(format_version=newer))
    _edit_config(later, lambda config: config["saved_by"].update(tft_jax="9.0"))
    with pytest.raises(
        RunFolderError,
        match=rf"config.json is format 'tft-jax-forecaster' version {newer}, saved by tft-jax "
        rf"9.0; this tft-jax \({re.escape(tft_jax.__version__)}\) reads 'tft-jax-forecaster' "
        rf"versions 1 to {newer - 1}. Upgrade tft-jax to load it, or train again",
    ):
        Forecaster.load(later)


def test_a_folder_saved_again_by_a_later_tft_jax_names_that_one_not_the_trainer(
    quantized, tmp_path, monkeypatch
):
    # config.json's `versions` is where the model was trained and is kept on a re-save, so
    # the refusal of a newer folder named the trainer's tft-jax, not the one to upgrade to.
    folder, _ = quantized
    trained = json.loads((folder / "config.json").read_text())["versions"]["tft_jax"]
    monkeypatch.setattr(tft_jax, "__version__", "9.5")
    Forecaster.load(folder).save(tmp_path / "again")
    monkeypatch.undo()
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    assert config["versions"]["tft_jax"] == trained
    assert config["saved_by"] == {"tft_jax": "9.5"}
    newer = run_folder.FORMAT_VERSION + 1
    _edit_config(tmp_path / "again", lambda c: c.update(format_version=newer))
    with pytest.raises(RunFolderError, match=rf"version {newer}, saved by tft-jax 9\.5; this"):
        Forecaster.load(tmp_path / "again")


@pytest.mark.parametrize(
    ("extra", "place"),
    [
        ({"loss": np.float32("nan")}, r"extra\['loss'\] is nan"),  # NumPy float32: no float
        ({"scores": [1.0, np.float16("inf")]}, r"extra\['scores'\]\[1\] is inf"),
        ({"pair": (0.5, {"x": -np.inf})}, r"extra\['pair'\]\[1\]\['x'\] is -inf"),
    ],
)
def test_save_extra_refuses_a_non_finite_float_of_any_float_type_naming_its_place(extra, place):
    # JSON writes NaN and infinities as null, which reads back as None.
    with pytest.raises(ValueError, match=place):
        run_folder.check_finite_extra(extra)
    run_folder.check_finite_extra({"loss": np.float32(0.25), "scores": [1.0, np.float16(2)]})


@pytest.mark.parametrize("digest", ["a" * 63, "a" * 65, "A" * 64, "g" * 64])
def test_a_recorded_digest_must_be_64_lowercase_hex_digits(digest):
    # A SHA-256 hex digest is 64 digits: a longer one can never match a model file's.
    config = {run_folder.DIGESTS_KEY: {"fp32": "0123456789abcdef" * 4, "qat": digest}}
    assert run_folder.recorded_digests(config, ["fp32"]) == config[run_folder.DIGESTS_KEY]
    with pytest.raises(ValueError, match=r"models_sha256.qat must be a SHA-256 digest"):
        run_folder.recorded_digests(config, ["fp32", "qat"])


# R06 (only the run folder searched for *.tmp, not models/), R07 (a model file's digest
# mismatch searches models/ as if it were the run folder): the refusal names every file a
# save cut short left, in the run folder and in models/, by their paths in the run.
def test_a_model_digest_mismatch_names_the_files_a_save_cut_short_left(quantized, tmp_path):
    folder, _ = quantized
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    _with_one_ulp_moved(damaged / "models" / "fp32.msgpack")
    (damaged / "models" / "qat.msgpack.4242.tmp").write_bytes(b"left")
    (damaged / "config.json.4242.tmp").write_text("{}")
    with pytest.raises(
        RunFolderError,
        match=r"a save into it was interrupted \(it holds config.json.4242.tmp, "
        r"models/qat.msgpack.4242.tmp, left by a save cut short\): retry the load",
    ):
        Forecaster.load(damaged)
