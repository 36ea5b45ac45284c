"""TMA copies and the host runtime's TMA descriptors (the state the async-copy ops of
``ops_async``, ``ops_cta_pair`` and the block's end in ``ops_gpu`` share): a load reads
GMEM when issued and lands in SMEM (signalling its bytes to its mbarrier) when some
thread waits on that mbarrier or the block ends; a store joins the issuing thread's
open bulk async-group and runs when its committed group is waited for, or at the end
of the block."""

from __future__ import annotations

import numpy as np

from pallas_mosaic_gpu._src.executor.mbarrier import complete_tx, state
from pallas_mosaic_gpu._src.executor.tmem import finish_block, land_mmas
from pallas_mosaic_gpu._src.executor.types import EmulationError, EmulationUnsupported

_MAGIC = 0x314D54555047_4D  # the first 8 bytes of a descriptor written here
# The element size of each data type code of ``mosaic_gpu_init_tma_desc``.
_TMA_BYTES = {1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 2, 9: 4, 10: 8}


def _lane(x, i):
    x = np.asarray(x).reshape(len(np.asarray(x)), -1)
    return int(x[i if x.shape[0] > 1 else 0, 0])


# -- the host runtime's descriptor ---------------------------------------------------


def init_tma_desc(m, host_ptr, base, code, rank, sizes_ptr, strides_ptr, swizzle, window_ptr):
    """``mosaic_gpu_init_tma_desc``: records the tensor map and writes its handle."""
    rank = _lane(rank, 0)
    code = _lane(code, 0)
    if code not in _TMA_BYTES:
        raise EmulationUnsupported(f"TMA of sub-byte elements (data type code {code})")
    read = lambda p: [int(v) for v in m.memory.read(_lane(p, 0), (rank,), np.int64)]  # noqa: E731
    desc = dict(base=_lane(base, 0), esize=_TMA_BYTES[code], sizes=read(sizes_ptr),
                strides=read(strides_ptr), swizzle=_lane(swizzle, 0), window=read(window_ptr))
    m.tma_descriptors.append(desc)
    handle = np.asarray([_MAGIC, len(m.tma_descriptors) - 1], np.int64)
    m.memory.scatter(np.asarray([_lane(host_ptr, 0)]) + np.arange(2) * 8, handle)


def descriptor(m, ptr: int) -> dict:
    magic, index = (int(v) for v in m.memory.read(ptr, (2,), np.int64))
    if magic != _MAGIC or not 0 <= index < len(m.tma_descriptors):
        raise EmulationError(f"no TMA descriptor at address {ptr:#x}")
    return m.tma_descriptors[index]


def _swizzle(offsets: np.ndarray, swizzle: int) -> np.ndarray:
    """SMEM byte addresses under a swizzle of ``swizzle`` bytes: bits 4.. (the 16-byte
    chunk) XOR bits 7.. (the 128-byte row), as many bits as the swizzle has chunks."""
    if swizzle in (0, 16):
        return offsets
    mask = swizzle // 16 - 1
    return offsets ^ (((offsets >> 7) & mask) << 4)


def swizzle_at(addr: int, offsets: np.ndarray, swizzle: int) -> np.ndarray:
    """The SMEM addresses of a box at ``addr``: TMA swizzles the address bits
    themselves (the SMEM window starts at a 256 KiB boundary here)."""
    return _swizzle(addr + offsets, swizzle)


def box(desc, coords):
    """For each element of the box (row-major), its GMEM address and whether it lies
    inside the tensor, and its SMEM byte offset before swizzling."""
    rank, es = len(desc["sizes"]), desc["esize"]
    window = desc["window"]
    idx = np.indices(window).reshape(rank, -1).astype(np.int64)
    start = np.asarray(coords[::-1], np.int64)[:, None]  # box coords are innermost first
    g = idx + start
    inside = np.all((g >= 0) & (g < np.asarray(desc["sizes"])[:, None]), axis=0)
    gaddr = desc["base"] + (g * np.asarray(desc["strides"])[:, None]).sum(0) * es
    soff = np.arange(idx.shape[1], dtype=np.int64) * es  # swizzled by the caller
    return gaddr, inside, soff, es


def byte_addresses(addrs, es):
    return (addrs[:, None] + np.arange(es)).reshape(-1)


def tma_load(m, desc_ptr: int, coords, targets) -> None:
    """Issues a TMA load of the box at ``coords`` (innermost first) of the tensor map at
    ``desc_ptr``: it reads GMEM now and lands at each ``(SMEM address, mbarrier)`` of
    ``targets`` when that mbarrier is waited on (or the block ends)."""
    desc = descriptor(m, desc_ptr)
    gaddr, inside, soff, es = box(desc, coords)
    data = np.zeros((len(gaddr), es), np.uint8)
    if inside.any():
        data[inside] = m.memory.gather(byte_addresses(gaddr[inside], es), np.uint8).reshape(-1, es)
    for a, b in targets:
        state(m, b)  # the barrier exists when the copy is issued
        landing = (byte_addresses(swizzle_at(a, soff, desc["swizzle"]), es),
                   data.reshape(-1), b, len(gaddr) * es)
        m.pending.setdefault(("load", b), []).append(landing)


def land_loads(m, bar: int) -> None:
    """Lands the TMA loads in flight that signal the mbarrier at ``bar``, and runs the
    tensor core ops committed to it (``ops_tcgen05``)."""
    for addrs, data, b, nbytes in m.pending.pop(("load", bar), ()):
        m.memory.scatter(addrs, data)
        complete_tx(m, b, nbytes)
    land_mmas(m, bar)


def flush_async(m) -> None:
    """The end of a block: every copy and tensor core op still in flight completes;
    TMEM must have been deallocated."""
    finish_block(m)
    for key in [k for k in m.pending if k[0] == "load"]:
        land_loads(m, key[1])
    for key in [k for k in m.pending if k[0] == "store"]:
        groups = m.pending.pop(key)
        for g in groups["committed"] + [groups["open"]]:
            for copy in g:
                copy()


def bulk_groups(m, lane: int) -> dict:
    """The bulk async-groups of a thread: its open group and the committed ones."""
    key = ("store", m.group, lane)
    if key not in m.pending:
        m.pending[key] = dict(open=[], committed=[])
    return m.pending[key]
