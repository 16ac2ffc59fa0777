"""A short batch filled up with unobserved rows: the wider batches' programs, the same numbers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import struct

from qat import QATConfig, QATModel
from tft_jax.batch_padding import fillable, filled_to
from tft_jax.train import (
    Batch,
    copy_state,
    create_train_state,
    evaluate,
    fit,
    make_optimizer,
    step_key,
    train_step,
)

from .tracing import recorded_compiles

LEVELS = (0.1, 0.5, 0.9)


@contextlib.contextmanager
def model_programs() -> Iterator[list[str]]:
    """The train steps and forwards compiled in the block (`recorded_compiles`; a trace that
    finds its program compiled, which JAX may do deep in a long run, is not counted)."""
    with recorded_compiles() as compiled:
        names: list[str] = []
        yield names
    names[:] = [name for name in compiled if "_train_step" in name or "output" in name]


@struct.dataclass
class Output:
    quantiles: jnp.ndarray


class Config:
    quantiles = LEVELS


class Linear(nn.Module):
    """Inputs flattened -> Dense -> (B, H, Q); no dropout, so a filled step is exact.

    `centered`: inputs less the batch's mean first, so rows depend on each other.
    """

    config: Config = Config()
    centered: bool = False
    dot_general_cls: Any = None  # the hook `qat.QATModel` fills

    @nn.compact
    def __call__(
        self, static, historical, future, known_history=None, static_categorical=None,
        deterministic=True,
    ):  # fmt: skip
        rows = historical.shape[0]
        x = jnp.concatenate([static, historical.reshape(rows, -1), future.reshape(rows, -1)], -1)
        if self.centered:
            x = x - x.mean(axis=0)
        dense = nn.Dense(future.shape[1] * 3, dot_general_cls=self.dot_general_cls)
        return Output(dense(x).reshape(rows, -1, 3))


def make_batch(seed: int, rows: int, mask: bool = True) -> Batch:
    rng = np.random.default_rng(seed)
    return Batch(
        static=rng.normal(size=(rows, 1)).astype(np.float32),
        historical=rng.normal(size=(rows, 3, 2)).astype(np.float32),
        future=rng.normal(size=(rows, 2, 1)).astype(np.float32),
        known_history=None,
        static_categorical=rng.integers(0, 3, size=(rows, 1)).astype(np.int32),
        target=rng.normal(size=(rows, 2)).astype(np.float32),
        target_mask=(rng.random((rows, 2)) > 0.2).astype(np.float32) if mask else None,
    )


def fresh_state():
    tx = make_optimizer(1e-2, clip_norm=1.0, weight_decay=0.0)
    return create_train_state(Linear(), tx, jax.random.key(0), make_batch(0, 8))


def reference_loss(state, batches: list[Batch]) -> float:
    """The mean pinball loss over every observed target, in float64 NumPy."""
    kernel = np.asarray(state.params["Dense_0"]["kernel"], np.float64)
    bias = np.asarray(state.params["Dense_0"]["bias"], np.float64)
    total, count = 0.0, 0
    for b in batches:
        x = np.concatenate([b.static, b.historical.reshape(len(b.static), -1), b.future[..., 0]], 1)
        pred = (x.astype(np.float64) @ kernel + bias).reshape(len(x), -1, 3)
        error = b.target[..., None] - pred
        losses = np.maximum(np.asarray(LEVELS) * error, (np.asarray(LEVELS) - 1) * error)
        observed = b.target_mask != 0
        total += losses[observed].sum()
        count += observed.sum() * len(LEVELS)
    return total / count


def test_filled_to_appends_unobserved_copies_of_the_last_row() -> None:
    batch = make_batch(1, 5)
    filled = filled_to(batch, 8)
    assert filled.batch_size == 8 and filled.known_history is None
    for name in ("static", "historical", "future", "static_categorical", "target"):
        value, original = getattr(filled, name), getattr(batch, name)
        np.testing.assert_array_equal(value[:5], original)
        np.testing.assert_array_equal(value[5:], np.repeat(original[-1:], 3, axis=0))
        assert value.dtype == original.dtype
    np.testing.assert_array_equal(filled.target_mask[:5], batch.target_mask)
    assert not filled.target_mask[5:].any()
    assert filled_to(batch, 5) is batch and filled_to(batch, 3) is batch
    assert batch.target_mask.shape == (5, 2)  # the caller's arrays are not written


def test_only_host_batches_with_a_mask_are_filled() -> None:
    assert fillable(make_batch(1, 5))
    assert not fillable(make_batch(1, 5, mask=False))
    assert not fillable(make_batch(1, 5).replace(target=jnp.zeros((5, 2))))
    with pytest.raises(
        ValueError, match="filled_to: the batch needs NumPy arrays and a target_mask"
    ):
        filled_to(make_batch(1, 5, mask=False), 8)


def test_evaluate_runs_a_short_batch_on_the_wider_batches_forward() -> None:
    state = fresh_state()
    full, short = make_batch(2, 8), make_batch(3, 5)
    evaluate(state, [full])
    with model_programs() as programs:
        loss = evaluate(state, [full, short])
    assert programs == []
    assert loss == pytest.approx(reference_loss(state, [full, short]), rel=1e-5)
    # A short batch first is not filled (its width is the widest yet): its own program.
    with model_programs() as programs:
        assert evaluate(state, [short, full]) == pytest.approx(loss, rel=1e-6)
    assert programs


def test_fit_trains_a_short_batch_on_the_wider_batches_step_with_the_same_update() -> None:
    train = [make_batch(4, 8), make_batch(5, 5), make_batch(6, 8)]
    val = [make_batch(7, 8), make_batch(8, 3)]
    warm = fresh_state()  # the 8-row step and forward compiled before counting
    evaluate(warm, [val[0]])
    train_step(warm, train[0], jax.random.key(0))
    with model_programs() as programs:
        result = fit(fresh_state(), train, val, epochs=1, seed=3, quiet=True)
    assert programs == []
    # The same updates, batch by batch, without filling (the model has no dropout).
    state = fresh_state()
    for step, batch in enumerate(train):
        state, _ = train_step(state, batch, step_key(jax.random.key(3), step))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        result.state.params,
        copy_state(state).params,
    )
    assert result.history["val_loss"][-1] == pytest.approx(reference_loss(state, val), rel=1e-5)


def test_a_resumed_fit_over_a_callable_fills_as_the_uninterrupted_run(tmp_path) -> None:
    epoch = [make_batch(10 + i, 8) for i in range(3)] + [make_batch(13, 6)]
    whole = fit(fresh_state(), lambda e: epoch, None, epochs=1, seed=5, quiet=True)
    run = tmp_path / "run"
    fit(fresh_state(), lambda e: epoch, None, epochs=1, seed=5, quiet=True, max_steps=3,
        checkpoint_dir=run)  # fmt: skip
    with model_programs() as programs:  # the 6-row batch: filled to 8, no program of its own
        resumed = fit(fresh_state(), lambda e: epoch, None, epochs=1, seed=5, quiet=True,
                      checkpoint_dir=run, resume=True)  # fmt: skip
    assert programs == []
    jax.tree.map(np.testing.assert_array_equal, resumed.state.params, whole.state.params)


def test_a_short_batch_splits_over_a_mesh_at_the_width_it_is_filled_to() -> None:
    from jax.sharding import AbstractMesh

    from tft_jax.steps import _check_mesh_divides

    mesh = AbstractMesh((4,), ("data",))
    _check_mesh_divides("train_batches", [make_batch(0, 8), make_batch(1, 5)], mesh, fills=True)
    refused = r"fit: train_batches\[1\] is a global batch of 5 windows"
    with pytest.raises(ValueError, match=refused):  # no mask to mark the copies
        _check_mesh_divides(
            "train_batches", [make_batch(0, 8), make_batch(1, 5, False)], mesh, True
        )
    with pytest.raises(ValueError, match=refused):
        _check_mesh_divides("train_batches", [make_batch(0, 8), make_batch(1, 5)], mesh, False)


def test_fill_short_batches_false_leaves_a_model_with_batch_statistics_exact() -> None:
    tx = make_optimizer(1e-2, clip_norm=1.0, weight_decay=0.0)
    state = create_train_state(Linear(centered=True), tx, jax.random.key(0), make_batch(0, 8))
    full, short = make_batch(2, 8), make_batch(3, 5)
    weights = [float(np.count_nonzero(b.target_mask)) for b in (full, short)]
    apart = np.average([evaluate(state, [full]), evaluate(state, [short])], weights=weights)
    assert evaluate(state, [full, short], fill_short_batches=False) == pytest.approx(apart)
    assert evaluate(state, [full, short]) != pytest.approx(apart, rel=1e-6)  # what filling does
    with pytest.raises(TypeError, match="evaluate: fill_short_batches must be a bool"):
        evaluate(state, [full], fill_short_batches="no")
    with pytest.raises(TypeError, match="fit: fill_short_batches must be a bool"):
        fit(state, [full], None, epochs=1, quiet=True, fill_short_batches=None)


def test_a_resume_fills_as_the_uninterrupted_run_whose_widest_batch_came_an_epoch_before(
    tmp_path,
) -> None:
    wide = [make_batch(20 + i, 8) for i in range(3)]
    short = make_batch(23, 7)
    epochs = {0: [*wide, short], 1: [short, *wide]}  # the short one first in epoch 1

    def source(epoch: int) -> list[Batch]:
        return epochs[epoch]

    whole = fit(fresh_state(), source, None, epochs=2, seed=5, quiet=True)
    run = tmp_path / "run"
    fit(fresh_state(), source, None, epochs=1, seed=5, quiet=True,
        checkpoint_dir=run)  # fmt: skip  # saved at epoch 0's end (a constant rate)
    with model_programs() as programs:  # epoch 1's 7 rows: filled to 8, as in `whole`
        resumed = fit(fresh_state(), source, None, epochs=2, seed=5, quiet=True,
                      checkpoint_dir=run, resume=True)  # fmt: skip
    assert programs == []
    jax.tree.map(np.testing.assert_array_equal, resumed.state.params, whole.state.params)


def test_calibration_steps_need_batches_the_mesh_splits_as_they_are() -> None:
    from jax.sharding import AbstractMesh

    batches = [make_batch(0, 8), make_batch(1, 5)]  # not filled while observers calibrate
    model = QATModel(Linear(), QATConfig(bits=8))
    tx, key = make_optimizer(1e-2), jax.random.key(0)
    state = create_train_state(model, tx, key, batches[0], quantiles=LEVELS)
    with pytest.raises(ValueError, match=r"fit: train_batches\[1\] is a global batch of 5"):
        fit(state, batches, None, epochs=1, quiet=True, calibrate_steps=1,
            mesh=AbstractMesh((4,), ("data",)))  # fmt: skip
