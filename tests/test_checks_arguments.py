"""The checks on users' own functions: arguments they refuse, inputs they must not
reshape, dtypes whose rounding they must allow, and the Hypothesis profiles.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from properties import checks
from properties.suite import assert_gradient_stays_in_sample, random_cotangent
from qat import fake_quantize

X = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)  # (B, T, D)


def cumulative(x):
    return jnp.cumsum(x, axis=1)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"axis": 1.0}, TypeError, r"axis must be an int, got 1\.0"),
        ({"seed": 1.5}, TypeError, r"seed must be an int >= 0, got 1\.5"),
        ({"seed": -1}, ValueError, r"seed must be an int >= 0, got -1"),
        ({"check_gradients": "no"}, TypeError, r"check_gradients must be a bool, got 'no'"),
    ],
)
def test_causal_refuses_arguments_of_the_wrong_kind_naming_them(kwargs, error, message):
    with pytest.raises(error, match=message):
        checks.assert_causal(cumulative, X, **kwargs)


def test_assert_nonzero_grads_refuses_a_per_element_flag_that_is_not_a_bool():
    # The text 'no' is truthy: it switched the per-element check on.
    grads = {"a": np.array([1.0, 0.0, 2.0], np.float32)}
    with pytest.raises(TypeError, match=r"per_element must be a bool, got 'no'"):
        checks.assert_nonzero_grads(grads, per_element="no")
    checks.assert_nonzero_grads(grads, per_element=np.bool_(False))  # the leaf's norm is live


ONE_SAMPLE_ONE_STEP = np.ones((1, 1, 2), np.float32)  # checks with nothing to compare


@pytest.mark.parametrize(
    "call",
    [
        lambda fn: checks.assert_causal(fn, ONE_SAMPLE_ONE_STEP),
        lambda fn: checks.assert_ignores_padding(fn, X, np.ones((2, 4), bool)),
        lambda fn: checks.assert_batch_independent(fn, ONE_SAMPLE_ONE_STEP),
        lambda fn: checks.assert_batch_order_equivariant(fn, ONE_SAMPLE_ONE_STEP),
        lambda fn: checks.assert_jit_matches_eager(fn, X),
        lambda fn: checks.assert_grads_match_finite_differences(fn, X),
        lambda fn: checks.assert_idempotent(fn, X),
    ],
)
def test_every_check_of_a_function_refuses_one_that_is_not_callable(call):
    # A batch of one (or no padding) passed without calling fn, whatever it was;
    # otherwise Python's own "'NoneType' object is not callable" named nothing.
    with pytest.raises(TypeError, match=r"fn must be a function of x, got NoneType None"):
        call(None)


@pytest.mark.parametrize(
    "check",
    [
        checks.assert_ste_gradient,
        checks.assert_quantization_error_bounded,
        checks.assert_rounds_to_grid,
    ],
)
def test_quantizer_checks_refuse_a_quantize_fn_that_is_not_callable(check):
    # Each used to fail inside its first call with "'int' object is not callable".
    x = np.linspace(-1, 1, 9, dtype=np.float32)
    with pytest.raises(TypeError, match=r"quantize_fn must be a function called as quantize_fn"):
        check(3, x, 0.1, 0, -8, 7)


def test_checks_that_trace_name_a_conversion_to_numpy_as_the_cause():
    def leaves_jax(v, scale, *args):
        return jnp.asarray(np.round(np.asarray(v) / scale) * scale)

    x = np.linspace(-1, 1, 9, dtype=np.float32)
    with pytest.raises(TypeError, match=r"quantize_fn cannot be differentiated with jax\.vjp"):
        checks.assert_ste_gradient(leaves_jax, x, 0.1, 0, -8, 7)
    # It used to blame a traced flag and suggest functools.partial.
    with pytest.raises(TypeError, match=r"converts a traced array to NumPy"):
        checks.assert_jit_matches_eager(lambda v: leaves_jax(v, 0.1), x)


def test_jit_matches_eager_multiplies_float32_in_full_off_cpu(monkeypatch):
    # A GPU's TF32 products may differ between the two sides by ~1e-3: the check
    # asks for full precision there, and leaves a precision the user set alone.
    seen = []

    def product(v):
        seen.append(jax.config.jax_default_matmul_precision)
        return v @ v.T

    square = np.eye(3, dtype=np.float32)
    checks.assert_jit_matches_eager(product, square)
    assert set(seen) == {None}  # the CPU computes float32 in full: nothing changed
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    seen.clear()
    checks.assert_jit_matches_eager(product, square)
    assert set(seen) == {"highest"}
    seen.clear()
    with jax.default_matmul_precision("bfloat16"):
        checks.assert_jit_matches_eager(product, square)
    assert set(seen) == {"bfloat16"}


def test_a_nested_list_of_numbers_is_refused_with_the_array_it_should_be():
    nested = X.tolist()
    with pytest.raises(TypeError, match=r"x\[0\]\[0\]\[0\] is a Python float: .*np\.asarray"):
        checks.assert_batch_independent(cumulative, nested)
    checks.assert_batch_independent(cumulative, np.asarray(nested, np.float32))


def test_a_tuple_of_inputs_is_refused_where_one_array_is_perturbed():
    # NumPy stacked (x, covariate) into one (2, B, T, D) array: axis 1 became the batch
    # and a causal model failed as "not causal".
    covariate = np.ones_like(X)
    for check in (checks.assert_causal, checks.assert_ignores_padding):
        args = () if check is checks.assert_causal else (np.ones((2, 4), bool),)
        with pytest.raises(TypeError, match=r"x must be one array, got a tuple of inputs"):
            check(lambda pair: cumulative(pair[0]) + pair[1], (X, covariate), *args)
    checks.assert_causal(lambda x: cumulative(x) + covariate, X)  # closed over: passes


def test_quantization_checks_refuse_a_scale_that_does_not_broadcast_and_a_nan_slack():
    x = np.linspace(-2, 2, 41, dtype=np.float32)
    with pytest.raises(ValueError, match=r"scale of shape \(3,\) does not broadcast to x's "):
        checks.assert_ste_gradient(fake_quantize, x, np.full(3, 0.1, np.float32), 0, -8, 7)
    with pytest.raises(ValueError, match=r"ulps must be finite and >= 0, got nan"):
        # With NaN slack every comparison was False: a quantizer returning 7 passed.
        checks.assert_quantization_error_bounded(
            lambda v, *args: jnp.full_like(v, 7.0), x, 0.1, 0, -8, 7, ulps=float("nan")
        )


def test_clipped_allows_the_rounding_of_half_precision_updates_and_names_bad_grads():
    grads = {"w": jnp.asarray(np.random.default_rng(1).normal(size=(64,)) * 3, jnp.bfloat16)}
    updates, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    checks.assert_clipped(updates, 1.0, grads=grads)  # failed at rtol 1e-5: norm 1.004
    with pytest.raises(AssertionError, match=r"global norm of updates is 2"):
        checks.assert_clipped({"w": grads["w"] * 0 + 2.0 / 8.0}, 1.0)  # norm 2 in bfloat16
    with pytest.raises(ValueError, match=r"grads must have the structure and shapes of updates"):
        checks.assert_clipped(updates, 1.0, grads={"w": grads["w"][:3]})


def test_jit_matches_eager_runs_numpy_inputs_as_jax_arrays_and_takes_python_numbers():
    scores = np.asarray(X[0], jnp.bfloat16)

    def attention(x):  # NumPy's bfloat16 @ gave float32 on the op-by-op side
        return jax.nn.softmax(x @ x.T / 8.0), {"count": x.shape[0], "scale": 0.5}

    checks.assert_jit_matches_eager(attention, scores)


def test_the_gradient_check_names_samples_outside_the_batch():
    outputs = jnp.ones((3, 2))
    with pytest.raises(ValueError, match=r"samples must lie in \[0, 3\), got \[5\]"):
        assert_gradient_stays_in_sample(lambda c: (c,), outputs, samples=[5])


def test_finite_differences_say_why_a_float32_carry_fails_under_the_float64_cast():
    class GRU(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.RNN(nn.GRUCell(4))(x)

    model = GRU()
    params = model.init(jax.random.key(0), X)
    with pytest.raises(TypeError, match=r"build the module with param_dtype=jnp\.float64, or "):
        checks.assert_grads_match_finite_differences(model.apply, (params, X), modes=("rev",))


def test_a_users_conftest_gets_the_profiles_by_importing_them(tmp_path: pathlib.Path):
    (tmp_path / "conftest.py").write_text("import properties.profiles  # noqa: F401\n")
    (tmp_path / "test_drawn.py").write_text(
        "from hypothesis import given, settings, strategies as st\n\n"
        "@given(st.integers())\n"
        "def test_examples(value):\n"
        "    print('EXAMPLES', settings.default.max_examples)\n"
    )
    for profile, count in (("dev", 5), ("ci", 15), ("thorough", 200)):
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
             f"--hypothesis-profile={profile}", "test_drawn.py"],
            cwd=tmp_path, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"EXAMPLES {count}" in run.stdout


def test_finite_differences_name_an_integer_output_instead_of_failing_a_correct_function():
    # check_grads raised a bare AssertionError: "derivatives of fn differ" with no report.
    with pytest.raises(TypeError, match=r"fn's output \[1\] has dtype int"):
        checks.assert_grads_match_finite_differences(
            lambda x: (jnp.sin(x), jnp.argmax(x)), (np.linspace(0.1, 1.0, 4),)
        )


def test_jit_matches_eager_names_a_python_flag_traced_under_jit():
    def flagged(x, deterministic):
        return x if deterministic else 2.0 * x

    with pytest.raises(TypeError, match=r"close over it \(functools.partial"):
        checks.assert_jit_matches_eager(flagged, X, True)


def test_random_cotangent_gives_integer_outputs_float0_and_checks_only_sample():
    # An integer leaf got int casts of ±U(0.5, 1.5): zeros at half the elements.
    like = {"codes": np.zeros((3, 4), np.int32), "x": np.zeros((3, 4), np.float32)}
    cotangent = random_cotangent(like, 0)
    assert cotangent["codes"].dtype == jax.dtypes.float0 and np.all(cotangent["x"] != 0)
    for bad, error in ((-1, ValueError), (3, ValueError), (1.0, TypeError)):
        with pytest.raises(error, match="only_sample"):
            random_cotangent(like, 0, only_sample=bad)


def test_gradient_sample_check_takes_its_samples_as_an_array():
    # `samples or None` raised "truth value of an array is ambiguous" (and a
    # one-element array [0] was falsy: every sample was tested).
    def leaky_pullback(cotangent):
        return cotangent + cotangent.sum(axis=0, keepdims=True)

    outputs = np.zeros((3, 2), np.float32)
    with pytest.raises(AssertionError, match="the gradient mixes samples"):
        assert_gradient_stays_in_sample(leaky_pullback, outputs, samples=np.array([0, 2]))
    assert_gradient_stays_in_sample(
        lambda cotangent: 2.0 * cotangent, outputs, samples=np.array([1])
    )


def batch_centered(x):
    return x - x.mean(axis=0, keepdims=True)  # mixes samples


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: checks.assert_batch_independent(batch_centered, X[:0]),
            r"x must hold at least one sample along axis 0, got leaf shapes \[\(0, 4, 3\)\]",
        ),
        (
            lambda: checks.assert_batch_order_equivariant(batch_centered, X[:0]),
            r"x must hold at least one sample along axis 0",
        ),
        (
            lambda: checks.assert_batch_independent(batch_centered, (X[:0], X[:0, :, 0]), axis=0),
            r"x must hold at least one sample along axis 0",
        ),
        (
            lambda: checks.assert_finite(np.zeros((0, 4), np.float32)),
            r"tree must hold at least one element, got leaf shapes \[\(0, 4\)\]",
        ),
        (
            lambda: checks.assert_finite({"w": np.zeros((0,)), "b": np.zeros((2, 0))}, name="g"),
            r"g must hold at least one element",
        ),
        (
            lambda: checks.assert_grads_match_finite_differences(
                jnp.sin, (np.zeros((0,), np.float32),)
            ),
            r"args must hold at least one element, got leaf shapes \[\(0,\)\]",
        ),
        (
            lambda: checks.assert_grads_match_finite_differences(lambda: jnp.ones(3), ()),
            r"args must hold at least one float array to differentiate fn at, got \(\)",
        ),
        (
            lambda: checks.assert_grads_match_finite_differences(lambda a: a[:0], (X,)),
            r"fn must return at least one non-empty array, got leaf shapes \[\(0, 4, 3\)\]",
        ),
    ],
)
def test_checks_refuse_inputs_with_no_element_to_check(call, message):
    # Each passed (or, for args=(), failed deep in check_grads with
    # "reduce() of empty iterable") without having checked anything.
    with pytest.raises(ValueError, match=message):
        call()


def test_batch_checks_pass_a_batch_of_one_and_finite_takes_a_tree_with_an_empty_leaf():
    # Documented passes: one sample has no other sample to mix with or to swap.
    checks.assert_batch_independent(batch_centered, X[:1])
    checks.assert_batch_order_equivariant(batch_centered, X[:1])
    checks.assert_finite({"w": np.ones(3), "empty": np.zeros((0,))})
    with pytest.raises(AssertionError, match=r"\['w'\]: 1 NaN"):
        checks.assert_finite({"w": np.array([1.0, np.nan]), "empty": np.zeros((0,))})


def test_a_tree_passed_as_fn_is_named_by_its_type_and_a_short_repr():
    params = {"params": {f"layer_{i}": {"kernel": np.ones((64, 64))} for i in range(20)}}
    with pytest.raises(
        TypeError, match=r"fn must be a function of x, got dict \{'params'"
    ) as error:
        checks.assert_jit_matches_eager(params, X)
    assert len(str(error.value)) < 150  # the full repr ran to thousands of characters
    assert len(repr(params)) > 5_000


@pytest.mark.parametrize(
    ("grads", "error", "message"),
    [
        ({}, ValueError, r"grads must hold at least one array, got PyTreeDef\(\{\}\)"),
        (None, ValueError, r"grads must hold at least one array, got PyTreeDef\(None\)"),
        ({"ids": np.arange(3)}, TypeError, r"grads must hold at least one float array .* int64"),
        (
            {"w": np.zeros((0, 2), np.float32), "ids": np.arange(3)},
            ValueError,
            r"the float leaves of grads must hold at least one element",
        ),
    ],
)
def test_nonzero_grads_refuses_a_tree_with_nothing_to_check(grads, error, message):
    # Each raised AssertionError ("has no non-empty float leaves"), as if a
    # gradient were dead, where assert_finite refuses the same trees as arguments.
    with pytest.raises(error, match=message):
        checks.assert_nonzero_grads(grads)


def test_finite_and_nonzero_grads_name_a_scalar_as_the_scalar():
    # "first at []" for a scalar leaf.
    with pytest.raises(AssertionError, match=r"<root>: the scalar is nan$"):
        checks.assert_finite(np.float32("nan"))
    with pytest.raises(AssertionError, match=r"\['t'\]: the scalar is -inf$"):
        checks.assert_finite({"t": jnp.float32(-np.inf), "w": np.ones(2, np.float32)})
    with pytest.raises(AssertionError, match=r"\['t'\] \(a scalar\): \|g\| 0$"):
        checks.assert_nonzero_grads({"t": np.float32(0.0)}, per_element=True)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_finite_differences_in_the_float32_fallback_refuse_narrow_float_arguments(dtype):
    # x + 1e-4 rounds back to x in bfloat16: a correct jnp.sin failed with
    # derivatives that differed by the dtype's rounding.
    x = X.astype(dtype)
    with pytest.raises(
        ValueError, match=rf"args\[0\] has dtype {np.dtype(dtype).name}: with use_x64=False"
    ) as error:
        checks.assert_grads_match_finite_differences(jnp.sin, (x,), use_x64=False)
    assert "keep use_x64=True" in str(error.value) and "cast them to float32" in str(error.value)
    checks.assert_grads_match_finite_differences(jnp.sin, (x,))  # cast to float64: passes
    checks.assert_grads_match_finite_differences(jnp.sin, (x.astype(np.float32),), use_x64=False)


def test_finite_differences_of_a_custom_vjp_in_forward_mode_say_to_pass_rev():
    @jax.custom_vjp
    def sine(a):
        return jnp.sin(a)

    sine.defvjp(lambda a: (jnp.sin(a), a), lambda a, g: (g * jnp.cos(a),))
    # JAX's bare "can't apply forward-mode autodiff (jvp) to a custom_vjp function".
    with pytest.raises(TypeError, match=r"forward-mode(.|\n)*pass modes=\('rev',\)"):
        checks.assert_grads_match_finite_differences(sine, (X,))
    checks.assert_grads_match_finite_differences(sine, (X,), modes=("rev",))


def test_jit_matches_eager_fails_on_non_finite_outputs_unless_they_are_allowed():
    # NaN matched NaN: a function NaN everywhere passed, having compared nothing.
    def nan_everywhere(a):
        return jnp.log(-jnp.abs(a) - 1)

    with pytest.raises(AssertionError, match=r"not finite(.|\n)*<root>: 24 NaN, 0 inf of 24"):
        checks.assert_jit_matches_eager(nan_everywhere, X)
    checks.assert_jit_matches_eager(nan_everywhere, X, allow_nonfinite=True)

    def masked_logits(a):  # -inf where masked: intended
        return jnp.where(jnp.tril(jnp.ones((4, 4), bool)), a[0] @ a[0].T, -jnp.inf)

    with pytest.raises(AssertionError, match=r"<root>: 0 NaN, 6 inf of 16 elements"):
        checks.assert_jit_matches_eager(masked_logits, X)
    checks.assert_jit_matches_eager(masked_logits, X, allow_nonfinite=True)
    with pytest.raises(TypeError, match="allow_nonfinite must be a bool"):
        checks.assert_jit_matches_eager(masked_logits, X, allow_nonfinite="yes")
