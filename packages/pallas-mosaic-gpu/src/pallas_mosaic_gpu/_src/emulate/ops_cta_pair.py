"""CTA pairs (``cta_group::2``): the two blocks of ranks ``2i`` and ``2i + 1`` of a
cluster sharing one tensor core operation. Semantics from the PTX ISA ("tcgen05.mma"
and "cp.async.bulk.tensor" with ``.cta_group::2``, "tcgen05.commit" with a multicast
mask; TMEM allocation across the pair is in ``ops_tcgen05``):

- the pair MMA, issued by one thread of the pair, with M = 256 (the instruction
  descriptor's M) and N the whole width: ``A = [A0; A1]`` (each block's SMEM holds its
  128 rows of A at the descriptor's offset), ``B = [B0 B1]`` (each block's SMEM holds
  N / 2 columns, block ``2i`` the first half), ``D = [D0; D1]``: block ``r``'s TMEM
  lanes 0-127, from the address's column, get ``D_r = A_r @ B`` (N columns). It runs
  on the issuing block's tensor core queue, in issue order, as ``cta_group::1`` MMAs
  do; M = 128 pair MMAs (64 rows per block) are not executed;
- a partitioned TMA load (``.cta_group::2``, the inline PTX Mosaic GPU emits) lands in
  the issuing block's own SMEM and signals the mbarrier at the ``mapa``-mapped address,
  which may be the peer's: the leader's barrier counts both halves' bytes.
"""

from __future__ import annotations

import types

import numpy as np

from pallas_mosaic_gpu._src.emulate.ops_async import tma_load
from pallas_mosaic_gpu._src.emulate.ops_cluster import cluster_of
from pallas_mosaic_gpu._src.emulate.ops_llvm import asm
from pallas_mosaic_gpu._src.emulate.ops_tcgen05 import (
    accumulate_into,
    decode_idesc,
    operands,
    tmem_at,
)
from pallas_mosaic_gpu._src.emulate.types import EmulationError, EmulationUnsupported

ROWS = 128  # rows of A and D per block of the pair (M = 256)


def _lane(x, i):
    x = np.asarray(x).reshape(len(np.asarray(x)), -1)
    return int(x[i if x.shape[0] > 1 else 0, 0])


def pair_blocks(m, what: str) -> tuple[int, int]:
    """The ranks of the pair the block of ``m`` belongs to (even rank first)."""
    cl = cluster_of(m)
    even = m.cta_rank & ~1
    if even + 1 >= len(cl.smem):
        raise EmulationError(f"{what} in block {m.cta_rank} of a cluster of "
                             f"{len(cl.smem)}: it has no peer block")
    return even, even + 1


def _block_view(m, rank: int):
    """What SMEM descriptors of block ``rank`` are read through (its SMEM window)."""
    cl = cluster_of(m)
    return types.SimpleNamespace(smem=cl.smem[rank], smem_size=cl.smem_size,
                                 memory=m.memory)


def pair_mma(m, d_addr: int, a_desc: int, b_desc: int, idesc: int, accumulate: bool,
             kind: str) -> None:
    """Runs one ``tcgen05.mma.cta_group::2`` with SMEM operands (see the module doc)."""
    a_t, b_t, d_t, n, mm, k = decode_idesc(idesc, kind)
    if mm != 2 * ROWS:
        raise EmulationUnsupported(f"tcgen05.mma.cta_group::2 with M = {mm} (only M = 256, "
                                   f"128 rows per block, is executed)")
    lane, col = (d_addr >> 16) & 0xFFFF, d_addr & 0xFFFF
    if lane:
        raise EmulationError(f"tcgen05.mma.cta_group::2 into TMEM lane {lane} (not 0)")
    pair = pair_blocks(m, "tcgen05.mma.cta_group::2")
    halves = [operands(_block_view(m, r), a_desc, b_desc, idesc, ROWS, n // 2, k, a_t, b_t)
              for r in pair]
    b = np.concatenate([bh for _, bh in halves], 0)  # [B0 B1]: N x K
    for r, (a, _) in zip(pair, halves):
        t = tmem_at(m, cluster_of(m).smem[r])
        t.check(col, n, f"tcgen05.mma.cta_group::2's accumulator in block {r}")
        accumulate_into(t, col, a, b, d_t, idesc, kind, accumulate)


@asm(r"\{\s*\.reg \.b32 mapped_addr;\s*@\$0 mapa\.shared::cluster\.u32 mapped_addr, \$3, "
     r"(?P<rank>\d+|\$\d+);\s*@\$0 cp\.async\.bulk\.tensor\.(?P<dims>\d)d\.shared::cta\."
     r"global\.tile\.mbarrier::complete_tx::bytes\.cta_group::2\s*\[\$1\], "
     r"\[\$2, \{(?P<coords>[^}]*)\}\], \[mapped_addr\];\s*\}")
def _partitioned_load(o, match):
    """Mosaic GPU's TMA load of a CTA pair's half, signalling the (leader's) mbarrier."""
    coords = [int(c.strip().lstrip("$")) for c in match.group("coords").split(",")]
    if len(coords) != int(match.group("dims")):
        raise EmulationUnsupported(f"a {match.group('dims')}d TMA load with "
                                   f"{len(coords)} coordinates")
    rank = match.group("rank")

    def run(m, pred, dst, desc, bar, *xs):
        cl = cluster_of(m)
        for i in m.lanes(pred):
            r = int(rank) if not rank.startswith("$") else _lane(xs[int(rank[1:]) - 4], i)
            target = (_lane(dst, i), cl.remote(m, _lane(bar, i), r))
            tma_load(m, _lane(desc, i), [_lane(xs[c - 4], i) for c in coords], [target])

    return run
