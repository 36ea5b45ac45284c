"""SMEM buffers with layout transforms, and views of refs through ``ref.at[...]``.

A buffer of logical shape ``(L..., D1, D2)`` with ``TilingTransform((t1, t2))`` is the
memref ``(L..., D1/t1, D2/t2, t1, t2)`` (what TMA writes with a tile transform and
``wgmma`` reads); ``SwizzleTransform(s)`` says its rows of ``s`` bytes are swizzled.
The kernel indexes it by logical dims: leading dims freely, tiled dims in whole tiles.
GMEM refs keep their whole memref and a *window* (offsets and sizes per dim), so a TMA
copy gets one descriptor for the array and the window as its slice.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith

from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering import views
from pallas_mosaic_gpu._src.lowering.context import KernelError, RefVal
from pallas_mosaic_gpu._src.transforms import SwizzleTransform, TilingTransform


def layout(transforms, shape, dtype, what: str) -> tuple[tuple | None, int | None]:
    """(tiling, swizzle) of a buffer's transforms; a clear error for ones Mosaic GPU's
    SMEM cannot hold."""
    tiling = swizzle = None
    for t in transforms:
        if isinstance(t, TilingTransform):
            if tiling is not None:
                raise KernelError(f"{what}: at most one TilingTransform, got {transforms}")
            if len(t.tiling) > len(shape):
                raise KernelError(f"{what}: tiling {t.tiling} has more dims than shape {shape}")
            tiling = t.tiling
        elif isinstance(t, SwizzleTransform):
            swizzle = t.swizzle
        else:
            raise KernelError(
                f"{what}: transform {t!r} is not supported for SMEM by the mosaic_gpu "
                "lowering; valid: plgpu.TilingTransform and plgpu.SwizzleTransform")
    if swizzle is not None:
        minor = tiling[-1] if tiling is not None else shape[-1]
        row = minor * np.dtype(dtype).itemsize
        if row != swizzle:
            raise KernelError(
                f"{what}: SwizzleTransform({swizzle}) needs rows of {swizzle} bytes, but the "
                f"minor {'tile' if tiling else 'dim'} is {minor} x {np.dtype(dtype).name} = "
                f"{row} bytes; use a minor tile of {swizzle // np.dtype(dtype).itemsize} "
                "elements")
    return tiling, swizzle


def physical_shape(shape, tiling) -> tuple[int, ...]:
    """The memref shape of a buffer of logical ``shape`` tiled by ``tiling``."""
    if tiling is None:
        return tuple(shape)
    n = len(tiling)
    lead, tail = tuple(shape[:-n]), tuple(shape[-n:])
    return lead + tuple(d // t for d, t in zip(tail, tiling)) + tuple(tiling)


def smem_ref(memref, dtype, shape, tiling, swizzle) -> RefVal:
    """The kernel's view of an SMEM buffer."""
    if tiling is None and swizzle is None:
        return RefVal(memref, np.dtype(dtype), "smem")
    return RefVal(memref, np.dtype(dtype), "smem", tiling=tiling, swizzle=swizzle,
                  logical=tuple(shape))


def _transforms(flat, tree):
    return jax.tree_util.tree_unflatten(tree, list(flat))


def _entries(indexer):
    """Per indexed dim: ("slice", start, size) or ("index", i)."""
    if tuple(getattr(indexer, "int_indexer_shape", ())):
        raise NotImplementedError("gather-style (array) ref indexing")
    out = []
    for i in indexer.indices:
        if isinstance(i, jc.Slice):
            if int(i.stride) != 1:
                raise NotImplementedError(f"strided ref windows (stride {i.stride})")
            out.append(("slice", views.index_operand(i.start), int(i.size)))
        else:
            out.append(("index", views.index_operand(i)))
    return out


def _div(x, t: int, what: str):
    if isinstance(x, int):
        if x % t:
            raise KernelError(f"{what}: offset {x} is not a multiple of the tile ({t})")
        return x // t
    return arith.divui(x, V.const(t, V.index()))


def view(ref: RefVal, flat, tree) -> RefVal:
    """``ref`` seen through ``ref.at[...]``/transpose transforms (SMEM or GMEM)."""
    for t in _transforms(flat, tree):
        if isinstance(t, jc.NDIndexer):
            ref = _index(ref, _entries(t))
        elif isinstance(t, jc.TransposeTransform):
            ref = _transpose(ref, tuple(t.permutation))
        else:
            raise NotImplementedError(
                f"ref transform {type(t).__name__} (bitcast/reshape of refs)")
    return ref


def _index(ref: RefVal, entries) -> RefVal:
    if ref.tiling is None:
        base = [mgpu.ds(e[1], e[2]) if e[0] == "slice" else e[1] for e in entries]
        m = mgpu.memref_slice(ref.memref, tuple(base))
        if ref.swizzle is not None:
            if entries[-1] != ("slice", 0, ref.shape[-1]) and entries[-1][0] != "slice":
                raise NotImplementedError("indexing the swizzled minor dim of an SMEM ref")
            return dataclasses.replace(ref, memref=m, logical=tuple(
                ir.MemRefType(m.type).shape))
        return dataclasses.replace(ref, memref=m)
    shape, tiling = ref.shape, ref.tiling
    n_lead = len(shape) - len(tiling)
    lead, tiled, logical = [], [], []
    for d, e in enumerate(entries):
        if d < n_lead:
            lead.append(mgpu.ds(e[1], e[2]) if e[0] == "slice" else e[1])
            if e[0] == "slice":
                logical.append(e[2])
            continue
        t = tiling[d - n_lead]
        if e[0] == "index" or e[2] % t:
            raise KernelError(
                f"an SMEM ref tiled by {tiling} (logical shape {shape}) can only be sliced "
                f"in whole tiles along its tiled dims; dim {d} got "
                f"{'an index' if e[0] == 'index' else f'a window of {e[2]}'}")
        tiled.append(mgpu.ds(_div(e[1], t, f"dim {d} of a ref tiled by {tiling}"),
                             e[2] // t))
        logical.append(e[2])
    m = mgpu.memref_slice(ref.memref, tuple(lead + tiled))
    if len(lead) != n_lead:
        raise NotImplementedError("tiled SMEM refs indexed in fewer dims than their rank")
    return dataclasses.replace(ref, memref=m, logical=tuple(logical))


def _transpose(ref: RefVal, perm: tuple[int, ...]) -> RefVal:
    if ref.tiling is None:
        if ref.swizzle is not None and perm[-1] != len(perm) - 1:
            raise NotImplementedError("transposing the swizzled minor dim of an untiled ref")
        m = mgpu.utils.memref_transpose(ref.memref, perm)
        if ref.logical is None:
            return dataclasses.replace(ref, memref=m)
        return dataclasses.replace(ref, memref=m, logical=tuple(ref.shape[p] for p in perm))
    n, k = len(perm), len(ref.tiling)
    lead = n - k
    if any(perm[i] != i for i in range(lead)) or sorted(perm[lead:]) != list(range(lead, n)):
        raise NotImplementedError(
            f"transposing a tiled SMEM ref by {perm}: only its tiled dims may be permuted")
    inner = [p - lead for p in perm[lead:]]
    phys = list(range(lead)) + [lead + j for j in inner] + [n + j for j in inner]
    m = mgpu.utils.memref_transpose(ref.memref, tuple(phys))
    return dataclasses.replace(ref, memref=m, tiling=tuple(ref.tiling[j] for j in inner),
                               logical=tuple(ref.shape[p] for p in perm))


def gmem_window(ref: RefVal, flat, tree) -> tuple:
    """The window of a GMEM ref seen through ``ref.at[...]``, as Mosaic GPU's
    ``gmem_slice`` over the whole array (``mgpu.ds`` per kept dim, an index per
    squeezed one)."""
    full = tuple(ir.MemRefType(ref.memref.type).shape)
    window = [mgpu.ds(0, d) for d in full]
    for t in _transforms(flat, tree):
        if not isinstance(t, jc.NDIndexer):
            raise NotImplementedError(
                f"ref transform {type(t).__name__} on a GMEM ref used by a TMA copy")
        kept = [i for i, w in enumerate(window) if isinstance(w, mgpu.DynamicSlice)]
        for dim, e in zip(kept, _entries(t)):
            base = window[dim].base
            if e[0] == "slice":
                window[dim] = mgpu.ds(_add(base, e[1]), e[2])
            else:
                window[dim] = _add(base, e[1])
    return tuple(window)


def _add(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    a = V.const(a, V.index()) if isinstance(a, int) else a
    b = V.const(b, V.index()) if isinstance(b, int) else b
    return arith.addi(a, b)


def window_shape(window) -> tuple[int, ...]:
    return tuple(w.length for w in window if isinstance(w, mgpu.DynamicSlice))


def nbytes(shape, dtype) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize
