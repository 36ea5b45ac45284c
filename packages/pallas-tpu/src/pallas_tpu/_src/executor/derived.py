"""Memrefs that no numpy view expresses: a ref bitcast to a dtype of another width
(``tpu.memref_bitcast``), and the slices and reshapes of one. Reads compute the values
from the base buffer; writes put them back, so stores through it land in the base.

A TPU bitcast keeps the (sublane, lane) tiling: an (m, n) i32 memref read as i16 is
(2m, n), row ``r * k`` holding the low halves of row ``r`` and row ``r * k + 1`` the high
ones (upstream's ``state_utils.bitcast``)."""

from __future__ import annotations

import numpy as np

from pallas.executor import bits, is_float, unsigned


def _as_bits(x: np.ndarray) -> np.ndarray:
    """The bit patterns of ``x`` as non-negative int64 (sub-byte ints count 4 bits)."""
    n = bits(x.dtype)
    if is_float(x.dtype):
        x = np.ascontiguousarray(x).view(unsigned(x.dtype))
    return x.astype(np.int64) & ((1 << n) - 1)


def _from_bits(u: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Bit patterns ``u`` (non-negative int64) as values of ``dt``."""
    n = bits(dt)
    if is_float(dt):
        return u.astype(unsigned(dt)).view(dt)
    if dt.kind == "u" or dt == unsigned(dt):
        return u.astype(dt)
    return np.where(u >= (1 << (n - 1)), u - (1 << n), u).astype(dt)


def unpack(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``x`` (..., m, n) of a dtype ``k`` times wider than ``dt`` as (..., m * k, n): row
    ``r * k + j`` holds bits ``[j * b, (j + 1) * b)`` of row ``r`` (``b`` the bits of
    ``dt``; int4 is 4 bits, two to a byte)."""
    b = bits(dt)
    k = bits(x.dtype) // b
    words = _as_bits(np.asarray(x))
    parts = np.stack([(words >> (j * b)) & ((1 << b) - 1) for j in range(k)], axis=-2)
    y = _from_bits(parts, dt)
    return y.reshape(x.shape[:-2] + (x.shape[-2] * k, x.shape[-1]))


def pack(y: np.ndarray, dt: np.dtype) -> np.ndarray:
    """The inverse of :func:`unpack`: ``y`` (..., m * k, n) as (..., m, n) of ``dt``."""
    b = bits(np.asarray(y).dtype)
    k = bits(dt) // b
    m, n = y.shape[-2] // k, y.shape[-1]
    parts = _as_bits(np.asarray(y)).reshape(y.shape[:-2] + (m, k, n))
    words = np.zeros(y.shape[:-2] + (m, n), np.int64)
    for j in range(k):
        words |= parts[..., j, :] << (j * b)
    return _from_bits(words, dt)


def bitcast(ref, dt: np.dtype):
    """``ref`` (a numpy view or a :class:`DerivedRef`) as ``dt``."""
    src = np.dtype(ref.dtype)
    sb, db = bits(src), bits(dt)
    if sb == db and isinstance(ref, np.ndarray) and ref.flags.c_contiguous \
            and src.itemsize == dt.itemsize:
        return ref.view(dt)
    if sb == db:
        return DerivedRef(ref, lambda a: _from_bits(_as_bits(np.asarray(a)), dt),
                          lambda a, new: _from_bits(_as_bits(np.asarray(new)), src),
                          ref.shape, dt, ("bitcast", dt))
    if sb > db:
        read, write = (lambda a: unpack(a, dt)), (lambda a, new: pack(new, src))
    else:
        read, write = (lambda a: pack(a, dt)), (lambda a, new: unpack(new, src))
    k = max(sb, db) // min(sb, db)
    rows = ref.shape[-2] * k if sb > db else ref.shape[-2] // k
    return DerivedRef(ref, read, write, tuple(ref.shape[:-2]) + (rows, ref.shape[-1]), dt,
                      ("bitcast", dt))


class DerivedRef:
    """A writable memref computed from ``parent`` (an array or another DerivedRef):
    ``read(parent values)`` are its values; ``write(parent values, new values)`` the
    parent's values that make them ``new``."""

    def __init__(self, parent, read, write, shape, dtype, how=()):
        self.parent, self.read, self.write = parent, read, write
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        # How it derives from its parent (an op and its static arguments): with the
        # parent's identity, what tells two DerivedRefs made alike apart from others.
        self.identity = (identity(parent), *how)

    @property
    def root(self) -> np.ndarray:
        """The array whose memory this ref reads and writes."""
        return self.parent.root if isinstance(self.parent, DerivedRef) else self.parent

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

        return DerivedRef(self, lambda a: a[idx], write, shape, self.dtype,
                          ("index", _static(idx)))

    def __setitem__(self, idx, val) -> None:
        full = np.array(self)
        full[idx] = val
        self.parent[...] = self.write(np.asarray(self.parent), full)

    def reshape(self, shape) -> DerivedRef:
        shape = tuple(int(s) for s in shape)
        return DerivedRef(self, lambda a: a.reshape(shape), lambda a, new: new.reshape(a.shape),
                          shape, self.dtype, ("reshape", shape))


def identity(ref) -> tuple:
    """What names the memory of ``ref`` (a numpy view or a :class:`DerivedRef`): the
    view's address and shape, or a DerivedRef's derivation from its root. Refs made
    alike (a DMA's destination at its start and at its wait) have equal identities."""
    if isinstance(ref, DerivedRef):
        return ref.identity
    return ("array", ref.__array_interface__["data"][0], tuple(ref.shape))


def _static(idx):
    """An indexer as comparable plain values (ints, slices' bounds, tuples)."""
    if isinstance(idx, tuple):
        return tuple(_static(i) for i in idx)
    if isinstance(idx, slice):
        return ("slice", *(None if v is None else int(v)
                           for v in (idx.start, idx.stop, idx.step)))
    if isinstance(idx, np.ndarray):
        return ("array", idx.shape, tuple(idx.ravel().tolist()))
    if idx is Ellipsis or idx is None:
        return idx
    return int(idx)
