"""Lowering rules of Blackwell's tensor-core matmul (sm_100a): ``tcgen05_mma``,
``tcgen05_commit_arrive``, ``async_copy_smem_to_tmem`` and the TMEM fences
``commit_tmem``/``wait_load_tmem``.

``tcgen05_mma(acc, a, b, barrier, accumulate=...)`` is Mosaic GPU's ``tcgen05.mma``
issued by one thread of the warpgroup (of the warp, in a ``plgpu.WarpMesh``): ``acc`` a TMEM ref (``tmem.TmemVal``), ``a``
an SMEM ref (tiled ``(8, swizzle // itemsize)`` and swizzled, as for ``wgmma``) or a
TMEM ref, ``b`` an SMEM ref; with a barrier, the same thread then commits (the barrier
completes when every MMA issued so far has). ``tcgen05_commit_arrive`` is that commit
alone. Everything here exists on sm_100a only: asking for it on sm_90a is an error
naming the target.
"""

from __future__ import annotations

import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import tcgen05
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import nvvm

from pallas_mosaic_gpu._src.lowering import smem, threads
from pallas_mosaic_gpu._src.lowering import tmem as T
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import KernelError, Lit, RefVal, rule
from pallas_mosaic_gpu._src.lowering.mma import BLACKWELL, check_target, operand
from pallas_mosaic_gpu._src.lowering.scoped import barrier_at
from pallas_mosaic_gpu._src.primitives import refs as R
from pallas_mosaic_gpu._src.primitives.hints import commit_tmem_p, wait_load_tmem_p
from pallas_mosaic_gpu._src.primitives.mma import tcgen05_mma_p
from pallas_mosaic_gpu._src.primitives.tmem import copy_smem_to_tmem_p, tcgen05_commit_arrive_p


def _flag(x) -> ir.Value | bool:
    if isinstance(x, Lit):
        return bool(np.asarray(x.val))
    return V.scalar(x, None)


def _acc(acc, flat, tree, fn: str) -> T.TmemVal:
    if not isinstance(acc, T.TmemVal):
        raise KernelError(f"plgpu.{fn}: acc must be a TMEM ref (plgpu.TMEM scratch or "
                          "pl.run_scoped buffer)")
    return T.view(acc, flat, tree, fn)


def _check_mma(fn, acc: T.TmemVal, a_dtype, b: RefVal):
    """Trace-time errors for shapes and dtypes the tensor cores cannot take."""
    m, n = acc.shape
    dt, acc_dt = np.dtype(b.dtype), np.dtype(acc.dtype)
    if np.dtype(a_dtype) != dt:
        raise KernelError(f"plgpu.{fn}: a is {np.dtype(a_dtype).name} but b is {dt.name}")
    if m not in (64, 128):
        raise KernelError(f"plgpu.{fn}: acc has {m} rows; tcgen05 MMAs have M = 128 (or 64)")
    if dt.name in ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
        ok = ("float32",) if dt.name == "bfloat16" else ("float32", "float16")
    elif dt.name == "float32":
        ok = ("float32",)
    elif dt.name == "int8":
        ok = ("int32",)
    else:
        raise KernelError(f"plgpu.{fn}: operands of dtype {dt.name}; valid: float16, "
                          "bfloat16, float32 (tf32), float8_e4m3fn, float8_e5m2, int8")
    if acc_dt.name not in ok:
        raise KernelError(f"plgpu.{fn}: a {dt.name} matmul accumulates into "
                          f"{' or '.join(ok)} TMEM, but acc is {acc_dt.name}")
    if n % 8 or n > 512 or (n > 256 and n != 512):
        raise KernelError(f"plgpu.{fn}: N = {n} (acc {acc.shape}); tcgen05 MMAs take N a "
                          "multiple of 8 up to 256, or 512")


@rule(tcgen05_mma_p)
def _tcgen05_mma(lctx, eqn, *ops):
    check_target(lctx, "tcgen05_mma", BLACKWELL)
    spec = eqn.params["refs"]
    axis = eqn.params.get("collective_axis")
    pair = axis is not None
    if pair:
        threads.check_pair(lctx, axis, "tcgen05_mma", "collective_axis")
    if len(spec) > 4:
        raise NotImplementedError("plgpu.tcgen05_mma with a_scale/b_scale (block-scaled "
                                  "MMA): the mosaic_gpu lowering does not emit it yet")
    (acc, aflat, atree), a, (b, bflat, btree), bar = R.unflatten(spec, ops)[:4]
    acc = _acc(acc, aflat, atree, "tcgen05_mma")
    if pair != acc.collective:
        raise KernelError(
            f"plgpu.tcgen05_mma(collective_axis={axis!r}): acc is a plgpu.TMEM with "
            f"collective={acc.collective}; a CTA-pair MMA (collective_axis) accumulates "
            "into collective TMEM (plgpu.TMEM(..., collective=True)) and a one-block MMA "
            "into non-collective TMEM")
    bv = smem.view(b, bflat, btree)
    bm, b_swizzle = operand(bv, "b", "tcgen05_mma")
    if isinstance(a[0], T.TmemVal):
        av = T.view(*a, "tcgen05_mma")
        am, a_swizzle, a_dtype = av.ref, b_swizzle, av.dtype
    else:
        av = smem.view(*a)
        am, a_swizzle = operand(av, "a", "tcgen05_mma")
        a_dtype = av.dtype
    _check_mma("tcgen05_mma", acc, a_dtype, bv)
    accumulate = _flag(ops[R.spec_end(spec)])
    barrier = barrier_at(*bar, "tcgen05_mma") if bar is not None else None
    with mgpu.when(threads.scope_issuer(lctx)):
        try:
            tcgen05.mma(acc.ref, am, bm, a_swizzle=a_swizzle, b_swizzle=b_swizzle,
                        accumulate=accumulate, collective=pair)
        except (ValueError, NotImplementedError) as e:
            raise KernelError(
                f"plgpu.tcgen05_mma: acc {acc.shape} {np.dtype(acc.dtype).name}, b "
                f"{bv.shape} {np.dtype(bv.dtype).name}: the tensor cores cannot do this "
                f"MMA: {e}") from e
        if barrier is not None:
            _commit(lctx, barrier, pair)
    return []


def _commit(lctx, barrier, pair: bool) -> None:
    """``tcgen05.commit`` to ``barrier``: in this block, or (CTA pair) multicast to the
    barrier at the same offset in both blocks of the pair."""
    if isinstance(barrier, mgpu.utils.CollectiveBarrierRef):
        barrier = barrier.barrier
    tcgen05.commit_arrive(barrier, collective=pair, ctx=lctx.launch_ctx if pair else None)


@rule(tcgen05_commit_arrive_p)
def _commit_arrive(lctx, eqn, *ops):
    check_target(lctx, "tcgen05_commit_arrive", BLACKWELL)
    ((bar, flat, tree),) = R.unflatten(eqn.params["refs"], ops)
    axis = eqn.params.get("collective_axis")
    if axis is not None:
        threads.check_pair(lctx, axis, "tcgen05_commit_arrive", "collective_axis")
    barrier = barrier_at(bar, flat, tree, "tcgen05_commit_arrive")
    with mgpu.when(threads.scope_issuer(lctx)):
        _commit(lctx, barrier, axis is not None)
    return []


@rule(copy_smem_to_tmem_p)
def _smem_to_tmem(lctx, eqn, *ops):
    check_target(lctx, "async_copy_smem_to_tmem", BLACKWELL)
    p = eqn.params
    if p["kind"] != "smem" or p["collective_axis"] is not None:
        raise NotImplementedError(f"plgpu.async_copy_{p['kind']}_to_tmem"
                                  + (" with collective_axis" if p["collective_axis"] else ""))
    (s, sflat, stree), (d, dflat, dtree) = R.unflatten(p["refs"], ops)
    sv = smem.view(s, sflat, stree)
    dv = _acc(d, dflat, dtree, "async_copy_smem_to_tmem")
    # The SMEM buffer is tiled (8, swizzle // itemsize) as for an MMA operand; without a
    # SwizzleTransform its 16-byte rows are unswizzled, which tcgen05.cp calls 16.
    swizzle = sv.swizzle if sv.swizzle is not None else 16
    with mgpu.when(threads.scope_issuer(lctx)):
        try:
            tcgen05.async_copy_smem_to_tmem(sv.memref, dv.ref, swizzle)
        except (ValueError, NotImplementedError) as e:
            raise KernelError(f"plgpu.async_copy_smem_to_tmem: SMEM {sv.shape} -> TMEM "
                              f"{dv.shape}: {e}") from e
    return []


# The TMEM waits: ``commit_tmem`` waits for the thread's TMEM stores, ``wait_load_tmem``
# for its TMEM loads; each then synchronises the scope.
_TMEM_WAITS = {commit_tmem_p: ("commit_tmem", nvvm.Tcgen05WaitKind.STORE),
               wait_load_tmem_p: ("wait_load_tmem", nvvm.Tcgen05WaitKind.LOAD)}


@rule(*_TMEM_WAITS)
def _tmem_wait(lctx, eqn):
    fn, kind = _TMEM_WAITS[eqn.primitive]
    check_target(lctx, fn, BLACKWELL)
    nvvm.tcgen05_wait(kind)
    threads.scope_sync(lctx)
    lctx.synced = True  # a barrier arrival right after needs no synchronisation again
    return []
