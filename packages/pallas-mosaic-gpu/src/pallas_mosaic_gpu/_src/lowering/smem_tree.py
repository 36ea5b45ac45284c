"""The kernel's SMEM tree: every entry at its alignment, in one flat tuple for Mosaic GPU.

Entries go in decreasing alignment (swizzled buffers, other buffers, barriers, TMEM
addresses), so padding is only needed where the order of equals leaves some. The
``run_scoped`` buffers that share bytes by lifetime come as one ``mgpu.Union`` entry
(see :mod:`scoped_stack`), as large as its deepest stack of live buffers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic import gpu as mgpu

SMEM_ALIGNMENT = 128  # TMA needs 128-byte aligned SMEM (and barriers 8 bytes)
SWIZZLE_REPEAT = 1024  # a 128-byte swizzle's XOR pattern repeats every 8 rows of 128 bytes


def alignment(size: int) -> int:
    """Where a buffer of ``size`` bytes may start: a swizzled buffer (whole swizzle atoms,
    ``8 x swizzle`` bytes each) at a multiple of its atom, since the swizzle XORs address
    bits 7.. into bits 4.. while Mosaic GPU's register loads/stores and wgmma descriptors
    (base offset 0) swizzle the offset from the buffer's start; other buffers at 128."""
    return max(SMEM_ALIGNMENT, min(SWIZZLE_REPEAT, size & -size)) if size else SMEM_ALIGNMENT


def buffer_bytes(e) -> int:
    """The bytes of an SMEM buffer (a ``jax.ShapeDtypeStruct``)."""
    return int(np.prod(e.shape)) * jnp.dtype(e.dtype).itemsize


def padding(n: int) -> jax.ShapeDtypeStruct:
    """``n`` bytes of nothing, to move the next entry to its alignment."""
    return jax.ShapeDtypeStruct((n,), jnp.uint8)


def size_and_alignment(e) -> tuple[int, int]:
    """An SMEM entry's bytes and where it may start: barriers at 8 bytes (mbarriers are
    8-byte words), a TMEM allocation's address (4 bytes) at 4, a union of buffers (each
    member a buffer after its padding) at the largest alignment of its buffers, buffers
    at :func:`alignment`."""
    if isinstance(e, (mgpu.Barrier, mgpu.ClusterBarrier)):
        return 8 * e.num_barriers, 8
    if isinstance(e, mgpu.TMEM) or getattr(e, "tmem_address", False):
        return 4, 4  # the TMEM address tcgen05.alloc writes to SMEM
    if isinstance(e, mgpu.Union):
        sizes = [sum(buffer_bytes(b) for b in m) for m in e.members]
        aligns = [alignment(buffer_bytes(m[-1])) for m in e.members]
        return max(sizes), max(aligns)
    size = buffer_bytes(e)
    return size, alignment(size)


def aligned(entries: dict):
    """The SMEM tree (a flat tuple, padded so every entry starts at its alignment, see
    :func:`size_and_alignment`), the position of each entry in it, and the total bytes."""
    tree, where, off = [], {}, 0
    sized = {key: size_and_alignment(e) for key, e in entries.items()}
    for key in sorted(entries, key=lambda k: -sized[k][1]):  # stable: otherwise as given
        size, align = sized[key]
        pad = (-off) % align
        if pad:
            tree.append(padding(pad))
            off += pad
        where[key] = len(tree)
        tree.append(entries[key])
        off += size
    return tuple(tree), where, off
