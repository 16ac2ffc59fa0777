"""Proof of power: deliberate faults in the real code, and the properties that catch each.

Run ``python -m properties.faults`` (options: ``--examples N``, ``--only
TEXT``, ``--list``, ``--cache-dir DIR``: a JAX compilation cache, none by
default, so that nothing is written to the current folder). Each `Fault` is
a context manager that patches the real code where it is looked up (a
module attribute, a class attribute, or a Flax method interceptor), so that
the project's own property checks (`properties.suite`) run against a broken
model, quantizer or optimizer. For each fault the runner draws a few cases
of every relevant property (derandomized, without shrinking), records which
properties fail, and prints a table. The same properties first run on the
real code (the baseline), where all must pass. Every fault must be caught
by at least one property; `tests/test_faults.py` runs the catalogue.

Faults change traced code, so compiled functions are dropped on entering
and leaving a fault (`properties.suite.clear_caches`). Jit-versus-eager
properties are left out of fault runs: op-by-op execution is slow, and
none of these faults depends on the execution mode.

`REFERENCE_FAULTS` are faults of the TFT's equations that leave every
structural property intact (a ReLU for the GRN's ELU, the LayerNorm epsilon
outside the square root, the decoder seeded with the static state, a
one-variable VSN deaf to its context). What catches them is a value-level
comparison with an independent float64 NumPy TFT, which lives with the tests
(`tests/reference_tft.py`), not in this package: `tests/test_reference_tft.py`
applies each of these patches and asserts that the comparison fails. They
have no properties here and are not part of `CATALOGUE`; they patch the
real code the same way (module attributes, Flax method interceptors) and
never change initialization (apply them to parameters initialized by the
real code).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from hypothesis import HealthCheck, Phase, Verbosity, given, settings

from properties import strategies as st_tft
from properties.suite import Property, clear_caches
from properties.suite import attention as attention_suite
from properties.suite import optimizer as optimizer_suite
from properties.suite import quantization as quantization_suite
from properties.suite import tft as tft_suite
from qat import dot_general, fake_quant, lsq, observers
from tft_jax import (
    attention,
    gating,
    interpretable_attention,
    layer_norm,
    linear,
    lstm,
    optimizer,
    variable_selection,
)
from tft_jax import model as tft_model

__all__ = [
    "CATALOGUE",
    "REFERENCE_FAULTS",
    "Fault",
    "FaultReport",
    "Outcome",
    "format_table",
    "main",
    "run_catalogue",
    "run_fault",
    "run_property",
]

DEFAULT_EXAMPLES = 3

# A preset with every static context, several history variables, categorical known and
# observed inputs and a 3-step horizon with the current step attendable (context routing,
# the categorical inputs and the decoder mask need all of them). The
# baseline's compiled pullback is the one `tests/test_properties_tft.py` uses: one cache entry.
FAULT_TFT_CONFIG = st_tft.TFT_PRESETS[1]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one property did on a few cases: `"passed"`, `"caught"` or `"error"`, and why."""

    status: str
    message: str = ""


@dataclasses.dataclass(frozen=True)
class Fault:
    """A deliberate bug: `patch()` is a context manager during which the real code is broken.

    `properties` are the relevant properties to run under it. `keeps_parameters`
    declares that the fault leaves initialization alone, so parameters
    initialized by the real code may be reused (one compile less per config).
    """

    name: str
    description: str
    patch: Callable[[], contextlib.AbstractContextManager[Any]]
    properties: tuple[Property, ...]
    keeps_parameters: bool = False  # init is unaffected: reuse the real code's parameters


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:160]


def _assertions_only(error: BaseException) -> bool:
    if isinstance(error, BaseExceptionGroup):
        return all(_assertions_only(inner) for inner in error.exceptions)
    return isinstance(error, AssertionError)


def run_property(prop: Property, examples: int = DEFAULT_EXAMPLES) -> Outcome:
    """Runs `prop.check` on `examples` derandomized cases, stopping at the first failure.

    Returns "caught" when a check raised `AssertionError`, "error" for any
    other exception (a property must fail by assertion, not by crashing),
    else "passed".
    """

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )
    @given(prop.strategy)
    def run(case: Any) -> None:
        prop.check(case)

    try:
        run()
    except Exception as error:
        status = "caught" if _assertions_only(error) else "error"
        return Outcome(status, _first_line(error))
    return Outcome("passed")


@contextlib.contextmanager
def _fresh_code(keep_parameters: bool = False) -> Iterator[None]:
    """Drops compiled functions on entry and exit, so traces see the code as patched now."""
    clear_caches(keep_parameters=keep_parameters)
    try:
        yield
    finally:
        clear_caches(keep_parameters=keep_parameters)


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Sets `owner.name = value` for the duration, then restores the original."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


# ---------------------------------------------------------------------------
# Attention block faults


def _kernel_wrapped(transform: Callable[..., Any]) -> Callable[[], Any]:
    """A fault replacing the block's attention kernel by `transform(real_kernel)`."""

    def patch() -> contextlib.AbstractContextManager[Any]:
        real = attention.scaled_dot_product_attention
        return _replaced(attention, "scaled_dot_product_attention", transform(real))

    return patch


class _UnscaledDropout(nn.Module):
    """`nn.Dropout` whose kept values are not divided by `1 - rate` (same masks' shape)."""

    rate: float

    @nn.compact
    def __call__(self, inputs: Any, deterministic: bool | None = None) -> Any:
        kept = nn.Dropout(self.rate)(inputs, deterministic=deterministic)
        return kept if deterministic or self.rate == 0.0 else kept * (1.0 - self.rate)


def _output_dropout_not_rescaled() -> contextlib.AbstractContextManager[Any]:
    """The block's dropouts outside the kernel (the output projection's) are not rescaled."""
    linen = types.SimpleNamespace(**vars(nn))
    linen.Dropout = _UnscaledDropout
    return _replaced(attention, "nn", linen)


def _gate_dropout_not_rescaled() -> contextlib.AbstractContextManager[Any]:
    """Every GLU's input dropout keeps its values undivided by `1 - rate`."""
    linen = types.SimpleNamespace(**vars(nn))
    linen.Dropout = _UnscaledDropout
    return _replaced(gating, "nn", linen)


def _head_zero_detached(real: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        output, weights = real(query, key, value, *args, **kwargs)
        if output.ndim == 4:  # (B, heads, T, head_dim)
            output = output.at[:, 0].set(jax.lax.stop_gradient(output[:, 0]))
        return output, weights

    return kernel


def _dropout_not_rescaled(real: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(
        query: Any,
        key: Any,
        value: Any,
        mask: Any = None,
        temperature: Any = 1.0,
        dropout_rate: float = 0.0,
        dropout_rng: Any = None,
        deterministic: bool = True,
    ) -> Any:
        output, weights = real(
            query, key, value, mask, temperature, dropout_rate, dropout_rng, deterministic
        )
        if not deterministic and dropout_rate > 0.0:
            output = output * (1.0 - dropout_rate)  # undoes the 1 / (1 - rate) rescaling
        return output, weights

    return kernel


def _shifted_mask(shift: int | None) -> Callable[..., np.ndarray]:
    """`causal_mask` that lets query `i` see `shift` steps ahead (None: no mask at all)."""

    def mask(num_queries: int, num_keys: int, attend_to_self: bool = True) -> np.ndarray:
        if shift is None:
            return np.ones((num_queries, num_keys), bool)
        query_steps = np.arange(num_keys - num_queries, num_keys)[:, None] + shift
        key_steps = np.arange(num_keys)[None, :]
        return key_steps <= query_steps if attend_to_self else key_steps < query_steps

    return mask


def _positional_encoding_removed() -> contextlib.AbstractContextManager[Any]:
    def zeros(length: int, dim: int, dtype: Any = np.float32) -> np.ndarray:
        return np.zeros((length, dim), dtype)

    return _replaced(attention, "sinusoidal_encoding", zeros)


def _positional_encoding_detached() -> contextlib.AbstractContextManager[Any]:
    def interceptor(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        if isinstance(context.module, attention.PositionalEncoding):
            args = (jax.lax.stop_gradient(args[0]), *args[1:])
        return next_fun(*args, **kwargs)

    return nn.intercept_methods(interceptor)


def _block_layer_norm(context: Any) -> bool:
    return isinstance(context.module, nn.LayerNorm) and isinstance(
        context.module.parent, attention.TemporalSelfAttention
    )


def _residual_removed() -> contextlib.AbstractContextManager[Any]:
    encoded: dict[str, Any] = {}

    def interceptor(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        if isinstance(context.module, attention.PositionalEncoding):
            encoded["h"] = next_fun(*args, **kwargs)
            return encoded["h"]
        if _block_layer_norm(context):
            return next_fun(args[0] - encoded["h"], *args[1:], **kwargs)  # LayerNorm(W_o · attn)
        return next_fun(*args, **kwargs)

    return nn.intercept_methods(interceptor)


def _layer_norm_removed() -> contextlib.AbstractContextManager[Any]:
    def interceptor(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        if _block_layer_norm(context):
            next_fun(*args, **kwargs)  # still creates its parameters
            return args[0]
        return next_fun(*args, **kwargs)

    return nn.intercept_methods(interceptor)


# ---------------------------------------------------------------------------
# TFT faults


class _PerHeadValues(interpretable_attention.InterpretableMultiHeadAttention):
    """The interpretable attention with one value projection per head (not shared)."""

    @nn.compact
    def __call__(
        self, queries: Any, keys_values: Any, mask: Any = None, deterministic: bool | None = True
    ) -> tuple[Any, Any]:
        del deterministic
        head_dim = self.features // self.num_heads

        def project(features: int, name: str, x: Any) -> Any:
            return linear.Linear(features, use_bias=False, name=name)(x)

        def split_heads(x: Any) -> Any:
            batch, steps, _ = x.shape
            return x.reshape(batch, steps, self.num_heads, head_dim).transpose(0, 2, 1, 3)

        query = split_heads(project(self.features, "query", queries))
        key = split_heads(project(self.features, "key", keys_values))
        value = split_heads(project(self.features, "value", keys_values))  # the fault
        heads, weights = attention.scaled_dot_product_attention(query, key, value, mask)
        return project(self.features, "out", jnp.mean(heads, axis=1)), weights


@contextlib.contextmanager
def _values_not_shared() -> Iterator[None]:
    with (
        _replaced(interpretable_attention, "InterpretableMultiHeadAttention", _PerHeadValues),
        _replaced(tft_model, "InterpretableMultiHeadAttention", _PerHeadValues),
    ):
        yield


def _enrichment_to_selection() -> contextlib.AbstractContextManager[Any]:
    """Feeds the static enrichment context to the variable selection networks."""
    contexts: dict[str, Any] = {}

    def interceptor(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        module = context.module
        if module.name == "static_context_enrichment" and context.method_name == "__call__":
            contexts["enrichment"] = next_fun(*args, **kwargs)
            return contexts["enrichment"]
        if (
            isinstance(module, variable_selection.VariableSelectionNetwork)
            and module.name in ("history_selection", "future_selection")
            and len(args) > 1
            and args[1] is not None
        ):
            args = (args[0], contexts["enrichment"], *args[2:])
        return next_fun(*args, **kwargs)

    return nn.intercept_methods(interceptor)


def _future_reads_history_codes() -> contextlib.AbstractContextManager[Any]:
    """The model reads the last `H` known codes of the history in place of the horizon's.

    An off-by-one-window bug in the categorical known inputs: the future
    selection never sees `future_categorical` (zeros without known history).
    """

    def interceptor(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        codes = kwargs.get("future_categorical")
        if (
            isinstance(context.module, tft_model.TemporalFusionTransformer)
            and context.method_name == "__call__"
            and codes is not None
        ):
            history = kwargs.get("known_categorical_history")
            horizon = codes.shape[1]
            if history is not None and history.shape[1] >= horizon:
                codes = history[:, -horizon:]
            else:
                codes = jnp.zeros_like(codes)
            kwargs = {**kwargs, "future_categorical": codes}
        return next_fun(*args, **kwargs)

    return nn.intercept_methods(interceptor)


# ---------------------------------------------------------------------------
# TFT equation faults (caught by the float64 reference, see REFERENCE_FAULTS)


@contextlib.contextmanager
def _relu_for_elu() -> Iterator[None]:
    """The GRN's ELU becomes a ReLU wherever the model looks it up (`nn.elu`, `jax.nn.elu`)."""
    with _replaced(nn, "elu", jax.nn.relu), _replaced(jax.nn, "elu", jax.nn.relu):
        yield


def _normalized_epsilon_outside(x: Any, epsilon: float) -> Any:
    """`(x - mean) / (sqrt(var) + eps)` over the last axis, statistics in at least float32."""
    wide = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = jnp.mean(wide, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(wide - mean), axis=-1, keepdims=True)
    return (wide - mean) / (jnp.sqrt(variance) + epsilon)  # the fault


@contextlib.contextmanager
def _layer_norm_epsilon_outside_sqrt() -> Iterator[None]:
    """Every LayerNorm divides by `sqrt(var) + eps` instead of `sqrt(var + eps)`.

    The TFT's gated LayerNorms (`FeatureLayerNorm`, and the chunked variable
    selection paths) all call `tft_jax.layer_norm.layer_norm`; the fault
    replaces the kernel they share.
    """

    def faulty(x: Any, scale: Any, bias: Any, epsilon: float) -> Any:
        return _normalized_epsilon_outside(x, epsilon) * scale + bias

    with _replaced(layer_norm, "_affine_normalize", faulty):
        yield


def _decoder_seeded_with_static_state() -> contextlib.AbstractContextManager[Any]:
    """The decoder LSTM starts from the static state `(c_h, c_c)`, not the encoder's final state."""
    contexts: dict[str, Any] = {}
    names = ("static_context_state_h", "static_context_state_c")

    def interceptor(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        module = context.module
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        if module.name in names:
            contexts[module.name] = next_fun(*args, **kwargs)
            return contexts[module.name]
        if isinstance(module, lstm.LSTM) and module.name == "decoder":
            seed = tuple(contexts[name] for name in names) if contexts else None
            if "initial_state" in kwargs:
                kwargs = {**kwargs, "initial_state": seed}
            else:
                args = (args[0], seed, *args[2:])
        return next_fun(*args, **kwargs)

    return nn.intercept_methods(interceptor)


def _single_variable_selection_ignores_context() -> contextlib.AbstractContextManager[Any]:
    """A one-variable VSN drops its static context (its only variable's GRN is unconditioned).

    The context is zeroed rather than left out: its GRN layer has no bias, so a
    zero context adds nothing, and the network (which refuses a call without
    the context it was initialized with) runs as if it had none.
    """

    def interceptor(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        module = context.module
        if (
            isinstance(module, variable_selection.VariableSelectionNetwork)
            and module.num_variables == 1
            and context.method_name == "__call__"
        ):
            if kwargs.get("context") is not None:
                kwargs = {**kwargs, "context": jnp.zeros_like(kwargs["context"])}
            elif len(args) > 1 and args[1] is not None:
                args = (args[0], jnp.zeros_like(args[1]), *args[2:])
        return next_fun(*args, **kwargs)

    return nn.intercept_methods(interceptor)


REFERENCE_FAULTS = (
    Fault(
        "tft: ReLU for ELU",
        "the gated residual networks use ReLU where the paper has ELU",
        _relu_for_elu,
        (),
        keeps_parameters=True,
    ),
    Fault(
        "tft: LayerNorm epsilon outside the square root",
        "(x - mean) / (sqrt(var) + eps) instead of (x - mean) / sqrt(var + eps)",
        _layer_norm_epsilon_outside_sqrt,
        (),
        keeps_parameters=True,
    ),
    Fault(
        "tft: decoder seeded with the static state",
        "the decoder LSTM starts from (c_h, c_c) instead of the encoder's final state",
        _decoder_seeded_with_static_state,
        (),
        keeps_parameters=True,
    ),
    Fault(
        "tft: one-variable selection ignores its context",
        "a variable selection network over one variable drops the static context",
        _single_variable_selection_ignores_context,
        (),
        keeps_parameters=True,
    ),
)


# ---------------------------------------------------------------------------
# Quantization faults


def _ste(fwd: Callable[..., Any], bwd: Callable[..., Any]) -> Any:
    """A fake quantizer with the real forward and the given VJP rule."""
    real = fake_quant._fake_quantize

    @functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
    def quantizer(x: Any, scale: Any, zero_point: Any, qmin: int, qmax: int) -> Any:
        return real(x, scale, zero_point, qmin, qmax)

    quantizer.defvjp(fwd, bwd)
    return quantizer


def _ste_without_mask() -> contextlib.AbstractContextManager[Any]:
    def bwd(qmin: int, qmax: int, residuals: Any, g: Any) -> Any:
        del qmin, qmax
        _, scale, zero_point = residuals
        return g, jnp.zeros_like(scale), jnp.zeros_like(zero_point)

    quantizer = _ste(fake_quant._fake_quantize_fwd, bwd)
    return _replaced(fake_quant, "_fake_quantize", quantizer)


def _ste_strict_at_bounds() -> contextlib.AbstractContextManager[Any]:
    real_fwd = fake_quant._fake_quantize_fwd

    def fwd(x: Any, scale: Any, zero_point: Any, qmin: int, qmax: int) -> Any:
        y, (_, scale_, zero_point_) = real_fwd(x, scale, zero_point, qmin, qmax)
        position = jnp.round(x / scale) + zero_point
        return y, ((position > qmin) & (position < qmax), scale_, zero_point_)  # > for >=

    quantizer = _ste(fwd, fake_quant._fake_quantize_bwd)
    return _replaced(fake_quant, "_fake_quantize", quantizer)


def _forward_without_rounding() -> contextlib.AbstractContextManager[Any]:
    """The forward only clips `x` to the grid's range; the gradient is the real STE.

    The error bound holds (the error is 0 in range) and clipping twice is
    clipping once: of the fake quantizer's own properties only the
    nearest-grid-point one sees it (the QAT layer's float64 reference too).
    """
    real = fake_quant._fake_quantize

    def quantizer(x: Any, scale: Any, zero_point: Any, qmin: int, qmax: int) -> Any:
        y = real(x, scale, zero_point, qmin, qmax)
        clipped = jnp.clip(x, (qmin - zero_point) * scale, (qmax - zero_point) * scale)
        return y + jax.lax.stop_gradient(clipped - y)

    return _replaced(fake_quant, "_fake_quantize", quantizer)


def _ties_away_from_zero() -> contextlib.AbstractContextManager[Any]:
    """The codes round ties away from zero (C's `round`) instead of to even."""

    def grid_position(x: Any, scale: Any, zero_point: Any) -> Any:
        ratio = x * jnp.reciprocal(scale)
        return jnp.sign(ratio) * jnp.floor(jnp.abs(ratio) + 0.5) + zero_point

    return _replaced(fake_quant, "_grid_position", grid_position)


def _observer_ignores_first_batch() -> contextlib.AbstractContextManager[Any]:
    """The first `observe` leaves the range as it was; the second batch starts it.

    The second batch is observed as a first one (`num_batches` 0): a
    moving-average observer would otherwise average it into the initial
    +-inf range and hold NaN for good, a different bug.
    """
    real = observers.QuantizationObserver.observe

    def observe(self: Any, x: Any) -> Any:
        second = self.num_batches == 1
        seen = real(self.replace(num_batches=jnp.where(second, 0, self.num_batches)), x)
        first = self.num_batches == 0
        return seen.replace(
            min_val=jnp.where(first, self.min_val, seen.min_val),
            max_val=jnp.where(first, self.max_val, seen.max_val),
            num_batches=self.num_batches + 1,
        )

    return _replaced(observers.QuantizationObserver, "observe", observe)


@contextlib.contextmanager
def _lsq_without_gradient_scale() -> Iterator[None]:
    """`default_grad_scale` is 1 wherever it is looked up.

    `lsq_fake_quantize` finds it in `qat.lsq`; the QAT layer's learnable-scale
    path imported its own name into `qat.dot_general`.
    """

    def unscaled(*args: Any) -> float:
        return 1.0

    with (
        _replaced(lsq, "default_grad_scale", unscaled),
        _replaced(dot_general, "default_grad_scale", unscaled),
    ):
        yield


def _rounding_without_ste() -> contextlib.AbstractContextManager[Any]:
    def plain(x: Any, scale: Any, zero_point: Any, qmin: int, qmax: int) -> Any:
        dtype = fake_quant.compute_dtype(x.dtype)
        position = jnp.round(x.astype(dtype) / scale) + zero_point
        return ((jnp.clip(position, qmin, qmax) - zero_point) * scale).astype(x.dtype)

    return _replaced(dot_general, "fake_quantize", plain)


# ---------------------------------------------------------------------------
# Optimizer faults


def _clip_after_adamw() -> contextlib.AbstractContextManager[Any]:
    real = optimizer.flat_adamw

    def adamw_then_clip(learning_rate: Any, *, clip_norm: Any = None, **kwargs: Any) -> Any:
        adamw = real(learning_rate, clip_norm=None, **kwargs)
        return (
            adamw if clip_norm is None else optax.chain(adamw, optax.clip_by_global_norm(clip_norm))
        )

    return _replaced(optimizer, "flat_adamw", adamw_then_clip)


def _clip_each_leaf(max_norm: float) -> optax.GradientTransformation:
    def update(updates: Any, state: Any, params: Any = None) -> Any:
        del params

        def clip(g: Any) -> Any:
            norm = jnp.sqrt(jnp.sum(jnp.square(g)))
            return jnp.where(norm < max_norm, g, g * (max_norm / norm))

        return jax.tree.map(clip, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _clipping_per_leaf() -> contextlib.AbstractContextManager[Any]:
    real = optimizer.flat_adamw

    def clip_each_leaf_then_adamw(
        learning_rate: Any, *, clip_norm: Any = None, **kwargs: Any
    ) -> Any:
        adamw = real(learning_rate, clip_norm=None, **kwargs)
        return adamw if clip_norm is None else optax.chain(_clip_each_leaf(clip_norm), adamw)

    return _replaced(optimizer, "flat_adamw", clip_each_leaf_then_adamw)


# ---------------------------------------------------------------------------
# The catalogue


def _without_jit_eager(properties: Sequence[Property]) -> tuple[Property, ...]:
    return tuple(prop for prop in properties if "jit == eager" not in prop.name)


def _attention_properties() -> tuple[Property, ...]:
    """The block properties on one informative shape: 2 heads, 5 steps (one compile per fault)."""
    shape = dict(num_heads=(2,), sequence_lengths=(5,))
    moderate = attention_suite.block_cases(kinds=attention_suite.MODERATE_KINDS, **shape)
    cases = {
        "attention: positions": attention_suite.block_cases(kinds=("constant",), **shape),
        "attention: unbiased dropout": attention_suite.dropout_cases(num_heads=(2,)),
        "attention: unbiased block dropout": attention_suite.block_dropout_cases(num_heads=(2,)),
        "attention: finite differences": attention_suite.block_cases(
            kinds=attention_suite.FINITE_DIFFERENCE_KINDS, **shape
        ),
    }
    return tuple(
        Property(prop.name, cases.get(prop.name, moderate), prop.check)
        for prop in _without_jit_eager(attention_suite.PROPERTIES)
    )


def _tft_properties() -> tuple[Property, ...]:
    """The model properties on `FAULT_TFT_CONFIG` (one compiled pullback per fault)."""
    cases = tft_suite.model_cases((FAULT_TFT_CONFIG,), kinds=("normal",))
    model_level = (
        tft_suite.check_finite,
        tft_suite.check_live_gradients,
        tft_suite.check_weights_are_distributions,
        tft_suite.check_causal,
        tft_suite.check_categorical_inputs_reach_the_forecast,
        tft_suite.check_batch_independent,
        tft_suite.check_batch_order_equivariant,
        tft_suite.check_context_routing,
    )
    names = {prop.check: prop.name for prop in tft_suite.PROPERTIES}
    return tuple(Property(names[check], cases, check) for check in model_level)


def _gate_dropout_property() -> Property:
    return Property(
        "tft: gate dropout is inverted",
        tft_suite.model_cases((FAULT_TFT_CONFIG,), kinds=("normal",)),
        tft_suite.check_gate_dropout_is_inverted,
    )


def _interpretable_attention_properties() -> tuple[Property, ...]:
    return (
        Property(
            "tft: interpretable attention",
            tft_suite.interpretable_attention_cases(num_heads=(2, 4)),
            tft_suite.check_attention_matches_reference,
        ),
    )


def _quantization_properties() -> tuple[Property, ...]:
    """The quantization properties on a 4-bit grid, one observer shape and 8-bit layers."""
    grid = st_tft.fake_quantize_cases(bits=(4,))
    observed = quantization_suite.observer_cases(shapes=((4, 8),))
    cases = {
        "fake quant: STE": grid,
        "fake quant: error bound": grid,
        "fake quant: nearest grid point": grid,
        "lsq: STE": grid,
        "lsq: gradient scale": grid,
        "qat layer: STE reference": quantization_suite.layer_cases(bits=(8,)),
    }
    return tuple(
        Property(prop.name, cases.get(prop.name, observed), prop.check)
        for prop in _without_jit_eager(quantization_suite.PROPERTIES)
    )


def _catalogue() -> tuple[Fault, ...]:
    block = _attention_properties()
    model = _tft_properties()
    quantization = _quantization_properties()
    optimizer = _without_jit_eager(optimizer_suite.PROPERTIES)

    def block_mask(shift: int | None) -> Callable[[], Any]:
        return lambda: _replaced(attention, "causal_mask", _shifted_mask(shift))

    return (
        Fault(
            "attention: stop_gradient in head 0",
            "head 0's output is detached: its Q/K/V projections stop learning",
            _kernel_wrapped(_head_zero_detached),
            block,
            keeps_parameters=True,
        ),
        Fault(
            "attention: causal mask dropped",
            "TemporalSelfAttention's mask allows every step",
            block_mask(None),
            block,
            keeps_parameters=True,
        ),
        Fault(
            "attention: causal mask shifted by one",
            "step t may attend to step t + 1",
            block_mask(1),
            block,
            keeps_parameters=True,
        ),
        Fault(
            "attention: positional encoding removed",
            "sinusoidal_encoding returns zeros",
            _positional_encoding_removed,
            block,
            keeps_parameters=True,
        ),
        Fault(
            "attention: positional encoding detached",
            "h = stop_gradient(x) + PE: no gradient reaches the input",
            _positional_encoding_detached,
            block,
            keeps_parameters=True,
        ),
        Fault(
            "attention: residual removed",
            "y = LayerNorm(W_o · attention) instead of LayerNorm(h + W_o · attention)",
            _residual_removed,
            block,
            keeps_parameters=True,
        ),
        Fault(
            "attention: LayerNorm removed",
            "y = h + W_o · attention, unnormalized",
            _layer_norm_removed,
            block,
            keeps_parameters=True,
        ),
        Fault(
            "attention: dropout not rescaled",
            "kept attention probabilities are not divided by 1 - rate",
            _kernel_wrapped(_dropout_not_rescaled),
            block,
            keeps_parameters=True,
        ),
        Fault(
            "attention: output dropout not rescaled",
            "the output projection's kept values are not divided by 1 - rate",
            _output_dropout_not_rescaled,
            # Only the block-dropout property can see it (the others run deterministically).
            tuple(prop for prop in block if prop.name == "attention: unbiased block dropout"),
            keeps_parameters=True,
        ),
        Fault(
            "tft: gate dropout not rescaled",
            "the GLUs' kept inputs are not divided by 1 - rate",
            _gate_dropout_not_rescaled,
            # Only the gate-dropout property can see it (the others run deterministically).
            (_gate_dropout_property(),),
            keeps_parameters=True,
        ),
        Fault(
            "tft: values not shared across heads",
            "the interpretable attention gets one value projection per head",
            _values_not_shared,
            _interpretable_attention_properties(),
        ),
        Fault(
            "tft: enrichment context to variable selection",
            "the static enrichment context replaces the selection context in both VSNs",
            _enrichment_to_selection,
            model,
            keeps_parameters=True,
        ),
        Fault(
            "tft: future selection reads the history's known codes",
            "future_categorical is replaced by the last H known codes of the history",
            _future_reads_history_codes,
            model,
            keeps_parameters=True,
        ),
        Fault(
            "tft: decoder mask shifted by one",
            "forecast step i attends to step i + 1",
            lambda: _replaced(tft_model, "causal_mask", _shifted_mask(1)),
            model,
            keeps_parameters=True,
        ),
        Fault(
            "fake quant: STE without clipping mask",
            "the gradient passes everywhere, saturated elements included",
            _ste_without_mask,
            quantization,
        ),
        Fault(
            "fake quant: STE strict at the bounds",
            "the mask uses qmin < code < qmax (> for >=): saturated bounds get no gradient",
            _ste_strict_at_bounds,
            quantization,
        ),
        Fault(
            "fake quant: forward without rounding",
            "the forward only clips x to the grid's range (error 0 in range)",
            _forward_without_rounding,
            quantization,
        ),
        Fault(
            "fake quant: ties away from zero",
            "codes round x / s = k + 1/2 away from zero, not to even",
            _ties_away_from_zero,
            quantization,
        ),
        Fault(
            "observer: ignores the first batch",
            "the range starts from the second batch",
            _observer_ignores_first_batch,
            quantization,
        ),
        Fault(
            "lsq: gradient without its scale",
            "the step-size gradient is not multiplied by 1/sqrt(N qmax)",
            _lsq_without_gradient_scale,
            quantization,
        ),
        Fault(
            "qat: rounding without STE",
            "the QAT layer differentiates round() itself: zero gradients",
            _rounding_without_ste,
            quantization,
        ),
        Fault(
            "optimizer: clipping after AdamW",
            "make_optimizer chains AdamW, then clip_by_global_norm",
            _clip_after_adamw,
            optimizer,
        ),
        Fault(
            "optimizer: clipping per leaf",
            "each leaf is clipped to clip_norm instead of the global norm",
            _clipping_per_leaf,
            optimizer,
        ),
    )


CATALOGUE = _catalogue()


@dataclasses.dataclass(frozen=True)
class FaultReport:
    """The outcome of every property of one run (a fault, or the baseline when `fault` is None)."""

    fault: Fault | None
    outcomes: dict[str, Outcome]
    seconds: float

    @property
    def caught_by(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if outcome.status == "caught"]

    @property
    def errors(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if outcome.status == "error"]


def run_fault(
    fault: Fault | None,
    properties: Sequence[Property],
    examples: int,
    stop_at_first_catch: bool = False,
) -> FaultReport:
    """Runs `properties` with `fault` applied (None: on the real code).

    With `stop_at_first_catch`, the properties after the first that catches
    the fault are not run (the report then lists only that one as catching it).
    """
    start = time.perf_counter()
    patch = contextlib.nullcontext() if fault is None else fault.patch()
    keep = fault is None or fault.keeps_parameters
    outcomes: dict[str, Outcome] = {}
    with _fresh_code(keep), patch:
        for prop in properties:
            outcomes[prop.name] = run_property(prop, examples)
            if stop_at_first_catch and outcomes[prop.name].status == "caught":
                break
    return FaultReport(fault, outcomes, time.perf_counter() - start)


def run_catalogue(
    faults: Sequence[Fault] = CATALOGUE,
    examples: int = DEFAULT_EXAMPLES,
    progress: Callable[[FaultReport], None] | None = None,
    stop_at_first_catch: bool = False,
) -> list[FaultReport]:
    """One baseline run of every property on the real code, then one run per fault.

    `stop_at_first_catch`: each fault run ends at the first property that
    catches it (enough to show that the suite catches it, and quicker).
    """
    properties = list({prop.name: prop for fault in faults for prop in fault.properties}.values())
    reports = [run_fault(None, properties, examples)]
    if progress:
        progress(reports[-1])
    for fault in faults:
        reports.append(run_fault(fault, fault.properties, examples, stop_at_first_catch))
        if progress:
            progress(reports[-1])
    return reports


def _describe(report: FaultReport) -> str:
    if report.fault is None:
        failed = [n for n, o in report.outcomes.items() if o.status != "passed"]
        if failed:
            return "FAILS ON THE REAL CODE: " + ", ".join(failed)
        return f"- (all {len(report.outcomes)} properties pass)"
    group = report.fault.name.split(": ", 1)[0]

    def short(name: str) -> str:
        prefix, _, rest = name.partition(": ")
        return rest if prefix == group else name

    caught = report.caught_by
    text = ", ".join(short(name) for name in caught) if caught else "NOT CAUGHT"
    if report.errors:
        text += "; errors: " + ", ".join(report.errors)
    return text


def format_table(reports: Sequence[FaultReport]) -> str:
    """A text table: fault -> the properties that caught it (baselines marked)."""
    rows = [
        (
            "(real code, baseline)" if r.fault is None else r.fault.name,
            _describe(r),
            f"{r.seconds:.0f}s",
        )
        for r in reports
    ]
    width = max(len(row[0]) for row in rows)
    lines = [f"{'fault'.ljust(width)}  {'time':>5}  caught by", "-" * (width + 60)]
    lines += [f"{name.ljust(width)}  {seconds:>5}  {text}" for name, text, seconds in rows]
    faults = [r for r in reports if r.fault is not None]
    caught = sum(bool(r.caught_by) for r in faults)
    lines.append(f"{caught} of {len(faults)} faults caught")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the table; the exit status is 1 if a fault escapes or a baseline fails."""
    parser = argparse.ArgumentParser(prog="python -m properties.faults", description=__doc__)
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, help="cases per property")
    parser.add_argument("--only", default="", help="run only faults whose name contains this")
    parser.add_argument("--list", action="store_true", help="list the faults and exit")
    parser.add_argument("--details", action="store_true", help="print each failure's message")
    parser.add_argument(
        "--cache-dir",
        default="",
        help=(
            "folder of a JAX persistent compilation cache to use (a warm cache saves minutes), "
            "e.g. ~/.cache/tft-jax/jax; by default none (nothing is written to the current "
            "folder), unless JAX_COMPILATION_CACHE_DIR names one"
        ),
    )
    args = parser.parse_args(argv)
    if args.cache_dir:
        args.cache_dir = os.path.expanduser(args.cache_dir)
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if args.examples < 1:
        parser.error(f"--examples must be >= 1, got {args.examples}")
    faults = [fault for fault in CATALOGUE if args.only in fault.name]
    if args.list:
        for fault in faults:
            print(f"{fault.name}: {fault.description}")
        return 0
    if not faults:
        parser.error(f"no fault name contains {args.only!r}")

    def progress(report: FaultReport) -> None:
        name = "baseline" if report.fault is None else report.fault.name
        print(f"  {name}: {_describe(report)} ({report.seconds:.0f}s)", file=sys.stderr)
        if args.details:
            for prop, outcome in report.outcomes.items():
                if outcome.status != "passed":
                    print(f"      {prop}: {outcome.message}", file=sys.stderr)

    reports = run_catalogue(faults, args.examples, progress)
    print(format_table(reports))
    baseline_ok = all(
        all(o.status == "passed" for o in r.outcomes.values()) for r in reports if r.fault is None
    )
    all_caught = all(r.caught_by for r in reports if r.fault is not None)
    return 0 if baseline_ok and all_caught else 1


if __name__ == "__main__":
    sys.exit(main())
