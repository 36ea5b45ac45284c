"""``run_scoped``: buffers allocated for the extent of a function inside a kernel."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.interpreter.evaluator import Cell, eval_jaxpr
from pallas._src.interpreter.rules import register_interpret_rule
from pallas._src.jaxpr_util import split_list
from pallas._src.memory import (
    MemoryRef,
    as_memory_ref,
    is_buffer_type,
    is_semaphore_space,
    uninitialized_value,
)

run_scoped_p = jc.Primitive("run_scoped")
run_scoped_p.multiple_results = True


def _as_memory_ref(t) -> MemoryRef:
    m = as_memory_ref(t)
    if m is None:
        raise TypeError(
            f"run_scoped takes buffer types such as pltpu.VMEM(shape, dtype), "
            f"pl.ANY(shape, dtype) or a semaphore type (plgpu.SemaphoreType.REGULAR); "
            f"got {t!r}"
        )
    return m


def run_scoped(f: Callable[..., Any], *types: Any, collective_axes=(), **kw_types: Any) -> Any:
    """Calls ``f`` with fresh refs of the given types; they live only during the call."""
    flat_types, tree = jax.tree_util.tree_flatten(
        (types, kw_types), is_leaf=is_buffer_type)
    mem_types = [_as_memory_ref(t) for t in flat_types]
    avals = [t.get_ref_aval() for t in mem_types]

    def flat_f(*refs):
        args, kwargs = jax.tree_util.tree_unflatten(tree, refs)
        out = f(*args, **kwargs)
        out_flat, out_tree = jax.tree_util.tree_flatten(out)
        flat_f.out_tree = out_tree
        return out_flat

    jaxpr, out_avals, consts = jc.trace_kernel_to_jaxpr(flat_f, avals, "run_scoped body")
    jaxpr = jc.convert_constvars_jaxpr(jaxpr)
    outs = run_scoped_p.bind(
        *consts, jaxpr=jaxpr, types=tuple(mem_types), num_consts=len(consts),
        collective_axes=collective_axes if isinstance(collective_axes, tuple)
        else (collective_axes,),
    )
    return jax.tree_util.tree_unflatten(flat_f.out_tree, outs)


def with_scoped(*types: Any, collective_axes=(), **kw_types: Any):
    """Decorator form of :func:`run_scoped`, as upstream: the decorated ``f`` becomes a
    function that, each time it is called with some arguments, runs ``f`` with those
    arguments followed by fresh refs of ``types`` (and ``kw_types`` as keywords)."""

    def decorator(f):
        @functools.wraps(f)
        def scoped(*args, **kwargs):
            def body(*refs, **kw_refs):
                return f(*args, *refs, **kwargs, **kw_refs)

            return run_scoped(body, *types, collective_axes=collective_axes, **kw_types)

        return scoped

    return decorator


def _run_scoped_abstract_eval(*args, jaxpr, types, num_consts, collective_axes):
    return [v.aval for v in jaxpr.outvars], operand_effects(jaxpr, num_consts)


def operand_effects(jaxpr, num_operands: int) -> set:
    """The effects of ``jaxpr`` as seen by an equation passing its first invars.

    Input effects on those invars move to the operand positions; effects on the
    remaining invars (buffers the equation allocates itself) disappear.
    """
    pos = {v: i for i, v in enumerate(jaxpr.invars)}
    out = set()
    for e in jaxpr.effects:
        if isinstance(e, jc.effects.JaxprInputEffect):
            i = e.input if isinstance(e.input, int) else pos.get(e.input)
            if i is not None and i < num_operands:
                out.add(e.replace(i))
        else:
            out.add(e)
    return out


run_scoped_p.def_effectful_abstract_eval(_run_scoped_abstract_eval)


@jc.register_partial_discharge_rule(run_scoped_p)
def _run_scoped_discharge(should_discharge, in_avals, out_avals, *args, jaxpr, types,
                          num_consts, collective_axes):
    """Discharges the captured refs asked for (``jax`` state discharge of a jaxpr that
    calls ``run_scoped``): inside the body they become values, and their final values
    are extra results; the scope's own buffers stay refs it allocates."""
    body = jc.discharge_state(jc.ClosedJaxpr(jaxpr, ()),
                              should_discharge=[*should_discharge, *([False] * len(types))])
    new_jaxpr = jc.convert_constvars_jaxpr(body.jaxpr)
    outs = run_scoped_p.bind(*body.consts, *args, jaxpr=new_jaxpr, types=types,
                             num_consts=len(body.consts) + num_consts,
                             collective_axes=collective_axes)
    n = len(jaxpr.outvars)
    final = iter(outs[n:])
    return [next(final) if d else None for d in should_discharge], outs[:n]


def fresh_cell(t: MemoryRef, origin: str, check_uninitialized: bool) -> Cell:
    """A cell for a newly allocated buffer: semaphores start at zero, buffer types that
    define ``initial_value()`` (e.g. a zeroed accumulator) at that, others poisoned."""
    initial = getattr(t, "initial_value", None)
    if callable(initial):
        value = jnp.broadcast_to(jnp.asarray(initial(), t.dtype), t.shape)
        init = jnp.ones(t.shape, jnp.bool_) if check_uninitialized else None
    elif is_semaphore_space(t.memory_space):
        value = jnp.zeros(t.shape, t.dtype)
        init = None
    else:
        value = uninitialized_value(t.shape, t.dtype)
        init = jnp.zeros(t.shape, jnp.bool_) if check_uninitialized else None
    return Cell(value, origin, init, t.memory_space)


@register_interpret_rule(run_scoped_p)
def _run_scoped_rule(ctx, eqn, invals):
    p = eqn.params
    new = [
        fresh_cell(t, f"run_scoped buffer {i}", ctx.check_uninitialized)
        for i, t in enumerate(p["types"])
    ]
    return eval_jaxpr(ctx, p["jaxpr"], (), [*invals, *new])


# Refs a kernel allocates with JAX's own ``jax.empty_ref(ty, memory_space=...)`` or
# ``jax.new_ref(value, memory_space=...)`` are scratch, as ``run_scoped``'s buffers: they
# live until the kernel (program) ends.


@register_interpret_rule(jc.empty_ref_p)
def _empty_ref_rule(ctx, eqn, invals):
    ty = eqn.params["ty"]
    t = MemoryRef(jc.ShapedArray(ty.shape, ty.dtype), eqn.params["memory_space"])
    return [fresh_cell(t, "jax.empty_ref buffer", ctx.check_uninitialized)]


@register_interpret_rule(jc.new_ref_p)
def _new_ref_rule(ctx, eqn, invals):
    (value,) = invals
    init = jnp.ones(jnp.shape(value), jnp.bool_) if ctx.check_uninitialized else None
    return [Cell(value, "jax.new_ref buffer", init, eqn.params["memory_space"])]


@register_interpret_rule(jc.free_ref_p)
def _free_ref_rule(ctx, eqn, invals):
    return []


def _run_scoped_jvp(primals, tangents, *, jaxpr, types, num_consts, collective_axes):
    """``run_scoped`` over primal and tangent buffers (floating buffers get tangents)."""
    nz_consts = [type(t) is not jc.Zero for t in tangents]
    nz_scoped = [jnp.issubdtype(t.inner_aval.dtype, jnp.inexact) for t in types]
    jvp, out_nz = jc.jvp_jaxpr(jc.ClosedJaxpr(jaxpr, ()), [*nz_consts, *nz_scoped],
                               instantiate=False)
    avals = [v.aval for v in jvp.jaxpr.invars]
    n_p = len(nz_consts) + len(nz_scoped)
    c_avals, s_avals = avals[:num_consts], avals[num_consts:n_p]
    n_tc = sum(nz_consts)
    tc_avals, ts_avals = avals[n_p : n_p + n_tc], avals[n_p + n_tc :]
    bounds = [num_consts, num_consts + n_tc, num_consts + n_tc + len(s_avals)]

    def body(*args):
        c, tc, sc, ts = split_list(args, bounds)
        return jc.core.eval_jaxpr(jvp.jaxpr, jvp.consts, *c, *sc, *tc, *ts)

    new_jaxpr, _, consts = jc.trace_kernel_to_jaxpr(
        body, [*c_avals, *tc_avals, *s_avals, *ts_avals], "run_scoped jvp body")
    new_jaxpr = jc.convert_constvars_jaxpr(new_jaxpr)
    t_types = tuple(t for t, nz in zip(types, nz_scoped) if nz)
    t_consts = [t for t in tangents if type(t) is not jc.Zero]
    outs = run_scoped_p.bind(*consts, *primals, *t_consts, jaxpr=new_jaxpr,
                             types=(*types, *t_types),
                             num_consts=len(consts) + num_consts + n_tc,
                             collective_axes=collective_axes)
    n_out = len(out_nz)
    p_out, t_it = outs[:n_out], iter(outs[n_out:])
    t_out = [next(t_it) if nz else jc.Zero(jax.typeof(p).to_tangent_aval())
             for p, nz in zip(p_out, out_nz)]
    return list(p_out), t_out


jc.primitive_jvps[run_scoped_p] = _run_scoped_jvp
