"""Lowering rules of refs and the grid: ``ref[...]`` loads and stores (static and
dynamic ``pl.ds`` windows, strided ones too, integer indices), ``pl.program_id`` and
``pl.num_programs``.

A load of a window with at least one dimension becomes a warpgroup array read from
SMEM (or straight from GMEM: a GMEM ref reads and writes in place); a store writes one
back and then, into SMEM, synchronises the warpgroup, since the threads that read an
SMEM element later need not be the ones that wrote it. ``ref.reshape(...)`` views a
contiguous ref with another shape.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, memref, scf

import pallas.plugins as pp
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.lowering import elements, small, threads, tmem
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import Lit, RefVal, lower_jaxpr, rule


def _index(x) -> object:
    """A static int or an ``index``-typed ir.Value for an indexer entry."""
    if isinstance(x, Lit):
        return int(np.asarray(x.val))
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, mgpu.FragmentedArray):
        raise NotImplementedError("gather-style (array) ref indexing")
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
                base.append(mgpu.ds(_index(idx.start), extent))
                dims.append((size, step))
            else:
                base.append(_index(idx))
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


def _check_space(ref: RefVal, what: str):
    if ref.space != "smem":
        raise NotImplementedError(
            f"{what} a GMEM ref directly (copy it to SMEM first, e.g. with "
            "plgpu.copy_gmem_to_smem, or give it a BlockSpec)")


def _tiled_view(ref: RefVal, flat, tree):
    """The memref of a view of a tiled/swizzled SMEM ref (whole tiles only)."""
    from pallas_mosaic_gpu._src.lowering import smem

    v = smem.view(ref, flat, tree)
    if v.tiling is None or len(v.tiling) != 2 or len(v.shape) != 2:
        raise NotImplementedError(
            f"reading or writing an SMEM ref with transforms (tiling={ref.tiling}, "
            f"swizzle={ref.swizzle}) except as a 2D view tiled in two dims")
    return v


def _check_scope(lctx, aval, what: str):
    if lctx.scope == "warp" and aval.shape:
        raise NotImplementedError(
            f"{what} an array of shape {tuple(aval.shape)} inside pl.core_map over a "
            "plgpu.WarpMesh (arrays are held by a whole warpgroup; read and write scalars "
            "there, or move the array code out of the warp's branch)")


@dataclasses.dataclass
class ValRef:
    """A ref holding a value in registers: what ``pl.run_state`` makes of a value it
    closes over (read and written whole)."""

    value: object

    def access(self, flat, what: str):
        if flat:
            raise NotImplementedError(f"{what} a window of a pl.run_state value ref")
        return self


@rule(jc.run_state_p)
def _run_state(lctx, eqn, *inits):
    """``pl.run_state(f)(...)``: ``f`` runs on refs starting at the inputs (a
    ``plgpu.ACC.init(x)`` accumulator in registers, a ref passed through, or a value it
    closed over); the results are the refs' final values."""
    from jax.experimental.mosaic.gpu import fragmented_array as fa

    from pallas_mosaic_gpu._src.lowering.rules_layout import in_layout
    from pallas_mosaic_gpu._src.lowering.scoped import AccVal, BarrierVal
    from pallas_mosaic_gpu._src.memory import AccumulatorSpace

    jaxpr = eqn.params["jaxpr"]
    refs = []
    for v, x, init in zip(jaxpr.invars, inits, eqn.params["is_initialized"]):
        if getattr(v.aval, "memory_space", None) is AccumulatorSpace.WGMMA:
            shape, dtype = tuple(v.aval.shape), np.dtype(v.aval.dtype)
            if init:
                value = in_layout(x, v.aval.inner_aval, fa.WGMMA_LAYOUT)
                acc = mgpu.WGMMAAccumulator.from_registers(value)
            else:
                acc = mgpu.WGMMAAccumulator.zero(
                    *shape, V.elem_type(dtype), is_signed=True if dtype.kind == "i" else None)
            refs.append(AccVal(acc, shape, dtype))
        elif not init:
            raise NotImplementedError(
                "pl.run_state with an uninitialized ref other than a plgpu.ACC (allocate "
                "buffers with pl.run_scoped)")
        elif isinstance(x, (RefVal, AccVal, BarrierVal, tmem.TmemVal)):
            refs.append(x)  # a ref passed through
        else:
            refs.append(ValRef(x))
    lower_jaxpr(lctx, jaxpr, [], refs)
    return [r.acc.value if isinstance(r, AccVal) else r.value if isinstance(r, ValRef)
            else r for r in refs]


@rule(jc.get_p)
def _get(lctx, eqn, ref, *flat):
    from pallas_mosaic_gpu._src.lowering import rules_wgmma
    from pallas_mosaic_gpu._src.lowering.scoped import AccVal

    _check_scope(lctx, eqn.outvars[0].aval, "reading")
    if isinstance(ref, ValRef):
        return ref.access(flat, "reading").value
    if isinstance(ref, AccVal):
        return rules_wgmma.read_acc(ref, flat, eqn.params["tree"])
    if isinstance(ref, tmem.TmemVal):
        return tmem.load(ref, flat, eqn.params["tree"], eqn.outvars[0].aval)
    # A GMEM ref is read in place by every thread (say, group sizes or offsets in a
    # GMEM operand of a plgpu.kernel): the same loads as from SMEM, from global memory.
    if ref.transformed:
        v = _tiled_view(ref, flat, eqn.params["tree"])
        return mgpu.FragmentedArray.load_tiled(
            v.memref, swizzle=v.swizzle or 16, is_signed=V.signed(v.dtype),
            layout=fa.WGMMA_LAYOUT)
    m = view(ref, flat, eqn.params["tree"])
    out = eqn.outvars[0].aval
    steps = stepped(flat, eqn.params["tree"])
    value = load_view(m, out.dtype, out.shape, elementwise=steps)
    if V.kind(out.dtype) != "b" and isinstance(value, mgpu.FragmentedArray) and not steps:
        # dots, reductions and transposes may read the value where it was loaded
        lctx.loaded_from[id(value)] = (value, m)
    return value


@rule(jc.swap_p)
def _swap(lctx, eqn, ref, value, *flat):
    from pallas_mosaic_gpu._src.lowering import rules_wgmma
    from pallas_mosaic_gpu._src.lowering.scoped import AccVal

    _check_scope(lctx, eqn.invars[1].aval, "writing")
    if isinstance(ref, ValRef):
        old = ref.access(flat, "writing").value
        ref.value = value
        return old
    if isinstance(ref, AccVal):
        old = rules_wgmma.read_acc(ref, flat, eqn.params["tree"]) \
            if lctx.is_used(eqn.outvars[0]) else None
        rules_wgmma.write_acc(ref, value, eqn.invars[1].aval, flat, eqn.params["tree"])
        return old
    if isinstance(ref, tmem.TmemVal):
        old = tmem.load(ref, flat, eqn.params["tree"], eqn.invars[1].aval) \
            if lctx.is_used(eqn.outvars[0]) else None
        tmem.store(ref, flat, eqn.params["tree"], value, eqn.invars[1].aval)
        return old
    if ref.transformed:
        if lctx.is_used(eqn.outvars[0]):
            raise NotImplementedError("swapping a value into a tiled SMEM ref")
        v = _tiled_view(ref, flat, eqn.params["tree"])
        if isinstance(value, mgpu.FragmentedArray) and id(value) in lctx.loaded_from \
                and not isinstance(value.layout, fa.TiledLayout):
            # Read from a ref in a strided layout (say plgpu.load(..., layout=WGMMA) of
            # a GMEM ref): read it again in the WGMMA layout the tiled store needs.
            value = fa.FragmentedArray.load_untiled(
                lctx.loaded_from[id(value)][1], layout=fa.WGMMA_LAYOUT, optimized=False,
                is_signed=V.signed(eqn.invars[1].aval.dtype))
        if not isinstance(value, mgpu.FragmentedArray) or not isinstance(
                value.layout, fa.TiledLayout):
            raise NotImplementedError(
                "storing into a tiled/swizzled SMEM ref an array not in the WGMMA layout "
                "(store a value computed from a plgpu.ACC accumulator)")
        value.store_tiled(v.memref, swizzle=v.swizzle or 16)
        mgpu.warpgroup_barrier()
        return None
    m = view(ref, flat, eqn.params["tree"])
    steps = stepped(flat, eqn.params["tree"])
    aval = eqn.invars[1].aval
    old = None
    if lctx.is_used(eqn.outvars[0]):
        old = load_view(m, aval.dtype, aval.shape, elementwise=steps)
        if aval.shape:
            old = V.to_strided(old)
            mgpu.warpgroup_barrier()  # every thread has read before anyone writes
    store_view(m, value, aval, ref.space, elementwise=steps)
    return old


_ATOMIC_STORES = ("add", "max", "min", "and", "or", "xor")


@rule(pp.atomic_rmw_p)
def _atomic_rmw(lctx, eqn, ref, value, *rest):
    """``plgpu.atomic_add(ref, val)`` and the like: Mosaic GPU's atomic stores of a
    register array into a whole SMEM or GMEM view (``red`` per register, in the
    array's own layout). The previous values are not read back (upstream's atomic
    stores return nothing), and masks are not supported."""
    op = eqn.params["op"]
    aval = eqn.invars[1].aval
    if op not in _ATOMIC_STORES:
        raise NotImplementedError(
            f"atomic_rmw with op {op!r}: Mosaic GPU's atomic stores are "
            f"{', '.join(_ATOMIC_STORES)}")
    if eqn.params["has_mask"]:
        raise NotImplementedError("a masked atomic_rmw (Mosaic GPU's atomic stores write "
                                  "whole views)")
    if lctx.is_used(eqn.outvars[0]):
        raise NotImplementedError(
            "reading the previous values of an atomic_rmw (Mosaic GPU's atomic stores "
            "return nothing; use plgpu.atomic_add and friends)")
    if not isinstance(ref, RefVal) or not aval.shape:
        raise NotImplementedError("atomic_rmw of a scalar or into a value that is not an "
                                  "SMEM or GMEM ref")
    flat = rest[:eqn.params["tree"].num_leaves]
    if ref.transformed:
        v = _tiled_view(ref, flat, eqn.params["tree"])
        if isinstance(value, mgpu.FragmentedArray) and id(value) in lctx.loaded_from \
                and not isinstance(value.layout, fa.TiledLayout):
            # Read from a ref in a strided layout (say plgpu.load(..., layout=WGMMA) of
            # a GMEM ref): read it again in the WGMMA layout the tiled store needs.
            value = fa.FragmentedArray.load_untiled(
                lctx.loaded_from[id(value)][1], layout=fa.WGMMA_LAYOUT, optimized=False,
                is_signed=V.signed(aval.dtype))
        if not isinstance(value, mgpu.FragmentedArray) or not isinstance(
                value.layout, fa.TiledLayout):
            raise NotImplementedError(
                "an atomic store into a tiled/swizzled SMEM ref of an array not in a "
                f"tiled layout (say plgpu.Layout.WGMMA); got {type(value).__name__} "
                f"{getattr(value, 'layout', '')}")
        value.store_tiled(v.memref, swizzle=v.swizzle or 16, atomic=op)
    else:
        m = view(ref, flat, eqn.params["tree"])
        arr = V.array(value, aval)
        if not isinstance(arr.layout, (fa.TiledLayout, fa.WGStridedFragLayout)):
            arr = V.to_strided(arr)
        arr.store_untiled(m, optimized=False, atomic=op)
    if ref.space == "smem":
        mgpu.warpgroup_barrier()
    return None  # the previous values, unused (checked above)


@rule(jc.addupdate_p)
def _addupdate(lctx, eqn, ref, value, *flat):
    _check_space(ref, "updating")
    m = view(ref, flat, eqn.params["tree"])
    steps = stepped(flat, eqn.params["tree"])
    aval = eqn.invars[1].aval
    old = load_view(m, aval.dtype, aval.shape, elementwise=steps)
    if aval.shape:
        mgpu.warpgroup_barrier()
    add = arith.addf if V.kind(aval.dtype) == "f" else arith.addi
    if aval.shape:
        new = V.map_registers(add, [V.to_strided(old), V.array(value, aval)], aval.dtype)
    else:
        new = add(old, V.scalar(value, aval))
    store_view(m, new, aval, ref.space, elementwise=steps)
    return []


@rule(pp.multiple_of_p)
def _multiple_of(lctx, eqn, x):
    return x


@rule(pp.program_id_p)
def _program_id(lctx, eqn):
    return lctx.program_ids[eqn.params["axis"]]


@rule(pp.num_programs_p)
def _num_programs(lctx, eqn):
    return V.const(lctx.grid[eqn.params["axis"]], V.i32())
