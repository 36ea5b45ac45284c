"""Broadcasting and shape cases: rows, columns, scalars (from (1, 1), 0-d and indexed
refs), rank changes, iota, outer products, bool/int8/uint32 operands, 3-D batch
broadcasts, expand_dims/squeeze, broadcasts inside reductions, and reshapes and
transposes inside kernels."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

import pallas as pl
from pallas_conformance.cases import _programs as shared
from pallas_conformance.registry import case, randn, sds

R, C = 16, 128


def _row_spec():
    return pl.BlockSpec((8, C), lambda i: (i, 0))


@case("broadcasting/row_vector_f32", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, (R, C)), randn(rng, (1, C))),
      reference=lambda x, b: x + b)
def row_vector(pallas_call, x, b):
    """x + b with b of shape (1, C), the same block for every program."""
    def kernel(x_ref, b_ref, o_ref):
        o_ref[...] = x_ref[...] + b_ref[...]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_row_spec(), pl.BlockSpec((1, C), lambda i: (0, 0))],
                       out_specs=_row_spec())(x, b)


@case("broadcasting/column_vector_f32", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, (R, C)), randn(rng, (R, 1))),
      reference=lambda x, c: x * c)
def column_vector(pallas_call, x, c):
    """x * c with c of shape (R, 1)."""
    def kernel(x_ref, c_ref, o_ref):
        o_ref[...] = x_ref[...] * c_ref[...]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_row_spec(), pl.BlockSpec((8, 1), lambda i: (i, 0))],
                       out_specs=_row_spec())(x, c)


@case("broadcasting/rank1_to_rank2_f32", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, (R, C)), randn(rng, (C,))),
      reference=lambda x, b: x - b[None, :])
def rank1(pallas_call, x, b):
    """A rank-1 operand expanded with [None, :] inside the kernel."""
    def kernel(x_ref, b_ref, o_ref):
        o_ref[...] = x_ref[...] - b_ref[...][None, :]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_row_spec(), pl.BlockSpec((C,), lambda i: (0,))],
                       out_specs=_row_spec())(x, b)


@case("broadcasting/scalar_ref_f32", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, (R, C)), randn(rng, (1, 1))),
      reference=lambda x, s: x * s[0, 0])
def scalar_ref(pallas_call, x, s):
    """A (1, 1) operand read as a scalar with s_ref[0, 0]."""
    def kernel(x_ref, s_ref, o_ref):
        o_ref[...] = x_ref[...] * s_ref[0, 0]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x, s)


@case("broadcasting/outer_product_f32", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, (2 * C,)), randn(rng, (C,))),
      reference=lambda a, b: a[:, None] * b[None, :])
def outer(pallas_call, a, b):
    """a[:, None] * b[None, :] tiled over the rows."""
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = a_ref[...][:, None] * b_ref[...][None, :]

    return pallas_call(kernel, out_shape=sds((2 * C, C), a.dtype), grid=(2,),
                       in_specs=[pl.BlockSpec((C,), lambda i: (i,)),
                                 pl.BlockSpec((C,), lambda i: (0,))],
                       out_specs=pl.BlockSpec((C, C), lambda i: (i, 0)))(a, b)


@case("broadcasting/broadcast_to_3d_f32", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: jnp.broadcast_to(x[None], (4, 8, C)) * 2.0)
def broadcast_3d(pallas_call, x):
    """jnp.broadcast_to to a new leading axis."""
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.broadcast_to(x_ref[...][None], (4, 8, C)) * 2.0

    return pallas_call(kernel, out_shape=sds((4, 8, C), x.dtype))(x)


@case("broadcasting/pl_broadcast_to_f32", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, (1, C)),),
      reference=lambda x: jnp.broadcast_to(x, (8, C)))
def pl_broadcast(pallas_call, x):
    """pl.broadcast_to of a row."""
    def kernel(x_ref, o_ref):
        o_ref[...] = pl.broadcast_to(x_ref[...], (8, C))

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


@case("broadcasting/iota_i32", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, (R, C), jnp.int32),),
      reference=lambda x: x + lax.broadcasted_iota(jnp.int32, (R, C), 0) * 1000
      + lax.broadcasted_iota(jnp.int32, (R, C), 1))
def iota(pallas_call, x):
    """broadcasted_iota over both axes, offset by the block's row."""
    def kernel(x_ref, o_ref):
        rows = lax.broadcasted_iota(jnp.int32, (8, C), 0) + pl.program_id(0) * 8
        cols = lax.broadcasted_iota(jnp.int32, (8, C), 1)
        o_ref[...] = x_ref[...] + rows * 1000 + cols

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_row_spec()], out_specs=_row_spec())(x)


@case("broadcasting/row_vector_bf16", tags={"broadcasting", "bf16"},
      inputs=lambda rng: (randn(rng, (R, C), jnp.bfloat16), randn(rng, (1, C), jnp.bfloat16)),
      reference=lambda x, b: x * b)
def row_bf16(pallas_call, x, b):
    """bf16 row broadcast."""
    def kernel(x_ref, b_ref, o_ref):
        o_ref[...] = x_ref[...] * b_ref[...]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_row_spec(), pl.BlockSpec((1, C), lambda i: (0, 0))],
                       out_specs=_row_spec())(x, b)


@case("broadcasting/reshape_f32", tags={"broadcasting", "unaligned_blocks"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: x.reshape(8, 2, 64).sum(axis=1))
def reshape(pallas_call, x):
    """A reshape that splits the lane axis, then a reduction."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].reshape(8, 2, 64).sum(axis=1)

    return pallas_call(kernel, out_shape=sds((8, 64), x.dtype))(x)


@case("broadcasting/transpose_f32", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, (2 * C, 2 * C)),),
      reference=lambda x: x.T)
def transpose(pallas_call, x):
    """x.T per block, with the output index map swapping the block indices."""
    return shared.block_transpose(pallas_call, x, swapped="out")


@case("broadcasting/concatenate_f32", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, (8, 64)), randn(rng, (8, 64))),
      reference=lambda a, b: jnp.concatenate([a, b], axis=1))
def concatenate(pallas_call, a, b):
    """jnp.concatenate along the lane axis."""
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.concatenate([a_ref[...], b_ref[...]], axis=1)

    return pallas_call(kernel, out_shape=sds((8, C), a.dtype))(a, b)


@case("broadcasting/scalar_0d_operand", tags={"broadcasting"},
      inputs=lambda rng: (randn(rng, ()), randn(rng, (8, C))),
      reference=lambda s, x: x * s)
def scalar_0d(pallas_call, s, x):
    """A 0-d operand read with s_ref[...] and broadcast against a block."""
    def kernel(s_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * s_ref[...]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(s, x)


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
