"""Ref views and whole-view reads and writes: ``ref.at[...]`` transforms as a memref view
(static and dynamic ``pl.ds`` windows, strided ones, integer indices, ``ref.reshape``),
and reading or writing one as a scalar, a small array every thread holds, or a
warpgroup array (bools are stored as int8). Helpers of the ref rules
(:mod:`rules_refs`) and of every rule that goes through SMEM.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, memref, scf

from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.lowering import elements, small, threads
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.context import Lit, RefVal


def index_operand(x) -> object:
    """A static int or an ``index``-typed ir.Value for an indexer entry (a literal, an
    int, a one-element small array or a scalar ir.Value); array indices are refused."""
    if isinstance(x, Lit):
        return int(np.asarray(x.val))
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, mgpu.FragmentedArray):
        raise NotImplementedError("gather-style (array) ref indexing")
    if hasattr(x, "values") and not isinstance(x, ir.Value):
        x = V.scalar(x, None)
    if isinstance(x.type, ir.IndexType):
        return x
    return arith.index_cast(V.index(), x)


def view(ref: RefVal, flat, tree):
    """(memref view, shape seen by the kernel) for ``ref.at[...]`` transforms."""
    transforms = jax.tree_util.tree_unflatten(tree, flat)
    m = ref.memref
    for t in transforms:
        if isinstance(t, jc.ReshapeTransform):  # ref.reshape(...) of a contiguous view
            m = mgpu.memref_reshape(m, tuple(t.shape))
            continue
        if not isinstance(t, jc.NDIndexer):
            raise NotImplementedError(
                f"ref transform {type(t).__name__} (bitcast/reshape/transpose of refs)")
        if tuple(getattr(t, "int_indexer_shape", ())):
            raise NotImplementedError("gather-style (array) ref indexing")
        base, dims = [], []
        for idx in t.indices:
            if isinstance(idx, jc.Slice):
                size, step = int(idx.size), int(idx.stride)
                extent = (size - 1) * step + 1 if size else 0
                base.append(mgpu.ds(index_operand(idx.start), extent))
                dims.append((size, step))
            else:
                base.append(index_operand(idx))
        m = elements.window(mgpu.memref_slice(m, tuple(base)), dims)
    return m


def stepped(flat, tree) -> bool:
    """Whether ``ref.at[...]`` transforms take every n-th element (``pl.ds(.., stride)``)
    along some dim: such a view is read and written element by element (elements.py)."""
    return any(isinstance(i, jc.Slice) and int(i.stride) != 1
               for t in jax.tree_util.tree_unflatten(tree, flat)
               if isinstance(t, jc.NDIndexer) for i in t.indices)


def load_view(m, dtype, shape, elementwise: bool = False):
    """Reads a memref view: a scalar for rank 0, else a warpgroup array (bools are
    stored as int8 and read as ``!= 0``); ``elementwise`` for a strided view."""
    is_bool = V.kind(dtype) == "b"

    def scalar_load(idx):
        v = memref.load(m, [V.const(i, V.index()) for i in idx])
        return arith.cmpi(arith.CmpIPredicate.ne, v, V.const_like(0, v)) if is_bool else v

    if not shape:
        return scalar_load([])
    if small.is_small(shape):
        small.check_small(shape)
        vals = np.empty(tuple(shape), dtype=object)
        for idx in np.ndindex(vals.shape):
            vals[idx] = scalar_load(idx)
        return small.Small(vals)
    if elementwise:
        return elements.load(m, jax.ShapeDtypeStruct(tuple(shape), dtype))
    layout = V.strided_layout(tuple(shape))
    arr = mgpu.FragmentedArray.load_strided(m, is_signed=V.signed(V.storage_dtype(dtype)),
                                            vec_size=layout.vec_size)
    if is_bool:
        arr = V.map_registers(
            lambda v: arith.cmpi(arith.CmpIPredicate.ne, v, V.const_like(0, v)), [arr], dtype)
    return arr


def store_view(m, value, aval, space: str, sync: bool = True, elementwise: bool = False):
    """Writes ``value`` (array, scalar or literal of ``aval``) into a memref view
    (``elementwise`` for a strided view)."""
    is_bool = V.kind(aval.dtype) == "b"

    def scalar_store(v, idx):
        if is_bool:
            v = arith.extui(V.elem_type(V.storage_dtype(aval.dtype)), v)
        memref.store(v, m, [V.const(i, V.index()) for i in idx])

    if not aval.shape:
        scalar_store(V.scalar(value, aval), [])
    elif small.is_small(aval.shape):
        # Every thread holds the same values; one thread writes them.
        vals = small.to_small(value, aval, aval.shape).values
        if_op = scf.IfOp(threads.issuer())
        with ir.InsertionPoint(if_op.then_block):
            for idx in np.ndindex(vals.shape):
                scalar_store(vals[idx], idx)
            scf.YieldOp([])
    elif elementwise:
        elements.store(m, value, aval)
    elif (isinstance(value, mgpu.FragmentedArray) and not is_bool
          and isinstance(value.layout, fa.TiledLayout)):
        try:  # e.g. a matmul result in the WGMMA layout
            # Mosaic GPU plans bank-conflict-free transfers for SMEM only; a GMEM ref
            # (a plgpu.kernel's output) takes plain stores.
            value.store_untiled(m, optimized=space == "smem")
        except fa.TransferPlanDerivationError:  # no bank-conflict-free plan: plain stores
            value.store_untiled(m, optimized=False)
    elif (isinstance(value, mgpu.FragmentedArray) and not is_bool
          and isinstance(value.layout, fa.WGStridedFragLayout)):
        value.store_untiled(m)  # at its own vector width (say, a WG_STRIDED layout_cast)
    else:
        arr = V.to_strided(V.array(value, aval))
        if is_bool:
            i8 = V.elem_type(V.storage_dtype(aval.dtype))
            arr = V.map_registers(
                lambda v: arith.extui(ir.VectorType.get(ir.VectorType(v.type).shape, i8), v)
                if isinstance(v.type, ir.VectorType) else arith.extui(i8, v),
                [arr], V.storage_dtype(aval.dtype))
        arr.store_untiled(m)
    if space == "smem" and sync:
        mgpu.warpgroup_barrier()
