"""Side by side: our FP32 train step against pytorch-forecasting's TemporalFusionTransformer.

Both models get the same configuration: the same real-valued inputs (static
reals, known reals over the horizon, observed reals over the history), hidden
size, heads, history and horizon, batch, 3 quantiles, dropout 0.1, Adam at
1e-3 with gradient clipping at norm 1, and pytorch-forecasting's
`hidden_continuous_size` set to our `variable_width`. By default ours is built
with `compact_selection=True`, the selection-GRN width pytorch-forecasting
uses (`min(hidden, V)`), so both run the same architecture up to the
learned skip projections (`--selection paper` times the paper's width
instead). The peer's step is a
plain PyTorch loop (zero_grad, forward, its `QuantileLoss`, backward,
`clip_grad_norm_`, `Adam.step`) without Lightning's per-step bookkeeping,
which only favours the peer. Torch gets as many threads as JAX's CPU client
uses. The two steps are timed in the same process in alternating blocks, so a
shared machine's load falls on both, but not alike: torch's threads stall on
busy cores far more than XLA's, so a run whose load average exceeded the
logical CPUs is marked `contended` and judges no target (`meets_target`
None); quote only uncontended ratios.

Needs the `peers` extra (`pip install -e '.[peers]'`, CPU build of torch).

Usage::

    python -m benchmarks.peer --config seed,electricity [--selection compact|paper] [--json]
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from benchmarks import common
from benchmarks import train_step as ours
from tft_jax import TFTConfig
from tft_jax.allocator import relaunch_with_tuned_allocator
from tft_jax.train import Batch

# Targets of the issue: our samples/s over the peer's, per configuration
# (electricity: 3x, with 5x as the stretch goal).
TARGET_SPEEDUP = {"seed": 20.0, "electricity": 3.0}
PARAM_TOLERANCE = 0.15
SELECTIONS = ("compact", "paper")


def _require_torch() -> Any:
    try:
        import pytorch_forecasting  # noqa: F401
        import torch
    except ImportError as error:
        raise SystemExit(
            "benchmarks.peer needs the 'peers' extra: pip install -e '.[peers]' "
            f"(missing: {error.name})"
        ) from error
    return torch


def jax_cpu_threads() -> int:
    """The cores this process may use, which is how many threads XLA's CPU client runs."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def variable_names(config: TFTConfig) -> dict[str, list[str]]:
    """Names for the peer's real-valued inputs: static, known and observed."""
    return {
        "static": [f"static_{i}" for i in range(config.num_static_features)],
        "known": [f"known_{i}" for i in range(config.num_known_features)],
        "observed": [f"observed_{i}" for i in range(config.num_observed_features)],
    }


def peer_buildable(config: TFTConfig) -> bool:
    """Whether `build_peer_model` covers `config`: real-valued inputs, no known history."""
    return not (config.num_static_categoricals or config.use_known_history)


# The configurations of `benchmarks.train_step` the peer can be built for.
PEER_CONFIGS = tuple(name for name, bench in ours.CONFIGS.items() if peer_buildable(bench.model))


def build_peer_model(config: TFTConfig, seed: int = 0) -> Any:
    """pytorch-forecasting's `TemporalFusionTransformer` for our configuration (its constructor).

    The encoder sees the observed reals, the decoder the known reals, as our
    model does without `use_known_history`; the output transformer is the
    identity normalizer a dataset with unscaled targets would give it.
    """
    torch = _require_torch()
    from pytorch_forecasting import TemporalFusionTransformer as PeerTFT
    from pytorch_forecasting.data.encoders import TorchNormalizer
    from pytorch_forecasting.metrics import QuantileLoss

    if not peer_buildable(config):
        raise ValueError("the peer benchmark covers real-valued inputs without known history")
    names = variable_names(config)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's save_hyperparameters chatter
        model = PeerTFT(
            hidden_size=config.hidden_dim,
            lstm_layers=1,
            dropout=config.dropout_rate,
            output_size=config.num_quantiles,
            loss=QuantileLoss(quantiles=list(config.quantiles)),
            attention_head_size=config.num_heads,
            max_encoder_length=config.sequence_length,
            static_reals=names["static"],
            time_varying_reals_encoder=names["observed"],
            time_varying_reals_decoder=names["known"],
            x_reals=names["static"] + names["known"] + names["observed"],
            hidden_continuous_size=config.variable_width,
            learning_rate=1e-3,
            output_transformer=TorchNormalizer(method="identity"),
        )
    return model


def peer_inputs(batch: Batch, config: TFTConfig) -> tuple[dict[str, Any], Any]:
    """The peer's input dict and target tensor for the same data as our `batch`.

    `encoder_cont (B, T, S+K+U)` and `decoder_cont (B, H, S+K+U)` hold the
    columns in `x_reals` order (static, known, observed); statics repeat over
    time, and the columns a part of the window does not use are zero.
    """
    torch = _require_torch()
    static = np.asarray(batch.static, np.float32)
    historical = np.asarray(batch.historical, np.float32)
    future = np.asarray(batch.future, np.float32)
    size, steps, horizon = historical.shape[0], config.sequence_length, config.prediction_horizon

    def window(length: int, known: np.ndarray | None, observed: np.ndarray | None) -> np.ndarray:
        columns = [
            np.repeat(static[:, None, :], length, axis=1),
            known if known is not None else np.zeros((size, length, config.num_known_features)),
            observed
            if observed is not None
            else np.zeros((size, length, config.num_observed_features)),
        ]
        return np.concatenate(columns, axis=-1).astype(np.float32)

    x = {
        "encoder_cat": torch.zeros((size, steps, 0), dtype=torch.long),
        "decoder_cat": torch.zeros((size, horizon, 0), dtype=torch.long),
        "encoder_cont": torch.from_numpy(window(steps, None, historical)),
        "decoder_cont": torch.from_numpy(window(horizon, future, None)),
        "encoder_lengths": torch.full((size,), steps, dtype=torch.long),
        "decoder_lengths": torch.full((size,), horizon, dtype=torch.long),
        "target_scale": torch.tensor([[0.0, 1.0]] * size),
    }
    return x, torch.from_numpy(np.asarray(batch.target, np.float32))


class PeerStep:
    """pytorch-forecasting's TFT in training mode; calling it runs one Adam step.

    Like ours (`train_step.PreparedStep`), it runs its first step when built,
    untimed: a first call's one-off costs (allocations, lazy initialisation,
    Adam's state) are never among the timed steps, whatever `warmup` is.

    Attributes:
      model: the peer module; params: its parameter count; threads: torch threads;
      first_call_s: wall time of the first step.

    Raises `RuntimeError` if the first step's loss is not finite.
    """

    def __init__(self, config: ours.BenchConfig, seed: int = 0) -> None:
        torch = _require_torch()
        if config.model.dtype != "float32":
            raise ValueError(f"the peer runs in float32, got dtype {config.model.dtype!r}")
        self.threads = jax_cpu_threads()
        torch.set_num_threads(self.threads)
        self.model = build_peer_model(config.model, seed)
        self.model.train()
        self.params = int(sum(p.numel() for p in self.model.parameters()))
        batch = ours.make_batch(config.model, config.batch_size, seed)
        self.inputs, self.target = peer_inputs(batch, config.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self._clip = torch.nn.utils.clip_grad_norm_
        start = time.perf_counter()
        loss = self()
        self.first_call_s = time.perf_counter() - start
        if not math.isfinite(loss):
            raise RuntimeError(f"{config.name} peer: the first step's loss is {loss}")

    def __call__(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        output = self.model(self.inputs)
        loss = self.model.loss.loss(output["prediction"], self.target).mean()
        loss.backward()
        self._clip(self.model.parameters(), 1.0)
        self.optimizer.step()
        return float(loss.detach())  # a host value: the step has finished


def bench(
    config: ours.BenchConfig,
    steps: int = common.MIN_TIMED_STEPS,
    warmup: int = common.DEFAULT_WARMUP,
    steps_per_block: int = 5,
    selection: str = "compact",
) -> dict[str, Any]:
    """Times our FP32 train step and the peer's in alternating blocks; returns the record.

    `selection` is `"compact"` (ours with `compact_selection=True`, the
    peer's selection-GRN width) or `"paper"` (the paper's `hidden_dim`).
    """
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    common.check_step_counts(steps, warmup)
    model = dataclasses.replace(config.model, compact_selection=selection == "compact")
    load_before = float(os.getloadavg()[0])
    mine = ours.PreparedStep(dataclasses.replace(config, model=model), "float")
    theirs = PeerStep(config)
    times = common.time_in_blocks({"ours": mine, "theirs": theirs}, steps, warmup, steps_per_block)
    ours_median, theirs_median = times["ours"].median, times["theirs"].median
    speedup = theirs_median / ours_median
    # Torch's threads stall on busy cores far more than XLA's (a tiny LayerNorm step went
    # from 0.25 to 48 ms): a busy machine inflates the ratio, so no target is judged then.
    load = max(load_before, float(os.getloadavg()[0]))
    contended = load > (os.cpu_count() or 1)
    target = TARGET_SPEEDUP.get(config.name)
    param_ratio = mine.params / theirs.params
    return common.make_record(
        "peer",
        config.name,
        batch_size=config.batch_size,
        selection=selection,
        ours_params=mine.params,
        theirs_params=theirs.params,
        param_ratio=param_ratio,
        params_within_tolerance=abs(param_ratio - 1.0) <= PARAM_TOLERANCE,
        ours_compile_s=mine.compile.total_s,
        ours_first_call_s=mine.first_call_s,
        theirs_first_call_s=theirs.first_call_s,
        **times["ours"].summary("ours_"),
        **times["theirs"].summary("theirs_"),
        ours_samples_per_s=config.batch_size / ours_median,
        theirs_samples_per_s=config.batch_size / theirs_median,
        speedup=speedup,
        target_speedup=target,
        contended=contended,
        load_max_1m=load,
        meets_target=None if target is None or contended else speedup >= target,
        torch_threads=theirs.threads,
        rss_peak_bytes=common.peak_rss_bytes(),
    )


REQUIRED_FIELDS: dict[str, Any] = {
    "batch_size": int,
    "contended": bool,
    "selection": str,
    "ours_params": int,
    "theirs_params": int,
    "param_ratio": float,
    "params_within_tolerance": bool,
    "ours_median_s": float,
    "theirs_median_s": float,
    "ours_steps": int,
    "theirs_steps": int,
    "ours_samples_per_s": float,
    "theirs_samples_per_s": float,
    "speedup": float,
    "torch_threads": int,
}

COLUMNS = [
    ("config", "config", ""),
    ("B", "batch_size", ""),
    ("ours params", "ours_params", ""),
    ("theirs params", "theirs_params", ""),
    ("ours ms", "ours_ms", ".2f"),
    ("theirs ms", "theirs_ms", ".2f"),
    ("ours samples/s", "ours_samples_per_s", ".0f"),
    ("theirs samples/s", "theirs_samples_per_s", ".0f"),
    ("speedup", "speedup", ".1f"),
    ("target", "target_speedup", ".0f"),
    ("meets", "meets_target_shown", ""),
    ("contended", "contended_shown", ""),
    (f"params within {PARAM_TOLERANCE:.0%}", "params_within_shown", ""),
]


def _yes_no(value: bool | None) -> str | None:
    return None if value is None else ("yes" if value else "NO")


def table_view(record: dict[str, Any]) -> dict[str, Any]:
    """Milliseconds, and the target, load and size checks as yes/NO, for the table."""
    return {
        **record,
        "ours_ms": record["ours_median_s"] * 1e3,
        "theirs_ms": record["theirs_median_s"] * 1e3,
        "meets_target_shown": _yes_no(record.get("meets_target")),
        "contended_shown": "YES" if record.get("contended") else "no",
        "params_within_shown": _yes_no(record.get("params_within_tolerance")),
    }


def warnings_for(records: Sequence[dict[str, Any]]) -> list[str]:
    """Lines printed under the table for the ratios not to quote: contended or unequal sizes."""
    lines = []
    for record in records:
        name = f"{record['config']} ({record['selection']})"
        if record.get("contended"):
            lines.append(
                f"warning: {name}: load {record['load_max_1m']:.1f} exceeded the "
                f"{record['env']['logical_cpus']} logical CPUs (contended): the speedup "
                "overstates a quiet machine's and judges no target"
            )
        if not record.get("params_within_tolerance", True):
            lines.append(
                f"warning: {name}: ours has {record['param_ratio']:.2f}x the peer's parameters, "
                f"outside {PARAM_TOLERANCE:.0%}: the models are not the same size"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: `python -m benchmarks.peer [--config seed,electricity] [--json]`."""
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        default="seed,electricity",
        help=f"comma-separated subset of {list(PEER_CONFIGS)}",
    )
    parser.add_argument(
        "--block",
        type=common.positive_int,
        default=5,
        help="steps of each per alternating block (at most half of --steps, so they alternate)",
    )
    parser.add_argument(
        "--selection",
        choices=SELECTIONS,
        default="compact",
        help="our selection-GRN width: the peer's min(hidden, V) (compact) or hidden (paper)",
    )
    args = parser.parse_args(argv)
    with common.usage_errors(parser):
        names = common.split_names(args.config, PEER_CONFIGS, "--config")
        common.setup(args)
        if jax.default_backend() != "cpu":  # the peer is torch's CPU build
            raise ValueError(
                f"JAX runs on {jax.default_backend()!r} here and the peer on the CPU: the ratio "
                "would not compare like with like; run with JAX_PLATFORMS=cpu"
            )
    _require_torch()
    records = [
        bench(ours.get_config(name), args.steps, args.warmup, args.block, args.selection)
        for name in names
    ]
    common.emit(
        records,
        COLUMNS,
        args.json,
        args.output,
        title="train step, ours (FP32, JAX) vs pytorch-forecasting (FP32, torch), one process",
        view=table_view,
    )
    if not args.json:
        for line in warnings_for(records):
            print(line, flush=True)
    return records


if __name__ == "__main__":
    relaunch_with_tuned_allocator()
    common.run_command(main)
