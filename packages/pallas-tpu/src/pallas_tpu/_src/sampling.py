"""``sample_block``: block-invariant random sampling inside a kernel.

The whole ``total_size`` array is cut into tiles of ``tile_size``; tile ``t`` (numbered
row-major over the tile grid, rounding partial tiles up) is sampled as
``sampler_fn(fold_in(global_key, t), shape=tile_size)``. A block is the concatenation of
its tiles, so kernels with different block shapes (each a multiple of ``tile_size``) and
iteration orders see the same values for the same elements.

``global_key`` is a typed key (threefry, or a ``pallas_tpu`` key from
``pltpu.to_pallas_key``) or raw threefry ``uint32`` key data, so this runs wherever
``jax.random`` runs: in the interpreter, outside kernels, and lowered to Mosaic (typed
keys become their words, ``lowering/keys.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_tpu._src import jax_compat as jc


def _as_key(global_key):
    key = jnp.asarray(global_key) if not isinstance(global_key, jax.Array) else global_key
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"sample_block: global_key must be a single key, got shape "
                             f"{key.shape}")
        return key
    if key.dtype != jnp.uint32:
        key = key.astype(jnp.uint32)
    key = key.reshape(-1)
    if key.shape != (2,):
        raise ValueError(
            f"sample_block: global_key must be a typed PRNG key or threefry2x32 key data "
            f"(2 uint32 words), got an array of shape {tuple(jnp.shape(global_key))}")
    return jax.random.wrap_key_data(key, impl="threefry2x32")


def sample_block(sampler_fn, global_key, block_size, tile_size, total_size,
                 block_index=None, **kwargs):
    """Samples the ``block_size`` block at ``block_index`` of a ``total_size`` random array.

    Args:
      sampler_fn: a sampler taking a key and ``shape=`` (e.g. ``jax.random.uniform``).
      global_key: the key shared by all blocks (typed, or raw threefry key data).
      block_size: the block's shape; each dim a multiple of ``tile_size``'s.
      tile_size: the unit in which samples are drawn; pick a divisor of every block
        shape the result must be invariant to.
      total_size: the shape of the whole array.
      block_index: the block's index (one per dim); defaults to ``pl.program_id(axis)``
        for each axis.
      **kwargs: passed to ``sampler_fn``.
    """
    block_size, tile_size, total_size = (tuple(int(d) for d in s)
                                         for s in (block_size, tile_size, total_size))
    if len(block_size) != len(tile_size):
        raise ValueError(f"block_size ({len(block_size)}) and tile_size ({len(tile_size)}) "
                         f"must have the same length.")
    if len(total_size) != len(block_size):
        raise ValueError(f"total_size ({len(total_size)}) and block_size "
                         f"({len(block_size)}) must have the same length.")
    for b, t in zip(block_size, tile_size):
        if t <= 0 or b % t:
            raise ValueError(f"sample_block: tile_size {tile_size} must divide block_size "
                             f"{block_size}")
    if block_index is None:
        block_index = tuple(pl.program_id(axis) for axis in range(len(block_size)))
    block_index = tuple(block_index)
    if len(block_index) != len(block_size):
        raise ValueError(f"block_index has {len(block_index)} entries; expected "
                         f"{len(block_size)}")
    block_index = tuple(jnp.asarray(i, jnp.uint32) for i in block_index)
    keys = jc.blocked_fold_in(_as_key(global_key), total_size, block_size, tile_size,
                              block_index)
    return jc.blocked_sample_block(sampler_fn, keys, block_size, tile_size, **kwargs)
