"""Buffers a kernel allocates: ``pl.run_scoped`` (and ``plgpu.kernel``'s scratch) and
``pallas_call`` scratch shapes.

Mosaic GPU takes a kernel's shared memory as one static tree, so every buffer is planned
before the body is emitted (:func:`plan`): each ``run_scoped`` equation, wherever it is
nested, gets its SMEM buffers (sharing bytes with scopes closed before it opens, see
:mod:`scoped_stack`) and its own mbarriers, initialised once at kernel start (a
barrier's phase then carries over between iterations of a loop around the scope, as the
hardware's does). ``plgpu.ACC`` accumulators live in registers (:class:`AccVal`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic import gpu as mgpu

from pallas import plugins
from pallas_mosaic_gpu._src.lowering import smem, threads, tmem
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.context import KernelError, unsupported
from pallas_mosaic_gpu._src.lowering.infer import wgmma_transforms
from pallas_mosaic_gpu._src.lowering.threads import Threads, per_thread
from pallas_mosaic_gpu._src.memory import AccumulatorSpace, BarrierSpace, MemorySpace

MAX_BARRIERS = 32  # per barrier array (Mosaic GPU tracks phases in one 32-bit word)


@dataclasses.dataclass
class BarrierVal:
    """An array of mbarriers (``plgpu.Barrier``) in the kernel, or one of them."""

    ref: Any  # mgpu.BarrierRef
    shape: tuple[int, ...]
    space: BarrierSpace


@dataclasses.dataclass
class AccVal:
    """A WGMMA accumulator (``plgpu.ACC``): its current value, replaced by each
    ``wgmma`` and carried through loops and branches (``rules_control``)."""

    acc: Any  # mgpu.WGMMAAccumulator
    shape: tuple[int, int]
    dtype: np.dtype


@dataclasses.dataclass(frozen=True)
class Planned:
    """One buffer: its entry in the SMEM tree (None: registers) and how the kernel
    sees it."""

    entry: Any
    kind: str  # "smem", "barrier", "acc", "tmem" or "sem" (a GMEM semaphore)
    shape: tuple[int, ...]
    dtype: Any
    tiling: tuple | None = None
    swizzle: int | None = None
    space: Any = None
    copies: int = 1  # one per warpgroup for per-warpgroup buffers (threads.per_thread)

    def per_warpgroup(self, n: int) -> Planned:
        """This buffer, once per warpgroup of ``n``."""
        if n == 1 or self.entry is None:
            return self
        if self.kind == "tmem":
            raise KernelError(
                f"plgpu.TMEM{self.shape} allocated by each of {n} warpgroups: TMEM belongs "
                "to the whole block in the mosaic_gpu lowering; allocate it with "
                "collective_axes=<thread axis> (or as plgpu.kernel scratch)")
        if self.kind == "barrier":
            total = self.entry.num_barriers * n
            if total > MAX_BARRIERS:
                raise KernelError(
                    f"{self.shape[0]} barriers per warpgroup x {n} warpgroups is more than "
                    f"{MAX_BARRIERS}; allocate them with collective_axes=<thread axis>")
            entry = dataclasses.replace(self.entry, num_barriers=total)
        else:
            entry = jax.ShapeDtypeStruct((n, *self.entry.shape), self.entry.dtype)
        return dataclasses.replace(self, entry=entry, copies=n)


def _space(t):
    return getattr(t, "memory_space", None)


def plan_type(t, what: str, kernel: str, target: str | None = None,
              cluster_names: tuple = ()) -> Planned:
    """How buffer type ``t`` (a ``MemoryRef``) is allocated (``cluster_names``: the
    kernel mesh's cluster axes); a clear error for types the lowering does not
    allocate."""
    space = _space(t)
    inner = getattr(t, "inner_aval", None)
    shape = tuple(getattr(t, "shape", None) or getattr(inner, "shape", ()))
    dtype = getattr(t, "dtype", None) or getattr(inner, "dtype", None)
    if isinstance(space, BarrierSpace):
        n = int(np.prod(shape))
        if len(shape) != 1 or n > MAX_BARRIERS:
            raise KernelError(
                f"{what}: plgpu.Barrier(num_barriers={shape if len(shape) > 1 else n}) — "
                f"the mosaic_gpu lowering takes a 1D array of at most {MAX_BARRIERS} "
                "barriers; allocate several Barrier scratch entries instead")
        if space.kind == "cluster_barrier":
            return Planned(_cluster_barrier(space, n, what, cluster_names), "barrier",
                           shape, None, space=space)
        return Planned(mgpu.Barrier(arrival_count=space.num_arrivals, num_barriers=n),
                       "barrier", shape, None, space=space)
    if plugins.is_semaphore_space(space):  # int32 words in GMEM (see collectives.py)
        return Planned(None, "sem", shape, np.dtype(np.int32), space=space)
    if space is AccumulatorSpace.WGMMA:
        dt = jnp.dtype(dtype)
        if dt not in (jnp.float32, jnp.float16, jnp.int32):
            raise KernelError(f"{what}: plgpu.ACC of dtype {dt.name}; valid: float32, "
                             "float16, int32")
        return Planned(None, "acc", shape, dt)
    if space is MemorySpace.TMEM:
        return _plan_tmem(t, shape, dtype, what, kernel, target)
    if str(getattr(space, "name", space) or "").lower() not in ("", "smem", "any"):
        raise unsupported(kernel, f"{what} in memory space {space}")
    if dtype is None:
        raise unsupported(kernel, f"{what} of type {type(t).__name__}")
    dt = jnp.dtype(dtype)
    if dt.itemsize > 4:
        raise unsupported(kernel, f"{what} of dtype {dt.name} (64-bit)")
    tiling, swizzle = smem.layout(tuple(getattr(t, "transforms", ())), shape, dt,
                                  f"{what} plgpu.SMEM{shape} {dt.name}")
    phys = smem.physical_shape(shape, tiling)
    return Planned(jax.ShapeDtypeStruct(phys, V.storage_dtype(dt)), "smem", shape, dt,
                   tiling, swizzle)


def _cluster_barrier(space: BarrierSpace, n: int, what: str, cluster_names: tuple):
    """Mosaic GPU's ``ClusterBarrier`` for a ``plgpu.ClusterBarrier``: each arrival
    reaches the barrier in every block of the cluster along ``collective_axes`` (or only
    the leader's, ``leader_tracked``), which expects arrivals from all of them."""
    dims = []
    for axes in space.collective_axes:
        d = threads.cluster_dims(cluster_names, axes, f"ClusterBarrier ({what})",
                                 "collective_axes")
        dims.append(d[0] if isinstance(axes, str) else d)
    return mgpu.ClusterBarrier(tuple(dims), space.num_arrivals, n,
                               orders_tensor_core=space.orders_tensor_core,
                               leader_tracked=space.leader_tracked)


def _plan_tmem(t, shape, dtype, what: str, kernel: str, target: str | None):
    """The ``Planned`` allocation of a ``plgpu.TMEM`` buffer type ``t``; a
    ``KernelError`` naming the buffer for shapes and dtypes TMEM cannot hold."""
    desc = f"{what}: plgpu.TMEM({tuple(shape)}, {jnp.dtype(dtype).name})"
    if target is not None and target != tmem.BLACKWELL:
        raise KernelError(
            f"{what}: plgpu.TMEM (tensor memory, for tcgen05_mma) is Blackwell-only "
            f"(sm_100a) but kernel {kernel} is compiled for {target}; on {target} use "
            "plgpu.wgmma with a plgpu.ACC accumulator")
    dt = jnp.dtype(dtype)
    if getattr(t, "layout", None) is not None:
        raise unsupported(kernel, f"{desc} with an explicit TMEM layout (block scales, "
                                  "sparse metadata)")
    if dt.name not in tmem.DTYPES:
        raise KernelError(f"{desc}: TMEM buffers hold {', '.join(tmem.DTYPES)} in the "
                          f"mosaic_gpu lowering, not {dt.name}")
    if len(shape) != 2 or shape[0] not in (tmem.ROWS, tmem.ROWS // 2):
        raise KernelError(
            f"{desc}: a TMEM buffer is 2D with {tmem.ROWS} rows (TMEM's lanes) or "
            f"{tmem.ROWS // 2}; got shape {tuple(shape)}")
    packing = 32 // (dt.itemsize * 8) if getattr(t, "packed", False) else 1
    if shape[1] % (8 * packing):
        raise KernelError(f"{desc}: the columns ({shape[1]}) must be a multiple of "
                          f"{8 * packing}")
    cols = tmem.columns(shape, dt, packing)
    if cols > tmem.MAX_COLS:
        raise KernelError(
            f"{desc} needs {cols} TMEM columns; TMEM has {tmem.MAX_COLS} (32-bit) columns per "
            f"block: use at most {tmem.MAX_COLS * packing} columns"
            + (" (or packed=True)" if dt.itemsize < 4 and packing == 1 else ""))
    entry = mgpu.TMEM(tuple(shape), dt, packing=packing,
                      collective=bool(getattr(t, "collective", False)))
    return Planned(entry, "tmem", tuple(shape), dt)


def plan(jaxpr, kernel: str, threads=None, target: str | None = None,
         infer: frozenset | set = frozenset(), cluster_names: tuple = ()) -> dict:
    """``{(id(run_scoped eqn), j): Planned}`` for every ``run_scoped`` in ``jaxpr``;
    the buffers in ``infer`` get the layout ``wgmma`` needs when declared without one
    (Warpgroup semantics, see :mod:`infer`)."""
    threads = threads or Threads()
    out: dict = {}

    def walk(j):
        for eqn in j.eqns:
            if eqn.primitive is plugins.run_scoped_p:
                n = threads.num if per_thread(eqn, threads) else 1
                for k, t in enumerate(eqn.params["types"]):
                    if (id(eqn), k) in infer:
                        t = wgmma_transforms(t)
                    out[(id(eqn), k)] = plan_type(
                        t, f"run_scoped buffer {k}", kernel, target,
                        cluster_names).per_warpgroup(n)
            for sub in jex.jaxprs_in_params(eqn.params):
                walk(getattr(sub, "jaxpr", sub))

    walk(jaxpr)
    return out


def value(p: Planned, allocated) -> Any:
    """The kernel's value for buffer ``p`` (``allocated``: its SMEM memref or BarrierRef)."""
    if p.copies > 1 and p.kind == "barrier":
        allocated = threads.own_barriers(allocated, p.shape[0])
    elif p.copies > 1 and p.kind == "smem":
        allocated = threads.own_slice(allocated)
    if p.kind == "barrier":
        return BarrierVal(allocated, p.shape, p.space)
    if p.kind == "tmem":
        return tmem.TmemVal(allocated, p.shape, p.dtype, bool(p.entry.collective))
    if p.kind == "sem":
        return allocated  # the RefVal of its words in the semaphore buffer
    if p.kind == "acc":
        m, n = p.shape
        zero = mgpu.WGMMAAccumulator.zero(m, n, V.elem_type(p.dtype),
                                          is_signed=True if p.dtype.kind == "i" else None)
        return AccVal(zero, (m, n), p.dtype)
    return smem.smem_ref(allocated, p.dtype, p.shape, p.tiling, p.swizzle)


def barrier_at(bar, flat, tree, fn: str):
    """The single mbarrier ``barrier.at[i]`` selects."""
    if not isinstance(bar, BarrierVal):
        raise TypeError(f"plgpu.{fn}: the barrier argument is not a plgpu.Barrier")
    sel = smem._transforms(flat, tree)
    ref, n = bar.ref, bar.shape[0]
    for t in sel:
        entries = smem._entries(t)
        if len(entries) != 1 or entries[0][0] != "index":
            raise NotImplementedError(f"plgpu.{fn}: barrier refs are indexed by one int")
        i = entries[0][1]
        if isinstance(i, int) and not 0 <= i < n:
            raise KernelError(f"plgpu.{fn}: barrier index {i} is out of range for "
                             f"plgpu.Barrier(num_barriers={n}); valid: 0..{n - 1}")
        ref, n = ref[i], 1
    if n != 1:
        raise KernelError(f"plgpu.{fn}: index the barrier array (num_barriers={n}), e.g. "
                         "barrier.at[i]")
    return ref
