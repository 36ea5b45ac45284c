"""Dynamic grids: grid sizes that are traced values (computed inside ``jax.jit``); and
dynamic shapes: grids and blocks computed from symbolic dimensions (``jax.export``).

The number of programs is an int32 input of the case, so every level traces it: the
grid runs to that run-time count, ``num_programs`` returns it, and index maps and
``program_id`` behave as for a static grid. Blocks are (8, 128).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import case, randn, sds

C = 128


def _first_blocks_sum(n, x):
    blocks = x.reshape(-1, 8, C)
    keep = jnp.arange(blocks.shape[0])[:, None, None] < n
    return jnp.where(keep, blocks, 0).sum(0) * n.astype(x.dtype)


@case("dynamic_grid/sum_first_blocks", tags={"dynamic_grid", "sequential_grid"},
      inputs=lambda rng: (jnp.asarray(3, jnp.int32), randn(rng, (48, C))),
      reference=_first_blocks_sum)
def sum_first_blocks(pallas_call, n, x):
    """Accumulates the first ``n`` of six row blocks (n traced), then scales by
    ``num_programs(0)`` at the last step: the loop runs exactly ``n`` programs."""
    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...]

        @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
        def _():
            o_ref[...] *= pl.num_programs(0).astype(o_ref.dtype)

    return pallas_call(
        kernel, out_shape=sds((8, C), x.dtype), grid=(n,),
        in_specs=[pl.BlockSpec((8, C), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, C), lambda i: (0, 0)))(x)


def _copy_last_blocks(n, x):
    # program (i, j) copies block (rows - n + i, j) into output block (i, j): the last
    # n block rows (n = 2, the case's input).
    del n
    return x[-16:]


@case("dynamic_grid/index_map_reads_num_programs", tags={"dynamic_grid"},
      inputs=lambda rng: (jnp.asarray(2, jnp.int32), randn(rng, (32, 2 * C))),
      reference=_copy_last_blocks)
def index_map_reads_num_programs(pallas_call, n, x):
    """A 2-D grid, (n, 2) with n traced: the input index map reads ``num_programs(0)``
    to copy the last ``n`` block rows of the input."""
    rows = x.shape[0] // 8

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    return pallas_call(
        kernel, out_shape=sds((16, 2 * C), x.dtype), grid=(n, 2),
        in_specs=[pl.BlockSpec((8, C), lambda i, j: (rows - pl.num_programs(0) + i, j))],
        out_specs=pl.BlockSpec((8, C), lambda i, j: (i, j)))(x)


def _halves_plus_rows(pallas_call, x):
    """A (2, 2) grid of blocks of half the array in each dimension; each block adds the
    array's (symbolic) number of rows: a dimension used as a value in the kernel."""
    block = (x.shape[0] // 2, x.shape[1] // 2)
    spec = pl.BlockSpec(block, lambda i, j: (i, j))

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + jnp.asarray(2 * x_ref.shape[0]).astype(x_ref.dtype)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2, 2),
                       in_specs=[spec], out_specs=spec)(x)


@case("dynamic_shapes/symbolic_blocks", tags={"dynamic_shapes", "export"},
      inputs=lambda rng: (randn(rng, (32, 2 * C)),),
      reference=lambda x: x + x.shape[0])
def symbolic_blocks(pallas_call, x):
    """Exported for shapes (16 * a, 256 * b) with blocks of half of each, then called on
    a (32, 256) array: the blocks are (16, 128) at run time."""
    a, b = jax.export.symbolic_shape("a, b")
    with pl.pallas_export_experimental(dynamic_shapes=True):
        exp = jax.export.export(jax.jit(lambda v: _halves_plus_rows(pallas_call, v)))(
            jax.ShapeDtypeStruct((16 * a, 2 * C * b), x.dtype))
    return exp.call(x)
