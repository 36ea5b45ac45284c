"""Memrefs as strided descriptors over the flat memory: aligned address, offset, sizes
and strides (per-lane int64 arrays), and the element dtype from the type."""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxlib.mlir import ir

from pallas_mosaic_gpu._src.executor.types import FOUR_BIT, EmulationUnsupported, dtype_of

DYNAMIC = -9223372036854775808  # ShapedType.kDynamic


def elem_bytes(dt: np.dtype) -> int:
    """The bytes of one element of a memref of ``dt`` (4-bit elements, two a byte, have
    no address of their own: unsupported)."""
    if dt in FOUR_BIT:
        raise EmulationUnsupported("addressing the 4-bit elements of a memref one by one")
    return dt.itemsize


@dataclasses.dataclass
class MemRef:
    allocated: np.ndarray
    aligned: np.ndarray
    offset: np.ndarray
    sizes: list
    strides: list
    dtype: np.dtype

    @property
    def rank(self) -> int:
        return len(self.sizes)

    def element_offsets(self, indices) -> np.ndarray:
        """The element offset (per lane) of ``indices`` (one per dim)."""
        off = np.asarray(self.offset, np.int64)
        for i, s in zip(indices, self.strides):
            off = off + np.asarray(i, np.int64) * np.asarray(s, np.int64)
        return off

    def address(self, indices) -> np.ndarray:
        return np.asarray(self.aligned, np.int64) + self.element_offsets(indices) * \
            elem_bytes(self.dtype)

    def vector_addresses(self, indices, shape) -> np.ndarray:
        """Per-lane addresses ``(lanes, *shape)`` of a vector of ``shape`` starting at
        ``indices``, its dims running along the memref's trailing dims."""
        base = self.address(indices)
        k = len(shape)
        if k > self.rank:
            raise EmulationUnsupported(
                f"a vector of shape {shape} over a rank-{self.rank} memref")
        grid = np.zeros(shape, np.int64)
        for d, (n, s) in enumerate(zip(shape, self.strides[self.rank - k:])):
            s = int(np.asarray(s).reshape(-1)[0])
            ax = [1] * k
            ax[d] = n
            grid = grid + (np.arange(n, dtype=np.int64) * s).reshape(ax)
        return base.reshape(base.shape + (1,) * k) + grid[None] * elem_bytes(self.dtype)


def static_layout(t: ir.MemRefType):
    """``(strides, offset)`` of a memref type (None where dynamic)."""
    strides, offset = t.get_strides_and_offset()
    return ([None if s == DYNAMIC else s for s in strides],
            None if offset == DYNAMIC else offset)


def contiguous_strides(shape) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def mixed(static, dynamic) -> list:
    """Static values with the dynamic markers replaced by the dynamic operands in order."""
    dyn = iter(dynamic)
    return [next(dyn) if int(s) == DYNAMIC else np.asarray([int(s)], np.int64)
            for s in static]


def from_struct(struct, t) -> MemRef:
    """The memref of an LLVM memref descriptor ``(alloc, aligned, offset, sizes,
    strides)``."""
    t = ir.MemRefType(t)
    rank = len(t.shape)
    alloc, aligned, offset = struct[0], struct[1], struct[2]
    sizes = [struct[3][:, i] for i in range(rank)] if rank else []
    strides = [struct[4][:, i] for i in range(rank)] if rank else []
    return MemRef(alloc, aligned, offset, sizes, strides, dtype_of(t))


def to_struct(ref: MemRef):
    """The LLVM descriptor of ``ref`` (arrays of sizes/strides as ``(lanes, rank)``)."""
    fields = [ref.allocated, ref.aligned, ref.offset]
    if ref.rank:
        lanes = max(len(np.asarray(x)) for x in ref.sizes + ref.strides)
        fields.append(np.stack([np.broadcast_to(x, (lanes,)) for x in ref.sizes], -1))
        fields.append(np.stack([np.broadcast_to(x, (lanes,)) for x in ref.strides], -1))
    return tuple(fields)
