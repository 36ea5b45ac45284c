"""More indexing: strided pl.ds with dynamic starts and on both axes, chained and dynamic
ref.at views, masks computed from data, masked loads of integers, masked stores at a
dynamic offset, edge blocks that overhang one axis only or a 3-D array, and index maps
that transpose or revisit blocks, a masked swap's partial exchange, and writes through
ref.reshape views."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import case, randn, sds

C = 128
ALL = slice(None)


def _iota(shape, axis):
    return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


# --- Strides --------------------------------------------------------------------------

@case("indexing/strided_dynamic_start", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (32, C)),),
      reference=lambda x: jnp.concatenate([x[0:16:2], x[1:17:2]], axis=0))
def strided_dynamic(pallas_call, x):
    """pl.ds(program_id, 8, stride=2): every other row from a start that program_id sets."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(pl.program_id(0), 8, stride=2), :]

    return pallas_call(kernel, out_shape=sds((16, C), x.dtype), grid=(2,),
                       in_specs=[pl.BlockSpec((32, C), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((8, C), lambda i: (i, 0)))(x)


@case("indexing/strided_both_axes", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (16, 2 * C)),), reference=lambda x: x[1::2, ::2])
def strided_both(pallas_call, x):
    """A stride on the rows and on the lanes of one load."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(1, 8, stride=2), pl.ds(0, C, stride=2)]

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


@case("indexing/strided_stride4", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (32, C)),), reference=lambda x: x[3::4] * 2)
def strided4(pallas_call, x):
    """pl.ds(3, 8, stride=4)."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(3, 8, stride=4), :] * 2

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


# --- ref.at ---------------------------------------------------------------------------

@case("indexing/ref_at_integer_3d", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (4, 8, C)),), reference=lambda x: x[1] + x[3] * 2)
def ref_at_int(pallas_call, x):
    """x_ref.at[1] and x_ref.at[3]: integer views that drop the leading axis of a 3-D ref."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref.at[1][...] + x_ref.at[3][...] * 2

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


@case("indexing/ref_at_dynamic_write", tags={"indexing", "control_flow"},
      inputs=lambda rng: (randn(rng, (4, 8, C)),),
      reference=lambda x: x * jnp.arange(1, 5, dtype=jnp.float32)[:, None, None])
def ref_at_dynamic(pallas_call, x):
    """o_ref.at[i] with a loop index: a helper writes through the view it is given."""
    def scale_into(src, dst, s):
        dst[...] = src[...] * s

    def kernel(x_ref, o_ref):
        def body(i, c):
            scale_into(x_ref.at[i], o_ref.at[i], (i + 1).astype(jnp.float32))
            return c

        jax.lax.fori_loop(0, 4, body, 0)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("indexing/ref_at_strided", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (32, C)),), reference=lambda x: x[0:32:2][4:12])
def ref_at_strided(pallas_call, x):
    """A contiguous ds of a strided .at view (view composition)."""
    def kernel(x_ref, o_ref):
        evens = x_ref.at[pl.ds(0, 16, stride=2)]
        o_ref[...] = evens[pl.ds(4, 8), :]

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


@case("indexing/ref_at_then_masked_load", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: jnp.where(jnp.arange(C)[None] < 50, x[8:], 0.0))
def ref_at_masked(pallas_call, x):
    """pl.load with a mask through an .at view."""
    def kernel(x_ref, o_ref):
        view = x_ref.at[pl.ds(8, 8)]
        o_ref[...] = pl.load(view, (ALL, ALL), mask=_iota((8, C), 1) < 50, other=0.0)

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


# --- Masks ----------------------------------------------------------------------------

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


# --- Edge blocks ------------------------------------------------------------------------

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


# --- Index maps -----------------------------------------------------------------------

@case("indexing/index_map_transposed", tags={"indexing", "broadcasting"},
      inputs=lambda rng: (randn(rng, (2 * C, 4 * C)),), reference=lambda x: x.T)
def index_map_transposed(pallas_call, x):
    """A (128, 128) block transpose with an index map that swaps the grid axes."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].T

    return pallas_call(kernel, out_shape=sds((4 * C, 2 * C), x.dtype), grid=(4, 2),
                       in_specs=[pl.BlockSpec((C, C), lambda i, j: (j, i))],
                       out_specs=pl.BlockSpec((C, C), lambda i, j: (i, j)))(x)


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


@case("indexing/three_d_dynamic_leading_index", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (4, 8, C)),), reference=lambda x: x[::-1])
def three_d_dynamic(pallas_call, x):
    """x_ref[3 - program_id] on a whole 3-D block: a traced index on the leading axis."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[3 - pl.program_id(0)]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,),
                       in_specs=[pl.BlockSpec((4, 8, C), lambda i: (0, 0, 0))],
                       out_specs=pl.BlockSpec((None, 8, C), lambda i: (i, 0, 0)))(x)


# --- Masked access through a window that runs past the array --------------------------

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


# --- Masked swap ------------------------------------------------------------------------

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


# --- Reshaped views of refs -------------------------------------------------------------

@case("ref_views/store_and_add_through_reshape", tags={"ref_views"},
      inputs=lambda rng: (randn(rng, (8, 2 * C)),),
      reference=lambda x: (2.0 * x + 1.0).reshape(8, 2 * C))
def store_add_through_reshape(pallas_call, x):
    """An (8, 256) block read and written through (16, 128) views: a store, then a +=
    into the view's second half (rows 8..15 of the view are columns 128..255 of the block
    rows, in row-major order), then the first half; the interpreters dropped such writes
    ('Unsupported transform: ReshapeTransform') before."""
    def kernel(x_ref, o_ref):
        o_ref.reshape(16, C)[...] = x_ref.reshape(16, C)[...] * 2.0
        view = o_ref.reshape(16, C)
        view.at[8:][...] += 1.0
        view.at[:8][...] += 1.0

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


def _as_int16_rows(x):
    """(m, n) int32 as a TPU reads it through ``ref.bitcast(jnp.int16)``: (2m, n), row 2i
    the low halves of row i and row 2i + 1 the high ones."""
    h = jax.lax.bitcast_convert_type(x, jnp.int16)  # (m, n, 2), low half first
    return jnp.swapaxes(h, 1, 2).reshape(2 * x.shape[0], x.shape[1])


@case("ref_views/bitcast_int32_as_int16", tags={"ref_bitcast"},
      inputs=lambda rng: (jnp.asarray(rng.integers(-2**31, 2**31, size=(16, C)), jnp.int32),),
      reference=lambda x: (_as_int16_rows(x), x))
def bitcast_int32_as_int16(pallas_call, x):
    """An int32 block read through an int16 bitcast view (twice the rows), and written
    back through one into an int32 output, in two halves."""
    def kernel(x_ref, h_ref, o_ref):
        h_ref[...] = x_ref.bitcast(jnp.int16)[...]
        o_ref.bitcast(jnp.int16).at[:16][...] = x_ref.bitcast(jnp.int16)[:16]
        o_ref.bitcast(jnp.int16).at[16:][...] = x_ref.bitcast(jnp.int16)[16:]

    return pallas_call(kernel, out_shape=(sds((32, C), jnp.int16), sds(x.shape, x.dtype)))(x)
