"""Indexing: pl.ds with static and dynamic starts, strides, ref.at, integer indices,
pl.load/pl.store, masked loads and stores, squeezed block dims, and edge blocks that
overhang the array."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import case, randn, sds

R, C = 16, 128


@case("indexing/ds_static", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (R, C)),), reference=lambda x: x[4:12] * 2)
def ds_static(pallas_call, x):
    """x_ref[pl.ds(4, 8), :] with a static start."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(4, 8), :] * 2

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


@case("indexing/ds_static_lanes", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (8, 256)),), reference=lambda x: x[:, 64:192])
def ds_static_lanes(pallas_call, x):
    """A static pl.ds on the lane axis."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[:, pl.ds(64, 128)]

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


@case("indexing/ds_dynamic_program_id", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (R, C)),), reference=lambda x: x)
def ds_dynamic(pallas_call, x):
    """pl.ds(program_id * 8, 8): each program copies its own rows from a whole-array block."""
    def kernel(x_ref, o_ref):
        i = pl.program_id(0)
        o_ref[...] = x_ref[pl.ds(i * 8, 8), :]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(R // 8,),
                       in_specs=[pl.BlockSpec((R, C), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((8, C), lambda i: (i, 0)))(x)


@case("indexing/ds_dynamic_in_loop", tags={"indexing", "control_flow"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: x.reshape(4, 4, C).sum(axis=0))
def ds_dynamic_loop(pallas_call, x):
    """pl.ds with a fori_loop index, summing four row groups."""
    def kernel(x_ref, o_ref):
        def body(k, acc):
            return acc + x_ref[pl.ds(pl.multiple_of(k * 4, 4), 4), :]

        o_ref[...] = jax.lax.fori_loop(0, 4, body, jnp.zeros((4, C), jnp.float32))

    return pallas_call(kernel, out_shape=sds((4, C), x.dtype))(x)


@case("indexing/strided_rows", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (R, C)),), reference=lambda x: x[1::2])
def strided_rows(pallas_call, x):
    """pl.ds(1, 8, stride=2): every other row."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(1, 8, stride=2), :]

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


@case("indexing/strided_lanes", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (8, 256)),), reference=lambda x: x[:, ::2])
def strided_lanes(pallas_call, x):
    """pl.ds(0, 128, stride=2) on the lane axis."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[:, pl.ds(0, 128, stride=2)]

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


@case("indexing/strided_store", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda a, b: jnp.stack([a, b], axis=1).reshape(R, C))
def strided_store(pallas_call, a, b):
    """Interleaving two blocks with strided stores."""
    def kernel(a_ref, b_ref, o_ref):
        o_ref[pl.ds(0, 8, stride=2), :] = a_ref[...]
        o_ref[pl.ds(1, 8, stride=2), :] = b_ref[...]

    return pallas_call(kernel, out_shape=sds((R, C), a.dtype))(a, b)


@case("indexing/ref_at_read", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (R, C)),), reference=lambda x: x[8:16, 0:64] + 1)
def ref_at_read(pallas_call, x):
    """Reading through nested ref.at views."""
    def kernel(x_ref, o_ref):
        view = x_ref.at[pl.ds(8, 8)]
        o_ref[...] = view.at[:, pl.ds(0, 64)][...] + 1

    return pallas_call(kernel, out_shape=sds((8, 64), x.dtype))(x)


@case("indexing/ref_at_write", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: jnp.concatenate([x * 2, x * 3], axis=0))
def ref_at_write(pallas_call, x):
    """Writing the two halves of an output through ref.at views."""
    def kernel(x_ref, o_ref):
        o_ref.at[pl.ds(0, 8)][...] = x_ref[...] * 2
        o_ref.at[pl.ds(8, 8)][...] = x_ref[...] * 3

    return pallas_call(kernel, out_shape=sds((R, C), x.dtype))(x)


@case("indexing/integer_index", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (R, C)),), reference=lambda x: x[3] + x[7])
def integer_index(pallas_call, x):
    """x_ref[3] and x_ref[7, :]: integer indices drop the axis."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[3] + x_ref[7, :]

    return pallas_call(kernel, out_shape=sds((C,), x.dtype))(x)


@case("indexing/dynamic_integer_index", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (R, C)),), reference=lambda x: x[::-1])
def dynamic_integer_index(pallas_call, x):
    """o_ref[program_id] = x_ref[R - 1 - program_id]: traced scalar indices (each program
    writes its own row of the whole-array output block)."""
    def kernel(x_ref, o_ref):
        i = pl.program_id(0)
        o_ref[i, :] = x_ref[R - 1 - i]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(R,),
                       in_specs=[pl.BlockSpec((R, C), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((R, C), lambda i: (0, 0)))(x)


@case("indexing/scalar_write", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: x.at[2, 5].set(42.0))
def scalar_write(pallas_call, x):
    """o_ref[2, 5] = scalar after a block copy."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]
        o_ref[2, 5] = jnp.float32(42.0)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("indexing/pl_load_store", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: jnp.concatenate([x[8:] * 2, x[:8]], axis=0))
def load_store(pallas_call, x):
    """pl.load / pl.store with index tuples and no mask."""
    def kernel(x_ref, o_ref):
        top = pl.load(x_ref, (pl.ds(0, 8), slice(None)))
        bottom = pl.load(x_ref, (pl.ds(8, 8), slice(None)))
        pl.store(o_ref, (pl.ds(0, 8), slice(None)), bottom * 2)
        pl.store(o_ref, (pl.ds(8, 8), slice(None)), top)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("indexing/swap", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: (x + 1, x))
def swap(pallas_call, x):
    """pl.swap returns the previous contents of the ref."""
    def kernel(x_ref, o_ref, old_ref):
        o_ref[...] = x_ref[...]
        old_ref[...] = pl.swap(o_ref, (), x_ref[...] + 1)

    return pallas_call(kernel, out_shape=(sds(x.shape, x.dtype), sds(x.shape, x.dtype)))(x)


def _lane_mask(n):
    return jax.lax.broadcasted_iota(jnp.int32, (8, C), 1) < n


@case("indexing/masked_load_other", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: jnp.where(jnp.arange(C)[None] < 100, x, -1.0))
def masked_load(pallas_call, x):
    """pl.load with mask= and other=: masked-out lanes read as other."""
    def kernel(x_ref, o_ref):
        o_ref[...] = pl.load(x_ref, (slice(None), slice(None)), mask=_lane_mask(100),
                             other=-1.0)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("indexing/masked_store", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda x, y: jnp.where(jnp.arange(C)[None] < 37, x * 2, y))
def masked_store(pallas_call, x, y):
    """pl.store with mask=: masked-out lanes keep what was there (the aliased input)."""
    def kernel(x_ref, y_ref, o_ref):
        del y_ref
        pl.store(o_ref, (slice(None), slice(None)), x_ref[...] * 2, mask=_lane_mask(37))

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       input_output_aliases={1: 0})(x, y)


@case("indexing/masked_store_first_write", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: jnp.where(jnp.arange(C)[None] < 50, x, 0.0) + jnp.where(
          jnp.arange(C)[None] >= 50, 7.0, 0.0))
def masked_store_two(pallas_call, x):
    """Two complementary masked stores fill an output."""
    def kernel(x_ref, o_ref):
        m = _lane_mask(50)
        pl.store(o_ref, (slice(None), slice(None)), x_ref[...], mask=m)
        pl.store(o_ref, (slice(None), slice(None)), jnp.full((8, C), 7.0, jnp.float32),
                 mask=jnp.logical_not(m))

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("indexing/masked_load_sum", tags={"indexing", "reductions"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: jnp.sum(x[:, :77], axis=1))
def masked_load_sum(pallas_call, x):
    """A masked load with other=0 feeding a reduction (the ragged-tail idiom)."""
    def kernel(x_ref, o_ref):
        v = pl.load(x_ref, (slice(None), slice(None)), mask=_lane_mask(77), other=0.0)
        o_ref[...] = jnp.sum(v, axis=1)

    return pallas_call(kernel, out_shape=sds((8,), x.dtype))(x)


@case("indexing/masked_load_ds", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: jnp.where(jnp.arange(64)[None] % 3 == 0, x[4:12, 32:96], 5.0))
def masked_load_ds(pallas_call, x):
    """A masked load through a pl.ds window."""
    def kernel(x_ref, o_ref):
        m = jax.lax.broadcasted_iota(jnp.int32, (8, 64), 1) % 3 == 0
        o_ref[...] = pl.load(x_ref, (pl.ds(4, 8), pl.ds(32, 64)), mask=m, other=5.0)

    return pallas_call(kernel, out_shape=sds((8, 64), x.dtype))(x)


@case("indexing/squeezed_block_dim", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (4, 8, C)),),
      reference=lambda x: x.sum(axis=1, keepdims=True))
def squeezed(pallas_call, x):
    """None block dims: the kernel sees (8, C) blocks of a (4, 8, C) array and writes
    (1, C) blocks of a (4, 1, C) array."""
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sum(x_ref[...], axis=0, keepdims=True)

    return pallas_call(kernel, out_shape=sds((4, 1, C), x.dtype), grid=(4,),
                       in_specs=[pl.BlockSpec((None, 8, C), lambda i: (i, 0, 0))],
                       out_specs=pl.BlockSpec((None, 1, C), lambda i: (i, 0, 0)))(x)


@case("indexing/index_map_reversed", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (32, C)),),
      reference=lambda x: x.reshape(4, 8, C)[::-1].reshape(32, C))
def index_map_reversed(pallas_call, x):
    """An index map that visits the input blocks in reverse."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,),
                       in_specs=[pl.BlockSpec((8, C), lambda i: (3 - i, 0))],
                       out_specs=pl.BlockSpec((8, C), lambda i: (i, 0)))(x)


# --- Edge blocks: array shapes that the block shape does not divide.

@case("indexing/edge_elementwise_2d", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (20, 200)),), reference=lambda x: x * 3 + 1)
def edge_elementwise(pallas_call, x):
    """(20, 200) through (8, 128) blocks on a (3, 2) grid: reads are padded and the
    write-back of the overhanging parts is dropped."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 3 + 1

    spec = pl.BlockSpec((8, C), lambda i, j: (i, j))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(3, 2),
                       in_specs=[spec], out_specs=spec)(x)


@case("indexing/edge_row_sum_masked",
      tags={"indexing", "reductions", "sequential_grid", "unaligned_blocks"},
      inputs=lambda rng: (randn(rng, (20, 200)),), reference=lambda x: x.sum(axis=1))
def edge_row_sum(pallas_call, x):
    """A row sum over lane blocks that overhang: the padding is masked out with
    program_id, and the output block is revisited along the reduction axis."""
    n_cols = x.shape[1]

    def kernel(x_ref, o_ref):
        j = pl.program_id(1)

        @pl.when(j == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        cols = j * C + jax.lax.broadcasted_iota(jnp.int32, (8, C), 1)
        v = pl.load(x_ref, (slice(None), slice(None)), mask=cols < n_cols, other=0.0)
        o_ref[...] += jnp.sum(v, axis=1)

    return pallas_call(kernel, out_shape=sds((20,), x.dtype), grid=(3, 2),
                       in_specs=[pl.BlockSpec((8, C), lambda i, j: (i, j))],
                       out_specs=pl.BlockSpec((8,), lambda i, j: (i,)))(x)


@case("indexing/edge_one_d", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (1000,)), randn(rng, (1000,))),
      reference=lambda x, y: x * y)
def edge_1d(pallas_call, x, y):
    """A 1-D array of 1000 elements in blocks of 256 (the last block is partial)."""
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] * y_ref[...]

    spec = pl.BlockSpec((256,), lambda i: (i,))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(pl.cdiv(1000, 256),),
                       in_specs=[spec, spec], out_specs=spec)(x, y)


@case("indexing/edge_int32", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (12, 130), jnp.int32),), reference=lambda x: x * 2 - 1)
def edge_int(pallas_call, x):
    """Integer edge blocks."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2 - 1

    spec = pl.BlockSpec((8, C), lambda i, j: (i, j))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2, 2),
                       in_specs=[spec], out_specs=spec)(x)


@case("indexing/edge_bool_output", tags={"indexing", "bool"},
      inputs=lambda rng: (randn(rng, (20, 200)),), reference=lambda x: x > 0.5)
def edge_bool(pallas_call, x):
    """A bool output written through overhanging edge blocks."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] > 0.5

    spec = pl.BlockSpec((8, C), lambda i, j: (i, j))
    return pallas_call(kernel, out_shape=sds(x.shape, jnp.bool_), grid=(3, 2),
                       in_specs=[spec], out_specs=spec)(x)


@case("indexing/element_block_dim", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (32, C)),),
      reference=lambda x: jnp.stack([x[i * 8:i * 8 + 16] for i in range(3)]))
def element_dim(pallas_call, x):
    """pl.Element(16): overlapping 16-row windows whose index map returns element
    offsets (every 8 rows)."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    return pallas_call(kernel, out_shape=sds((3, 16, C), x.dtype), grid=(3,),
                       in_specs=[pl.BlockSpec((pl.Element(16), C), lambda i: (i * 8, 0))],
                       out_specs=pl.BlockSpec((None, 16, C), lambda i: (i, 0, 0)))(x)


@case("indexing/bounded_slice", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (32, C)),), reference=lambda x: x * 2)
def bounded_slice(pallas_call, x):
    """pl.BoundedSlice block dims with pl.ds in the index maps."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    spec = pl.BlockSpec((pl.BoundedSlice(8), C), lambda i: (pl.ds(i * 8, 8), 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,), in_specs=[spec],
                       out_specs=spec)(x)
