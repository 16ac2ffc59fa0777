"""`properties` used on a researcher's own modules (not the TFT), with bugs planted in copies.

Four small modules written here the way a user would: a residual MLP, a
causal 1-D convolution, a GRU cell under `nn.scan` and a multi-head attention
with a padding mask (plus a float16 RMS norm). Each check passes on the
correct module and fails on the copy with the bug it is meant to catch. The
padding bugs (a mask applied after the softmax, NaN for an all-masked row)
are caught by `checks.assert_ignores_padding` on masks drawn by
`strategies.padding_masks`: no causal or batch check sees a dependence on padding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import find, given, settings

from properties import checks
from properties import strategies as st_tft

_RNG = np.random.default_rng(0)
_X = _RNG.standard_normal((3, 5, 8)).astype(np.float32)  # (B, T, D)
# Sample 0 all real, sample 1 right-padded (2 padded steps), sample 2 left-padded.
_VALID = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 1, 1, 1]], bool)


class ResidualMLP(nn.Module):
    """`x + W2 gelu(W1 x)`, `(B, T, D) -> (B, T, D)`; `detach` stops the branch's gradient,
    `dead` adds a parameter the output never reads."""

    detach: bool = False
    dead: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        branch = nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(16)(x)))
        if self.detach:
            branch = jax.lax.stop_gradient(branch)
        if self.dead:
            self.param("unused", nn.initializers.ones, (3,))
        return x + branch


class CausalConv(nn.Module):
    """Width-3 convolution over `T`, left-padded so step `t` reads `t-2..t`; `leak` shifts the
    padding so step `t` also reads `t + leak` (the off-by-one)."""

    leak: int = 0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        padded = jnp.pad(x, ((0, 0), (2 - self.leak, self.leak), (0, 0)))
        return nn.Conv(8, (3,), padding="VALID")(padded)


class ScannedGRU(nn.Module):
    """A GRU cell run over `T` with `nn.scan`, `(B, T, D) -> (B, T, 8)`; `batch_mix` seeds the
    carry with the batch mean of the inputs (a statistic over the wrong axis)."""

    batch_mix: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        carry = jnp.zeros((x.shape[0], 8), x.dtype)
        if self.batch_mix:
            carry = carry + x.mean(axis=(0, 1))
        scan = nn.scan(
            lambda cell, c, xt: cell(c, xt),
            variable_broadcast="params",
            split_rngs={"params": False},
            in_axes=1,
            out_axes=1,
        )
        return scan(nn.GRUCell(8), carry, x)[1]


class PaddedAttention(nn.Module):
    """Two-head self-attention with a causal and a padding mask, `-> (y (B, T, D), w (B, 2, T, T))`.

    Bugs: `shift=1` lets step `t` see `t + 1`; `mask_after` multiplies the
    softmax by the mask instead of masking the logits; `nan_empty` masks with
    `-inf` and leaves an all-masked row NaN instead of zeros.
    """

    causal: bool = True
    shift: int = 0
    mask_after: bool = False
    nan_empty: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
        batch, steps, width = x.shape
        q, k, v = (nn.DenseGeneral((2, width // 2), name=name)(x) for name in "qkv")
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(width // 2)
        allowed = jnp.broadcast_to(valid[:, None, None, :], (batch, 1, steps, steps))
        if self.causal:
            allowed = allowed & jnp.tri(steps, k=self.shift, dtype=bool)
        if self.mask_after:
            weights = jax.nn.softmax(logits, axis=-1) * allowed
        elif self.nan_empty:
            weights = jax.nn.softmax(jnp.where(allowed, logits, -jnp.inf), axis=-1)
        else:
            weights = jax.nn.softmax(jnp.where(allowed, logits, -1e30), axis=-1)
            weights = jnp.where(allowed.any(-1, keepdims=True), weights, 0.0)
        y = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, steps, width)
        return nn.Dense(width, name="out")(y), weights


class HalfRMSNorm(nn.Module):
    """RMS norm computed in float16; `overflow` squares in float16 (1e4 squared is inf there,
    so the output and its gradient silently become 0)."""

    overflow: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        x = jnp.asarray(x)
        wide = x if self.overflow else x.astype(jnp.float32)
        rms = jnp.sqrt(jnp.mean(wide * wide, axis=-1, keepdims=True))
        return (x / rms.astype(x.dtype)) * scale.astype(x.dtype)


def _bound(module: nn.Module, *args: Any) -> tuple[Any, Callable[..., Any]]:
    """`(variables, jitted apply)` of `module` initialised on `args` (jitted: op by op, init
    compiled each primitive apart)."""
    return jax.jit(module.init)(jax.random.key(0), *args), jax.jit(module.apply)


@pytest.fixture(scope="module")
def mlps() -> dict[str, tuple[Any, Callable[..., Any]]]:
    variants = {
        "ok": ResidualMLP(),
        "detach": ResidualMLP(detach=True),
        "dead": ResidualMLP(dead=True),
    }
    return {name: _bound(module, _X) for name, module in variants.items()}


@pytest.fixture(scope="module")
def attentions() -> dict[str, tuple[Any, Callable[..., Any]]]:
    variants = {
        "ok": PaddedAttention(),
        "shift": PaddedAttention(shift=1),
        "after": PaddedAttention(causal=False, mask_after=True),
        "ok_noncausal": PaddedAttention(causal=False),
        "nan": PaddedAttention(nan_empty=True),
    }
    return {name: _bound(module, _X, _VALID) for name, module in variants.items()}


def _parameter_grads(bound: tuple[Any, Callable[..., Any]], *args: Any) -> Any:
    variables, apply = bound
    loss = lambda v: jnp.sum(jax.tree_util.tree_leaves(apply(v, *args))[0])  # noqa: E731
    return jax.jit(jax.grad(loss))(variables)


def test_residual_mlp_detached_branch_and_dead_parameter_are_named(mlps):
    checks.assert_nonzero_grads(_parameter_grads(mlps["ok"], _X), per_element=True)
    variables, apply = mlps["ok"]
    checks.assert_grads_match_finite_differences(apply, (variables, _X[:1, :2]))
    with pytest.raises(AssertionError, match=r"\['Dense_0'\]\['kernel'\]: norm 0"):
        checks.assert_nonzero_grads(_parameter_grads(mlps["detach"], _X))
    with pytest.raises(AssertionError, match=r"1 of 5 leaves(.|\n)*\['unused'\]: norm 0"):
        checks.assert_nonzero_grads(_parameter_grads(mlps["dead"], _X))
    variables, apply = mlps["detach"]
    with pytest.raises(AssertionError, match="differ from central finite differences"):
        checks.assert_grads_match_finite_differences(apply, (variables, _X[:1, :2]))


@pytest.mark.parametrize("leak", [0, 1])
def test_causal_conv_off_by_one_padding_is_caught_at_its_step(leak):
    variables, apply = _bound(CausalConv(leak=leak), _X)
    fn = lambda x: apply(variables, x)  # noqa: E731
    checks.assert_batch_independent(fn, _X)
    if leak == 0:
        checks.assert_causal(fn, _X)
        return
    with pytest.raises(AssertionError, match=r"not causal along axis 1.*\n  t=0, output"):
        checks.assert_causal(fn, _X)


@pytest.mark.parametrize("batch_mix", [False, True])
def test_scanned_gru_batch_statistic_is_caught(batch_mix):
    variables, apply = _bound(ScannedGRU(batch_mix=batch_mix), _X)
    fn = lambda x: apply(variables, x)  # noqa: E731
    checks.assert_batch_order_equivariant(fn, _X)  # a batch mean is order-invariant: passes
    if not batch_mix:
        checks.assert_jit_matches_eager(apply, variables, _X[:1, :3])
        checks.assert_causal(fn, _X)
        checks.assert_batch_independent(fn, _X)
        return
    with pytest.raises(AssertionError, match=r"mixes samples(.|\n)*\[sample 0\] changed"):
        checks.assert_batch_independent(fn, _X)


def test_attention_causal_shift_is_caught_on_outputs_and_weights(attentions):
    variables, apply = attentions["ok"]
    checks.assert_causal(lambda x: apply(variables, x, _VALID), _X, out_axis=(1, 2))
    checks.assert_batch_independent(lambda xv: apply(variables, *xv), (_X, _VALID))
    checks.assert_batch_order_equivariant(lambda xv: apply(variables, *xv), (_X, _VALID))
    variables, apply = attentions["shift"]
    with pytest.raises(AssertionError, match=r"t=0, output \[1\]\[:1 along axis 2\]"):
        checks.assert_causal(lambda x: apply(variables, x, _VALID), _X, out_axis=(1, 2))


def test_ignores_padding_catches_a_padding_mask_applied_after_the_softmax(attentions):
    # Without a causal mask, no other check sees this bug: the padded keys'
    # logits still enter the softmax's normalization, so real outputs move
    # with the padded inputs.
    variables, apply = attentions["ok_noncausal"]
    checks.assert_ignores_padding(
        lambda x: apply(variables, x, _VALID), _X, _VALID, out_axis=(1, 2)
    )
    variables, apply = attentions["after"]
    fn = lambda x: apply(variables, x, _VALID)  # noqa: E731
    checks.assert_batch_independent(fn, _X, out_axis=0)
    with pytest.raises(AssertionError, match=r"\[sample 1, step 0\]: 8 of 8 elements differ"):
        checks.assert_ignores_padding(fn, _X, _VALID, out_axis=(1, 2))


def test_ignores_padding_catches_a_leak_in_the_gradient_only():
    """`y + (s - stop_gradient(s))`, `s` a sum over padded steps: equal values, leaking gradient."""
    padded = jnp.asarray(~_VALID)[..., None]

    def leaky(x: jax.Array) -> jax.Array:
        total = jnp.sum(x * padded, axis=1, keepdims=True)
        return x + (total - jax.lax.stop_gradient(total))

    checks.assert_ignores_padding(leaky, _X, _VALID, check_gradients=False)
    with pytest.raises(AssertionError, match=r"x\[sample 1, step 3\] \(padded\) is nonzero"):
        checks.assert_ignores_padding(leaky, _X, _VALID)


def test_ignores_padding_catches_a_count_of_real_steps_taken_from_nonzero_inputs():
    """A mean that counts real steps as the nonzero ones: noise keeps the count, zeros do not."""

    def centred(x: jax.Array) -> jax.Array:
        count = jnp.sum(jnp.any(x != 0, axis=-1), axis=1)[:, None, None]
        return x - jnp.sum(x * _VALID[..., None], axis=1, keepdims=True) / count

    with pytest.raises(AssertionError, match=r"\(padded inputs set to 0\)"):
        checks.assert_ignores_padding(centred, _X, _VALID)


def test_ignores_padding_with_nan_padding_catches_a_mask_applied_by_multiplication():
    """`x * valid` ignores finite padding but not NaN padding (`NaN * 0` is NaN); `where` does."""

    def multiplied(x: jax.Array) -> jax.Array:
        return x + jnp.sum(x * _VALID[..., None], axis=1, keepdims=True)

    def selected(x: jax.Array) -> jax.Array:
        return x + jnp.sum(jnp.where(_VALID[..., None], x, 0.0), axis=1, keepdims=True)

    checks.assert_ignores_padding(multiplied, _X, _VALID)  # finite padding: no dependence
    with pytest.raises(AssertionError) as error:
        checks.assert_ignores_padding(multiplied, _X, _VALID, nan_padding=True)
    message = str(error.value)
    assert "output <root>[sample 1, step 0] (padded inputs set to NaN): 8 of 8" in message
    assert "sample 0" not in message  # no padded step: unchanged
    checks.assert_ignores_padding(selected, _X, _VALID, nan_padding=True)
    with pytest.raises(TypeError, match="nan_padding must be a bool"):
        checks.assert_ignores_padding(selected, _X, _VALID, nan_padding=1)


_ONE_ROW_ALL_PADDED = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)


def _masked_self_attention(fill: float) -> Callable[[jax.Array], jax.Array]:
    """Softmax over the real keys of `_ONE_ROW_ALL_PADDED` (masked logits set to `fill`)."""

    def attend(x: jax.Array) -> jax.Array:
        logits = jnp.where(_ONE_ROW_ALL_PADDED[:, None, :], jnp.einsum("btd,bsd->bts", x, x), fill)
        return jnp.einsum("bts,bsd->btd", jax.nn.softmax(logits, axis=-1), x)

    return attend


def test_ignores_padding_says_nan_at_padded_outputs_makes_the_gradient_nan_not_a_leak():
    # The all-padded row's softmax over -inf logits is 0/0: NaN at padded outputs
    # only. The gradient check read the NaN gradient there as a leak, "is nonzero
    # (max |g| 0, 2 NaN)"; it now names the cause.
    x, valid = _X[:, :4, :2], _ONE_ROW_ALL_PADDED
    with pytest.raises(AssertionError) as error:
        checks.assert_ignores_padding(_masked_self_attention(-jnp.inf), x, valid)
    message = str(error.value)
    assert message.startswith("fn's gradient at the padded inputs is NaN: the outputs at padded")
    assert "output <root>: 8 NaN, 0 inf of 12 elements at padded steps" in message
    assert "first at [sample 1, step 0]" in message and "check_gradients=False" in message
    assert "is nonzero" not in message
    checks.assert_ignores_padding(_masked_self_attention(-jnp.inf), x, valid, check_gradients=False)
    checks.assert_ignores_padding(_masked_self_attention(-1e9), x, valid)  # finite: passes


def test_ignores_padding_counts_a_nan_gradient_as_a_leak_where_the_outputs_are_finite():
    """A backward that writes NaN at padded inputs, finite outputs everywhere: still a leak."""

    @jax.custom_vjp
    def identity(x: jax.Array) -> jax.Array:
        return x

    padded = jnp.asarray(~_VALID)[..., None]
    identity.defvjp(lambda x: (x, None), lambda _, g: (jnp.where(padded, jnp.nan, g),))
    with pytest.raises(AssertionError, match=r"x\[sample 1, step 3\] \(padded\) is NaN at 8 of"):
        checks.assert_ignores_padding(identity, _X, _VALID)


def test_ignores_padding_refuses_bad_arguments():
    identity = lambda x: x  # noqa: E731
    with pytest.raises(TypeError, match="valid must be a boolean array"):
        checks.assert_ignores_padding(identity, _X, _VALID.astype(np.int32))
    with pytest.raises(ValueError, match=r"valid must have shape \(B, T\) = \(3, 5\)"):
        checks.assert_ignores_padding(identity, _X, _VALID[:, :3])
    with pytest.raises(ValueError, match="not 0 \\(the batch axis\\)"):
        checks.assert_ignores_padding(identity, _X, _VALID, axis=0)
    with pytest.raises(ValueError, match="output leaf <root> has shape \\(3, 8\\)"):
        checks.assert_ignores_padding(lambda x: x.sum(1), _X, _VALID)
    nan_at_real = lambda x: jnp.asarray(x).at[0, 0, 0].set(jnp.nan)  # noqa: E731
    with pytest.raises(AssertionError, match="NaN at real steps"):
        checks.assert_ignores_padding(nan_at_real, _X, _VALID)


_ATTENTION = PaddedAttention()
_ATTENTION_INIT = jax.jit(_ATTENTION.init)  # built once: one compile per drawn shape
_ATTENTION_APPLY = jax.jit(_ATTENTION.apply)
_SMALL = st_tft.attention_configs(
    hidden_dims=(8,), num_heads=(2,), sequence_lengths=(1, 4), batch_sizes=(1, 3)
)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(_SMALL, st_tft.data())
def test_padded_attention_holds_its_properties_on_drawn_masks(config, data):
    x = data.draw(st_tft.attention_inputs(config, kinds=("normal",)))
    valid = data.draw(st_tft.padding_masks(config))
    assert valid.shape == (config.batch_size, config.sequence_length) and valid.dtype == bool
    variables = _ATTENTION_INIT(jax.random.key(0), x, valid)
    fn = lambda x: _ATTENTION_APPLY(variables, x, valid)  # noqa: E731
    checks.assert_finite(fn(x))
    checks.assert_ignores_padding(fn, x, valid, out_axis=(1, 2))
    checks.assert_causal(fn, x, out_axis=(1, 2), check_gradients=False)


def test_padding_masks_draw_the_rows_that_break_attention():
    """The strategy reaches an all-masked row and a left-padded row (no real key for the first
    causal queries), where `-inf` masking gives NaN; `assert_finite` then names it."""
    config = st_tft.AttentionConfig(hidden_dim=8, num_heads=2, sequence_length=4, batch_size=3)
    empty = find(st_tft.padding_masks(config), lambda v: (~v.any(axis=1)).any())
    left = find(
        st_tft.padding_masks(config, kinds=("left",)), lambda v: (~v[:, 0] & v[:, -1]).any()
    )
    one = find(st_tft.padding_masks(config, kinds=("one",)), lambda v: v[:, -1].any())
    assert (one.sum(axis=1) == 1).all()
    x = _X[:, :4]
    module = PaddedAttention(nan_empty=True)
    init, apply = jax.jit(module.init), jax.jit(module.apply)  # op by op: every primitive
    for valid in (empty, left):
        variables = init(jax.random.key(0), x, valid)
        with pytest.raises(AssertionError, match=r"non-finite leaves:\n  \[0\]: \d+ NaN"):
            checks.assert_finite(apply(variables, x, valid))
    with pytest.raises(ValueError, match="kinds must be drawn from"):
        st_tft.padding_masks(config, kinds=("middle",))


@pytest.mark.parametrize("overflow", [False, True])
def test_float16_overflow_that_zeroes_the_output_is_caught_by_the_gradient_check(overflow):
    x = np.asarray(
        st_tft._seeded_array("large", (2, 3, 8), 0, constant_axis=1), np.float16
    )  # |x| up to 1e4: x * x reaches 1e8 > float16's 65504
    module = HalfRMSNorm(overflow=overflow)
    variables, apply = _bound(module, x)
    checks.assert_finite(apply(variables, x))  # the overflow is silent: 0, not inf
    gradient = jax.jit(jax.grad(lambda v, x: jnp.sum(apply(v, x).astype(jnp.float32) ** 2), (0, 1)))
    if not overflow:
        checks.assert_nonzero_grads(gradient(variables, x))
        return
    with pytest.raises(AssertionError, match=r"\['params'\]\['scale'\]: norm"):
        checks.assert_nonzero_grads(gradient(variables, x))
