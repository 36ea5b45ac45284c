"""More broadcasting: bool and integer operands, a scalar read from a ref spread over a
block, 3-D batch broadcasts, expand_dims/squeeze, and broadcasts inside reductions."""

from __future__ import annotations

import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import case, randn, sds

C = 128


@case("broadcasting/bool_column_mask", tags={"broadcasting", "bool"},
      inputs=lambda rng: (randn(rng, (8, 1), jnp.bool_), randn(rng, (8, C))),
      reference=lambda m, x: jnp.where(m, x, 0.0))
def bool_column(pallas_call, m, x):
    """jnp.where with an (8, 1) bool column broadcast over the lanes."""
    def kernel(m_ref, x_ref, o_ref):
        o_ref[...] = jnp.where(m_ref[...], x_ref[...], 0.0)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(m, x)


@case("broadcasting/int8_row_plus_column", tags={"broadcasting", "int8"},
      inputs=lambda rng: (randn(rng, (8, 1), jnp.int8), randn(rng, (1, C), jnp.int8)),
      reference=lambda a, b: a.astype(jnp.int32) * 1000 + b.astype(jnp.int32))
def int8_outer(pallas_call, a, b):
    """An int8 column and an int8 row widened to int32 and broadcast against each other."""
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = a_ref[...].astype(jnp.int32) * 1000 + b_ref[...].astype(jnp.int32)

    return pallas_call(kernel, out_shape=sds((8, C), jnp.int32))(a, b)


@case("broadcasting/scalar_from_ref", tags={"broadcasting", "indexing"},
      inputs=lambda rng: (randn(rng, (16, C)), randn(rng, (8, C))),
      reference=lambda x, s: x * s[3, 7])
def scalar_from_ref(pallas_call, x, s):
    """A scalar read with s_ref[3, 7] multiplied into every element of a block."""
    def kernel(x_ref, s_ref, o_ref):
        o_ref[...] = x_ref[...] * s_ref[3, 7]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[pl.BlockSpec((8, C), lambda i: (i, 0)),
                                 pl.BlockSpec((8, C), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((8, C), lambda i: (i, 0)))(x, s)


@case("broadcasting/batch_3d", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, (1, 8, C)), randn(rng, (4, 1, C))),
      reference=lambda a, b: a * b + 1)
def batch_3d(pallas_call, a, b):
    """(1, 8, 128) * (4, 1, 128) -> (4, 8, 128): broadcasting on two axes at once."""
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = a_ref[...] * b_ref[...] + 1

    return pallas_call(kernel, out_shape=sds((4, 8, C), a.dtype))(a, b)


@case("broadcasting/expand_dims_squeeze", tags={"broadcasting", "reductions"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: x - jnp.mean(x, axis=1)[:, None])
def expand_squeeze(pallas_call, x):
    """A reduction without keepdims re-expanded with jnp.expand_dims and broadcast back."""
    def kernel(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = v - jnp.expand_dims(jnp.mean(v, axis=1), 1)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("broadcasting/column_u32", tags={"broadcasting", "uint32"},
      inputs=lambda rng: (randn(rng, (8, C), jnp.uint32), randn(rng, (8, 1), jnp.uint32)),
      reference=lambda x, c: x ^ c)
def column_u32(pallas_call, x, c):
    """A uint32 column xor-ed into every lane."""
    def kernel(x_ref, c_ref, o_ref):
        o_ref[...] = x_ref[...] ^ c_ref[...]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x, c)
