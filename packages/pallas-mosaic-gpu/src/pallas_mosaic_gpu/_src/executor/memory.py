"""A flat, byte-addressed memory: GMEM operands, each block's SMEM, kernel parameters and
stack allocations are regions at distinct addresses, so pointers are plain int64s.

Regions are separated by unmapped gaps: an access outside every region (or straddling
one's end) is an :class:`EmulationError`, never a read of a neighbour.
"""

from __future__ import annotations

import bisect

import numpy as np

from pallas_mosaic_gpu._src.executor.types import EmulationError

_GAP = 1 << 16
_START = 1 << 20


class Region:
    __slots__ = ("base", "data", "name")

    def __init__(self, base: int, data: np.ndarray, name: str):
        self.base, self.data, self.name = base, data, name


class Memory:
    """Regions of bytes at addresses; loads and stores take per-thread address arrays."""

    def __init__(self):
        self._bases: list[int] = []
        self._regions: list[Region] = []
        self._next = _START

    def alloc(self, nbytes: int, name: str, fill: int = 0, align: int = 4096) -> int:
        """A new region of ``nbytes`` (filled with ``fill``) at an address that is a
        multiple of ``align``; returns its address."""
        base = -(-self._next // align) * align
        data = np.full(max(int(nbytes), 1), fill, np.uint8)
        self._bases.append(base)
        self._regions.append(Region(base, data, name))
        self._next = base + -(-len(data) // 4096) * 4096 + _GAP
        return base

    def put(self, array: np.ndarray, name: str) -> int:
        """A new region holding ``array``'s bytes (C order); returns its address."""
        base = self.alloc(array.nbytes, name)
        self.region_at(base).data[:] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        return base

    def free(self, base: int) -> None:
        i = self._bases.index(base)
        del self._bases[i], self._regions[i]

    def region_at(self, addr: int) -> Region:
        i = bisect.bisect_right(self._bases, int(addr)) - 1
        if i < 0 or int(addr) >= self._bases[i] + len(self._regions[i].data):
            raise EmulationError(f"access to unmapped address {int(addr):#x}")
        return self._regions[i]

    def read(self, base: int, shape, dtype) -> np.ndarray:
        """The array of ``shape``/``dtype`` stored at ``base`` (a copy)."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        r = self.region_at(base)
        off = base - r.base
        return r.data[off:off + n].copy().view(dtype).reshape(shape)

    def _locate(self, addrs: np.ndarray, nbytes: int) -> tuple[Region, np.ndarray]:
        flat = addrs.reshape(-1)
        lo, hi = int(flat.min()), int(flat.max())
        r = self.region_at(lo)
        if hi + nbytes > r.base + len(r.data):
            raise EmulationError(
                f"access of {nbytes} bytes at {hi:#x} falls outside {r.name} "
                f"[{r.base:#x}, {r.base + len(r.data):#x})")
        return r, addrs - r.base

    def gather(self, addrs: np.ndarray, dtype, mask=None) -> np.ndarray:
        """One element of ``dtype`` per address (``addrs`` of any shape). Masked-off
        lanes (``mask`` broadcasting against ``addrs``) read nothing and give 0."""
        dtype = np.dtype(dtype)
        addrs = np.asarray(addrs, np.int64)
        if mask is not None:
            shape = np.broadcast_shapes(addrs.shape, np.shape(mask))
            addrs, mask = np.broadcast_to(addrs, shape), np.broadcast_to(mask, shape)
            if not mask.any():
                return np.zeros(addrs.shape, dtype)
            addrs = np.where(mask, addrs, addrs[mask].reshape(-1)[0])
        r, off = self._locate(addrs, dtype.itemsize)
        idx = off[..., None] + np.arange(dtype.itemsize)
        out = r.data[idx].view(dtype)[..., 0]
        if mask is not None:
            out = np.where(mask, out, np.zeros((), dtype))
        return out

    def scatter(self, addrs: np.ndarray, values: np.ndarray, mask=None) -> None:
        """Stores ``values`` (one per address, broadcast to ``addrs``' shape) where
        ``mask`` is set."""
        addrs = np.asarray(addrs, np.int64)
        values = np.asarray(values)
        shape = np.broadcast_shapes(addrs.shape, values.shape,
                                    () if mask is None else np.shape(mask))
        addrs, values = np.broadcast_to(addrs, shape), np.broadcast_to(values, shape)
        if mask is not None:
            mask = np.broadcast_to(mask, shape)
            addrs, values = addrs[mask], values[mask]
        if addrs.size == 0:
            return
        itemsize = values.dtype.itemsize
        r, off = self._locate(addrs, itemsize)
        raw = np.ascontiguousarray(values).reshape(-1).view(np.uint8).reshape(-1, itemsize)
        idx = off.reshape(-1, 1) + np.arange(itemsize)
        r.data[idx] = raw
