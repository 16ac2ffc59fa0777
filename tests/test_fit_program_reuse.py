"""`fit` on one device compiles the programs that direct calls on its result run.

`jax.jit` keys a program by whether its inputs are committed to a device. `fit`
used to commit the state and batches to a one-device mesh, so a `train_step`,
`evaluate` or `predict` on `fit`'s result with NumPy batches compiled every
program again (seconds each), and so did a resumed `fit` in the same process.
"""

from __future__ import annotations

import jax
import numpy as np

from tft_jax.distributed import data_mesh, default_device_only, place_state, shard_batch
from tft_jax.train import copy_state, create_train_state, evaluate, fit, predict, train_step

from .checkpoint_states import STAND_IN_TX, TRAIN, VAL, StandIn
from .tracing import recorded_compiles


def _fresh_state():
    return create_train_state(StandIn(), STAND_IN_TX, jax.random.key(0), TRAIN[0])


def test_direct_calls_and_a_resumed_fit_after_fit_compile_nothing_new(tmp_path) -> None:
    run = tmp_path / "run"
    result = fit(_fresh_state(), TRAIN, VAL, epochs=1, quiet=True, checkpoint_dir=run)
    state = _fresh_state()
    with recorded_compiles() as compiled:
        loss = evaluate(result.state, VAL)
        output = predict(result.best_state, VAL[0])
        stepped, metrics = train_step(copy_state(result.state), TRAIN[0], jax.random.key(1))
        resumed = fit(state, TRAIN, VAL, epochs=2, quiet=True, checkpoint_dir=run, resume=True)
        evaluate(resumed.state, VAL)
    # (fit's own `jax.random.key` and checkpoint reads trace small helpers each call.)
    # Compiles, not traces: deep in a long run JAX may trace again and find the compiled
    # program; the old placement compiled each again.
    assert not [name for name in compiled if "_train_step" in name or "output" in name], compiled
    # The programs reused are the right ones: a fresh process's numbers.
    assert np.isfinite(loss) and np.isfinite(float(metrics["loss"]))
    assert output.quantiles.shape == (VAL[0].batch_size, 2, 3)
    assert int(stepped.step) == int(result.state.step) + 1
    assert int(resumed.state.step) == 2 * len(TRAIN)


def test_placement_on_the_default_device_alone_is_uncommitted_and_exact() -> None:
    mesh = data_mesh(1)
    assert default_device_only(mesh)
    committed = jax.device_put(np.arange(6.0, dtype=np.float32), jax.devices()[0])
    key = jax.device_put(jax.random.key(3), jax.devices()[0])
    tree = {"a": committed, "b": np.ones((2, 3), np.float32), "key": key}
    placed = place_state(tree, mesh)
    assert committed.committed and not any(leaf.committed for leaf in jax.tree.leaves(placed))
    np.testing.assert_array_equal(placed["a"], np.arange(6.0))
    np.testing.assert_array_equal(placed["b"], np.ones((2, 3)))
    np.testing.assert_array_equal(jax.random.key_data(placed["key"]), jax.random.key_data(key))
    assert jax.random.key_impl(placed["key"]) == jax.random.key_impl(key)
    batch = shard_batch(TRAIN[0], mesh)
    assert not any(leaf.committed for leaf in jax.tree.leaves(batch))
    np.testing.assert_array_equal(batch.target, TRAIN[0].target)
