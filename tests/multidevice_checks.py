"""Data-parallel checks on 8 simulated CPU devices; run in a subprocess by test_distributed.py.

The device count must be fixed before JAX starts, so these checks cannot share
the pytest process. Each check raises AssertionError with a message; the
script prints one line per passed check.
"""

from __future__ import annotations

import os
import sys
import tempfile

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
jax.config.update("jax_compilation_cache_dir", os.path.join(_ROOT, ".jax_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
import numpy as np  # noqa: E402
import optax  # noqa: E402

from qat import QATConfig, QATTemporalFusionTransformer  # noqa: E402
from tft_jax import TemporalFusionTransformer, TFTConfig  # noqa: E402
from tft_jax.batch_padding import filled_to  # noqa: E402
from tft_jax.checkpoint import TrainingCheckpointer  # noqa: E402
from tft_jax.distributed import data_mesh, place_state, replicated, shard_batch  # noqa: E402
from tft_jax.forecaster.predictors import make_predictor  # noqa: E402
from tft_jax.train import Batch, create_train_state, fit, step_key, train_step  # noqa: E402

CONFIG = TFTConfig(
    num_static_features=2,
    num_known_features=2,
    num_observed_features=3,
    hidden_dim=16,
    num_heads=2,
    sequence_length=6,
    prediction_horizon=3,
    dropout_rate=0.0,
    static_categorical_cardinalities=(3,),
)
GLOBAL_BATCH = 16


def make_batch(seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    return Batch(
        static=normal(GLOBAL_BATCH, 2),
        historical=normal(GLOBAL_BATCH, 6, 3),
        future=normal(GLOBAL_BATCH, 3, 2),
        known_history=None,
        static_categorical=rng.integers(0, 3, size=(GLOBAL_BATCH, 1)).astype(np.int32),
        target=normal(GLOBAL_BATCH, 3),
    )


# Plain SGD after clipping: Adam's first steps are sign-like, so a gradient that
# is ~0 up to summation order would turn into a full-size difference. One
# optimizer object for every state: the optimizer is static in the jitted step,
# so states that share it (and a mesh) share one traced and compiled step.
TX = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))
_INITIAL: dict[type, tuple] = {}  # host copy of the initial state, per model class


def fresh_state(model, mesh, fsdp=False):
    """The initial state of `model` (always built from CONFIG) placed on `mesh` in new buffers.

    The state is initialized once per model class and kept on the host: each
    call places fresh device copies, since `train_step` donates its state.
    """
    if type(model) not in _INITIAL:
        state = create_train_state(model, TX, jax.random.key(0), make_batch(0))
        _INITIAL[type(model)] = (model, jax.tree.map(np.array, state))
    initial_model, state = _INITIAL[type(model)]
    assert initial_model == model, "fresh_state caches one model per class"
    return place_state(state, mesh, fsdp=fsdp)


def run_steps(model, mesh, steps, calibrate=None, fsdp=False, state=None):
    state = fresh_state(model, mesh, fsdp) if state is None else state
    for step in range(steps):
        batch = shard_batch(make_batch(step + 1), mesh)
        state, _ = train_step(state, batch, jax.random.key(step), calibrate=calibrate)
    return state


def assert_trees_close(a, b, what, atol=2e-5):
    for (path, x), y in zip(
        jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(x),
            np.asarray(y),
            rtol=1e-4,
            atol=atol,
            err_msg=f"{what}: {jax.tree_util.keystr(path)} differs",
        )


def check_fp32_sharded_step_equals_single_device() -> None:
    model = TemporalFusionTransformer(CONFIG)
    single = run_steps(model, data_mesh(1), 3)
    sharded = run_steps(model, data_mesh(8), 3)
    assert len(sharded.params["quantile_head"]["kernel"].sharding.device_set) == 8
    assert_trees_close(sharded.params, single.params, "fp32 params")


def check_fsdp_sharded_step_equals_single_device() -> None:
    model = TemporalFusionTransformer(CONFIG)
    single = run_steps(model, data_mesh(1), 2)
    sharded = run_steps(model, data_mesh(8), 2, fsdp=True)
    assert_trees_close(sharded.params, single.params, "fsdp params")


def check_qat_sharded_step_equals_single_device_and_replicas_agree() -> None:
    model = QATTemporalFusionTransformer(CONFIG, QATConfig())
    single = run_steps(model, data_mesh(1), 3, calibrate=True)
    sharded = run_steps(model, data_mesh(8), 3, calibrate=True)
    assert_trees_close(sharded.params, single.params, "qat params")
    assert_trees_close(sharded.model_state, single.model_state, "qat observers", atol=1e-6)
    for path, leaf in jax.tree_util.tree_flatten_with_path(sharded.model_state)[0]:
        shards = [np.asarray(shard.data) for shard in leaf.addressable_shards]
        assert len(shards) == 8, jax.tree_util.keystr(path)
        for shard in shards[1:]:
            np.testing.assert_array_equal(
                shard, shards[0], err_msg=f"replicas disagree on {jax.tree_util.keystr(path)}"
            )


def check_checkpoint_from_8_devices_restores_on_1_and_continues_identically() -> None:
    model = TemporalFusionTransformer(CONFIG)
    mesh8, mesh1 = data_mesh(8), data_mesh(1)
    state8 = run_steps(model, mesh8, 2)
    with tempfile.TemporaryDirectory() as directory:
        with TrainingCheckpointer(directory) as checkpointer:
            checkpointer.save_latest(state8, jax.random.key(0), {"step": 2})
        template = fresh_state(model, mesh1)
        with TrainingCheckpointer(directory) as checkpointer:
            restored = checkpointer.restore_latest(template)
    assert restored is not None and restored.step == 2
    assert all(
        leaf.sharding.device_set == {jax.devices()[0]}
        for leaf in jax.tree.leaves(restored.state.params)
    )
    assert_trees_close(restored.state.params, state8.params, "restored params", atol=0)
    continued1 = run_steps(model, mesh1, 1, state=restored.state)
    continued8 = run_steps(model, mesh8, 1, state=place_state(state8, mesh8))
    assert_trees_close(continued1.params, continued8.params, "continued params")


def check_predictors_split_what_the_devices_can_and_forecast_as_one_device() -> None:
    """A `Forecaster` predictor: batches of 16 split over the 8 devices, as `fit`
    validates, and a batch of 3 on one device, each equal to `apply` on one device."""
    state = jax.tree.map(np.asarray, fresh_state(TemporalFusionTransformer(CONFIG), data_mesh(1)))
    predict = make_predictor("fp32", CONFIG, state.variables)
    apply = jax.jit(TemporalFusionTransformer(CONFIG).apply, static_argnames="deterministic")
    device = jax.devices()[0]
    for rows in (GLOBAL_BATCH, 3):
        batch = jax.tree.map(lambda x, rows=rows: x[:rows], make_batch(7))
        output = predict(batch)
        variables, static, historical, future, codes = jax.device_put(
            (state.variables, batch.static, batch.historical, batch.future,
             batch.static_categorical),
            device,
        )  # fmt: skip
        expected = apply(
            variables, static, historical, future, static_categorical=codes, deterministic=True
        )
        devices = len(output.quantiles.sharding.device_set)
        assert devices == (8 if rows == GLOBAL_BATCH else 1), f"{rows} rows on {devices} devices"
        assert_trees_close(output, expected, f"forecast of {rows} windows", atol=1e-5)


def check_clear_errors() -> None:
    mesh = data_mesh(8)
    batch = make_batch(0)
    odd = jax.tree.map(lambda x: x[:12], batch)
    try:
        shard_batch(odd, mesh)
    except ValueError as error:
        assert "12" in str(error) and "8" in str(error), error
    else:
        raise AssertionError("a batch of 12 over 8 devices was accepted")
    try:
        data_mesh(9)
    except ValueError as error:
        assert "9" in str(error) and "8 available" in str(error), error
    else:
        raise AssertionError("a mesh of 9 devices on 8 was accepted")
    assert replicated(mesh).is_fully_replicated


def check_placement_commits_unless_the_mesh_is_the_default_device_alone() -> None:
    """Uncommitted on `data_mesh(1)` (the programs of direct calls); committed to a
    mesh of another device, or split over several."""
    tree, batch = {"w": np.ones((4, 2), np.float32)}, make_batch(0)
    on_default = place_state(tree, data_mesh(1))["w"], shard_batch(batch, data_mesh(1)).target
    assert not any(leaf.committed for leaf in on_default)
    third = data_mesh(devices=[jax.devices()[3]])
    on_third = place_state(tree, third)["w"], shard_batch(batch, third).target
    assert all(leaf.committed and leaf.devices() == {jax.devices()[3]} for leaf in on_third)
    split = shard_batch(batch, data_mesh(8)).target
    assert split.committed and len(split.sharding.device_set) == 8
    elsewhere = jax.device_put(batch.target, jax.devices()[3])  # committed: moved to the mesh
    assert shard_batch(elsewhere, data_mesh(1)).devices() == {jax.devices()[0]}


def check_fit_fills_a_short_batch_that_the_mesh_then_splits() -> None:
    """[16, 16, 5] over 8 devices: the 5 filled up to 16 with unobserved rows trains as the
    one-device steps on the filled batches do."""
    batches = [make_batch(1), make_batch(2), filled_to_mask(make_batch(3), 5)]
    model = TemporalFusionTransformer(CONFIG)
    result = fit(fresh_state(model, data_mesh(8)), batches, None, epochs=1, seed=0, quiet=True,
                 mesh=data_mesh(8))  # fmt: skip
    state = fresh_state(model, data_mesh(1))
    for step, batch in enumerate(batches):
        wide = filled_to(batch, GLOBAL_BATCH) if batch.target_mask is not None else batch
        state, _ = train_step(state, wide, step_key(jax.random.key(0), step))
    assert_trees_close(result.state.params, state.params, "filled-batch params", atol=1e-5)


def filled_to_mask(batch: Batch, rows: int) -> Batch:
    """The first `rows` rows of `batch`, with a target_mask (all observed)."""
    first = jax.tree.map(lambda x: x[:rows], batch)
    return first.replace(target_mask=np.ones_like(first.target))


CHECKS = [
    check_fp32_sharded_step_equals_single_device,
    check_fsdp_sharded_step_equals_single_device,
    check_qat_sharded_step_equals_single_device_and_replicas_agree,
    check_checkpoint_from_8_devices_restores_on_1_and_continues_identically,
    check_predictors_split_what_the_devices_can_and_forecast_as_one_device,
    check_clear_errors,
    check_placement_commits_unless_the_mesh_is_the_default_device_alone,
    check_fit_fills_a_short_batch_that_the_mesh_then_splits,
]


def main(names: list[str]) -> None:
    assert jax.device_count() == 8, f"expected 8 simulated devices, got {jax.device_count()}"
    for check in CHECKS:
        if names and check.__name__ not in names:
            continue
        check()
        print(f"passed {check.__name__}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
