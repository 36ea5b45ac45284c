"""Lowering rules of control flow: ``jit``/``closed_call``/custom derivatives (inlined),
``fori_loop``/``scan`` without scanned operands, ``while_loop``, ``cond``/``pl.when``.

Loop carries and branch results become ``scf`` block arguments and results: a scalar is
one value, a warpgroup array is its registers (in the strided layout of its shape).
"""

from __future__ import annotations

import jax.extend.core.primitives as P
import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, scf

from pallas_mosaic_gpu._src.lowering import small
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import Lit, lower_jaxpr, rule


def _flatten(vals, avals):
    """(flat ir.Values, how to rebuild) for carries of ``avals``."""
    flat, specs = [], []
    for x, a in zip(vals, avals):
        if not a.shape:
            flat.append(V.scalar(x, a))
            specs.append(None)
        elif small.is_small(a.shape):
            vals_ = small.to_small(x, a, a.shape).values
            flat.extend(vals_.flat)
            specs.append(("small", tuple(a.shape)))
        else:
            arr = V.to_strided(V.array(x, a))
            flat.extend(arr.registers.flat)
            specs.append((arr.layout, arr.is_signed, arr.registers.shape))
    return flat, specs


def _unflatten(flat, specs):
    out, k = [], 0
    for s in specs:
        if s is None:
            out.append(flat[k])
            k += 1
            continue
        if s[0] == "small":
            n = int(np.prod(s[1]))
            out.append(small.Small(np.array(flat[k:k + n], dtype=object).reshape(s[1])))
            k += n
            continue
        layout, is_signed, shape = s
        n = int(np.prod(shape))
        regs = np.empty(shape, dtype=object)
        regs.flat[:] = list(flat[k:k + n])
        k += n
        out.append(V.FragmentedArray(_registers=regs, _layout=layout, _is_signed=is_signed))
    return out


def _inline(lctx, closed, args):
    return lower_jaxpr(lctx, closed.jaxpr, closed.consts, list(args))


@rule(P.jit_p, P.closed_call_p)
def _call(lctx, eqn, *args):
    sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
    return _inline(lctx, sub, args)


@rule(P.custom_jvp_call_p)
def _custom_jvp(lctx, eqn, *args):
    return _inline(lctx, eqn.params["call_jaxpr"], args)


@rule(P.custom_vjp_call_p)
def _custom_vjp(lctx, eqn, *args):
    sub = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
    return _inline(lctx, sub, args)


@rule(P.scan_p)
def _scan(lctx, eqn, *args):
    p = eqn.params
    nc, ncarry, length = p["num_consts"], p["num_carry"], int(p["length"])
    closed = p["jaxpr"]
    if len(args) != nc + ncarry or len(eqn.outvars) != ncarry:
        raise NotImplementedError("scan over arrays (only fori_loop-style scans lower)")
    consts, init = args[:nc], args[nc:]
    avals = [v.aval for v in eqn.invars[nc:]]
    flat, specs = _flatten(init, avals)
    lo, hi, one = (V.const(v, V.index()) for v in (0, length, 1))
    loop = scf.ForOp(lo, hi, one, flat)
    with ir.InsertionPoint(loop.body):
        carry = _unflatten(list(loop.inner_iter_args), specs)
        outs = _inline(lctx, closed, [*consts, *carry])
        new, _ = _flatten(outs, avals)
        scf.YieldOp(new)
    return _unflatten(list(loop.results), specs)


@rule(P.while_p)
def _while(lctx, eqn, *args):
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = args[:cn], args[cn:cn + bn], args[cn + bn:]
    avals = [v.aval for v in eqn.invars[cn + bn:]]
    flat, specs = _flatten(init, avals)
    types = [v.type for v in flat]
    op = scf.WhileOp(types, flat)
    before = op.before.blocks.append(*types)
    with ir.InsertionPoint(before):
        carry = _unflatten(list(before.arguments), specs)
        (c,) = _inline(lctx, p["cond_jaxpr"], [*cconsts, *carry])
        scf.ConditionOp(V.scalar(c, p["cond_jaxpr"].out_avals[0]), list(before.arguments))
    after = op.after.blocks.append(*types)
    with ir.InsertionPoint(after):
        carry = _unflatten(list(after.arguments), specs)
        outs = _inline(lctx, p["body_jaxpr"], [*bconsts, *carry])
        new, _ = _flatten(outs, avals)
        scf.YieldOp(new)
    return _unflatten(list(op.results), specs)


@rule(P.cond_p)
def _cond(lctx, eqn, index, *args):
    branches = eqn.params["branches"]
    avals = [v.aval for v in eqn.outvars]
    idx = V.scalar(index, eqn.invars[0].aval)
    if isinstance(index, Lit):
        return _inline(lctx, branches[int(np.asarray(index.val))], args)
    return _emit_branches(lctx, idx, branches, args, avals)


def _emit_branches(lctx, idx, branches, args, avals):
    if len(branches) == 1:
        return _inline(lctx, branches[0], args)
    # if idx == 0: branch 0 else: the rest (nested).
    if isinstance(idx.type, ir.IntegerType) and ir.IntegerType(idx.type).width == 1:
        pred = arith.cmpi(arith.CmpIPredicate.eq, idx, V.const(0, idx.type))
    else:
        pred = arith.cmpi(arith.CmpIPredicate.sle, idx, V.const(0, idx.type))
    specs_holder = {}

    def emit(block_fn):
        outs = block_fn()
        flat, specs = _flatten(outs, avals)
        specs_holder["specs"] = specs
        return flat

    # Every branch yields its results in the strided layout of their shapes.
    types = _result_types(avals)
    if_op = scf.IfOp(pred, types, has_else=True)
    with ir.InsertionPoint(if_op.then_block):
        scf.YieldOp(emit(lambda: _inline(lctx, branches[0], args)))
    with ir.InsertionPoint(if_op.else_block):
        rest = branches[1:]
        one = V.const(1, idx.type) if not (
            isinstance(idx.type, ir.IntegerType) and ir.IntegerType(idx.type).width == 1) \
            else None
        nidx = arith.subi(idx, one) if one is not None else None
        if len(rest) == 1 or nidx is None:
            scf.YieldOp(emit(lambda: _inline(lctx, rest[-1], args)))
        else:
            scf.YieldOp(emit(lambda: _emit_branches(lctx, nidx, rest, args, avals)))
    return _unflatten(list(if_op.results), specs_holder["specs"])


def _result_types(avals):
    types = []
    for a in avals:
        et = V.elem_type(a.dtype)
        if not a.shape:
            types.append(et)
            continue
        if small.is_small(a.shape):
            types.extend([et] * int(np.prod(a.shape)))
            continue
        layout = V.strided_layout(tuple(a.shape))
        vt = ir.VectorType.get((layout.vec_size,), et)
        types.extend([vt] * int(np.prod(layout.registers_shape(tuple(a.shape)))))
    return types

