"""Lowering rules of control flow: ``jit``/``closed_call``/custom derivatives (inlined),
``fori_loop``/``scan`` without scanned operands, ``while_loop``, ``cond``/``pl.when``.

Loop carries and branch results become ``scf`` block arguments and results: a scalar is
one value, a warpgroup array is its registers (in the strided layout of its shape).
"""

from __future__ import annotations

import jax.extend.core.primitives as P
import numpy as np
from jax import lax
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, scf

from pallas_mosaic_gpu._src.lowering import small
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import Lit, lower_jaxpr, rule


class _CarryLayout(Exception):
    """A loop body returns carry ``index`` in the tiled ``layout`` (None: an array in
    the strided layout) while the loop was entered with it in another (or as a splat):
    the loop is emitted again, entered in that layout."""

    def __init__(self, index: int, layout):
        super().__init__(index, layout)
        self.index, self.layout = index, layout


def _flatten(vals, avals, specs=None, strided=False):
    """(flat ir.Values, how to rebuild) for carries of ``avals``; with ``specs`` (the
    loop's entry), each value is put in the layout its carry has; with ``strided``
    (branch results, whose types are fixed before the branches are emitted), every array
    in the strided layout of its shape."""
    from pallas_mosaic_gpu._src.lowering.rules_layout import in_layout, is_tiled

    flat, out = [], []
    for i, (x, a) in enumerate(zip(vals, avals)):
        want = None if specs is None else specs[i]
        if not a.shape:
            flat.append(V.scalar(x, a))
            out.append(None)
            continue
        if strided and is_tiled(x):
            raise NotImplementedError(
                f"a lax.cond/pl.when branch returning a {tuple(a.shape)} array in the "
                f"register layout {x.layout} (return it through a ref, or compute it "
                "outside the branch and select with jnp.where)")
        if strided:
            if small.is_small(a.shape):
                flat.extend(small.to_small(x, a, a.shape).values.flat)
                out.append(("small", tuple(a.shape)))
            else:
                arr = V.to_strided(V.array(x, a))
                flat.extend(arr.registers.flat)
                out.append((arr.layout, arr.is_signed, arr.registers.shape))
        elif (want is not None and want[0] == "tiled") or (specs is None and is_tiled(x)):
            layout = want[1] if want is not None else x.layout
            arr = in_layout(x, a, layout)
            flat.extend(arr.registers.flat)
            out.append(("tiled", layout, arr.is_signed, arr.registers.shape))
        elif is_tiled(x):
            raise _CarryLayout(i, x.layout)
        elif not small.is_small(a.shape) and (
                (want is not None and want[0] == "splat") or (specs is None and _is_splat(x))):
            # One register for the whole array, until the body makes it an array.
            if not _is_splat(x):
                raise _CarryLayout(i, None)
            arr = V.array(x, a)
            flat.append(arr.registers.item())
            out.append(("splat", tuple(a.shape), arr.is_signed))
        elif small.is_small(a.shape):
            vals_ = small.to_small(x, a, a.shape).values
            flat.extend(vals_.flat)
            out.append(("small", tuple(a.shape)))
        else:
            arr = V.to_strided(V.array(x, a))
            flat.extend(arr.registers.flat)
            out.append((arr.layout, arr.is_signed, arr.registers.shape))
    return flat, out


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
        if s[0] == "splat":
            out.append(V.FragmentedArray.splat(flat[k], s[1], is_signed=s[2]))
            k += 1
            continue
        layout, is_signed, shape = s[1:] if s[0] == "tiled" else s
        n = int(np.prod(shape))
        regs = np.empty(shape, dtype=object)
        regs.flat[:] = list(flat[k:k + n])
        k += n
        out.append(V.FragmentedArray(_registers=regs, _layout=layout, _is_signed=is_signed))
    return out


def _is_splat(x) -> bool:
    from jax.experimental.mosaic.gpu import fragmented_array as fa

    return isinstance(x, Lit) or (isinstance(x, V.FragmentedArray)
                                  and isinstance(x.layout, fa.WGSplatFragLayout))


def _relayout(init, avals, e: _CarryLayout) -> list:
    """The loop's entry values with carry ``e.index`` in the body's layout (None: the
    strided layout)."""
    from pallas_mosaic_gpu._src.lowering.rules_layout import in_layout

    init = list(init)
    x, a = init[e.index], avals[e.index]
    init[e.index] = V.to_strided(V.array(x, a)) if e.layout is None else in_layout(
        x, a, e.layout)
    return init


def _accs(args) -> list:
    """The ``plgpu.ACC`` accumulators among an equation's operands (registers that a
    loop or branch may replace, so they travel as loop carries and branch results)."""
    from pallas_mosaic_gpu._src.lowering.scoped import AccVal

    seen, out = set(), []
    for a in args:
        if isinstance(a, AccVal) and id(a) not in seen:
            seen.add(id(a))
            out.append(a)
    return out


def _acc_regs(accs) -> list:
    return [r for a in accs for r in a.acc._value.registers.flat]


def _set_accs(accs, flat) -> None:
    from jax.experimental.mosaic import gpu as mgpu

    k = 0
    for a in accs:
        v = a.acc._value
        n = v.registers.size
        regs = np.empty(v.registers.shape, dtype=object)
        regs.flat[:] = list(flat[k:k + n])
        k += n
        arr = V.FragmentedArray(_registers=regs, _layout=v.layout, _is_signed=v.is_signed)
        a.acc = mgpu.WGMMAAccumulator(_value=arr, _original_layout=a.acc._original_layout,
                                      _sync=False)


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
    consts, init = args[:nc], list(args[nc:])
    avals = [v.aval for v in eqn.invars[nc:]]
    accs = _accs(consts)
    while True:
        saved = [a.acc for a in accs]
        flat, specs = _flatten(init, avals)
        n = len(flat)
        lo, hi, one = (V.const(v, V.index()) for v in (0, length, 1))
        loop = scf.ForOp(lo, hi, one, flat + _acc_regs(accs))
        try:
            with ir.InsertionPoint(loop.body):
                inner = list(loop.inner_iter_args)
                _set_accs(accs, inner[n:])
                carry = _unflatten(inner[:n], specs)
                outs = _inline(lctx, closed, [*consts, *carry])
                new, _ = _flatten(outs, avals, specs)
                scf.YieldOp(new + _acc_regs(accs))
        except _CarryLayout as e:  # enter the loop with that carry in the body's layout
            loop.operation.erase()
            for a, acc in zip(accs, saved):
                a.acc = acc
            init = _relayout(init, avals, e)
            continue
        break
    results = list(loop.results)
    _set_accs(accs, results[n:])
    return _unflatten(results[:n], specs)


@rule(P.while_p)
def _while(lctx, eqn, *args):
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = args[:cn], args[cn:cn + bn], list(args[cn + bn:])
    avals = [v.aval for v in eqn.invars[cn + bn:]]
    accs = _accs(bconsts)
    while True:
        saved = [a.acc for a in accs]
        flat, specs = _flatten(init, avals)
        n = len(flat)
        flat = flat + _acc_regs(accs)
        types = [v.type for v in flat]
        op = scf.WhileOp(types, flat)
        try:
            before = op.before.blocks.append(*types)
            with ir.InsertionPoint(before):
                args_ = list(before.arguments)
                _set_accs(accs, args_[n:])
                carry = _unflatten(args_[:n], specs)
                (c,) = _inline(lctx, p["cond_jaxpr"], [*cconsts, *carry])
                scf.ConditionOp(V.scalar(c, p["cond_jaxpr"].out_avals[0]), args_)
            after = op.after.blocks.append(*types)
            with ir.InsertionPoint(after):
                args_ = list(after.arguments)
                _set_accs(accs, args_[n:])
                carry = _unflatten(args_[:n], specs)
                outs = _inline(lctx, p["body_jaxpr"], [*bconsts, *carry])
                new, _ = _flatten(outs, avals, specs)
                scf.YieldOp(new + _acc_regs(accs))
        except _CarryLayout as e:  # enter the loop with that carry in the body's layout
            op.operation.erase()
            for a, acc in zip(accs, saved):
                a.acc = acc
            init = _relayout(init, avals, e)
            continue
        break
    results = list(op.results)
    _set_accs(accs, results[n:])
    return _unflatten(results[:n], specs)


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
    accs = _accs(args)
    if accs:
        return _emit_branches_acc(lctx, idx, branches, args, avals, accs)
    # if idx == 0: branch 0 else: the rest (nested).
    if isinstance(idx.type, ir.IntegerType) and ir.IntegerType(idx.type).width == 1:
        pred = arith.cmpi(arith.CmpIPredicate.eq, idx, V.const(0, idx.type))
    else:
        pred = arith.cmpi(arith.CmpIPredicate.sle, idx, V.const(0, idx.type))
    specs_holder = {}

    def emit(block_fn):
        outs = block_fn()
        flat, specs = _flatten(outs, avals, strided=True)
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


def _emit_branches_acc(lctx, idx, branches, args, avals, accs):
    """Branches that may replace accumulators: each yields them after its results."""
    start = _acc_regs(accs)
    holder = {}

    def emit(i):
        _set_accs(accs, start)
        flat, holder["specs"] = _flatten(_emit_one(lctx, idx, i, branches, args, avals),
                                         avals, strided=True)
        return flat + _acc_regs(accs)

    types = _result_types(avals) + [r.type for r in start]
    pred = _is_zero(idx)
    if_op = scf.IfOp(pred, types, has_else=True)
    with ir.InsertionPoint(if_op.then_block):
        scf.YieldOp(emit(0))
    with ir.InsertionPoint(if_op.else_block):
        scf.YieldOp(emit(1))
    results = list(if_op.results)
    n = len(results) - len(start)
    _set_accs(accs, results[n:])
    return _unflatten(results[:n], holder["specs"])


def _is_zero(idx):
    if isinstance(idx.type, ir.IntegerType) and ir.IntegerType(idx.type).width == 1:
        return arith.cmpi(arith.CmpIPredicate.eq, idx, V.const(0, idx.type))
    return arith.cmpi(arith.CmpIPredicate.sle, idx, V.const(0, idx.type))


def _emit_one(lctx, idx, i, branches, args, avals):
    if i == 0 or len(branches) == 2:
        return _inline(lctx, branches[min(i, len(branches) - 1)], args)
    is_bool = isinstance(idx.type, ir.IntegerType) and ir.IntegerType(idx.type).width == 1
    nidx = idx if is_bool else arith.subi(idx, V.const(1, idx.type))
    return _emit_branches(lctx, nidx, branches[1:], args, avals)


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



@rule(lax.optimization_barrier_p)
def _optimization_barrier(lctx, eqn, *xs):
    """Arrays in registers pass through Mosaic GPU's optimization barrier (computed
    before what follows, e.g. a barrier wait); other values pass unchanged."""
    from jax.experimental.mosaic.gpu import fragmented_array as fa

    pos = [i for i, x in enumerate(xs) if isinstance(x, V.FragmentedArray)
           and not isinstance(x.layout, fa.WGSplatFragLayout)]
    out = list(xs)
    if pos:
        res = fa.optimization_barrier(*(xs[i] for i in pos))
        for i, r in zip(pos, [res] if len(pos) == 1 else res):
            out[i] = r
    return out
