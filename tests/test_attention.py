"""The temporal self-attention block and its kernel: reference values, masks, causality,
gradient flow, argument checks, and bfloat16 weights against a float64 softmax."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import train_step
from tft_jax import (
    AttentionHead,
    PositionalEncoding,
    TemporalFusionTransformer,
    TemporalSelfAttention,
    causal_mask,
    scaled_dot_product_attention,
    sinusoidal_encoding,
)

HIDDEN, HEADS = 16, 4
HEAD_DIM = HIDDEN // HEADS


@functools.cache
def block(dropout_rate: float = 0.0, flash: bool = False) -> TemporalSelfAttention:
    return TemporalSelfAttention(HIDDEN, HEADS, dropout_rate, use_flash_attention=flash)


@functools.cache
def params_for(steps: int, batch: int = 2) -> dict:
    x = jnp.zeros((batch, steps, HIDDEN))
    return jax.jit(block().init)(jax.random.key(0), x)


@functools.partial(
    jax.jit, static_argnames=("causal", "deterministic", "dropout_rate", "flash", "weights")
)
def apply(
    variables,
    x,
    rng,
    temperature=1.0,
    *,
    causal=True,
    deterministic=True,
    dropout_rate=0.0,
    flash=False,
    weights=False,
):
    return block(dropout_rate, flash).apply(
        variables,
        x,
        causal=causal,
        deterministic=deterministic,
        return_weights=weights,
        temperature=temperature,
        rngs={"dropout": rng},
    )


def random_input(batch: int, steps: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(batch, steps, HIDDEN)).astype(np.float32)


def numpy_layer_norm(x, scale, bias, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def numpy_block(params, x, causal, temperature=1.0):
    """An independent float64 implementation of the block's formula."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
    batch, steps, _ = x.shape
    h = x.astype(np.float64) + sinusoidal_encoding(steps, HIDDEN)
    out = np.zeros_like(h)
    for b in range(batch):
        q = h[b] @ p["query"]["kernel"] + p["query"]["bias"]
        k = h[b] @ p["key"]["kernel"] + p["key"]["bias"]
        v = h[b] @ p["value"]["kernel"] + p["value"]["bias"]
        for j in range(HEADS):
            cols = slice(j * HEAD_DIM, (j + 1) * HEAD_DIM)
            logits = q[:, cols] @ k[:, cols].T / (np.sqrt(HEAD_DIM) * temperature)
            if causal:
                logits = np.where(np.tril(np.ones((steps, steps), bool)), logits, -np.inf)
            w = np.exp(logits - logits.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            out[b, :, cols] = w @ v[:, cols]
    projected = out @ p["out"]["kernel"] + p["out"]["bias"]
    return numpy_layer_norm(h + projected, p["layer_norm"]["scale"], p["layer_norm"]["bias"])


@pytest.mark.parametrize("causal", [True, False])
def test_block_matches_independent_numpy_reference(causal):
    x = random_input(3, 7)
    params = params_for(7, 3)
    got = apply(params, x, jax.random.key(1), causal=causal)
    np.testing.assert_allclose(got, numpy_block(params, x, causal), rtol=1e-4, atol=1e-4)


def test_temperature_divides_the_logits():
    x = random_input(2, 7)
    params = params_for(7)
    got = apply(params, x, jax.random.key(1), 2.0)
    np.testing.assert_allclose(got, numpy_block(params, x, True, 2.0), rtol=1e-4, atol=1e-4)
    assert not np.allclose(got, apply(params, x, jax.random.key(1), 1.0), atol=1e-4)


def test_positional_encoding_is_the_interleaved_sinusoid():
    x = np.zeros((1, 5, 6), np.float32)
    pe = np.asarray(PositionalEncoding(6).apply({}, x))[0]
    for t in range(5):
        for i in range(3):
            angle = t / 10000 ** (2 * i / 6)
            assert pe[t, 2 * i] == pytest.approx(np.sin(angle), abs=1e-6)
            assert pe[t, 2 * i + 1] == pytest.approx(np.cos(angle), abs=1e-6)


def numpy_sinusoid(steps: int, dim: int) -> np.ndarray:
    """The interleaved encoding in float64, written here from Vaswani et al. (2017)."""
    angles = np.arange(steps, dtype=np.float64)[:, None] / 10000.0 ** (np.arange(0, dim, 2) / dim)
    encoding = np.empty((steps, dim))
    encoding[:, 0::2], encoding[:, 1::2] = np.sin(angles), np.cos(angles[:, : dim // 2])
    return encoding


def test_float64_inputs_get_the_encoding_in_float64_and_float32_ones_keep_theirs():
    # The encoding was always float32: a float64 input got it rounded (errors ~3e-8).
    steps, dim = 50, 16
    reference = numpy_sinusoid(steps, dim)
    with jax.enable_x64(True):
        out = PositionalEncoding(dim).apply({}, jnp.zeros((1, steps, dim), jnp.float64))
        assert out.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(out)[0], reference, rtol=0, atol=1e-15)
        assert sinusoidal_encoding(steps, dim, np.float64).dtype == np.float64
    # float32 (x64 or not): the table rounded once from float64, as before.
    for x64 in (True, False):
        with jax.enable_x64(x64):
            out = PositionalEncoding(dim).apply({}, jnp.zeros((1, steps, dim), jnp.float32))
        assert out.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(out)[0], reference.astype(np.float32))
    assert sinusoidal_encoding(steps, dim).dtype == np.float32
    with pytest.raises(TypeError, match="sinusoidal_encoding: dtype must be a float dtype"):
        sinusoidal_encoding(steps, dim, np.int32)


def test_causal_output_ignores_future_inputs():
    x = random_input(2, 9)
    params = params_for(9)
    base = np.asarray(apply(params, x, jax.random.key(0)))
    for t in range(8):
        changed = x.copy()
        changed[:, t + 1 :] += 5.0
        out = np.asarray(apply(params, changed, jax.random.key(0)))
        np.testing.assert_array_equal(out[:, : t + 1], base[:, : t + 1])
        assert not np.allclose(out[:, t + 1 :], base[:, t + 1 :])


def test_non_causal_output_sees_future_inputs():
    x = random_input(2, 9)
    params = params_for(9)
    changed = x.copy()
    changed[:, -1] += 5.0
    base = apply(params, x, jax.random.key(0), causal=False)
    out = apply(params, changed, jax.random.key(0), causal=False)
    assert not np.allclose(np.asarray(out)[:, 0], np.asarray(base)[:, 0])


def test_causal_weights_are_lower_triangular_rows_summing_to_one():
    params = params_for(7)
    _, w = apply(params, random_input(2, 7), jax.random.key(0), weights=True)
    assert w.shape == (2, HEADS, 7, 7)
    np.testing.assert_array_equal(np.triu(np.asarray(w), 1), 0.0)
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_flash_path_matches_default_path(causal):
    x = random_input(2, 7)
    params = params_for(7)
    default, w_default = apply(params, x, jax.random.key(0), causal=causal, weights=True)
    flash, w_flash = apply(params, x, jax.random.key(0), causal=causal, flash=True, weights=True)
    np.testing.assert_allclose(flash, default, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w_flash, w_default, rtol=1e-6)


def test_dropout_is_active_only_when_not_deterministic():
    x = random_input(2, 7)
    params = params_for(7)
    key = jax.random.key(3)
    off = apply(params, x, key, dropout_rate=0.5)
    on = apply(params, x, key, dropout_rate=0.5, deterministic=False)
    again = apply(params, x, key, dropout_rate=0.5, deterministic=False)
    other = apply(params, x, jax.random.key(4), dropout_rate=0.5, deterministic=False)
    np.testing.assert_array_equal(off, apply(params, x, key))
    np.testing.assert_array_equal(on, again)
    assert not np.allclose(on, off)
    assert not np.allclose(on, other)


# Gradient flow: the twelve checks of the original suite, strict.


@functools.partial(jax.jit, static_argnames=("causal", "deterministic", "dropout_rate"))
def grads(variables, x, rng, temperature=1.0, *, causal=True, deterministic=True, dropout_rate=0.0):
    def loss(variables, x):
        y = block(dropout_rate).apply(
            variables,
            x,
            causal=causal,
            deterministic=deterministic,
            temperature=temperature,
            rngs={"dropout": rng},
        )
        # A loss that is not invariant to the LayerNorm's normalization.
        return jnp.sum(y * jnp.arange(y.size, dtype=y.dtype).reshape(y.shape) / y.size)

    return jax.grad(loss, argnums=(0, 1))(variables, x)


def assert_gradient_flows_everywhere(param_grads, input_grad):
    assert np.all(np.isfinite(input_grad)), "input gradient is not finite"
    assert np.linalg.norm(input_grad) > 1e-6, "input gradient is zero"
    flat = jax.tree_util.tree_flatten_with_path(param_grads)[0]
    dead = [jax.tree_util.keystr(path) for path, g in flat if not np.any(np.asarray(g) != 0)]
    assert not dead, f"parameters with zero gradient: {dead}"
    assert all(np.all(np.isfinite(g)) for _, g in flat)
    # Each head's Q/K/V column slice must receive gradient of its own.
    for name in ("query", "key", "value"):
        kernel = np.asarray(param_grads["params"][name]["kernel"])
        for head in range(HEADS):
            piece = kernel[:, head * HEAD_DIM : (head + 1) * HEAD_DIM]
            assert np.linalg.norm(piece) > 0, f"head {head} of {name} receives no gradient"


@pytest.mark.parametrize(
    "case",
    [
        dict(),
        dict(causal=False),
        dict(dropout_rate=0.5, deterministic=False),
        dict(temperature=2.0),
    ],
    ids=["causal", "non_causal", "dropout_training", "temperature_2"],
)
def test_gradient_reaches_every_parameter_head_and_input(case):
    x = random_input(4, 8)
    temperature = case.pop("temperature", 1.0)
    param_grads, input_grad = grads(params_for(8, 4), x, jax.random.key(7), temperature, **case)
    assert_gradient_flows_everywhere(param_grads, input_grad)


@pytest.mark.parametrize("batch", [1, 4])
def test_gradient_flows_for_batch_sizes_with_shared_parameters(batch):
    params = params_for(8, 4)
    param_grads, input_grad = grads(params, random_input(batch, 8), jax.random.key(0))
    assert input_grad.shape == (batch, 8, HIDDEN)
    assert_gradient_flows_everywhere(param_grads, input_grad)


def test_gradient_flows_over_a_long_sequence():
    x = random_input(2, 100)
    param_grads, input_grad = grads(params_for(100), x, jax.random.key(0))
    assert_gradient_flows_everywhere(param_grads, input_grad)
    # The first step still influences the last output through attention.
    assert np.linalg.norm(np.asarray(input_grad)[:, 0]) > 0


def test_positional_encoding_contributes_to_the_output():
    x = random_input(2, 7)
    params = params_for(7)
    y = np.asarray(apply(params, x, jax.random.key(0), causal=False))
    # Shifting the sequence by one step changes positions, so outputs are not shifted copies.
    rolled = np.asarray(apply(params, np.roll(x, 1, axis=1), jax.random.key(0), causal=False))
    assert not np.allclose(rolled[:, 1:], y[:, :-1], atol=1e-4)


# The attention kernel and its single head.


def test_fully_masked_row_gives_zeros_and_finite_gradients():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 4, 3)), jnp.float32) for _ in range(3))
    mask = np.ones((4, 4), bool)
    mask[2] = False
    out, w = scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_array_equal(out[0, 2], 0.0)
    np.testing.assert_array_equal(w[0, 2], 0.0)
    g = jax.grad(lambda q: jnp.sum(scaled_dot_product_attention(q, k, v, mask)[0]))(q)
    assert np.all(np.isfinite(g))


def test_attention_head_matches_numpy_with_mask_and_temperature():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 5, 8)).astype(np.float32)
    head = AttentionHead(8, 4)
    variables = jax.jit(head.init)(jax.random.key(0), x)
    mask = rng.random((2, 5, 5)) < 0.7
    mask[:, :, 0] = True
    out, w = head.apply(variables, x, mask=mask, temperature=1.5)
    # The float32 reference runs in NumPy, on the very parameter values.
    p = jax.tree.map(np.asarray, variables["params"])
    q = x @ p["query"]["kernel"] + p["query"]["bias"]
    k = x @ p["key"]["kernel"] + p["key"]["bias"]
    v = x @ p["value"]["kernel"] + p["value"]["bias"]
    logits = np.where(mask, q @ np.swapaxes(k, 1, 2) / (2.0 * 1.5), -np.inf)
    expected_w = np.exp(logits - logits.max(-1, keepdims=True))
    expected_w /= expected_w.sum(-1, keepdims=True)
    np.testing.assert_allclose(w, expected_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out, expected_w @ v, rtol=1e-5, atol=1e-5)


def test_causal_mask_convention():
    np.testing.assert_array_equal(causal_mask(3, 3), np.tril(np.ones((3, 3), bool)))
    np.testing.assert_array_equal(
        causal_mask(3, 3, attend_to_self=False), np.tril(np.ones((3, 3), bool), -1)
    )
    # Two queries at the end of five steps: the first sees steps 0..3, the second 0..4.
    np.testing.assert_array_equal(causal_mask(2, 5), [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


@pytest.mark.parametrize("num_queries, num_keys", [(3, 2), (-1, 3)])
def test_causal_mask_rejects_more_queries_than_steps(num_queries, num_keys):
    # (3, 2) used to give a first row with no allowed key, (-1, 3) an empty (0, 3) mask.
    with pytest.raises(ValueError, match=f"num_queries={num_queries}, num_keys={num_keys}"):
        causal_mask(num_queries, num_keys)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_attention_kernel_rejects_a_non_boolean_mask(dtype):
    # An additive mask (0 = attend, -inf = blocked) was read as `mask != 0`: inverted, silently.
    q = jnp.ones((1, 3, 2))
    additive = np.where(np.tril(np.ones((3, 3), bool)), 0, -1e9).astype(dtype)
    with pytest.raises(TypeError, match=f"mask must be boolean.*got dtype {np.dtype(dtype)}"):
        scaled_dot_product_attention(q, q, q, additive)


def test_attention_kernel_rejects_an_integer_query_instead_of_truncating_the_weights():
    # The float32 softmax was cast back to the query's int32: every weight 0, output 0.
    query = jnp.ones((1, 3, 2), jnp.int32)
    with pytest.raises(TypeError, match=r"query must be floating point.*int32"):
        scaled_dot_product_attention(query, jnp.ones((1, 3, 2)), jnp.ones((1, 3, 2)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        # 1.0 zeroed the whole output; a negative rate switched dropout off; both silently.
        (dict(dropout_rate=1.0), r"dropout_rate must be in \[0, 1\), got 1.0"),
        (dict(dropout_rate=-0.5), r"dropout_rate must be in \[0, 1\), got -0.5"),
        # 0 gave NaN weights; a negative temperature attended to the least similar keys.
        (dict(temperature=0.0), "temperature must be positive, got 0.0"),
        (dict(temperature=-1.0), "temperature must be positive, got -1.0"),
    ],
    ids=["dropout_one", "dropout_negative", "temperature_zero", "temperature_negative"],
)
def test_attention_kernel_rejects_a_dropout_rate_or_temperature_that_gives_garbage(kwargs, message):
    q = jnp.ones((1, 3, 2))
    with pytest.raises(ValueError, match=f"scaled_dot_product_attention: {message}"):
        scaled_dot_product_attention(
            q, q, q, dropout_rng=jax.random.key(0), deterministic=False, **kwargs
        )


def test_attention_kernel_needs_deterministic_with_a_dropout_rate():
    # Left out, deterministic defaulted to True: dropout_rate=0.5 with a dropout_rng
    # gave exactly the output without dropout, silently (the rule of tft_jax._dropout).
    q, k, v = (jnp.asarray(random_input(2, 5, seed)[..., :4]) for seed in range(3))
    rng = jax.random.key(0)
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: .*deterministic must"):
        scaled_dot_product_attention(q, k, v, dropout_rate=0.5, dropout_rng=rng)
    plain, weights = scaled_dot_product_attention(q, k, v)
    off, _ = scaled_dot_product_attention(q, k, v, dropout_rate=0.5, deterministic=True)
    on, on_weights = scaled_dot_product_attention(
        q, k, v, dropout_rate=0.5, dropout_rng=rng, deterministic=False
    )
    np.testing.assert_array_equal(np.asarray(off), np.asarray(plain))
    assert not np.allclose(np.asarray(on), np.asarray(plain))
    np.testing.assert_array_equal(np.asarray(on_weights), np.asarray(weights))  # before dropout
    with pytest.raises(TypeError, match=r"deterministic must be a bool, got str"):
        scaled_dot_product_attention(q, k, v, dropout_rate=0.5, deterministic="False")


def test_bfloat16_inputs_compute_in_bfloat16_with_float32_params():
    x = random_input(2, 7).astype(jnp.bfloat16)
    params = params_for(7)
    y = block().apply(params, x)
    assert y.dtype == jnp.bfloat16
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    reference = apply(params, np.asarray(x, np.float32), jax.random.key(0))
    np.testing.assert_allclose(np.asarray(y, np.float32), reference, atol=0.1)


# Errors at the boundary.


def test_heads_must_divide_hidden_dim():
    with pytest.raises(ValueError, match=r"hidden_dim \(10\).*num_heads \(4\)"):
        TemporalSelfAttention(10, 4)


@pytest.mark.parametrize(
    "shape, message",
    [
        ((2, 5, 12), r"x.shape\[-1\] must equal hidden_dim=16, got 12"),
        ((5, 16), r"3-D"),
        ((2, 0, 16), r"T must be > 0"),
    ],
)
def test_bad_input_shapes_are_rejected_with_the_numbers(shape, message):
    with pytest.raises(ValueError, match=message):
        block().apply(params_for(7), np.zeros(shape, np.float32))


def test_non_positive_temperature_is_rejected():
    with pytest.raises(ValueError, match="temperature"):
        block().apply(params_for(7), random_input(2, 7), temperature=0.0)


def test_a_host_mask_with_a_key_in_every_row_skips_the_empty_row_zeroing():
    # XLA constant-folded that reduction over the mask at every compile: 4.1 s of a
    # 10.4 s compile at T = 4096 on an H200. A device mask keeps it, with equal results.
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 6, 4)), jnp.float32) for _ in range(3))
    mask = np.tril(np.ones((6, 6), bool))
    on_host = jax.make_jaxpr(lambda *qkv: scaled_dot_product_attention(*qkv, mask))(q, k, v)
    device_mask = jnp.asarray(mask)
    on_device = jax.make_jaxpr(lambda *qkv: scaled_dot_product_attention(*qkv, device_mask))(
        q, k, v
    )
    assert "reduce_or" not in str(on_host) and "reduce_or" in str(on_device)
    for a, b in zip(
        scaled_dot_product_attention(q, k, v, mask),
        scaled_dot_product_attention(q, k, v, jnp.asarray(mask)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_causal_block_and_the_tft_hold_no_mask_reduction():
    x = jnp.zeros((1, 5, 8))
    block = TemporalSelfAttention(8, 2)
    # Only the jaxprs are read: the variables' shapes are all they need (no init compiled).
    variables = jax.eval_shape(block.init, jax.random.key(0), x)
    assert "reduce_or" not in str(jax.make_jaxpr(block.apply)(variables, x))
    config = train_step.get_config("tiny").model
    batch = train_step.make_batch(config, 1)
    inputs = (batch.static, batch.historical, batch.future, batch.known_history)
    model = TemporalFusionTransformer(config)
    tft_variables = jax.eval_shape(model.init, jax.random.key(0), *inputs)
    jaxpr = jax.make_jaxpr(lambda v: model.apply(v, *inputs, deterministic=True))(tft_variables)
    assert "reduce_or" not in str(jaxpr)


# ---------------------------------------------------------------------------
# The kernel: masks that would enlarge the output, shapes that do not fit, bfloat16


def test_attention_kernel_refuses_a_mask_that_would_enlarge_the_output():
    """A `(B, 1, Tq, Tk)` mask with 3-D `(B, Tq, d)` inputs used to broadcast the
    weights to `(B, B, Tq, Tk)` and the output to `(B, B, Tq, dv)`, silently."""
    x = jnp.ones((2, 3, 4))
    with pytest.raises(ValueError, match=r"mask must broadcast to the logits' shape.*\(2, 3, 3\)"):
        scaled_dot_product_attention(x, x, x, np.ones((2, 1, 3, 3), bool))
    # A mask that broadcasts without enlarging is still taken, with the documented result.
    rows = np.array([[True], [True], [False]])  # (Tq, 1): the last query sees nothing
    output, weights = scaled_dot_product_attention(x, x, x, rows)
    assert output.shape == (2, 3, 4) and weights.shape == (2, 3, 3)
    np.testing.assert_allclose(np.asarray(weights[:, :2]), 1.0 / 3.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(weights[:, 2]), 0.0)


@pytest.mark.parametrize(
    "query_shape, key_shape, value_shape, match",
    [
        ((1, 2, 4), (1, 3, 5), (1, 3, 4), r"query .* and key .* the same depth d"),
        ((1, 2, 4), (1, 3, 4), (1, 2, 4), r"key .* and value .* the same number of steps Tk"),
        ((2, 2, 4), (3, 3, 4), (3, 3, 4), r"leading axes of query, key and value"),
        ((4,), (3, 4), (3, 4), r"query must have at least 2 axes"),
    ],
)
def test_attention_kernel_names_the_arguments_whose_shapes_do_not_fit(
    query_shape, key_shape, value_shape, match
):
    with pytest.raises(ValueError, match=match):
        scaled_dot_product_attention(
            jnp.ones(query_shape), jnp.ones(key_shape), jnp.ones(value_shape)
        )


# One rounding to bfloat16 (8 significant bits) moves a value by at most 2^-8 of itself.
BFLOAT16_ROUNDING = 2.0**-8


def _float64_softmax_weights(query: np.ndarray, key: np.ndarray) -> np.ndarray:
    """`softmax(Q Kᵀ / sqrt(d))` in float64: `(..., Tq, d), (..., Tk, d) -> (..., Tq, Tk)`."""
    logits = query @ np.swapaxes(key, -1, -2) / np.sqrt(query.shape[-1])
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def test_bfloat16_attention_weights_are_the_float64_softmax_rounded_once():
    # Logits up to ~20: rounded to bfloat16 before the softmax they were off by up to 0.06,
    # which moved weights by up to 5%, ten times the weights' own final bfloat16 rounding.
    rng = np.random.default_rng(0)
    depth = 16
    query = jnp.asarray(2.0 * rng.normal(size=(2, 2, 6, depth)), jnp.bfloat16)
    key = jnp.asarray(2.0 * rng.normal(size=(2, 2, 40, depth)), jnp.bfloat16)
    value = jnp.asarray(rng.normal(size=(2, 1, 40, depth)), jnp.bfloat16)
    output, weights = scaled_dot_product_attention(query, key, value)
    # The inputs are exact bfloat16 values; the reference reads those very values.
    expected = _float64_softmax_weights(np.asarray(query, np.float64), np.asarray(key, np.float64))
    assert weights.dtype == output.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(weights, np.float64), expected, rtol=BFLOAT16_ROUNDING * 1.01, atol=1e-30
    )


def test_sizes_and_temperatures_that_would_change_the_shapes_are_refused():
    # causal_mask(2.5, 3) gave a (3, 3) mask and sinusoidal_encoding(3, 0) a (3, 0)
    # array, silently; a temperature of shape (7, 1, 1, 1) enlarged the outputs to 7 rows.
    with pytest.raises(TypeError, match=r"causal_mask: num_queries must be an int, got 2\.5"):
        causal_mask(2.5, 3)
    with pytest.raises(TypeError, match=r"causal_mask: num_keys must be an int, got 3\.5"):
        causal_mask(2, 3.5)
    assert causal_mask(np.int64(2), np.int64(3)).shape == (2, 3)
    with pytest.raises(ValueError, match="sinusoidal_encoding: length must be an int >= 0"):
        sinusoidal_encoding(-1, 4)
    with pytest.raises(ValueError, match="sinusoidal_encoding: dim must be a positive int"):
        sinusoidal_encoding(3, 0)
    q = np.ones((2, 3, 5, 4), np.float32)
    with pytest.raises(
        ValueError, match=r"temperature must be .* without enlarging it, got \(7, 1, 1, 1\)"
    ):
        scaled_dot_product_attention(q, q, q, temperature=np.ones((7, 1, 1, 1), np.float32))
    per_example = np.array([1.0, 2.0], np.float32).reshape(2, 1, 1, 1)
    output, _ = scaled_dot_product_attention(q, q, q, temperature=per_example)
    assert output.shape == q.shape


# ---------------------------------------------------------------------------
# Input-validation gaps: flags that are not bools, dtypes that are not floating


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("use_flash_attention", "no"),
        ("use_flash_attention", 1),
        ("use_positional_encoding", None),
        ("use_positional_encoding", "False"),
    ],
)
def test_temporal_self_attention_refuses_flags_that_are_not_bools(field: str, value: object):
    # Before: "no" was truthy (the fused path), None falsy (no positional encoding).
    with pytest.raises(
        TypeError,
        match=rf"TemporalSelfAttention: {field} must be a bool, got {type(value).__name__}",
    ):
        TemporalSelfAttention(hidden_dim=8, num_heads=2, **{field: value})
    assert getattr(TemporalSelfAttention(8, 2, **{field: np.bool_(True)}), field)


def test_temporal_self_attention_refuses_a_dtype_that_is_not_floating():
    # Before: accepted; "floaty" failed deep inside JAX at the first call.
    with pytest.raises(
        TypeError, match=r"TemporalSelfAttention: dtype must be a floating dtype, got 'floaty'"
    ):
        TemporalSelfAttention(hidden_dim=8, num_heads=2, dtype="floaty")
    with pytest.raises(
        ValueError, match=r"TemporalSelfAttention: dtype must be one of .*, got 'int32'"
    ):
        TemporalSelfAttention(hidden_dim=8, num_heads=2, dtype=jnp.int32)
    assert TemporalSelfAttention(8, 2, dtype="bfloat16").dtype == "bfloat16"
