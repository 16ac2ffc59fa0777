"""Properties of `TemporalSelfAttention` and of the attention kernel's dropout.

A `BlockCase` is a block config and an input `(B, T, D)`. One jitted
function per block config, `pullback(params, x, dy) -> (y, weights,
param_grads, x_grad)`, serves every property (its forward half with a zero
cotangent), so a config costs two compiles: `init` and `pullback`.

Properties: finite outputs and gradients; a gradient to every parameter,
every head's columns and the input; causality; batch independence (forward
and backward); batch-order equivariance; jit == eager; derivatives ==
float64 finite differences; the documented formula (an independent NumPy
implementation); position awareness; the LayerNorm bound; unbiased
attention dropout, in the kernel and in the whole block.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from properties import checks
from properties import strategies as st_tft
from properties.suite import (
    PARAM_KEY_IMPL,
    Property,
    assert_gradient_stays_causal,
    assert_gradient_stays_in_sample,
    full_float32_matmuls,
    param_key,
    parameter_cache,
    platform_cache,
    random_cotangent,
)
from tft_jax import attention

__all__ = [
    "PROPERTIES",
    "BlockCase",
    "BlockDropoutCase",
    "DropoutCase",
    "block_cases",
    "block_dropout_cases",
    "check_batch_independent",
    "check_batch_order_equivariant",
    "check_block_dropout_unbiased",
    "check_causal",
    "check_dropout_unbiased",
    "check_finite",
    "check_grads_match_finite_differences",
    "check_jit_matches_eager",
    "check_layer_norm_bounds_output",
    "check_live_gradients",
    "check_matches_reference",
    "check_positions_distinguished",
    "dropout_cases",
]

HIDDEN_DIMS = (8,)
NUM_HEADS = (1, 2, 4)
SEQUENCE_LENGTHS = (1, 5)
BATCH_SIZE = 3
# Inputs on which every gradient is legitimately nonzero and float32 agrees with float64
# (1e4-sized inputs saturate the softmax: query and key gradients underflow to 0).
MODERATE_KINDS = ("normal", "constant", "tiny")
LAYER_NORM_EPSILON = 1e-6  # flax.linen.LayerNorm's default
DROPOUT_SAMPLES = 2048


class BlockCase(NamedTuple):
    """A block config and an input `x (B, T, D)` float32; `seed` drives cotangents."""

    config: st_tft.AttentionConfig
    x: np.ndarray
    seed: int


def block_cases(
    *,
    hidden_dims: Sequence[int] = HIDDEN_DIMS,
    num_heads: Sequence[int] = NUM_HEADS,
    sequence_lengths: Sequence[int] = SEQUENCE_LENGTHS,
    kinds: Sequence[str] = st_tft.INPUT_KINDS,
) -> st.SearchStrategy[BlockCase]:
    """`BlockCase`s of batch size 3 from `strategies.attention_configs` and `attention_inputs`."""
    configs = st_tft.attention_configs(
        hidden_dims=hidden_dims,
        num_heads=num_heads,
        sequence_lengths=sequence_lengths,
        batch_sizes=(BATCH_SIZE,),
    )

    @st.composite
    def draw(draw_: st.DrawFn) -> BlockCase:
        config = draw_(configs)
        x = draw_(st_tft.attention_inputs(config, kinds=kinds))
        return BlockCase(config, x, draw_(st.integers(0, 2**16)))

    return draw()


class _BlockFunctions(NamedTuple):
    params: Any
    pullback: Any


@parameter_cache
def _parameters(hidden_dim: int, num_heads: int) -> Any:
    """The block's `'params'` from a jitted `init`, once per block config."""
    block = attention.TemporalSelfAttention(hidden_dim, num_heads)
    return jax.jit(block.init)(param_key(), np.zeros((1, 2, hidden_dim), np.float32))["params"]


@platform_cache
def _functions(hidden_dim: int, num_heads: int) -> _BlockFunctions:
    """The block's parameters and its jitted pullback, built once per block config."""
    block = attention.TemporalSelfAttention(hidden_dim, num_heads)

    @jax.jit
    def pullback(params: Any, x: Any, dy: Any) -> tuple[Any, Any, Any, Any]:
        def forward(params: Any, x: Any) -> tuple[Any, Any]:
            return block.apply(
                {"params": params}, x, causal=True, deterministic=True, return_weights=True
            )

        (y, weights), vjp = jax.vjp(forward, params, x)
        param_grads, x_grad = vjp((dy, jnp.zeros_like(weights)))
        return y, weights, param_grads, x_grad

    return _BlockFunctions(_parameters(hidden_dim, num_heads), pullback)


def _block(case: BlockCase) -> _BlockFunctions:
    return _functions(case.config.hidden_dim, case.config.num_heads)


def _forward(case: BlockCase) -> Any:
    """`x -> (y (B, T, D), weights (B, T, heads, T))`: queries on axis 1 for `assert_causal`."""
    functions = _block(case)

    def forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y, weights, _, _ = functions.pullback(functions.params, x, np.zeros_like(x))
        return np.asarray(y), np.swapaxes(np.asarray(weights), 1, 2)

    return forward


def check_finite(case: BlockCase) -> None:
    """Outputs, attention weights and every gradient are finite, whatever the input scale."""
    functions = _block(case)
    dy = random_cotangent(case.x, case.seed)
    y, weights, param_grads, x_grad = functions.pullback(functions.params, case.x, dy)
    checks.assert_finite({"y": y, "weights": weights}, name="outputs")
    checks.assert_finite({"params": param_grads, "x": x_grad}, name="gradients")


def _head_slices(param_grads: Any, num_heads: int, head_dim: int) -> dict[str, np.ndarray]:
    """Each head's block of the Q/K/V kernels (columns) and of the output kernel (rows)."""
    slices = {}
    for head in range(num_heads):
        columns = slice(head * head_dim, (head + 1) * head_dim)
        for name in ("query", "key", "value"):
            slices[f"{name} head {head}"] = np.asarray(param_grads[name]["kernel"])[:, columns]
        slices[f"out head {head}"] = np.asarray(param_grads["out"]["kernel"])[columns]
    return slices


def check_live_gradients(case: BlockCase) -> None:
    """Every parameter leaf, every head's slice of Q/K/V/out, and the input get a gradient.

    Needs `T > 1` (one step gives its query and key no gradient) and moderate
    inputs (`MODERATE_KINDS`).
    """
    functions = _block(case)
    dy = random_cotangent(case.x, case.seed)
    _, _, param_grads, x_grad = functions.pullback(functions.params, case.x, dy)
    checks.assert_nonzero_grads(param_grads, name="parameter gradients")
    config = case.config
    checks.assert_nonzero_grads(
        _head_slices(param_grads, config.num_heads, config.head_dim), name="per-head gradients"
    )
    checks.assert_nonzero_grads(x_grad, name="input gradient")


def check_causal(case: BlockCase) -> None:
    """With `causal=True`, outputs and weights at step `t` ignore inputs after `t`, exactly.

    And so does the backward: the input gradient of the outputs up to `t` is
    zero after `t` (through the compiled pullback: the forward here returns NumPy).
    """
    # NumPy forward; time on axis 1 of y (B, T, D) and of the weights (B, T, heads, T).
    checks.assert_causal(_forward(case), case.x, out_axis=1, check_gradients=False)
    functions = _block(case)

    def input_gradient(dy: np.ndarray) -> Any:
        return functions.pullback(functions.params, case.x, dy)[3]

    assert_gradient_stays_causal(input_gradient, case.x, seed=case.seed)


def check_batch_independent(case: BlockCase) -> None:
    """Sample `i`'s output ignores sample `j`, and so does its gradient w.r.t. the input."""
    forward = _forward(case)
    checks.assert_batch_independent(forward, case.x, check_gradients=False)
    functions = _block(case)

    def input_gradient(dy: np.ndarray) -> Any:
        return functions.pullback(functions.params, case.x, dy)[3]

    assert_gradient_stays_in_sample(input_gradient, case.x, seed=case.seed)


def check_batch_order_equivariant(case: BlockCase) -> None:
    """Permuting the batch permutes the outputs and weights alike."""
    checks.assert_batch_order_equivariant(_forward(case), case.x)


def check_jit_matches_eager(case: BlockCase) -> None:
    """The compiled forward and backward equal their op-by-op execution."""
    functions = _block(case)
    dy = random_cotangent(case.x, case.seed)
    checks.assert_jit_matches_eager(functions.pullback, functions.params, case.x, dy)


@platform_cache
def _weighted_output(hidden_dim: int, num_heads: int) -> Any:
    """`(params, x) -> sum(y * W)` with a fixed, shape-derived weighting `W` (for `check_grads`)."""
    block = attention.TemporalSelfAttention(hidden_dim, num_heads)

    def weighted(params: Any, x: Any) -> Any:
        y: jax.Array = block.apply(  # type: ignore[assignment]  # flax: no mutable, the output alone
            {"params": params}, x, causal=True, deterministic=True
        )
        weights = np.cos(np.arange(math.prod(y.shape))).reshape(y.shape)
        return jnp.sum(y * jnp.asarray(weights, y.dtype))

    return weighted


def check_grads_match_finite_differences(case: BlockCase) -> None:
    """Forward and reverse derivatives w.r.t. parameters and input match float64 differences."""
    functions = _block(case)
    fn = _weighted_output(case.config.hidden_dim, case.config.num_heads)
    checks.assert_grads_match_finite_differences(fn, (functions.params, case.x))


def _reference_encoding(steps: int, dim: int) -> np.ndarray:
    """`PE[t, 2i] = sin(t / 10000^(2i/D))`, `PE[t, 2i+1] = cos(...)`, written from the formula."""
    encoding = np.zeros((steps, dim))
    for t in range(steps):
        for i in range(0, dim, 2):
            angle = t / 10000.0 ** (i / dim)
            encoding[t, i] = math.sin(angle)
            if i + 1 < dim:
                encoding[t, i + 1] = math.cos(angle)
    return encoding


def _reference_block(params: Any, x: np.ndarray, num_heads: int) -> np.ndarray:
    """The documented block in float64 NumPy: `LayerNorm(h + W_o · causal MHA(h))`, `h = x + PE`."""
    p = jax.tree.map(lambda leaf: np.asarray(leaf, np.float64), params)
    _, steps, dim = x.shape
    head_dim = dim // num_heads
    h = x.astype(np.float64) + _reference_encoding(steps, dim)
    q, k, v = (h @ p[name]["kernel"] + p[name]["bias"] for name in ("query", "key", "value"))
    attended = np.zeros_like(h)
    allowed = np.tril(np.ones((steps, steps), bool))
    for head in range(num_heads):
        columns = slice(head * head_dim, (head + 1) * head_dim)
        logits = q[..., columns] @ np.swapaxes(k[..., columns], 1, 2) / math.sqrt(head_dim)
        logits = np.where(allowed, logits, -np.inf)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        attended[..., columns] = weights @ v[..., columns]
    z = h + attended @ p["out"]["kernel"] + p["out"]["bias"]
    mean = z.mean(-1, keepdims=True)
    variance = ((z - mean) ** 2).mean(-1, keepdims=True)
    normalized = (z - mean) / np.sqrt(variance + LAYER_NORM_EPSILON)
    return normalized * p["layer_norm"]["scale"] + p["layer_norm"]["bias"]


def _require_parameters(params: Any, names: Sequence[str]) -> None:
    missing = [name for name in names if name not in params]
    if missing:
        raise AssertionError(
            f"the block lacks the documented parameters {missing} (has {sorted(params)})"
        )


def _perturbed(params: Any, seed: int) -> Any:
    """`params` with every element moved by `±U(0.125, 0.375)`, in the leaves' dtypes.

    Initialized biases are 0 and LayerNorm scales 1: a reference run on them
    cannot tell a bias added in the wrong place, or a scale and bias applied
    in the wrong order, from the documented formula.
    """
    return jax.tree.map(
        lambda leaf, step: (np.asarray(leaf) + 0.25 * step).astype(np.asarray(leaf).dtype),
        params,
        random_cotangent(params, seed),
    )


def check_matches_reference(case: BlockCase) -> None:
    """The block computes the documented formula (`API.md`), against float64 NumPy.

    With the initialized parameters perturbed (`_perturbed`), so that every
    bias and LayerNorm parameter takes part. Matrix products run in full
    float32 (`full_float32_matmuls`).
    """
    functions = _block(case)
    _require_parameters(functions.params, ("query", "key", "value", "out", "layer_norm"))
    params = _perturbed(functions.params, case.seed)
    with full_float32_matmuls():
        y = functions.pullback(params, case.x, np.zeros_like(case.x))[0]
    expected = _reference_block(params, case.x, case.config.num_heads)
    np.testing.assert_allclose(
        np.asarray(y, np.float64),
        expected,
        rtol=1e-4,
        atol=1e-4,
        err_msg="TemporalSelfAttention differs from LayerNorm(h + W_o causal-MHA(h)), h = x + PE",
    )


def check_positions_distinguished(case: BlockCase) -> None:
    """A sequence constant over time gets a different output at every step (positional encoding).

    Needs inputs constant along `T` (`kinds=("constant",)`) and `T > 1`.
    """
    y = np.asarray(_forward(case)(case.x)[0], np.float64)
    steps = y.shape[1]
    for sample in range(y.shape[0]):
        for t in range(steps):
            for s in range(t + 1, steps):
                gap = np.abs(y[sample, t] - y[sample, s]).max()
                if not gap > 1e-4:
                    raise AssertionError(
                        f"sample {sample}: steps {t} and {s} of a constant sequence give the "
                        f"same output (max |diff| {gap:.3g}): the block cannot tell positions apart"
                    )


def check_layer_norm_bounds_output(case: BlockCase) -> None:
    """Every output row is a LayerNorm output: `||y_t|| <= sqrt(D) max|scale| + ||bias||`.

    Holds for inputs of any magnitude (1e4 included).
    """
    functions = _block(case)
    _require_parameters(functions.params, ("layer_norm",))
    norm_params = functions.params["layer_norm"]
    scale = np.abs(np.asarray(norm_params["scale"], np.float64)).max()
    bias = np.linalg.norm(np.asarray(norm_params["bias"], np.float64))
    bound = math.sqrt(case.config.hidden_dim) * scale + bias
    y = np.asarray(_forward(case)(case.x)[0], np.float64)
    norms = np.linalg.norm(y, axis=-1)
    worst = np.unravel_index(np.argmax(norms), norms.shape)
    if not norms[worst] <= bound * (1 + 1e-5):
        raise AssertionError(
            f"output row [sample {worst[0]}, step {worst[1]}] has norm {norms[worst]:.4g} > "
            f"{bound:.4g} = sqrt(D) max|scale| + ||bias||: the output is not layer-normalized"
        )


class DropoutCase(NamedTuple):
    """Attention kernel operands `(B, heads, T, head_dim)` and a dropout rate."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    rate: float
    seed: int


def dropout_cases(
    *,
    num_heads: Sequence[int] = (1, 2),
    sequence_lengths: Sequence[int] = (5,),
    rates: Sequence[float] = (0.25,),
) -> st.SearchStrategy[DropoutCase]:
    """`DropoutCase`s with batch 2, head width 4 and standard normal operands."""

    @st.composite
    def draw(draw_: st.DrawFn) -> DropoutCase:
        shape = (2, draw_(st.sampled_from(num_heads)), draw_(st.sampled_from(sequence_lengths)), 4)
        operand = st_tft.float_arrays(shape, kinds=("normal",))
        return DropoutCase(
            draw_(operand),
            draw_(operand),
            draw_(operand),
            draw_(st.sampled_from(rates)),
            draw_(st.integers(0, 2**16)),
        )

    return draw()


@platform_cache
def _dropout_statistics() -> Any:
    """Jitted `(q, k, v, seed) -> (mean, std over dropout masks, deterministic output)`."""

    @functools.partial(jax.jit, static_argnames=("rate",))
    def statistics(query: Any, key: Any, value: Any, seed: Any, rate: float) -> Any:
        steps = query.shape[-2]
        mask = jnp.tril(jnp.ones((steps, steps), bool))

        def attend(dropout_rng: Any, deterministic: bool) -> Any:
            return attention.scaled_dot_product_attention(
                query,
                key,
                value,
                mask,
                dropout_rate=rate,
                dropout_rng=dropout_rng,
                deterministic=deterministic,
            )[0]

        keys = jax.random.split(jax.random.key(seed, impl=PARAM_KEY_IMPL), DROPOUT_SAMPLES)
        samples = jax.vmap(lambda k: attend(k, False))(keys)
        return samples.mean(0), samples.std(0), attend(None, True)

    return statistics


def check_dropout_unbiased(case: DropoutCase) -> None:
    """Attention dropout keeps the expected output: the mean over masks is the deterministic output.

    Inverted dropout rescales kept probabilities by `1 / (1 - rate)`. Over
    `DROPOUT_SAMPLES` masks every element's mean must lie within 6 standard
    errors of the deterministic output. And dropout must take place: with a
    rate above 0 every element varies over the masks (a kernel that ignores
    the rate or `deterministic=False` is trivially "unbiased").
    """
    mean, std, expected = (
        np.asarray(a, np.float64)
        for a in _dropout_statistics()(
            case.query, case.key, case.value, np.uint32(case.seed), rate=case.rate
        )
    )
    _assert_unbiased(mean, std, expected, case.rate, "attention dropout", "output")


def _assert_unbiased(
    mean: np.ndarray, std: np.ndarray, expected: np.ndarray, rate: float, what: str, value: str
) -> None:
    """Raises unless `value` varies over the masks (rate > 0) and its mean is within 6 SE.

    `mean`, `std`: over `DROPOUT_SAMPLES` masks; `expected`: the
    deterministic value; `what` and `value` name the dropout and the value.
    """
    dropout = f"{what} (rate {rate})"
    if rate > 0 and not np.all(std > 0):
        still = np.unravel_index(np.argmin(std), std.shape)
        raise AssertionError(
            f"{dropout} is not applied: at {[int(i) for i in still]} the {value} is the same "
            f"({mean[still]:.5g}) under all {DROPOUT_SAMPLES} masks"
        )
    tolerance = 6.0 * std / math.sqrt(DROPOUT_SAMPLES) + 1e-6 * (1.0 + np.abs(expected))
    bias = np.abs(mean - expected)
    if not np.all(bias <= tolerance):
        worst = np.unravel_index(np.argmax(bias / tolerance), bias.shape)
        raise AssertionError(
            f"{dropout} is biased: at {[int(i) for i in worst]} the mean of the {value} over "
            f"{DROPOUT_SAMPLES} masks is {mean[worst]:.5g}, its deterministic value "
            f"{expected[worst]:.5g} (ratio {mean[worst] / expected[worst]:.4g}, tolerance "
            f"{tolerance[worst]:.2g})"
        )


class BlockDropoutCase(NamedTuple):
    """A `BlockCase` and the block's dropout rate (attention probabilities and output)."""

    block: BlockCase
    rate: float


def block_dropout_cases(
    *,
    num_heads: Sequence[int] = (1, 2),
    sequence_lengths: Sequence[int] = (5,),
    rates: Sequence[float] = (0.1, 0.5),
) -> st.SearchStrategy[BlockDropoutCase]:
    """`BlockDropoutCase`s on standard normal inputs."""
    blocks = block_cases(num_heads=num_heads, sequence_lengths=sequence_lengths, kinds=("normal",))
    return st.builds(BlockDropoutCase, blocks, st.sampled_from(rates))


@platform_cache
def _block_dropout_statistics(hidden_dim: int, num_heads: int, rate: float) -> Any:
    """Jitted `(params, x, seed) -> (mean, std over masks, deterministic)` of the LayerNorm input.

    The block is `y = LayerNorm(h + Dropout(W_o · MultiHead(h)))`: what the
    LayerNorm reads is linear in each dropout mask (the attention
    probabilities' and the output's), so its mean over masks is its
    deterministic value. It is read with a Flax method interceptor.
    """
    block = attention.TemporalSelfAttention(hidden_dim, num_heads, dropout_rate=rate)

    def layer_norm_input(params: Any, x: Any, rng: Any) -> Any:
        seen = []

        def record(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
            if context.method_name == "__call__" and context.module.name == "layer_norm":
                seen.append(args[0])
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(record):
            block.apply(
                {"params": params},
                x,
                causal=True,
                deterministic=rng is None,
                rngs=None if rng is None else {"dropout": rng},
            )
        if len(seen) != 1:
            raise AssertionError(
                f"TemporalSelfAttention called its 'layer_norm' {len(seen)} times, not once: "
                "the block no longer has the documented form"
            )
        return seen[0]

    @jax.jit
    def statistics(params: Any, x: Any, seed: Any) -> Any:
        keys = jax.random.split(jax.random.key(seed, impl=PARAM_KEY_IMPL), DROPOUT_SAMPLES)
        samples = jax.vmap(lambda key: layer_norm_input(params, x, key))(keys)
        return samples.mean(0), samples.std(0), layer_norm_input(params, x, None)

    return statistics


def check_block_dropout_unbiased(case: BlockDropoutCase) -> None:
    """The block's dropout keeps the expected pre-LayerNorm value `h + W_o · MultiHead(h)`.

    Catches a dropout anywhere in the block that is not rescaled by `1 / (1 -
    rate)` (the output projection's as well as the attention probabilities'),
    or not applied: over `DROPOUT_SAMPLES` masks the mean of the LayerNorm's
    input must lie within 6 standard errors of its deterministic value, and
    it must vary over the masks.
    """
    config = case.block.config
    statistics = _block_dropout_statistics(config.hidden_dim, config.num_heads, case.rate)
    params = _parameters(config.hidden_dim, config.num_heads)
    mean, std, expected = (
        np.asarray(a, np.float64)
        for a in statistics(params, case.block.x, np.uint32(case.block.seed))
    )
    _assert_unbiased(mean, std, expected, case.rate, "block dropout", "LayerNorm's input")


def _moderate(**kwargs: Any) -> st.SearchStrategy[BlockCase]:
    return block_cases(kinds=MODERATE_KINDS, **kwargs)


# Finite differences compile three float64 functions per shape: a few shapes only. The
# step (1e-4) must be small against the inputs: 1e-6-sized ones make the LayerNorm of
# a near-zero row vary faster than central differences can follow.
FINITE_DIFFERENCE_CASES = dict(num_heads=(2,), sequence_lengths=(5,))
FINITE_DIFFERENCE_KINDS = ("normal", "constant")

PROPERTIES = (
    Property("attention: finite", block_cases(), check_finite),
    Property("attention: live gradients", _moderate(sequence_lengths=(5,)), check_live_gradients),
    Property("attention: causal", block_cases(), check_causal),
    Property("attention: batch independent", block_cases(), check_batch_independent),
    Property("attention: batch order", block_cases(), check_batch_order_equivariant),
    Property(
        "attention: jit == eager",
        _moderate(num_heads=(1, 2), sequence_lengths=(5,)),
        check_jit_matches_eager,
    ),
    Property(
        "attention: finite differences",
        block_cases(kinds=FINITE_DIFFERENCE_KINDS, **FINITE_DIFFERENCE_CASES),
        check_grads_match_finite_differences,
    ),
    Property("attention: reference", _moderate(), check_matches_reference),
    Property(
        "attention: positions",
        block_cases(sequence_lengths=(5,), kinds=("constant",)),
        check_positions_distinguished,
    ),
    Property("attention: layer norm bound", block_cases(), check_layer_norm_bounds_output),
    Property("attention: unbiased dropout", dropout_cases(), check_dropout_unbiased),
    Property(
        "attention: unbiased block dropout", block_dropout_cases(), check_block_dropout_unbiased
    ),
)
