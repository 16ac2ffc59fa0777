"""The property suite catches every deliberate fault of `properties.faults`; real code passes."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import linen as nn
from hypothesis import strategies as st

from properties import faults
from properties.suite import Property
from qat import dot_general, fake_quant, lsq, observers
from qat.config import QATConfig
from tft_jax import attention, interpretable_attention, layer_norm, optimizer
from tft_jax import model as tft_model

# Where the catalogue patches the real code.
_PATCH_TARGETS = (
    (attention, "scaled_dot_product_attention"),
    (attention, "causal_mask"),
    (attention, "sinusoidal_encoding"),
    (attention, "nn"),
    (tft_model, "causal_mask"),
    (tft_model, "InterpretableMultiHeadAttention"),
    (interpretable_attention, "InterpretableMultiHeadAttention"),
    (fake_quant, "_fake_quantize"),
    (fake_quant, "_grid_position"),
    (observers.QuantizationObserver, "observe"),
    (lsq, "default_grad_scale"),
    (dot_general, "default_grad_scale"),
    (dot_general, "fake_quantize"),
    (optimizer, "flat_adamw"),
)


def _snapshot() -> list[object]:
    return [getattr(owner, name) for owner, name in _PATCH_TARGETS]


def test_catalogue_holds_at_least_twelve_distinct_faults_each_with_properties():
    names = [fault.name for fault in faults.CATALOGUE]
    assert len(names) >= 12
    assert len(set(names)) == len(names)
    assert all(fault.properties for fault in faults.CATALOGUE)


def test_every_fault_patches_the_real_code_and_restores_it():
    before = _snapshot()
    for fault in faults.CATALOGUE:
        with fault.patch():
            pass
        assert _snapshot() == before, fault.name
    changed = set()
    for fault in faults.CATALOGUE:
        with fault.patch():
            changed |= {
                i for i, (a, b) in enumerate(zip(_snapshot(), before, strict=True)) if a is not b
            }
    assert changed == set(range(len(_PATCH_TARGETS)))


def _fault(prefix: str) -> faults.Fault:
    (fault,) = [fault for fault in faults.CATALOGUE if fault.name.startswith(prefix)]
    return fault


@pytest.mark.parametrize("kind", ["minmax", "moving_average"])
def test_observer_fault_starts_the_range_from_the_second_batch(kind):
    """Both observer kinds: the first batch is ignored, the second sets the range (no NaN)."""
    first = np.array([-1.0, 2.0], np.float32)
    second = np.array([-3.0, 5.0], np.float32)
    observer = observers.QuantizationObserver.create(QATConfig(bits=8, observer=kind))
    with _fault("observer: ignores the first batch").patch():
        after_one = observer.observe(first)
        after_two = after_one.observe(second)
    assert float(after_one.min_val) == np.inf and float(after_one.max_val) == -np.inf
    assert (float(after_two.min_val), float(after_two.max_val)) == (-3.0, 5.0)
    assert int(after_two.num_batches) == 2


def test_lsq_fault_reaches_the_qat_layer_too():
    """The QAT layer's learnable-scale path looks the gradient scale up in `qat.dot_general`."""
    with _fault("lsq: gradient without its scale").patch():
        assert lsq.default_grad_scale(64, 1, 127) == 1.0
        assert dot_general.default_grad_scale(64, 1, 127) == 1.0
    assert dot_general.default_grad_scale(64, 1, 127) == pytest.approx(1 / np.sqrt(64 * 127))


def test_reference_faults_are_distinct_and_restore_the_real_code():
    """The equation faults (caught by `tests/test_reference_tft.py`) undo their patches."""
    names = [fault.name for fault in faults.REFERENCE_FAULTS]
    assert len(names) == 4
    assert len(set(names) | {fault.name for fault in faults.CATALOGUE}) == len(names) + len(
        faults.CATALOGUE
    )

    def state() -> tuple[object, ...]:
        return (*_snapshot(), nn.elu, jax.nn.elu, layer_norm._affine_normalize)

    before = state()
    for fault in faults.REFERENCE_FAULTS:
        with fault.patch():
            if "ELU" in fault.name:
                assert nn.elu is jax.nn.relu and jax.nn.elu is jax.nn.relu
            if "LayerNorm" in fault.name:
                assert layer_norm._affine_normalize is not before[-1]
        assert state() == before, fault.name


def test_every_fault_is_caught_and_every_property_passes_on_the_real_code():
    reports = faults.run_catalogue(examples=2, stop_at_first_catch=True)
    table = faults.format_table(reports)
    print(table)
    baselines = [r for r in reports if r.fault is None]
    assert baselines and all(
        outcome.status == "passed" for r in baselines for outcome in r.outcomes.values()
    ), table
    for report in reports:
        if report.fault is None:
            continue
        assert report.caught_by, f"{report.fault.name} escaped every property\n{table}"
        assert not report.errors, f"{report.fault.name} crashed {report.errors}\n{table}"


def test_command_line_lists_the_catalogue_and_rejects_unknown_names(capsys):
    assert faults.main(["--list", "--cache-dir", ""]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == len(faults.CATALOGUE)
    with pytest.raises(SystemExit):
        faults.main(["--only", "no such fault", "--cache-dir", ""])


def test_command_line_uses_no_compilation_cache_unless_given_one(monkeypatch, tmp_path, capsys):
    # The default was the relative ".jax_cache": a run wrote it into the caller's folder.
    updates = {}
    monkeypatch.setattr(jax.config, "update", lambda name, value: updates.update({name: value}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert faults.main(["--list"]) == 0
    assert "jax_compilation_cache_dir" not in updates
    assert faults.main(["--list", "--cache-dir", "~/jax"]) == 0
    assert updates["jax_compilation_cache_dir"] == str(tmp_path / "jax")
    assert list(tmp_path.iterdir()) == []
    capsys.readouterr()
    with pytest.raises(SystemExit):
        faults.main(["--help"])
    assert "by default none (nothing is written to the current folder)" in " ".join(
        capsys.readouterr().out.split()
    )


def _property(name: str, error: BaseException | None) -> Property:
    def check(case: int) -> None:
        if error is not None:
            raise error

    return Property(name, st.integers(0, 3), check)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (None, "passed"),
        (AssertionError("wrong"), "caught"),
        (TypeError("crashed"), "error"),  # a property must fail by assertion, not by crashing
        (ExceptionGroup("two", [AssertionError("a"), AssertionError("b")]), "caught"),
        (ExceptionGroup("mixed", [AssertionError("a"), ValueError("b")]), "error"),
    ],
)
def test_run_property_tells_an_assertion_from_a_crash(error, status):
    assert faults.run_property(_property("p", error), examples=2).status == status


@pytest.mark.parametrize("stop", [False, True])
def test_run_fault_stops_at_the_first_catch_only_when_asked(stop):
    props = [_property("catches", AssertionError("x")), _property("passes", None)]
    report = faults.run_fault(None, props, examples=2, stop_at_first_catch=stop)
    assert list(report.outcomes) == (["catches"] if stop else ["catches", "passes"])
    assert report.outcomes["catches"].status == "caught"
