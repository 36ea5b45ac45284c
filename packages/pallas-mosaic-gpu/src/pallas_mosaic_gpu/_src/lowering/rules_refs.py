"""Lowering rules of refs and the grid: ``ref[...]`` loads and stores (static and
dynamic ``pl.ds`` windows, strided ones too, integer indices), ``pl.run_state`` and
``pl.run_scoped`` (the buffers :mod:`scoped` planned), ``pl.program_id`` and
``pl.num_programs``.

A load of a window with at least one dimension becomes a warpgroup array read from
SMEM (or straight from GMEM: a GMEM ref reads and writes in place); a store writes one
back and then, into SMEM, synchronises the warpgroup, since the threads that read an
SMEM element later need not be the ones that wrote it. ``ref.reshape(...)`` views a
contiguous ref with another shape.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jaxlib.mlir.dialects import arith

import pallas.plugins as pp
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.lowering import collectives, mma, scoped, scoped_stack, smem, tmem
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import RefVal, lower_jaxpr, rule
from pallas_mosaic_gpu._src.lowering.register_layouts import in_layout
from pallas_mosaic_gpu._src.lowering.scoped import AccVal, BarrierVal
from pallas_mosaic_gpu._src.lowering.views import load_view, stepped, store_view, view
from pallas_mosaic_gpu._src.memory import AccumulatorSpace


def _check_space(ref: RefVal, what: str):
    if ref.space != "smem":
        raise NotImplementedError(
            f"{what} a GMEM ref directly (copy it to SMEM first, e.g. with "
            "plgpu.copy_gmem_to_smem, or give it a BlockSpec)")


def _plain_view(lctx, ref: RefVal, flat, tree, what: str):
    """``(memref view, remaining flat, remaining tree)`` of an untiled ref, on the peer
    device a ``plgpu.remote_ref`` names (Mosaic GPU's collective metadata gives its
    address of the same GMEM buffer)."""
    flat, tree, peer = collectives.split_peer(lctx, flat, tree, what)
    m = view(ref, flat, tree)
    if peer is not None:
        if ref.space != "gmem":
            raise NotImplementedError(
                f"{what} a plgpu.remote_ref of an SMEM ref: only GMEM buffers (kernel "
                f"operands) have an address on other devices")
        m = lctx.launch_ctx.to_remote(m, peer)
    return m, flat, tree


def _tiled_view(ref: RefVal, flat, tree):
    """The memref of a view of a tiled/swizzled SMEM ref (whole tiles only)."""
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


@rule(pp.run_scoped_p)
def _run_scoped(lctx, eqn, *consts):
    sync = lctx.scope_syncs.get(id(eqn))  # bytes or barriers an earlier scope used
    scoped_stack.enter(sync, [(lctx.scoped[k][1], lctx.scoped[k][0].entry.arrival_count)
                              for k in (sync.barriers if sync else ())])
    refs = []
    for k in range(len(eqn.params["types"])):
        if (id(eqn), k) not in lctx.scoped:
            raise NotImplementedError("run_scoped outside the kernel body (not planned)")
        planned, allocated = lctx.scoped[(id(eqn), k)]
        refs.append(scoped.value(planned, allocated))
    return lower_jaxpr(lctx, eqn.params["jaxpr"], [], [*consts, *refs])


@rule(jc.get_p)
def _get(lctx, eqn, ref, *flat):
    _check_scope(lctx, eqn.outvars[0].aval, "reading")
    if isinstance(ref, ValRef):
        return ref.access(flat, "reading").value
    if isinstance(ref, AccVal):
        return mma.read_acc(ref, flat, eqn.params["tree"])
    if isinstance(ref, tmem.TmemVal):
        return tmem.load(ref, flat, eqn.params["tree"], eqn.outvars[0].aval)
    # A GMEM ref is read in place by every thread (say, group sizes or offsets in a
    # GMEM operand of a plgpu.kernel): the same loads as from SMEM, from global memory.
    if ref.transformed:
        v = _tiled_view(ref, flat, eqn.params["tree"])
        return mgpu.FragmentedArray.load_tiled(
            v.memref, swizzle=v.swizzle or 16, is_signed=V.signed(v.dtype),
            layout=fa.WGMMA_LAYOUT)
    m, flat, tree = _plain_view(lctx, ref, flat, eqn.params["tree"], "reading")
    out = eqn.outvars[0].aval
    steps = stepped(flat, tree)
    value = load_view(m, out.dtype, out.shape, elementwise=steps)
    if V.kind(out.dtype) != "b" and isinstance(value, mgpu.FragmentedArray) and not steps:
        # dots, reductions and transposes may read the value where it was loaded
        lctx.loaded_from[id(value)] = (value, m)
    return value


@rule(jc.swap_p)
def _swap(lctx, eqn, ref, value, *flat):
    _check_scope(lctx, eqn.invars[1].aval, "writing")
    if isinstance(ref, ValRef):
        old = ref.access(flat, "writing").value
        ref.value = value
        return old
    if isinstance(ref, AccVal):
        old = mma.read_acc(ref, flat, eqn.params["tree"]) \
            if lctx.is_used(eqn.outvars[0]) else None
        mma.write_acc(ref, value, eqn.invars[1].aval, flat, eqn.params["tree"])
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
    m, flat, tree = _plain_view(lctx, ref, flat, eqn.params["tree"], "writing")
    steps = stepped(flat, tree)
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
    m, flat, tree = _plain_view(lctx, ref, flat, eqn.params["tree"], "writing")
    steps = stepped(flat, tree)
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
