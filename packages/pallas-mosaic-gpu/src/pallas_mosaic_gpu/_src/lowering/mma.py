"""Tensor-core helpers shared by the ``wgmma`` and ``tcgen05_mma`` rules and by ref reads
and writes: the target an instruction needs, an MMA operand's tiled and swizzled SMEM
memref, and reading or writing a ``plgpu.ACC`` accumulator (``acc[...]``).
"""

from __future__ import annotations

import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jaxlib.mlir.dialects import nvvm

from pallas_mosaic_gpu._src.lowering import smem
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.context import KernelError, RefVal
from pallas_mosaic_gpu._src.lowering.scoped import AccVal

HOPPER, BLACKWELL = "sm_90a", "sm_100a"


def check_target(lctx, fn: str, want: str) -> None:
    if lctx.target is not None and lctx.target != want:
        family = "Hopper" if want == HOPPER else "Blackwell"
        other = "plgpu.tcgen05_mma with TMEM accumulators" if want == HOPPER else \
            "plgpu.wgmma with plgpu.ACC accumulators"
        raise KernelError(
            f"plgpu.{fn} is a {family}-only instruction ({want}) but kernel {lctx.name} "
            f"is compiled for {lctx.target}; on {lctx.target} use {other}")


def operand(ref: RefVal, arg: str, fn: str = "wgmma"):
    """The tiled, swizzled SMEM memref of a wgmma/tcgen05_mma operand, and its swizzle."""
    if not isinstance(ref, RefVal) or ref.space != "smem":
        space = ref.space if isinstance(ref, RefVal) else type(ref).__name__
        raise KernelError(f"plgpu.{fn}: {arg} must be an SMEM ref, got a {space} ref")
    itemsize = np.dtype(ref.dtype).itemsize
    want = "TilingTransform((8, S)), SwizzleTransform(B) with B in (32, 64, 128) and S = " \
           f"B // {itemsize} (the {np.dtype(ref.dtype).name} elements of one swizzled row)"
    if ref.swizzle is None or ref.tiling is None or len(ref.tiling) != 2:
        raise KernelError(
            f"plgpu.{fn}: {arg} (SMEM {ref.shape} {np.dtype(ref.dtype).name}) must be "
            f"tiled and swizzled for the tensor cores; give its buffer transforms={want}; "
            f"got tiling={ref.tiling}, swizzle={ref.swizzle}")
    s = ref.swizzle // itemsize
    if sorted(ref.tiling) != sorted((8, s)):
        raise KernelError(
            f"plgpu.{fn}: {arg} is tiled by {ref.tiling} with SwizzleTransform"
            f"({ref.swizzle}); {fn} needs tiles of (8, {s}) for that swizzle ({want})")
    return ref.memref, ref.swizzle


def _whole(flat, shape, what):
    for t in smem._transforms(flat[1], flat[2]) if flat else ():
        entries = smem._entries(t)
        if any(e != ("slice", 0, d) for e, d in zip(entries, shape)):
            raise NotImplementedError(f"{what} a slice of a plgpu.ACC accumulator")


def read_acc(acc: AccVal, flat, tree):
    """``acc[...]``: the accumulator's value (WGMMA layout), once every wgmma group in
    flight has completed (``wgmma.wait_group 0``, as upstream's accumulator read): PTX
    leaves the registers undefined until then (ptxas would inject the wait itself, at
    the first use, after code that may already reuse the operands' SMEM)."""
    _whole((None, flat, tree), acc.shape, "reading")
    nvvm.wgmma_wait_group_sync_aligned(0)
    return acc.acc.value


def write_acc(acc: AccVal, value, aval, flat, tree):
    """``acc[...] = value`` (an array in the WGMMA layout, or a scalar)."""
    _whole((None, flat, tree), acc.shape, "writing")
    if isinstance(value, mgpu.FragmentedArray) and value.layout == fa.WGMMA_LAYOUT:
        arr = value
    else:
        x = V.array(value, aval)
        if not isinstance(x.layout, fa.WGSplatFragLayout):
            raise NotImplementedError(
                "writing a plgpu.ACC accumulator from an array not in the WGMMA layout "
                "(write a scalar, or a value computed from an accumulator)")
        arr = mgpu.FragmentedArray.splat(x.registers.item(), acc.shape, fa.WGMMA_LAYOUT,
                                         is_signed=x.is_signed)
    acc.acc = mgpu.WGMMAAccumulator.from_registers(arr)
