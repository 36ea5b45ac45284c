"""SparseCore lowering rules of generic primitives: ref loads/stores through
``tpu.vector_load``/``tpu.vector_store`` (with the lane check), and indexed DMAs.

A vector subcore register holds ``(lanes,)`` 32-bit elements (``supported_shapes``);
loading or storing another shape is a clear lowering error naming the shape and the
valid ones. ``pltpu.async_copy(x_hbm.at[idx], rows_vmem, sem)`` (an int32 index vector
on the first dimension of the HBM side) lowers to ``tpu.enqueue_indirect_dma`` and its
wait to ``tpu.wait_indirect_dma``; other DMAs lower as on a TensorCore. Indexed DMAs that
libtpu's SparseCore compiler rejects are refused here (``MosaicUnsupported``, see
:func:`_check_indirect`).
"""

from __future__ import annotations

import contextvars
import math

import jax
import jax.numpy as jnp
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, memref, vector
from jaxlib.mosaic.python import tpu

from pallas_tpu import MemorySpace
from pallas_tpu import extend as tpx
from pallas_tpu_sparsecore._src import jax_compat as jc
from pallas_tpu_sparsecore._src.indices import Indices
from pallas_tpu_sparsecore._src.info import check_vector_shape, current_chip
from pallas_tpu_sparsecore._src.lowering.table import rule


def _space(ref) -> MemorySpace:
    return tpx.types.space_of(ref.space)


def _check_local(what: str, ref) -> None:
    space = _space(ref)
    if space in (MemorySpace.HBM, MemorySpace.ANY, MemorySpace.VMEM_SHARED):
        raise NotImplementedError(
            f"{what} a ref in {space.value} on SparseCore: copy it to VMEM (or SMEM for "
            f"scalars) first, e.g. with pltpu.sync_copy")


def _load(w, aval):
    ref = w.ref
    if _space(ref) is MemorySpace.SMEM or not w.shape:
        return tpx.load_window(w, aval.dtype)
    check_vector_shape("loading a vector from a ref on a SparseCore vector subcore: the "
                       "vector", aval.shape, aval.dtype)
    squeezed = _squeezed(w, aval)
    if squeezed is not None:
        return tpu.vector_load(tpx.types.aval_type(aval), squeezed,
                               _zeros(len(aval.shape)), strides=[])
    full = tpx.types.value_type(w.full_shape, aval.dtype)
    v = tpu.vector_load(full, ref.memref, tpx.window_indices(w), strides=[])
    if tuple(w.full_shape) != tuple(aval.shape):
        v = vector.shape_cast(tpx.types.aval_type(aval), v)
    return v


def _zeros(n: int) -> list:
    return [arith.ConstantOp(ir.IndexType.get(), 0).result for _ in range(n)]


def _squeezed(w, aval):
    """The window's memref with its integer-indexed dims dropped (``ref[r]`` of a 2-D
    ref), so that the access is one ``(lanes,)`` vector: a ``(1, lanes)`` vector is not
    a vreg type of a vector subcore (libtpu: 'Result type is not a valid vmask or vreg
    type'). None when no dim is dropped or the window is strided."""
    if tuple(w.full_shape) == tuple(aval.shape) or any(s != 1 for s in w.strides):
        return None
    return tpx.window_memref(w)


def _store(w, value, aval):
    ref = w.ref
    if _space(ref) is MemorySpace.SMEM or not w.shape:
        if _space(ref) is MemorySpace.SMEM:
            memref.store(value, ref.memref, tpx.window_indices(w))
        else:
            tpx.store_window(w, value, aval.dtype)
        return
    check_vector_shape("storing a vector to a ref on a SparseCore vector subcore: the "
                       "vector", aval.shape, aval.dtype)
    squeezed = _squeezed(w, aval)
    if squeezed is not None:
        tpu.vector_store(value, squeezed, _zeros(len(aval.shape)), strides=[])
        return
    if tuple(w.full_shape) != tuple(aval.shape):
        value = vector.shape_cast(tpx.types.value_type(w.full_shape, aval.dtype), value)
    tpu.vector_store(value, ref.memref, tpx.window_indices(w), strides=[])


@rule(jc.get_p)
def _get(lctx, eqn, ref, *idx):
    _check_local("loading from", ref)
    w = tpx.apply_transforms(ref, idx, eqn.params["tree"])
    return _load(w, tpx.aval_out(eqn))


@rule(jc.swap_p)
def _swap(lctx, eqn, ref, val, *idx):
    _check_local("storing to", ref)
    w = tpx.apply_transforms(ref, idx, eqn.params["tree"])
    aval = tpx.aval_in(eqn, 1)
    v = tpx.materialize(val, aval)
    old = _load(w, aval) if eqn.outvars and lctx.is_used(eqn.outvars[0]) else None
    _store(w, v, aval)
    return old if old is not None else v


# -- indexed DMAs -------------------------------------------------------------------------


def _offsets(idx):
    """(offsets, ignored value or None) of an indexed DMA's index: a vector, a ref, a
    ref view or ``plsc.Indices`` of one of those; None if ``idx`` is not an index array."""
    ignored = None
    if isinstance(idx, Indices):
        idx, ignored = idx.values, idx.ignored_value
    if isinstance(idx, tpx.RefIndex):
        flat, tree = jax.tree_util.tree_flatten(list(idx.transforms))
        return tpx.window_memref(tpx.apply_transforms(idx.ref, flat, tree)), ignored
    if isinstance(idx, tpx.RefVal):
        return idx.memref, ignored
    if isinstance(idx, ir.Value) and isinstance(idx.type, ir.VectorType):
        return idx, ignored
    return None


def _split_indexed(ref, flat, tree):
    """(memref of the view with the indexed dim kept whole, offsets, ignored value) when
    the view indexes its first dim with an index array or ref, else None."""
    transforms = jax.tree_util.tree_unflatten(tree, flat)
    if not transforms or not isinstance(transforms[-1], jc.NDIndexer):
        return None
    last = transforms[-1]
    first = None if isinstance(last.indices[0], jc.Slice) else _offsets(last.indices[0])
    if any(not isinstance(i, jc.Slice) and _offsets(i) is not None
           for i in last.indices[1:]):
        raise NotImplementedError(
            "backend 'mosaic_sparsecore': an indexed DMA indexes the first dimension of "
            "the ref with an index vector or ref (x_hbm.at[idx], x_hbm.at[idx, pl.ds(...)])")
    if first is None:
        return None
    before = tpx.apply_transforms(ref, *jax.tree_util.tree_flatten(transforms[:-1]))
    rows = before.shape[0]
    whole = jc.NDIndexer((jc.Slice(0, rows, 1), *last.indices[1:]),
                         tuple(before.shape), ())
    wflat, wtree = jax.tree_util.tree_flatten([*transforms[:-1], whole])
    return (tpx.window_memref(tpx.apply_transforms(ref, wflat, wtree)), *first)


def _views(spec, invals):
    out = []
    for entry in tpx.unflatten_refs(spec, invals):
        out.append(None if entry is None else entry)
    return out


#: Whether the kernel being lowered keeps TensorCore (compact) tiling for its memrefs
#: (``use_tc_tiling_on_sc`` not False, upstream's default) rather than SparseCore tiling.
TC_TILING = contextvars.ContextVar("pallas_tpu_sparsecore_tc_tiling", default=True)

# The row size (elements) an indexed DMA moves must be a multiple of this under
# TensorCore tiling (the minor tile of a compact 32-bit memref).
_TC_TILE_LANES = 128


def _check_indirect(src_mem, dst_mem, *, gather: bool, add: bool) -> None:
    """Refuses indexed DMAs that libtpu's SparseCore compiler rejects (measured with
    ``pallas_tpu.compile`` for v5p, v6e and 7x): a scatter-add into HBM, and under
    TensorCore tiling rows that are not 32-bit or not a multiple of 128 elements."""
    side = ir.MemRefType(src_mem.type if gather else dst_mem.type)
    shape, dtype = tuple(side.shape), side.element_type
    what = (f"an indexed DMA ({'gather from' if gather else 'scatter into'} a "
            f"{dtype}{list(shape)} ref{', add=True' if add else ''}) on TPU {current_chip()}")
    space = str(side.memory_space) if side.memory_space is not None else ""
    if add and not gather and ("hbm" in space or "any" in space or not space):
        raise tpx.MosaicUnsupported(
            f"{what}: the SparseCore compiler cannot scatter-add into HBM (libtpu: "
            f"'IndirectStreamAddStartOp doesn't support transfer from TileSpmem to HBM'); "
            f"valid: scatter-add into a pltpu.VMEM_SHARED scratch ref (then copy it to HBM), "
            f"or add=True on a gather into VMEM")
    if not TC_TILING.get():
        return
    row = math.prod(shape[1:])
    width = getattr(dtype, "width", 32)
    if width != 32 or row % _TC_TILE_LANES:
        raise tpx.MosaicUnsupported(
            f"{what}: under TensorCore tiling (use_tc_tiling_on_sc not False, the default) "
            f"the SparseCore compiler moves rows of 32-bit elements in multiples of "
            f"{_TC_TILE_LANES} (this row: {row} elements of {width} bits); valid: "
            f"pltpu.CompilerParams(use_tc_tiling_on_sc=False) (SparseCore tiling), or rows "
            f"of a multiple of {_TC_TILE_LANES} 32-bit elements")


@rule(tpx.dma_start_p)
def _dma_start(lctx, eqn, *invals):
    p = eqn.params
    end = tpx.spec_end(p["refs"])
    (src, sf, st), (dst, df, dt), (sem, mf, mt), src_sem = _views(p["refs"], invals[:end])
    gather = _split_indexed(src, sf, st)
    scatter = _split_indexed(dst, df, dt)
    if gather is None and scatter is None:
        if p["add"]:
            what = ir.MemRefType(tpx.window_memref(tpx.apply_transforms(dst, df, dt)).type)
            raise tpx.MosaicUnsupported(
                f"a DMA with add=True into a {what.element_type}{list(what.shape)} ref that "
                f"is not indexed, on TPU {current_chip()}: the SparseCore adds only through "
                f"indexed DMAs; valid: index the destination's first dimension "
                f"(dst.at[idx], idx an int32 ref holding 0..n-1 or the rows to add into)")
        return tpx.RULES[tpx.dma_start_p](lctx, eqn, *invals)
    if gather is not None and scatter is not None:
        raise NotImplementedError("an indexed DMA indexes one side only (x_hbm.at[idx])")
    if invals[end:] or src_sem is not None:
        raise NotImplementedError("indexed DMAs to or from another device")
    sem_ref = tpx.window_memref(tpx.apply_transforms(sem, mf, mt))
    if gather is not None:
        src_mem, offsets, ignored = gather
        dst_mem = tpx.window_memref(tpx.apply_transforms(dst, df, dt))
    else:
        dst_mem, offsets, ignored = scatter
        src_mem = tpx.window_memref(tpx.apply_transforms(src, sf, st))
    _check_indirect(src_mem, dst_mem, gather=gather is not None, add=bool(p["add"]))
    filt = None if ignored is None else tpx.const((), jnp.int32, int(ignored))
    tpu.enqueue_indirect_dma(src_mem, dst_mem, offsets, sem_ref, offset_filter=filt,
                             add=bool(p["add"]))
    return []


@rule(tpx.dma_wait_p)
def _dma_wait(lctx, eqn, *invals):
    p = eqn.params
    end = tpx.spec_end(p["refs"])
    (sem, mf, mt), (src, sf, st), (dst, df, dt) = _views(p["refs"], invals[:end])
    gather = _split_indexed(src, sf, st)
    scatter = _split_indexed(dst, df, dt)
    if gather is None and scatter is None:
        return tpx.RULES[tpx.dma_wait_p](lctx, eqn, *invals)
    sem_ref = tpx.window_memref(tpx.apply_transforms(sem, mf, mt))
    src_mem = gather[0] if gather else tpx.window_memref(tpx.apply_transforms(src, sf, st))
    dst_mem = scatter[0] if scatter else tpx.window_memref(tpx.apply_transforms(dst, df, dt))
    tpu.wait_indirect_dma(sem_ref, src_mem, dst_mem)
    return []
