"""Builds the Mosaic GPU kernel of a ``pallas_call``: one warpgroup per CUDA block.

The grid is split in two. Axes that every output's index map uses are *parallel*: they
become the CUDA grid (at most three; any further ones run as loops). The others are
*sequential* (reduction axes, whose output blocks are revisited): each CUDA block runs
them as a loop nest in grid order, so revisits happen in order, as on any GPU backend.
``CompilerParams.dimension_semantics`` overrides the split.

Each step copies the input blocks GMEM -> SMEM with TMA (one barrier per input), runs
the kernel body on the SMEM blocks, then copies the output blocks SMEM -> GMEM with TMA.
TMA clips edge blocks that overhang the array (zero-filled on load, dropped on store).
Operands in ``plgpu.GMEM`` (or ``pl.ANY``) are passed whole, as GMEM refs.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re

import jax
import jax.extend.core as jex
import jax.extend.core.primitives as P
import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.interpreters import mlir as jmlir
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, gpu, scf

import pallas as pl
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.lowering import collectives, smem, smem_budget
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.aliases import aliased_fn
from pallas_mosaic_gpu._src.lowering.copies import thread_copy, tma_can_copy
from pallas_mosaic_gpu._src.lowering.engine import (
    KernelError,
    Lit,
    LoweringContext,
    MosaicGpuLoweringError,
    RefVal,
    is_elementwise,
    lower_jaxpr,
    unsupported,
)
from pallas_mosaic_gpu._src.lowering.infer import wgmma_buffers, wgmma_transforms
from pallas_mosaic_gpu._src.lowering.scoped import plan, plan_type, value
from pallas_mosaic_gpu._src.lowering.scoped_stack import buffer, plan_stack
from pallas_mosaic_gpu._src.lowering.smem_tree import aligned, size_and_alignment
from pallas_mosaic_gpu._src.lowering.spill import reduces, spill_buffers
from pallas_mosaic_gpu._src.lowering.threads import (
    cluster_of,
    entry_values,
    grid_axes,
    issuer,
    own_slice,
    threads_of,
    warpgroup,
)
from pallas_mosaic_gpu._src.lowering.tmem_alloc import TmemAddress
from pallas_mosaic_gpu._src.lowering.tmem_alloc import allocate as allocate_tmem
from pallas_mosaic_gpu._src.lowering.tmem_alloc import free as free_tmem
from pallas_mosaic_gpu._src.lowering.tmem_alloc import plan as plan_tmem

ENV_TARGET = "PALLAS_MOSAIC_GPU_TARGET"
MAX_CUDA_GRID_AXES = 3
REDUCTION_SCRATCH_BYTES = 2048


@dataclasses.dataclass
class Kernel:
    """A lowered kernel: the function that binds Mosaic GPU's custom call, and facts
    about it for reports and tests."""

    fn: object  # jitted: binds mosaic_gpu_p (the ``mosaic_gpu_v2`` custom call)
    in_shapes: tuple  # what ``fn`` takes (bool operands as int8)
    out_shapes: tuple
    name: str
    cuda_grid: tuple[int, int, int]
    sequential_axes: tuple[int, ...]
    smem_bytes: int
    primitives: frozenset
    sem_words: int = 0  # the zeroed semaphore buffer ``fn`` takes last (and returns last)
    aliases: tuple = ()  # (input, output) pairs sharing one GMEM buffer (see aliases.py)

    @property
    def arg_shapes(self) -> tuple:
        """What ``fn`` takes: ``in_shapes``, then the semaphore buffer when it has one."""
        if not self.sem_words:
            return self.in_shapes
        return (*self.in_shapes, _sds((self.sem_words,), jnp.int32))


def _kernel_symbol(name: str) -> str:
    s = re.sub(r"\W", "_", name or "kernel")
    return s if s[:1].isalpha() else f"k_{s}"


def _space_name(space) -> str | None:
    s = str(getattr(space, "name", space) or "").lower()
    return s or None


def _is_gmem(bm) -> bool:
    """Whether the operand is passed whole, as a GMEM ref (``plgpu.GMEM``/``pl.ANY``)."""
    return _space_name(bm.memory_space) in ("gmem", "any", "hbm")


def _uses_axis(index_map_jaxpr, axis: int) -> bool:
    """Whether the block index depends on grid axis ``axis``: the axis's variable reaches
    an output of the index map. Dead equations do not count (an index map remapped
    onto a reversed grid computes ``n - 1 - k`` for every axis, used or not); an
    equation with a sub-jaxpr counts as using all its operands."""
    jaxpr = index_map_jaxpr.jaxpr
    live = {id(o) for o in jaxpr.outvars if not isinstance(o, jex.Literal)}
    for e in reversed(jaxpr.eqns):
        if any(id(o) in live for o in e.outvars):
            live.update(id(i) for i in e.invars if not isinstance(i, jex.Literal))
    return id(jaxpr.invars[axis]) in live


def split_grid(gm, params) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(parallel axes, sequential axes) of the grid."""
    n = len(gm.grid)
    sems = getattr(params, "dimension_semantics", None)
    if sems is not None:
        if len(sems) != n:
            raise ValueError(
                f"plgpu.CompilerParams(dimension_semantics={tuple(sems)}) names "
                f"{len(sems)} axes but the grid {gm.grid} has {n}")
        par = [i for i in range(n) if sems[i] == "parallel"]
    else:
        outs = [bm for bm in gm.out_block_mappings if not _is_gmem(bm)]
        par = [i for i in range(n)
               if all(_uses_axis(bm.index_map_jaxpr, i) for bm in outs)
               and not any(_is_gmem(bm) for bm in gm.out_block_mappings)]
    par = [i for i in par if gm.grid[i] > 1][:MAX_CUDA_GRID_AXES]
    seq = [i for i in range(n) if i not in par]
    return tuple(par), tuple(seq)


def _sds(shape, dtype):
    """The buffer of an operand or scratch (bool is stored as int8)."""
    return jax.ShapeDtypeStruct(tuple(shape), V.storage_dtype(dtype))


def _check_dtype(aval, what: str, name: str):
    dt = jnp.dtype(aval.dtype)
    if dt.itemsize > 4:
        raise unsupported(name, f"{what} of dtype {dt.name} (64-bit operands; Mosaic GPU "
                                "kernels take 32-bit and narrower)")


def _smem_block_shape(bm) -> tuple[int, ...]:
    return tuple(bm.ref_shape)


def _block_layout(bm, by_tma: bool, name: str):
    """(tiling, swizzle) of a block's SMEM buffer from its ``plgpu.BlockSpec(transforms=
    ...)``; (None, None) without transforms. Only TMA copies lay a block out so."""
    if not bm.transforms:
        return None, None
    what = f"the plgpu.BlockSpec of {bm.origin} in kernel {name}"
    layout = smem.layout(bm.transforms, _smem_block_shape(bm), bm.array_aval.dtype, what)
    if not by_tma:
        raise KernelError(
            f"{what}: transforms={bm.transforms} need the block copied by TMA, which "
            f"cannot copy it (block {bm.block_shape} of array {bm.array_aval.shape}: "
            "each dim's bytes a multiple of 16, boxes of at most 256 per dim, no "
            "BoundedSlice); drop the transforms or change the block")
    return layout


def _tma_layout(layout) -> dict:
    tiling, swizzle = layout
    out = {}
    if tiling is not None:
        out["gmem_transform"] = mgpu.TileTransform(tuple(tiling))
    if swizzle is not None:
        out["swizzle"] = swizzle
    return out


def _block_slices(lctx, bm, program_ids):
    """The GMEM window of the block at the current step: ``mgpu.ds`` per blocked dim,
    an index per squeezed dim; and per dim the valid size of a ``BoundedSlice`` dim
    (an ``index`` value; None for other dims)."""
    cj = bm.index_map_jaxpr
    ilctx = LoweringContext(lctx.launch_ctx, lctx.grid, program_ids,
                            f"index_map of {bm.origin} in {lctx.name}")
    outs = iter(lower_jaxpr(ilctx, cj.jaxpr, cj.consts, list(program_ids)))
    slices, bounds = [], []
    for d in bm.block_dims:
        o = next(outs)
        bound = None
        if isinstance(d, pl.BoundedSlice):  # pl.ds(start, size): two outputs
            size = next(outs)
            bound = (V.const(int(size.val), V.index()) if isinstance(size, Lit)
                     else arith.index_cast(V.index(), size))
        bounds.append(bound)
        scale = d.block_size if isinstance(d, pl.Blocked) else 1
        if isinstance(o, Lit):
            start = V.const(int(o.val) * scale, V.index())
        else:
            start = arith.index_cast(V.index(), o)
            if scale != 1:
                start = arith.muli(start, V.const(scale, V.index()))
        if isinstance(d, pl.Squeezed):
            slices.append(start)
        else:
            slices.append(mgpu.ds(start, d.block_size))
    return tuple(slices), tuple(bounds)


def target_of(target: str | None) -> str | None:
    """The compile target: given, or the emulated GPU's (``PALLAS_EMULATE_DEVICE``), or
    ``PALLAS_MOSAIC_GPU_TARGET``, or unknown (None)."""
    if target:
        return target
    from pallas.plugins import emulated_device

    dev = emulated_device()
    if dev is not None and dev.platform == "cuda" and dev.target in ("sm_90a", "sm_100a"):
        return dev.target
    return os.environ.get(ENV_TARGET) or None


def semantics_of(params) -> str:
    """``"lane"`` or ``"warpgroup"``: how the kernel asked to be read
    (``CompilerParams.lowering_semantics``). A kernel is the same warpgroup-level array
    program under both, which is what this engine lowers (arrays held by the
    warpgroup, scalars uniform across it); upstream differs only in how it gets there
    (``FragmentedArray`` rules against the ``mosaic_gpu`` dialect and layout
    inference), so both lower here alike. See docs/mosaic-gpu.md."""
    sem = getattr(params, "lowering_semantics", None)
    name = getattr(sem, "name", sem)
    if name in (None, "Lane"):
        return "lane"
    if name == "Warpgroup":
        return "warpgroup"
    raise ValueError(f"plgpu.CompilerParams(lowering_semantics={sem!r}): expected "
                     "plgpu.LoweringSemantics.Lane or plgpu.LoweringSemantics.Warpgroup")


_BUILT: collections.OrderedDict = collections.OrderedDict()  # the latest builds
_BUILT_KEEP = 8


def build(jaxpr, gm, params, name: str, target: str | None = None,
          jax_mesh=None) -> Kernel:
    """Lowers the kernel jaxpr and grid mapping to a Mosaic GPU kernel (for ``target``,
    ``"sm_90a"``/``"sm_100a"``, when known: target-specific instructions are checked;
    ``jax_mesh``: the device mesh of an enclosing ``shard_map``, whose devices the kernel
    may address, see collectives.py).

    A kernel is built at trace time (the backend's ``validate``, so what cannot lower
    fails there) and again when the call is lowered, from the same jaxpr and grid
    mapping objects: the latest builds are kept, keyed by those objects themselves
    (which compare by identity), and the second is served from them; lowering is
    deterministic."""
    # What the kernel takes of the mesh: its axes, and the devices of a concrete one (a
    # trace-time check has an abstract one; single-device kernels take nothing).
    mesh_axes = _mesh_axes(jax_mesh)
    uses = jax_mesh if mesh_axes and isinstance(jax_mesh, jax.sharding.Mesh) else mesh_axes
    try:
        key = (jaxpr, gm, params, name, target_of(target), uses)
        hash(key)
    except TypeError:  # params holding something unhashable: no reuse
        return _build(jaxpr, gm, params, name, target, jax_mesh)
    hit = _BUILT.get(key)
    if hit is not None:
        _BUILT.move_to_end(key)
        return hit
    kernel = _build(jaxpr, gm, params, name, target, jax_mesh)
    _BUILT[key] = kernel
    while len(_BUILT) > _BUILT_KEEP:
        _BUILT.popitem(last=False)
    return kernel


def _mesh_axes(jax_mesh):
    """(axis names, sizes) of a mesh of several devices, else None."""
    if jax_mesh is not None and not jax_mesh.empty and jax_mesh.size > 1:
        return tuple(jax_mesh.axis_names), tuple(int(s) for s in jax_mesh.axis_sizes)
    return None


def _build(jaxpr, gm, params, name: str, target: str | None, jax_mesh) -> Kernel:
    if gm.num_scalar_prefetch:
        raise unsupported(name, "scalar prefetch (PrefetchScalarGridSpec)")
    semantics = semantics_of(params)
    threads = threads_of(gm, name)
    cluster, cluster_names = (1, 1, 1), ()
    if getattr(gm, "mesh", None) is not None and hasattr(gm.mesh, "thread_name"):
        cluster, cluster_names = cluster_of(gm, name)
        par, seq = grid_axes(gm, threads, cluster_names)
    else:
        par, seq = split_grid(gm, params)
    blocks = tuple(gm.grid[i] for i in par) + (1,) * (3 - len(par))
    cuda_grid = tuple(b * c for b, c in zip(blocks, cluster))  # clusters tile the grid
    ins, outs = gm.in_block_mappings, gm.out_block_mappings
    for bm in gm.block_mappings:
        _check_dtype(bm.array_aval, f"operand {bm.origin}", name)
    in_shapes = tuple(_sds(bm.array_aval.shape, bm.array_aval.dtype) for bm in ins)
    out_shapes = tuple(_sds(bm.array_aval.shape, bm.array_aval.dtype) for bm in outs)
    blocked = [k for k, bm in enumerate(gm.block_mappings) if not _is_gmem(bm)]
    # Blocks loaded GMEM -> SMEM before each step: the inputs', and those of outputs
    # aliased to an input, which start as that input's values (the kernel may read them).
    aliased_outs = {gm.num_inputs + o for _, o in gm.input_output_aliases}
    blocked_in = [k for k in blocked if k < gm.num_inputs or k in aliased_outs]
    by_tma = {k for k in blocked if tma_can_copy(gm.block_mappings[k])}
    layouts = {k: _block_layout(gm.block_mappings[k], k in by_tma, name) for k in blocked}
    bufs = tuple(_sds(smem.physical_shape(_smem_block_shape(gm.block_mappings[k]),
                                          layouts[k][0]),
                      gm.block_mappings[k].array_aval.dtype) for k in blocked)
    target = target_of(target)
    scratch_types = list(gm.scratch_types)
    inferred: set = set()
    if semantics == "warpgroup":  # SMEM layouts follow from their uses (see infer.py)
        top, inferred = wgmma_buffers(jaxpr.jaxpr)
        first = len(jaxpr.jaxpr.invars) - len(scratch_types)
        scratch_types = [wgmma_transforms(t) if jaxpr.jaxpr.invars[first + i] in top else t
                         for i, t in enumerate(scratch_types)]
    scratch = [plan_type(t, f"scratch {origin}", name, target, cluster_names)
               for origin, t in zip(gm.scratch_origins, scratch_types)]
    if seq and any(p.kind == "acc" for p in scratch):
        raise unsupported(name, "a plgpu.ACC scratch with sequential grid axes (the "
                                "accumulator would have to live across grid steps); "
                                "allocate it with pl.run_scoped around an emit_pipeline")
    scoped = plan(jaxpr.jaxpr, name, threads, target, inferred, cluster_names)
    pair_tmem = [p for p in (*scratch, *scoped.values())
                 if p.kind == "tmem" and p.entry.collective]
    if pair_tmem and cluster != (2, 1, 1):
        raise KernelError(
            f"plgpu.TMEM({pair_tmem[0].shape}, collective=True) in kernel {name}: collective "
            "TMEM is allocated by a CTA pair, a cluster of 2 blocks (plgpu.kernel(cluster="
            f"(2,), cluster_names=...)); the kernel's cluster is {cluster} (x, y, z)")
    stack = plan_stack(jaxpr.jaxpr, scoped, threads.num, repeated=bool(seq))
    # TMEM: one allocation of the body's own (tmem_alloc.py), not SMEM tree entries.
    tmem = plan_tmem({**{("scratch", i): p.entry for i, p in enumerate(scratch)
                         if p.kind == "tmem"},
                      **{("scoped", *k): p.entry for k, p in scoped.items()
                         if p.kind == "tmem"}}, name)
    sems = collectives.layout(scratch, scoped, jaxpr.jaxpr)
    sem_words = sems.words(int(np.prod(cuda_grid)))
    sem_shapes = (_sds((sem_words,), jnp.int32),) if sem_words else ()
    mesh_axes = _mesh_axes(jax_mesh)
    nt = threads.num

    def per_wg(shape):  # a buffer each warpgroup has to itself
        return (nt, *shape) if nt > 1 else tuple(shape)

    # Cross-warp partial results of reductions (none reserved for kernels without one).
    red = (_sds(per_wg((REDUCTION_SCRATCH_BYTES // 4,)), jnp.float32)
           if reduces(jaxpr.jaxpr) else None)
    spills = spill_buffers(jaxpr.jaxpr, is_elementwise)

    def smem_tree(keep, with_red=True):
        """The SMEM tree with the spill buffers of the eqns in ``keep`` (None: all), and
        the reduction scratch unless told otherwise."""
        entries = {"red": red} if red is not None and with_red else {}
        entries.update({("buf", k): b for k, b in zip(blocked, bufs)})
        entries.update({("scratch", i): p.entry for i, p in enumerate(scratch)
                        if p.entry is not None and p.kind != "tmem"})
        entries.update({("scoped", *k): p.entry for k, p in scoped.items()
                        if p.entry is not None and k not in stack.member
                        and p.kind != "tmem" and k not in stack.barrier_of})
        if tmem is not None:
            entries["tmem_addr"] = TmemAddress()
        if stack.union is not None:  # the buffers scopes share by lifetime
            entries["scoped_stack"] = stack.union
        # Staging buffers live only within their eqn's rule (written, read, then a
        # barrier), so those of different eqns share SMEM: a union with one member per
        # eqn. A scan's rows stay live across its loop (whose body may stage values):
        # they get their own.
        members, state["in_union"] = [], {}
        for i, (e, avals) in enumerate(spills):
            if keep is not None and i not in keep:
                continue
            own = {("spill", i, j): _sds(per_wg(a.shape), a.dtype)
                   for j, a in enumerate(avals) if a is not None}
            if e.primitive is P.scan_p:
                entries.update(own)
            elif own:
                tree, where, _ = aligned(own)
                state["in_union"].update({k: (len(members), w) for k, w in where.items()})
                members.append(tree)
        if members:
            entries["staging"] = mgpu.Union(members)
        if blocked_in:
            entries["barriers"] = mgpu.Barrier(arrival_count=1, num_barriers=len(blocked_in))
        tree, where, total = aligned(entries)
        smem_budget.check(name, target, total,
                          {k: size_and_alignment(e)[0] for k, e in entries.items()},
                          {k: f"{gm.block_mappings[k].origin} ({b.shape} {b.dtype})"
                           for k, b in zip(blocked, bufs)})
        return tree, where, total

    state = {}

    def body(launch_ctx, *refs_and_smem):
        with entry_values(threads):
            emit_body(launch_ctx, *refs_and_smem)

    def emit_body(launch_ctx, *refs_and_smem):
        *gmem_refs, smem_refs = refs_and_smem
        sem_refs = {}
        if sem_shapes:  # the semaphore buffer comes after the inputs (an in/out buffer)
            sem_refs = collectives.semaphore_refs(sems, gmem_refs.pop(len(ins)), cuda_grid)
        ref = {key: smem_refs[i] for key, i in state["where"].items()}
        tmem_refs = allocate_tmem(tmem, ref.pop("tmem_addr")) if tmem is not None else {}
        ref.update({k: r for k, r in tmem_refs.items() if k})
        staging = ref.pop("staging", None)
        for key, (m, pos) in state["in_union"].items():
            ref[key] = staging.members[m][pos]
        if nt > 1:
            for key in ref:
                if key == "red" or key[0] == "spill":
                    ref[key] = own_slice(ref[key])
        buf_refs = [ref[("buf", k)] for k in blocked]
        scratch_vals = [value(p, sem_refs.get(("scratch", i)) if p.kind == "sem"
                              else ref.get(("scratch", i))) for i, p in enumerate(scratch)]
        red_ref, barriers = ref.get("red"), ref.get("barriers")
        spill_refs = _Used({id(e): [ref.get(("spill", i, j)) for j in range(len(avals))]
                            for i, (e, avals) in enumerate(spills)
                            if state["keep"] is None or i in state["keep"]})
        state["spill_refs"] = spill_refs
        lctx = LoweringContext(launch_ctx, tuple(gm.grid), [None] * len(gm.grid), name,
                               approx_math=bool(getattr(params, "approx_math", False)),
                               reduction_scratch=red_ref,
                               spill_buffers=spill_refs, target=target,
                               axis_names=tuple(gm.grid_names or ()),
                               semantics=semantics, jax_mesh=mesh_axes, sems=sem_refs)
        lctx.scoped = {k: (p, sem_refs.get(("scoped", *k)) if p.kind == "sem"
                           else buffer(ref["scoped_stack"], stack.member[k])
                           if k in stack.member
                           else ref.get(("scoped", *stack.barrier_of.get(k, k))))
                       for k, p in scoped.items()}
        lctx.scope_syncs = stack.syncs
        dims = (gpu.Dimension.x, gpu.Dimension.y, gpu.Dimension.z)
        for dim, axis in zip(dims, par):
            block = gpu.block_id(dim)
            if cluster[dim.value] > 1:  # the cluster's index along dim
                block = arith.divui(block, V.const(cluster[dim.value], V.index()))
            lctx.program_ids[axis] = arith.index_cast(V.i32(), block)
        names = tuple(gm.grid_names or ())
        for dim, cname in zip(dims, cluster_names):
            lctx.program_ids[names.index(cname)] = arith.index_cast(
                V.i32(), gpu.cluster_block_id(dim))
        lctx.cluster_names = tuple(cluster_names)
        if threads.axis is not None:
            lctx.program_ids[threads.axis] = warpgroup()
        for axis in range(len(gm.grid)):
            if lctx.program_ids[axis] is None and axis not in seq:
                lctx.program_ids[axis] = V.const(0, V.i32())
        smem_of = dict(zip(blocked, buf_refs))
        with _loop_nest(lctx, seq):
            ids = list(lctx.program_ids)
            if seq:
                mgpu.warpgroup_barrier()  # the previous step is done with the blocks
            windows = {k: _block_slices(lctx, gm.block_mappings[k], ids) for k in blocked}
            slices = {k: w[0] for k, w in windows.items()}
            bounds = {k: w[1] for k, w in windows.items()}
            for j, k in enumerate(blocked_in):
                if k in by_tma:
                    launch_ctx.async_copy(src_ref=gmem_refs[k], dst_ref=smem_of[k],
                                          gmem_slice=slices[k], barrier=barriers[j],
                                          predicate=issuer(), **_tma_layout(layouts[k]))
                else:
                    thread_copy(gmem_refs[k], smem_of[k], gm.block_mappings[k], slices[k],
                                to_smem=True, bounds=bounds[k])
            for j, k in enumerate(blocked_in):
                if k in by_tma:
                    barriers[j].wait()
            if any(k not in by_tma for k in blocked_in):
                mgpu.warpgroup_barrier()
            refs = []
            for k, bm in enumerate(gm.block_mappings):
                if k in smem_of:
                    refs.append(smem.smem_ref(smem_of[k], bm.array_aval.dtype,
                                              _smem_block_shape(bm), *layouts[k]))
                else:
                    refs.append(RefVal(gmem_refs[k], jnp.dtype(bm.array_aval.dtype), "gmem"))
            refs.extend(scratch_vals)
            lower_jaxpr(lctx, jaxpr.jaxpr, jaxpr.consts, refs)
            stores = [k for k in blocked if k >= gm.num_inputs]
            if stores:  # the body's SMEM writes, before the output blocks' copies
                mgpu.commit_shared()
            for k in stores:
                if k in by_tma:
                    launch_ctx.async_copy(src_ref=smem_of[k], dst_ref=gmem_refs[k],
                                          gmem_slice=slices[k], predicate=issuer(),
                                          **_tma_layout(layouts[k]))
                else:
                    thread_copy(gmem_refs[k], smem_of[k], gm.block_mappings[k], slices[k],
                                to_smem=False, bounds=bounds[k])
            if any(k in by_tma for k in stores):
                launch_ctx.await_async_copy(0)
        if tmem is not None:
            free_tmem(tmem, tmem_refs)
        state["uses"] = frozenset(lctx.uses)
        state["red_used"] = red_ref is not None and any(True for _ in red_ref.uses)

    symbol = _kernel_symbol(name)

    def emit(keep, with_red=True):
        smem, state["where"], smem_bytes = smem_tree(keep, with_red)
        state["keep"] = keep
        # Mosaic GPU reads the device mesh (for peer addresses) from the current mesh.
        concrete = mesh_axes and isinstance(jax_mesh, jax.sharding.Mesh)
        on_mesh = jc.device_mesh(jax_mesh) if concrete else contextlib.nullcontext()
        with jmlir.make_ir_context() as ctx, ir.Location.unknown(), on_mesh:
            mgpu.dialect.register_dialect(ctx)
            try:
                fn = mgpu.as_gpu_kernel(
                    body, cuda_grid, (V.WARPGROUP_SIZE * nt, 1, 1), in_shapes, out_shapes,
                    tuple(smem), cluster=cluster, module_name=symbol, kernel_name=symbol,
                    inout_shape=sem_shapes)
            except MosaicGpuLoweringError:
                raise
            except ir.MLIRError as e:
                raise MosaicGpuLoweringError(
                    f"pallas-mosaic-gpu produced a Mosaic GPU module for kernel {name} that "
                    f"does not verify (a bug in pallas-mosaic-gpu; please report it): "
                    f"{e}") from e
        return fn, smem_bytes

    fn, smem_bytes = emit(None)
    # Spill buffers are planned from the jaxpr alone; operands that turn out to be in a
    # tiled layout (say, a row reduction of a WGMMA array) need none. When some went
    # unused, the kernel is emitted again without them (lowering is deterministic).
    # The reduction scratch goes too when no reduction used it (row reductions of WGMMA
    # arrays shuffle within warps); it alone is not worth emitting again.
    used = state["spill_refs"].used
    keep = {i for i, (e, _) in enumerate(spills) if id(e) in used}
    if len(keep) < len(spills):
        fn, smem_bytes = emit(keep, with_red=state["red_used"])
    aliases = tuple(gm.input_output_aliases)
    if aliases:
        fn = aliased_fn(fn, in_shapes, out_shapes, sem_shapes, aliases)
    return Kernel(fn, in_shapes, out_shapes, symbol, cuda_grid, seq, smem_bytes,
                  state.get("uses", frozenset()), sem_words, aliases)


class _Used(dict):
    """The spill buffers per eqn, remembering which eqns asked for theirs."""

    def __init__(self, *args):
        super().__init__(*args)
        self.used = set()

    def __getitem__(self, key):
        self.used.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.used.add(key)
        return super().get(key, default)


@contextlib.contextmanager
def _loop_nest(lctx: LoweringContext, axes):
    """Runs the body once per point of the sequential ``axes``, in grid order."""
    if not axes:
        yield
        return
    with contextlib.ExitStack() as stack:
        for axis in axes:
            lo, hi, one = (V.const(v, V.index()) for v in (0, lctx.grid[axis], 1))
            loop = scf.ForOp(lo, hi, one)
            stack.enter_context(ir.InsertionPoint(loop.body))
            lctx.program_ids[axis] = arith.index_cast(V.i32(), loop.induction_variable)
            stack.callback(scf.YieldOp, [])
        yield
