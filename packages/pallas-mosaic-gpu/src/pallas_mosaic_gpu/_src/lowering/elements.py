"""Ref windows read and written element by element: strided windows
(``ref[pl.ds(start, size, stride)]``) and masked ``pl.load``/``pl.store``/``pl.swap``.

A strided window is a ``memref.subview`` with a step along each strided dim; Mosaic
GPU's vector loads and stores want a contiguous innermost dim, so such a view is read
and written one element at a time. Each thread touches the elements its registers hold
(in the strided register layout; every element of an array all threads hold whole, one
thread writing them) and packs them into vectors. A mask guards each access: a
masked-off element is neither read nor written, so a mask may guard a window that runs
past the end of a ref, and warpgroups storing with disjoint masks never overwrite each
other's elements.
"""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, memref, scf, vector

from pallas_mosaic_gpu._src.lowering import small, threads
from pallas_mosaic_gpu._src.lowering import values as V


def window(m, dims) -> ir.Value:
    """``m`` with every ``step``-th element along each dim; ``dims``: (size, step) per dim
    of ``m``, whose extent along a stepped dim is ``(size - 1) * step + 1``."""
    if all(step == 1 for _, step in dims):
        return m
    return memref.subview(m, [0] * len(dims), [n for n, _ in dims],
                          [step for _, step in dims])


def _indices(shape) -> list[list]:
    """The indices this thread accesses, in the order of :func:`_parts`."""
    if not shape:
        return [[]]
    if small.is_small(shape):
        small.check_small(shape)
        return [[V.const(i, V.index()) for i in idx] for idx in np.ndindex(shape)]
    return small.owned_indices(shape)


def _parts(x, aval, shape) -> list[ir.Value]:
    """The scalars of ``x`` (of ``aval``, broadcast to ``shape``) at :func:`_indices`."""
    if not shape:
        return [V.scalar(x, aval)]
    if small.is_small(shape):
        return list(small.to_small(x, aval, shape).values.flat)
    arr = V.to_strided(V.array(x, aval, shape))
    return [vector.extract(reg, [], [e]) for reg in arr.registers.flat
            for e in range(arr.layout.vec_size)]


def _assemble(vals, shape, dtype):
    if not shape:
        return vals[0]
    if small.is_small(shape):
        return small.Small(np.array(vals, dtype=object).reshape(shape))
    return small.from_elements(shape, dtype, vals)


def _read(m, idx, dtype) -> ir.Value:
    v = memref.load(m, idx)
    if V.kind(dtype) == "b":  # stored as int8
        return arith.cmpi(arith.CmpIPredicate.ne, v, V.const_like(0, v))
    return v


def _write(m, idx, v, dtype) -> None:
    if V.kind(dtype) == "b":
        v = arith.extui(V.elem_type(V.storage_dtype(dtype)), v)
    memref.store(v, m, idx)


def load(m, aval, mask=None, mask_aval=None, other=None):
    """The window ``m`` as a value of ``aval``; with ``mask``, masked-off elements are not
    read and are ``other`` (of ``aval``), or zero."""
    shape, dtype = tuple(aval.shape), aval.dtype
    idxs = _indices(shape)
    masks = _parts(mask, mask_aval, shape) if mask is not None else [None] * len(idxs)
    if other is not None:
        others = _parts(other, aval, shape)
    else:
        others = [V.const(0, V.elem_type(dtype))] * len(idxs)
    vals = []
    for idx, pred, fallback in zip(idxs, masks, others):
        if pred is None:
            vals.append(_read(m, idx, dtype))
            continue
        if_op = scf.IfOp(pred, [fallback.type], has_else=True)
        with ir.InsertionPoint(if_op.then_block):
            scf.YieldOp([_read(m, idx, dtype)])
        with ir.InsertionPoint(if_op.else_block):
            scf.YieldOp([fallback])
        vals.append(if_op.result)
    return _assemble(vals, shape, dtype)


def store(m, value, aval, mask=None, mask_aval=None) -> None:
    """Writes ``value`` (of ``aval``) into the window ``m`` where ``mask`` holds (everywhere
    without one); the caller synchronises."""
    shape, dtype = tuple(aval.shape), aval.dtype
    idxs = _indices(shape)
    vals = _parts(value, aval, shape)
    masks = _parts(mask, mask_aval, shape) if mask is not None else [None] * len(idxs)
    def emit():
        for idx, v, pred in zip(idxs, vals, masks):
            if pred is None:
                _write(m, idx, v, dtype)
                continue
            if_op = scf.IfOp(pred)
            with ir.InsertionPoint(if_op.then_block):
                _write(m, idx, v, dtype)
                scf.YieldOp([])

    if small.is_small(shape):  # every thread holds the values: one thread writes them
        if_op = scf.IfOp(threads.issuer())
        with ir.InsertionPoint(if_op.then_block):
            emit()
            scf.YieldOp([])
    else:
        emit()
