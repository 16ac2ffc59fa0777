"""The project's own property suite: check functions over drawn cases, for tests and fault runs.

Each submodule pairs Hypothesis strategies of *cases* (a config plus NumPy
data) with *check functions* `check_*(case)` that raise `AssertionError`
when a property of the real code fails:

- `properties.suite.attention`: the attention kernel and `TemporalSelfAttention`.
- `properties.suite.tft`: the full `TemporalFusionTransformer` and its
  interpretable attention.
- `properties.suite.qat_tft`: the quantization-aware TFT.
- `properties.suite.quantization`: `fake_quantize`, LSQ, observers, the QAT dense layer.
- `properties.suite.optimizer`: `make_optimizer` and `train_step`.

`tests/test_properties_*.py` run them under `@given` on every platform;
`properties.faults` runs them against deliberately broken code. Each module
lists its `PROPERTIES` (name, strategy, check) for such runs.

Code under test is looked up through its module at call time (``attention.
TemporalSelfAttention``, not a name imported once), and compiled functions
are cached per config by `platform_cache`, which `clear_caches` empties: so
a patched module is traced afresh.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from properties import backends
from properties.checks import dependence

__all__ = [
    "CI_EXAMPLES",
    "PARAM_KEY_IMPL",
    "Property",
    "assert_gradient_stays_causal",
    "assert_gradient_stays_in_sample",
    "clear_caches",
    "examples",
    "full_float32_matmuls",
    "param_key",
    "parameter_cache",
    "platform_cache",
    "random_cotangent",
    "zeros_like_tree",
]

# The number of examples of the `ci` Hypothesis profile (`properties.profiles`).
CI_EXAMPLES = 15

# RngBitGenerator keys: a TFT's initializers compile ~2.5x faster than with threefry.
PARAM_KEY_IMPL = "rbg"


class Property(NamedTuple):
    """A named property: cases drawn from `strategy`, each checked by `check(case)`."""

    name: str
    strategy: Any
    check: Callable[[Any], None]


def examples(ci_examples: int) -> int:
    """Examples for a test that runs `ci_examples` in the `ci` profile, scaled to the active one.

    `dev` (5 by default) gives a third, `thorough` (200) about 13 times as many.
    """
    from hypothesis import settings

    active = settings.default
    if active is None:  # None only before hypothesis loads its first profile
        raise RuntimeError("examples: hypothesis has no settings profile loaded")
    return max(1, active.max_examples * ci_examples // CI_EXAMPLES)


def full_float32_matmuls() -> contextlib.AbstractContextManager[None]:
    """Float32 matrix products at full precision, for checks against float64 references.

    GPUs multiply float32 matrices in TF32 by default (inputs rounded to 10
    mantissa bits, relative errors near 1e-3), which a reference check's
    tolerance would read as a wrong formula. Such a check tests the formula,
    not the backend's precision choice; CPUs compute float32 in full either way.
    """
    return jax.default_matmul_precision("highest")


_CACHES: list[tuple[Any, bool]] = []


def _platform_keyed(fn: Callable[..., Any], holds_parameters: bool) -> Callable[..., Any]:
    @functools.cache
    def keyed(platform: str, *args: Any) -> Any:
        del platform
        return fn(*args)

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        return keyed(backends.current_platform(), *args)

    wrapper.cache_clear = keyed.cache_clear  # type: ignore[attr-defined]
    _CACHES.append((keyed, holds_parameters))
    return wrapper


def platform_cache(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`functools.cache` keyed also by the current platform, emptied by `clear_caches`.

    For functions that build jitted functions for a (hashable) config: each
    is built once per config and platform.
    """
    return _platform_keyed(fn, holds_parameters=False)


def parameter_cache(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`platform_cache` for initialized parameters; `clear_caches(keep_parameters=True)` keeps them.

    A fault that leaves the parameter tree alone can then reuse the
    parameters initialized by the real code instead of compiling `init` again.
    """
    return _platform_keyed(fn, holds_parameters=True)


def clear_caches(*, keep_parameters: bool = False) -> None:
    """Drops the functions built by `platform_cache` and JAX's compiled-function caches.

    Call it after patching code under test, so that the next call traces the
    patched code, and after restoring it. Parameters (`parameter_cache`)
    survive with `keep_parameters=True`.
    """
    for cache, holds_parameters in _CACHES:
        if not (keep_parameters and holds_parameters):
            cache.cache_clear()
    jax.clear_caches()


def param_key(seed: int = 0) -> Any:
    """A PRNG key for parameter initialization (`PARAM_KEY_IMPL`)."""
    return jax.random.key(seed, impl=PARAM_KEY_IMPL)


def random_cotangent(like: Any, seed: int, *, only_sample: int | None = None) -> Any:
    """NumPy cotangents shaped like the arrays of `like`: `±U(0.5, 1.5)`, never zero.

    With `only_sample=i`, every leaf is zero except sample `i` of its first
    axis (`0 <= i <` that axis' length). Integer and boolean leaves have no
    cotangent but JAX's `float0` zeros, which they get (an integer cast of
    `±U(0.5, 1.5)` was zero at half the elements).
    """
    rng = np.random.default_rng(seed)
    if only_sample is not None:
        _check_only_sample(only_sample, like)

    def draw(leaf: Any) -> np.ndarray:
        shape, dtype = np.shape(leaf), _dtype_of(leaf)
        if not jnp.issubdtype(dtype, jnp.inexact):  # NumPy does not count bfloat16
            return np.zeros(shape, jax.dtypes.float0)
        values = rng.uniform(0.5, 1.5, shape) * rng.choice((-1.0, 1.0), shape)
        if only_sample is not None:
            keep = np.zeros(shape, bool)
            keep[only_sample] = True
            values = np.where(keep, values, 0.0)
        return values.astype(dtype)

    return jax.tree.map(draw, like)


def _check_only_sample(only_sample: Any, like: Any) -> None:
    """Raises unless `only_sample` is an int indexing the first axis of every leaf of `like`."""
    if isinstance(only_sample, bool) or not isinstance(only_sample, numbers.Integral):
        raise TypeError(f"only_sample must be an int or None, got {only_sample!r}")
    for leaf in jax.tree.leaves(like):
        shape = np.shape(leaf)
        if not shape or not 0 <= int(only_sample) < shape[0]:
            raise ValueError(
                f"only_sample={only_sample} must index the first axis of every leaf "
                f"(0 <= only_sample < its length), got a leaf of shape {shape}"
            )


def zeros_like_tree(like: Any) -> Any:
    """NumPy zeros shaped and typed like the arrays of `like`."""
    return jax.tree.map(lambda leaf: np.zeros(np.shape(leaf), _dtype_of(leaf)), like)


def _dtype_of(leaf: Any) -> np.dtype:
    """An array's (or an abstract array's) dtype; a Python number's as NumPy reads it."""
    dtype = getattr(leaf, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.asarray(leaf).dtype


def assert_gradient_stays_causal(
    pullback: Callable[[Any], Any], outputs: Any, *, seed: int = 0, axis: int = 1
) -> None:
    """Asserts that a cotangent on the outputs up to step `t` gives zero input gradient after `t`.

    The backward half of causality, for a compiled pullback (the check
    `checks.assert_causal` runs on a `jax.vjp`): for every step `t` but the
    last, the cotangent is random on steps `<= t` of `axis` and zero after,
    and every input gradient must be exactly zero at the steps after `t`. A
    forward can be causal while its backward is not (a mask applied to the
    values but not inside a custom gradient).

    Args:
      pullback: `cotangents -> input gradients` (a pytree, every leaf with its
        time steps on `axis`, as the outputs).
      outputs: the outputs (a pytree of arrays, time on `axis`) the cotangents match.
      seed: seed of the cotangents.
      axis: the time axis of the outputs and the input gradients.

    Raises:
      AssertionError: naming the input leaf, `t` and the first later step reached.
    """
    _assert_no_pullback_leaks(
        dependence._causal_pullback_leaks,
        pullback,
        outputs,
        axis,
        lambda steps: range(steps - 1),
        seed,
        "the gradient is not causal",
    )


def assert_gradient_stays_in_sample(
    pullback: Callable[[Any], Any], outputs: Any, *, seed: int = 0, samples: Sequence[int] = ()
) -> None:
    """Asserts that a cotangent on sample `i`'s outputs gives zero input gradient at every `j != i`.

    The backward half of batch independence, for a compiled pullback.

    Args:
      pullback: `cotangents -> input gradients` (a pytree, every leaf batched on axis 0).
      outputs: the outputs (a pytree of arrays batched on axis 0) the cotangents match.
      seed: seed of the cotangents.
      samples: the samples `i` to test (default: all).

    Raises:
      AssertionError: naming the input leaf and the pair `(i, j)`.
    """
    _assert_no_pullback_leaks(
        dependence._sample_pullback_leaks,
        pullback,
        outputs,
        0,
        lambda batch: dependence._samples(
            None if samples is None or len(samples) == 0 else samples, batch
        ),
        seed,
        "the gradient mixes samples",
    )


def _check_pullback_arguments(leaves: list[np.ndarray], axis: Any, seed: Any) -> None:
    """Raises naming `outputs`, `axis` or `seed` where the leak finders would fail deep."""
    if not leaves:
        raise ValueError("outputs must hold at least one array, got an empty pytree")
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int, got {axis!r}")
    too_short = [leaf.shape for leaf in leaves if not -leaf.ndim <= int(axis) < leaf.ndim]
    if too_short:
        raise ValueError(f"axis {axis} is out of range for an output of shape {too_short[0]}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")


def _assert_no_pullback_leaks(
    find_leaks: Callable[..., list[str]],
    pullback: Callable[[Any], Any],
    outputs: Any,
    axis: int,
    positions: Callable[[int], Sequence[int]],
    seed: int,
    failure: str,
) -> None:
    """Runs a `checks` pullback-leak finder on a compiled pullback; raises listing the leaks.

    `find_leaks` is `dependence._causal_pullback_leaks` or
    `dependence._sample_pullback_leaks`; `positions(n)` gives the steps or
    samples to test from the size `n` of the outputs' `axis`. Gradients must
    be exactly zero where they should not reach.
    """
    leaves, treedef = jax.tree_util.tree_flatten(outputs)
    leaves = [np.asarray(leaf) for leaf in leaves]
    _check_pullback_arguments(leaves, axis, seed)
    problems = find_leaks(
        lambda cotangents: pullback(jax.tree_util.tree_unflatten(treedef, cotangents)),
        leaves,
        [axis] * len(leaves),
        axis,
        positions(int(leaves[0].shape[axis])),
        atol=0.0,
        seed=seed,
        name="inputs",
    )
    if problems:
        shown = "\n  ".join(problems[:6])
        raise AssertionError(f"{failure} ({len(problems)} leaks):\n  {shown}")
