"""Kernels over a ``plgpu.Mesh`` (``plgpu.kernel``/``pl.kernel``): blocks and threads.

The mesh's grid axes are the CUDA grid; its thread axis (``num_threads`` warpgroups of
128 CUDA threads) is the warpgroup index within the block, so ``lax.axis_index`` of it
is ``thread_id / 128`` and ``pl.when`` on it specialises warpgroups. Buffers a
``run_scoped`` allocates without the thread axis in ``collective_axes`` are per
warpgroup (one copy each); with it, shared by the block. Clusters are not lowered yet.
"""

from __future__ import annotations

import contextlib
import dataclasses

from jax.experimental.mosaic import gpu as mgpu
from jaxlib.mlir.dialects import arith, nvvm

from pallas import plugins
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import rule, unsupported
from pallas_mosaic_gpu._src.primitives.hints import set_max_registers_p


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
    if any(int(c) > 1 for c in mesh.cluster):
        raise unsupported(kernel, f"a plgpu.Mesh with cluster={tuple(mesh.cluster)} "
                                  "(clusters and cluster barriers)")
    if mesh.thread_name is None:
        return Threads()
    names = tuple(gm.grid_names or ())
    return Threads(int(mesh.num_threads), names.index(mesh.thread_name), mesh.thread_name)


def grid_axes(gm, threads: Threads) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(CUDA grid axes, axes run as loops) of a mesh kernel: every axis but the
    thread axis is a block axis (at most three of them on the CUDA grid)."""
    axes = [i for i in range(len(gm.grid)) if i != threads.axis]
    par = [i for i in axes if gm.grid[i] > 1][:3]
    return tuple(par), tuple(i for i in axes if i not in par)


def per_thread(eqn, threads: Threads) -> bool:
    """Whether ``run_scoped`` ``eqn`` allocates one copy per warpgroup."""
    return threads.num > 1 and threads.name not in tuple(eqn.params["collective_axes"])


_ENTRY: list = []  # the warpgroup index computed at the kernel's entry, while emitting it


def warpgroup() -> object:
    """This thread's warpgroup index in the block (i32, uniform across the warp):
    computed once at the kernel's entry (one ``shfl.sync``) and reused."""
    if _ENTRY:
        return _ENTRY[-1]
    return mgpu.utils.warpgroup_idx(sync=True)


@contextlib.contextmanager
def entry_warpgroup(threads: Threads):
    """While a kernel of several warpgroups is emitted, its warpgroup index is the value
    computed here, at the top of the kernel body (which dominates all of it)."""
    if threads.num <= 1:
        yield
        return
    _ENTRY.append(mgpu.utils.warpgroup_idx(sync=True))
    try:
        yield
    finally:
        _ENTRY.pop()


def own_slice(memref):
    """This warpgroup's part of a per-warpgroup buffer (leading dim = warpgroups)."""
    return mgpu.memref_slice(memref, arith.index_cast(V.index(), warpgroup()))


def own_barriers(ref, n: int):
    """This warpgroup's ``n`` barriers of a per-warpgroup barrier array."""
    off = arith.muli(warpgroup(), V.const(n, V.i32()))
    return dataclasses.replace(ref, offset=arith.addi(ref.offset, off), num_barriers=n)


@rule(plugins.axis_index_p)
def _axis_index(lctx, eqn):
    name = eqn.params["axis_name"]
    names = lctx.axis_names
    if isinstance(name, tuple) and len(name) == 1:
        name = name[0]
    if name in lctx.inner_axes:  # a plgpu.WarpMesh's axis (warps.py)
        return lctx.inner_axes[name]
    if name not in names:
        raise NotImplementedError(f"lax.axis_index({name!r}) of an axis that is not one of "
                                  f"the kernel mesh's {names}")
    return lctx.program_ids[names.index(name)]


@rule(set_max_registers_p)
def _set_max_registers(lctx, eqn):
    action = nvvm.SetMaxRegisterAction.increase if eqn.params["action"] == "increase" \
        else nvvm.SetMaxRegisterAction.decrease
    nvvm.setmaxregister(eqn.params["n"], action)
    return []
