"""Block copies between GMEM and SMEM: TMA where the hardware can, threads otherwise.

TMA needs every GMEM stride but the last to be a multiple of 16 bytes, at most 256
elements per block dimension and a minor block dimension of a multiple of 16 bytes.
Blocks that break a rule, and blocks with ``BoundedSlice`` dims (whose valid size is
only known at run time), are copied by the warpgroup's threads, one element each per
step, with edge elements outside the array, or past a bounded slice's size, skipped
(what the kernel reads there is unspecified, as in Pallas; TMA happens to give zeros).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax.experimental.mosaic import gpu as mgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, gpu, memref, scf

import pallas as pl
from pallas_mosaic_gpu._src.lowering import values as V

TMA_MAX_BOX = 256


def tma_can_copy(bm) -> bool:
    """Whether TMA can copy the blocks of ``bm``."""
    shape = tuple(bm.array_aval.shape)
    size = jnp.dtype(V.storage_dtype(bm.array_aval.dtype)).itemsize
    if not shape or len(shape) > 5:
        return False
    strides = [math.prod(shape[i + 1:]) * size for i in range(len(shape))]
    if any(s % 16 for s in strides[:-1]):
        return False
    if any(isinstance(d, pl.BoundedSlice) for d in bm.block_dims):
        return False  # a box has a static size; the threads copy the valid part
    box = [d.block_size for d in bm.block_dims if not isinstance(d, pl.Squeezed)]
    if not box or any(b > TMA_MAX_BOX for b in box):
        return False
    last = bm.block_dims[-1]
    return not isinstance(last, pl.Squeezed) and (last.block_size * size) % 16 == 0


def _c(v: int) -> ir.Value:
    return V.const(v, V.index())


def thread_copy(gmem: ir.Value, smem: ir.Value, bm, slices, to_smem: bool,
                bounds=None) -> None:
    """Copies one block element by element: thread ``t`` moves elements ``t, t + 128,
    ...`` of the block; elements outside the array are skipped, and so are those past
    the valid size of a ``BoundedSlice`` dim (``bounds``: per dim an ``index`` value or
    None), which the block holds but the kernel neither reads nor writes back."""
    array_shape = tuple(bm.array_aval.shape)
    starts, kept = [], []
    for d, s in zip(bm.block_dims, slices):
        if isinstance(d, pl.Squeezed):
            starts.append(s)
            kept.append(None)
        else:
            starts.append(s.base if isinstance(s, mgpu.DynamicSlice) else s.start)
            kept.append(d.block_size)
    block = [n for n in kept if n is not None]
    total = math.prod(block)
    tid = arith.remui(gpu.thread_id(gpu.Dimension.x), _c(V.WARPGROUP_SIZE))
    steps = -(-total // V.WARPGROUP_SIZE)
    loop = scf.ForOp(_c(0), _c(steps), _c(1))
    with ir.InsertionPoint(loop.body):
        flat = arith.addi(tid, arith.muli(loop.induction_variable, _c(V.WARPGROUP_SIZE)))
        ok = arith.cmpi(arith.CmpIPredicate.ult, flat, _c(total))
        local, gidx, j = [], [], 0
        strides = [math.prod(block[i + 1:]) for i in range(len(block))]
        for start, n, dim, bound in zip(starts, kept, array_shape,
                                        bounds or (None,) * len(starts)):
            start = start if isinstance(start, ir.Value) else _c(int(start))
            if n is None:
                gidx.append(start)
                continue
            i = arith.remui(arith.divui(flat, _c(strides[j])), _c(n))
            j += 1
            local.append(i)
            g = arith.addi(start, i)
            gidx.append(g)
            ok = arith.andi(ok, arith.cmpi(arith.CmpIPredicate.ult, g, _c(dim)))
            if bound is not None:
                ok = arith.andi(ok, arith.cmpi(arith.CmpIPredicate.ult, i, bound))
        if_op = scf.IfOp(ok)
        with ir.InsertionPoint(if_op.then_block):
            if to_smem:
                memref.store(memref.load(gmem, gidx), smem, local)
            else:
                memref.store(memref.load(smem, local), gmem, gidx)
            scf.YieldOp([])
        scf.YieldOp([])

