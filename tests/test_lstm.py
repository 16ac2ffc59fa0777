"""The LSTM: gradients against float64 NumPy backpropagation through time, zero steps, lists.

The reference is written here by hand (gates i, f, g, o); its forward pass
is checked against `tests/reference_tft.py` in `test_reference_modules.py`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.block_inputs import _X
from tft_jax.lstm import LSTM

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


def test_lstm_takes_nested_lists_like_arrays():
    lstm = LSTM(2)
    state = (np.full((2, 2), 0.5, np.float32), np.zeros((2, 2), np.float32))
    variables = lstm.init(jax.random.key(0), _X)
    expected = lstm.apply(variables, _X, state)
    got = lstm.apply(variables, _X.tolist(), [state[0].tolist(), state[1].tolist()])
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(a, b)


def test_lstm_initial_bias_is_one_on_the_forget_gate_only() -> None:
    # Jozefowicz et al. (2015): gate order i, f, g, o; only f's bias starts at 1.
    module = LSTM(FEATURES)
    x = np.zeros((BATCH, STEPS, INPUTS), np.float32)
    bias = np.asarray(module.init(jax.random.key(0), x)["params"]["input"]["bias"])
    want = np.concatenate(
        [np.zeros(FEATURES), np.ones(FEATURES), np.zeros(FEATURES), np.zeros(FEATURES)]
    )
    np.testing.assert_array_equal(bias, want)


def test_an_initial_h_beyond_the_unit_range_is_scaled_by_the_smallest_power_of_two():
    # The quantized recurrent projection reads h / scale on a fixed [-1, 1] grid: the
    # smallest power of two that brings the row's largest |h| within it (1 when it is
    # already), so that a row reaching exactly 2 or 4 uses the whole grid.
    from tft_jax.lstm import _scaled_into_unit_range

    largest = np.array([0.0, 1e-3, 0.3, 1.0, 1.5, 2.0, 3.0, 4.0, 4.5, 1024.0])
    hidden = np.stack([largest, -0.5 * largest, 0.25 * largest], axis=-1).astype(np.float32)
    hidden[:, 1] *= -1.0
    want = np.where(largest <= 1.0, 1.0, 2.0 ** np.ceil(np.log2(np.maximum(largest, 1.0))))
    scaled, scale = _scaled_into_unit_range(jnp.asarray(hidden))
    np.testing.assert_array_equal(np.asarray(scale)[:, 0], want)
    np.testing.assert_array_equal(np.asarray(scaled), hidden / want[:, None])


def test_a_quantized_lstm_over_zero_steps_returns_an_initial_h_beyond_the_unit_range():
    # The quantized path carries h / scale through the scan; with no step the scale was
    # never reset to 1, so it must be multiplied back.
    from qat import QATConfig, QATModel

    h0 = np.array([[3.0, -0.5, 2.0, 1.0, -6.0], [0.1, 0.2, 0.3, 0.4, 0.5]], np.float32)
    c0 = -h0
    x = np.zeros((BATCH, STEPS, INPUTS), np.float32)
    model = QATModel(LSTM(FEATURES), QATConfig(bits=8))
    variables = model.init(jax.random.key(0), x, (h0, c0))
    outputs, (h, c) = model.apply(variables, x[:, :0], (h0, c0))
    assert outputs.shape == (BATCH, 0, FEATURES)
    np.testing.assert_array_equal(np.asarray(h), h0)
    np.testing.assert_array_equal(np.asarray(c), c0)
