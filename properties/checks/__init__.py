"""Property checks for any JAX function: plain functions that raise `AssertionError`.

Each check takes a user function and concrete inputs, evaluates it on the
host side of `jit` and raises `AssertionError` with a message that names the
offending leaves (by pytree path), positions or samples (chex asserts tree
structures and shapes; the value comparisons are NumPy, in float64). Bad arguments to a
check raise `ValueError`/`TypeError` naming the argument. Nothing here
imports `tft_jax`: the checks work for any function of arrays and pytrees.

- `assert_finite(tree)`: every float leaf is free of NaN and inf.
- `assert_nonzero_grads(grads, min_norm, per_element)`: every leaf's L2 norm
  (or, with `per_element=True`, every element) exceeds `min_norm`.
- `assert_causal(fn, x, axis)`: outputs at steps `<= t` (and their gradient) ignore
  inputs at steps `> t`.
- `assert_ignores_padding(fn, x, valid)`: outputs at real steps (and their gradient)
  ignore the inputs at padded steps (`valid (B, T)` False).
- `assert_batch_independent(fn, x)`: sample `i`'s output and gradient ignore sample `j`.
- `assert_batch_order_equivariant(fn, x)`: permuting the batch permutes the output (every
  permutation: a random one and the two that generate them all).
- `assert_jit_matches_eager(fn, *args, compute_dtype=None)`: `jax.jit(fn)` equals op-by-op
  execution (`compute_dtype=jnp.bfloat16` for a function computing below its outputs' dtype;
  NaN/inf outputs fail unless `allow_nonfinite=True`).
- `assert_grads_match_finite_differences(fn, args)`: `jax.test_util.check_grads` in float64.
- `assert_ste_gradient(quantize_fn, ...)`: the gradient is the clipped-STE mask times `g`
  (up to 4 ulps of rounding).
- `assert_quantization_error_bounded(quantize_fn, ...)`: `|fq(x) - x| <= scale/2` in range.
- `assert_rounds_to_grid(quantize_fn, ...)`: `fq(x)` is the nearest grid point (ties to even).
- `assert_idempotent(fn, x)`: `fn(fn(x)) == fn(x)`.
- `assert_clipped(updates, max_norm)`: global norm bound (and optax's exact rescaling).
- `count_compiles()` / `assert_max_compiles(n)`: how many computations were lowered.

Functions with several outputs are checked in one call: `out_axis` takes an
int per part of the output (`out_axis=(1, 2)` for `fn -> (y, weights)`), and
`select` picks the parts to check (`select=lambda out: out.quantiles`). The
time checks ask for `out_axis` (`ValueError`) where the output's shapes leave
its time axis in doubt (a leaf of another shape than `x` with length `T` on
two axes) rather than guess.

Keeping a property suite fast (compile time dominates, not run time):

- Pass a function that calls a jitted function built once at module level
  (``apply = jax.jit(model.apply)``; ``fn = lambda x: apply(variables, x)``).
  The checks evaluate `fn` several times on inputs of one shape, so it
  compiles once per shape bucket; `jax.vjp` of such a closure reuses the
  compiled forward and backward across examples too.
- Give NumPy inputs; the checks build perturbations and cotangents in NumPy,
  never with eager `jnp` ops (each would compile once per new shape).
- `assert_jit_matches_eager` necessarily runs `fn` op by op; pass an already
  jitted `fn` so that the compiled side is reused rather than re-traced.
- Bound compiles explicitly with ``with checks.assert_max_compiles(n): ...``
  around a loop of examples, or with `chex.assert_max_traces` on a function
  that is jitted once::

      @jax.jit
      @chex.assert_max_traces(n=1)
      def step(params, x): ...

  (`chex.clear_trace_counter()` between tests). A second trace of ``step``
  then fails loudly instead of silently recompiling.
"""

from __future__ import annotations

from properties.checks.compiles import CompileLog, assert_max_compiles, count_compiles
from properties.checks.dependence import (
    assert_batch_independent,
    assert_batch_order_equivariant,
    assert_causal,
    assert_ignores_padding,
)
from properties.checks.numerics import (
    FLOAT32_FINITE_DIFFERENCE_EPS,
    FLOAT64_FINITE_DIFFERENCE_EPS,
    assert_grads_match_finite_differences,
    assert_jit_matches_eager,
)
from properties.checks.optimizer import assert_clipped
from properties.checks.quantization import (
    assert_idempotent,
    assert_quantization_error_bounded,
    assert_rounds_to_grid,
    assert_ste_gradient,
)
from properties.checks.values import assert_finite, assert_nonzero_grads

__all__ = [
    "FLOAT32_FINITE_DIFFERENCE_EPS",
    "FLOAT64_FINITE_DIFFERENCE_EPS",
    "CompileLog",
    "assert_batch_independent",
    "assert_batch_order_equivariant",
    "assert_causal",
    "assert_clipped",
    "assert_finite",
    "assert_grads_match_finite_differences",
    "assert_idempotent",
    "assert_ignores_padding",
    "assert_jit_matches_eager",
    "assert_max_compiles",
    "assert_nonzero_grads",
    "assert_quantization_error_bounded",
    "assert_rounds_to_grid",
    "assert_ste_gradient",
    "count_compiles",
]
