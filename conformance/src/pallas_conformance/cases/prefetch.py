"""Scalar prefetch: PrefetchScalarGridSpec, index maps that read prefetched scalars, and
kernels that read them, a block-sparse matmul over a 2-D grid, prefetch with scratch,
and kernels that keep state in a prefetched scalar across grid steps (which index maps
see one point late, as on a TPU)."""

from __future__ import annotations

import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import case, randn, sds

C = 128


@case("scalar_prefetch/gather_rows", tags={"scalar_prefetch"},
      inputs=lambda rng: (jnp.asarray([3, 0, 2, 2, 1], jnp.int32), randn(rng, (4, 8, C))),
      reference=lambda idx, x: x[idx])
def gather_rows(pallas_call, idx, x):
    """Block gather: the input index map reads the prefetched indices."""
    def kernel(idx_ref, x_ref, o_ref):
        del idx_ref
        o_ref[...] = x_ref[...]

    return pallas_call(
        kernel, out_shape=sds((idx.shape[0], 8, C), x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(idx.shape[0],),
            in_specs=[pl.BlockSpec((None, 8, C), lambda i, idx: (idx[i], 0, 0))],
            out_specs=pl.BlockSpec((None, 8, C), lambda i, idx: (i, 0, 0))))(idx, x)


@case("scalar_prefetch/scatter_rows", tags={"scalar_prefetch"},
      inputs=lambda rng: (jnp.asarray([2, 0, 3, 1], jnp.int32), randn(rng, (4, 8, C))),
      reference=lambda idx, x: jnp.zeros_like(x).at[idx].set(x))
def scatter_rows(pallas_call, idx, x):
    """Block scatter: the output index map reads the prefetched permutation."""
    def kernel(idx_ref, x_ref, o_ref):
        del idx_ref
        o_ref[...] = x_ref[...]

    return pallas_call(
        kernel, out_shape=sds(x.shape, x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(4,),
            in_specs=[pl.BlockSpec((None, 8, C), lambda i, idx: (i, 0, 0))],
            out_specs=pl.BlockSpec((None, 8, C), lambda i, idx: (idx[i], 0, 0))))(idx, x)


@case("scalar_prefetch/read_in_kernel", tags={"scalar_prefetch"},
      inputs=lambda rng: (jnp.asarray([1.5, -2.0, 0.25, 4.0], jnp.float32),
                          randn(rng, (32, C))),
      reference=lambda s, x: x * jnp.repeat(s, 8)[:, None])
def read_in_kernel(pallas_call, scales, x):
    """The kernel reads its own prefetched scalar with s_ref[program_id]."""
    def kernel(s_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * s_ref[pl.program_id(0)]

    spec = pl.BlockSpec((8, C), lambda i, s: (i, 0))
    return pallas_call(
        kernel, out_shape=sds(x.shape, x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(4,),
                                            in_specs=[spec], out_specs=spec))(scales, x)


@case("scalar_prefetch/two_operands", tags={"scalar_prefetch"},
      inputs=lambda rng: (jnp.asarray([1, 0], jnp.int32), jnp.asarray([0, 1], jnp.int32),
                          randn(rng, (16, 256))),
      reference=lambda r, c, x: jnp.stack([x[8:16, 0:128], x[0:8, 128:256]]).reshape(16, C))
def two_operands(pallas_call, rows, cols, x):
    """Two prefetched arrays drive the row and column block indices."""
    def kernel(r_ref, c_ref, x_ref, o_ref):
        del r_ref, c_ref
        o_ref[...] = x_ref[...]

    return pallas_call(
        kernel, out_shape=sds((16, C), x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(2,),
            in_specs=[pl.BlockSpec((8, C), lambda i, r, c: (r[i], c[i]))],
            out_specs=pl.BlockSpec((8, C), lambda i, r, c: (i, 0))))(rows, cols, x)


@case("scalar_prefetch/block_sparse_skip", tags={"scalar_prefetch", "control_flow"},
      inputs=lambda rng: (jnp.asarray([1, 0, 0, 1], jnp.int32), randn(rng, (32, C))),
      reference=lambda m, x: x * jnp.repeat(m, 8)[:, None].astype(jnp.float32))
def block_sparse(pallas_call, mask, x):
    """A prefetched block mask decides with pl.when which blocks are computed."""
    def kernel(m_ref, x_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

        @pl.when(m_ref[pl.program_id(0)] != 0)
        def _():
            o_ref[...] = x_ref[...]

    spec = pl.BlockSpec((8, C), lambda i, m: (i, 0))
    return pallas_call(
        kernel, out_shape=sds(x.shape, x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(4,),
                                            in_specs=[spec], out_specs=spec))(mask, x)


def _block_sparse_ref(bcols, a, b):
    """Row block i of the output: a's block (i, k) times b's block (bcols[i, k], 0),
    summed over k."""
    out = []
    for i in range(2):
        acc = jnp.zeros((8, C), jnp.float32)
        for k in range(2):
            j = int(bcols[i, k])
            acc = acc + jnp.dot(a[i * 8:(i + 1) * 8, k * C:(k + 1) * C],
                                b[j * C:(j + 1) * C], precision="highest")
        out.append(acc)
    return jnp.concatenate(out)


@case("scalar_prefetch/block_sparse_matmul_2d_grid",
      tags={"scalar_prefetch", "dot", "sequential_grid"},
      inputs=lambda rng: (jnp.asarray([[2, 0], [1, 3]], jnp.int32),
                          randn(rng, (16, 2 * C), scale=0.3), randn(rng, (4 * C, C), scale=0.3)),
      reference=_block_sparse_ref, tolerance={"float32": (1e-4, 1e-4)})
def block_sparse_matmul(pallas_call, bcols, a, b):
    """A 2-D grid whose rhs index map reads a 2-D prefetched table (block-sparse matmul)."""
    def kernel(t_ref, a_ref, b_ref, o_ref):
        del t_ref

        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(a_ref[...], b_ref[...], precision="highest")

    return pallas_call(
        kernel, out_shape=sds((16, C), a.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(2, 2),
            in_specs=[pl.BlockSpec((8, C), lambda i, k, t: (i, k)),
                      pl.BlockSpec((C, C), lambda i, k, t: (t[i, k], 0))],
            out_specs=pl.BlockSpec((8, C), lambda i, k, t: (i, 0))))(bcols, a, b)


@case("scalar_prefetch/with_scratch", tags={"scalar_prefetch", "scratch"},
      inputs=lambda rng: (jnp.asarray([2, 5, 1, 3], jnp.int32), randn(rng, (32, C))),
      reference=lambda n, x: x * jnp.repeat(n, 8)[:, None].astype(jnp.float32) + 1)
def prefetch_scratch(pallas_call, n, x):
    """A prefetched scalar and a scratch buffer in the same kernel (ref order: prefetch,
    inputs, outputs, scratch)."""
    def kernel(n_ref, x_ref, o_ref, s_ref):
        s_ref[...] = x_ref[...] * n_ref[pl.program_id(0)].astype(jnp.float32)
        o_ref[...] = s_ref[...] + 1

    spec = pl.BlockSpec((8, C), lambda i, n: (i, 0))
    return pallas_call(
        kernel, out_shape=sds(x.shape, x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(4,),
                                            in_specs=[spec], out_specs=spec,
                                            scratch_shapes=[pl.ANY((8, C), jnp.float32)]))(n, x)


@case("scalar_prefetch/kernel_writes_persist", tags={"scalar_prefetch", "carry_across_blocks"},
      inputs=lambda rng: (jnp.asarray([3], jnp.int32), randn(rng, (32, C))),
      reference=lambda c, x: x * (c[0] + jnp.repeat(jnp.arange(4), 8))[:, None]
      .astype(jnp.float32))
def kernel_writes_persist(pallas_call, count, x):
    """The kernel keeps a counter in its prefetched scalar (SMEM on a TPU): what one grid
    step writes there, the next step reads (upstream's ragged paged attention keeps its
    sequence and buffer indices so)."""
    def kernel(c_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * c_ref[0].astype(jnp.float32)
        c_ref[0] = c_ref[0] + 1

    spec = pl.BlockSpec((8, C), lambda i, c: (i, 0))
    return pallas_call(
        kernel, out_shape=sds(x.shape, x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(4,),
                                            in_specs=[spec], out_specs=spec))(count, x)


@case("scalar_prefetch/index_map_sees_writes_one_point_late",
      tags={"scalar_prefetch", "carry_across_blocks"},
      inputs=lambda rng: (jnp.zeros((1,), jnp.int32), randn(rng, (48, C))),
      # Point t reads the block the kernel's point t - 2 named (0 before that).
      reference=lambda c, x: x.reshape(6, 8, C)[jnp.asarray([0, 0, 0, 1, 2, 3])]
      .reshape(48, C))
def index_map_sees_writes_one_point_late(pallas_call, block, x):
    """An index map reading a prefetched scalar the kernel writes sees the value as it was
    when the previous grid point began: a TPU's pipeline works out (and starts copying)
    the next point's blocks before the current point's body runs."""
    def kernel(b_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]
        b_ref[0] = pl.program_id(0)

    return pallas_call(
        kernel, out_shape=sds(x.shape, x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(6,),
            in_specs=[pl.BlockSpec((8, C), lambda i, b: (b[0], 0))],
            out_specs=pl.BlockSpec((8, C), lambda i, b: (i, 0))))(block, x)
