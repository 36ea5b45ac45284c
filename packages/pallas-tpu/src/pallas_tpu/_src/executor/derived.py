"""Memrefs that no numpy view expresses: a ref bitcast to a dtype of another width
(``tpu.memref_bitcast``), and the slices and reshapes of one. Reads compute the values
from the base buffer; writes put them back, so stores through it land in the base.

A TPU bitcast keeps the (sublane, lane) tiling: an (m, n) i32 memref read as i16 is
(2m, n), row ``r * k`` holding the low halves of row ``r`` and row ``r * k + 1`` the high
ones (upstream's ``state_utils.bitcast``)."""

from __future__ import annotations

import numpy as np


def unpack(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``x`` (..., m, n) of a dtype ``k`` times wider than ``dt`` as (..., m * k, n)."""
    k = x.dtype.itemsize // dt.itemsize
    y = np.ascontiguousarray(x).view(dt).reshape(x.shape + (k,))
    return np.swapaxes(y, -1, -2).reshape(x.shape[:-2] + (x.shape[-2] * k, x.shape[-1]))


def pack(y: np.ndarray, dt: np.dtype) -> np.ndarray:
    """The inverse of :func:`unpack`: ``y`` (..., m * k, n) as (..., m, n) of ``dt``."""
    k = dt.itemsize // y.dtype.itemsize
    m, n = y.shape[-2] // k, y.shape[-1]
    x = np.swapaxes(y.reshape(y.shape[:-2] + (m, k, n)), -1, -2)
    return np.ascontiguousarray(x).view(dt).reshape(y.shape[:-2] + (m, n))


def bitcast(ref, dt: np.dtype):
    """``ref`` (a numpy view or a :class:`DerivedRef`) as ``dt``."""
    src = np.dtype(ref.dtype)
    if src.itemsize == dt.itemsize and isinstance(ref, np.ndarray) and ref.flags.c_contiguous:
        return ref.view(dt)
    if src.itemsize == dt.itemsize:
        return DerivedRef(ref, lambda a: np.ascontiguousarray(a).view(dt),
                          lambda a, new: np.ascontiguousarray(new).view(src), ref.shape, dt)
    if src.itemsize > dt.itemsize:
        read, write = (lambda a: unpack(a, dt)), (lambda a, new: pack(new, src))
    else:
        read, write = (lambda a: pack(a, dt)), (lambda a, new: unpack(new, src))
    k = max(src.itemsize, dt.itemsize) // min(src.itemsize, dt.itemsize)
    rows = ref.shape[-2] * k if src.itemsize > dt.itemsize else ref.shape[-2] // k
    return DerivedRef(ref, read, write, tuple(ref.shape[:-2]) + (rows, ref.shape[-1]), dt)


class DerivedRef:
    """A writable memref computed from ``parent`` (an array or another DerivedRef):
    ``read(parent values)`` are its values; ``write(parent values, new values)`` the
    parent's values that make them ``new``."""

    def __init__(self, parent, read, write, shape, dtype):
        self.parent, self.read, self.write = parent, read, write
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def __array__(self, dtype=None, copy=None):
        a = np.array(self.read(np.asarray(self.parent)))
        return a if dtype is None else a.astype(dtype)

    def copy(self) -> np.ndarray:
        return np.array(self)

    def __getitem__(self, idx) -> DerivedRef:
        shape = np.empty(self.shape, np.bool_)[idx].shape

        def write(a, new):
            a = np.array(a)
            a[idx] = new
            return a

        return DerivedRef(self, lambda a: a[idx], write, shape, self.dtype)

    def __setitem__(self, idx, val) -> None:
        full = np.array(self)
        full[idx] = val
        self.parent[...] = self.write(np.asarray(self.parent), full)

    def reshape(self, shape) -> DerivedRef:
        shape = tuple(int(s) for s in shape)
        return DerivedRef(self, lambda a: a.reshape(shape), lambda a, new: new.reshape(a.shape),
                          shape, self.dtype)
