"""Small arrays, held whole by every thread, and building arrays element by element.

An array whose size is not a multiple of the warpgroup (a row of statistics, a column
vector) cannot use the strided layout; up to :data:`MAX_SMALL` elements it is a
:class:`Small` array instead: every thread holds every element as a scalar register,
so its values are uniform across the warpgroup, like scalars.

:func:`build` makes an array of a given shape from a function of the element index:
for a strided array each thread computes the elements it owns (dynamic indices), for a
small one every element is computed (static indices).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, gpu, vector

from pallas_mosaic_gpu._src.lowering import values as V

MAX_SMALL = 64


@dataclasses.dataclass(frozen=True)
class Small:
    """An array every thread holds whole: ``values`` (numpy array of scalar ir.Values)."""

    values: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)


def is_small(shape) -> bool:
    n = math.prod(shape)
    return bool(shape) and n % V.WARPGROUP_SIZE != 0


def check_small(shape):
    n = math.prod(shape)
    if n > MAX_SMALL:
        raise NotImplementedError(
            f"arrays of shape {tuple(shape)} ({n} elements): an array is spread over "
            f"the {V.WARPGROUP_SIZE} threads of a warpgroup when its size is a multiple "
            f"of {V.WARPGROUP_SIZE}, or held whole by every thread up to {MAX_SMALL} "
            "elements")


def to_small(x, aval, shape) -> Small:
    """``x`` (Small, scalar, literal or splat) as a Small array of ``shape``."""
    shape = tuple(shape)
    check_small(shape)
    if isinstance(x, Small):
        if x.shape == shape:
            return x
        if x.values.size == 1:
            return Small(np.full(shape, x.values.flat[0], dtype=object))
        raise NotImplementedError(f"broadcasting a {x.shape} array to {shape}")
    if isinstance(x, V.FragmentedArray):
        return Small(np.full(shape, V.scalar(x, aval), dtype=object))
    if isinstance(x, V.Lit):
        v = np.asarray(x.val)
        if v.ndim and not np.all(v == v.reshape(-1)[0]):
            raise NotImplementedError("non-splat array constants in kernels")
        x = V.Lit(v.reshape(-1)[0] if v.ndim else v, aval)
    return Small(np.full(shape, V.scalar(x, aval), dtype=object))


def map_small(fn, arrays: list[Small]) -> Small:
    out = np.empty(arrays[0].shape, dtype=object)
    for idx in np.ndindex(out.shape):
        out[idx] = fn(*(a.values[idx] for a in arrays))
    return Small(out)


def _c(v: int) -> ir.Value:
    return V.const(v, V.index())


def owned_indices(shape) -> list[list[ir.Value]]:
    """The indices (index-typed) of the elements this thread owns in the strided layout
    of ``shape``, register by register, element by element."""
    layout = V.strided_layout(tuple(shape))
    vec = layout.vec_size
    nregs = math.prod(layout.registers_shape(tuple(shape)))
    tid = arith.remui(gpu.thread_id(gpu.Dimension.x), _c(V.WARPGROUP_SIZE))
    base = arith.muli(tid, _c(vec))
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    out = []
    for r in range(nregs):
        for e in range(vec):
            flat = arith.addi(base, _c(r * V.WARPGROUP_SIZE * vec + e))
            out.append([arith.remui(arith.divui(flat, _c(s)), _c(n))
                        for s, n in zip(strides, shape)])
    return out


def from_elements(shape, dtype, elems: list[ir.Value]) -> V.FragmentedArray:
    """A strided array from the scalars this thread owns (in :func:`owned_indices`
    order)."""
    layout = V.strided_layout(tuple(shape))
    vec = layout.vec_size
    regs = np.empty(layout.registers_shape(tuple(shape)), dtype=object)
    vt = ir.VectorType.get((vec,), elems[0].type)
    for r in range(regs.size):
        regs.flat[r] = vector.from_elements(vt, elems[r * vec:(r + 1) * vec])
    return V.FragmentedArray(_registers=regs, _layout=layout, _is_signed=V.signed(dtype))


def build(shape, dtype, elem) -> object:
    """An array of ``shape`` whose element at index ``idx`` is ``elem(idx)`` (a scalar
    ir.Value); ``idx`` holds ints for small arrays, index ir.Values otherwise."""
    shape = tuple(shape)
    if not shape:
        return elem([])
    if is_small(shape):
        check_small(shape)
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            out[idx] = elem(list(idx))
        return Small(out)
    return from_elements(shape, dtype, [elem(idx) for idx in owned_indices(shape)])


def pick(values: np.ndarray, flat_index: ir.Value) -> ir.Value:
    """``values.flat[flat_index]`` for a dynamic index (a chain of selects)."""
    flat = list(values.flat)
    out = flat[-1]
    for i in range(len(flat) - 2, -1, -1):
        out = arith.select(arith.cmpi(arith.CmpIPredicate.eq, flat_index, _c(i)), flat[i], out)
    return out


def element(x, idx) -> ir.Value:
    """One element of a Small array at ``idx`` (ints or index ir.Values)."""
    if all(isinstance(i, int) for i in idx):
        return x.values[tuple(idx)]
    strides = [math.prod(x.shape[i + 1:]) for i in range(len(x.shape))]
    flat = _c(0)
    for i, s in zip(idx, strides):
        i = _c(i) if isinstance(i, int) else i
        flat = arith.addi(flat, arith.muli(i, _c(s)))
    return pick(x.values, flat)


def stretch(x, aval, shape):
    """``x`` of ``aval`` (same rank, size-1 dims) broadcast to ``shape``: held-whole and
    splat arrays only (a strided array needs SMEM, see ``broadcast_in_dim``)."""
    src = tuple(aval.shape)
    if isinstance(x, V.FragmentedArray) and not isinstance(x.layout, V.fa.WGSplatFragLayout):
        raise NotImplementedError(f"broadcasting a {src} array to {tuple(shape)} implicitly")
    if isinstance(x, Small):
        return build(tuple(shape), aval.dtype, lambda idx: element(
            x, [0 if n == 1 else i for n, i in zip(src, idx)]))
    return x  # scalars, literals and splats broadcast by themselves
