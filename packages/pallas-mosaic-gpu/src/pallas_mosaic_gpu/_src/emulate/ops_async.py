"""TMA copies, mbarriers and the host runtime's TMA descriptors.

A copy is issued by each active lane whose predicate holds (normally one elected
thread) and completes at once: a load signals its bytes to its mbarrier, as TMA does;
``commit.group``/``wait_group`` have nothing left to wait for. An mbarrier completes
its phase when every expected arrival has happened and its transaction count is zero;
a wait on a phase that has not completed when every thread reaches it can never
complete (the threads run in lockstep) and is reported as a deadlock.
"""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from pallas_mosaic_gpu._src.emulate.engine import int_array_attr, op
from pallas_mosaic_gpu._src.emulate.types import EmulationError, EmulationUnsupported

_MAGIC = 0x314D54555047_4D  # the first 8 bytes of a descriptor written here
# The element size of each data type code of ``mosaic_gpu_init_tma_desc``.
_TMA_BYTES = {1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 2, 9: 4, 10: 8}


def _lane(x, i):
    x = np.asarray(x).reshape(len(np.asarray(x)), -1)
    return int(x[i if x.shape[0] > 1 else 0, 0])


def _pred(o, xs, seg_index=None):
    """The predicate operand of an nvvm op whose last segment is the predicate."""
    if "operandSegmentSizes" in o.attributes:
        seg = int_array_attr(o.attributes["operandSegmentSizes"])
        return xs[-1] if seg[-1] else None
    return None


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


def _descriptor(m, ptr: int) -> dict:
    magic, index = (int(v) for v in m.memory.read(ptr, (2,), np.int64))
    if magic != _MAGIC or not 0 <= index < len(m.tma_descriptors):
        raise EmulationError(f"no TMA descriptor at address {ptr:#x}")
    return m.tma_descriptors[index]


@op("func.call")
def _func_call(o, cc):
    callee = ir.FlatSymbolRefAttr(o.attributes["callee"]).value
    if callee != "mosaic_gpu_init_tma_desc":
        raise EmulationUnsupported(f"the Mosaic GPU executor does not implement a call to "
                                   f"{callee}")

    def run(m, *xs):
        init_tma_desc(m, *xs)

    return run


def _swizzle(offsets: np.ndarray, swizzle: int) -> np.ndarray:
    """SMEM byte offsets under TMA's swizzle (16-byte chunks XOR the 128-byte row)."""
    if swizzle in (0, 16):
        return offsets
    mask = swizzle // 16 - 1
    return offsets ^ (((offsets >> 7) & mask) << 4)


def _box(desc, coords):
    """For each element of the box (row-major), its GMEM address and whether it lies
    inside the tensor, and its SMEM byte offset."""
    rank, es = len(desc["sizes"]), desc["esize"]
    window = desc["window"]
    idx = np.indices(window).reshape(rank, -1).astype(np.int64)
    start = np.asarray(coords[::-1], np.int64)[:, None]  # box coords are innermost first
    g = idx + start
    inside = np.all((g >= 0) & (g < np.asarray(desc["sizes"])[:, None]), axis=0)
    gaddr = desc["base"] + (g * np.asarray(desc["strides"])[:, None]).sum(0) * es
    soff = _swizzle(np.arange(idx.shape[1], dtype=np.int64) * es, desc["swizzle"])
    return gaddr, inside, soff, es


def _bytes(addrs, es):
    return (addrs[:, None] + np.arange(es)).reshape(-1)


@op("nvvm.cp.async.bulk.tensor.shared.cluster.global")
def _tma_load(o, cc):
    seg = int_array_attr(o.attributes["operandSegmentSizes"])
    if seg[4] or seg[5]:
        raise EmulationUnsupported("TMA loads in im2col mode or multicast to a cluster")
    ncoord = seg[2]

    def run(m, *xs):
        dst, desc_ptr, coords, mbar = xs[0], xs[1], xs[2:2 + ncoord], xs[2 + ncoord]
        for i in m.lanes(_pred(o, xs)):
            desc = _descriptor(m, _lane(desc_ptr, i))
            gaddr, inside, soff, es = _box(desc, [_lane(c, i) for c in coords])
            data = np.zeros((len(gaddr), es), np.uint8)
            if inside.any():
                data[inside] = m.memory.gather(_bytes(gaddr[inside], es), np.uint8).reshape(
                    -1, es)
            m.memory.scatter(_bytes(_lane(dst, i) + soff, es), data.reshape(-1))
            complete_tx(m, _lane(mbar, i), len(gaddr) * es)

    return run


@op("nvvm.cp.async.bulk.tensor.global.shared.cta")
def _tma_store(o, cc):
    seg = int_array_attr(o.attributes["operandSegmentSizes"])
    ncoord = seg[2]
    if "mode" in o.attributes and "tile" not in str(o.attributes["mode"]):
        raise EmulationUnsupported(f"TMA stores in mode {o.attributes['mode']}")
    if "redKind" in o.attributes:
        raise EmulationUnsupported("TMA reductions")

    def run(m, *xs):
        desc_ptr, src, coords = xs[0], xs[1], xs[2:2 + ncoord]
        for i in m.lanes(_pred(o, xs)):
            desc = _descriptor(m, _lane(desc_ptr, i))
            gaddr, inside, soff, es = _box(desc, [_lane(c, i) for c in coords])
            data = m.memory.gather(_bytes(_lane(src, i) + soff, es), np.uint8).reshape(-1, es)
            if inside.any():
                m.memory.scatter(_bytes(gaddr[inside], es), data[inside].reshape(-1))

    return run


@op("nvvm.cp.async.bulk.commit.group", "nvvm.cp.async.bulk.wait_group")
def _bulk_group(o, cc):
    def run(m, *xs):
        return None

    return run


# -- mbarriers -------------------------------------------------------------------------


def _state(m, addr: int) -> dict:
    st = m.mbarriers.get(addr)
    if st is None:
        raise EmulationError(f"mbarrier at {addr:#x} used before nvvm.mbarrier.init")
    return st


def _maybe_complete(st):
    if st["pending"] == 0 and st["tx"] == 0:
        st["phase"] += 1
        st["pending"] = st["count"]


def complete_tx(m, addr: int, nbytes: int):
    st = _state(m, addr)
    st["tx"] -= nbytes
    _maybe_complete(st)


def _arrive(st, tx=0):
    st["tx"] += tx
    st["pending"] -= 1
    if st["pending"] < 0:
        raise EmulationError("more arrivals on an mbarrier than its arrival count")
    _maybe_complete(st)


@op("nvvm.mbarrier.init", "nvvm.mbarrier.init.shared")
def _mbarrier_init(o, cc):
    def run(m, addr, count, pred=None):
        for i in m.lanes(pred):
            n = _lane(count, i)
            m.mbarriers[_lane(addr, i)] = dict(count=n, pending=n, tx=0, phase=0)

    return run


@op("nvvm.mbarrier.arrive.expect_tx", "nvvm.mbarrier.arrive.expect_tx.shared")
def _mbarrier_arrive_expect_tx(o, cc):
    def run(m, addr, tx, pred=None):
        for i in m.lanes(pred):
            _arrive(_state(m, _lane(addr, i)), _lane(tx, i))

    return run


@op("nvvm.mbarrier.arrive", "nvvm.mbarrier.arrive.shared")
def _mbarrier_arrive(o, cc):
    def run(m, addr, *rest):
        for i in m.lanes():
            _arrive(_state(m, _lane(addr, i)))
        if o.results:
            return (np.zeros(1, np.int64),)

    return run


@op("nvvm.mbarrier.try_wait.parity", "nvvm.mbarrier.try_wait.parity.shared")
def _mbarrier_wait(o, cc):
    def run(m, addr, parity, *rest):
        for i in m.lanes():
            st = _state(m, _lane(addr, i))
            if st["phase"] % 2 == _lane(parity, i) % 2:
                raise EmulationError(
                    f"deadlock: thread {i} waits on phase parity {_lane(parity, i) % 2} of "
                    f"the mbarrier at {_lane(addr, i):#x}, which every thread has reached "
                    f"and which can no longer complete ({st['pending']} arrivals and "
                    f"{st['tx']} transaction bytes outstanding)")
        if o.results:
            return (np.ones(1, bool),)

    return run
