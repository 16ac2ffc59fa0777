"""Review tests of the LSTM, the schedules, the inline Threefry keys, `deterministic`, flat AdamW.

References: a float64 NumPy LSTM with hand-written backpropagation through
time, the warmup + cosine closed form in float64, JAX's own Threefry draws,
and the checkpoint layout check that keeps a flat optimizer state with its
own parameters.
"""

from __future__ import annotations

import math
import pathlib
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tft_jax import inline_threefry
from tft_jax.checkpoint import TrainingCheckpointer
from tft_jax.flat_optimizer import FlatAdamWState, flat_adamw
from tft_jax.gating import GatedLinearUnit
from tft_jax.inline_threefry import inline_threefry_key
from tft_jax.lstm import LSTM
from tft_jax.schedules import WarmupCosine

# ---------------------------------------------------------------------------
# LSTM gradients against float64 NumPy backpropagation through time

BATCH, STEPS, INPUTS, FEATURES = 2, 4, 3, 5


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def numpy_lstm_gradients(
    w_x: np.ndarray,
    bias: np.ndarray,
    w_h: np.ndarray,
    x: np.ndarray,
    h0: np.ndarray,
    c0: np.ndarray,
    out_weight: np.ndarray,
    h_weight: np.ndarray,
    c_weight: np.ndarray,
) -> dict[str, np.ndarray]:
    """Gradients of `Σ outputs·R + Σ h_T·a + Σ c_T·b` in float64, by hand (gates i, f, g, o).

    `x (B, T, I)`, `h0, c0 (B, F)`, `R (B, T, F)`, `a, b (B, F)`; the LSTM is
    `z = x_t W_x + h W_h + bias`, `c' = σ(z_f) c + σ(z_i) tanh(z_g)`,
    `h' = σ(z_o) tanh(c')`.
    """
    f = h0.shape[-1]
    h, c, cache = h0, c0, []
    for t in range(x.shape[1]):
        z = x[:, t] @ w_x + h @ w_h + bias
        i, fg, g, o = (
            _sigmoid(z[:, :f]),
            _sigmoid(z[:, f : 2 * f]),
            np.tanh(z[:, 2 * f : 3 * f]),
            _sigmoid(z[:, 3 * f :]),
        )
        c_new = fg * c + i * g
        cache.append((h, c, i, fg, g, o, np.tanh(c_new)))
        h, c = o * np.tanh(c_new), c_new
    grads = {
        "w_x": np.zeros_like(w_x),
        "bias": np.zeros_like(bias),
        "w_h": np.zeros_like(w_h),
        "x": np.zeros_like(x),
    }
    dh_next, dc_next = h_weight.copy(), c_weight.copy()
    for t in reversed(range(x.shape[1])):
        h_prev, c_prev, i, fg, g, o, tanh_c = cache[t]
        dh = out_weight[:, t] + dh_next
        dc = dc_next + dh * o * (1.0 - tanh_c**2)
        dz = np.concatenate(
            [
                dc * g * i * (1 - i),
                dc * c_prev * fg * (1 - fg),
                dc * i * (1 - g**2),
                dh * tanh_c * o * (1 - o),
            ],
            axis=-1,
        )
        grads["w_x"] += x[:, t].T @ dz
        grads["bias"] += dz.sum(axis=0)
        grads["w_h"] += h_prev.T @ dz
        grads["x"][:, t] = dz @ w_x.T
        dh_next, dc_next = dz @ w_h.T, dc * fg
    grads["h0"], grads["c0"] = dh_next, dc_next
    return grads


def test_lstm_gradients_equal_float64_numpy_backpropagation_through_time() -> None:
    rng = np.random.default_rng(0)
    module = LSTM(FEATURES)
    x = rng.normal(size=(BATCH, STEPS, INPUTS)).astype(np.float32)
    h0, c0 = (rng.normal(size=(BATCH, FEATURES)).astype(np.float32) for _ in range(2))
    shapes = jax.eval_shape(module.init, jax.random.key(0), x, (h0, c0))["params"]
    params = jax.tree.map(
        lambda leaf: (0.6 * rng.normal(size=leaf.shape)).astype(np.float32), shapes
    )
    out_weight = rng.normal(size=(BATCH, STEPS, FEATURES)).astype(np.float32)
    h_weight, c_weight = (rng.normal(size=(BATCH, FEATURES)).astype(np.float32) for _ in range(2))

    def loss(params: Any, x: Any, h0: Any, c0: Any) -> Any:
        outputs, (h, c) = module.apply({"params": params}, x, (h0, c0))
        return jnp.sum(outputs * out_weight) + jnp.sum(h * h_weight) + jnp.sum(c * c_weight)

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(params, x, h0, c0)
    f64 = lambda value: np.asarray(value, np.float64)  # noqa: E731
    want = numpy_lstm_gradients(
        f64(params["input"]["kernel"]),
        f64(params["input"]["bias"]),
        f64(params["cell"]["recurrent"]["kernel"]),
        *(f64(value) for value in (x, h0, c0, out_weight, h_weight, c_weight)),
    )
    pairs = {
        "w_x": got[0]["input"]["kernel"],
        "bias": got[0]["input"]["bias"],
        "w_h": got[0]["cell"]["recurrent"]["kernel"],
        "x": got[1],
        "h0": got[2],
        "c0": got[3],
    }
    for name, value in pairs.items():
        np.testing.assert_allclose(f64(value), want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_lstm_over_zero_steps_returns_the_initial_state() -> None:
    module = LSTM(FEATURES)
    x = np.zeros((BATCH, 0, INPUTS), np.float32)
    h0 = np.arange(BATCH * FEATURES, dtype=np.float32).reshape(BATCH, FEATURES) / 3
    c0 = -h0
    variables = jax.eval_shape(module.init, jax.random.key(0), x)
    variables = jax.tree.map(lambda leaf: jnp.ones(leaf.shape, leaf.dtype), variables)
    outputs, (h, c) = module.apply(variables, x, (h0, c0))
    assert outputs.shape == (BATCH, 0, FEATURES)
    np.testing.assert_array_equal(np.asarray(h), h0)
    np.testing.assert_array_equal(np.asarray(c), c0)


# ---------------------------------------------------------------------------
# Schedules at their boundaries, against the closed form


def closed_form(count: float, peak: float, total: float, warmup: float, end: float) -> float:
    if count < warmup:
        return peak * count / warmup
    progress = min(count - warmup, total - warmup) / (total - warmup)
    return end + (peak - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


@pytest.mark.parametrize(
    "numbers", [(1e-3, 100, 10, 0.0), (0.1, 7, 0, 0.01), (2.0, 7, 6, 0.5), (0.5, 1, 0, 0.7)]
)
def test_schedule_at_step_zero_warmup_end_total_and_beyond_is_the_closed_form(numbers) -> None:
    peak, total, warmup, end = numbers
    schedule = WarmupCosine(*numbers)
    in_state = jax.jit(lambda count, schedule: schedule(count))
    counts = sorted({0, 1, warmup - 1, warmup, warmup + 1, total - 1, total, total + 1, 10 * total})
    for count in (c for c in counts if c >= 0):
        want = closed_form(count, peak, total, warmup, end)
        for label, got in [
            ("int", schedule(count)),
            ("float", schedule(float(count))),
            ("int32", schedule(jnp.int32(count))),
            ("in state", in_state(jnp.int32(count), schedule.as_arrays())),
            ("in state, float count", in_state(jnp.float32(count), schedule.as_arrays())),
        ]:
            assert got.dtype == jnp.float32, label
            np.testing.assert_allclose(
                float(got), want, rtol=2e-6, atol=1e-9, err_msg=f"{label} count {count}"
            )


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


# ---------------------------------------------------------------------------
# `deterministic` must be a bool


@pytest.mark.parametrize("value", ["False", "True", 0.0, [False]])
def test_deterministic_that_is_not_a_bool_raises_type_error_naming_it(value: Any) -> None:
    # "False" is truthy: it used to switch dropout off without a word.
    module = GatedLinearUnit(4, dropout_rate=0.5)
    x = jnp.ones((2, 3))
    variables = module.init(jax.random.key(0), x)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        module.apply(variables, x, deterministic=value, rngs={"dropout": jax.random.key(1)})


def test_traced_deterministic_raises_type_error_naming_it_and_is_ignored_without_dropout() -> None:
    x = jnp.ones((2, 3))
    module = GatedLinearUnit(4, dropout_rate=0.5)
    variables = module.init(jax.random.key(0), x)
    apply = jax.jit(
        lambda d: module.apply(variables, x, deterministic=d, rngs={"dropout": jax.random.key(1)})
    )
    with pytest.raises(TypeError, match=r"deterministic.*static"):
        apply(False)
    plain = GatedLinearUnit(4)
    plain_variables = plain.init(jax.random.key(0), x)
    traced = jax.jit(lambda d: plain.apply(plain_variables, x, deterministic=d))(False)
    want = plain.apply(plain_variables, x, deterministic=True)
    np.testing.assert_allclose(traced, want, rtol=1e-6, atol=1e-7)


def test_numpy_and_array_bools_and_zero_or_one_are_accepted_as_deterministic() -> None:
    module = GatedLinearUnit(4, dropout_rate=0.5)
    x = jnp.ones((2, 3))
    variables = module.init(jax.random.key(0), x)
    rngs = {"dropout": jax.random.key(1)}
    on = module.apply(variables, x, deterministic=False, rngs=rngs)
    off = module.apply(variables, x, deterministic=True, rngs=rngs)
    for value, want in [(np.bool_(False), on), (jnp.array(True), off), (0, on), (1, off)]:
        got = module.apply(variables, x, deterministic=value, rngs=rngs)
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------
# A flat optimizer state is restored only with the parameters it was built for


@flax.struct.dataclass
class _State:
    step: Any
    params: Any
    opt_state: FlatAdamWState


def _state(params: dict[str, Any]) -> _State:
    tx = flat_adamw(0.1)
    opt_state = tx.init(params)
    _, opt_state = tx.update(params, opt_state)
    return _State(step=jnp.ones((), jnp.int32), params=params, opt_state=opt_state)


def test_checkpoint_refuses_a_flat_state_of_parameters_laid_out_otherwise_with_equal_size(
    tmp_path: pathlib.Path,
) -> None:
    # Moments are matched to parameters by position in one (N,) vector: the
    # checkpoint's per-leaf layout check is what keeps them with their own leaves.
    saved = _state({"a": jnp.ones((2, 3)), "b": jnp.ones(4)})
    other = _state({"a": jnp.ones(4), "b": jnp.ones((2, 3))})
    assert saved.opt_state.mu.shape == other.opt_state.mu.shape
    with TrainingCheckpointer(tmp_path) as checkpointer:
        checkpointer.save_latest(saved, jax.random.key(0), {})
        with pytest.raises(ValueError, match="does not fit the template"):
            checkpointer.restore_latest(other)
        restored = checkpointer.restore_latest(saved)
    assert restored is not None
    np.testing.assert_array_equal(restored.state.opt_state.mu, saved.opt_state.mu)
