"""The harness on partially dead gradients, several outputs, and its finite-difference hint."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from properties import checks

RNG = np.random.default_rng(0)
X = RNG.normal(size=(4, 3)).astype(np.float32)
PARAMS = {"dense": {"kernel": RNG.normal(size=(3, 5)).astype(np.float32)}}


def partially_dead_grads():
    """Row 1 of the kernel is under `stop_gradient`: the rest of the leaf learns."""

    def loss(params):
        kernel = params["dense"]["kernel"]
        kernel = kernel.at[1].set(jax.lax.stop_gradient(kernel[1]))
        return jnp.sum(jnp.tanh(X @ kernel))

    return jax.grad(loss)(PARAMS)


def test_per_leaf_norm_misses_a_dead_row_that_per_element_names():
    grads = partially_dead_grads()
    checks.assert_nonzero_grads(grads)  # the leaf's norm is positive: the default cannot see it
    with pytest.raises(AssertionError) as error:
        checks.assert_nonzero_grads(grads, per_element=True)
    message = str(error.value)
    assert "['dense']['kernel'] (shape (3, 5)): 5 of 15 elements dead" in message
    assert "at [1, 0], [1, 1], [1, 2], [1, 3], [1, 4]" in message


def test_per_element_passes_when_every_element_learns_and_reports_nan_as_dead():
    grads = jax.grad(lambda p: jnp.sum(jnp.tanh(X @ p["dense"]["kernel"])))(PARAMS)
    checks.assert_nonzero_grads(grads, per_element=True)
    broken = {"dense": {"kernel": np.where(np.eye(3, 5) > 0, np.nan, 1.0)}}
    with pytest.raises(AssertionError, match=r"3 of 15 elements dead at \[0, 0\], \[1, 1\]"):
        checks.assert_nonzero_grads(broken, per_element=True)
    with pytest.raises(AssertionError, match=r"elements with \|g\| <= 2"):
        checks.assert_nonzero_grads({"w": np.ones(3)}, min_norm=2.0, per_element=True)


def test_finite_difference_hint_appears_only_for_float32_sized_errors():
    @jax.custom_jvp
    def wrong_sin(x):
        return jnp.sin(x)

    wrong_sin.defjvp(lambda p, t: (jnp.sin(p[0]), 2.37 * jnp.cos(p[0]) * t[0]))
    point = (np.linspace(0.1, 1.0, 5),)
    with pytest.raises(AssertionError) as wrong:
        checks.assert_grads_match_finite_differences(lambda x: wrong_sin(x).sum(), point)
    assert "relative difference among violations: 1.37" in str(wrong.value)
    assert "float32" not in str(wrong.value)

    def casts_to_float32(x):  # float32 inside, float64 out: round-off / eps ~ 1e-4
        return 1e3 * jnp.sin(x.astype(jnp.float32)).astype(x.dtype).sum()

    with pytest.raises(AssertionError, match=r"relative error of .* casts to\s+float32 inside"):
        checks.assert_grads_match_finite_differences(casts_to_float32, point, modes=("rev",))


def sequence_and_weights(x, leak_weights=False):
    """`(cumsum over T (B, T, D), weights (B, 2, T, T))`: causal unless the weights leak."""
    steps = x.shape[1]
    scores = jnp.einsum("btd,bsd->bts", x, x)
    allowed = np.tril(np.ones((steps, steps), bool))
    if leak_weights:
        allowed = np.ones((steps, steps), bool)
    weights = jax.nn.softmax(jnp.where(allowed, scores, -1e9), axis=-1)
    return jnp.cumsum(x, axis=1), jnp.stack([weights, 2 * weights], axis=1)


SEQUENCE = RNG.normal(size=(2, 5, 3)).astype(np.float32)
causal_fn = jax.jit(sequence_and_weights)
leaky_fn = jax.jit(lambda x: sequence_and_weights(x, leak_weights=True))


def test_causal_checks_both_outputs_in_one_call_with_an_axis_per_output():
    checks.assert_causal(causal_fn, SEQUENCE, out_axis=(1, 2))
    with pytest.raises(AssertionError, match=r"output \[1\]\[:1 along axis 2\]"):
        checks.assert_causal(leaky_fn, SEQUENCE, out_axis=(1, 2))
    # One time axis for both outputs is wrong for the weights (their axis 1 is the heads).
    with pytest.raises(ValueError, match=r"output leaf \[1\] has shape \(2, 2, 5, 5\)"):
        checks.assert_causal(causal_fn, SEQUENCE, out_axis=1)


def test_select_picks_the_outputs_to_check():
    checks.assert_causal(leaky_fn, SEQUENCE, select=lambda out: out[0])
    with pytest.raises(AssertionError, match="not causal"):
        checks.assert_causal(leaky_fn, SEQUENCE, select=lambda out: {"w": out[1]}, out_axis=2)
    with pytest.raises(TypeError, match="select must be a function"):
        checks.assert_causal(causal_fn, SEQUENCE, select=0)


def test_batch_checks_take_a_batch_axis_per_output():
    def fn(x, mix=False):
        per_sample = jnp.tanh(x)
        other = per_sample.mean(axis=0, keepdims=True) if mix else per_sample
        return {"y": per_sample, "time_major": jnp.swapaxes(other + 0 * per_sample, 0, 1)}

    checks.assert_batch_independent(fn, SEQUENCE, out_axis={"y": 0, "time_major": 1})
    checks.assert_batch_order_equivariant(fn, SEQUENCE, out_axis={"y": 0, "time_major": 1})
    with pytest.raises(AssertionError, match=r"output \['time_major'\]\[sample 0\] changed"):
        checks.assert_batch_independent(
            lambda x: fn(x, mix=True), SEQUENCE, out_axis={"y": 0, "time_major": 1}
        )
    with pytest.raises(ValueError, match="must be a prefix of fn's output structure"):
        checks.assert_batch_independent(fn, SEQUENCE, out_axis=(0, 1))
    with pytest.raises(TypeError, match="out_axis must be an int or a pytree of ints"):
        checks.assert_batch_independent(fn, SEQUENCE, out_axis={"y": 0, "time_major": "1"})


def heads_and_steps(x):
    """`(y (B, T, D), weights (B, heads, T, T))`, causal, 2 heads: heads == T for T = 2."""
    y, weights = sequence_and_weights(x)
    return y, weights[:, :2]


def test_causal_default_out_axis_refuses_outputs_whose_time_axis_it_would_guess():
    # With heads == T == 2 the default (axis 1 for every leaf) judged the heads
    # axis of a correct block's weights and failed it as "not causal".
    x = SEQUENCE[:, :2]
    with pytest.raises(
        ValueError, match=r"out_axis must be given: .* leaf \[1\] has length T = 2 on axes 1, 2, 3"
    ) as e:
        checks.assert_causal(heads_and_steps, x)
    assert "[1] (2, 2, 2, 2)" in str(e.value)
    with pytest.raises(ValueError, match=r"leaf <root> has length T = 2 on axes 1, 2, 3"):
        checks.assert_causal(lambda x: heads_and_steps(x)[1], x)
    valid = np.array([[True, False], [True, True]])
    with pytest.raises(ValueError, match=r"out_axis must be given: .* on axes 1, 2, 3"):
        checks.assert_ignores_padding(heads_and_steps, x, valid)
    checks.assert_causal(heads_and_steps, x, out_axis=(1, 2))
    checks.assert_ignores_padding(heads_and_steps, x, valid, out_axis=(1, 2))
    # Shapes that leave no doubt keep the default: x's shape, fewer axes, or T once.
    checks.assert_causal(lambda x: jnp.cumsum(x, axis=1), SEQUENCE)
    checks.assert_causal(lambda x: jnp.cumsum(x, axis=1).sum(-1), SEQUENCE)
    checks.assert_causal(lambda x: jnp.cumsum(x, axis=1)[..., None] * jnp.ones(4), SEQUENCE[..., 0])
    # Leaves of different ranks with T on one axis each: (y (B, T, F), score (B, T)).
    checks.assert_causal(lambda x: (jnp.cumsum(x, axis=1), jnp.cumsum(x, axis=1).sum(-1)), SEQUENCE)


def test_out_axis_of_the_wrong_structure_is_named_without_the_output_values():
    # JAX's structure error quoted both (4, 64, 32) outputs in full: 6,000 characters.
    big = RNG.normal(size=(4, 64, 32)).astype(np.float32)
    with pytest.raises(ValueError, match=r"Tuple arity mismatch: 2 != 3") as error:
        checks.assert_causal(lambda a: (a, a), big, out_axis=(1, 2, 3))
    assert "float32[4, 64, 32]" in str(error.value)
    assert len(str(error.value)) < 400, str(error.value)
