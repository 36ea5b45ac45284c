"""SMEM for operands that threads must read across the warpgroup.

A thread holds only the elements it owns of a strided array, so a dot, a reduction
over some axes, a transpose or a broadcast of an array reads its operand from SMEM.
When the operand was just read from a ref (and nothing was written since), it is read
there in place; otherwise the kernel reserves an SMEM buffer for it, found by
:func:`spill_buffers` before the kernel body is emitted, and the rule writes the
operand there first (:func:`operand_memref`).
"""

from __future__ import annotations

import math

import jax.extend.core as jex
import jax.extend.core.primitives as P
import jax.numpy as jnp
from jax.experimental.mosaic import gpu as mgpu

from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.lowering import small
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.views import store_view

# Primitives whose first operand is read across the warpgroup (when strided).
GATHERING = (P.reduce_sum_p, P.reduce_max_p, P.reduce_min_p, P.reduce_prod_p,
             P.reduce_and_p, P.reduce_or_p, P.argmax_p, P.argmin_p, P.transpose_p,
             P.broadcast_in_dim_p, P.cumsum_p, P.cumprod_p, P.cummax_p, P.cummin_p)
CUMULATIVE = (P.cumsum_p, P.cumprod_p, P.cummax_p, P.cummin_p)


def _read_in_place(jaxpr, pos: int, var) -> bool:
    """Whether ``var`` (an operand of ``jaxpr.eqns[pos]``) was read from a ref by a
    ``get`` of the same jaxpr with no effect but other reads in between (a JVP kernel
    reads every primal and tangent block before its first dot)."""
    for i in range(pos - 1, -1, -1):
        e = jaxpr.eqns[i]
        if any(o is var for o in e.outvars):
            return e.primitive is jc.get_p
        if e.effects and e.primitive is not jc.get_p:
            return False
    return False


def _strided(aval) -> bool:
    return bool(aval.shape) and math.prod(aval.shape) % V.WARPGROUP_SIZE == 0


def _in_place(jaxpr, pos, v) -> bool:
    # Bools are stored as int8 and read as ``!= 0``: they are always written out.
    return _strided(v.aval) and V.kind(v.aval.dtype) != "b" and _read_in_place(jaxpr, pos, v)


def load_element(m, idx, dtype):
    """One element of an SMEM operand (bools are stored as int8)."""
    from jaxlib.mlir.dialects import arith, memref

    idx = [V.const(i, V.index()) if isinstance(i, int) else i for i in idx]
    v = memref.load(m, idx)
    if V.kind(dtype) == "b":
        return arith.cmpi(arith.CmpIPredicate.ne, v, V.const_like(0, v))
    return v


def needs_gather(eqn) -> bool:
    """Whether the eqn reads its (strided) operand across the warpgroup."""
    p = eqn.primitive
    if p not in GATHERING:
        return False
    a = eqn.invars[0].aval
    if not _strided(a):
        return False
    if p is P.broadcast_in_dim_p:
        return math.prod(eqn.outvars[0].aval.shape) != math.prod(a.shape)
    if p in (P.argmax_p, P.argmin_p, P.transpose_p, *CUMULATIVE):
        return True
    # Full reductions of float32 need no SMEM (a warpgroup reduction); others loop.
    return (len(eqn.params["axes"]) != len(a.shape) or jnp.dtype(a.dtype) != jnp.float32
            or p in (P.reduce_and_p, P.reduce_or_p))


def _stretches(eqn, elementwise) -> bool:
    """An elementwise eqn (``elementwise(primitive)``: the engine's
    ``is_elementwise``) with a strided operand that has size-1 dims the output has not
    (lax broadcasts those implicitly)."""
    if not elementwise(eqn.primitive):
        return False
    if len(eqn.outvars) != 1 or not hasattr(eqn.outvars[0].aval, "shape"):
        return False
    out = tuple(eqn.outvars[0].aval.shape)
    return any(_strided(v.aval) and tuple(v.aval.shape) != out for v in eqn.invars
               if hasattr(v.aval, "shape"))


REDUCING = (P.reduce_sum_p, P.reduce_max_p, P.reduce_min_p, P.reduce_prod_p,
            P.reduce_and_p, P.reduce_or_p)


def reduces(jaxpr) -> bool:
    """Whether ``jaxpr`` (sub-jaxprs included) has a reduction, whose lowering may combine
    partial results across warps in SMEM (the kernel's reduction scratch): kernels
    without one get no such scratch."""
    return any(eqn.primitive in REDUCING
               or any(reduces(getattr(sub, "jaxpr", sub))
                      for sub in jex.jaxprs_in_params(eqn.params))
               for eqn in jaxpr.eqns)


def scanned_avals(eqn) -> list:
    """The scanned operands (``xs``) and stacked results (``ys``) of a ``lax.scan``:
    the loop reads row ``i`` of each from SMEM and writes row ``i`` of each there, since a
    thread holds only its own elements of a register array (nothing dynamic indexes
    registers)."""
    p = eqn.params
    n = p["num_consts"] + p["num_carry"]
    return [v.aval for v in eqn.invars[n:]] + [v.aval for v in eqn.outvars[p["num_carry"]:]]


def spill_buffers(jaxpr, elementwise) -> list[tuple]:
    """(eqn, [aval or None per operand]) of every eqn needing SMEM for its operands
    (None: read in place), sub-jaxprs included; ``elementwise(primitive)`` tells the
    eqns whose operands stretch (the engine's ``is_elementwise``, passed down since the
    engine sits above this module)."""
    found = []
    for pos, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive is P.dot_general_p:
            found.append((eqn, [None if _in_place(jaxpr, pos, v) else v.aval
                                for v in eqn.invars]))
        elif eqn.primitive is P.concatenate_p:
            found.append((eqn, [v.aval if _strided(v.aval) and not _in_place(jaxpr, pos, v)
                                else None for v in eqn.invars]))
        elif eqn.primitive is P.scan_p and scanned_avals(eqn):
            found.append((eqn, scanned_avals(eqn)))
        elif needs_gather(eqn):
            v = eqn.invars[0]
            found.append((eqn, [None if _in_place(jaxpr, pos, v) else v.aval]))
        elif _stretches(eqn, elementwise):
            out = tuple(eqn.outvars[0].aval.shape)
            found.append((eqn, [v.aval if _strided(v.aval) and tuple(v.aval.shape) != out
                                and not _in_place(jaxpr, pos, v) else None
                                for v in eqn.invars]))
        for sub in jex.jaxprs_in_params(eqn.params):
            found.extend(spill_buffers(getattr(sub, "jaxpr", sub), elementwise))
    return found


def operand_memrefs(lctx, eqn, xs) -> tuple[list, bool]:
    """SMEM memrefs holding the operands ``xs`` of ``eqn`` (written there if needed),
    and whether any was written (then the caller syncs again after reading)."""
    bufs = lctx.spill_buffers[id(eqn)]
    out, stored = [], False
    for x, v, buf in zip(xs, eqn.invars, bufs):
        if buf is None:
            hit = lctx.loaded_from.get(id(x))
            if hit is None:
                raise NotImplementedError(
                    f"{eqn.primitive.name} of a value not read from a ref (internal)")
            out.append(hit[1])
        else:
            store_view(buf, x, v.aval, "smem", sync=False)
            out.append(buf)
            stored = True
    if stored:
        mgpu.warpgroup_barrier()
    return out, stored


def stretch(lctx, eqn, i, x, aval, shape):
    """Operand ``i`` of an elementwise eqn, a strided array, broadcast along its size-1
    dims to ``shape`` (as lax allows) by reading it from SMEM: where it was loaded from
    a ref, or the buffer reserved for it."""
    buf = (lctx.spill_buffers.get(id(eqn)) or [None] * (i + 1))[i]
    if buf is not None:
        store_view(buf, x, aval, "smem")
        m = buf
    else:
        hit = lctx.loaded_from.get(id(x))
        if hit is None:
            raise NotImplementedError(
                f"broadcasting a {tuple(aval.shape)} array to {tuple(shape)} (internal)")
        m = hit[1]
    src = tuple(aval.shape)
    res = small.build(tuple(shape), aval.dtype, lambda idx: load_element(
        m, [0 if n == 1 else j for n, j in zip(src, idx)], aval.dtype))
    if buf is not None:
        mgpu.warpgroup_barrier()
    return res
