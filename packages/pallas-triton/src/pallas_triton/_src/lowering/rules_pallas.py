"""Triton lowering rules of the Pallas primitives: program ids, ref reads and writes
(``ref[...]``, masked ``pl.load``/``pl.store``, ``addupdate``), atomics, ``run_scoped``,
hints, debugging, and pallas-triton's own ``debug_barrier`` and inline assembly."""

from __future__ import annotations

import numpy as np

from pallas import plugins
from pallas_triton._src import jax_compat as jc
from pallas_triton._src import primitives as tp
from pallas_triton._src import refs
from pallas_triton._src.codegen import TritonLoweringError, Value, tl_dtype
from pallas_triton._src.lowering.engine import alloc_local, lower_jaxpr, rule


def _grid_axis(ctx, eqn, rank: int, fn: str) -> int:
    """The ``axis`` of ``pl.program_id``/``pl.num_programs``, checked against ``rank``."""
    axis = int(eqn.params["axis"])
    if not 0 <= axis < rank:
        raise TritonLoweringError(f"pl.{fn}({axis}) is out of range for the grid {ctx.grid}")
    return axis


@rule(plugins.program_id_p)
def _program_id(ctx, eqn, *invals):
    return [ctx.pids[_grid_axis(ctx, eqn, len(ctx.pids), "program_id")]]


@rule(plugins.num_programs_p)
def _num_programs(ctx, eqn, *invals):
    axis = _grid_axis(ctx, eqn, len(ctx.grid), "num_programs")
    return [Value(str(ctx.grid[axis]), (), np.int32, literal=True)]


@rule(plugins.multiple_of_p)
def _multiple_of(ctx, eqn, *invals):
    (x,) = invals
    if x.literal or x.shape == ():
        return [x]
    values = list(eqn.params["values"])
    arg = values[0] if len(values) == 1 else values
    return [ctx.em.assign(f"tl.multiple_of({x.expr}, {arg})", x.shape, x.dtype)]


def _split_transforms(eqn, rest):
    tree = eqn.params["tree"]
    n = tree.num_leaves
    return refs.unflatten_transforms(tree, rest[:n]), rest[n:]


@rule(jc.get_p)
def _get(ctx, eqn, *invals):
    ref, *rest = invals
    transforms, _ = _split_transforms(eqn, rest)
    return [refs.load(ctx.em, ref, transforms)]


@rule(jc.swap_p)
def _swap(ctx, eqn, *invals):
    ref, val, *rest = invals
    transforms, _ = _split_transforms(eqn, rest)
    want = ctx.is_used(eqn.outvars[0])
    old = refs.store(ctx.em, ref, transforms, val, want_old=want)
    return [old if old is not None else val]


@rule(jc.addupdate_p)
def _addupdate(ctx, eqn, *invals):
    ref, val, *rest = invals
    transforms, _ = _split_transforms(eqn, rest)
    cur = refs.load(ctx.em, ref, transforms)
    new = ctx.em.assign(f"{cur.expr} + {val.expr}", cur.shape, cur.dtype)
    refs.store(ctx.em, ref, transforms, new, want_old=False)
    return []


def _hints(eqn) -> str:
    parts = []
    cache = eqn.params.get("cache_modifier")
    if cache:
        parts.append(f'cache_modifier="{cache}"')
    evict = eqn.params.get("eviction_policy")
    if evict:
        parts.append(f'eviction_policy="{evict}"')
    if eqn.params.get("is_volatile"):
        parts.append("volatile=True")
    return ", ".join(parts)


@rule(plugins.load_p)
def _masked_load(ctx, eqn, *invals):
    ref, *rest = invals
    transforms, extra = _split_transforms(eqn, rest)
    it = iter(extra)
    mask = next(it) if eqn.params.get("has_mask") else None
    other = next(it) if eqn.params.get("has_other") else None
    return [refs.load(ctx.em, ref, transforms, mask=mask, other=other, extra=_hints(eqn))]


@rule(plugins.swap_p)
def _masked_swap(ctx, eqn, *invals):
    ref, val, *rest = invals
    transforms, extra = _split_transforms(eqn, rest)
    mask = extra[0] if eqn.params.get("has_mask") else None
    want = bool(eqn.outvars) and ctx.is_used(eqn.outvars[0])
    old = refs.store(ctx.em, ref, transforms, val, mask=mask, want_old=want,
                     extra=_hints(eqn))
    return [old if old is not None else val] if eqn.outvars else []


@rule(plugins.atomic_rmw_p)
def _atomic_rmw(ctx, eqn, *invals):
    ref, val, *rest = invals
    transforms, extra = _split_transforms(eqn, rest)
    mask = extra[0] if eqn.params["has_mask"] else None
    return [refs.atomic(ctx.em, eqn.params["op"], ref, transforms, val, mask=mask)]


@rule(plugins.atomic_cas_p)
def _atomic_cas(ctx, eqn, *invals):
    ref, cmp, val, *rest = invals
    transforms, _ = _split_transforms(eqn, rest)
    return [refs.atomic(ctx.em, "cas", ref, transforms, val, mask=None, cmp=cmp)]


@rule(tp.elementwise_inline_asm_p)
def _inline_asm(ctx, eqn, *invals):
    p = eqn.params
    outs = [(tuple(r.shape), r.dtype) for r in p["result_shape_dtypes"]]
    dtypes = [tl_dtype(d) for _, d in outs]
    dtype_arg = dtypes[0] if len(dtypes) == 1 else "(" + ", ".join(dtypes) + ",)"
    args = ", ".join(v.expr for v in invals)
    names = [ctx.em.fresh("asm") for _ in outs]
    target = names[0] if len(names) == 1 else ", ".join(names)
    ctx.em.line(f"{target} = tl.inline_asm_elementwise({p['asm']!r}, {p['constraints']!r}, "
                f"[{args}], dtype={dtype_arg}, is_pure=True, pack={int(p['pack'])})")
    return [Value(n, s, d) for n, (s, d) in zip(names, outs)]


@rule(plugins.run_scoped_p)
def _run_scoped(ctx, eqn, *invals):
    jaxpr = eqn.params["jaxpr"]
    news = [alloc_local(ctx.em, t, f"run_scoped buffer {i}", "scoped")
            for i, t in enumerate(eqn.params["types"])]
    return lower_jaxpr(ctx, jaxpr, [], [*invals, *news])


@rule(plugins.debug_print_p)
def _debug_print(ctx, eqn, *invals):
    fmt = eqn.params["fmt"]
    prefix = fmt.split("{")[0] if "{" in fmt else fmt
    args = ", ".join(v.expr for v in invals)
    ctx.em.line(f"tl.device_print({prefix!r}{', ' if args else ''}{args})")
    return []


@rule(plugins.debug_check_p)
def _debug_check(ctx, eqn, *invals):
    (cond,) = invals
    ctx.em.line(f"tl.device_assert({cond.expr}, {eqn.params['message']!r})")
    return []


@rule(plugins.delay_p)
def _delay(ctx, eqn, *invals):
    return []


@rule(tp.debug_barrier_p)
def _debug_barrier(ctx, eqn, *invals):
    ctx.em.line("tl.debug_barrier()")
    return []
