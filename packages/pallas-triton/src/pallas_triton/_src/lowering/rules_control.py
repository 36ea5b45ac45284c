"""Triton lowering rules of calls and control flow: inlined calls (``jit``,
``custom_jvp``/``custom_vjp``, ``checkpoint``), ``cond``/``switch`` as ``if``/``elif``,
``scan`` and ``while`` (a ``fori_loop`` becomes a ``for`` over ``range``)."""

from __future__ import annotations

import numpy as np
from jax import lax
from jax.extend.core import primitives as core_prims

from pallas_triton._src.codegen import (
    GlobalRef,
    LocalRef,
    Value,
    check_pow2,
    dtype_name,
    tl_dtype,
    typed,
    unsupported,
)
from pallas_triton._src.lowering.engine import (
    PASSES_STACKED,
    check_not_padded,
    jaxpr_and_consts,
    lower_jaxpr,
    rule,
)

_CALLS = (core_prims.jit_p, core_prims.closed_call_p, core_prims.remat_p,
          core_prims.custom_jvp_call_p, core_prims.custom_vjp_call_p, core_prims.custom_lin_p)
PASSES_STACKED.update((*_CALLS, lax.cond_p))


@rule(*_CALLS)
def _inline(ctx, eqn, *invals):
    p = eqn.params
    sub = p.get("jaxpr") or p.get("call_jaxpr") or p.get("fun_jaxpr")
    if sub is None:
        raise unsupported(f"the call primitive {eqn.primitive.name!r}")
    jaxpr, consts = jaxpr_and_consts(sub)
    n = len(jaxpr.invars)
    return lower_jaxpr(ctx, jaxpr, consts, invals[len(invals) - n:])


def _carry_vars(ctx, vals) -> list[Value]:
    """Fresh, typed variables initialised from ``vals`` (loop carries, branch results)."""
    out = []
    for v in vals:
        if isinstance(v, (GlobalRef, LocalRef)):
            out.append(v)
            continue
        t = typed(ctx.em, v)
        out.append(ctx.em.assign(t.expr, v.shape, v.dtype, prefix="c"))
    return out


def _assign_all(ctx, targets: list[Value], vals: list[Value]) -> None:
    check_not_padded(vals, "carried by a loop or returned by a cond branch")
    tmps = []
    for v in vals:
        tmps.append(typed(ctx.em, v) if v.literal else v)
    # Copy first, so that a carry passed through to another position reads its old value.
    staged = [ctx.em.assign(t.expr, t.shape, t.dtype, prefix="t") for t in tmps]
    for tgt, s in zip(targets, staged):
        ctx.em.line(f"{tgt.expr} = {s.expr}")


@rule(lax.cond_p)
def _cond(ctx, eqn, *invals):
    branches = eqn.params["branches"]
    index, *ops = invals
    out_avals = [v.aval for v in eqn.outvars]
    results = []
    em = ctx.em
    for aval in out_avals:
        shape = tuple(aval.shape)
        results.append(em.assign(f"tl.zeros({list(shape)}, {tl_dtype(aval.dtype)})",
                                 shape, aval.dtype, prefix="r"))
    if index.literal:
        jaxpr, consts = jaxpr_and_consts(branches[int(index.expr)])
        outs = lower_jaxpr(ctx, jaxpr, consts, ops)
        return outs
    idx = index.expr
    if len(branches) == 2:
        conds = [f"{idx} == 0", None]
    else:
        conds = [f"{idx} <= {i}" if i == 0 else f"{idx} == {i}" for i in range(len(branches) - 1)]
        conds.append(None)
    for i, (br, c) in enumerate(zip(branches, conds)):
        if c is not None:
            em.line(("if " if i == 0 else "elif ") + f"{c}:")
        else:
            em.line("else:")
        with em.indent():
            start = len(em.lines)
            jaxpr, consts = jaxpr_and_consts(br)
            outs = lower_jaxpr(ctx, jaxpr, consts, ops)
            if results:
                _assign_all(ctx, results, outs)
            if len(em.lines) == start:
                em.line("pass")
    # Triton's if/elif/else: the last "else" also catches out-of-range indices, as
    # lax.cond clamps the index.
    return results


@rule(lax.scan_p)
def _scan(ctx, eqn, *invals):
    """``for`` over the carries; ``xs`` rows are selected and ``ys`` rows placed with
    masks over the leading axis (Triton tensors cannot be indexed by a loop index).
    Stacked arrays have a power-of-two number of rows (``tl.arange``): for another
    length they are padded, and only scans may read them (``Value.rows``), such as the
    loops of a generated backward kernel over the residuals its primal loop saved."""
    p = eqn.params
    nc, ncarry, length = p["num_consts"], p["num_carry"], int(p["length"])
    jaxpr, jconsts = jaxpr_and_consts(p["jaxpr"])
    consts, carry, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
    y_avals = [v.aval for v in jaxpr.outvars[ncarry:]]
    padded = 1 << max(length - 1, 0).bit_length()
    for x in xs:
        if isinstance(x, (GlobalRef, LocalRef)) or x.shape[:1] != (padded,):
            check_pow2((length,), "lax.scan over arrays (its length)")
    em = ctx.em
    check_not_padded(carry, "carried by a lax.scan")
    carries = _carry_vars(ctx, carry)
    ys = []
    for aval in y_avals:
        shape = (padded, *aval.shape)
        y = em.assign(f"tl.zeros({list(shape)}, {tl_dtype(aval.dtype)})", shape,
                      aval.dtype, prefix="ys")
        ys.append(Value(y.expr, y.shape, y.dtype, rows=None if padded == length else length))
    it = em.fresh("it")
    em.line(f"for {it} in range(0, {length}):")
    with em.indent():
        start = len(em.lines)
        idx = f"({length - 1} - {it})" if p.get("reverse") else it
        rows = []
        for x in xs:
            rank = len(x.shape)
            sel = _row_selector(idx, padded, rank)
            wide = f"{x.expr}.to(tl.float32)" if dtype_name(x.dtype) == "bfloat16" else x.expr
            zero = "0" if not np.dtype(x.dtype) == np.bool_ else "False"
            rows.append(em.assign(
                f"tl.sum(tl.where({sel}, {wide}, {zero}), axis=0).to({tl_dtype(x.dtype)})",
                x.shape[1:], x.dtype))
        outs = lower_jaxpr(ctx, jaxpr, jconsts, [*consts, *carries, *rows])
        new_carry, new_ys = outs[:ncarry], outs[ncarry:]
        check_not_padded(new_ys, "stacked again by a lax.scan")
        placed = []
        for y, acc in zip(new_ys, ys):
            rank = len(acc.shape)
            sel = _row_selector(idx, padded, rank)
            yv = typed(em, y)
            row = yv.expr if not yv.shape else f"{yv.expr}[None, {', '.join([':'] * len(yv.shape))}]"
            placed.append(Value(f"tl.where({sel}, {row}, {acc.expr})", acc.shape, acc.dtype))
        if carries or ys:
            _assign_all(ctx, [*carries, *ys], [*new_carry, *placed])
        if len(em.lines) == start:
            em.line("pass")
    return [*carries, *ys]


def _row_selector(idx: str, length: int, rank: int) -> str:
    ar = f"tl.arange(0, {length})"
    if rank > 1:
        ar = f"{ar}[:, {', '.join(['None'] * (rank - 1))}]"
    return f"({ar} == {idx})"


@rule(lax.while_p)
def _while(ctx, eqn, *invals):
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cjaxpr, cconsts = jaxpr_and_consts(p["cond_jaxpr"])
    bjaxpr, bconsts = jaxpr_and_consts(p["body_jaxpr"])
    cargs, bargs, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
    carries = _carry_vars(ctx, init)
    em = ctx.em
    if _is_fori(cjaxpr, cconsts, bjaxpr, bn):
        # A fori_loop with traced bounds: a ``for`` over ``range(lo, hi)``, which
        # Triton's software pipeliner handles (it does not pipeline ``while`` loops).
        it = em.fresh("it")
        em.line(f"for {it} in range({carries[0].expr}, {carries[1].expr}):")
        with em.indent():
            outs = lower_jaxpr(ctx, bjaxpr, bconsts, [*bargs, *carries])
            _assign_all(ctx, carries, outs)
        return carries
    (pred,) = lower_jaxpr(ctx, cjaxpr, cconsts, [*cargs, *carries])
    pvar = em.assign(typed(em, pred).expr, (), np.bool_, prefix="pred")
    em.line(f"while {pvar.expr}:")
    with em.indent():
        outs = lower_jaxpr(ctx, bjaxpr, bconsts, [*bargs, *carries])
        if carries:
            _assign_all(ctx, carries, outs)
        (pred2,) = lower_jaxpr(ctx, cjaxpr, cconsts, [*cargs, *carries])
        em.line(f"{pvar.expr} = {typed(em, pred2).expr}")
    return carries


def _is_fori(cjaxpr, cconsts, bjaxpr, bn: int) -> bool:
    """Whether a ``while`` is ``lax.fori_loop``'s: carries ``(i, upper, *x)``, condition
    ``i < upper``, body ``(i + 1, upper, ...)`` with ``upper`` passed through."""
    if cconsts or len(cjaxpr.invars) < 2 or len(cjaxpr.eqns) != 1:
        return False
    (ceqn,) = cjaxpr.eqns
    i, upper = cjaxpr.invars[:2]
    if (ceqn.primitive is not lax.lt_p or list(ceqn.invars) != [i, upper]
            or list(ceqn.outvars) != list(cjaxpr.outvars)
            or i.aval.dtype != upper.aval.dtype or i.aval.shape != ()
            or not np.issubdtype(i.aval.dtype, np.integer)):
        return False
    bi, bupper = bjaxpr.invars[bn:bn + 2]
    if bjaxpr.outvars[1] is not bupper:
        return False
    for e in bjaxpr.eqns:
        if e.outvars and e.outvars[0] is bjaxpr.outvars[0]:
            one = e.invars[1] if len(e.invars) == 2 else None
            return (e.primitive is lax.add_p and e.invars[0] is bi
                    and getattr(one, "val", None) is not None and int(one.val) == 1)
    return False
