"""Attention benchmark: `TemporalSelfAttention` forward+backward against sequence length.

For each length `T` and each path (`default`: the explicit kernel
`scaled_dot_product_attention`; `flash`: `use_flash_attention=True`, i.e.
`jax.nn.dot_product_attention`), one jitted call computes the causal
self-attention block, a scalar loss and the gradients with respect to the
parameters and the input. Reported: compile time, median time, tokens/s, FLOPs
(`common.count_flops`), the executable's memory (the `T x T` probabilities dominate the
default path's temp bytes) and `kernel`, the attention kernel the compiled
executable really runs: `cudnn` when it calls cuDNN's fused attention
(`__cudnn$fmha*` custom calls), `xla` otherwise. The `flash` path asks for
cuDNN where it applies (`tft_jax.fused_attention`); a `flash` record on a GPU
without cuDNN's kernel (float32, say) is announced on stderr, never passed
off as cuDNN.

Usage::

    python -m benchmarks.attention --lengths 64,256,1024,4096 --paths default,flash [--json]
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from benchmarks import common
from tft_jax import TemporalSelfAttention
from tft_jax.allocator import relaunch_with_tuned_allocator

PATHS = ("default", "flash")
DEFAULT_LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096)
KERNELS = ("xla", "cudnn")
_CUDNN_ATTENTION = "__cudnn$fmha"  # custom-call target prefix of cuDNN's fused attention


def attention_kernel(hlo_text: str) -> str:
    """`"cudnn"` if a compiled module's text calls cuDNN's fused attention, else `"xla"`."""
    return "cudnn" if _CUDNN_ATTENTION in hlo_text else "xla"


def announce_kernel(path: str, kernel: str, backend: str, seq_len: int) -> str | None:
    """The stderr line for a `flash` path that runs no cuDNN kernel on a GPU (None otherwise)."""
    if path != "flash" or kernel == "cudnn" or backend != "gpu":
        return None
    return (
        f"benchmarks.attention: T={seq_len} path 'flash' runs XLA's attention on this GPU, "
        "not cuDNN's fused kernel (its record says kernel='xla')"
    )


def make_step(
    seq_len: int, path: str, batch_size: int, hidden_dim: int, num_heads: int, dtype: str
) -> tuple[Any, tuple[Any, ...]]:
    """`(jitted forward+backward, its arguments)` for one length and path.

    The loss is the mean of the block's output; gradients are taken with
    respect to the parameters and the input `x (B, T, D)`.
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    module = TemporalSelfAttention(
        hidden_dim,
        num_heads,
        dropout_rate=0.0,
        use_flash_attention=path == "flash",
        dtype=jnp.dtype(dtype),
    )
    x = jax.random.normal(jax.random.key(0), (batch_size, seq_len, hidden_dim), jnp.dtype(dtype))
    params = jax.jit(module.init)(jax.random.key(1), x)

    def loss(variables: Any, inputs: Any) -> Any:
        return jnp.mean(module.apply(variables, inputs, causal=True).astype(jnp.float32))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), (params, x)


class _PreparedPath(NamedTuple):
    """One length and path, compiled: its timed call and what its record reads."""

    call: Callable[[], Any]
    compiled: Any
    fields: dict[str, Any]
    flops: common.FlopCount


def _prepare(
    seq_len: int,
    path: str,
    batch_size: int,
    hidden_dim: int,
    num_heads: int,
    dtype: str,
) -> _PreparedPath:
    step, args = make_step(seq_len, path, batch_size, hidden_dim, num_heads, dtype)
    compiled = common.compile_timed(step, *args)
    fields = dict(
        seq_len=seq_len, path=path, batch_size=batch_size, hidden_dim=hidden_dim,
        num_heads=num_heads, dtype=jnp.dtype(dtype).name,
    )  # fmt: skip
    flops = common.count_flops(step, *args)
    return _PreparedPath(lambda: jax.block_until_ready(step(*args)), compiled, fields, flops)


def _record(prepared: _PreparedPath, times: common.StepTimes) -> dict[str, Any]:
    compiled = prepared.compiled.compiled
    seq_len, path = prepared.fields["seq_len"], prepared.fields["path"]
    kernel = attention_kernel(compiled.as_text())
    note = announce_kernel(path, kernel, jax.default_backend(), seq_len)
    if note:
        print(note, file=sys.stderr, flush=True)
    return common.make_record(
        "attention",
        f"T{seq_len}-{path}",
        **prepared.fields,
        kernel=kernel,
        compile_s=prepared.compiled.total_s,
        **times.summary(),
        tokens_per_s=prepared.fields["batch_size"] * seq_len / times.median,
        **prepared.flops.fields(times.median, None),
        memory=common.memory_stats(compiled),
        device_peak_bytes=common.device_peak_bytes(),
    )


def bench(
    seq_len: int,
    paths: Sequence[str],
    steps: int = common.MIN_TIMED_STEPS,
    warmup: int = common.DEFAULT_WARMUP,
    batch_size: int = 1,
    hidden_dim: int = 64,
    num_heads: int = 4,
    dtype: str = "float32",
    steps_per_block: int = 5,
) -> list[dict[str, Any]]:
    """One record per path of one length, the paths timed in alternating blocks.

    Alternating spreads a shared machine's load over the paths alike, so the
    default-vs-flash ratio read from the records is fair.
    """
    common.check_step_counts(steps, warmup)
    prepared = {
        path: _prepare(seq_len, path, batch_size, hidden_dim, num_heads, dtype) for path in paths
    }
    calls = {path: item.call for path, item in prepared.items()}
    common.first_calls(calls)
    times = common.time_in_blocks(calls, steps, warmup, steps_per_block)
    return [_record(prepared[path], times[path]) for path in paths]


REQUIRED_FIELDS: dict[str, Any] = {
    "seq_len": int,
    "path": str,
    "kernel": str,
    "batch_size": int,
    "dtype": str,
    "compile_s": float,
    "median_s": float,
    "steps": int,
    "tokens_per_s": float,
    "flops": (float, type(None)),
    "flops_method": str,
    "flops_loops_counted_once": int,
    "memory": (dict, type(None)),
}

COLUMNS = [
    ("T", "seq_len", ""),
    ("path", "path", ""),
    ("kernel", "kernel", ""),
    ("dtype", "dtype", ""),
    ("compile s", "compile_s", ".2f"),
    ("median ms", "median_ms", ".3f"),
    ("tokens/s", "tokens_per_s", ".0f"),
    ("GFLOP/s", "gflops_per_s", ".2f"),
    ("temp MiB", "temp_mib", ".1f"),
]


def table_view(record: dict[str, Any]) -> dict[str, Any]:
    """Milliseconds and MiB for the table."""
    memory = record.get("memory") or {}
    return {
        **record,
        "median_ms": record["median_s"] * 1e3,
        "temp_mib": memory["temp_bytes"] / 2**20 if memory else None,
    }


def run(
    lengths: Sequence[int],
    paths: Sequence[str],
    steps: int,
    warmup: int,
    batch_size: int = 1,
    hidden_dim: int = 64,
    num_heads: int = 4,
    dtype: str = "float32",
) -> list[dict[str, Any]]:
    """One record per (length, path); the paths of a length are timed alternately."""
    return [
        record
        for length in lengths
        for record in bench(length, paths, steps, warmup, batch_size, hidden_dim, num_heads, dtype)
    ]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.attention [--lengths ...] [--paths ...] [--json]`."""
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--lengths",
        default=",".join(map(str, DEFAULT_LENGTHS)),
        help="sequence lengths T (comma-separated)",
    )
    parser.add_argument(
        "--paths", default=",".join(PATHS), help=f"comma-separated subset of {list(PATHS)}"
    )
    parser.add_argument("--batch-size", type=common.positive_int, default=1, help="batch size")
    parser.add_argument(
        "--hidden-dim", type=common.positive_int, default=64, help="model width (heads divide it)"
    )
    parser.add_argument("--heads", type=common.positive_int, default=4, help="attention heads")
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype"
    )
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        lengths = common.split_positive_ints(args.lengths, "--lengths")
        paths = common.split_names(args.paths, PATHS, "--paths")
        if args.hidden_dim % args.heads:
            raise ValueError(
                f"--hidden-dim ({args.hidden_dim}) must be divisible by --heads ({args.heads})"
            )
        common.setup(args)
    records = run(
        lengths,
        paths,
        args.steps,
        args.warmup,
        args.batch_size,
        args.hidden_dim,
        args.heads,
        args.dtype,
    )
    common.emit(
        records,
        COLUMNS,
        args.json,
        args.output,
        title="TemporalSelfAttention forward+backward (causal)",
        view=table_view,
    )
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    common.run_command(main)
