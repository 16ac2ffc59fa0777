"""The tuned allocator: the environment it sets, and the relaunch that puts it in effect."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tft_jax import allocator

# Loads the module by path: without `tft_jax/__init__` (and JAX) each process starts fast.
PROBE = textwrap.dedent(
    f"""
    import importlib.util, os, sys
    spec = importlib.util.spec_from_file_location("allocator", {allocator.__file__!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    relaunch_with_tuned_allocator = module.relaunch_with_tuned_allocator
    print("started", flush=True)
    relaunch_with_tuned_allocator()
    print("tunables", os.environ.get("GLIBC_TUNABLES"), "args", sys.argv[1:], flush=True)
    """
)


def run_probe(env_updates):
    env = {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}
    env.pop("TFT_JAX_ALLOCATOR", None)
    env.update(env_updates)
    result = subprocess.run(
        [sys.executable, "-c", PROBE, "--flag", "value"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.splitlines()


def test_tuned_environment_adds_the_tunable_and_keeps_others():
    tuned = allocator.tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "A": "1"})
    assert tuned["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert tuned["A"] == "1"
    assert allocator.tuned_environment({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    # A value the user chose is kept.
    mine = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    assert allocator.tuned_environment(mine) == mine
    assert allocator.is_tuned(mine) and not allocator.is_tuned({"GLIBC_TUNABLES": ""})


@pytest.mark.skipif(not allocator._uses_glibc(), reason="the tunable is glibc's")
def test_relaunch_restarts_the_process_once_with_the_tunable_in_effect():
    lines = run_probe({})
    # The code before the relaunch ran twice (two processes), the code after once.
    assert lines.count("started") == 2
    assert lines[-1] == "tunables glibc.malloc.hugetlb=1 args ['--flag', 'value']"


def test_relaunch_keeps_the_process_when_tuned_or_opted_out():
    lines = run_probe({"TFT_JAX_ALLOCATOR": "default"})
    assert lines == ["started", "tunables None args ['--flag', 'value']"]
    lines = run_probe({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert lines == ["started", "tunables glibc.malloc.hugetlb=1 args ['--flag', 'value']"]


@pytest.mark.parametrize("value", ["off", "0", "system", "jemalloc"])
def test_an_unknown_allocator_choice_is_refused_instead_of_relaunching(value):
    # Meant to opt out, each of these relaunched with the tuned allocator without a word.
    environ = {"TFT_JAX_ALLOCATOR": value}
    with pytest.raises(ValueError, match=f"TFT_JAX_ALLOCATOR must be 'default' .* got '{value}'"):
        allocator.should_relaunch(environ)
    assert not allocator.should_relaunch({"TFT_JAX_ALLOCATOR": "Default"})
    assert allocator.should_relaunch({}) == allocator._uses_glibc()


@pytest.mark.skipif(not allocator._uses_glibc(), reason="the relaunch is glibc's")
def test_a_program_read_from_standard_input_runs_on_instead_of_relaunching():
    env = {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}
    env.pop("TFT_JAX_ALLOCATOR", None)
    result = subprocess.run(
        [sys.executable, "-", "--flag", "value"],
        input=PROBE,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # The relaunched process read an exhausted standard input: the probe printed
    # "started" once and nothing after the call.
    assert result.stdout.splitlines() == ["started", "tunables None args ['--flag', 'value']"]
    assert "RuntimeWarning" in result.stderr and "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in (
        result.stderr
    )


def _main_block(tree: ast.Module) -> ast.If | None:
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
        ):
            return node
    return None


def test_every_benchmark_script_relaunches_with_the_tunable_first():
    # The README promises `python -m benchmarks.*` runs with the tuned allocator;
    # `benchmarks.quality` once did not.
    scripts = sorted(pathlib.Path(__file__).resolve().parent.parent.glob("benchmarks/*.py"))
    checked = []
    for script in scripts:
        block = _main_block(ast.parse(script.read_text()))
        if block is None:
            continue
        first = block.body[0]
        call = first.value if isinstance(first, ast.Expr) else None
        assert (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "relaunch_with_tuned_allocator"
        ), f"{script.name}: its __main__ block must start with relaunch_with_tuned_allocator()"
        checked.append(script.stem)
    assert {"quality", "train_step", "peer", "accelerator"} <= set(checked)
