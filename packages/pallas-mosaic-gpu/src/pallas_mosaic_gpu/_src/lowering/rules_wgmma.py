"""Lowering rules of Hopper's tensor-core matmul: ``wgmma``, ``wgmma_wait`` and the
``plgpu.ACC`` accumulator (read with ``acc[...]``, written with ``acc[...] = x``).

``wgmma(acc, a, b)`` is Mosaic GPU's ``wgmma``: ``a`` and ``b`` are SMEM refs tiled by
``(8, swizzle // itemsize)`` and swizzled (``b`` possibly ``transpose_ref``-ed), or
``a`` a value in registers; it issues and commits one wgmma group. Reading the
accumulator gives an array in the WGMMA register layout. ``wgmma`` exists on sm_90a
only, ``tcgen05_mma`` on sm_100a only: asking for the other is an error naming the
target. The shared helpers (operands, accumulator reads and writes) are in :mod:`mma`.
"""

from __future__ import annotations

from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jaxlib.mlir.dialects import nvvm

from pallas_mosaic_gpu._src.lowering import smem
from pallas_mosaic_gpu._src.lowering.engine import KernelError, rule
from pallas_mosaic_gpu._src.lowering.mma import HOPPER, check_target, operand
from pallas_mosaic_gpu._src.lowering.scoped import AccVal
from pallas_mosaic_gpu._src.primitives import refs as R
from pallas_mosaic_gpu._src.primitives.mma import wgmma_p, wgmma_wait_p


@rule(wgmma_p)
def _wgmma(lctx, eqn, *ops):
    check_target(lctx, "wgmma", HOPPER)
    spec = eqn.params["refs"]
    (acc, aflat, atree), a, (b, bflat, btree) = R.unflatten(spec, ops)[:3]
    if not isinstance(acc, AccVal):
        raise KernelError("plgpu.wgmma: acc must be a plgpu.ACC accumulator allocated with "
                         "pl.run_scoped")
    if aflat:
        raise NotImplementedError("plgpu.wgmma into a slice of an accumulator")
    bm, swizzle = operand(smem.view(b, bflat, btree), "b")
    if a is None:
        a_val = ops[R.spec_end(spec)]
        if not isinstance(a_val, mgpu.FragmentedArray) or \
                a_val.layout != fa.WGMMA_LAYOUT:
            raise NotImplementedError(
                "plgpu.wgmma with a in registers needs it in the WGMMA layout (e.g. "
                "computed from an accumulator); pass an SMEM ref instead")
        am = a_val
    else:
        am, a_swizzle = operand(smem.view(*a), "a")
        if a_swizzle != swizzle:
            raise KernelError(f"plgpu.wgmma: a is swizzled by {a_swizzle} bytes but b by "
                             f"{swizzle}; both operands need the same SwizzleTransform")
    acc.acc = mgpu.wgmma(acc.acc, am, bm, swizzle=swizzle)
    nvvm.wgmma_commit_group_sync_aligned()
    return []


@rule(wgmma_wait_p)
def _wgmma_wait(lctx, eqn):
    check_target(lctx, "wgmma_wait", HOPPER)
    nvvm.wgmma_wait_group_sync_aligned(int(eqn.params["n"]))
    return []
