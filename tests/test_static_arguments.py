"""`tft_jax.static_arguments`: hashable values pass as they are, others by the identity of the
object, so one object shares a trace and an equal one built anew does not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tft_jax.static_arguments import ByIdentity, from_static_argument, is_hashable, static_argument


# Mutant S1 (static_arguments.py:22, `except TypeError: return False` -> `return True`)
def test_is_hashable_tells_hashable_from_unhashable_values():
    assert is_hashable((1, 2.0, "a")) and is_hashable(None) and is_hashable(frozenset({1}))
    assert not is_hashable([1, 2])
    assert not is_hashable({"a": 1})
    assert not is_hashable(np.ones(2))
    assert not is_hashable((1, [2]))  # a tuple holding a list does not hash either


# Mutants S2 (eq by wrapper identity), S3 (eq inverted), S4 (hash by wrapper identity),
# S8 (eq by value ==) -- static_arguments.py:35 and :38
def test_by_identity_compares_and_hashes_by_the_wrapped_object():
    features = [4, 2]
    first, second = ByIdentity(features), ByIdentity(features)
    assert first is not second
    assert first == second and hash(first) == hash(second)  # one object: one trace
    equal_copy = ByIdentity([4, 2])
    assert features == [4, 2] and first != equal_copy  # an equal object built anew: another
    array = np.ones(3)
    assert ByIdentity(array) == ByIdentity(array)
    assert ByIdentity(array) != ByIdentity(array.copy())  # no element-wise `==` (ambiguous)
    assert first != features and first != (4, 2)  # never equal to a bare value


# Mutants S5 (always wrap), S6 (condition inverted), S7 (no unwrap) -- static_arguments.py:43, :48
def test_static_argument_wraps_only_unhashable_values_and_round_trips():
    hashable = (8, (0.1, 0.5))
    assert static_argument(hashable) is hashable  # equal settings share a compile by value
    assert static_argument(None) is None
    mask = {"params": True}
    wrapped = static_argument(mask)
    assert isinstance(wrapped, ByIdentity) and wrapped.value is mask
    assert from_static_argument(wrapped) is mask
    assert from_static_argument(hashable) is hashable


# Mutants S2, S4, S5 as seen by jax.jit: the trace count is the observable effect.
def test_jit_traces_once_per_wrapped_object_and_once_per_equal_hashable_value():
    traces = []

    def body(static, x):
        traces.append(1)
        value = from_static_argument(static)
        return x * len(value)

    f = jax.jit(body, static_argnums=0)
    x = jnp.ones(2)
    features = [1, 2, 3]
    for _ in range(3):
        np.testing.assert_array_equal(f(static_argument(features), x), np.full(2, 3.0))
    assert len(traces) == 1  # one object, three fresh wrappers: one trace
    f(static_argument([1, 2, 3]), x)
    assert len(traces) == 2  # an equal list built anew traces again
    f(static_argument((1, 2)), x)
    f(static_argument((1, 2)), x)
    assert len(traces) == 3  # equal hashable tuples share one trace
