"""Indexing: pl.ds with static and dynamic starts, strides (with dynamic starts, on both
axes), ref.at views (chained, dynamic, strided), integer indices, pl.load/pl.store,
swap, squeezed block dims, pl.Element block dims and bounded slices."""

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


@case("indexing/three_d_dynamic_leading_index", tags={"indexing"},
      inputs=lambda rng: (randn(rng, (4, 8, C)),), reference=lambda x: x[::-1])
def three_d_dynamic(pallas_call, x):
    """x_ref[3 - program_id] on a whole 3-D block: a traced index on the leading axis."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[3 - pl.program_id(0)]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,),
                       in_specs=[pl.BlockSpec((4, 8, C), lambda i: (0, 0, 0))],
                       out_specs=pl.BlockSpec((None, 8, C), lambda i: (i, 0, 0)))(x)


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
