"""Train states, a stand-in model and checkpoint damage shared by the checkpoint tests.

`TEMPLATE` is a tiny TFT's train state, `randomized` fills one with noise and
`save_two_latest_steps` saves two of them; `STAND_IN` is the source of a small
model and its batches that `fit` trains in process and in the subprocesses of
the tests; `_truncate` damages a saved step.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tft_jax.checkpoint import CORRUPT, TrainingCheckpointer
from tft_jax.config import TFTConfig
from tft_jax.model import TemporalFusionTransformer
from tft_jax.train import Batch, TrainState, create_train_state, make_optimizer

CONFIG = TFTConfig(
    num_static_features=1,
    num_known_features=2,
    num_observed_features=1,
    hidden_dim=8,
    num_heads=2,
    sequence_length=4,
    prediction_horizon=2,
    dropout_rate=0.1,
)
MODEL = TemporalFusionTransformer(CONFIG)
TX = make_optimizer(1e-3, clip_norm=1.0, weight_decay=1e-4)


def sample_batch(batch_size: int = 2) -> Batch:
    rng = np.random.default_rng(0)
    cfg = CONFIG
    return Batch(
        static=rng.normal(size=(batch_size, 1)).astype(np.float32),
        historical=rng.normal(size=(batch_size, cfg.sequence_length, 1)).astype(np.float32),
        future=rng.normal(size=(batch_size, cfg.prediction_horizon, 2)).astype(np.float32),
        known_history=None,
        static_categorical=None,
        target=rng.normal(size=(batch_size, cfg.prediction_horizon)).astype(np.float32),
    )


TEMPLATE = create_train_state(MODEL, TX, jax.random.key(0), sample_batch())


def randomized(state: TrainState, seed: int, step: int) -> TrainState:
    """`state` with every float leaf (params and Adam moments) replaced by noise."""
    rng = np.random.default_rng(seed)

    def noise(leaf: Any) -> Any:
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.asarray(rng.normal(size=leaf.shape).astype(leaf.dtype))
        return leaf

    noisy = jax.tree.map(noise, state)
    return noisy.replace(step=jnp.asarray(step, jnp.int32), skipped_steps=jnp.asarray(1, jnp.int32))


def save_two_latest_steps(directory: pathlib.Path) -> tuple[TrainState, TrainState]:
    """Latest steps 5 and 10 of `randomized` states under `directory`; returns them, in order."""
    older, newer = randomized(TEMPLATE, 2, step=5), randomized(TEMPLATE, 3, step=10)
    with TrainingCheckpointer(directory) as checkpointer:
        checkpointer.save_latest(older, jax.random.key(0), {})
        checkpointer.save_latest(newer, jax.random.key(0), {})
    return older, newer


def _data(tree: Any) -> Any:
    """The array fields of a `TrainState` (the static ones hold per-instance callables)."""
    if isinstance(tree, TrainState):
        return (tree.step, tree.params, tree.opt_state, tree.model_state, tree.skipped_steps)
    return tree


def assert_bitwise_equal(left: Any, right: Any) -> None:
    left, right = _data(left), _data(right)
    assert jax.tree.structure(left) == jax.tree.structure(right)
    for a, b in zip(jax.tree.leaves(left), jax.tree.leaves(right), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


def corrupt_warning(directory: pathlib.Path, kind: str, step: int, reason: str = "") -> str:
    """The regex of the warning that moves step `step` of `kind` aside as corrupt.

    `reason` is a regex of the start of the damage found (in parentheses).
    """
    moved = re.escape(str(directory / CORRUPT / f"{kind}-{step}"))
    return (
        rf"^checkpoint {kind} step {step} in {re.escape(str(directory))} is corrupt "
        rf"\((?:{reason}).*\); moved to {moved}$"
    )


def _array_files(step_dir: pathlib.Path) -> list[pathlib.Path]:
    files = [path for path in (step_dir / "state").rglob("d/*") if path.is_file()]
    assert files, f"no array data files under {step_dir}"
    return files


def _truncate(step_dir: pathlib.Path) -> None:
    for path in _array_files(step_dir):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


STAND_IN = '''
import time

from flax import linen as nn
from flax import struct
import jax.numpy as jnp
import numpy as np

from tft_jax.train import Batch


@struct.dataclass
class Output:
    quantiles: jnp.ndarray


class Config:
    quantiles = (0.1, 0.5, 0.9)


class StandIn(nn.Module):
    """Inputs flattened -> Dense -> tanh -> Dropout -> Dense -> (B, H, Q)."""

    config: Config = Config()

    @nn.compact
    def __call__(self, static, historical, future, known_history=None,
                 static_categorical=None, deterministic=True):
        batch = historical.shape[0]
        x = jnp.concatenate([static, historical.reshape(batch, -1),
                             future.reshape(batch, -1)], axis=-1)
        hidden = nn.Dropout(0.3)(jnp.tanh(nn.Dense(16)(x)), deterministic=deterministic)
        return Output(nn.Dense(future.shape[1] * 3)(hidden).reshape(batch, -1, 3))


def make_batches(seed, count, batch_size=4):
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        future = rng.normal(size=(batch_size, 2, 2)).astype(np.float32)
        batches.append(Batch(
            static=rng.normal(size=(batch_size, 1)).astype(np.float32),
            historical=rng.normal(size=(batch_size, 3, 1)).astype(np.float32),
            future=future, known_history=None, static_categorical=None,
            target=(future.sum(-1) + 0.1 * rng.normal(size=(batch_size, 2))).astype(np.float32),
        ))
    return batches


TRAIN = make_batches(0, 6)
VAL = make_batches(1, 2)


def epoch_batches(epoch, delay=0.0, repeat=1):
    """The training batches of `epoch` (each `repeat` times), shuffled by a generator seeded
    with (0, epoch)."""
    order = np.random.default_rng([0, epoch]).permutation(len(TRAIN) * repeat) % len(TRAIN)
    for index in order:
        if delay:
            time.sleep(delay)
        yield TRAIN[index]
'''

namespace: dict[str, Any] = {}
exec(STAND_IN, namespace)  # the very source the subprocesses run
StandIn, TRAIN, VAL, epoch_batches = (
    namespace[name] for name in ("StandIn", "TRAIN", "VAL", "epoch_batches")
)
STAND_IN_TX = make_optimizer(3e-2, clip_norm=1.0, weight_decay=1e-3)


def stand_in_state() -> TrainState:
    return create_train_state(StandIn(), STAND_IN_TX, jax.random.key(3), TRAIN[0])
