"""Lowering rules of the grid (``program_id``, ``num_programs``, ``axis_index``) and of
control flow (``cond``, ``fori_loop``/``scan``, ``while_loop``, calls, ``run_scoped``)."""

from __future__ import annotations

import jax.extend.core as jex
import jax.extend.core.primitives as P
import jax.numpy as jnp
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, scf, vector
from jaxlib.mosaic.python import tpu

from pallas_tpu._src import core_compat as cc
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.core_compat import dynamic_grid_dim
from pallas_tpu._src.lowering import types as T
from pallas_tpu._src.lowering.common import (
    alloc_scratch,
    aval_in,
    cmpi,
    const,
    materialize,
)
from pallas_tpu._src.lowering.engine import lower_jaxpr, rule
from pallas_tpu._src.lowering.values import RefVal

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
    if lctx.grid[axis] is dynamic_grid_dim:  # a size given at run time
        return tpu.iteration_bound(axis)
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
        pred = cmpi(arith.CmpIPredicate.ne, idx, const((), idx_aval.dtype, 0))
        op = scf.IfOp(pred, _types_of(out_avals), has_else=True)
        with ir.InsertionPoint(op.then_block):
            scf.yield_(_branch(lctx, branches[1], ops))
        with ir.InsertionPoint(op.else_block):
            scf.yield_(_branch(lctx, branches[0], ops))
        return list(op.results)

    def emit(k):  # lax.switch: a chain of scf.if on index == k
        if k == len(branches) - 1:
            return _branch(lctx, branches[k], ops)
        pred = cmpi(arith.CmpIPredicate.eq, idx, const((), idx_aval.dtype, k))
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
        return _unrolled_scan(lctx, eqn, consts, carry, xs)
    if p["reverse"]:
        raise NotImplementedError("reverse scans in kernels")
    carry_avals = [aval_in(eqn, nconsts + i) for i in range(ncarry)]
    body = p["jaxpr"]
    length, unroll = int(p["length"]), int(p.get("unroll", 1) or 0)

    def bodies(vals, n):  # n copies of the body, in sequence
        for _ in range(n):
            outs = lower_jaxpr(lctx, body.jaxpr, body.consts, [*consts, *vals])
            vals = [materialize(o, a) for o, a in zip(outs, carry_avals)]
        return vals

    init = [materialize(c, a) for c, a in zip(carry, carry_avals)]
    # As upstream lowers lax.scan/fori_loop(unroll=k): k bodies per scf.for step, the
    # leftover steps after the loop; unroll=0 or True (k >= length) unrolls it all.
    if unroll == 0 or unroll >= length:
        return bodies(init, length)
    steps = length // unroll
    lb = arith.constant(T.index(), 0)
    ub = arith.constant(T.index(), steps)
    step = arith.constant(T.index(), 1)
    loop = scf.ForOp(lb, ub, step, init)
    with ir.InsertionPoint(loop.body):
        scf.yield_(bodies(list(loop.inner_iter_args), unroll))
    return bodies(list(loop.results), length - steps * unroll)


MAX_UNROLLED_SCAN = 64


def _row(x: ir.Value, i: int, shape) -> ir.Value:
    """Row ``i`` (along the leading axis) of the vector ``x`` of ``shape``, as a value of
    ``shape[1:]`` (a scalar when ``x`` is 1-D)."""
    if len(shape) == 1:
        return vector.extract(x, [], [i])
    t = ir.VectorType(x.type)
    row = vector.extract_strided_slice(ir.VectorType.get([1, *shape[1:]], t.element_type), x,
                                       [i] + [0] * (len(shape) - 1), [1, *shape[1:]],
                                       [1] * len(shape))
    return vector.shape_cast(ir.VectorType.get(list(shape[1:]), t.element_type), row)


def _stack(rows: list, aval) -> ir.Value:
    """Stacks values of ``aval.shape[1:]`` along a new leading axis (``tpu.concatenate``)."""
    one = T.value_type((1, *aval.shape[1:]), aval.dtype)
    pieces = [vector.broadcast(one, r) if not aval.shape[1:] else vector.shape_cast(one, r)
              for r in rows]
    if len(pieces) == 1:
        return pieces[0]
    return tpu.concatenate(pieces, 0, results=[T.aval_type(aval)])


def _unrolled_scan(lctx, eqn, consts, carry, xs):
    """``lax.scan`` over arrays: Mosaic vectors cannot be indexed dynamically, so the scan
    is unrolled (static row slices of ``xs``, ``ys`` stacked with ``tpu.concatenate``)."""
    p = eqn.params
    nconsts, ncarry, length = p["num_consts"], p["num_carry"], int(p["length"])
    if length > MAX_UNROLLED_SCAN:
        raise NotImplementedError(
            f"lax.scan over arrays of length {length} in a Mosaic TPU kernel (scans over "
            f"arrays are unrolled, up to {MAX_UNROLLED_SCAN} steps; use fori_loop over a ref)"
        )
    carry_avals = [aval_in(eqn, nconsts + i) for i in range(ncarry)]
    x_avals = [aval_in(eqn, nconsts + ncarry + i) for i in range(len(xs))]
    y_avals = [v.aval for v in eqn.outvars[ncarry:]]
    xs = [materialize(x, a) for x, a in zip(xs, x_avals)]
    state = [materialize(c, a) for c, a in zip(carry, carry_avals)]
    ys: list[list] = [[None] * length for _ in y_avals]
    body = p["jaxpr"]
    for i in (reversed(range(length)) if p["reverse"] else range(length)):
        rows = [_row(x, i, a.shape) for x, a in zip(xs, x_avals)]
        outs = lower_jaxpr(lctx, body.jaxpr, body.consts, [*consts, *state, *rows])
        outs = [materialize(o, v.aval) for o, v in zip(outs, body.jaxpr.outvars)]
        state = outs[:ncarry]
        for k, y in enumerate(outs[ncarry:]):
            ys[k][i] = y
    return [*state, *[_stack(rows, a) for rows, a in zip(ys, y_avals)]]


def _is_fori(p) -> bool:
    """Whether a ``while_loop`` is ``fori_loop``'s form, ``(i, upper, *x)`` with
    ``i < upper`` as its condition, ``i + 1`` and ``upper`` carried on by its body (the
    form a ``fori_loop`` with bounds known only at run time takes)."""
    cj, bj, nb = p["cond_jaxpr"].jaxpr, p["body_jaxpr"].jaxpr, p["body_nconsts"]
    if p["cond_nconsts"] or len(cj.invars) < 2 or len(cj.eqns) != 1:
        return False
    (lt,) = cj.eqns
    i, upper = cj.invars[:2]
    if (lt.primitive is not P.lt_p or list(lt.invars) != [i, upper]
            or cj.outvars[0] is not lt.outvars[0] or i.aval.dtype != jnp.int32
            or upper.aval.dtype != jnp.int32 or i.aval.shape or upper.aval.shape):
        return False
    bi, bupper = bj.invars[nb:nb + 2]
    if bj.outvars[1] is not bupper:
        return False
    inc = next((e for e in bj.eqns if e.outvars[0] is bj.outvars[0]), None)
    if inc is None or inc.primitive is not P.add_p:
        return False
    a, b = inc.invars
    one = [v for v in (a, b) if isinstance(v, jex.Literal) and v.val == 1]
    return bool(one) and bi in (a, b)


def _fori(lctx, eqn, bconsts, carry, carry_avals):
    """A ``fori_loop`` with run-time bounds as ``scf.for`` over i32 (as upstream lowers
    it): no per-step compare and add of an ``scf.while``."""
    p = eqn.params
    lb, ub, *init = [materialize(c, a) for c, a in zip(carry, carry_avals)]
    step = const((), jnp.int32, 1)
    loop = scf.ForOp(lb, ub, step, init)
    with ir.InsertionPoint(loop.body):
        bj = p["body_jaxpr"]
        outs = lower_jaxpr(lctx, bj.jaxpr, bj.consts,
                           [*bconsts, loop.induction_variable, ub, *loop.inner_iter_args])
        scf.yield_([materialize(o, a) for o, a in zip(outs[2:], carry_avals[2:])])
    # The counter ends at upper, or stays at lower when the loop does not run.
    return [arith.maxsi(lb, ub), ub, *loop.results]


@rule(P.while_p)
def _while(lctx, eqn, *args):
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = args[:nc], args[nc:nc + nb], args[nc + nb:]
    carry_avals = [aval_in(eqn, nc + nb + i) for i in range(len(carry))]
    if _is_fori(p):
        return _fori(lctx, eqn, bconsts, carry, carry_avals)
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


rule(P.jit_p)(_inline("jaxpr"))
rule(P.closed_call_p)(_inline("call_jaxpr"))
rule(P.custom_jvp_call_p)(_inline("call_jaxpr"))
rule(P.custom_vjp_call_p)(_inline("call_jaxpr"))
rule(P.remat_p)(_inline("jaxpr"))
rule(P.stop_gradient_p, P.sharding_constraint_p, jc.reshard_p)(
    lambda lctx, eqn, x: materialize(x, aval_in(eqn, 0)))


@rule(cc.run_scoped_p)
def _run_scoped(lctx, eqn, *consts):
    p = eqn.params
    jaxpr = p["jaxpr"]
    out_avals = [v.aval for v in jaxpr.outvars]
    region = tpu.RegionOp(_types_of(out_avals))
    with ir.InsertionPoint(region.body):
        refs = []
        for t in p["types"]:
            space = T.scratch_space(t.memory_space)
            mt = T.memref_type(t.shape, t.dtype, space)
            m = alloc_scratch(mt, space)
            refs.append(RefVal(m, t.dtype, space, (False,) * len(t.shape)))
        outs = lower_jaxpr(lctx, jaxpr, (), [*consts, *refs])
        tpu.yield_([materialize(o, a) for o, a in zip(outs, out_avals)])
    return list(region.results)
