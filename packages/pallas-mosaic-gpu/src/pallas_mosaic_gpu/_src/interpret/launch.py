"""Kernel launches in GPU interpret mode: from ``pallas_call``/``core_map`` to threads.

The lowering emits a host callback (``jax.pure_callback``) that receives the operands
(and the indices of any enclosing ``shard_map`` axes the kernel reads), simulates every
thread of every block of the kernel, and returns the outputs. One :class:`Launch` holds
what its threads share: buffers of collective allocations, the vector clocks and the
race detector.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas.plugins import RaceReport, axis_index_p, run_scoped_p, semaphore_signal_p
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.interpret import blocks
from pallas_mosaic_gpu._src.interpret.evaluator import eval_jaxpr
from pallas_mosaic_gpu._src.interpret.memory import Buffer, fill_value
from pallas_mosaic_gpu._src.interpret.sync import check_barriers_at_exit
from pallas_mosaic_gpu._src.interpret.thread import Launch, ThreadCtx
from pallas_mosaic_gpu._src.interpret.threads import SimThread, run_threads
from pallas_mosaic_gpu._src.mesh import Mesh as GpuMesh

# -- the race report that pallas_mosaic_gpu.interpret.get_races() returns --------------

REPORT = RaceReport()
_active = 0
_active_lock = threading.Lock()


def _begin_launch() -> None:
    global _active
    with _active_lock:
        if _active == 0:
            REPORT.reset()  # a new kernel (not another device's copy of a running one)
        _active += 1


def _end_launch() -> None:
    global _active
    with _active_lock:
        _active -= 1


def reset_state() -> None:
    """Forgets races and any launch left half-way by an error."""
    global _active
    with _active_lock:
        _active = 0
    REPORT.reset()


# -- static checks ---------------------------------------------------------------------


def _all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for p in eqn.params.values():
            for j in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(j, "jaxpr", j)
                if hasattr(inner, "eqns"):
                    yield from _all_eqns(inner)


def outer_axis_names(jaxpr, kernel_axes: Sequence[Any]) -> tuple:
    """Axis names the kernel reads that an enclosing map (``shard_map``) binds: neither
    the kernel's own nor those of a ``core_map`` inside it (a ``plgpu.WarpMesh``)."""
    eqns = list(_all_eqns(jaxpr))
    inner = {n for e in eqns if e.primitive.name == "core_map"
             for n in getattr(e.params["mesh"], "shape", {})}
    names = []
    for eqn in eqns:
        if eqn.primitive is axis_index_p:
            n = eqn.params["axis_name"]
            if n not in kernel_axes and n not in inner and n not in names:
                names.append(n)
    return tuple(names)


_UNSHARED = ("wgmma_acc", "regs", "tmem")


def check_collective_allocations(jaxpr, mesh) -> None:
    """Upstream's rules for ``run_scoped(..., collective_axes=...)`` on a GPU mesh."""
    if not isinstance(mesh, GpuMesh):
        return
    names = list(mesh.shape)
    for eqn in _all_eqns(jaxpr):
        if eqn.primitive is not run_scoped_p:
            continue
        axes = tuple(eqn.params.get("collective_axes") or ())
        for a in axes:
            if a not in names:
                raise ValueError(f"Collective axis `{a}` not found among axes `{names}`.")
        if axes and mesh.thread_name is None:
            raise ValueError(
                "Requesting collective allocations, but no explicit thread axis specified.")
        if any(a in mesh.cluster_names for a in axes):
            raise NotImplementedError(
                "Collective allocations along cluster axes are not supported.")
        shared = [t for t in eqn.params["types"]
                  if str(getattr(t, "memory_space", "")) not in _UNSHARED]
        if mesh.thread_name is not None and shared and mesh.thread_name not in axes:
            raise ValueError(
                "Scoped allocation must have the thread axis in its collective axes. "
                f"(run_scoped of {[str(t.memory_space) for t in shared]} buffers in a kernel "
                f"with thread axis {mesh.thread_name!r}; pass "
                f"collective_axes={mesh.thread_name!r})")


def check_no_cta_pairs(jaxpr) -> None:
    """CTA-pair forms (``collective_axis``, ``leader_tracked``) and multimem across
    several devices are refused at trace time, naming the primitive: the interpreters run
    each block (and each device's kernel) alone."""
    from pallas_mosaic_gpu._src.primitives import copies, mma, tmem
    from pallas_mosaic_gpu._src.primitives.multimem import check_single_device
    from pallas_mosaic_gpu._src.primitives.refs import check_not_collective

    names = {copies.copy_gmem_to_smem_p: "copy_gmem_to_smem", mma.tcgen05_mma_p: "tcgen05_mma",
             tmem.tcgen05_commit_arrive_p: "tcgen05_commit_arrive",
             tmem.copy_smem_to_tmem_p: "async_copy_smem_to_tmem"}
    for eqn in _all_eqns(jaxpr):
        if eqn.primitive in names:
            check_not_collective(eqn, names[eqn.primitive])
        check_single_device(eqn)
        if eqn.primitive is semaphore_signal_p and eqn.params["device_id_tree"].num_leaves:
            raise NotImplementedError(
                "pl.semaphore_signal(..., device_id=...) (a remote semaphore): "
                "pallas-mosaic-gpu's GPU interpret mode runs each device's kernel on its "
                "own and does not simulate other devices' memory yet; backend "
                "'mosaic_gpu' lowers and compiles it (interpret=False)")


# -- lowering ----------------------------------------------------------------------------


def _plain(a):
    if isinstance(a, jc.ShapedArray):
        return jc.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)
    return a


def _mesh_axes(mesh, grid_mapping) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if mesh is not None:
        return tuple(mesh.shape), tuple(int(s) for s in mesh.shape.values())
    names = grid_mapping.grid_names or ()
    return tuple(names), tuple(grid_mapping.grid)


def lower_pallas_call(params, ctx, *in_nodes, jaxpr, grid_mapping, name, out_avals):
    mesh = grid_mapping.mesh
    check_collective_allocations(jaxpr, mesh)
    check_no_cta_pairs(jaxpr)
    axis_names, _ = _mesh_axes(mesh, grid_mapping)
    outer = outer_axis_names(jaxpr, axis_names)
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals]
    run = functools.partial(_run_pallas_call, params, jaxpr, grid_mapping, outer, name,
                            len(in_nodes))

    def fun(*args):
        axis_vals = [lax.axis_index(n) for n in outer]
        return jax.pure_callback(run, shapes, *args, *axis_vals, vmap_method="sequential")

    plain = ctx.replace(avals_in=[_plain(a) for a in ctx.avals_in],
                        avals_out=[_plain(a) for a in ctx.avals_out])
    return jc.mlir.lower_fun(fun, multiple_results=True)(plain, *in_nodes)


def discharge_core_map(params, in_avals, args, *, jaxpr, mesh, scratch_types, name):
    check_collective_allocations(jaxpr, mesh)
    check_no_cta_pairs(jaxpr)
    outer = outer_axis_names(jaxpr, tuple(mesh.shape))
    is_ref = [isinstance(a, jc.AbstractRef) for a in in_avals]
    shapes = [jax.ShapeDtypeStruct(a.inner_aval.shape, a.inner_aval.dtype)
              for a, r in zip(in_avals, is_ref) if r]
    spaces = [getattr(a, "memory_space", None) for a in in_avals]
    run = functools.partial(_run_core_map, params, jaxpr, mesh, tuple(scratch_types), outer,
                            tuple(is_ref), tuple(spaces), name)
    axis_vals = [lax.axis_index(n) for n in outer]
    outs = iter(jax.pure_callback(run, shapes, *args, *axis_vals, vmap_method="sequential"))
    return [next(outs) if r else None for r in is_ref]


# -- running -----------------------------------------------------------------------------


def _new_launch(params, axis_names, sizes, mesh, outer, axis_vals, name) -> Launch:
    n_threads = int(np.prod(sizes, dtype=np.int64)) if sizes else 1
    return Launch(params, axis_names=axis_names, sizes=sizes, mesh=mesh,
                  outer_axes=dict(zip(outer, (int(v) for v in axis_vals))),
                  num_threads=n_threads, report=REPORT, name=name)


def _points(sizes):
    if not sizes:
        yield ()
        return
    for flat in range(int(np.prod(sizes, dtype=np.int64))):
        yield tuple(int(i) for i in np.unravel_index(flat, sizes))


def _run_threads_on_mesh(launch: Launch, jaxpr, make_args) -> None:
    threads = []
    for tid, point in enumerate(_points(launch.sizes)):
        th = ThreadCtx(launch, tid, point)
        threads.append(SimThread(th.name, eval_jaxpr(th, jaxpr, (), make_args(th))))
    run_threads(threads)
    check_barriers_at_exit(launch)


def _run_pallas_call(params, jaxpr, gm, outer, name, n_in, *args):
    _begin_launch()
    try:
        operands, axis_vals = args[:n_in], args[n_in:]
        mesh = gm.mesh
        axis_names, sizes = _mesh_axes(mesh, gm)
        nsp = gm.num_scalar_prefetch
        prefetch = [jnp.asarray(a) for a in operands[:nsp]]
        body_ops = operands[nsp:]
        ins = [Buffer(bm.origin, blocks.GMEM, jnp.asarray(x))
               for bm, x in zip(gm.in_block_mappings, body_ops)]
        aliases = dict((o, i) for i, o in gm.input_output_aliases)
        outs = []
        for k, bm in enumerate(gm.out_block_mappings):
            a = bm.array_aval
            if k in aliases:
                value = jnp.asarray(operands[aliases[k]])
            else:
                value = jnp.full(a.shape, fill_value(a.dtype, params.uninitialized_memory))
            outs.append(Buffer(bm.origin, blocks.GMEM, value))
        if mesh is not None:
            launch = _new_launch(params, axis_names, sizes, mesh, outer, axis_vals, name)

            def make_args(th):
                scratch = [launch.allocate(th, t, f"scratch {o}", ("__kernel__", i), ())
                           for i, (t, o) in enumerate(zip(gm.scratch_types,
                                                          gm.scratch_origins))]
                return [*prefetch, *ins, *outs, *scratch]

            _run_threads_on_mesh(launch, jaxpr, make_args)
        else:
            launch = _new_launch(params, axis_names, (), None, outer, axis_vals, name)
            launch.grid = tuple(gm.grid)
            th = ThreadCtx(launch, 0, ())
            body = blocks.run_grid(th, jaxpr, gm, prefetch, ins, outs)
            run_threads([SimThread(th.name, body)])
            check_barriers_at_exit(launch)
        return [np.asarray(b.value) for b in outs]
    finally:
        _end_launch()


def _run_core_map(params, jaxpr, mesh, scratch_types, outer, is_ref, spaces, name, *args):
    _begin_launch()
    try:
        n = len(is_ref)
        operands, axis_vals = args[:n], args[n:]
        axis_names = tuple(mesh.shape)
        sizes = tuple(int(s) for s in mesh.shape.values())
        launch = _new_launch(params, axis_names, sizes, mesh, outer, axis_vals, name)
        vals = [Buffer(f"core_map operand {i}", sp if sp is not None else blocks.GMEM,
                       jnp.asarray(x)) if r else jnp.asarray(x)
                for i, (x, r, sp) in enumerate(zip(operands, is_ref, spaces))]

        def make_args(th):
            scratch = [launch.allocate(th, t, f"core_map scratch {i}", ("__core_map__", i), ())
                       for i, t in enumerate(scratch_types)]
            return [*vals, *scratch]

        _run_threads_on_mesh(launch, jaxpr, make_args)
        return [np.asarray(v.value) for v in vals if isinstance(v, Buffer)]
    finally:
        _end_launch()


