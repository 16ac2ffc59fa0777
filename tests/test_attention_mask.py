"""The attention block's user mask, its positional-encoding switch, `deterministic`, and its
`causal` and `return_weights` flags (bools, concrete under `jit`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.block_inputs import _RNG
from tft_jax import TemporalSelfAttention, sinusoidal_encoding

HIDDEN, HEADS = 8, 2
HEAD_DIM = HIDDEN // HEADS
BATCH, STEPS = 2, 5


@functools.cache
def block(flash: bool = False, positional: bool = True) -> TemporalSelfAttention:
    return TemporalSelfAttention(
        HIDDEN, HEADS, use_flash_attention=flash, use_positional_encoding=positional
    )


@functools.cache
def variables() -> dict:
    return jax.jit(block().init)(jax.random.key(0), jnp.zeros((BATCH, STEPS, HIDDEN)))


@functools.partial(jax.jit, static_argnames=("causal", "flash", "positional"))
def apply(params, x, mask, *, causal, flash=False, positional=True):
    return block(flash, positional).apply(
        params, x, causal=causal, deterministic=True, return_weights=True, mask=mask
    )


def numpy_block(params, x, allowed, positional=True):
    """Float64 reference; `allowed (B, heads, T, T)`, a row with no allowed key attends nowhere."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
    batch, steps, _ = x.shape
    h = x.astype(np.float64)
    if positional:
        h = h + sinusoidal_encoding(steps, HIDDEN)
    out = np.zeros_like(h)
    weights = np.zeros((batch, HEADS, steps, steps))
    for b in range(batch):
        q = h[b] @ p["query"]["kernel"] + p["query"]["bias"]
        k = h[b] @ p["key"]["kernel"] + p["key"]["bias"]
        v = h[b] @ p["value"]["kernel"] + p["value"]["bias"]
        for j in range(HEADS):
            cols = slice(j * HEAD_DIM, (j + 1) * HEAD_DIM)
            logits = q[:, cols] @ k[:, cols].T / np.sqrt(HEAD_DIM)
            for t in range(steps):
                keys = allowed[b, j, t]
                if not keys.any():
                    continue
                e = np.exp(logits[t, keys] - logits[t, keys].max())
                weights[b, j, t, keys] = e / e.sum()
            out[b, :, cols] = weights[b, j] @ v[:, cols]
    y = h + out @ p["out"]["kernel"] + p["out"]["bias"]
    mean = y.mean(-1, keepdims=True)
    var = ((y - mean) ** 2).mean(-1, keepdims=True)
    normed = (y - mean) / np.sqrt(var + 1e-6)
    return normed * p["layer_norm"]["scale"] + p["layer_norm"]["bias"], weights


def inputs(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(BATCH, STEPS, HIDDEN)).astype(np.float32)


def padding() -> np.ndarray:
    valid = np.ones((BATCH, STEPS), bool)
    valid[0, 3:] = False  # sample 0: two padded steps at the end
    valid[1, :2] = False  # sample 1: two padded steps at the start
    return valid


def pair_mask() -> np.ndarray:
    """`(B, heads, T, T)` with one fully masked query row (sample 1, head 0, step 2)."""
    allowed = np.random.default_rng(3).random((BATCH, HEADS, STEPS, STEPS)) > 0.4
    allowed[1, 0, 2] = False
    return allowed


def reference_mask(user: np.ndarray, causal: bool) -> np.ndarray:
    if user.ndim == 2:
        user = np.broadcast_to(user[:, None, None, :], (BATCH, HEADS, STEPS, STEPS))
    user = np.broadcast_to(user, (BATCH, HEADS, STEPS, STEPS))
    return user & np.tril(np.ones((STEPS, STEPS), bool)) if causal else user


@pytest.mark.parametrize("flash", [False, True], ids=["default", "flash"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ["padding", "per_head", "shared_heads"])
def test_masked_attention_matches_numpy_reference(kind, causal, flash):
    user = {
        "padding": padding(),
        "per_head": pair_mask(),
        "shared_heads": pair_mask()[:, :1],
    }[kind]
    params, x = variables(), inputs()
    y, weights = apply(params, x, user, causal=causal, flash=flash)
    expected_y, expected_weights = numpy_block(params, x, reference_mask(user, causal))
    assert np.isfinite(np.asarray(y)).all()
    np.testing.assert_allclose(y, expected_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flash", [False, True], ids=["default", "flash"])
def test_fully_masked_rows_attend_to_nothing_without_nan(flash):
    params, x = variables(), inputs(1)
    nothing = np.zeros((BATCH, STEPS), bool)
    y, weights = apply(params, x, nothing, causal=True, flash=flash)
    assert not np.asarray(weights).any()
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
    # Zero attention output: the block is LayerNorm(h + b_out) at every step.
    h = x.astype(np.float64) + sinusoidal_encoding(STEPS, HIDDEN) + p["out"]["bias"]
    normed = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-6)
    expected = normed * p["layer_norm"]["scale"] + p["layer_norm"]["bias"]
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


def test_padded_steps_do_not_change_the_valid_outputs():
    params, x = variables(), inputs(2)
    valid = padding()
    changed = x.copy()
    changed[~valid] = 100.0
    y, _ = apply(params, x, valid, causal=False)
    y_changed, _ = apply(params, changed, valid, causal=False)
    np.testing.assert_allclose(np.asarray(y)[valid], np.asarray(y_changed)[valid], atol=1e-5)


def test_without_positional_encoding_the_block_is_permutation_equivariant():
    params, x = variables(), inputs(4)
    everything = np.ones((BATCH, STEPS), bool)
    y, _ = apply(params, x, everything, causal=False, positional=False)
    expected, _ = numpy_block(params, x, reference_mask(everything, False), positional=False)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    order = np.array([3, 0, 4, 1, 2])
    y_permuted, _ = apply(params, x[:, order], everything, causal=False, positional=False)
    np.testing.assert_allclose(np.asarray(y)[:, order], y_permuted, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        (np.ones((BATCH, STEPS), np.int32), TypeError, "boolean"),
        (np.ones((BATCH, STEPS + 1), bool), ValueError, r"\(2, 5\).*got \(2, 6\)"),
        (np.ones((BATCH, 3, STEPS, STEPS), bool), ValueError, r"1 or 2.*got \(2, 3, 5, 5\)"),
        (np.ones((STEPS, STEPS), bool), ValueError, r"got \(5, 5\)"),
    ],
)
def test_a_mask_of_the_wrong_shape_or_dtype_is_named(mask, error, match):
    with pytest.raises(error, match=match):
        block().apply(variables(), inputs(), mask=mask)


def test_dropout_without_deterministic_raises_and_without_dropout_it_is_optional():
    x = jnp.asarray(inputs())
    params = variables()
    with pytest.raises(ValueError, match="deterministic"):
        TemporalSelfAttention(HIDDEN, HEADS, dropout_rate=0.1).apply(params, x)
    np.testing.assert_array_equal(
        block().apply(params, x), block().apply(params, x, deterministic=True)
    )
    # init needs no `deterministic`: the parameters do not depend on it.
    TemporalSelfAttention(HIDDEN, HEADS, dropout_rate=0.1).init(jax.random.key(0), x)


@pytest.fixture(scope="module")
def attention_block() -> tuple[TemporalSelfAttention, dict, np.ndarray]:
    block = TemporalSelfAttention(4, 2)
    x = _RNG.normal(size=(1, 3, 4)).astype(np.float32)
    return block, block.init(jax.random.key(0), x), x


@pytest.mark.parametrize("name", ["causal", "return_weights"])
def test_attention_flags_must_be_bools_not_truthy_strings(attention_block, name):
    # causal="False" was truthy: the block silently ran causal.
    block, variables, x = attention_block
    with pytest.raises(TypeError, match=f"{name} must be a bool, got str 'False'"):
        block.apply(variables, x, **{name: "False"})


@pytest.mark.parametrize("name", ["causal", "return_weights"])
def test_attention_flags_traced_under_jit_are_named(attention_block, name):
    block, variables, x = attention_block
    run = jax.jit(lambda flag: block.apply(variables, x, **{name: flag}))
    with pytest.raises(TypeError, match=f"{name} must be a concrete Python bool"):
        run(jnp.asarray(True))


def test_attention_flags_accept_numpy_bools(attention_block):
    block, variables, x = attention_block
    np.testing.assert_array_equal(
        block.apply(variables, x, causal=np.bool_(False)), block.apply(variables, x, causal=False)
    )
