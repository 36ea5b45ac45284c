"""How a kernel enters TPU interpret mode: static checks, then one host callback per device.

``pallas_call(..., interpret=pltpu.InterpretParams(...))`` (or forced interpret mode)
lowers to a host callback that runs the device's part of the call in the simulation
(:mod:`.grid`); under ``shard_map`` every device's callback joins the same simulation,
so remote DMAs and semaphores work across devices. Errors that upstream raises at trace
time (referencing HBM directly, HBM in ``run_scoped``, bad ``dimension_semantics``) are
raised here, before anything runs.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas.plugins import dynamic_grid_dim, host_call, load_p, run_scoped_p, swap_p
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.interpret.grid import Config, is_hbm, run_device
from pallas_tpu._src.lowering.keys import physicalize, physicalize_body
from pallas_tpu._src.memory import MemorySpace, canonical_space

if TYPE_CHECKING:  # params.py sits above this module: its InterpretParams calls in here
    from pallas_tpu._src.interpret.params import InterpretParams

_DIRECT = {jc.get_p: "get_p", jc.swap_p: "swap_p", jc.addupdate_p: "addupdate_p",
           load_p: "load_p", swap_p: "swap_p"}


def _closed(jaxpr):
    return jaxpr if isinstance(jaxpr, jc.ClosedJaxpr) else jc.ClosedJaxpr(jaxpr, ())


def _sub_jaxprs(eqn):
    for v in eqn.params.values():
        for x in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(x, jc.ClosedJaxpr):
                yield x.jaxpr
            elif hasattr(x, "eqns") and hasattr(x, "invars"):
                yield x


def _is_var(v) -> bool:
    return not isinstance(v, jc.Literal)


def _core_local(space) -> bool:
    return canonical_space(space) in (MemorySpace.SMEM, MemorySpace.VMEM)


def check_kernel(jaxpr, hbm_invars: set, params: InterpretParams) -> None:
    """Raises upstream's trace-time errors: loads/stores of HBM refs, HBM allocations in
    ``run_scoped`` (unless allowed)."""
    for eqn in jaxpr.eqns:
        prim = eqn.primitive
        if prim in _DIRECT and eqn.invars and _is_var(eqn.invars[0]) and (
                eqn.invars[0] in hbm_invars):
            raise ValueError(
                f"{_DIRECT[prim]}: Buffers with a memory space of HBM or ANY cannot be "
                f"referenced directly. Instead, use `pltpu.sync_copy` or `pltpu.async_copy`."
            )
        if prim is run_scoped_p:
            body = eqn.params["jaxpr"]
            inner = {body.invars[i] for i, v in enumerate(eqn.invars)
                     if _is_var(v) and v in hbm_invars}
            for k, t in enumerate(eqn.params["types"]):
                if is_hbm(t.memory_space):
                    if not params.allow_hbm_allocation_in_run_scoped:
                        raise ValueError(
                            "Cannot allocate HBM in `run_scoped`. (TPU interpret mode "
                            "allows it with InterpretParams("
                            "allow_hbm_allocation_in_run_scoped=True).)")
                    inner.add(body.invars[len(eqn.invars) + k])
            check_kernel(body, inner, params)
            continue
        for sub in _sub_jaxprs(eqn):
            # Operands line up with the trailing invars of a body (consts first).
            n = len(sub.invars)
            inner = {sub.invars[n - len(eqn.invars) + i] for i, v in enumerate(eqn.invars)
                     if _is_var(v) and v in hbm_invars and n - len(eqn.invars) + i >= 0}
            check_kernel(sub, inner, params)


def _dimension_semantics(compiler_params, ndim: int) -> tuple[bool, ...]:
    sem = getattr(compiler_params, "dimension_semantics", None)
    if sem is None:
        return (False,) * ndim
    par = tuple(str(getattr(s, "value", s)) in ("parallel", "core_parallel") for s in sem)
    for a, b in zip(par[:-1], par[1:]):
        if b and not a:
            raise ValueError("Dimensions with parallel semantics must form a prefix of the "
                             f"grid; got dimension_semantics={tuple(sem)}.")
    return par + (False,) * (ndim - len(par))


def _core_parallel(compiler_params) -> tuple[bool, ...]:
    sem = getattr(compiler_params, "dimension_semantics", None) or ()
    return tuple(str(getattr(s, "value", s)) == "core_parallel" for s in sem)


def _dynamic_parallel_bounds(grid, parallel) -> list[tuple[int, int]]:
    """(operand index of the size, grid dimension) of each dynamic grid size on a
    parallel dimension (the dynamic sizes are the call's first operands, in order)."""
    out, b = [], 0
    for dim, (g, par) in enumerate(zip(grid, parallel)):
        if g is dynamic_grid_dim:
            if par:
                out.append((b, dim))
            b += 1
    return out


def _semantics_str(compiler_params) -> str:
    sem = getattr(compiler_params, "dimension_semantics", None) or ()
    return repr(tuple(str(getattr(s, "value", s)) for s in sem))


def _permutations(grid, parallel, seed) -> tuple:
    """The visiting order of each parallel grid dimension: ``jax.random`` permutations
    seeded by ``random_seed`` (the same orders as upstream), computed eagerly and
    outside any mesh context (this runs while a ``shard_map`` is being lowered)."""
    out = []
    with jax.ensure_compile_time_eval(), jc.no_abstract_mesh():
        key = jax.random.key(seed or 0)
        for n, par in zip(grid, parallel):
            if not par or n is dynamic_grid_dim:  # dynamic: refused in lower_pallas_call
                out.append(None)
                continue
            n = jc.concrete_or_error(n, "the size of a grid dimension with parallel "
                                        "semantics")
            key, sub = jax.random.split(key)
            out.append(tuple(int(i) for i in np.asarray(
                jax.random.permutation(sub, jnp.arange(n, dtype=jnp.int32)))))
    return tuple(out)


def mesh_axes() -> tuple:
    """((name, size), ...) of the manual axes of the enclosing ``shard_map``, if any."""
    am = jax.sharding.get_abstract_mesh()
    names = tuple(getattr(am, "axis_names", ()) or ())
    manual = set(getattr(am, "manual_axes", ()) or ())
    return tuple((n, int(am.axis_sizes[i])) for i, n in enumerate(names) if n in manual)


def _device_coords(axes):
    if not axes:
        return jnp.int32(0), jnp.zeros((0,), jnp.int32)
    coords = [lax.axis_index(n).astype(jnp.int32) for n, _ in axes]
    dev = jnp.int32(0)
    for c, (_, size) in zip(coords, axes):
        dev = dev * size + c
    return dev, jnp.stack(coords)


def _callback(cfg: Config, result_avals, args):
    axes = cfg.mesh_axes
    dev, coords = _device_coords(axes)
    return host_call(functools.partial(run_device, cfg), result_avals, dev, coords, *args)


def lower_pallas_call(params: InterpretParams, ctx, *in_nodes, jaxpr, grid_mapping,
                      compiler_params, name):
    """The HLO of a ``pallas_call`` in TPU interpret mode (see the module docstring)."""
    # Typed PRNG keys as their key data: the simulation's buffers hold arrays.
    jaxpr, gm = physicalize(jaxpr, grid_mapping)
    if gm is not grid_mapping:
        ctx = ctx.replace(avals_in=[jc.physical_aval(a) for a in ctx.avals_in],
                          avals_out=[jc.physical_aval(a) for a in ctx.avals_out])
    closed = _closed(jaxpr)
    n_pre = gm.num_scalar_prefetch
    kernel_invars = closed.jaxpr.invars
    hbm = {kernel_invars[n_pre + k] for k, bm in enumerate(gm.block_mappings)
           if is_hbm(bm.memory_space)}
    hbm |= {kernel_invars[n_pre + len(gm.block_mappings) + i]
            for i, t in enumerate(gm.scratch_types) if is_hbm(t.memory_space)}
    check_kernel(closed.jaxpr, hbm, params)
    grid = tuple(gm.grid)
    parallel = _dimension_semantics(compiler_params, len(grid))
    num_cores = params.num_cores_per_device
    core_par = _core_parallel(compiler_params)
    dynamic = gm.num_dynamic_grid_bounds > 0
    if dynamic and any(core_par):
        raise NotImplementedError(
            f"TPU interpret mode: pallas_call {name} has a dynamic grid and core_parallel "
            f"dimension semantics; the cores of a mesh need static grid sizes")
    dynamic_parallel = _dynamic_parallel_bounds(grid, parallel)
    if any(core_par):
        # pl.kernel over a TensorCore mesh: one core per point of the core axes.
        num_cores = int(np.prod([g for g, c in zip(grid, core_par) if c]))
        params = _replace(params, num_cores_or_threads=num_cores)
        perms = tuple(tuple(range(g)) if p else None for g, p in zip(grid, parallel))
    else:
        perms = _permutations(grid, parallel, params.random_seed)
    axes = mesh_axes()
    cfg = Config(kind="pallas_call", name=name or "kernel", jaxpr=closed, params=params,
                 num_devices=int(np.prod([s for _, s in axes])) if axes else 1,
                 mesh_axes=axes, num_cores=num_cores, grid_mapping=gm,
                 parallel=parallel, permutations=perms)
    out_avals = [bm.array_aval for bm in gm.out_block_mappings]

    def fun(*args):
        for b, dim in dynamic_parallel:
            # Raises JAX's ConcretizationTypeError (as upstream): the bound is a tracer.
            jc.concrete_or_error(args[b], (
                f"the size of grid dimension {dim} of pallas_call {name or 'kernel'}, "
                f"which has parallel semantics (dimension_semantics="
                f"{_semantics_str(compiler_params)}). TPU interpret mode visits a parallel "
                f"dimension in a random order drawn when the kernel is traced, so its size "
                f"must be static; give a dynamic size 'arbitrary' semantics instead."))
        return _callback(cfg, out_avals, args)

    plain = ctx.replace(avals_in=[_plain(a) for a in ctx.avals_in],
                        avals_out=[_plain(a) for a in ctx.avals_out])
    return jc.mlir.lower_fun(fun, multiple_results=True)(plain, *in_nodes)


def _plain(a):
    if isinstance(a, jc.ShapedArray):
        return jc.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)
    return a


def _replace(params, **kw):
    import dataclasses

    return dataclasses.replace(params, **kw)


def discharge_core_map(params: InterpretParams, mesh, in_avals, args, eqn_params):
    """``core_map`` over a TensorCore mesh (under ``pl.run_state``): the body runs on
    ``mesh.num_cores`` simulated cores; returns the new values of the ref operands."""
    jaxpr = eqn_params["jaxpr"]
    eqn_args = list(args)
    n_ops = len(args)
    refs = [isinstance(a, jc.AbstractRef) for a in in_avals]
    scratch = tuple(eqn_params["scratch_types"])
    physical = physicalize_body(jaxpr, scratch)
    keys = [jnp.issubdtype(x.dtype, jax.dtypes.prng_key) for x in args]
    if physical is not None:
        # Typed PRNG keys as their key data: the simulation's buffers hold arrays.
        closed, scratch = physical
        if closed.consts:
            raise NotImplementedError("a core_map body with PRNG keys captures constants")
        jaxpr = closed.jaxpr
        args = [jax.random.key_data(x) if k else x for x, k in zip(args, keys)]
        in_avals = [jc.AbstractRef(jc.physical_aval(a.inner_aval), memory_space=a.memory_space)
                    if isinstance(a, jc.AbstractRef) else a for a in in_avals]
    # A ref made in a core's own memory (``pl.empty_ref_like(pltpu.SMEM(...))``,
    # ``jax.new_ref(x, memory_space=pltpu.VMEM)``) is read and written directly.
    spaces = tuple(canonical_space(a.memory_space) if r and _core_local(a.memory_space)
                   else MemorySpace.HBM for a, r in zip(in_avals, refs))
    hbm = {jaxpr.invars[i] for i in range(n_ops) if refs[i] and spaces[i] is MemorySpace.HBM}
    check_kernel(jaxpr, hbm, params)
    num_cores = int(mesh.num_cores)
    params = _replace(params, num_cores_or_threads=num_cores)
    axes = mesh_axes()
    cfg = Config(kind="core_map", name=eqn_params.get("name") or "core_map",
                 jaxpr=jc.ClosedJaxpr(jaxpr, ()), params=params,
                 num_devices=int(np.prod([s for _, s in axes])) if axes else 1,
                 mesh_axes=axes, num_cores=num_cores,
                 grid_mapping=scratch, core_axis=mesh.axis_name,
                 operand_spaces=spaces,
                 value_operands=frozenset(i for i, r in enumerate(refs) if not r),
                 operand_names=tuple(f"core_map operand {i}" for i in range(n_ops)))
    # A captured value may be traced (a core count computed inside jit): its aval,
    # not a numpy conversion of it.
    avals = [a.inner_aval if r else jc.ShapedArray(np.shape(x), jax.typeof(x).dtype)
             for a, r, x in zip(in_avals, refs, args)]
    outs = _callback(cfg, avals, list(args))
    outs = [jax.random.wrap_key_data(o, impl=jax.random.key_impl(x)) if k else o
            for o, x, k in zip(outs, eqn_args, keys)]
    return [o if r else None for o, r in zip(outs, refs)]
