"""Block arithmetic of the interpreter: padding, block starts, block loads and stores.

Starts are computed in the coordinates of the unpadded array (an ``Element`` index map
returns an offset into the padded array, so its start can be below zero); a buffer
holds its array padded by ``(lo, hi)`` per dimension, so a block starting at ``s`` is
at ``s + lo`` in the buffer.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas._src import block_spec as bs
from pallas._src.jax_compat import is_symbolic_dim
from pallas._src.memory import uninitialized_value


def own_padding(bm) -> tuple[tuple[int, int], ...]:
    """The (lo, hi) padding a mapping needs so every in-range block fits."""
    pads = []
    for d, n in zip(bm.block_dims, bm.array_aval.shape):
        if isinstance(d, bs.Blocked) and is_symbolic_dim(d.block_size):
            # A symbolic block may be of size 0 (no division by it): room for one block.
            pads.append((0, 0 if d.block_size == n else d.block_size))
        elif isinstance(d, bs.Blocked):
            pads.append((0, -(-n // d.block_size) * d.block_size - n))
        elif isinstance(d, bs.Element):
            pads.append(tuple(d.padding))
        elif isinstance(d, bs.BoundedSlice):
            # A slice may start anywhere in the array; room for a whole block after it
            # keeps dynamic_slice from clamping the start.
            pads.append((0, d.block_size))
        else:
            pads.append((0, 0))
    return tuple(pads)


def merge_padding(*pads):
    return tuple(
        (max(p[i][0] for p in pads), max(p[i][1] for p in pads)) for i in range(len(pads[0]))
    )


def pad_array(x, pads, fill_uninitialized: bool = True):
    if all(lo == 0 and hi == 0 for lo, hi in pads):
        return x
    fill = uninitialized_value((), x.dtype) if fill_uninitialized else jnp.zeros((), x.dtype)
    return lax.pad(x, fill.astype(x.dtype), [(lo, hi, 0) for lo, hi in pads])


def unpad_array(x, pads, shape):
    if all(lo == 0 and hi == 0 for lo, hi in pads):
        return x
    return lax.slice(x, [lo for lo, _ in pads], [lo + n for (lo, _), n in zip(pads, shape)])


def block_starts(bm, flat_indices):
    """Element starts (unpadded coordinates) and BoundedSlice sizes of one block."""
    starts, sizes = [], []
    it = iter(flat_indices)
    for d in bm.block_dims:
        i = next(it)
        if isinstance(d, bs.Blocked):
            starts.append(i * d.block_size)
            sizes.append(None)
        elif isinstance(d, bs.BoundedSlice):
            starts.append(i)
            sizes.append(next(it))
        elif isinstance(d, bs.Element):  # an element offset into the padded array
            starts.append(i - d.padding[0])
            sizes.append(None)
        else:  # Squeezed: an element index
            starts.append(i)
            sizes.append(None)
    return starts, sizes


def block_indices_np(bm, table):
    """Element starts for a whole table of index-map outputs (numpy, one row per point)."""
    cols = []
    c = 0
    for d in bm.block_dims:
        col = table[:, c]
        if isinstance(d, bs.Blocked):
            cols.append(col * d.block_size)
        elif isinstance(d, bs.Element):
            cols.append(col - d.padding[0])
        else:
            cols.append(col)
        c += 2 if isinstance(d, bs.BoundedSlice) else 1
    return np.stack(cols, axis=1) if cols else np.zeros((table.shape[0], 0), np.int64)


def load_block(buf, bm, pads, starts):
    """The block at ``starts`` from a padded buffer, squeezed dims removed."""
    if bm.whole and all(lo == 0 and hi == 0 for lo, hi in pads):
        return buf
    idx = [jnp.asarray(s, jnp.int32) + lo for s, (lo, _) in zip(starts, pads)]
    blk = lax.dynamic_slice(buf, idx, bm.block_shape)
    return squeeze_block(blk, bm)


def squeeze_block(blk, bm):
    sq = tuple(i for i, d in enumerate(bm.block_dims) if isinstance(d, bs.Squeezed))
    return lax.squeeze(blk, sq) if sq else blk


def unsqueeze_block(blk, bm):
    return blk.reshape(bm.block_shape)


def store_block(buf, bm, pads, starts, sizes, blk):
    """Writes a kernel-shaped block back into a padded buffer."""
    if bm.whole and all(lo == 0 and hi == 0 for lo, hi in pads):
        return blk
    blk = unsqueeze_block(blk, bm)
    idx = [jnp.asarray(s, jnp.int32) + lo for s, (lo, _) in zip(starts, pads)]
    if any(s is not None for s in sizes):
        old = lax.dynamic_slice(buf, idx, bm.block_shape)
        keep = None
        for dim, s in enumerate(sizes):
            if s is None:
                continue
            m = lax.broadcasted_iota(jnp.int32, bm.block_shape, dim) < s
            keep = m if keep is None else keep & m
        blk = jnp.where(keep, blk, old)
    return lax.dynamic_update_slice(buf, blk, idx)


def in_bounds(bm, starts, sizes):
    """Whether a block lies within the array (padding counted as inside)."""
    ok = jnp.bool_(True)
    for d, n, s, sz in zip(bm.block_dims, bm.array_aval.shape, starts, sizes):
        s = jnp.asarray(s, jnp.int32)
        if isinstance(d, bs.Blocked):
            ok &= (s >= 0) & (s < max(n, 1))
        elif isinstance(d, bs.Element):
            lo, hi = d.padding
            ok &= (s >= -lo) & (s + d.block_size <= n + hi)
        elif isinstance(d, bs.BoundedSlice):
            ok &= (s >= 0) & (sz >= 0) & (sz <= d.block_size) & (s + sz <= n)
        else:
            ok &= (s >= 0) & (s < n)
    return ok
