"""Tensor memory (TMEM) and the tensor core's queue of a block (the state the
``tcgen05`` ops, the TMA landings and the block's end share): allocations, cells (an
unwritten cell reads as NaN) and the ops committed to mbarriers, run when one is waited
for or the block ends."""

from __future__ import annotations

import numpy as np

from pallas_mosaic_gpu._src.executor.mbarrier import arrive
from pallas_mosaic_gpu._src.executor.types import EmulationError

LANES, COLUMNS = 128, 512
_GARBAGE = 0xFFFFFFFF  # unwritten TMEM reads as NaN


class Tmem:
    """A block's tensor memory, its allocations and its tensor core's queue."""

    def __init__(self):
        self.cells = np.full((LANES, COLUMNS), _GARBAGE, np.uint32)
        self.allocated: dict[int, int] = {}  # first column -> columns
        self.relinquished = False
        self.queue: list = []  # ("op", fn) | ("commit", mbarrier addresses), issue order

    def alloc(self, ncols: int) -> int:
        if ncols < 32 or ncols > COLUMNS or ncols & (ncols - 1):
            raise EmulationError(f"tcgen05.alloc of {ncols} columns (a power of two from "
                                 f"32 to {COLUMNS})")
        if self.relinquished:
            raise EmulationError("tcgen05.alloc after tcgen05.relinquish_alloc_permit")
        for start in range(0, COLUMNS, ncols):
            if all(s + n <= start or start + ncols <= s for s, n in self.allocated.items()):
                self.allocated[start] = ncols
                return start
        raise EmulationError(
            f"tcgen05.alloc of {ncols} columns with {sorted(self.allocated.items())} "
            f"(first column, columns) already allocated: it would wait forever")

    def dealloc(self, taddr: int, ncols: int) -> None:
        col = taddr & 0xFFFF
        if self.allocated.get(col) != ncols or taddr >> 16:
            raise EmulationError(f"tcgen05.dealloc of {ncols} columns at TMEM address "
                                 f"{taddr:#x}, which is not an allocation of that size "
                                 f"({sorted(self.allocated.items())})")
        del self.allocated[col]

    def check(self, col: int, ncols: int, what: str) -> None:
        if not any(s <= col and col + ncols <= s + n for s, n in self.allocated.items()):
            raise EmulationError(f"{what} reaches TMEM columns [{col}, {col + ncols}), "
                                 f"outside every allocation "
                                 f"({sorted(self.allocated.items())})")

    def run_until(self, m, bar: int | None) -> None:
        """Runs the queued ops up to the last commit to ``bar`` (all of them: None),
        arriving on each committed mbarrier on the way."""
        if bar is None:
            last = len(self.queue) - 1
        else:
            hits = [i for i, (k, x) in enumerate(self.queue) if k == "commit" and bar in x]
            if not hits:
                return
            last = hits[-1]
        todo, self.queue = self.queue[:last + 1], self.queue[last + 1:]
        for kind, x in todo:
            if kind == "op":
                x()
            else:
                for b in x:
                    arrive(m, b)


def tmem_of(m) -> Tmem:
    """The TMEM of the machine's block (created at its first use; blocks of a cluster
    share ``m.pending`` and are told apart by their SMEM)."""
    return tmem_at(m, m.smem)


def tmem_at(m, smem: int) -> Tmem:
    """The TMEM of the block of the cluster whose SMEM starts at ``smem``."""
    t = m.pending.get(("tmem", smem))
    if t is None:
        t = m.pending[("tmem", smem)] = Tmem()
    return t


def _tmems(m) -> list:
    return [t for k, t in m.pending.items() if k[0] == "tmem"]


def land_mmas(m, bar: int) -> None:
    """Completes the tensor core ops committed to the mbarrier at ``bar``."""
    for t in _tmems(m):
        t.run_until(m, bar)


def finish_block(m) -> None:
    """The end of a block (of a cluster's blocks): queued tensor core ops complete;
    TMEM must be deallocated."""
    for t in _tmems(m):
        t.run_until(m, None)
        if t.allocated:
            raise EmulationError(f"a block exits with TMEM columns still allocated "
                                 f"({sorted(t.allocated.items())}: first column, columns); "
                                 f"tcgen05.dealloc them first")
