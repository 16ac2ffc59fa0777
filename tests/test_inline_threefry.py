"""The inline Threefry keys draw JAX's exact bits, without a loop on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import tft_jax.train as train
from tft_jax import TemporalFusionTransformer, TFTConfig, inline_threefry
from tft_jax.inline_threefry import INLINE_THREEFRY, inline_threefry_key

# A draw size for the tests that raise the inline threshold (by default every draw is inline).
LARGE = 1 << 12

# These tests run at the library's inline threshold (the suite raises it).
pytestmark = pytest.mark.usefixtures("library_inline_threshold")


SHAPES = [(1,), (7,), (LARGE - 1,), (LARGE,), (3, 171, 131), (2, 5, 64, 103)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
def test_bits_equal_the_builtin_threefry_bits(shape: tuple[int, ...], dtype: type) -> None:
    key = jax.random.key(20261201)
    want = jax.random.bits(key, shape, dtype)
    got = jax.random.bits(inline_threefry_key(key), shape, dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_threefry_hash_matches_the_published_known_answer() -> None:
    # Salmon et al.'s Random123 known-answer vector for Threefry-2x32-20 (also
    # JAX's own test): key (0x13198a2e, 0x03707344), counter (0x243f6a88, 0x85a308d3).
    key = jnp.array([0x13198A2E, 0x03707344], jnp.uint32)
    hi, lo = inline_threefry.threefry2x32(
        key, jnp.array([0x243F6A88], jnp.uint32), jnp.array([0x85A308D3], jnp.uint32)
    )
    assert (int(hi[0]), int(lo[0])) == (0xC4923A9C, 0x483DF7A0)


def test_key_derivations_and_draws_equal_the_builtin_ones() -> None:
    key = jax.random.key(7)
    inline = inline_threefry_key(key)
    assert jax.random.key_impl(inline) == INLINE_THREEFRY
    for derive in (lambda k: jax.random.fold_in(k, 12345), lambda k: jax.random.split(k, 3)):
        np.testing.assert_array_equal(
            np.asarray(jax.random.key_data(derive(inline))),
            np.asarray(jax.random.key_data(derive(key))),
        )
    shape = (64, 40, 32)  # above the inline size
    for draw in (
        lambda k: jax.random.bernoulli(k, 0.9, shape),
        lambda k: jax.random.uniform(k, shape),
        lambda k: jax.random.normal(jax.random.fold_in(k, 3), shape),
    ):
        np.testing.assert_array_equal(np.asarray(draw(inline)), np.asarray(draw(key)))


def test_flax_dropout_draws_the_same_mask_from_either_key() -> None:
    x = jnp.ones((4, 128, 160))
    layer = nn.Dropout(0.3, deterministic=False)
    key = jax.random.key(1)
    want = layer.apply({}, x, rngs={"dropout": key})
    got = layer.apply({}, x, rngs={"dropout": inline_threefry_key(key)})
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert 0.25 < float(jnp.mean(want == 0)) < 0.35


def test_draws_lower_without_a_loop_and_those_below_a_raised_threshold_keep_jax_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def text(key: jax.Array, shape: tuple[int, ...]) -> str:
        return jax.jit(lambda k: jax.random.bits(k, shape)).lower(key).as_text()

    key = inline_threefry_key(jax.random.key(0))
    assert "while" not in text(key, (1,)) and "while" not in text(key, (LARGE,))
    assert "while" in text(jax.random.key(0), (LARGE,))  # the built-in rolled loop
    monkeypatch.setattr(inline_threefry, "INLINE_MIN_SIZE", LARGE)
    assert "while" not in text(key, (LARGE,))
    assert "while" in text(key, (LARGE - 1,))
    np.testing.assert_array_equal(
        np.asarray(jax.random.bits(key, (LARGE - 1,))),
        np.asarray(jax.random.bits(jax.random.key(0), (LARGE - 1,))),
    )


def test_raw_keys_are_retyped_and_other_implementations_pass_through() -> None:
    raw = jax.random.PRNGKey(5)
    retyped = inline_threefry_key(raw)
    assert jax.random.key_impl(retyped) == INLINE_THREEFRY
    np.testing.assert_array_equal(
        np.asarray(jax.random.bits(retyped, (LARGE,))),
        np.asarray(jax.random.bits(raw, (LARGE,))),
    )
    for impl in ("rbg", "unsafe_rbg"):
        other = jax.random.key(5, impl=impl)
        assert inline_threefry_key(other) is other


def test_without_partitionable_threefry_every_draw_is_jax_s_own() -> None:
    key = jax.random.key(9)
    with jax.threefry_partitionable(False):
        want = jax.random.bits(key, (LARGE + 3,))
        got = jax.random.bits(inline_threefry_key(key), (LARGE + 3,))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_train_step_dropout_equals_the_model_applied_with_the_given_key() -> None:
    # The step draws every mask inline (the default threshold), the model JAX's way.
    config = TFTConfig(
        num_static_features=0,
        num_known_features=1,
        num_observed_features=2,
        hidden_dim=8,
        num_heads=2,
        sequence_length=5,
        prediction_horizon=2,
        dropout_rate=0.5,
    )
    rng = np.random.default_rng(0)
    batch = train.Batch(
        static=None,
        historical=rng.normal(size=(3, 5, 2)).astype(np.float32),
        future=rng.normal(size=(3, 2, 1)).astype(np.float32),
        known_history=None,
        static_categorical=None,
        target=rng.normal(size=(3, 2)).astype(np.float32),
    )
    model = TemporalFusionTransformer(config)
    state = train.create_train_state(model, train.make_optimizer(1e-3), jax.random.key(0), batch)
    params = jax.tree.map(np.array, state.params)

    @jax.jit  # one compile for both keys; eagerly, each op of the model compiles on its own
    def loss_of(key: jax.Array) -> jax.Array:
        out = model.apply(
            {"params": params},
            None,
            batch.historical,
            batch.future,
            deterministic=False,
            rngs={"dropout": key},
        )
        return train.batch_loss(out, batch, config.quantiles)[0]

    def loss_with(key: jax.Array) -> float:
        return float(loss_of(key))

    key = jax.random.key(42)
    _, metrics = train.train_step(state, batch, key)
    np.testing.assert_allclose(float(metrics["loss"]), loss_with(key), rtol=1e-6)
    # The masks matter at this rate: another key gives another loss.
    assert abs(loss_with(jax.random.key(43)) - loss_with(key)) > 1e-3


# ---------------------------------------------------------------------------
# Inline Threefry draws beyond the raw bits


@pytest.fixture
def inline_every_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inline_threefry, "INLINE_MIN_SIZE", 1)


DRAWS = {
    "scalar bits": lambda key: jax.random.bits(key, ()),
    "empty": lambda key: jax.random.bits(key, (0, 4)),
    "uniform bfloat16": lambda key: jax.random.uniform(key, (33,), jnp.bfloat16),
    "uniform float16": lambda key: jax.random.uniform(key, (33,), jnp.float16),
    "bernoulli near 1": lambda key: jax.random.bernoulli(key, 0.999, (257,)),
    "normal": lambda key: jax.random.normal(key, (4, 5)),
    "randint": lambda key: jax.random.randint(key, (50,), 0, 1000),
    "permutation": lambda key: jax.random.permutation(key, 20),
    "vmapped over split keys": lambda key: jax.vmap(lambda k: jax.random.uniform(k, (3,)))(
        jax.random.split(key, 4)
    ),
}


@pytest.mark.usefixtures("inline_every_draw")
@pytest.mark.parametrize("name", list(DRAWS))
def test_inline_key_draws_equal_jax_s_threefry_draws_bit_for_bit(name: str) -> None:
    key = jax.random.key(7)
    draw = jax.jit(DRAWS[name])
    want, got = np.asarray(draw(key)), np.asarray(draw(inline_threefry_key(key)))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8))
