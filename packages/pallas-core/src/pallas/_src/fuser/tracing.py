"""Tracing helpers shared by the fuser: functions to jaxprs, Ref discharge, kernel context."""

from __future__ import annotations

import itertools

import jax

from pallas._src import jax_compat as jc
from pallas._src.primitives.grid import _tracing_grid


def abstractify(x):
    """The abstract value of an argument: arrays, ShapeDtypeStructs, Refs and tracers."""
    if isinstance(x, (jc.core.Tracer, jax.ref.Ref)) or hasattr(x, "aval"):
        return jc.typeof(x)
    return jc.shaped_abstractify(x)


def make_jaxpr(f, *args, **kwargs):
    """Traces ``f(*args, **kwargs)``: (open jaxpr, consts, input tree, output tree)."""
    flat_args, in_tree = jax.tree.flatten((args, kwargs))
    avals = [abstractify(x) for x in flat_args]
    dbg = jc.api_util.debug_info("pallas.fuser", f, args, kwargs)
    flat_fun, out_tree = jc.flatten_fun(jc.lu.wrap_init(f, debug_info=dbg), in_tree)
    jaxpr, _, consts = jc.trace_to_jaxpr_dynamic(flat_fun, avals)
    return jaxpr, consts, in_tree, out_tree()


def split(seq, sizes):
    """Splits ``seq`` into consecutive pieces of the given sizes, plus the rest."""
    out, start = [], 0
    for n in sizes:
        out.append(list(seq[start:start + n]))
        start += n
    out.append(list(seq[start:]))
    return out


def in_kernel_trace() -> bool:
    """Whether a Pallas kernel body is being traced right now (inside ``pallas_call``)."""
    return _tracing_grid.get() is not None


def written_inputs(jaxpr) -> set[int]:
    """Positions (constvars then invars) of the Refs that ``jaxpr`` writes or accumulates."""
    position = {v: i for i, v in enumerate(itertools.chain(jaxpr.constvars, jaxpr.invars))}
    out = set()
    for eqn in jaxpr.eqns:
        for e in eqn.effects:
            if isinstance(e, (jc.WriteEffect, jc.AccumEffect)) and e.input in position:
                out.add(position[e.input])
    return out


def discharge_refs(jaxpr, *, allow_additional_outputs: bool = True, dce: bool = False):
    """Turns the Ref consts/inputs of ``jaxpr`` into values; writes become extra outputs.

    Returns ``(jaxpr, used_consts, aliases)``: the pure jaxpr (consts still as constvars),
    which of the original consts it still uses, and ``{output index: input index}`` (over
    constvars then invars of the result) for each written Ref's final value. Without
    ``allow_additional_outputs`` the final Ref values are dropped.
    """
    all_vars = list(itertools.chain(jaxpr.constvars, jaxpr.invars))
    is_ref = [isinstance(v.aval, jc.AbstractRef) for v in all_vars]
    if not any(is_ref):
        return jaxpr, [True] * len(jaxpr.constvars), {}
    flat = jc.convert_constvars_jaxpr(jaxpr)
    discharged = jc.state_discharge.discharge_state(
        jc.ClosedJaxpr(flat, ()), should_discharge=is_ref, lower=False
    ).jaxpr
    ref_positions = [i for i, r in enumerate(is_ref) if r]
    writes = written_inputs(jaxpr) if allow_additional_outputs else set()
    n_out = len(jaxpr.outvars)
    keep = [True] * n_out + [i in writes for i in ref_positions]
    n_consts = len(jaxpr.constvars)
    if dce:
        instantiate = [i in writes for i in range(n_consts)] + [True] * len(jaxpr.invars)
        discharged, used = jc.pe.dce_jaxpr(discharged, keep, instantiate=instantiate)
    else:
        discharged = discharged.replace(
            outvars=[v for k, v in zip(keep, discharged.outvars) if k])
        used = [True] * len(all_vars)
    used_consts = list(used[:n_consts])
    discharged = jc.convert_invars_to_constvars(discharged, sum(used_consts))
    new_position = list(itertools.accumulate(used, initial=-1))[1:]
    written = [new_position[i] for i in ref_positions if used[i] and i in writes]
    aliases = {n_out + k: j for k, j in enumerate(written)}
    return discharged, used_consts, aliases
