"""Threefry-2x32 keys whose random draws are computed inline on CPU, with JAX's exact bits.

JAX lowers the Threefry-2x32 hash on CPU as a rolled loop over its five
four-round blocks (small code, quick to compile): a `while` loop per draw
that writes the whole counter state to memory and reads it back five times.
A training step draws one dropout mask per dropout layer, so on CPU those
loops, the copies around them and their compile time are a visible part of
the step. This module registers a PRNG implementation
(`jax.extend.random.define_prng_impl`) that is Threefry-2x32 in every
respect, same key data, same `split`, `fold_in` and `random_bits` results,
but computes the bits of a draw (of at least `INLINE_MIN_SIZE` values: by
default every draw) as straight-line integer arithmetic (the twenty rounds
unrolled), which XLA fuses into one loop-free kernel. Key derivations
(`split`, `fold_in`) keep JAX's own implementation: they hash a handful of
counters, where the rolled loop's smaller code compiles faster.

`inline_threefry_key(key)` re-types a Threefry key (typed or raw `uint32[2]`)
to this implementation on CPU and returns any other key unchanged; the
training step applies it to the dropout key, so dropout masks, and thus
training, are bit-identical to the built-in implementation's.

References:
  Salmon, Moraes, Dror, Shaw. "Parallel random numbers: as easy as 1, 2, 3."
  SC 2011 (Threefry). JAX's `jax._src.random.threefry2x32` for the key
  schedule, rotations and counter layout (`jax_threefry_partitionable`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.extend.random as jex_random
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = Any

# Draws of at least this many values are computed inline, smaller ones by JAX's
# rolled loop. Every draw: a small model's step is bound by its number of
# kernels, and each rolled draw adds a loop and the copies around it.
INLINE_MIN_SIZE = 1

# Threefry-2x32's rotation constants, alternating by block of four rounds.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = np.uint32(0x1BD11BDA)
_BUILTIN = "threefry2x32"
_UINT_DTYPES = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def _rotate_left(x: Array, distance: int) -> Array:
    return lax.shift_left(x, np.uint32(distance)) | lax.shift_right_logical(
        x, np.uint32(32 - distance)
    )


def threefry2x32(key: Array, count_hi: Array, count_lo: Array) -> tuple[Array, Array]:
    """The Threefry-2x32 hash (20 rounds) of the counter pairs, unrolled: `(hi, lo)` `uint32`."""
    schedule = (key[0], key[1], key[0] ^ key[1] ^ _KEY_PARITY)
    x0, x1 = count_hi + schedule[0], count_lo + schedule[1]
    for block in range(5):
        for distance in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, distance) ^ x0
        x0 = x0 + schedule[(block + 1) % 3]
        x1 = x1 + schedule[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def _flat_index(shape: tuple[int, ...]) -> Array:
    """`uint32` row-major index of every element of `shape` (fewer than 2**32 elements)."""
    index = jnp.zeros(shape, np.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        index = index + lax.broadcasted_iota(np.uint32, shape, axis) * np.uint32(stride)
        stride *= shape[axis]
    return index


def _builtin(key: Array) -> Array:
    return jax.random.wrap_key_data(key, impl=_BUILTIN)


def _random_bits(key: Array, bit_width: int, shape: tuple[int, ...]) -> Array:
    size = math.prod(shape)
    inline = (
        bit_width in _UINT_DTYPES
        and INLINE_MIN_SIZE <= size < 2**32
        and jax.config.jax_threefry_partitionable  # type: ignore[attr-defined]  # a flag jax adds at runtime
    )
    if not inline:
        dtype = np.dtype(f"uint{bit_width}")
        return jax.random.bits(_builtin(key), shape, dtype)
    # The partitionable layout: element i hashes the counter pair (0, i) and
    # keeps the XOR of the two output words.
    hi, lo = threefry2x32(key, jnp.zeros(shape, np.uint32), _flat_index(shape))
    bits = hi ^ lo
    return bits if bit_width == 32 else lax.convert_element_type(bits, _UINT_DTYPES[bit_width])


def _seed(seed: Array) -> Array:
    return jax.random.key_data(jax.random.key(seed, impl=_BUILTIN))


def _split(key: Array, shape: tuple[int, ...]) -> Array:
    return jax.random.key_data(jax.random.split(_builtin(key), shape))


def _fold_in(key: Array, data: Array) -> Array:
    return jax.random.key_data(jax.random.fold_in(_builtin(key), data))


INLINE_THREEFRY = jex_random.define_prng_impl(
    key_shape=(2,),
    seed=_seed,
    split=_split,
    random_bits=_random_bits,
    fold_in=_fold_in,
    name="threefry2x32_inline",
    tag="tfi",
)


def _is_builtin_threefry(key: Array) -> bool:
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return str(jax.random.key_impl(key)) == _BUILTIN
    # A raw key (`jax.random.PRNGKey`) uses the default implementation.
    return (
        key.dtype == np.uint32
        and key.shape[-1:] == (2,)
        and str(jax.config.jax_default_prng_impl) == _BUILTIN  # type: ignore[attr-defined]  # a flag jax adds at runtime
    )


def inline_threefry_key(key: Array) -> Array:
    """`key` under `INLINE_THREEFRY` on CPU if it is a Threefry-2x32 key; otherwise `key` itself.

    Every draw from the result equals the same draw from `key` bit for bit;
    on CPU the draws compile to loop-free kernels. Keys of other
    implementations (`rbg`, `unsafe_rbg`, a user's own) and every key on
    other backends (whose Threefry kernels are not loops) pass through.
    Works on traced keys, and on arrays of keys `(..., )` / raw `(..., 2)`.
    """
    if jax.default_backend() != "cpu" or not _is_builtin_threefry(key):
        return key
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key, impl=_BUILTIN)
    return jax.random.wrap_key_data(jax.random.key_data(key), impl=INLINE_THREEFRY)
