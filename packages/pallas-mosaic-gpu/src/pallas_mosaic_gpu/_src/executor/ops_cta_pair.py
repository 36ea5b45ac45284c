"""CTA pairs (``cta_group::2``): the two blocks of ranks ``2i`` and ``2i + 1`` of a
cluster sharing one tensor core operation. Semantics from the PTX ISA ("tcgen05.mma"
and "cp.async.bulk.tensor" with ``.cta_group::2``, "tcgen05.commit" with a multicast
mask; TMEM allocation across the pair and the pair MMA (``pair_mma``) are in
``ops_tcgen05``, this module has the partitioned TMA load):

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

import numpy as np

from pallas_mosaic_gpu._src.executor.cluster import cluster_of
from pallas_mosaic_gpu._src.executor.engine import asm
from pallas_mosaic_gpu._src.executor.tma import tma_load
from pallas_mosaic_gpu._src.executor.types import EmulationUnsupported


def _lane(x, i):
    x = np.asarray(x).reshape(len(np.asarray(x)), -1)
    return int(x[i if x.shape[0] > 1 else 0, 0])


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
