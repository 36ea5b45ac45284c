"""JAX's PRNG primitives inside kernels, in the interpreter."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import pallas as pl
from pallas._src import jax_compat as jc


def test_threefry2x32_with_a_scalar_key_over_a_grid_of_count_blocks():
    """A (1, 1) key against count blocks that depend on the program id (upstream's threefry
    kernel): JAX's batching of threefry2x32 kept the key at size-1 batch dims and its
    rolled loop refused the mixed carry ('scan body function carry input and carry output
    must have equal types')."""
    def kernel(key_ref, o_ref):
        i, j = pl.program_id(0), pl.program_id(1)
        counts = (jax.lax.broadcasted_iota(jnp.uint32, (8, 128), 0) * 128
                  + jax.lax.broadcasted_iota(jnp.uint32, (8, 128), 1)
                  + (i * 2 + j).astype(jnp.uint32) * 1024)
        k1 = jnp.reshape(key_ref[0, 0], (1, 1))
        k2 = jnp.reshape(key_ref[0, 1], (1, 1))
        o1, o2 = jc.threefry2x32_p.bind(k1, k2, jnp.zeros_like(counts), counts)
        o_ref[...] = o1 ^ o2

    key = jnp.array([[3, 7]], jnp.uint32)
    out = pl.pallas_call(kernel, grid=(2, 2), out_shape=jax.ShapeDtypeStruct((16, 256), jnp.uint32),
                         out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
                         interpret=True)(key)
    counts = jnp.arange(4 * 1024, dtype=jnp.uint32).reshape(4, 8, 128)
    ones = jnp.ones_like(counts)
    o1, o2 = jc.threefry2x32_p.bind(3 * ones, 7 * ones, jnp.zeros_like(counts), counts)
    expected = (o1 ^ o2).reshape(2, 2, 8, 128).transpose(0, 2, 1, 3).reshape(16, 256)
    np.testing.assert_array_equal(out, expected)


def test_threefry_keys_sample_in_a_kernel_as_outside():
    key = jax.random.key(11)

    def kernel(o_ref):
        o_ref[...] = jax.random.uniform(jax.random.fold_in(key, 3), shape=o_ref.shape)

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                         interpret=True)()
    np.testing.assert_array_equal(out, jax.random.uniform(jax.random.fold_in(key, 3), (8, 128)))
