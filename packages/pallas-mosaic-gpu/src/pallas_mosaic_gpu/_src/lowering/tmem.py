"""Blackwell's tensor memory (``plgpu.TMEM``) in the lowering: allocation, views, and
``ref[...]`` loads and stores (``async_load_tmem``/``async_store_tmem``).

A TMEM buffer is a Mosaic GPU ``TMEM`` entry of the kernel's SMEM tree: Mosaic GPU
allocates its columns when the kernel starts (one warp, ``tcgen05.alloc``) and frees
them at the end; the kernel sees a ``tcgen05.TMEMRef`` (:class:`TmemVal`). TMEM has 128
lanes (rows) of at most 512 32-bit columns; a buffer has 128 rows (or 64) and its
columns are rounded up to a power of two, at least 32. Views slice columns only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import tcgen05

from pallas_mosaic_gpu._src.lowering import smem
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.context import KernelError

BLACKWELL = "sm_100a"
ROWS = tcgen05.TMEM_ROWS  # 128 lanes
MAX_COLS = tcgen05.TMEM_MAX_COLS  # 512 columns of 32 bits
DTYPES = ("float32", "int32", "float16", "bfloat16")


@dataclasses.dataclass
class TmemVal:
    """A TMEM ref in the kernel: Mosaic GPU's ``TMEMRef`` (an address and a layout)."""

    ref: Any  # tcgen05.TMEMRef
    shape: tuple[int, int]
    dtype: np.dtype
    collective: bool = False


def columns(shape, dtype, packing: int) -> int:
    """The TMEM columns a buffer takes (as Mosaic GPU allocates them)."""
    return max(32, 1 << (max(shape[1] // packing, 1) - 1).bit_length())


def view(tv: TmemVal, flat, tree, fn: str = "ref") -> TmemVal:
    """``tmem_ref.at[:, cols]``: a window of whole rows (TMEM is sliced along columns)."""
    ref, shape = tv.ref, tuple(tv.shape)
    for t in smem._transforms(flat, tree):
        entries = smem._entries(t)
        if len(entries) != 2 or entries[0] != ("slice", 0, shape[0]) or \
                entries[1][0] != "slice":
            raise KernelError(
                f"plgpu.{fn}: a TMEM ref {shape} can only be sliced along its columns "
                "(ref.at[:, pl.ds(start, size)]), keeping every row")
        _, start, size = entries[1]
        if isinstance(start, int) and (start % 8 or start + size > shape[1]):
            raise KernelError(
                f"plgpu.{fn}: TMEM column window [{start}, {start + size}) of a ref with "
                f"{shape[1]} columns must lie inside it and start at a multiple of 8")
        ref = ref.slice(slice(None), mgpu.ds(start, size))
        shape = (shape[0], size)
    return dataclasses.replace(tv, ref=ref, shape=shape)


def load(tv: TmemVal, flat, tree, aval):
    """``async_load_tmem(ref)``/``ref[...]``: TMEM into registers (tcgen05 layout)."""
    v = view(tv, flat, tree, "async_load_tmem")
    if v.shape[0] != ROWS:
        raise NotImplementedError(f"loading a TMEM ref of {v.shape[0]} rows (only {ROWS})")
    return v.ref.load(is_signed=V.signed(aval.dtype))


def store(tv: TmemVal, flat, tree, value, aval) -> None:
    """``async_store_tmem(ref, x)``/``ref[...] = x``: registers into TMEM."""
    v = view(tv, flat, tree, "async_store_tmem")
    if v.shape[0] != ROWS:
        raise NotImplementedError(f"storing a TMEM ref of {v.shape[0]} rows (only {ROWS})")
    if isinstance(value, mgpu.FragmentedArray) and value.layout == tcgen05.LAYOUT:
        arr = value
    else:
        x = V.array(value, aval)
        if not isinstance(x.layout, fa.WGSplatFragLayout):
            x = x.to_layout(tcgen05.LAYOUT) if isinstance(x.layout, fa.TiledLayout) else None
        if x is None:
            raise NotImplementedError(
                "storing into TMEM an array not in the tcgen05 register layout (store a "
                "scalar, or a value loaded from TMEM)")
        if isinstance(x.layout, fa.WGSplatFragLayout):
            x = mgpu.FragmentedArray.splat(x.registers.item(), tuple(v.shape),
                                           tcgen05.LAYOUT, is_signed=x.is_signed)
        arr = x
    v.ref.store(arr)
