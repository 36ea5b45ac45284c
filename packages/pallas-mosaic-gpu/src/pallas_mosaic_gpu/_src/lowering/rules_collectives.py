"""Lowering rules of semaphores (``pl.semaphore_signal``/``wait``/``read``,
``pl.get_global``) and of memory shared between devices (``multimem_store``,
``multimem_load_reduce``, ``semaphore_signal_multicast``). The semaphore layout and the
addressing of devices are in :mod:`collectives`.
"""

from __future__ import annotations

import math

import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import llvm

from pallas import plugins
from pallas_mosaic_gpu._src.lowering import threads
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.collectives import as_i32, peer_id
from pallas_mosaic_gpu._src.lowering.engine import KernelError, RefVal, rule
from pallas_mosaic_gpu._src.lowering.register_layouts import hinted_layout
from pallas_mosaic_gpu._src.lowering.views import view
from pallas_mosaic_gpu._src.primitives import multimem as M
from pallas_mosaic_gpu._src.primitives import refs as R


def _ptr(m):
    return mgpu.utils.memref_ptr(m)


def _sem_view(sem, flat, tree, what: str):
    if not isinstance(sem, RefVal) or sem.space != "gmem":
        raise KernelError(f"{what}: expected a semaphore (plgpu.SemaphoreType scratch or "
                          "pl.get_global)")
    m = view(sem, flat, tree)
    if ir.MemRefType(m.type).shape:
        raise KernelError(f"{what}: signal or wait on one semaphore; index the array of "
                          f"shape {tuple(ir.MemRefType(m.type).shape)} with .at[i]")
    return m


@rule(plugins.get_global_p)
def _get_global(lctx, eqn):
    return lctx.sems[("global", id(eqn))]


@rule(plugins.semaphore_signal_p)
def _semaphore_signal(lctx, eqn, sem, *rest):
    p = eqn.params
    n = p["tree"].num_leaves
    flat, inc, devs = rest[:n], rest[n], rest[n + 1:]
    if p.get("has_core"):
        raise KernelError("pl.semaphore_signal(core_index=...): GPUs have no cores to name")
    m = _sem_view(sem, flat, p["tree"], "pl.semaphore_signal")
    if p["device_id_tree"].num_leaves:
        import jax

        device_id = jax.tree_util.tree_unflatten(p["device_id_tree"], list(devs))
        peer = peer_id(lctx, device_id, p["device_id_type"], "pl.semaphore_signal")
        m = lctx.launch_ctx.to_remote(m, peer)
    # One thread of the warpgroup (of the warp, in a plgpu.WarpMesh) signals.
    mgpu.utils.SemaphoreRef(_ptr(m)).signal(as_i32(inc), predicate=threads.scope_issuer(lctx))
    return []


@rule(plugins.semaphore_wait_p)
def _semaphore_wait(lctx, eqn, sem, *rest):
    p = eqn.params
    n = p["tree"].num_leaves
    m = _sem_view(sem, rest[:n], p["tree"], "pl.semaphore_wait")
    mgpu.utils.SemaphoreRef(_ptr(m)).wait(as_i32(rest[n]), decrement=p["decrement"])
    return []


@rule(plugins.semaphore_read_p)
def _semaphore_read(lctx, eqn, sem, *flat):
    m = _sem_view(sem, flat, eqn.params["tree"], "pl.semaphore_read")
    return llvm.inline_asm(V.i32(), [_ptr(m)], "ld.relaxed.sys.global.b32 $0, [$1];",
                           "=r,l", has_side_effects=True)


def _check_axes(lctx, eqn):
    """Multicast reaches every device of the mesh: ``collective_axes`` must be all its
    axes (Mosaic GPU's multicast object spans the whole mesh)."""
    name = f"plgpu.{M.NAMES[eqn.primitive]}"
    if lctx.jax_mesh is None:
        raise KernelError(f"{name}: the kernel is not inside a jax.shard_map over a mesh "
                          "of several devices")
    axes = tuple(eqn.params["collective_axes"])
    if set(axes) != set(lctx.jax_mesh[0]):
        raise KernelError(f"{name}(collective_axes={axes}): the mosaic_gpu lowering "
                          f"multicasts to the whole mesh; name all its axes "
                          f"{lctx.jax_mesh[0]}")


def _gmem_view(lctx, eqn, ref, flat, tree):
    if not isinstance(ref, RefVal) or ref.space != "gmem" or ref.transformed:
        raise KernelError(f"plgpu.{M.NAMES[eqn.primitive]}: ref must be a GMEM ref (a "
                          "kernel operand or output)")
    return view(ref, flat, tree)


def multimem_layout(shape, dtype):
    """A strided layout whose accesses multimem instructions can move: at most 128 bits
    (and, where the size allows, at least 32)."""
    bits = np.dtype(dtype).itemsize * 8
    per_thread = math.prod(shape) // V.WARPGROUP_SIZE
    vec = next(v for v in (8, 4, 2, 1) if per_thread % v == 0 and v * bits <= 128)
    return fa.WGStridedFragLayout(shape=tuple(shape), vec_size=vec)


@rule(M.multimem_store_p)
def _multimem_store(lctx, eqn, source, *ops):
    _check_axes(lctx, eqn)
    ((ref, flat, tree),) = R.unflatten(eqn.params["refs"], ops)
    m = _gmem_view(lctx, eqn, ref, flat, tree)
    aval = eqn.invars[0].aval
    value = V.array(source, aval)
    if not isinstance(value.layout, (fa.WGStridedFragLayout, fa.TiledLayout)):
        value = fa.FragmentedArray.splat(value.registers.item(), value.shape,
                                         multimem_layout(value.shape, aval.dtype),
                                         is_signed=value.is_signed) \
            if isinstance(value.layout, fa.WGSplatFragLayout) else V.to_strided(value)
    bits = lambda v: v.layout.vec_size * np.dtype(aval.dtype).itemsize * 8  # noqa: E731
    if isinstance(value.layout, fa.WGStridedFragLayout) and bits(value) > 128 \
            and id(value) in lctx.loaded_from:
        # Read from a ref at a wider vector than multimem moves: read it again narrower
        # (a thread cannot change its vector width without exchanging elements).
        _, src = lctx.loaded_from[id(value)]
        value = fa.FragmentedArray.load_strided(
            src, is_signed=value.is_signed,
            vec_size=multimem_layout(value.shape, aval.dtype).vec_size)
    if isinstance(value.layout, fa.WGStridedFragLayout):
        if not 32 <= bits(value) <= 128:
            raise KernelError(
                f"plgpu.multimem_store: source is held {value.layout.vec_size} "
                f"{np.dtype(aval.dtype).name} elements ({bits(value)} bits) per access; multimem "
                "stores move 32 to 128 bits: layout_cast it to plgpu.Layout.WG_STRIDED("
                f"{tuple(value.shape)}, vec_size={multimem_layout(value.shape, aval.dtype).vec_size})")
    value.store_untiled(lctx.launch_ctx.to_remote_multicast(m), optimized=False)
    return []


@rule(M.multimem_load_reduce_p)
def _multimem_load_reduce(lctx, eqn, *ops):
    _check_axes(lctx, eqn)
    p = eqn.params
    ((ref, flat, tree),) = R.unflatten(p["refs"], ops)
    m = _gmem_view(lctx, eqn, ref, flat, tree)
    shape = tuple(p["out_aval"].shape)
    dtype = np.dtype(p["out_aval"].dtype)
    layout = hinted_layout(lctx, eqn.outvars[0], shape) or multimem_layout(shape, dtype)
    return mgpu.FragmentedArray.load_reduce_untiled(
        lctx.launch_ctx.to_remote_multicast(m), layout, p["reduction_op"],
        is_signed=V.signed(dtype))


@rule(M.semaphore_signal_multicast_p)
def _semaphore_signal_multicast(lctx, eqn, *ops):
    _check_axes(lctx, eqn)
    spec = eqn.params["refs"]
    ((sem, flat, tree),) = R.unflatten(spec, ops)
    m = _sem_view(sem, flat, tree, "plgpu.semaphore_signal_multicast")
    mc = lctx.launch_ctx.to_remote_multicast(m)
    mgpu.utils.SemaphoreRef.signal_multimem(_ptr(mc.ref), as_i32(ops[R.spec_end(spec)]))
    return []
