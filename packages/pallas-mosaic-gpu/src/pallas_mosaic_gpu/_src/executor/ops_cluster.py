"""Clusters of CUDA blocks: the blocks of a cluster run together (their warpgroups are
coroutines of one scheduler), each with its own SMEM; ``mapa`` maps an SMEM address to
the same offset in another block of the cluster (distributed shared memory), remote
mbarrier arrivals, the cluster barrier (``barrier.cluster.arrive``/``wait``) and the
cluster's ids. Multicast TMA loads are in ``ops_async``.

A block's rank in its cluster is ``x + cx (y + cy z)`` for its index ``(x, y, z)`` in
the cluster and the cluster's shape ``(cx, cy, cz)`` (PTX's ``%cluster_ctarank``).
"""

from __future__ import annotations

import numpy as np

from pallas_mosaic_gpu._src.executor.cluster import cluster_of
from pallas_mosaic_gpu._src.executor.engine import asm, dimension_rules, op, same_index
from pallas_mosaic_gpu._src.executor.mbarrier import arrive
from pallas_mosaic_gpu._src.executor.types import EmulationError, EmulationUnsupported


def _size(m, d) -> int:
    return cluster_of(m).shape[d]


# The block's index in its cluster and the cluster's size, the cluster's index in the
# grid and the grid's size in clusters, along one dimension.
dimension_rules({
    "gpu.cluster_block_id": lambda m, d: same_index(int(m.block_id[d][0]) % _size(m, d)),
    "gpu.cluster_dim_blocks": lambda m, d: same_index(_size(m, d)),
    "gpu.cluster_id": lambda m, d: same_index(int(m.block_id[d][0]) // _size(m, d)),
    "gpu.cluster_dim": lambda m, d: same_index(m.grid_dim[d] // _size(m, d)),
})


@op("nvvm.read.ptx.sreg.cluster.ctarank")
def _ctarank(o, cc):
    def run(m):
        return (np.asarray([m.cta_rank], np.int32),)

    return run


@op("nvvm.cluster.arrive", "nvvm.cluster.arrive.relaxed")
def _cluster_arrive(o, cc):
    def run(m):
        c = cluster_of(m)
        n = m.threads if m.mask is None else int(np.count_nonzero(m.mask))
        m.cluster_phase = c.phase  # the phase this warpgroup's wait waits for
        c.arrived += n
        if c.arrived > c.threads:
            raise EmulationError(f"{c.arrived} threads arrived at the cluster barrier, "
                                 f"which expects {c.threads}")
        if c.arrived == c.threads:
            c.arrived, c.phase = 0, c.phase + 1

    return run


@op("nvvm.cluster.wait")
def _cluster_wait(o, cc):
    def run(m):
        c = cluster_of(m)
        want = getattr(m, "cluster_phase", None)
        if want is None:
            raise EmulationError("barrier.cluster.wait without a barrier.cluster.arrive")
        m.block.wait_until(m, lambda: c.phase > want,
                           lambda: f"the cluster barrier ({c.arrived} of {c.threads} "
                                   f"threads have arrived)")
        m.cluster_phase = None

    return run


@op("nvvm.mapa")
def _mapa(o, cc):
    def run(m, addr, rank):
        c = cluster_of(m)
        a = np.broadcast_to(np.asarray(addr, np.int64).reshape(-1), (m.threads,))
        r = np.broadcast_to(np.asarray(rank, np.int64).reshape(-1), (m.threads,))
        out = np.zeros(m.threads, np.int64)
        for i in m.lanes():
            out[i] = c.remote(m, a[i], int(r[i]))
        return (out,)

    return run


@asm(r"\{\s*\.reg \.b32 mapped_addr;\s*@\$0 mapa\.shared::cluster\.u32 mapped_addr, \$1, "
     r"\$2;\s*@\$0 mbarrier\.arrive\.shared::cluster\.b64 _, \[mapped_addr\];\s*\}")
def _remote_arrive(o, match):
    """Mosaic GPU's arrival on the mbarrier at the same offset in another block."""
    def run(m, pred, addr, rank):
        c = cluster_of(m)
        for i in m.lanes(pred):
            a = np.asarray(addr).reshape(-1)
            r = np.asarray(rank).reshape(-1)
            arrive(m, c.remote(m, int(a[i if a.size > 1 else 0]), int(r[i if r.size > 1 else 0])))

    return run


assert EmulationUnsupported  # raised by callers for what clusters cannot do here
