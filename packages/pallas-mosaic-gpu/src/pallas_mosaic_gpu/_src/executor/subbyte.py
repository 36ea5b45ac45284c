"""4-bit integers (``i4``) in the executor: a value holds one element per numpy item
(ml_dtypes' ``int4``); memory and bitcasts hold two per byte, element ``2k`` in the low
nibble of byte ``k`` (LLVM's bit order of a ``vector<Nxi4>``, and XLA's packing of int4
buffers)."""

from __future__ import annotations

import numpy as np

from pallas_mosaic_gpu._src.executor.types import FOUR_BIT, EmulationUnsupported

INT4, UINT4 = FOUR_BIT


def is_int4(dt) -> bool:
    return np.dtype(dt) in FOUR_BIT


def pack(values) -> np.ndarray:
    """The bytes of 4-bit ``values`` along their last axis (an even number of them)."""
    v = np.asarray(values)
    if v.shape[-1] % 2:
        raise EmulationUnsupported(f"packing an odd number ({v.shape[-1]}) of 4-bit elements")
    nib = v.astype(np.int8).astype(np.uint8) & 0xF
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)


def unpack(data, dtype=INT4) -> np.ndarray:
    """The 4-bit elements (``dtype``: int4 or uint4) of bytes ``data`` along their last
    axis, two per byte."""
    b = np.asarray(data).astype(np.uint8)
    nib = np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[:-1] + (2 * b.shape[-1],))
    if np.dtype(dtype) == UINT4:
        return nib.astype(UINT4)
    return ((nib.astype(np.int8) ^ 8) - 8).astype(INT4)


def to_bytes(values) -> np.ndarray:
    """A bitcast's view of ``values`` (thread axis first) as bytes, packing 4-bit ones."""
    v = np.ascontiguousarray(values)
    if is_int4(v.dtype):
        return pack(v.reshape(v.shape[0], -1))
    return v.view(np.uint8).reshape(v.shape[0], -1)


def from_bytes(data, dtype, shape) -> np.ndarray:
    """Bytes (thread axis first) as ``shape`` elements of ``dtype`` per thread."""
    d = np.ascontiguousarray(data).reshape(np.asarray(data).shape[0], -1)
    if is_int4(dtype):
        return unpack(d, dtype).reshape((d.shape[0],) + tuple(shape))
    return d.view(dtype).reshape((d.shape[0],) + tuple(shape))


def bitcast(x, dt, shape) -> np.ndarray:
    """``x`` (a batch of values, one per lane) reinterpreted as ``dt`` of ``shape`` each:
    int4 packs two to a byte."""
    return from_bytes(to_bytes(x), dt, shape)
