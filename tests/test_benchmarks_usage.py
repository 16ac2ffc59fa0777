"""What the benchmark commands say and record: help, usage checks, record fields.

Findings of a usage audit of the benchmark scripts; nothing here compiles a
model (stand-ins replace the steps where a record is built).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import types

import jax
import jax.numpy as jnp
import pytest

import benchmarks
import tft_jax.train as train
from benchmarks import (
    accelerator,
    attention,
    common,
    cpu,
    data_pipeline,
    device_check,
    dropout_keys,
    fake_quant,
    inference,
    optimizer,
    peer,
    profile_step,
    quality,
    selection_variants,
    train_step,
)
from tft_jax import inline_threefry

# Keeps the test session's compilation cache on (`common.setup` switches it off otherwise).
KEEP_CACHE = ["--compile-cache"]


def _never(*args, **kwargs):
    raise AssertionError("the benchmark started measuring despite a bad flag")


def _usage_error(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_the_qat_step_ratio_target_is_the_projects():
    # It was 1.3 while issue 16 (BENCHMARKS.md, Targets) asks QAT/FP32 <= 1.15.
    assert fake_quant.TARGET_RATIO == 1.15
    assert f"target <= {fake_quant.TARGET_RATIO}" in fake_quant.__doc__


def test_dropout_keys_records_the_threshold_each_step_was_traced_with(monkeypatch):
    # Both records said the library's threshold, though `builtin` was traced with 2**32.
    traced = []

    class Compiled:
        def as_text(self):
            return ""

        def __call__(self, state, batch, key):
            return state, {"skipped": jnp.zeros((), jnp.int32), "loss": jnp.ones(())}

    def lower(state, batch, key):
        traced.append(inline_threefry.INLINE_MIN_SIZE)
        text = f"module {{}} // {inline_threefry.INLINE_MIN_SIZE}"
        return types.SimpleNamespace(compile=Compiled, as_text=lambda debug_info=False: text)

    monkeypatch.setattr(train, "lower_train_step", lower)
    monkeypatch.setattr(train, "copy_state", lambda state: state)
    monkeypatch.setattr(train_step, "make_batch", lambda model, size: jnp.zeros(2))
    monkeypatch.setattr(train_step, "build_state", lambda mode, model, batch: (None, None))
    monkeypatch.setattr(jax, "clear_caches", lambda: None)  # keep this session's traces
    records = dropout_keys.bench(train_step.get_config("tiny"), steps=2, warmup=0)
    assert traced == [dropout_keys.BUILTIN_MIN_SIZE, inline_threefry.INLINE_MIN_SIZE]
    assert [r["variant"] for r in records] == ["builtin", "inline"]
    assert [r["inline_min_size"] for r in records] == traced


def test_data_pipeline_rows_too_short_for_a_period_are_a_usage_error(capsys, monkeypatch):
    # `--rows 45` passed the old check (history + horizon = 30) and failed after the
    # table was built: "the train/test period [...] holds no complete window".
    monkeypatch.setattr(data_pipeline, "bench", _never)
    minimum = {"tiny": 60, "electricity": 240, "retail": 140}
    assert {name: data_pipeline.minimum_rows(s) for name, s in data_pipeline.SIZES.items()} == (
        minimum
    )
    tiny = data_pipeline.SIZES["tiny"]
    assert data_pipeline.rows_fit(tiny, 60) and not data_pipeline.rows_fit(tiny, 59)
    for argv in (
        ["--rows", "30", "--no-memory"],
        ["--rows", "45"],
        ["--series", "1", "--rows", "40"],
        ["--rows", "1"],
    ):
        error = _usage_error(data_pipeline.main, [*argv, *KEEP_CACHE], capsys)
        assert "--rows must be at least 60 for --size tiny" in error
    argv = ["--size", "retail", "--rows", "139", *KEEP_CACHE]
    error = _usage_error(data_pipeline.main, argv, capsys)
    assert "--rows must be at least 140" in error


def test_data_pipeline_records_say_how_many_runs_and_batches_they_hold(capsys):
    # One cold run was labelled a median; the records did not say how many batches
    # were asked for, gathered, or of what size.
    argv = ["--series", "1", "--rows", "60", "--no-memory", "--batches", "50", "--batch-size", "4"]
    records = data_pipeline.main([*argv, "--json", *KEEP_CACHE])
    capsys.readouterr()
    for record in records:
        common.validate_record(record, data_pipeline.REQUIRED_FIELDS)
        assert record["timed_runs"] == record["steps"] == 1 and record["warmup_runs"] == 0
        assert record["timing"] == "one cold run, no warm-up"
        assert record["batch_size"] == 4 and record["batches_requested"] == 50
        # one pass over the training windows of one short series: fewer batches
        assert 1 <= record["batches_gathered"] < 50
        assert record["samples_gathered"] <= 4 * record["batches_gathered"]
    assert data_pipeline.timing(20, 3) == "median of 20 runs after 3 warm-ups"


def test_profile_refuses_a_trace_dir_it_cannot_write_before_running(tmp_path, capsys, monkeypatch):
    # A file as --trace-dir failed with a JaxRuntimeError after compiling and running.
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # main adds a flag
    monkeypatch.setattr(profile_step, "profile", _never)
    afile = tmp_path / "trace.txt"
    afile.write_text("x")
    error = _usage_error(profile_step.main, ["--trace-dir", str(afile), *KEEP_CACHE], capsys)
    assert "--trace-dir must name a folder" in error
    under = str(afile / "sub")
    error = _usage_error(profile_step.main, ["--trace-dir", under, *KEEP_CACHE], capsys)
    assert "--trace-dir: cannot write in" in error
    assert afile.read_text() == "x"


def test_profile_reports_the_share_without_op_name():
    totals = {("fwd", "a"): 6.0, ("?", "copy"): 3.0, ("?", "fusion"): 1.0}
    assert profile_step.unattributed_share(totals) == pytest.approx(0.4)
    assert profile_step.unattributed_share({}) == 0.0
    attributed = profile_step.attribute(
        {"copy.3": 2.0, "add.1": 1.0}, {"add.1": "jit(f)/jvp(M)/a/b"}, 1
    )
    assert attributed == {("?", "copy"): 2.0, ("fwd", "a"): 1.0}


def test_quality_records_carry_the_fields_of_every_benchmark_record(capsys, monkeypatch):
    # Its records lacked schema_version, benchmark, load_average_1m and env.
    def measure(table, variant, overrides, cutoffs, qat=True):
        return {"table": table, "variant": variant, "fit_seconds": 1.5}

    monkeypatch.setattr(quality, "measure", measure)
    assert quality.main(["--tables", "pedestrian", "tourism"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["config"] for r in records] == ["pedestrian:default", "tourism:default"]
    for record in records:
        common.validate_record(record, {"table": str, "variant": str, "fit_seconds": float})
        assert record["benchmark"] == "quality"


def _peer_record(**fields):
    record = {
        "config": "seed",
        "batch_size": 4,
        "selection": "compact",
        "ours_params": 100,
        "theirs_params": 80,
        "param_ratio": 1.25,
        "params_within_tolerance": False,
        "ours_median_s": 0.001,
        "theirs_median_s": 0.01,
        "ours_samples_per_s": 4000.0,
        "theirs_samples_per_s": 400.0,
        "speedup": 10.0,
        "target_speedup": 20.0,
        "contended": True,
        "load_max_1m": 9.5,
        "meets_target": None,
    }
    return common.make_record("peer", record.pop("config"), **{**record, **fields})


def test_peer_table_shows_contention_target_and_size_checks():
    # The table hid `contended`, `meets_target` and `params_within_tolerance`: a
    # contended or unequal-size ratio read like any other.
    contended = _peer_record()
    quiet = _peer_record(contended=False, meets_target=False, params_within_tolerance=True)
    table = common.format_table([peer.table_view(r) for r in (contended, quiet)], peer.COLUMNS)
    header, _, first, second = table.splitlines()
    assert "contended" in header and "meets" in header and "params within 15%" in header
    assert first.split()[-3:] == ["-", "YES", "NO"]
    assert second.split()[-3:] == ["NO", "no", "yes"]
    warnings = peer.warnings_for([contended, quiet])
    assert len(warnings) == 2
    assert "load 9.5 exceeded" in warnings[0] and "(contended)" in warnings[0]
    assert "1.25x the peer's parameters" in warnings[1]
    assert peer.warnings_for([quiet]) == []


HELP_MODULES = [
    accelerator, attention, cpu, data_pipeline, device_check, dropout_keys, fake_quant,
    inference, optimizer, peer, profile_step, quality, selection_variants, train_step,
]  # fmt: skip


@pytest.mark.parametrize("module", HELP_MODULES, ids=lambda m: m.__name__.split(".")[-1])
def test_help_shows_each_default_once(module, capsys, monkeypatch):
    # --help showed no defaults (argparse's plain formatter), and a few helps wrote
    # their own "(default 20)".
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # profile_step adds one
    parsers = []
    parse_args = argparse.ArgumentParser.parse_args

    def spy(self, *args, **kwargs):
        parsers.append(self)
        return parse_args(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", spy)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    (parser,) = parsers
    entries = re.split(r"\n(?=  -)", text.split("options:", 1)[1])
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        (entry,) = [e for e in entries if re.match(rf"\s*{action.option_strings[0]}\b", e)]
        assert action.help, f"{action.option_strings[0]} has no help"
        assert len(re.findall(r"\(default\b", entry)) <= 1, entry
        if action.default is not None and action.nargs != 0:
            assert f"(default: {action.default})" in entry, entry


def test_help_says_what_each_script_counts_and_writes(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))

    def help_of(module):
        with pytest.raises(SystemExit):
            module.main(["--help"])
        return capsys.readouterr().out

    profile = help_of(profile_step)
    assert re.search(r"--steps STEPS\s+profiled train steps", profile)
    assert re.search(r"--warmup WARMUP\s+unprofiled warm-up train steps", profile)
    assert re.search(r"--steps STEPS\s+timed runs of the pipeline", help_of(data_pipeline))
    # The accelerator always writes its file: "also append" did not say so.
    (output,) = [line for line in help_of(accelerator).splitlines() if "--output" in line[:12]]
    assert "always written" in output and "(default: accelerator-results.jsonl)" in output
    assert "also append" not in output


def test_output_check_opens_the_file_as_the_write_will(tmp_path):
    # `os.access` passes anything for root, and a dangling link looks writable.
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "missing" / "x.jsonl")
    with pytest.raises(ValueError, match=r"--output: .* cannot be written"):
        common.check_output_path(str(link))
    existing = tmp_path / "old.jsonl"
    existing.write_text('{"a": 1}\n')
    common.check_output_path(str(existing))
    assert existing.read_text() == '{"a": 1}\n'
    common.check_output_path(str(tmp_path / "new.jsonl"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.jsonl", "old.jsonl"]
    # A dangling link into an existing folder: its target was created and left there.
    (tmp_path / "folder").mkdir()
    writable = tmp_path / "writable.jsonl"
    writable.symlink_to(tmp_path / "folder" / "target.jsonl")
    common.check_output_path(str(writable))
    assert list((tmp_path / "folder").iterdir()) == [] and writable.is_symlink()


def test_blocks_alternate_even_when_fewer_steps_than_a_block():
    # 3 steps in blocks of 5 timed all of `a`, then all of `b`: no alternation.
    calls: list[str] = []
    contenders = {name: (lambda name=name: calls.append(name)) for name in ("a", "b")}
    times = common.time_in_blocks(contenders, 3, warmup=1, steps_per_block=5)
    assert calls == ["a", "b", *"ababab"]
    assert times["a"].summary()["warmup"] == 1 and times["a"].summary()["steps_per_block"] == 1
    calls.clear()
    times = common.time_in_blocks(contenders, 5, warmup=0, steps_per_block=5)
    assert calls == [*"aabbaabbab"] and times["b"].steps_per_block == 2
    assert [common.block_size(n, 5) for n in (1, 2, 9, 10, 40)] == [1, 1, 4, 5, 5]
    assert common.time_steps(lambda: None, 2, warmup=3).summary()["warmup"] == 3


def test_the_package_docstring_names_every_module():
    # optimizer, dropout_keys, selection_variants, data_pipeline, quality and
    # device_check were missing; tables and backend_probe print nothing when run.
    names = sorted(p.stem for p in pathlib.Path(benchmarks.__file__).parent.glob("*.py"))
    doc = benchmarks.__doc__
    library = doc[doc.index("Library modules") :]
    for name in names:
        if name == "__init__":
            continue
        assert f"`{name}`" in doc, name
        assert (f"`{name}`" in library) == (name in ("common", "tables", "backend_probe")), name


class _Compiled:
    def __init__(self):
        x = jnp.ones((16, 16))
        self.compiled = jax.jit(lambda a: a @ a).lower(x).compile()


@pytest.mark.parametrize(("simulated", "peak_devices"), [(True, 1), (False, 2)])
def test_simulated_devices_share_one_machine_peak(simulated, peak_devices, monkeypatch):
    # `peak_fraction` divided by 2x the matmul peak for two simulated CPU devices,
    # which share the cores that one device's matmul already used.
    env = common.environment()
    monkeypatch.setattr(common, "environment", lambda: {**env, "simulated_devices": simulated})
    compiled = _Compiled().compiled
    # `count_flops` counts the whole step, every device's share: not multiplied again.
    count = common.FlopCount(flops=4096.0, xla_flops=4096.0)
    prepared = types.SimpleNamespace(
        flop_count=lambda: count,
        config=train_step.get_config("tiny"),
        mode="float",
        devices=2,
        compiler_options=None,
        params=1,
        compile=types.SimpleNamespace(compiled=compiled, total_s=1.0, lower_s=0.5, compile_s=0.5),
        first_call_s=0.1,
    )
    peak = {"matmul_peak_gflops": 10.0, "matmul_peak_dtype": "float32", "matmul_peak_size": 16}
    record = train_step.measure(prepared, common.StepTimes((1e-3,), warmup=0), peak)
    common.validate_record(record, train_step.REQUIRED_FIELDS)
    assert record["peak_devices"] == peak_devices
    assert record["flops"] == count.flops
    assert record["flops_method"] == common.FLOPS_METHOD
    assert record["flops_loops_counted_once"] == 0
    assert record["peak_fraction"] == pytest.approx(record["gflops_per_s"] / (10.0 * peak_devices))


@pytest.mark.parametrize(
    "error, detail",
    [
        (
            jax.errors.JaxRuntimeError(
                "RESOURCE_EXHAUSTED: Out of memory allocating 5 bytes.\nmore"
            ),
            "RESOURCE_EXHAUSTED: Out of memory allocating 5 bytes.",
        ),
        (MemoryError("Unable to allocate 7.5 TiB for an array"), "Unable to allocate 7.5 TiB"),
        (MemoryError(), "MemoryError"),
    ],
    ids=["xla", "numpy", "bare"],
)
def test_a_command_out_of_memory_ends_in_one_line_naming_the_sizes_given(
    error, detail, monkeypatch
):
    # Before: a traceback from deep inside the measurement.
    argv = ["/x/benchmarks/train_step.py", "--config", "tiny", "--batch-size=4096", "--json"]
    monkeypatch.setattr("sys.argv", argv)

    def main():
        raise error

    with pytest.raises(SystemExit) as exit_info:
        common.run_command(main)
    message = str(exit_info.value.code)
    assert message.startswith(f"benchmarks.train_step: out of memory ({detail}")
    assert message.endswith(
        "with --config tiny, --batch-size=4096; measure a smaller configuration"
    )


def test_a_command_keeps_the_traceback_of_other_runtime_errors_and_returns_mains_value(
    monkeypatch,
):
    monkeypatch.setattr("sys.argv", ["/x/benchmarks/quality.py"])
    assert common.run_command(lambda: 3) == 3

    def main():
        raise jax.errors.JaxRuntimeError("INTERNAL: something else")

    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        common.run_command(main)


def test_sizes_given_keeps_each_size_flag_with_its_value_as_typed():
    argv = ["--steps", "3", "--sizes", "64,128", "--lengths=8", "--json", "--batch-size"]
    assert common.sizes_given(argv) == ["--sizes 64,128", "--lengths=8", "--batch-size"]
    argv = ["--tables", "a", "b", "--set", "model.hidden_dim=4096", "--ratio-config=seed"]
    assert common.sizes_given(argv) == [
        "--tables a b", "--set model.hidden_dim=4096", "--ratio-config=seed"
    ]  # fmt: skip


def test_every_benchmark_command_runs_its_main_through_run_command():
    for path in sorted(pathlib.Path(benchmarks.__file__).parent.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if '__name__ == "__main__"' in text:
            assert "run_command(main)" in text.split('__name__ == "__main__"', 1)[1], path.name
