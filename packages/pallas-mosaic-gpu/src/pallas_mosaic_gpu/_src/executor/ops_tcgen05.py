"""Blackwell's tensor memory and 5th-generation tensor core ops: ``tcgen05.alloc``/
``dealloc``/``relinquish_alloc_permit``, ``tcgen05.mma`` (the inline PTX Mosaic GPU
emits for it), ``tcgen05.commit`` to an mbarrier, ``tcgen05.ld``/``st``, fences and waits.

Semantics from the PTX ISA ("Tensor Memory", "tcgen05.mma", "Instruction descriptor",
"Matrix fragments for tcgen05.ld/st"):

- TMEM is a block's 128 lanes x 512 columns of 32-bit cells; an address holds the lane
  in bits 16-31 and the column in bits 0-15. ``alloc`` (a whole warp) takes a power of
  two >= 32 of columns and writes the address of the first (lane 0) to SMEM; columns
  must be deallocated before the block exits; no allocation after a
  ``relinquish_alloc_permit``. Cells start as garbage (NaN for f32), as SMEM does;
- ``tcgen05.mma.cta_group::1`` (one thread): ``D = A @ B (+ D if enable-input-d)``, M x N
  x K with M, N from the instruction descriptor (D type bits 4-5, A/B types 7-9/10-12,
  negate A/B 13/14, transpose (MN-major) A/B 15/16, N >> 3 in 17-22, M >> 4 in 24-28) and
  K 32 bytes of the input type; A and B from SMEM descriptors, laid out as for wgmma
  (swizzle in bits 61-63: 2 = 128 B, 4 = 64 B, 6 = 32 B). With M = 128, row ``i`` of D
  is TMEM lane ``i``, column ``j`` the address's column plus ``j``;
- the tensor core runs the block's ``tcgen05`` ops in issue order, asynchronously:
  ``tcgen05.commit`` makes an mbarrier arrive once every earlier op has completed (with
  a multicast mask, the mbarrier at the same offset in each block it names). Here
  an MMA runs (reading SMEM and TMEM then) when a thread waits on the mbarrier of a
  later commit, or at the end of the block, so a kernel that reads TMEM or refills an
  operand's SMEM before waiting for the MMA sees stale data, as on the hardware;
- ``tcgen05.ld``/``st`` (whole warps): warp ``w`` reaches TMEM lanes ``32 (w % 4)`` to
  ``32 (w % 4) + 31`` (the address's lane taken within that slab). Lane ``l``'s register
  ``r`` holds (row, column) relative to the address: ``32x32b`` (l, r); ``16x64b``
  (l/4 + 8(l%2), (l/2)%2 + 2r); ``16x128b`` (l/4 + 8(r%2), l%4 + 4(r/2)); ``16x256b``
  (l/4 + 8((r/2)%2), r%2 + 2(l%4) + 8(r/4)). They complete when issued, so
  ``tcgen05.wait`` has nothing left to wait for.

CTA pairs' MMAs and partitioned loads (``cta_group::2``) are in ``ops_cta_pair``.
What is not implemented raises :class:`EmulationUnsupported` naming it: A in TMEM,
M other than 128 (256 for pairs), f16 accumulators,
sparse/scaled/weight-stationary MMAs, ``pack::16b``/``unpack::16b``, ``tcgen05.cp``/
``shift``.
"""

from __future__ import annotations

import re
import types

import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir

from pallas_mosaic_gpu._src.executor.cluster import cluster_of
from pallas_mosaic_gpu._src.executor.engine import asm, no_effect, op
from pallas_mosaic_gpu._src.executor.mbarrier import mbarrier_state
from pallas_mosaic_gpu._src.executor.smem_desc import WINDOW, decode, smem_operand
from pallas_mosaic_gpu._src.executor.tmem import Tmem, tmem_at, tmem_of
from pallas_mosaic_gpu._src.executor.types import EmulationError, EmulationUnsupported

WARP = 32
_KINDS = {  # kind -> {type code: dtype}
    "f16": {0: np.dtype(np.float16), 1: np.dtype(jnp.bfloat16)},
    "tf32": {2: np.dtype(np.float32)},
    "f8f6f4": {0: np.dtype(jnp.float8_e4m3fn), 1: np.dtype(jnp.float8_e5m2)},
    "i8": {0: np.dtype(np.uint8), 1: np.dtype(np.int8)},
}
_D_TYPES = {1: np.dtype(np.float32), 2: np.dtype(np.int32)}  # 0 (f16) not implemented


def _lane(x, i):
    x = np.asarray(x).reshape(len(np.asarray(x)), -1)
    return int(x[i if x.shape[0] > 1 else 0, 0])


def _pair(o) -> bool:
    """Whether the op is the ``cta_group::2`` form (a CTA pair's)."""
    g = o.attributes["group"] if "group" in o.attributes else None
    return g is not None and "cta_2" in str(g)


def _check_pair(m, what: str) -> None:
    """A ``cta_group::2`` op needs the block's peer (rank ^ 1) in its cluster."""
    if (m.cta_rank ^ 1) >= len(cluster_of(m).smem):
        raise EmulationError(f"{what}.cta_group::2 in block {m.cta_rank} of a cluster of "
                             f"{len(cluster_of(m).smem)}: it has no peer block")


def _warp_leaders(m) -> list[int]:
    """The first active lane of each warp that has one: warp-wide ops (TMEM allocation)
    happen once per warp, with that lane's operands."""
    lanes = m.lanes()
    warps = _linear_tid(m)[lanes] // WARP
    return [lanes[np.nonzero(warps == w)[0][0]] for w in np.unique(warps)]


def _linear_tid(m) -> np.ndarray:
    bx, by, _ = m.block_dim
    x, y, z = (np.broadcast_to(np.asarray(v).reshape(-1), (m.threads,)) for v in m.thread_id)
    return x + bx * (y + by * z)


@op("nvvm.tcgen05.alloc", "nvvm.tcgen05.alloc.shared")
def _alloc(o, cc):
    """With ``cta_group::2`` a warp of each block of the pair allocates the same columns
    of its own TMEM (blocks that allocate alike get the same columns here)."""
    pair = _pair(o)

    def run(m, ptr, ncols):
        if pair:
            _check_pair(m, "tcgen05.alloc")
        t = tmem_of(m)
        for i in _warp_leaders(m):  # one allocation per warp
            col = t.alloc(_lane(ncols, i))
            m.memory.scatter(np.asarray([_lane(ptr, i)]), np.asarray([col], np.uint32))

    return run


@op("nvvm.tcgen05.dealloc")
def _dealloc(o, cc):
    pair = _pair(o)

    def run(m, taddr, ncols):
        if pair:
            _check_pair(m, "tcgen05.dealloc")
        t = tmem_of(m)
        for i in _warp_leaders(m):
            t.dealloc(_lane(taddr, i) & 0xFFFFFFFF, _lane(ncols, i))

    return run


@op("nvvm.tcgen05.relinquish_alloc_permit")
def _relinquish(o, cc):
    def run(m):
        if m.lanes().size:
            tmem_of(m).relinquished = True

    return run


# Loads and stores complete when issued; MMAs are ordered by their commits.
op("nvvm.tcgen05.fence", "nvvm.tcgen05.wait")(no_effect)


@op("nvvm.tcgen05.commit")
def _commit(o, cc):
    """The mbarrier arrives once the issuing thread's earlier tensor core ops have
    completed; with a multicast mask, the mbarrier at the same offset in each block of
    the cluster the mask names."""
    pair = _pair(o)
    multicast = len(o.operands) == 2

    def run(m, bar, *mask):
        if pair:
            _check_pair(m, "tcgen05.commit")
        t = tmem_of(m)
        for i in m.lanes():
            a = _lane(bar, i)
            targets = (a,)
            if multicast:
                cl, bits = cluster_of(m), _lane(mask[0], i) & 0xFFFF
                targets = tuple(cl.remote(m, a, r) for r in range(len(cl.smem))
                                if bits >> r & 1)
            for x in targets:
                mbarrier_state(m, x)  # the barrier exists when the commit is issued
            t.queue.append(("commit", targets))

    return run


# -- tcgen05.mma ------------------------------------------------------------------------

_MMA = re.compile(
    r"\{\s*\.reg \.b32 a_desc_low, a_desc_high, b_desc_low, b_desc_high;\s*"
    r"\.reg \.b64 a_desc;\s*\.reg \.b64 b_desc;\s*"
    r"add\.s32 a_desc_low, \$1, (?P<alo>-?\d+);\s*add\.s32 b_desc_low, \$2, (?P<blo>-?\d+);\s*"
    r"mov\.b64 b_desc, \{b_desc_low, (?P<bhi>-?\d+)\};\s*"
    r"mov\.b64 a_desc, \{a_desc_low, (?P<ahi>-?\d+)\};\s*"
    r"tcgen05\.mma\.cta_group::(?P<group>[12])\.kind::(?P<kind>\w+) \[\$0\], a_desc, b_desc, "
    r"\$3, \$4;\s*\}",
    re.S)


def _desc(base: int, lo: int, hi: int) -> int:
    return ((base + lo) & 0xFFFFFFFF) | ((hi & 0xFFFFFFFF) << 32)


def _operand(m, desc: int, rows: int, k: int, dtype, k_major: bool, what: str):
    if (desc >> 61) & 1:
        raise EmulationUnsupported(f"tcgen05.mma with {what} in the 128-byte swizzle with "
                                   f"32-byte atomicity")
    if (desc >> 52) & 1:
        raise EmulationUnsupported(f"tcgen05.mma with {what} in absolute LBO mode")
    return smem_operand(m, desc, rows, k, dtype, k_major)  # bits 62-63 as for wgmma


def decode_idesc(idesc: int, kind: str):
    """The instruction descriptor's A, B and D types, N and M; K is 32 bytes of A."""
    if idesc & 0b1100:
        raise EmulationUnsupported("a sparse or saturating tcgen05.mma")
    d_code, a_code, b_code = (idesc >> 4) & 3, (idesc >> 7) & 7, (idesc >> 10) & 7
    types = _KINDS.get(kind)
    if types is None or a_code not in types or b_code not in types:
        raise EmulationUnsupported(f"tcgen05.mma kind::{kind} with A/B type codes "
                                   f"{a_code}/{b_code}")
    a_t, b_t = types[a_code], types[b_code]
    if d_code not in _D_TYPES:
        raise EmulationUnsupported(f"tcgen05.mma with an accumulator of type code {d_code} "
                                   f"(f16 accumulators)")
    n, mm = ((idesc >> 17) & 0x3F) << 3, ((idesc >> 24) & 0x1F) << 4
    return a_t, b_t, _D_TYPES[d_code], n, mm, 32 // a_t.itemsize


def operands(m, a_desc: int, b_desc: int, idesc: int, rows: int, cols: int, k: int,
             a_t, b_t):
    """A (``rows x k``) and B (``cols x k``) of an MMA, from SMEM of ``m``'s block."""
    a = _operand(m, a_desc, rows, k, a_t, not (idesc >> 15) & 1, "A")
    b = _operand(m, b_desc, cols, k, b_t, not (idesc >> 16) & 1, "B")
    return a, b


def accumulate_into(t: Tmem, col: int, a, b, d_t, idesc: int, kind: str,
                    accumulate: bool) -> None:
    """``D = A @ B^T (+ D)`` into TMEM lanes ``0..rows`` from column ``col``."""
    if d_t == np.int32:
        prod = a.astype(np.int64) @ b.astype(np.int64).T
    else:
        af, bf = a.astype(np.float32), b.astype(np.float32)
        if kind == "tf32":  # tensor cores read the upper 19 bits of an f32
            af, bf = ((v.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
                      for v in (af, bf))
        prod = af @ bf.T
    if (idesc >> 13) & 1:
        prod = -prod
    if (idesc >> 14) & 1:
        prod = -prod
    rows, n = prod.shape
    cells = t.cells[:rows, col:col + n]
    if accumulate:
        prod = prod + cells.view(d_t)
    t.cells[:rows, col:col + n] = np.asarray(prod).astype(d_t).view(np.uint32)


def mma(m, d_addr: int, a_desc: int, b_desc: int, idesc: int, accumulate: bool,
        kind: str) -> None:
    """Runs one ``tcgen05.mma.cta_group::1`` with SMEM operands (see the module doc)."""
    a_t, b_t, d_t, n, mm, k = decode_idesc(idesc, kind)
    if mm != 128:
        raise EmulationUnsupported(f"tcgen05.mma with M = {mm} (only M = 128 is executed)")
    lane, col = (d_addr >> 16) & 0xFFFF, d_addr & 0xFFFF
    if lane:
        raise EmulationError(f"tcgen05.mma with M = 128 into TMEM lane {lane} (not 0)")
    t = tmem_of(m)
    t.check(col, n, "tcgen05.mma's accumulator")
    a, b = operands(m, a_desc, b_desc, idesc, mm, n, k, a_t, b_t)
    accumulate_into(t, col, a, b, d_t, idesc, kind, accumulate)


# -- tcgen05.cp (SMEM -> TMEM) -----------------------------------------------------------

_CP_SHAPE = re.compile(r"shape_(\d+)x(\d+)b")


def smem_rows(m, desc: int, rows: int, row_bytes: int) -> np.ndarray:
    """The ``rows x row_bytes`` bytes a K-major matrix descriptor points at: 8-row core
    matrices, SBO apart down the rows; in a swizzle mode, rows of one atom ``swizzle``
    bytes apart and the 16-byte chunks XOR-swizzled by address; unswizzled, 16-byte rows
    and LBO between core matrices along a row."""
    start, lbo, sbo, base, swz = decode(desc)
    if base or (desc >> 61) & 1 or (desc >> 52) & 1:
        raise EmulationUnsupported(f"tcgen05.cp from a descriptor with a base offset, "
                                   f"32-byte atomicity or absolute LBO ({desc:#x})")
    r = np.arange(rows)[:, None]
    c = np.arange(row_bytes)[None, :]
    pitch = swz or 16
    off = (r % 8) * pitch + (r // 8) * sbo + (c // pitch) * lbo + c % pitch
    addr = (m.smem & ~WINDOW) + start + off
    if swz:
        addr = addr ^ (((addr >> 7) & (swz // 16 - 1)) << 4)
    if addr.min() < m.smem or addr.max() + 1 > m.smem + m.smem_size:
        raise EmulationError(f"tcgen05.cp's source (descriptor {desc:#x}) reaches outside "
                             f"the block's {m.smem_size} bytes of SMEM")
    return m.memory.gather(addr, np.uint8)


def copy_to_tmem(m, taddr: int, desc: int, rows: int, row_bytes: int) -> None:
    """Runs one ``tcgen05.cp.cta_group::1`` of ``rows`` lanes of ``row_bytes`` each."""
    lane, col = (taddr >> 16) & 0xFFFF, taddr & 0xFFFF
    if lane:
        raise EmulationError(f"tcgen05.cp of {rows} lanes into TMEM lane {lane} (not 0)")
    t = tmem_of(m)
    ncols = row_bytes // 4
    t.check(col, ncols, "tcgen05.cp's destination")
    data = np.ascontiguousarray(smem_rows(m, desc, rows, row_bytes))
    t.cells[:rows, col:col + ncols] = data.view(np.uint32).reshape(rows, ncols)


@op("nvvm.tcgen05.cp")
def _tcgen05_cp(o, cc):
    """An asynchronous copy, ordered (as MMAs) by the commits that follow it."""
    shape = _CP_SHAPE.search(str(o.attributes["shape"]))
    # Warp multicast and decompression of the source are not modelled.
    extra = [a for a in ("multicast", "srcFormat") if a in o.attributes
             and not str(o.attributes[a]).endswith("<none>")]
    if shape is None or int(shape.group(1)) != 128 or _pair(o) or extra:
        raise EmulationUnsupported(
            f"the Mosaic GPU executor runs tcgen05.cp.cta_group::1 of shapes 128x256b and "
            f"128x128b; not {' '.join(str(o).split())[:200]}")
    rows, row_bytes = 128, int(shape.group(2)) // 8

    def run(m, taddr, desc):
        t = tmem_of(m)
        for i in m.lanes():
            args = (_lane(taddr, i) & 0xFFFFFFFF, _lane(desc, i) & 0xFFFFFFFFFFFFFFFF)
            t.queue.append(("op", lambda args=args: copy_to_tmem(m, *args, rows, row_bytes)))

    return run


# -- tcgen05.mma.cta_group::2 (a CTA pair) ---------------------------------------------

PAIR_ROWS = 128  # rows of A and D per block of the pair (M = 256)


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
    if mm != 2 * PAIR_ROWS:
        raise EmulationUnsupported(f"tcgen05.mma.cta_group::2 with M = {mm} (only M = 256, "
                                   f"128 rows per block, is executed)")
    lane, col = (d_addr >> 16) & 0xFFFF, d_addr & 0xFFFF
    if lane:
        raise EmulationError(f"tcgen05.mma.cta_group::2 into TMEM lane {lane} (not 0)")
    pair = pair_blocks(m, "tcgen05.mma.cta_group::2")
    halves = [operands(_block_view(m, r), a_desc, b_desc, idesc, PAIR_ROWS, n // 2, k, a_t, b_t)
              for r in pair]
    b = np.concatenate([bh for _, bh in halves], 0)  # [B0 B1]: N x K
    for r, (a, _) in zip(pair, halves):
        t = tmem_at(m, cluster_of(m).smem[r])
        t.check(col, n, f"tcgen05.mma.cta_group::2's accumulator in block {r}")
        accumulate_into(t, col, a, b, d_t, idesc, kind, accumulate)


def _mma_builder(o, match):
    g = match.groupdict()
    alo, blo, ahi, bhi = (int(g[x]) for x in ("alo", "blo", "ahi", "bhi"))
    kind = g["kind"]
    if g["group"] == "2":
        run_mma = pair_mma
    else:
        run_mma = mma

    def run(m, d, a, b, idesc, acc):
        t = tmem_of(m)
        for i in m.lanes():
            args = (_lane(d, i) & 0xFFFFFFFF, _desc(_lane(a, i), alo, ahi),
                    _desc(_lane(b, i), blo, bhi), _lane(idesc, i) & 0xFFFFFFFF,
                    bool(_lane(acc, i)))
            t.queue.append(("op", lambda args=args: run_mma(m, *args, kind)))

    return run


@asm(r".*tcgen05\.mma.*")
def _tcgen05_mma(o, match):
    text = match.group(0)
    full = _MMA.fullmatch(text)
    if full is None:
        what = re.search(r"tcgen05\.mma\S*", text).group(0)
        raise EmulationUnsupported(
            f"the Mosaic GPU executor runs tcgen05.mma.cta_group::1/2 with A and B in SMEM; "
            f"not {what} in: {' '.join(text.split())[:300]}")
    return _mma_builder(o, full)


# -- tcgen05.ld / tcgen05.st ------------------------------------------------------------

_REGS_PER_REP = {"32x32b": 1, "16x64b": 1, "16x128b": 2, "16x256b": 4}


def _image(shape: str, nregs: int):
    """(row, column) of each register of each lane, shape (32, nregs)."""
    lane = np.arange(WARP)[:, None]
    r = np.arange(nregs)[None, :]
    if shape == "32x32b":
        return np.broadcast_to(lane, (WARP, nregs)), np.broadcast_to(r, (WARP, nregs))
    if shape == "16x64b":
        return (np.broadcast_to(lane // 4 + 8 * (lane % 2), (WARP, nregs)),
                lane // 2 % 2 + 2 * r)
    if shape == "16x128b":
        return lane // 4 + 8 * (r % 2), lane % 4 + 4 * (r // 2)
    return lane // 4 + 8 * (r // 2 % 2), r % 2 + 2 * (lane % 4) + 8 * (r // 4)


def _cells(m, taddr, shape: str, nregs: int, what: str):
    """The TMEM (lane, column) of each register of each thread, shape (threads, nregs)."""
    if m.mask is not None:
        tids = _linear_tid(m)
        for w in np.unique(tids // WARP):
            in_warp = m.mask[tids // WARP == w]
            if in_warp.any() and not in_warp.all():
                raise EmulationUnsupported(f"{what} by part of a warp (divergent lanes)")
    tid = _linear_tid(m)
    addr = np.broadcast_to(np.asarray(taddr, np.int64).reshape(-1), (m.threads,)) & 0xFFFFFFFF
    lane_field, col = (addr >> 16) & 0xFFFF, addr & 0xFFFF
    rows, cols = _image(shape, nregs)
    lane = tid % WARP
    slab = 32 * (tid // WARP % 4)
    row = slab[:, None] + (lane_field % 32)[:, None] + rows[lane]
    column = col[:, None] + cols[lane]
    if (lane_field % 32 + rows.max() >= 32).any():
        raise EmulationError(f"{what} at TMEM lane {int(lane_field.max())} reaches past "
                             f"its warp's 32 lanes")
    t = tmem_of(m)
    active = m.lanes()
    if active.size:
        lo, hi = int(column[active].min()), int(column[active].max())
        t.check(lo, hi - lo + 1, what)
    return t, row, column, active


_LDST = r"tcgen05\.{op}\.sync\.aligned\.(?P<shape>\w+)\.x(?P<num>\d+)(?P<pack>\.\w+::16b)?\.b32 "


def _ldst_form(g: dict, op: str, packed: str) -> tuple[str, int, str]:
    """(shape, registers per thread, name) of a matched ``tcgen05.ld``/``st``."""
    if g["pack"]:
        raise EmulationUnsupported(f"tcgen05.{op}{g['pack']} ({packed})")
    shape, num = g["shape"], int(g["num"])
    if shape not in _REGS_PER_REP:
        raise EmulationUnsupported(f"tcgen05.{op} of shape {shape}")
    return shape, _REGS_PER_REP[shape] * num, f"tcgen05.{op}.{shape}.x{num}"


@asm(_LDST.format(op="ld") + r"(?P<regs>\{[^}]*\}|\$\d+), \[\$(?P<addr>\d+)\];")
def _tcgen05_ld(o, match):
    g = match.groupdict()
    shape, nregs, what = _ldst_form(g, "ld", "16-bit halves packed")

    def run(m, taddr):
        t, row, column, active = _cells(m, taddr, shape, nregs, what)
        vals = t.cells[row, column].view(np.int32)
        if m.mask is not None:
            vals = np.where(m.mask[:, None], vals, 0)
        if nregs == 1:
            return (vals[:, 0],)
        return (tuple(vals[:, r] for r in range(nregs)),)

    return run


@asm(_LDST.format(op="st") + r"\[\$(?P<addr>\d+)\], (?P<regs>\{[^}]*\}|\$\d+);")
def _tcgen05_st(o, match):
    g = match.groupdict()
    shape, nregs, what = _ldst_form(g, "st", "16-bit halves unpacked")
    addr_i = int(g["addr"])

    def run(m, *xs):
        taddr, regs = xs[addr_i], [x for j, x in enumerate(xs) if j != addr_i]
        t, row, column, active = _cells(m, taddr, shape, nregs, what)
        vals = np.stack([np.broadcast_to(np.asarray(v).reshape(len(np.asarray(v)), -1)[:, 0],
                                         (m.threads,)) for v in regs], 1)
        # A register's 32 bits as they are (Mosaic GPU passes f32 values for "r").
        vals = vals.view(np.uint32) if vals.dtype.itemsize == 4 else \
            vals.astype(np.int32).view(np.uint32)
        t.cells[row[active], column[active]] = vals[active]

    return run


assert ir  # (attributes are read through the op)
