"""Lowering rules of plgpu's TMA copies, fences and mbarriers.

``copy_gmem_to_smem`` is one TMA load (``LaunchContext.async_copy``) issued by one
thread of the warpgroup, which also arrives on the barrier expecting the copy's bytes
(one arrival per copy, the ``num_arrivals`` of ``plgpu.Barrier`` count them); the
warpgroup first synchronises, so no thread still reads the slot being overwritten.
``copy_smem_to_gmem`` is a TMA store joining the thread's bulk group;
``wait_smem_to_gmem`` waits on bulk groups; ``commit_smem`` fences SMEM writes for the
async proxy. ``barrier_arrive`` is one arrival per warpgroup (after it synchronises);
``barrier_wait`` waits for the phase this thread has not seen yet.
"""

from __future__ import annotations

import math

import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu.launch_context import TileTransform
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, nvvm

from pallas_mosaic_gpu._src.lowering import collectives, smem, threads
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import KernelError, Lit, RefVal, rule
from pallas_mosaic_gpu._src.lowering.scoped import barrier_at
from pallas_mosaic_gpu._src.primitives import refs as R
from pallas_mosaic_gpu._src.primitives.barriers import barrier_arrive_p, barrier_wait_p
from pallas_mosaic_gpu._src.primitives.copies import (
    commit_group_p,
    commit_smem_p,
    copy_gmem_to_smem_p,
    copy_smem_to_gmem_p,
    wait_smem_to_gmem_p,
)
from pallas_mosaic_gpu._src.primitives.hints import async_prefetch_p

TMA_MAX_BOX = 256


def _check_tma(fn: str, gmem: RefVal, window, dst: RefVal, arg: str):
    """Trace-time errors for windows TMA cannot move, naming the argument."""
    full = tuple(ir.MemRefType(gmem.memref.type).shape)
    size = np.dtype(V.storage_dtype(gmem.dtype)).itemsize
    name = np.dtype(gmem.dtype).name
    strides = [math.prod(full[i + 1:]) * size for i in range(len(full))]
    if any(s % 16 for s in strides[:-1]):
        raise KernelError(
            f"plgpu.{fn}: {arg} is a GMEM array of shape {full} {name} whose strides "
            f"{tuple(strides)} (bytes) are not all multiples of 16 but the minor one; TMA "
            "needs 16-byte aligned rows (pad the minor dim to a multiple of "
            f"{16 // math.gcd(16, size)} elements)")
    shape = smem.window_shape(window)
    if shape and isinstance(window[-1], mgpu.DynamicSlice) and (shape[-1] * size) % 16:
        raise KernelError(
            f"plgpu.{fn}: the {arg} window {shape} of the GMEM array {full} {name} has a "
            f"minor dim of {shape[-1] * size} bytes; TMA copies blocks whose minor dim is "
            f"a multiple of 16 bytes ({16 // math.gcd(16, size)} elements of {name})")
    box = smem.physical_shape(shape, dst.tiling) if dst.tiling else shape
    if dst.tiling is None and any(d > TMA_MAX_BOX for d in box):
        raise KernelError(
            f"plgpu.{fn}: the {arg} window {shape} has a dim over {TMA_MAX_BOX} elements, "
            f"more than one TMA copy moves; split the copy, or tile the SMEM buffer "
            f"(plgpu.TilingTransform) so each tile dim is at most {TMA_MAX_BOX}")
    if len(shape) > 5 and dst.tiling is None:
        raise KernelError(f"plgpu.{fn}: the {arg} window {shape} has more than 5 dims; TMA "
                         "copies at most 5")


def _copy(lctx, fn, **kwargs):
    try:
        lctx.launch_ctx.async_copy(**kwargs)
    except (ValueError, NotImplementedError) as e:
        raise KernelError(f"plgpu.{fn}: TMA cannot do this copy: {e}") from e


def _transform(d: RefVal):
    return TileTransform(tuple(d.tiling)) if d.tiling else ()


def _own_part(lctx, window, leader, dims):
    """The window one block of a partitioned copy (``CopyPartition.PARTITIONED(axis)``)
    loads: the CTA pair's window split evenly along ``axis``."""
    axis = getattr(leader, "axis", None)
    if axis is None:
        return window
    n = int(np.prod([lctx.launch_ctx.cluster_size[d] for d in dims]))
    if int(np.prod(lctx.launch_ctx.cluster_size)) != 2:
        raise KernelError(
            f"plgpu.copy_gmem_to_smem(leader_tracked=CopyPartition.PARTITIONED({axis})): "
            "partitioned copies split a copy across a CTA pair, a cluster of 2 blocks; "
            f"the kernel's cluster is {tuple(lctx.launch_ctx.cluster_size)} (x, y, z)")
    sliced = [i for i, w in enumerate(window) if isinstance(w, mgpu.DynamicSlice)]
    if axis >= len(sliced) or window[sliced[axis]].length % n:
        raise KernelError(
            f"plgpu.copy_gmem_to_smem(leader_tracked=CopyPartition.PARTITIONED({axis})): "
            f"the src window {smem.window_shape(window)} must have a dim {axis} divisible "
            f"by the {n} blocks it is split across")
    i = sliced[axis]
    w = window[i]
    return (*window[:i], mgpu.DynamicSlice(w.base, w.length // n), *window[i + 1:])


@rule(copy_gmem_to_smem_p)
def _gmem_to_smem(lctx, eqn, *ops):
    p = eqn.params
    (src, sflat, stree), (dst, dflat, dtree), bar = R.unflatten(p["refs"], ops)
    if src.space != "gmem" or dst.space != "smem":
        raise KernelError("plgpu.copy_gmem_to_smem: src must be a GMEM ref (plgpu.GMEM "
                         f"memory space) and dst an SMEM ref; got {src.space} -> {dst.space}")
    window = smem.gmem_window(src, sflat, stree)
    d = smem.view(dst, dflat, dtree)
    dims = threads.cluster_dims(lctx.cluster_names, p["collective_axes"],
                                "copy_gmem_to_smem", "collective_axes")
    leader = p["leader_tracked"]
    _check_tma("copy_gmem_to_smem", src, _own_part(lctx, window, leader, dims), d, "src")
    barrier = barrier_at(*bar, "copy_gmem_to_smem")
    if isinstance(barrier, mgpu.utils.CollectiveBarrierRef):
        barrier = barrier.barrier  # TMA arrives through the copy's own collective mode
    if not lctx.synced:  # no thread still reads the destination
        threads.scope_sync(lctx)
        lctx.synced = True
    _copy(lctx, "copy_gmem_to_smem", src_ref=src.memref, dst_ref=d.memref, gmem_slice=window,
          gmem_transform=_transform(d), swizzle=d.swizzle, barrier=barrier,
          collective=dims or None, leader_tracked=leader,
          oob_mode=p["oob_mode"], predicate=threads.scope_issuer(lctx))
    return []


@rule(async_prefetch_p)
def _prefetch(lctx, eqn, *ops):
    """``async_prefetch``: one thread of the warpgroup asks TMA to bring the GMEM window
    into L2 (``cp.async.bulk.prefetch.tensor``); nothing waits for it."""
    p = eqn.params
    ((src, sflat, stree),) = R.unflatten(p["refs"], ops)
    if src.space != "gmem":
        raise KernelError(f"plgpu.async_prefetch: the ref must be a GMEM ref (plgpu.GMEM "
                          f"memory space); got {src.space}")
    window = smem.gmem_window(src, sflat, stree)
    dims = threads.cluster_dims(lctx.cluster_names, p["collective_axes"],
                                "async_prefetch", "collective_axes")
    try:
        lctx.launch_ctx.async_prefetch(
            gmem_ref=src.memref, gmem_slice=window, collective=dims or None,
            leader_tracked=p["leader_tracked"], predicate=threads.scope_issuer(lctx))
    except (ValueError, NotImplementedError) as e:
        raise KernelError(f"plgpu.async_prefetch: TMA cannot prefetch this window: {e}") from e
    return []


@rule(copy_smem_to_gmem_p)
def _smem_to_gmem(lctx, eqn, *ops):
    p = eqn.params
    (src, sflat, stree), (dst, dflat, dtree) = R.unflatten(p["refs"], ops)
    if src.space != "smem" or dst.space != "gmem":
        raise KernelError("plgpu.copy_smem_to_gmem: src must be an SMEM ref and dst a GMEM "
                         f"ref; got {src.space} -> {dst.space}")
    s = smem.view(src, sflat, stree)
    dflat, dtree, peer = collectives.split_peer(lctx, dflat, dtree, "plgpu.copy_smem_to_gmem")
    window = smem.gmem_window(dst, dflat, dtree)
    _check_tma("copy_smem_to_gmem", dst, window, s, "dst")
    pred = threads.scope_issuer(lctx)
    if p["has_predicate"]:
        user = ops[R.spec_end(p["refs"])]
        user = V.const(bool(np.asarray(user.val)), ir.IntegerType.get_signless(1)) \
            if isinstance(user, Lit) else V.scalar(user, None)
        pred = arith.andi(pred, user)
    _copy(lctx, "copy_smem_to_gmem", src_ref=s.memref, dst_ref=dst.memref, gmem_slice=window,
          gmem_transform=_transform(s), swizzle=s.swizzle, arrive=p["commit_group"],
          predicate=pred, reduction_op=p["reduction_op"], gmem_peer_id=peer)
    return []


@rule(commit_smem_p)
def _commit_smem(lctx, eqn):
    nvvm.fence_proxy(nvvm.ProxyKind.async_shared, space=nvvm.SharedSpace.shared_cta)
    threads.scope_sync(lctx)
    return []


@rule(commit_group_p)
def _commit_group(lctx, eqn):
    nvvm.cp_async_bulk_commit_group()
    return []


@rule(wait_smem_to_gmem_p)
def _wait_smem_to_gmem(lctx, eqn):
    scope = mgpu.ThreadSubset.WARP if threads.in_warp(lctx) else mgpu.ThreadSubset.WARPGROUP
    lctx.launch_ctx.await_async_copy(eqn.params["n"],
                                     await_read_only=eqn.params["wait_read_only"],
                                     scope=scope)
    return []


@rule(barrier_arrive_p)
def _barrier_arrive(lctx, eqn, *ops):
    ((bar, flat, tree),) = R.unflatten(eqn.params["refs"], ops)
    ref = barrier_at(bar, flat, tree, "barrier_arrive")
    if isinstance(ref, mgpu.utils.CollectiveBarrierRef):  # plgpu.ClusterBarrier
        if threads.in_warp(lctx):
            raise NotImplementedError(
                "plgpu.barrier_arrive on a plgpu.ClusterBarrier inside a plgpu.WarpMesh "
                "(Mosaic GPU's cluster arrivals are issued by a whole warpgroup)")
        ref.arrive(orders_tensor_core=bar.space.orders_tensor_core)  # syncs the warpgroup
        return []
    if not lctx.synced:  # the warpgroup's (or warp's) work before the arrival is done
        threads.scope_sync(lctx)
        lctx.synced = True
    ref.arrive(predicate=threads.scope_issuer(lctx),
               orders_tensor_core=bar.space.orders_tensor_core)
    return []


@rule(barrier_wait_p)
def _barrier_wait(lctx, eqn, *ops):
    ((bar, flat, tree),) = R.unflatten(eqn.params["refs"], ops)
    ref = barrier_at(bar, flat, tree, "barrier_wait")
    ref.wait(orders_tensor_core=bar.space.orders_tensor_core)
    return []
