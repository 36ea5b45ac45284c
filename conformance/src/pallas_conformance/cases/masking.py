"""Masked loads and stores (pl.load/pl.store with ``mask=``): lane masks, masks computed
from data, masked loads of integers and through pl.ds and ref.at views, masked stores at
a dynamic offset and into an edge block, a masked window over an array's tail, and a
masked swap's partial exchange."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import case, randn, sds

R, C = 16, 128


ALL = slice(None)


def _iota(shape, axis):
    return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


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


@case("indexing/ref_at_then_masked_load", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: jnp.where(jnp.arange(C)[None] < 50, x[8:], 0.0))
def ref_at_masked(pallas_call, x):
    """pl.load with a mask through an .at view."""
    def kernel(x_ref, o_ref):
        view = x_ref.at[pl.ds(8, 8)]
        o_ref[...] = pl.load(view, (ALL, ALL), mask=_iota((8, C), 1) < 50, other=0.0)

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


@case("indexing/masked_load_int32_other", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (8, C), jnp.int32),),
      reference=lambda x: jnp.where(jnp.arange(8)[:, None] < 5, x, -7))
def masked_load_int(pallas_call, x):
    """A masked int32 load over rows, with an integer other=."""
    def kernel(x_ref, o_ref):
        o_ref[...] = pl.load(x_ref, (ALL, ALL), mask=_iota((8, C), 0) < 5, other=-7)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("indexing/masked_store_data_mask", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: jnp.where(x > 0, x * 10, -1.0))
def masked_store_data(pallas_call, x):
    """pl.store with a mask computed from the data (x > 0) over a prior fill."""
    def kernel(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = jnp.full(v.shape, -1.0, v.dtype)
        pl.store(o_ref, (ALL, ALL), v * 10, mask=v > 0)

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,), in_specs=[spec],
                       out_specs=spec)(x)


@case("indexing/masked_store_dynamic_ds", tags={"indexing", "control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: jnp.concatenate(
          [jnp.zeros((8, C)), jnp.where(jnp.arange(C)[None] < 64, x, 0.0)], axis=0))
def masked_store_dyn(pallas_call, x):
    """pl.store at pl.ds(i * 8, 8), i a loop index, with a lane mask (half a block)."""
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

        def body(i, c):
            pl.store(o_ref, (pl.ds(pl.multiple_of(i * 8, 8), 8), ALL), x_ref[...],
                     mask=_iota((8, C), 1) < 64)
            return c

        jax.lax.fori_loop(1, 2, body, 0)

    return pallas_call(kernel, out_shape=sds((16, C), x.dtype))(x)


@case("indexing/edge_masked_store_by_program_id", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (20, 200)),), reference=lambda x: jnp.exp(x))
def edge_masked_store(pallas_call, x):
    """Edge blocks written with pl.store masked by the true array bounds (row and lane
    iotas offset by program_id), as kernels that must not rely on dropped write-back do."""
    rows, cols = x.shape

    def kernel(x_ref, o_ref):
        r = pl.program_id(0) * 8 + _iota((8, C), 0)
        c = pl.program_id(1) * C + _iota((8, C), 1)
        pl.store(o_ref, (ALL, ALL), jnp.exp(x_ref[...]), mask=(r < rows) & (c < cols))

    spec = pl.BlockSpec((8, C), lambda i, j: (i, j))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(3, 2), in_specs=[spec],
                       out_specs=spec)(x)


_TAIL_N, _TAIL_BLK = 1000, 128


@case("indexing/masked_window_past_the_end", tags={"indexing", "unaligned_blocks"},
      inputs=lambda rng: (randn(rng, (_TAIL_N,)), randn(rng, (_TAIL_N,))),
      reference=lambda x, y: x + y)
def masked_window_tail(pallas_call, x, y):
    """The canonical Triton tutorial add: ``x_ref.at[pl.ds(i * blk, blk)]`` with a mask
    ``offs < n``; the last window runs past the array and must not be clamped into it
    (the lanes that are not masked off keep their positions)."""
    def kernel(x_ref, y_ref, o_ref):
        i = pl.program_id(0)
        offs = i * _TAIL_BLK + jnp.arange(_TAIL_BLK)
        mask = offs < _TAIL_N
        window = pl.ds(i * _TAIL_BLK, _TAIL_BLK)
        a = pl.load(x_ref.at[window], mask=mask)
        b = pl.load(y_ref.at[window], mask=mask)
        pl.store(o_ref.at[window], a + b, mask=mask)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       grid=(pl.cdiv(_TAIL_N, _TAIL_BLK),))(x, y)


@case("indexing/masked_swap_returns_val_where_masked_off", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda x, y: (jnp.where(jnp.arange(C)[None] % 3 == 0, x, y),
                              jnp.where(jnp.arange(C)[None] % 3 == 0, y, x)))
def masked_swap(pallas_call, x, y):
    """A masked ``pl.swap`` is a partial exchange: where the mask holds the ref takes
    ``val`` and the old contents come back; where it does not, the ref is untouched and
    ``val`` itself comes back (upstream's semantics; the returned lanes are read)."""
    def kernel(x_ref, y_ref, o_ref, old_ref):
        o_ref[...] = y_ref[...]
        m = _iota((8, C), 1) % 3 == 0
        old_ref[...] = pl.swap(o_ref, (ALL, ALL), x_ref[...], mask=m)

    return pallas_call(kernel, out_shape=(sds(x.shape, x.dtype), sds(x.shape, x.dtype)))(x, y)
