"""The blocks of one cluster (the state the cluster ops share): each rank's SMEM base,
the cluster barrier, and ``mapa``'s address mapping."""

from __future__ import annotations

from pallas_mosaic_gpu._src.executor.types import EmulationError


class Cluster:
    """The blocks of one cluster: each rank's SMEM and the cluster barrier."""

    def __init__(self, shape, smem_bases, smem_size: int, threads: int):
        self.shape = tuple(shape)
        self.smem = list(smem_bases)  # by rank
        self.smem_size = smem_size
        self.threads = threads  # of the whole cluster (the barrier's expected arrivals)
        self.arrived = 0
        self.phase = 0

    def remote(self, m, addr: int, rank: int) -> int:
        """``mapa``: the address at ``addr``'s offset in block ``rank``'s SMEM."""
        off = int(addr) - m.smem
        if not 0 <= off < self.smem_size:
            raise EmulationError(f"mapa of address {int(addr):#x}, outside the block's SMEM")
        if not 0 <= rank < len(self.smem):
            raise EmulationError(f"mapa to block {rank} of a cluster of {len(self.smem)}")
        return self.smem[rank] + off


def cluster_of(m) -> Cluster:
    c = getattr(m, "cluster", None)
    if c is None:  # a launch without clusters: a cluster of one block
        c = m.cluster = Cluster((1, 1, 1), [m.smem], m.smem_size, m.threads)
    return c


def rank_of(index, shape) -> int:
    x, y, z = index
    cx, cy, _ = shape
    return int(x + cx * (y + cy * z))
