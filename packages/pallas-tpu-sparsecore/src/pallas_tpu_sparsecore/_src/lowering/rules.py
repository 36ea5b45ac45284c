"""SparseCore lowering rules of generic primitives: ref loads/stores through
``tpu.vector_load``/``tpu.vector_store`` (with the lane check), and indexed DMAs.

A vector subcore register holds ``(lanes,)`` 32-bit elements (``supported_shapes``);
loading or storing another shape is a clear lowering error naming the shape and the
valid ones. ``pltpu.async_copy(x_hbm.at[idx], rows_vmem, sem)`` (an int32 index vector
on the first dimension of the HBM side) lowers to ``tpu.enqueue_indirect_dma`` and its
wait to ``tpu.wait_indirect_dma``; other DMAs lower as on a TensorCore.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import memref, vector
from jaxlib.mosaic.python import tpu

from pallas_tpu import MemorySpace
from pallas_tpu import extend as tpx
from pallas_tpu_sparsecore._src import jax_compat as jc
from pallas_tpu_sparsecore._src.info import check_vector_shape
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
    full = tpx.types.value_type(w.full_shape, aval.dtype)
    v = tpu.vector_load(full, ref.memref, tpx.window_indices(w), strides=[])
    if tuple(w.full_shape) != tuple(aval.shape):
        v = vector.shape_cast(tpx.types.aval_type(aval), v)
    return v


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
    from pallas_tpu_sparsecore._src.indices import Indices

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


@rule(tpx.dma_start_p)
def _dma_start(lctx, eqn, *invals):
    p = eqn.params
    end = tpx.spec_end(p["refs"])
    (src, sf, st), (dst, df, dt), (sem, mf, mt), src_sem = _views(p["refs"], invals[:end])
    gather = _split_indexed(src, sf, st)
    scatter = _split_indexed(dst, df, dt)
    if gather is None and scatter is None:
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
