"""Blocks: edge blocks that overhang the array (on one axis or both, of 1-D and 3-D
arrays, of int, bool and bf16 values, reduced across), and index maps that reverse,
transpose or revisit blocks."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.cases import _programs as shared
from pallas_conformance.registry import case, randn, sds

C = 128


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


def _edge_case(block, grid, index_map):
    def fn(pallas_call, x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2 - 1

        spec = pl.BlockSpec(block, index_map)
        return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=grid,
                           in_specs=[spec], out_specs=spec)(x)

    return fn


@case("indexing/edge_last_dim_only", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (16, 300)),), reference=lambda x: x * 2 - 1)
def edge_lanes(pallas_call, x):
    """(16, 300) in (8, 128) blocks: only the lane axis overhangs (by 84)."""
    return _edge_case((8, C), (2, 3), lambda i, j: (i, j))(pallas_call, x)


@case("indexing/edge_first_dim_only", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (21, C)),), reference=lambda x: x * 2 - 1)
def edge_rows(pallas_call, x):
    """(21, 128) in (8, 128) blocks: only the row axis overhangs (by 3)."""
    return _edge_case((8, C), (3,), lambda i: (i, 0))(pallas_call, x)


@case("indexing/edge_3d", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (3, 12, 130)),), reference=lambda x: x * 2 - 1)
def edge_3d(pallas_call, x):
    """A 3-D array whose two minor axes both overhang (8, 128) blocks."""
    return _edge_case((None, 8, C), (3, 2, 2),
                      lambda b, i, j: (b, i, j))(pallas_call, x)


@case("indexing/edge_bf16", tags={"indexing", "bf16"},
      inputs=lambda rng: (randn(rng, (20, 200), jnp.bfloat16),), reference=lambda x: x * 2 - 1)
def edge_bf16(pallas_call, x):
    """bf16 edge blocks on both axes."""
    return _edge_case((8, C), (3, 2), lambda i, j: (i, j))(pallas_call, x)


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


@case("indexing/index_map_transposed", tags={"indexing", "broadcasting"},
      inputs=lambda rng: (randn(rng, (2 * C, 4 * C)),), reference=lambda x: x.T)
def index_map_transposed(pallas_call, x):
    """A (128, 128) block transpose with an index map that swaps the grid axes."""
    return shared.block_transpose(pallas_call, x, swapped="in")


@case("indexing/index_map_modulo", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: jnp.concatenate([x, x], axis=0) + 1)
def index_map_modulo(pallas_call, x):
    """An input index map i % 2: each input block is read by two programs."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    return pallas_call(kernel, out_shape=sds((32, C), x.dtype), grid=(4,),
                       in_specs=[pl.BlockSpec((8, C), lambda i: (i % 2, 0))],
                       out_specs=pl.BlockSpec((8, C), lambda i: (i, 0)))(x)
