"""Kernels over a ``plgpu.Mesh`` (``plgpu.kernel``/``pl.kernel``): blocks and threads.

The mesh's grid axes are the CUDA grid; its thread axis (``num_threads`` warpgroups of
128 CUDA threads) is the warpgroup index within the block, so ``lax.axis_index`` of it
is ``thread_id / 128`` and ``pl.when`` on it specialises warpgroups. Buffers a
``run_scoped`` allocates without the thread axis in ``collective_axes`` are per
warpgroup (one copy each); with it, shared by the block.

A mesh's cluster axes (``cluster=``/``cluster_names=``) launch clusters of blocks:
cluster axis ``j`` is CUDA dimension ``j`` (x, y, z), the CUDA grid is the block grid
times the cluster along each dimension, and ``lax.axis_index`` of a cluster axis is the
block's index in its cluster (``%cluster_ctaid``).

Inside ``pl.core_map(plgpu.WarpMesh(...))`` (:mod:`warps`) the lowering is in warp
scope: :func:`scope_issuer` and :func:`scope_sync` then issue and synchronise per warp.
The rules (``lax.axis_index``, ``set_max_registers``) are in :mod:`rules_threads`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

from jax.experimental.mosaic import gpu as mgpu
from jaxlib.mlir.dialects import arith, nvvm

from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.context import KernelError


@dataclasses.dataclass(frozen=True)
class Threads:
    """The thread structure of a kernel: warpgroups per block and the mesh axis that
    indexes them (None: one warpgroup, a ``pallas_call`` grid)."""

    num: int = 1
    axis: int | None = None
    name: str | None = None


def threads_of(gm, kernel: str) -> Threads:
    mesh = getattr(gm, "mesh", None)
    if mesh is None or not hasattr(mesh, "thread_name"):
        return Threads()
    if mesh.thread_name is None:
        return Threads()
    names = tuple(gm.grid_names or ())
    return Threads(int(mesh.num_threads), names.index(mesh.thread_name), mesh.thread_name)


MAX_CLUSTER_BLOCKS = 16  # sm_90a/sm_100a (8 is the portable size; 16 needs opting in)


def cluster_of(gm, kernel: str) -> tuple[tuple[int, int, int], tuple[str, ...]]:
    """The cluster shape (x, y, z) of a mesh kernel and its axis names (axis ``j`` is
    CUDA dimension ``j``); a ``KernelError`` naming ``cluster`` for shapes CUDA cannot
    launch."""
    mesh = getattr(gm, "mesh", None)
    shape = tuple(int(c) for c in getattr(mesh, "cluster", ()) or ())
    if not shape:
        return (1, 1, 1), ()
    if any(c < 1 for c in shape) or math.prod(shape) > MAX_CLUSTER_BLOCKS:
        raise KernelError(
            f"plgpu.Mesh(cluster={shape}) in kernel {kernel}: a cluster has 1 to "
            f"{MAX_CLUSTER_BLOCKS} blocks (sizes >= 1, product <= {MAX_CLUSTER_BLOCKS})")
    return (*shape, *(1,) * (3 - len(shape))), tuple(mesh.cluster_names)


def grid_axes(gm, threads: Threads, cluster_names: tuple = ()
              ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(CUDA grid axes, axes run as loops) of a mesh kernel: every axis but the
    thread and cluster axes is a block axis (at most three of them on the CUDA grid)."""
    names = tuple(gm.grid_names or ())
    skip = {names.index(n) for n in cluster_names}
    axes = [i for i in range(len(gm.grid)) if i != threads.axis and i not in skip]
    par = [i for i in axes if gm.grid[i] > 1][:3]
    return tuple(par), tuple(i for i in axes if i not in par)


def per_thread(eqn, threads: Threads) -> bool:
    """Whether ``run_scoped`` ``eqn`` allocates one copy per warpgroup."""
    return threads.num > 1 and threads.name not in tuple(eqn.params["collective_axes"])


@dataclasses.dataclass(frozen=True)
class _Entry:
    """Values computed once at the kernel's entry (which dominates all of its body)."""

    warpgroup: object  # this thread's warpgroup index (i32), or None: one warpgroup
    issuer: object  # i1: this thread issues its warpgroup's single-thread operations


_ENTRY: list = []  # the _Entry of the kernel being emitted


def warpgroup() -> object:
    """This thread's warpgroup index in the block (i32, uniform across the warp):
    computed once at the kernel's entry (one ``shfl.sync``) and reused."""
    if _ENTRY and _ENTRY[-1].warpgroup is not None:
        return _ENTRY[-1].warpgroup
    return mgpu.utils.warpgroup_idx(sync=True)


def issuer() -> object:
    """The predicate of the one thread per warpgroup that issues a single-thread operation
    (a TMA copy, a barrier arrival, a store of values all threads hold): computed once at
    the kernel's entry and reused, as upstream does, since each fresh
    ``mgpu.single_thread_predicate`` broadcasts the warp index again (a ``shfl.sync``)."""
    if _ENTRY:
        return _ENTRY[-1].issuer
    return mgpu.single_thread_predicate(mgpu.ThreadSubset.WARPGROUP)


@contextlib.contextmanager
def entry_values(threads: Threads):
    """While a kernel is emitted, its warpgroup index (kernels of several warpgroups)
    and issuing thread are the values computed here, at the top of the kernel body."""
    wg = mgpu.utils.warpgroup_idx(sync=True) if threads.num > 1 else None
    _ENTRY.append(_Entry(wg, mgpu.single_thread_predicate(mgpu.ThreadSubset.WARPGROUP)))
    try:
        yield
    finally:
        _ENTRY.pop()


def scope_issuer(lctx):
    """The predicate of the one thread that issues a single-thread operation in the
    current scope (of the warpgroup, or of the warp)."""
    if lctx.scope == "warp":  # the warp's elected lane (no warp-index broadcast needed)
        return mgpu.single_thread_predicate(mgpu.ThreadSubset.WARP)
    return issuer()


def scope_sync(lctx) -> None:
    """Synchronises the threads running the current scope (the warpgroup, or the warp)."""
    if lctx.scope == "warp":
        nvvm.bar_warp_sync(V.const(-1, V.i32()))
    else:
        mgpu.warpgroup_barrier()


def in_warp(lctx) -> bool:
    return lctx.scope == "warp"


def own_slice(memref):
    """This warpgroup's part of a per-warpgroup buffer (leading dim = warpgroups)."""
    return mgpu.memref_slice(memref, arith.index_cast(V.index(), warpgroup()))


def own_barriers(ref, n: int):
    """This warpgroup's ``n`` barriers of a per-warpgroup barrier array."""
    off = arith.muli(warpgroup(), V.const(n, V.i32()))
    return dataclasses.replace(ref, offset=arith.addi(ref.offset, off), num_barriers=n)


def cluster_dims(names: tuple, axes, fn: str, arg: str) -> tuple:
    """The CUDA dimensions (``gpu.Dimension``) of cluster axes ``axes`` of a mesh whose
    cluster axes are ``names``; a ``KernelError`` naming ``arg`` for other names."""
    from jaxlib.mlir.dialects import gpu

    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    out = []
    for a in axes:
        if a not in names:
            raise KernelError(
                f"plgpu.{fn}({arg}={a!r}): {a!r} is not a cluster axis of the kernel's "
                f"mesh; its cluster axes are {tuple(names)} (plgpu.kernel(cluster=..., "
                "cluster_names=...))")
        out.append(gpu.Dimension(names.index(a)))
    return tuple(out)


def check_pair(lctx, axis: str, fn: str, arg: str):
    """The cluster dimension of a CTA-pair operation along ``axis``: Mosaic GPU's
    2-CTA tensor-core ops need a cluster of exactly 2 blocks along x."""
    (dim,) = cluster_dims(lctx.cluster_names, axis, fn, arg)
    shape = tuple(lctx.launch_ctx.cluster_size)
    if shape != (2, 1, 1):
        raise KernelError(
            f"plgpu.{fn}({arg}={axis!r}): CTA-pair (2-CTA) tensor-core operations need a "
            f"cluster of 2 blocks along the first cluster axis, cluster=(2,); the kernel's "
            f"cluster is {shape[:len(lctx.cluster_names)]}")
    return dim
