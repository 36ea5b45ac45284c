"""Scalar prefetch: PrefetchScalarGridSpec, index maps that read prefetched scalars, and
kernels that read them."""

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
