"""Kernel launches in GPU interpret mode: from ``pallas_call``/``core_map`` to threads.

The lowering emits a host callback (``jax.pure_callback``) that receives the operands
(and the indices of any enclosing ``shard_map`` axes the kernel reads), simulates every
thread of every block of the kernel, and returns the outputs. One :class:`Launch` holds
what its threads share: buffers of collective allocations, the vector clocks and the
race detector. Under ``shard_map``, a kernel that reaches other devices (remote refs and
semaphores, multimem) runs each device's launch in a :class:`~.devices.DeviceGroup`
shared with the other devices' callbacks.
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

from pallas.plugins import RaceReport, axis_index_p, host_call, run_scoped_p, semaphore_signal_p
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.interpret import blocks, devices
from pallas_mosaic_gpu._src.interpret.evaluator import eval_jaxpr
from pallas_mosaic_gpu._src.interpret.memory import Buffer, fill_value
from pallas_mosaic_gpu._src.interpret.params import InterpretParams, register_launcher
from pallas_mosaic_gpu._src.interpret.sync import check_barriers_at_exit
from pallas_mosaic_gpu._src.interpret.thread import Launch, ThreadCtx
from pallas_mosaic_gpu._src.interpret.threads import SimThread, run_threads
from pallas_mosaic_gpu._src.mesh import Mesh as GpuMesh
from pallas_mosaic_gpu._src.mesh import register_core_map_interpreter
from pallas_mosaic_gpu._src.primitives.multimem import NAMES

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
    devices.reset_all()


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


def _trees(params):
    for v in params.values():
        if isinstance(v, jax.tree_util.PyTreeDef):
            yield v
        elif isinstance(v, tuple):  # a RefOperands spec: ((pos, n, tree) | None, ...)
            for e in v:
                if isinstance(e, tuple) and len(e) == 3 and isinstance(
                        e[2], jax.tree_util.PyTreeDef):
                    yield e[2]


def communicates(jaxpr) -> bool:
    """Whether the kernel reaches other devices: a remote semaphore signal, a
    ``plgpu.remote_ref`` view, a multimem primitive."""
    for eqn in _all_eqns(jaxpr):
        if eqn.primitive is semaphore_signal_p and eqn.params["device_id_tree"].num_leaves:
            return True
        if eqn.primitive in NAMES:
            return True
        if any(devices.has_peer(t) for t in _trees(eqn.params)):
            return True
    return False


def _device_axes(jaxpr, outer) -> tuple[tuple, tuple | None]:
    """The enclosing map axes to pass to the callback, and (key, mesh axes) of the
    device group when the kernel communicates across several devices."""
    axes = devices.mesh_axes()
    if int(np.prod([s for _, s in axes])) <= 1 or not communicates(jaxpr):
        return outer, None
    names = tuple(outer) + tuple(n for n, _ in axes if n not in outer)
    return names, (object(), axes)


def _callback(run, shapes, group, *args):
    """The host callback of each device: a ``pure_callback``, or for a kernel that
    reaches other devices, one whose operands stay numpy (``pallas.plugins.host_call``)."""
    if group is None:
        return jax.pure_callback(run, shapes, *args, vmap_method="sequential")
    return host_call(run, shapes, *args)


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
    axis_names, _ = _mesh_axes(mesh, grid_mapping)
    outer, group = _device_axes(jaxpr, outer_axis_names(jaxpr, axis_names))
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals]
    run = functools.partial(_run_pallas_call, params, jaxpr, grid_mapping, outer, group,
                            name, len(in_nodes))

    def fun(*args):
        axis_vals = [lax.axis_index(n) for n in outer]
        return _callback(run, shapes, group, *args, *axis_vals)

    plain = ctx.replace(avals_in=[_plain(a) for a in ctx.avals_in],
                        avals_out=[_plain(a) for a in ctx.avals_out])
    return jc.mlir.lower_fun(fun, multiple_results=True)(plain, *in_nodes)


def discharge_core_map(params, in_avals, args, *, jaxpr, mesh, scratch_types, name):
    check_collective_allocations(jaxpr, mesh)
    outer, group = _device_axes(jaxpr, outer_axis_names(jaxpr, tuple(mesh.shape)))
    is_ref = [isinstance(a, jc.AbstractRef) for a in in_avals]
    shapes = [jax.ShapeDtypeStruct(a.inner_aval.shape, a.inner_aval.dtype)
              for a, r in zip(in_avals, is_ref) if r]
    spaces = [getattr(a, "memory_space", None) for a in in_avals]
    run = functools.partial(_run_core_map, params, jaxpr, mesh, tuple(scratch_types), outer,
                            group, tuple(is_ref), tuple(spaces), name)
    axis_vals = [lax.axis_index(n) for n in outer]
    outs = iter(_callback(run, shapes, group, *args, *axis_vals))
    return [next(outs) if r else None for r in is_ref]


def core_map_interpreter(mesh, interpret: Any):
    """``pl.core_map`` on a ``plgpu.Mesh`` in GPU interpret mode, when ``interpret`` is
    ``plgpu.InterpretParams`` or ``True`` (threads that wait for each other need it):
    the core's ``simulate(in_avals, args, params)``; None for other ``interpret``."""
    if interpret is True:
        interpret = InterpretParams()
    if not isinstance(interpret, InterpretParams):
        return None

    def simulate(in_avals, args, params):
        return discharge_core_map(interpret, in_avals, args, jaxpr=params["jaxpr"],
                                  mesh=mesh, scratch_types=params["scratch_types"],
                                  name=params.get("name"))

    return simulate


register_launcher(lower_pallas_call)
register_core_map_interpreter(core_map_interpreter)


# -- running -----------------------------------------------------------------------------


def _new_launch(params, axis_names, sizes, mesh, outer, axis_vals, name, group=None,
                device=0) -> Launch:
    n_threads = int(np.prod(sizes, dtype=np.int64)) if sizes else 1
    launch = Launch(params, axis_names=axis_names, sizes=sizes, mesh=mesh,
                    outer_axes=dict(zip(outer, (int(v) for v in axis_vals))),
                    num_threads=n_threads, report=REPORT, name=name, group=group,
                    device=device)
    if group is not None:
        group.launches[device] = launch
    return launch


def _points(sizes):
    if not sizes:
        yield ()
        return
    for flat in range(int(np.prod(sizes, dtype=np.int64))):
        yield tuple(int(i) for i in np.unravel_index(flat, sizes))


def _host(x) -> np.ndarray:
    """A GMEM buffer's value on several devices: a writable numpy array, read and written
    in place (large JAX computations there could wait behind a blocked device)."""
    return np.array(x)


def _simulate(threads, launches) -> None:
    """Runs the threads of one or more launches (several devices: together) to the end."""
    run_threads(threads)
    for launch in launches:
        check_barriers_at_exit(launch)


def _mesh_threads(launch: Launch, jaxpr, make_args) -> list[SimThread]:
    threads = []
    for tid, point in enumerate(_points(launch.sizes)):
        th = ThreadCtx(launch, tid, point)
        threads.append(SimThread(th.name, eval_jaxpr(th, jaxpr, (), make_args(th))))
    return threads


def _execute(group_cfg, outer, axis_vals, name, prepare):
    """``prepare(group, device) -> (launch, threads, collect)`` builds a device's launch; runs
    it alone, or as this device's part of a device group (see :mod:`.devices`)."""
    if group_cfg is None:
        launch, threads, collect = prepare(None, 0)
        _simulate(threads, [launch])
        return collect()
    key, axes = group_cfg
    coords = dict(zip(outer, (int(v) for v in axis_vals)))
    make = functools.partial(devices.DeviceGroup, name, axes)
    device = make().device_of(coords)
    group = devices.GROUPS.join(key, device, make)
    try:
        return group.run(device, prepare, _simulate)
    finally:
        devices.GROUPS.leave(group)


def _run_pallas_call(params, jaxpr, gm, outer, group_cfg, name, n_in, *args):
    operands, axis_vals = args[:n_in], args[n_in:]
    _begin_launch()
    try:
        return _execute(group_cfg, outer, axis_vals, name, functools.partial(
            _pallas_call_body, params, jaxpr, gm, outer, name, operands, axis_vals))
    finally:
        _end_launch()


def _pallas_call_body(params, jaxpr, gm, outer, name, operands, axis_vals, group, device):
    mesh = gm.mesh
    axis_names, sizes = _mesh_axes(mesh, gm)
    nsp = gm.num_scalar_prefetch
    prefetch = [jnp.asarray(a) for a in operands[:nsp]]
    body_ops = operands[nsp:]
    host = _host if group is not None else jnp.asarray
    ins = [Buffer(bm.origin, blocks.GMEM, host(x), sym=("in", i))
           for i, (bm, x) in enumerate(zip(gm.in_block_mappings, body_ops))]
    aliases = dict((o, i) for i, o in gm.input_output_aliases)
    outs = []
    for k, bm in enumerate(gm.out_block_mappings):
        a = bm.array_aval
        if k in aliases:
            value = host(operands[aliases[k]])
        else:
            value = host(jnp.full(a.shape, fill_value(a.dtype, params.uninitialized_memory)))
        outs.append(Buffer(bm.origin, blocks.GMEM, value, sym=("out", k)))
    launch = _new_launch(params, axis_names, sizes if mesh is not None else (), mesh,
                         outer, axis_vals, name, group, device)
    for b in (*ins, *outs):
        launch.register(b, b.sym)

    def collect():
        return [np.asarray(b.value) for b in outs]

    if mesh is not None:
        def make_args(th):
            scratch = [launch.allocate(th, t, f"scratch {o}", ("__kernel__", i), ())
                       for i, (t, o) in enumerate(zip(gm.scratch_types,
                                                      gm.scratch_origins))]
            return [*prefetch, *ins, *outs, *scratch]

        return launch, _mesh_threads(launch, jaxpr, make_args), collect
    launch.grid = tuple(gm.grid)
    th = ThreadCtx(launch, 0, ())
    body = blocks.run_grid(th, jaxpr, gm, prefetch, ins, outs)
    return launch, [SimThread(th.name, body)], collect


def _run_core_map(params, jaxpr, mesh, scratch_types, outer, group_cfg, is_ref, spaces,
                  name, *args):
    n = len(is_ref)
    operands, axis_vals = args[:n], args[n:]
    _begin_launch()
    try:
        return _execute(group_cfg, outer, axis_vals, name, functools.partial(
            _core_map_body, params, jaxpr, mesh, scratch_types, outer, is_ref, spaces,
            name, operands, axis_vals))
    finally:
        _end_launch()


def _core_map_body(params, jaxpr, mesh, scratch_types, outer, is_ref, spaces, name,
                   operands, axis_vals, group, device):
    axis_names = tuple(mesh.shape)
    sizes = tuple(int(s) for s in mesh.shape.values())
    launch = _new_launch(params, axis_names, sizes, mesh, outer, axis_vals, name, group,
                         device)
    host = _host if group is not None else jnp.asarray
    vals = [launch.register(Buffer(f"core_map operand {i}",
                                   sp if sp is not None else blocks.GMEM, host(x)),
                            ("core_map", i)) if r else jnp.asarray(x)
            for i, (x, r, sp) in enumerate(zip(operands, is_ref, spaces))]

    def make_args(th):
        scratch = [launch.allocate(th, t, f"core_map scratch {i}", ("__core_map__", i), ())
                   for i, t in enumerate(scratch_types)]
        return [*vals, *scratch]

    return launch, _mesh_threads(launch, jaxpr, make_args), lambda: [
        np.asarray(v.value) for v in vals if isinstance(v, Buffer)]
