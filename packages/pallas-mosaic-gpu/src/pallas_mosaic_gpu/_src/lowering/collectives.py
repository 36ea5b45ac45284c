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
"""

from __future__ import annotations

import dataclasses
import math

import jax.extend.core as jex
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, gpu, llvm

from pallas import DeviceIdType, plugins
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering import warps
from pallas_mosaic_gpu._src.lowering.engine import KernelError, Lit, RefVal, rule
from pallas_mosaic_gpu._src.lowering.rules_layout import hinted_layout
from pallas_mosaic_gpu._src.lowering.rules_refs import view
from pallas_mosaic_gpu._src.primitives import multimem as M
from pallas_mosaic_gpu._src.primitives import refs as R

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


def _i32(x):
    if isinstance(x, Lit):
        return V.const(int(np.asarray(x.val)), V.i32())
    if x.type != V.i32():
        return arith.index_cast(V.i32(), x) if ir.IndexType.isinstance(x.type) else x
    return x


def peer_id(lctx, device_id, device_id_type, what: str):
    """The device id (i32) a ``device_id`` argument names: a logical id, a mesh index
    (a scalar for a one-axis mesh), or ``{axis: index}`` (other axes: this device's)."""
    if lctx.jax_mesh is None:
        raise KernelError(
            f"{what} names another device, but the kernel is not inside a jax.shard_map "
            "over a mesh of several devices")
    names, sizes = lctx.jax_mesh
    if isinstance(device_id, dict):
        unknown = [a for a in device_id if a not in names]
        if unknown:
            raise KernelError(f"{what}: device_id names axes {unknown}, not axes of the "
                              f"mesh {names}")
        total = V.const(0, V.i32())
        for i, a in enumerate(names):
            idx = _i32(device_id[a]) if a in device_id else mesh_axis_index(lctx, a)
            stride = V.const(math.prod(sizes[i + 1:]), V.i32())
            total = arith.addi(total, arith.muli(idx, stride))
        return total
    if isinstance(device_id, (tuple, list)):
        if len(device_id) != 1:
            raise KernelError(f"{what}: device_id {len(device_id)} indices; give a dict "
                              "{axis: index} for a mesh of several axes")
        device_id = device_id[0]
    if device_id_type is DeviceIdType.MESH and len(names) != 1:
        raise KernelError(f"{what}: a scalar device_id on the mesh {names} of several "
                          "axes; give {axis: index} or device_id_type=LOGICAL")
    return _i32(device_id)


def split_peer(lctx, flat, tree, what: str):
    """``(flat, tree)`` of a ref's transforms without its ``plgpu.remote_ref`` one, and
    the device id (i32) that one names (None: this device's memory)."""
    import jax

    from pallas_mosaic_gpu._src.cluster import PeerMemRef

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


# -- rules -------------------------------------------------------------------------------


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
    mgpu.utils.SemaphoreRef(_ptr(m)).signal(_i32(inc), predicate=warps.issuer(lctx))
    return []


@rule(plugins.semaphore_wait_p)
def _semaphore_wait(lctx, eqn, sem, *rest):
    p = eqn.params
    n = p["tree"].num_leaves
    m = _sem_view(sem, rest[:n], p["tree"], "pl.semaphore_wait")
    mgpu.utils.SemaphoreRef(_ptr(m)).wait(_i32(rest[n]), decrement=p["decrement"])
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
    mgpu.utils.SemaphoreRef.signal_multimem(_ptr(mc.ref), _i32(ops[R.spec_end(spec)]))
    return []
