"""``gpu`` ops (the launch, thread/block ids, dynamic SMEM, barriers), ``nvvm`` warp
ops (``elect.sync``, ``shfl.sync``) and fences, and ``builtin`` casts."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from pallas_mosaic_gpu._src.executor.cluster import Cluster
from pallas_mosaic_gpu._src.executor.engine import (
    dimension_rules,
    int_array_attr,
    no_effect,
    op,
    run,
    same_index,
    uniform,
)
from pallas_mosaic_gpu._src.executor.memref import MemRef, from_struct, to_struct
from pallas_mosaic_gpu._src.executor.sched import WARPGROUP, Block
from pallas_mosaic_gpu._src.executor.tma import flush_async
from pallas_mosaic_gpu._src.executor.types import EmulationError, EmulationUnsupported

WARP = 32
SMEM_FILL = 0xFF  # SMEM starts as garbage (NaN for floats): reading unwritten SMEM shows
SMEM_WINDOW = 1 << 18  # the shared window's address bits a descriptor keeps


@op("gpu.launch")
def _launch(o, cc):
    seg = int_array_attr(o.attributes["operandSegmentSizes"])
    body = cc.region(o.regions[0])
    nasync = seg[0]
    clustered = any(seg[7:10])

    def run_launch(m, *xs):
        grid = [uniform(x, m, "the grid size") for x in xs[nasync:nasync + 3]]
        block = [uniform(x, m, "the block size") for x in xs[nasync + 3:nasync + 6]]
        cluster = [uniform(x, m, "the cluster size") for x in xs[nasync + 6:nasync + 9]] \
            if clustered else [1, 1, 1]
        smem = uniform(xs[-1], m, "the SMEM size") if seg[10] else 0
        if any(g % c for g, c in zip(grid, cluster)):
            raise EmulationError(f"a grid of {grid} blocks in clusters of {cluster}")
        threads = block[0] * block[1] * block[2]
        # Warpgroups run as coroutines (sched.py); a block of another size is one group.
        size = WARPGROUP if threads % WARPGROUP == 0 else threads
        saved = (m.threads, m.thread_id, m.block_id, m.block_dim, m.grid_dim, m.mask)
        m.block_dim, m.grid_dim = tuple(block), tuple(grid)
        g = [np.asarray([v], np.int64) for v in grid]
        b = [np.asarray([v], np.int64) for v in block]
        cs = [np.asarray([v], np.int64) for v in cluster]
        try:
            for cz, cy, cx in np.ndindex(*(gd // c for gd, c in zip(grid[::-1], cluster[::-1]))):
                run_cluster(m, (cx, cy, cz), cluster, smem, threads, size,
                            lambda gm, bid, cid: run(body, gm, gm.env, [
                                *bid, *gm.thread_id, *g, *b,
                                *([np.asarray([v], np.int64) for v in cid] + cs
                                  if clustered else [])]))
        finally:
            m.threads, m.thread_id, m.block_id, m.block_dim, m.grid_dim, m.mask = saved
        return (None,) * len(o.results)

    return run_launch


def run_cluster(m, cid, cluster, smem, threads, size, body_of):
    """Runs the blocks of cluster ``cid`` together: each block's SMEM (at a 256 KiB
    boundary: its addresses' low 18 bits are offsets in the block's shared window, as
    wgmma descriptors take them), the cluster's mbarriers and async units shared."""
    cx, cy, cz = cluster
    bids = [tuple(c * n + i for c, n, i in zip(cid, cluster, (x, y, z)))
            for z in range(cz) for y in range(cy) for x in range(cx)]  # by rank
    bases = [m.memory.alloc(smem, f"SMEM of block {bid}", fill=SMEM_FILL, align=SMEM_WINDOW)
             for bid in bids]
    m.mbarriers = {}
    m.pending = {}
    cl = Cluster(cluster, bases, smem, threads * len(bids))
    groups, names = [], []
    for rank, (bid, base) in enumerate(zip(bids, bases)):
        m.block_id = tuple(np.asarray([v], np.int64) for v in bid)
        m.smem, m.smem_size, m.cta_rank, m.cluster = base, smem, rank, cl
        for i in range(0, threads, size):
            # A strand per warp for the warpgroups whose warps wait for each other.
            split = i // size in m.split_warps and size % WARP == 0
            for j in range(i, i + size, WARP if split else size):
                gm = m.fork(np.arange(j, j + (WARP if split else size)))
                gm.warpgroup, gm.is_warp = i // size, split
                groups.append(gm)
                name = f"warp {j // WARP} (of warpgroup {i // size})" if split else \
                    f"warpgroup {i // size}"
                names.append(f"block {rank} {name}" if len(bids) > 1 else name)
    try:
        Block(groups, names).run(lambda gm: body_of(gm, gm.block_id, cid))
        flush_async(m)
    finally:
        for base in bases:
            m.memory.free(base)
        m.cluster = None


# Thread and block ids are per thread; the block and grid sizes, one for all.
dimension_rules({
    "gpu.thread_id": lambda m, d: m.thread_id[d],
    "gpu.block_id": lambda m, d: m.block_id[d],
    "gpu.block_dim": lambda m, d: same_index(m.block_dim[d]),
    "gpu.grid_dim": lambda m, d: same_index(m.grid_dim[d]),
})


@op("gpu.dynamic_shared_memory")
def _dynamic_shared_memory(o, cc):
    def run_(m):
        p = np.asarray([m.smem], np.int64)
        one = np.ones(1, np.int64)
        return (MemRef(p, p, np.zeros(1, np.int64), [np.asarray([m.smem_size], np.int64)],
                       [one], np.dtype(np.int8)),)

    return run_


@op("gpu.barrier", "nvvm.barrier0")
def _barrier(o, cc):
    """``__syncthreads``: barrier 0, for every thread of the block."""
    def run_(m):
        bx, by, bz = m.block_dim
        m.block.barrier(m, 0, bx * by * bz, "the block barrier (gpu.barrier)")

    return run_


# Every access completes before the next op starts: fences order nothing more; the lanes
# of a warp meet at ``bar.warp.sync``, which lanes running in lockstep do.
op("nvvm.fence.mbarrier.init", "nvvm.fence.proxy", "nvvm.fence.proxy.acquire",
   "nvvm.fence.proxy.release", "gpu.dealloc", "nvvm.setmaxregister",
   "nvvm.wgmma.fence.aligned", "nvvm.bar.warp.sync")(no_effect)


@op("nvvm.elect.sync")
def _elect(o, cc):
    def run_(m):
        active = np.ones(m.threads, bool) if m.mask is None else m.mask
        out = np.zeros(m.threads, bool)
        for w in range(0, m.threads, WARP):
            lanes = np.nonzero(active[w:w + WARP])[0]
            if lanes.size:
                out[w + lanes[0]] = True
        return (out,)

    return run_


@op("nvvm.shfl.sync")
def _shfl(o, cc):
    kind = str(o.attributes["kind"]).split()[-1].rstrip(">")
    if kind not in ("idx", "up", "down", "bfly"):
        raise EmulationUnsupported(f"nvvm.shfl.sync kind {kind}")
    pred_result = len(o.results[0].type.__str__()) and "struct" in str(o.results[0].type)
    if pred_result:
        raise EmulationUnsupported("nvvm.shfl.sync returning a predicate")

    def run_(m, mask, val, b, c):
        n = m.threads
        lane = np.arange(n) % WARP
        base = np.arange(n) - lane
        b = np.broadcast_to(np.asarray(b, np.int64).reshape(-1), (n,))
        c = np.broadcast_to(np.asarray(c, np.int64).reshape(-1), (n,))
        segmask = (c >> 8) & 0x1F
        max_lane = (lane & segmask) | (c & 0x1F & ~segmask)
        min_lane = lane & segmask
        if kind == "up":
            j = lane - b
            ok = j >= max_lane
        elif kind == "down":
            j = lane + b
            ok = j <= max_lane
        elif kind == "bfly":
            j = lane ^ b
            ok = j <= max_lane
        else:
            j = min_lane | (b & 0x1F & ~segmask)
            ok = j <= max_lane
        j = np.where(ok, j, lane)
        val = np.asarray(val)
        val = np.broadcast_to(val, (n,) + val.shape[1:])
        return (val[base + j],)

    return run_


@op("builtin.unrealized_conversion_cast")
def _unrealized_cast(o, cc):
    src, dst = str(o.operands[0].type), o.results[0].type
    if isinstance(dst, ir.MemRefType) and src.startswith("!llvm.struct"):
        def run_(m, x):
            return (from_struct(x, dst),)
    elif isinstance(o.operands[0].type, ir.MemRefType) and str(dst).startswith("!llvm.struct"):
        def run_(m, x):
            return (to_struct(x),)
    elif str(dst) == "!gpu.async.token":
        def run_(m, x):
            return (None,)
    elif src.startswith("!llvm.array") and str(dst).startswith("!llvm.ptr"):
        # Kernel parameters passed by value (TMA descriptors): the device reads them
        # from parameter memory, here a region holding the bytes.
        def run_(m, x):
            x = np.asarray(x)
            key = (id(o), x.tobytes())
            if key not in m.cache:
                m.cache[key] = m.memory.put(x[0].view(np.uint8), "kernel parameters")
            return (np.asarray([m.cache[key]], np.int64),)
    else:
        raise EmulationUnsupported(f"builtin.unrealized_conversion_cast from {src} to {dst}")
    return run_
