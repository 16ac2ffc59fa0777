"""What the benchmarks measure: FLOPs of every loop iteration, one program timed once, the
forward in a forward+backward.

* `common.count_flops` counts each `lax.scan` body once per iteration (XLA's cost
  analysis counts it once) and the variable selection in one chunk, so a step's
  FLOPs do not depend on how the CPU splits the selection's rows into chunks;
* variants that lower to the very same program (`recompute` with one chunk,
  `inline` dropout draws without dropout) report no ratio;
* `fake_quant`'s forward+backward keeps the fake-quantized forward in its program.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import tft_jax.chunked_selection as chunked_selection
import tft_jax.train as train
from benchmarks import common, dropout_keys, fake_quant, selection_variants, train_step
from tft_jax import steps

FAST = ["--json", "--steps", "1", "--warmup", "0", "--compile-cache"]

_B, _D = 8, 32  # a scanned (B, D) @ (D, D) matmul: 2 * B * D * D FLOPs per step


def _scanned_matmul(length: int, unroll: int = 1):
    def f(x, w):
        def body(carry, _):
            return carry @ w, None

        return lax.scan(body, x, None, length=length, unroll=unroll)[0].sum()

    return f


@pytest.mark.parametrize("length", [1, 7, 50])
@pytest.mark.parametrize("unroll", [1, 3, 0])
def test_count_flops_counts_every_iteration_of_a_scan(length, unroll):
    # XLA's cost analysis counts a scan's body once: 50 steps read as one.
    x, w = jnp.ones((_B, _D)), jnp.ones((_D, _D))
    count = common.count_flops(_scanned_matmul(length, unroll), x, w)
    matmuls = 2 * _B * _D * _D * length
    # Besides the matmuls: the final sum (B * D - 1 adds) and the loop's counter.
    assert matmuls + _B * _D - 1 <= count.flops <= matmuls + _B * _D + 2
    assert count.loops_counted_once == 0
    if unroll == 1 and length > 1:
        assert count.xla_flops < count.flops / (length - 1)
    fully_unrolled = common.count_flops(_scanned_matmul(length, 0), x, w)
    assert count.flops == pytest.approx(fully_unrolled.flops, abs=2)


def test_count_flops_counts_the_backward_scan_and_nested_scans():
    x, w = jnp.ones((_B, _D)), jnp.ones((_D, _D))
    # The gradient with respect to w: per step the forward's matmul, two matmuls
    # backward and the (D, D) sum into w's gradient; a few FLOPs outside the loops.
    grad = common.count_flops(jax.grad(_scanned_matmul(20), argnums=1), x, w)
    per_step = 3 * 2 * _B * _D * _D + _D * _D
    assert 20 * per_step <= grad.flops <= 20 * per_step + 16

    def nested(x, w):
        def outer(carry, _):
            return _scanned_matmul(5)(carry, w) * carry, None

        return lax.scan(outer, x, None, length=4)[0].sum()

    count = common.count_flops(nested, x, w)
    assert count.flops == pytest.approx(4 * 2 * _B * _D * _D * 5, rel=0.02)


def test_count_flops_says_when_a_loop_has_no_known_trip_count():
    x, w = jnp.ones((_B, _D)), jnp.ones((_D, _D))

    def until_large(x, w):
        return lax.while_loop(lambda c: c.sum() < 1e6, lambda c: c @ w, x).sum()

    count = common.count_flops(until_large, x, w)
    assert count.loops_counted_once == 1  # a lower bound, and the record says so
    assert count.fields(1.0, None)["flops_loops_counted_once"] == 1


def test_count_flops_counts_a_scan_inside_a_cond_branch_once():
    # The branch taken is known only at run time: its scan may run 0 or `length`
    # times, so it is not multiplied out but reported as counted once.
    x, w = jnp.ones((_B, _D)), jnp.ones((_D, _D))
    scanned = _scanned_matmul(50)

    def maybe_scan(x, w):
        return lax.cond(x.sum() > 0, lambda x, w: scanned(x, w), lambda x, w: x.sum(), x, w)

    count = common.count_flops(maybe_scan, x, w)
    assert count.loops_counted_once == 1
    assert count.flops == count.xla_flops  # nothing multiplied: a lower bound
    assert count.flops < 2 * _B * _D * _D * 50  # well below 50 matmuls


def test_count_flops_leaves_a_jitted_functions_trace_cache_alone():
    calls = []

    @jax.jit
    def f(x):
        calls.append(1)
        return x * 2.0

    x = jnp.ones(4)
    common.count_flops(f, x)
    common.count_flops(f, x)
    assert len(calls) == 2  # traced afresh each time, not through the jit's cache
    f(x)
    assert len(calls) == 3  # the count cached nothing the jitted call then reuses


@pytest.fixture(scope="module")
def seed_step():
    """`(body, state, batch, key)` of the FP32 train step of `seed` (counted, never timed)."""
    config = train_step.get_config("seed")
    batch = jax.device_put(train_step.make_batch(config.model, config.batch_size))
    state, calibrate = train_step.build_state("float", config.model, batch)
    body = functools.partial(steps._train_step, calibrate=calibrate)
    return body, state, batch, jax.random.key(1)


def _loops(closed) -> int:
    """The outermost loops of a traced step (its closed jaxpr)."""
    return sum(1 for _ in common._outer_loops(closed.jaxpr))


def test_step_flops_do_not_depend_on_the_selection_chunks(seed_step, monkeypatch):
    # On CPU the selection ran in a `lax.scan` over chunks of rows, which XLA counted
    # once: the step's FLOPs fell with the number of chunks.
    counts, xla_chunked, loops = {}, {}, {}
    for chunk_bytes in (64, 4096, 1 << 40):
        monkeypatch.setattr(chunked_selection, "DEFAULT_CHUNK_BYTES", chunk_bytes)
        counts[chunk_bytes] = common.count_flops(*seed_step)
        # One trace of the step at these chunks serves XLA's count and the loops.
        closed = jax.make_jaxpr(lambda *a: seed_step[0](*a))(*seed_step[1:])
        xla_chunked[chunk_bytes] = common._jaxpr_flops(closed)[0]
        loops[chunk_bytes] = _loops(closed)
    # The settings give several chunks, fewer, and one: XLA's own counts differ.
    assert loops[64] == loops[4096] > loops[1 << 40] > 0
    assert len(set(xla_chunked.values())) == 3
    assert len({count.flops for count in counts.values()}) == 1
    assert counts[64].flops > counts[64].xla_flops  # the LSTM's steps, each counted


def test_step_flops_count_leaves_the_timed_program_as_it_was(seed_step, monkeypatch):
    body, state, batch, key = seed_step
    monkeypatch.setattr(chunked_selection, "DEFAULT_CHUNK_BYTES", 64)
    chunked_rows = chunked_selection.chunked_rows
    try:
        jax.clear_caches()
        before = train.lower_train_step(state, batch, key).as_text()
        common.count_flops(body, state, batch, key)
        after = train.lower_train_step(state, batch, key).as_text()
    finally:
        jax.clear_caches()  # later tests trace with the library's chunks
    assert chunked_selection.chunked_rows is chunked_rows
    assert before == after
    assert "stablehlo.while" in before  # the timed step still runs its chunks


def test_train_step_record_says_how_its_flops_were_counted(seed_step):
    body, state, batch, key = seed_step
    count = common.count_flops(body, state, batch, key)
    prepared = train_step.PreparedStep(train_step.get_config("seed"), "float")
    assert prepared.flop_count().flops == count.flops
    peak = {"matmul_peak_gflops": 10.0, "matmul_peak_dtype": "float32", "matmul_peak_size": 16}
    record = train_step.measure(prepared, common.StepTimes((1e-3,), warmup=0), peak)
    common.validate_record(record, train_step.REQUIRED_FIELDS)
    assert record["flops"] == count.flops
    assert record["flops_method"] == common.FLOPS_METHOD
    assert record["flops_loops_counted_once"] == 0
    assert record["gflops_per_s"] == pytest.approx(count.flops / 1e-3 / 1e9)


def _records(main, argv, capsys) -> tuple[list[dict], str]:
    main([*argv, *FAST])
    captured = capsys.readouterr()
    return [json.loads(line) for line in captured.out.splitlines() if line.strip()], captured.err


def test_selection_variants_with_one_chunk_report_one_program_and_no_ratio(capsys):
    # `tiny`'s selection runs in one chunk, where `CHUNK_REMAT_POLICY` changes nothing:
    # `recompute` lowered to `default`'s very program, yet got a step-time ratio.
    argv = ["--config", "tiny", "--mode", "float", "--variant", "default,recompute"]
    records, err = _records(selection_variants.main, argv, capsys)
    default, recompute = records
    for record in records:
        common.validate_record(record, selection_variants.REQUIRED_FIELDS)
        assert record["same_program"] is True
    assert recompute["program_sha256"] == default["program_sha256"]
    assert recompute["median_ratio"] is None and recompute["compile_cpu_ratio"] is None
    assert default["median_ratio"] == 1.0
    assert "'recompute' lowers to the same program as 'default'" in err


def test_dropout_keys_without_dropout_report_one_program_and_no_ratio(capsys):
    # `tiny` has no dropout: `builtin` and `inline` are one program (median_ratio was 0.90).
    records, err = _records(dropout_keys.main, ["--config", "tiny"], capsys)
    builtin, inline = records
    assert inline["program_sha256"] == builtin["program_sha256"]
    for record in records:
        common.validate_record(record, dropout_keys.REQUIRED_FIELDS)
        assert record["same_program"] is True
    for field in ("fusions_ratio", "compile_cpu_ratio", "compile_wall_ratio", "median_ratio"):
        assert inline[field] is None
    assert "'inline' lowers to the same program as 'builtin'" in err


def _variant_records(digests: dict[str, str]) -> list[dict]:
    return [
        {
            "config": "c",
            "mode": "float",
            "variant": variant,
            "program_sha256": digest,
            "compile_cpu_s": 2.0,
            "median_s": 1.0 + index,
            "first_loss": 1.0,
        }
        for index, (variant, digest) in enumerate(digests.items())
    ]


def test_selection_variant_ratios_only_between_different_programs():
    records = _variant_records({"default": "a", "recompute": "a", "materialized": "b"})
    selection_variants.add_ratios(records)
    default, recompute, materialized = records
    assert default["same_program"] is True and default["median_ratio"] == 1.0
    assert recompute["same_program"] is True and recompute["median_ratio"] is None
    assert materialized["same_program"] is False and materialized["median_ratio"] == 3.0
    records = _variant_records({"default": "a", "recompute": "b"})
    selection_variants.add_ratios(records)
    assert [r["same_program"] for r in records] == [False, False]
    assert records[1]["median_ratio"] == 2.0
    records = _variant_records({"recompute": "b"})
    selection_variants.add_ratios(records)
    assert records[0]["same_program"] is None and records[0]["median_ratio"] is None


def test_program_digest_ignores_source_locations():
    def f(x):
        return x * 2.0

    def g(x):  # the same program, traced from other lines
        return x * 2.0

    x = jnp.ones(3)
    assert common.program_digest(jax.jit(f).lower(x)) == common.program_digest(jax.jit(g).lower(x))
    assert common.program_digest(jax.jit(f).lower(x)) != common.program_digest(
        jax.jit(lambda x: x * 3.0).lower(x)
    )


def test_fake_quant_forward_backward_keeps_the_fake_quantized_forward():
    # Returning only the VJP let XLA drop the forward: no clamp in the timed program.
    x = jnp.linspace(-20.0, 20.0, 1024)
    g = jnp.ones_like(x)
    quantized, baseline = fake_quant._functions("forward+backward")
    text = quantized.lower(x, g).compile().as_text()
    assert "clamp(" in text and "round-nearest" in text
    y, grad = quantized(x, g)
    forward = fake_quant._functions("forward")[0](x, g)
    assert jnp.array_equal(y, forward)
    assert grad.shape == x.shape
    base_y, base_grad = baseline(x, g)
    assert jnp.allclose(base_y, x * 1.0001) and base_grad.shape == x.shape
