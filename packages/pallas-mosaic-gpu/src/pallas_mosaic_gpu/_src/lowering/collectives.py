"""Lowering of semaphores and of memory shared between devices.

Semaphores are int32 words in GMEM. The kernel takes one extra buffer, zeroed by the
caller at every launch and aliased to an extra output (dropped): each block owns a
region of it for its ``SemaphoreType`` scratch and ``run_scoped`` semaphores, and
``pl.get_global`` semaphores follow, one per call site, shared by the whole launch.
Signals and waits are Mosaic GPU's release/acquire atomics (``SemaphoreRef``).

Devices: inside ``jax.shard_map`` a kernel's GMEM operands are at the same place on
every device of the mesh; Mosaic GPU's collective metadata gives a peer's address of
them (``LaunchContext.to_remote``: ``pl.semaphore_signal(..., device_id=...)``,
``plgpu.remote_ref``) and their multicast address (``to_remote_multicast``:
``multimem_store``, ``multimem_load_reduce``, ``semaphore_signal_multicast``). The mesh
is the enclosing ``shard_map``'s; ``lax.axis_index`` of its axes reads the device id.

This module lays the semaphores out and addresses devices; the rules are in
:mod:`rules_collectives`.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.extend.core as jex
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, gpu

from pallas import DeviceIdType, plugins
from pallas_mosaic_gpu._src.cluster import PeerMemRef
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.context import KernelError, Lit, RefVal

SEM_DTYPE = np.dtype(np.int32)


@dataclasses.dataclass
class SemLayout:
    """Where each semaphore allocation lives in the semaphore buffer: key ->
    (``"block"`` or ``"global"``, offset in its region, shape)."""

    block_words: int = 0
    global_words: int = 0
    where: dict = dataclasses.field(default_factory=dict)

    def words(self, num_blocks: int) -> int:
        return self.block_words * num_blocks + self.global_words

    def add(self, key, scope: str, shape: tuple[int, ...]) -> None:
        n = max(1, math.prod(shape))
        if scope == "block":
            self.where[key] = (scope, self.block_words, shape)
            self.block_words += n
        else:
            self.where[key] = (scope, self.global_words, shape)
            self.global_words += n


def layout(scratch: list, scoped: dict, jaxpr) -> SemLayout:
    """The semaphore buffer of a kernel: its scratch and ``run_scoped`` semaphores
    (planned with kind ``"sem"``) per block, then its ``pl.get_global`` ones."""
    out = SemLayout()
    for i, p in enumerate(scratch):
        if p.kind == "sem":
            out.add(("scratch", i), "block", p.shape)
    for k, p in scoped.items():
        if p.kind == "sem":
            out.add(("scoped", *k), "block", p.shape)

    def walk(j):
        for eqn in j.eqns:
            if eqn.primitive is plugins.get_global_p:
                what = eqn.params["what"]
                if not plugins.is_semaphore_space(what.memory_space):
                    raise KernelError(
                        f"pl.get_global({what.memory_space}{tuple(what.shape)}): the "
                        "mosaic_gpu lowering allocates global semaphores only "
                        "(plgpu.SemaphoreType.REGULAR)")
                out.add(("global", id(eqn)), "global", tuple(what.shape))
            for sub in jex.jaxprs_in_params(eqn.params):
                walk(getattr(sub, "jaxpr", sub))

    walk(jaxpr)
    return out


def block_linear_id(cuda_grid: tuple[int, int, int]):
    """This block's index in the CUDA grid, x fastest (an ``index``)."""
    x, y, z = (gpu.block_id(d) for d in (gpu.Dimension.x, gpu.Dimension.y, gpu.Dimension.z))
    gx, gy = (V.const(n, V.index()) for n in cuda_grid[:2])
    return arith.addi(x, arith.muli(gx, arith.addi(y, arith.muli(gy, z))))


def semaphore_refs(sems: SemLayout, buf, cuda_grid) -> dict:
    """key -> the RefVal of each semaphore allocation, in the semaphore buffer ``buf``."""
    if not sems.where:
        return {}
    block = arith.muli(block_linear_id(cuda_grid), V.const(sems.block_words, V.index()))
    global_base = sems.block_words * math.prod(cuda_grid)
    out = {}
    for key, (scope, off, shape) in sems.where.items():
        n = max(1, math.prod(shape))
        start = (arith.addi(block, V.const(off, V.index())) if scope == "block"
                 else V.const(global_base + off, V.index()))
        flat = mgpu.memref_slice(buf, (mgpu.ds(start, n),))
        m = mgpu.memref_slice(flat, (0,)) if not shape else (
            flat if len(shape) == 1 else mgpu.memref_reshape(flat, shape))
        out[key] = RefVal(m, SEM_DTYPE, "gmem")
    return out


# -- devices -----------------------------------------------------------------------------


def mesh_axis_index(lctx, name):
    """``lax.axis_index(name)`` of an axis of the enclosing ``shard_map``'s mesh: this
    device's coordinate along it (device ids run over the mesh in row-major order)."""
    names, sizes = lctx.jax_mesh
    i = names.index(name)
    dev = lctx.launch_ctx.device_id()
    minor = V.const(math.prod(sizes[i + 1:]), V.i32())
    return arith.remui(arith.divui(dev, minor), V.const(sizes[i], V.i32()))


def as_i32(x):
    if isinstance(x, Lit):
        return V.const(int(np.asarray(x.val)), V.i32())
    if x.type != V.i32():
        return arith.index_cast(V.i32(), x) if ir.IndexType.isinstance(x.type) else x
    return x


def peer_id(lctx, device_id, device_id_type, what: str):
    """The device id (i32) a ``device_id`` argument names: a logical id, a mesh index
    (a scalar for a one-axis mesh), the device's mesh coordinates (a tuple, one per
    axis), or ``{axis: index}`` (other axes: this device's)."""
    if lctx.jax_mesh is None:
        raise KernelError(
            f"{what} names another device, but the kernel is not inside a jax.shard_map "
            "over a mesh of several devices")
    names, sizes = lctx.jax_mesh
    if isinstance(device_id, (tuple, list)) and len(device_id) == len(names) > 1:
        device_id = dict(zip(names, device_id))  # the coordinates, in the mesh's order
    if isinstance(device_id, dict):
        unknown = [a for a in device_id if a not in names]
        if unknown:
            raise KernelError(f"{what}: device_id names axes {unknown}, not axes of the "
                              f"mesh {names}")
        total = V.const(0, V.i32())
        for i, a in enumerate(names):
            idx = as_i32(device_id[a]) if a in device_id else mesh_axis_index(lctx, a)
            stride = V.const(math.prod(sizes[i + 1:]), V.i32())
            total = arith.addi(total, arith.muli(idx, stride))
        return total
    if isinstance(device_id, (tuple, list)):
        if len(device_id) != 1:
            raise KernelError(f"{what}: device_id has {len(device_id)} indices for the mesh "
                              f"{names}; give one per axis (its coordinates) or a dict "
                              "{axis: index}")
        device_id = device_id[0]
    if device_id_type is DeviceIdType.MESH and len(names) != 1:
        raise KernelError(f"{what}: a scalar device_id on the mesh {names} of several "
                          "axes; give {axis: index} or device_id_type=LOGICAL")
    return as_i32(device_id)


def split_peer(lctx, flat, tree, what: str):
    """``(flat, tree)`` of a ref's transforms without its ``plgpu.remote_ref`` one, and
    the device id (i32) that one names (None: this device's memory)."""
    transforms = jax.tree_util.tree_unflatten(tree, list(flat))
    peers = [t for t in transforms if isinstance(t, PeerMemRef)]
    if not peers:
        return flat, tree, None
    if len(peers) > 1:
        raise KernelError(f"{what}: a ref made remote twice (plgpu.remote_ref)")
    rest = [t for t in transforms if not isinstance(t, PeerMemRef)]
    flat, tree = jax.tree_util.tree_flatten(rest)
    t = peers[0]
    return flat, tree, peer_id(lctx, t.device_id, t.device_id_type, what)
