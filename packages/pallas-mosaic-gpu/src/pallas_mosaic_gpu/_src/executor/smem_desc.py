"""SMEM matrix descriptors, read by ``wgmma`` (``ops_wgmma``) and ``tcgen05.mma``
(``ops_tcgen05``): the 64-bit descriptor's start address (bits 0-13), leading and stride
dimension byte offsets (16-29, 32-45; each ``(x & 0x3FFFF) >> 4``), base offset (49-51)
and swizzle mode (62-63: 1 = 128 B, 2 = 64 B, 3 = 32 B); see ``ops_wgmma``'s module doc
for the layouts."""

from __future__ import annotations

import numpy as np

from pallas_mosaic_gpu._src.executor.types import EmulationError, EmulationUnsupported

_SWIZZLE = {1: 128, 2: 64, 3: 32}
WINDOW = (1 << 18) - 1  # SMEM addresses: descriptors hold their low 18 bits


def decode(desc: int):
    """(start, LBO, SBO, base offset, swizzle bytes) of a matrix descriptor."""
    f = lambda lo: ((desc >> lo) & 0x3FFF) << 4  # noqa: E731
    return f(0), f(16), f(32), (desc >> 49) & 7, _SWIZZLE.get((desc >> 62) & 3)


def smem_operand(m, desc: int, rows: int, k: int, dtype: np.dtype, k_major: bool):
    """The ``rows x k`` matrix (MN x K) a descriptor points at in this block's SMEM."""
    start, lbo, sbo, base, swz = decode(desc)
    if swz is None:
        raise EmulationUnsupported("wgmma with an unswizzled SMEM operand (interleaved "
                                   "layout)")
    if base:
        raise EmulationUnsupported(f"wgmma with a matrix base offset of {base}")
    es = dtype.itemsize
    t, w = 16 // es, swz // 16  # elements per 16-byte chunk, chunks per row
    r = np.arange(rows)[:, None]
    kk = np.arange(k)[None, :]
    if k_major:
        off = (r % 8) * swz + (r // 8) * sbo + (kk // t) * 16 + (kk % t) * es
    else:
        off = (r % t) * es + (r // t % w) * 16 + (r // t // w) * lbo + (kk % 8) * swz + \
            (kk // 8) * sbo
    window = m.smem & ~WINDOW
    addr = window + start + off
    addr = addr ^ (((addr >> 7) & (w - 1)) << 4)
    if addr.min() < m.smem or addr.max() + es > m.smem + m.smem_size:
        raise EmulationError(f"a wgmma operand (descriptor {desc:#x}) reaches outside the "
                             f"block's {m.smem_size} bytes of SMEM")
    return m.memory.gather(addr, dtype)
