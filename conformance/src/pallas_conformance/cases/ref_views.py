"""Ref views: writes and += through ``ref.reshape`` views of a kernel's refs, and loads
through ``ref.bitcast`` views to a dtype of another width."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_conformance.registry import case, randn, sds

C = 128


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
