"""Lowering rules of JAX's threefry PRNG primitives (what ``jax.random`` binds once a
kernel's typed keys are their uint32 words, see ``keys``): ``iota_2x32_shape`` (the
counters) and ``threefry2x32`` (the hash), both on int32 vectors, Mosaic having no
unsigned types (uint32 arithmetic is int32's, bit for bit)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxlib.mlir.dialects import arith

from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.lowering.common import aval_in, aval_out, const, iota
from pallas_tpu._src.lowering.engine import lower_jaxpr, rule


@rule(jc.iota_2x32_shape_p)
def _iota_2x32_shape(lctx, eqn):
    """The row-major index of every element as a 64-bit count in two words: the high
    word is 0 (a kernel's vector has far fewer than 2**32 elements), the low one the sum
    of each dim's iota times its stride."""
    shape = tuple(eqn.params["shape"])
    if math.prod(shape) >= 2**32:
        raise NotImplementedError(f"iota_2x32_shape of {shape}: 2**32 elements or more")
    lo = None
    stride = 1
    for d in reversed(range(len(shape))):
        term = iota(shape, d)
        if stride != 1:
            term = arith.muli(term, const(shape, jnp.int32, stride))
        lo = term if lo is None else arith.addi(lo, term)
        stride *= shape[d]
    if lo is None:  # rank 0 (jax.random makes zeros itself; for completeness)
        lo = const((), jnp.int32, 0)
    return [const(shape, jnp.int32, 0), lo]


# Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy as
# 1, 2, 3", SC'11): the rotation constants of the two groups of four rounds, and the key
# schedule's parity constant.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def threefry_2x32_words(k0, k1, x0, x1):
    """The Threefry-2x32 hash of the counter pair ``(x0, x1)`` under the key ``(k0,
    k1)``, on uint32 arrays of one shape, in ``jax.numpy`` operations."""
    def rotl(v, r):
        return lax.shift_left(v, jnp.uint32(r)) | lax.shift_right_logical(v, jnp.uint32(32 - r))

    ks = (k0, k1, k0 ^ k1 ^ jnp.uint32(_PARITY))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = rotl(x1, r) ^ x0
        i = block + 1
        x0 = x0 + ks[i % 3]
        x1 = x1 + ks[(i + 1) % 3] + jnp.uint32(i)
    return x0, x1


@rule(jc.threefry2x32_p)
def _threefry2x32(lctx, eqn, *invals):
    shape = tuple(aval_out(eqn).shape)
    avals = [aval_in(eqn, i) for i in range(4)]

    def hash_(*xs):
        xs = [jnp.broadcast_to(x, shape) for x in xs]
        return list(threefry_2x32_words(*xs))

    jaxpr, _, consts = jc.trace_to_jaxpr(hash_, avals, "threefry2x32")
    return lower_jaxpr(lctx, jaxpr, [np.asarray(c) for c in consts], list(invals))
