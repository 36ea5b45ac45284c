"""The kernel's TMEM allocation: one ``tcgen05.alloc`` for all its ``plgpu.TMEM`` buffers.

Warp 0 allocates the columns of every TMEM buffer of the kernel (scratch and
``run_scoped``) at once when the kernel body starts and frees them when it ends, with
the address ``tcgen05.alloc`` wrote to SMEM read once and kept in a register until the
``tcgen05.dealloc``, as upstream's warpgroup lowering does through Mosaic GPU's dialect.
A ``mgpu.TMEM`` entry of the SMEM tree would instead have Mosaic GPU read the address
from SMEM again to free it (one ``ld.shared`` more per allocation), and allocate each
buffer on its own. Buffers sit in the allocation at offsets aligned to their own
(power-of-two) column count, largest first, so no padding is needed between them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import tcgen05
from jaxlib.mlir.dialects import arith, gpu, memref, nvvm

from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.context import KernelError


class TmemAddress(jax.ShapeDtypeStruct):
    """The SMEM word ``tcgen05.alloc`` writes the allocation's address to (4 bytes at 4:
    see ``smem_tree.size_and_alignment``)."""

    tmem_address = True

    def __init__(self):
        super().__init__((1,), jnp.int32)


@dataclasses.dataclass(frozen=True)
class TmemPlan:
    """Where each TMEM buffer (by key) starts in the one allocation of ``cols`` columns."""

    cols: int
    collective: bool
    offsets: dict  # key -> first column
    entries: dict  # key -> the buffer's mgpu.TMEM entry (shape, dtype, packing)


def layout(entry) -> tcgen05.TMEMLayout:
    """The TMEM layout Mosaic GPU gives a buffer of this shape (as for its own
    ``mgpu.TMEM`` entries): 128 rows one lane per row, 64 rows split over lane halves."""
    rows, cols = entry.shape
    packing = entry.packing or 1
    if rows == tcgen05.TMEM_ROWS:
        return tcgen05.tmem_default_layout(packing)
    if entry.collective:
        return tcgen05.tmem_m64_collective_layout(cols, packing)
    return tcgen05.tmem_half_lane_layout(cols, packing)


def columns(entry) -> int:
    """The columns a buffer takes: its layout's, rounded up to a power of two (>= 32)."""
    bits = jnp.dtype(entry.dtype).itemsize * 8
    return tcgen05.tmem_alloc_exact_ncols(layout(entry).cols_in_shape(entry.shape, bits),
                                          exact=False)


def plan(entries: dict, kernel: str) -> TmemPlan | None:
    """The allocation of the ``mgpu.TMEM`` ``entries`` (key -> entry); None for none."""
    if not entries:
        return None
    kinds = {bool(e.collective) for e in entries.values()}
    if len(kinds) > 1:
        raise KernelError(
            f"kernel {kernel} mixes collective and non-collective plgpu.TMEM buffers; a "
            "block's TMEM is allocated once, for a CTA pair (collective=True) or not")
    sizes = {k: columns(e) for k, e in entries.items()}
    offsets, used = {}, 0
    for key in sorted(entries, key=lambda k: -sizes[k]):  # stable: otherwise as given
        offsets[key] = used  # a multiple of sizes[key]: all sizes are powers of two
        used += sizes[key]
    if used > tcgen05.TMEM_MAX_COLS:
        listed = ", ".join(f"{tuple(e.shape)} {jnp.dtype(e.dtype).name}: {sizes[k]}"
                           for k, e in entries.items())
        raise KernelError(
            f"kernel {kernel}'s plgpu.TMEM buffers need {used} TMEM columns in all "
            f"({listed}); a block has {tcgen05.TMEM_MAX_COLS}")
    cols = tcgen05.tmem_alloc_exact_ncols(used, exact=False)
    return TmemPlan(cols, kinds.pop(), offsets, dict(entries))


def _warp0():
    return arith.cmpi(arith.CmpIPredicate.eq, mgpu.utils.warp_idx(sync=False),
                      V.const(0, V.i32()))


def allocate(p: TmemPlan, addr_ref) -> dict:
    """Emits the allocation (warp 0 allocates, then gives up its permit to allocate more,
    so the other block of an SM may allocate too; a block barrier publishes the address)
    and returns each buffer's ``TMEMRef`` by key. Call :func:`free` with the same refs at
    the end of the body."""
    with mgpu.utils.when(_warp0()):
        tcgen05.tmem_alloc(addr_ref, p.cols, collective=p.collective, exact=False)
        tcgen05.tmem_relinquish_alloc_permit(p.collective)
    gpu.barrier()
    base = memref.load(addr_ref, [V.const(0, V.index())])
    refs: dict[Any, Any] = {"": base}
    for key, entry in p.entries.items():
        addr = base if not p.offsets[key] else arith.addi(
            base, V.const(p.offsets[key], V.i32()))
        refs[key] = tcgen05.TMEMRef(addr, tuple(entry.shape),
                                    mgpu.utils.dtype_to_ir_type(entry.dtype), layout(entry))
    return refs


def free(p: TmemPlan, refs: dict) -> None:
    """Frees the allocation once every thread is done with it, with the address read at
    the start: after a block barrier, or for a CTA pair's (whose MMAs write both blocks'
    TMEM) a cluster barrier, which every thread of both blocks reaches (release/acquire:
    it orders memory as the block barrier would, so that one is not needed too)."""
    if p.collective:
        nvvm.cluster_arrive(aligned=True)
        nvvm.cluster_wait(aligned=True)
    else:
        gpu.barrier()
    with mgpu.utils.when(_warp0()):
        tcgen05.tmem_dealloc(refs[""], p.cols, collective=p.collective, exact=False)
