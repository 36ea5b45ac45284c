"""The model of the TensorCore's hardware PRNG that both the interpreter and the Mosaic
TPU executor implement, so that a kernel draws the same numbers on both paths.

It is a model, not the chip's generator (whose algorithm is not published): the state
that ``pltpu.prng_seed(s0, s1, ...)`` sets is a threefry key, ``key(0)`` with each seed
folded in (as uint32) in order; the ``n``-th ``pltpu.prng_random_bits(shape)`` after the
seed (counting from 0) returns ``jax.random.bits(fold_in(key, n), shape)`` as int32.
The draws use the partitionable threefry (JAX's default), whatever
``jax_threefry_partitionable`` says, so the bits do not depend on that flag.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def seeded_key(seeds) -> jax.Array:
    """The state ``prng_seed(*seeds)`` sets: a threefry key (typed)."""
    key = jax.random.key(jnp.uint32(0), impl="threefry2x32")
    for s in seeds:
        key = jax.random.fold_in(key, lax.convert_element_type(s, jnp.uint32))
    return key


def draw(key: jax.Array, n, shape) -> jax.Array:
    """The ``n``-th draw of ``shape`` from the state ``key``: int32 bits."""
    with jax.threefry_partitionable(True):
        bits = jax.random.bits(jax.random.fold_in(key, n), tuple(shape), jnp.uint32)
    return lax.bitcast_convert_type(bits, jnp.int32)


@functools.cache
def _host_draw(shape: tuple, nseeds: int):
    def f(seeds, n):
        return draw(seeded_key([seeds[i] for i in range(nseeds)]), n, shape)

    return jax.jit(f)


def host_draw(seeds, n: int, shape) -> np.ndarray:
    """:func:`draw` after ``prng_seed(*seeds)``, computed on the host CPU (the executor's
    use): numpy int32 bits."""
    seeds = np.asarray([np.int64(s) for s in seeds], np.int64).astype(np.uint32)
    cpu = jax.devices("cpu")[0]
    fn = _host_draw(tuple(int(d) for d in shape), len(seeds))
    return np.asarray(fn(jax.device_put(seeds, cpu), jax.device_put(np.uint32(n), cpu)))
