"""``sample_block``: block-invariant sampling in the interpreter, checked against the
whole-array tile-by-tile sampler computed outside any kernel."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu

TOTAL = (32, 512)
TILE = (8, 128)


def _reference(key, sampler=jax.random.uniform):
    """Tile ``t`` (row-major over the tile grid) is sampler(fold_in(key, t), tile)."""
    rows = []
    nr, nc = TOTAL[0] // TILE[0], TOTAL[1] // TILE[1]
    for r in range(nr):
        rows.append(jnp.concatenate(
            [sampler(jax.random.fold_in(key, r * nc + c), shape=TILE) for c in range(nc)],
            axis=1))
    return jnp.concatenate(rows, axis=0)


def _sample(key_data, block, sampler=jax.random.uniform, dtype=jnp.float32):
    def kernel(key_ref, o_ref):
        o_ref[...] = pltpu.sample_block(sampler, key_ref[...], block_size=block,
                                        tile_size=TILE, total_size=TOTAL)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(TOTAL, dtype),
        grid=(TOTAL[0] // block[0], TOTAL[1] // block[1]),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec(block, lambda i, j: (i, j)),
        compiler_params=pltpu.CompilerParams(), interpret=True,
    )(key_data)


@pytest.mark.parametrize("block", [(8, 128), (16, 256), (32, 512), (8, 512)])
def test_sample_block_matches_the_whole_array_sampler(block):
    key = jax.random.key(42)
    out = _sample(jax.random.key_data(key), block)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(_reference(key)))
    assert 0.0 <= float(out.min()) and float(out.max()) < 1.0
    assert len(np.unique(np.asarray(out))) > out.size // 2


def test_sample_block_kwargs_and_other_samplers():
    key = jax.random.key(3)
    sampler = functools.partial(jax.random.normal, dtype=jnp.float32)
    out = _sample(jax.random.key_data(key), (16, 128), sampler)
    np.testing.assert_allclose(np.asarray(out), np.asarray(_reference(key, sampler)))

    def kernel(key_ref, o_ref):
        o_ref[...] = pltpu.sample_block(jax.random.randint, key_ref[...], (8, 128), TILE,
                                        TOTAL, block_index=(1, 2), minval=0, maxval=10)

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32),
                         in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                         interpret=True)(jax.random.key_data(key))
    ref = jax.random.randint(jax.random.fold_in(key, 1 * 4 + 2), TILE, 0, 10)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_sample_block_outside_kernels_and_typed_keys():
    key = jax.random.key(5)
    got = pltpu.sample_block(jax.random.uniform, key, (16, 256), TILE, TOTAL,
                             block_index=(1, 0))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(_reference(key)[16:, :256]))


def test_sample_block_argument_errors():
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="same length"):
        pltpu.sample_block(jax.random.uniform, key, (8, 128), (8,), TOTAL, block_index=(0, 0))
    with pytest.raises(ValueError, match="must divide"):
        pltpu.sample_block(jax.random.uniform, key, (8, 128), (16, 128), TOTAL,
                           block_index=(0, 0))
    with pytest.raises(ValueError, match="key data"):
        pltpu.sample_block(jax.random.uniform, jnp.zeros((3,), jnp.uint32), (8, 128), TILE,
                           TOTAL, block_index=(0, 0))


@pytest.mark.parametrize("block", [(8, 128), (16, 256)])
def test_sample_block_with_a_threefry_key_runs_emulated_as_the_reference(block):
    """Lowered for TPU (the key as its two words in SMEM, fold_in and the sampler as the
    threefry hash on vectors), compiled and run by the executor on an emulated v5e."""
    key = jax.random.key(1)

    def kernel(key_ref, o_ref):
        o_ref[...] = pltpu.sample_block(jax.random.uniform, key_ref[...], block, TILE, TOTAL)

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(TOTAL, jnp.float32),
                       grid=(TOTAL[0] // block[0], TOTAL[1] // block[1]),
                       in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                       out_specs=pl.BlockSpec(block, lambda i, j: (i, j)),
                       compiler_params=pltpu.CompilerParams())
    with pl.emulate_device("tpu:v5e"):
        out = f(key)
    np.testing.assert_array_equal(out, _reference(key))


def test_sample_block_with_pallas_keys_is_block_invariant():
    """With a ``pallas_tpu`` key the samples come from the core's PRNG (interpreted), and
    still do not depend on the block shape or the iteration order (upstream's test)."""
    key = pltpu.to_pallas_key(jax.random.key(7))
    small = np.asarray(_sample(key, (8, 128)))
    large = np.asarray(_sample(key, (16, 256)))
    np.testing.assert_array_equal(small, large)
    assert 0.0 <= small.min() and small.max() < 1.0
    assert len(np.unique(small)) > small.size // 2
