"""Lowering rules of the grid (``program_id``, ``num_programs``, ``axis_index``) and of
control flow (``cond``, ``fori_loop``/``scan``, ``while_loop``, calls, ``run_scoped``)."""

from __future__ import annotations

import jax.extend.core.primitives as P
import jax.numpy as jnp
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, memref, scf
from jaxlib.mosaic.python import tpu

from pallas_tpu._src import core_compat as cc
from pallas_tpu._src.lowering import types as T
from pallas_tpu._src.lowering.common import (
    RULES,
    aval_in,
    const,
    materialize,
    rule,
)
from pallas_tpu._src.lowering.engine import RefVal, lower_jaxpr

# ------------------------------------------------------------------------------------------
# Grid.


@rule(cc.program_id_p)
def _program_id(lctx, eqn):
    axis = eqn.params["axis"]
    if not lctx.grid_indices:
        raise ValueError("program_id is not available here (only in the kernel body)")
    if not 0 <= axis < len(lctx.grid_indices):
        raise ValueError(f"program_id({axis}) out of range for a grid of rank {len(lctx.grid)}")
    return lctx.grid_indices[axis]


@rule(cc.num_programs_p)
def _num_programs(lctx, eqn):
    axis = eqn.params["axis"]
    if not 0 <= axis < len(lctx.grid):
        raise ValueError(f"num_programs({axis}) out of range for a grid of rank {len(lctx.grid)}")
    return const((), jnp.int32, lctx.grid[axis])


@rule(cc.axis_index_p)
def _axis_index(lctx, eqn):
    """A shard_map mesh axis index, from the device's logical id (row-major over the
    mesh axes, as Mosaic numbers devices)."""
    name = eqn.params["axis_name"]
    if name in lctx.grid_names and lctx.grid_indices:  # a core axis of pl.kernel's mesh
        return lctx.grid_indices[lctx.grid_names.index(name)]
    names = [n for n, _ in lctx.mesh_axes]
    if name not in names:
        raise NotImplementedError(
            f"lax.axis_index({name!r}) in a kernel lowers only under jax.shard_map over a "
            f"mesh with that axis (mesh axes here: {names})"
        )
    i = names.index(name)
    stride = 1
    for _, size in lctx.mesh_axes[i + 1:]:
        stride *= size
    dev = tpu.device_id()
    if stride != 1:
        dev = arith.divsi(dev, const((), jnp.int32, stride))
    return arith.remsi(dev, const((), jnp.int32, lctx.mesh_axes[i][1]))


@rule(cc.multiple_of_p)
def _multiple_of(lctx, eqn, x):
    v = materialize(x, aval_in(eqn, 0))
    values = eqn.params["values"]
    m = values[0] if isinstance(values, (tuple, list)) else values
    return tpu.assume_multiple(v, int(m))



# ------------------------------------------------------------------------------------------
# Control flow.


def _types_of(avals):
    return [T.aval_type(a) for a in avals]


@rule(P.cond_p)
def _cond(lctx, eqn, index, *ops):
    branches = eqn.params["branches"]
    out_avals = [v.aval for v in eqn.outvars]
    idx_aval = aval_in(eqn, 0)
    idx = materialize(index, idx_aval)

    if len(branches) == 1:
        return _branch(lctx, branches[0], ops)
    if len(branches) == 2:  # pl.when / lax.cond: then is branch 1, else branch 0
        pred = arith.cmpi(arith.CmpIPredicate.ne, idx, const((), idx_aval.dtype, 0))
        op = scf.IfOp(pred, _types_of(out_avals), has_else=True)
        with ir.InsertionPoint(op.then_block):
            scf.yield_(_branch(lctx, branches[1], ops))
        with ir.InsertionPoint(op.else_block):
            scf.yield_(_branch(lctx, branches[0], ops))
        return list(op.results)

    def emit(k):  # lax.switch: a chain of scf.if on index == k
        if k == len(branches) - 1:
            return _branch(lctx, branches[k], ops)
        pred = arith.cmpi(arith.CmpIPredicate.eq, idx, const((), idx_aval.dtype, k))
        op = scf.IfOp(pred, _types_of(out_avals), has_else=True)
        with ir.InsertionPoint(op.then_block):
            scf.yield_(_branch(lctx, branches[k], ops))
        with ir.InsertionPoint(op.else_block):
            scf.yield_(emit(k + 1))
        return list(op.results)

    return emit(0)


def _branch(lctx, closed, ops):
    outs = lower_jaxpr(lctx, closed.jaxpr, closed.consts, list(ops))
    return [materialize(o, v.aval) for o, v in zip(outs, closed.jaxpr.outvars)]


@rule(P.scan_p)
def _scan(lctx, eqn, *args):
    p = eqn.params
    nconsts, ncarry = p["num_consts"], p["num_carry"]
    consts, carry, xs = args[:nconsts], args[nconsts:nconsts + ncarry], args[nconsts + ncarry:]
    if xs or len(eqn.outvars) != ncarry:
        raise NotImplementedError("lax.scan over arrays in kernels (use fori_loop / pl.loop)")
    if p["reverse"]:
        raise NotImplementedError("reverse scans in kernels")
    carry_avals = [aval_in(eqn, nconsts + i) for i in range(ncarry)]
    init = [materialize(c, a) for c, a in zip(carry, carry_avals)]
    lb = arith.constant(T.index(), 0)
    ub = arith.constant(T.index(), int(p["length"]))
    step = arith.constant(T.index(), 1)
    loop = scf.ForOp(lb, ub, step, init)
    with ir.InsertionPoint(loop.body):
        body = p["jaxpr"]
        outs = lower_jaxpr(lctx, body.jaxpr, body.consts, [*consts, *loop.inner_iter_args])
        scf.yield_([materialize(o, a) for o, a in zip(outs, carry_avals)])
    return list(loop.results)


@rule(P.while_p)
def _while(lctx, eqn, *args):
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = args[:nc], args[nc:nc + nb], args[nc + nb:]
    carry_avals = [aval_in(eqn, nc + nb + i) for i in range(len(carry))]
    types = _types_of(carry_avals)
    init = [materialize(c, a) for c, a in zip(carry, carry_avals)]
    op = scf.WhileOp(types, init)
    before = op.before.blocks.append(*types)
    with ir.InsertionPoint(before):
        cj = p["cond_jaxpr"]
        (pred,) = lower_jaxpr(lctx, cj.jaxpr, cj.consts, [*cconsts, *before.arguments])
        scf.condition(materialize(pred, cj.jaxpr.outvars[0].aval), list(before.arguments))
    after = op.after.blocks.append(*types)
    with ir.InsertionPoint(after):
        bj = p["body_jaxpr"]
        outs = lower_jaxpr(lctx, bj.jaxpr, bj.consts, [*bconsts, *after.arguments])
        scf.yield_([materialize(o, a) for o, a in zip(outs, carry_avals)])
    return list(op.results)


def _inline(param):
    def inline(lctx, eqn, *args):
        sub = eqn.params[param]
        if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
            return lower_jaxpr(lctx, sub.jaxpr, sub.consts, list(args))
        return lower_jaxpr(lctx, sub, (), list(args))

    return inline


RULES[P.jit_p] = _inline("jaxpr")
RULES[P.closed_call_p] = _inline("call_jaxpr")
RULES[P.custom_jvp_call_p] = _inline("call_jaxpr")
RULES[P.custom_vjp_call_p] = _inline("call_jaxpr")
RULES[P.remat_p] = _inline("jaxpr")
RULES[P.stop_gradient_p] = lambda lctx, eqn, x: materialize(x, aval_in(eqn, 0))


@rule(cc.run_scoped_p)
def _run_scoped(lctx, eqn, *consts):
    p = eqn.params
    jaxpr = p["jaxpr"]
    out_avals = [v.aval for v in jaxpr.outvars]
    region = tpu.RegionOp(_types_of(out_avals))
    with ir.InsertionPoint(region.body):
        refs = []
        for t in p["types"]:
            mt = T.memref_type(t.shape, t.dtype, t.memory_space)
            if T.is_semaphore(t.memory_space):
                m = tpu.sem_alloc(mt)
            else:
                m = memref.alloca(mt, [], [])
            refs.append(RefVal(m, t.dtype, t.memory_space, (False,) * len(t.shape)))
        outs = lower_jaxpr(lctx, jaxpr, (), [*consts, *refs])
        tpu.yield_([materialize(o, a) for o, a in zip(outs, out_avals)])
    return list(region.results)
