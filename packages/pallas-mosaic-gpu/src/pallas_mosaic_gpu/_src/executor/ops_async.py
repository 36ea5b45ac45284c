"""TMA copies, mbarriers, bulk async-groups and the host runtime's TMA descriptors.

A copy is issued by each active lane whose predicate holds (normally one elected
thread) and completes as late as the hardware allows, so code that reads a copy's
destination before waiting for it sees stale data: a load reads GMEM when issued and
lands in SMEM (signalling its bytes to its mbarrier, as TMA does) only when some thread
waits on that mbarrier or the block ends; a store joins the issuing thread's open bulk
async-group and reads SMEM and writes GMEM only when ``cp.async.bulk.wait_group``
waits for its committed group, or at the end of the block. An mbarrier completes its
phase when every expected arrival has happened and its transaction count is zero; a
warpgroup waiting on a phase that has not completed lets the others run
(:mod:`sched`), and a wait no one can satisfy any more is a deadlock.
"""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from pallas_mosaic_gpu._src.executor.cluster import cluster_of
from pallas_mosaic_gpu._src.executor.engine import asm, int_array_attr, op
from pallas_mosaic_gpu._src.executor.mbarrier import arrive, arrive_state, complete_tx, state
from pallas_mosaic_gpu._src.executor.tma import (
    box,
    bulk_groups,
    byte_addresses,
    descriptor,
    init_tma_desc,
    land_loads,
    swizzle_at,
    tma_load,
)
from pallas_mosaic_gpu._src.executor.types import EmulationError, EmulationUnsupported


def _lane(x, i):
    x = np.asarray(x).reshape(len(np.asarray(x)), -1)
    return int(x[i if x.shape[0] > 1 else 0, 0])


def _pred(o, xs, seg_index=None):
    """The predicate operand of an nvvm op whose last segment is the predicate."""
    if "operandSegmentSizes" in o.attributes:
        seg = int_array_attr(o.attributes["operandSegmentSizes"])
        return xs[-1] if seg[-1] else None
    return None


@op("func.call")
def _func_call(o, cc):
    callee = ir.FlatSymbolRefAttr(o.attributes["callee"]).value
    if callee != "mosaic_gpu_init_tma_desc":
        raise EmulationUnsupported(f"the Mosaic GPU executor does not implement a call to "
                                   f"{callee}")

    def run(m, *xs):
        init_tma_desc(m, *xs)

    return run


@op("nvvm.cp.async.bulk.tensor.shared.cluster.global")
def _tma_load(o, cc):
    """A TMA load; with a multicast mask it lands at the same SMEM offset in every block
    of the cluster the mask names, signalling each one's mbarrier at the same offset."""
    seg = int_array_attr(o.attributes["operandSegmentSizes"])
    if seg[4]:
        raise EmulationUnsupported("TMA loads in im2col mode")
    ncoord = seg[2]
    multicast = 3 + ncoord if seg[5] else None

    def run(m, *xs):
        dst, desc_ptr, coords, mbar = xs[0], xs[1], xs[2:2 + ncoord], xs[2 + ncoord]
        for i in m.lanes(_pred(o, xs)):
            addr, bar = _lane(dst, i), _lane(mbar, i)
            targets = [(addr, bar)]
            if multicast is not None:
                cl, mask = cluster_of(m), _lane(xs[multicast], i) & 0xFFFF
                targets = [(cl.remote(m, addr, r), cl.remote(m, bar, r))
                           for r in range(len(cl.smem)) if mask >> r & 1]
            tma_load(m, _lane(desc_ptr, i), [_lane(c, i) for c in coords], targets)

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
            desc = descriptor(m, _lane(desc_ptr, i))
            gaddr, inside, soff, es = box(desc, [_lane(c, i) for c in coords])
            saddr = byte_addresses(swizzle_at(_lane(src, i), soff, desc["swizzle"]), es)

            def copy(gaddr=gaddr, inside=inside, saddr=saddr, es=es):
                data = m.memory.gather(saddr, np.uint8).reshape(-1, es)
                if inside.any():
                    m.memory.scatter(byte_addresses(gaddr[inside], es), data[inside].reshape(-1))

            bulk_groups(m, i)["open"].append(copy)

    return run


@op("nvvm.cp.async.bulk.commit.group")
def _bulk_commit(o, cc):
    def run(m):
        for i in m.lanes():
            g = bulk_groups(m, int(i))
            if g["open"]:
                g["committed"].append(g["open"])
                g["open"] = []

    return run


@op("nvvm.cp.async.bulk.wait_group")
def _bulk_wait(o, cc):
    n = int(ir.IntegerAttr(o.attributes["group"]).value)

    def run(m):
        for i in m.lanes():
            g = bulk_groups(m, int(i))
            while len(g["committed"]) > n:
                for copy in g["committed"].pop(0):
                    copy()

    return run


# -- mbarriers -------------------------------------------------------------------------


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
            arrive_state(state(m, _lane(addr, i)), _lane(tx, i))

    return run


@op("nvvm.mbarrier.arrive", "nvvm.mbarrier.arrive.shared")
def _mbarrier_arrive(o, cc):
    def run(m, addr, *rest):
        for i in m.lanes():
            arrive_state(state(m, _lane(addr, i)))
        if o.results:
            return (np.zeros(1, np.int64),)

    return run


@op("nvvm.mbarrier.try_wait.parity", "nvvm.mbarrier.try_wait.parity.shared")
def _mbarrier_wait(o, cc):
    """Waits until the phase of the given parity has completed (NVVM lowers the op
    to a loop around ``try_wait``)."""
    def run(m, addr, parity, *rest):
        waits = {}
        for i in m.lanes():
            waits.setdefault(_lane(addr, i), set()).add(_lane(parity, i) % 2)
        for a, parities in waits.items():
            if len(parities) > 1:
                raise EmulationUnsupported("threads of a warpgroup waiting on different "
                                           "phases of one mbarrier")
            st = state(m, a)
            p = parities.pop()

            def done(a=a, st=st, p=p):
                land_loads(m, a)
                return st["phase"] % 2 != p

            def what(a=a, st=st, p=p):
                return (f"phase parity {p} of the mbarrier at {a:#x} ({st['pending']} "
                        f"arrivals and {st['tx']} transaction bytes outstanding)")

            m.block.wait_until(m, done, what)
        if o.results:
            return (np.ones(1, bool),)

    return run


@asm(r"@\$(\d+) mbarrier\.arrive(?:\.release)?(?:\.cta)?\.shared(?:::cta)?\.b64 "
     r"\$0, \[\$(\d+)\], (\d+);")
def _arrive_asm(o, match):
    """Mosaic GPU's predicated arrival (``mbarrier.arrive.release ... [addr], count``)."""
    pred_i, addr_i, count = int(match.group(1)) - 1, int(match.group(2)) - 1, \
        int(match.group(3))

    def run(m, *xs):
        for i in m.lanes(xs[pred_i]):
            arrive(m, _lane(xs[addr_i], i), count)
        return (np.zeros(1, np.int64),)

    return run


@asm(r"@\$0 cp\.async\.bulk\.shared::cta\.global\.mbarrier::complete_tx::bytes "
     r"\[\$1\], \[\$2\], \$3, \[\$4\];")
def _bulk_load_asm(o, match):
    """A non-tensor bulk copy GMEM -> SMEM of ``$3`` bytes (a multiple of 16, both
    addresses 16-byte aligned), by each lane whose predicate ``$0`` holds: like a TMA
    load it reads GMEM when issued and lands (completing its bytes on the mbarrier
    ``$4``) when that mbarrier is waited on or the block ends."""

    def run(m, pred, dst, src, size, bar):
        for i in m.lanes(pred):
            d, s, n, b = _lane(dst, i), _lane(src, i), _lane(size, i), _lane(bar, i)
            if n % 16 or d % 16 or s % 16:
                raise EmulationError(
                    f"cp.async.bulk of {n} bytes from {s:#x} to {d:#x}: the size and both "
                    f"addresses must be multiples of 16")
            state(m, b)  # the barrier exists when the copy is issued
            if n == 0:  # nothing to copy, no bytes to complete
                continue
            data = m.memory.gather(s + np.arange(n, dtype=np.int64), np.uint8)
            landing = (d + np.arange(n, dtype=np.int64), data, b, n)
            m.pending.setdefault(("load", b), []).append(landing)

    return run


@asm(r"(?:@\$2 )?mbarrier\.complete_tx\.shared::cta\.b64 \[\$0\], \$1;")
def _complete_tx_asm(o, match):
    """``mbarrier.complete_tx``: ``$1`` transaction bytes complete on the mbarrier at
    ``$0`` without an arrival (by each lane whose predicate ``$2``, if any, holds)."""

    def run(m, bar, nbytes, pred=None):
        for i in m.lanes(pred):
            complete_tx(m, _lane(bar, i), _lane(nbytes, i))

    return run


@asm(r"@\$0 cp\.async\.bulk\.prefetch\.tensor\.(\d)d\.L2\.global\.tile "
     r"\[\$1, \{[$\d, ]*\}\];")
def _prefetch_asm(o, match):
    """A TMA prefetch of a box into L2: no effect on memory the executor models, but
    the tensor map must exist (the hardware faults otherwise)."""

    def run(m, pred, desc_ptr, *coords):
        for i in m.lanes(pred):
            descriptor(m, _lane(desc_ptr, i))

    return run
