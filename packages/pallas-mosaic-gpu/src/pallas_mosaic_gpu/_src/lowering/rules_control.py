"""Lowering rules of control flow: ``jit``/``closed_call``/custom derivatives (inlined),
``fori_loop``/``scan`` (scanned operands and stacked results through SMEM),
``while_loop``, ``cond``/``pl.when``.

Loop carries and branch results become ``scf`` block arguments and results: a scalar is
one value, a warpgroup array is its registers, in the layout the loop is entered with or
the branches return (a tiled layout such as WGMMA's is kept), else the strided layout
of its shape. Those types are fixed when the ``scf`` op is created, before its regions
are emitted: when a region yields a value in another layout, the op is emitted again
with that layout (:func:`_settle_layouts`).
"""

from __future__ import annotations

import jax
import jax.extend.core.primitives as P
import numpy as np
from jax import lax
from jax.experimental.mosaic import gpu as mgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, scf

from pallas_mosaic_gpu._src.loops import ROLLED_SCOPE
from pallas_mosaic_gpu._src.lowering import small
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import Lit, lower_jaxpr, rule
from pallas_mosaic_gpu._src.lowering.register_layouts import in_layout, is_tiled
from pallas_mosaic_gpu._src.lowering.scoped import AccVal
from pallas_mosaic_gpu._src.lowering.views import load_view, store_view


class _CarryLayout(Exception):
    """A region yields value ``index`` (a loop's carry, a branch's result) in the tiled
    ``layout`` (None: an array in the strided layout) while the op was created for
    another (or a splat): the op is emitted again with that layout."""

    def __init__(self, index: int, layout):
        super().__init__(index, layout)
        self.index, self.layout = index, layout


def _flatten(vals, avals, specs=None):
    """(flat ir.Values, how to rebuild) for carries of ``avals``; with ``specs`` (the
    layouts the op was created for: a loop's entry, or None per value for the strided
    layout of branch results), each value is put in the layout its spec names, or a
    ``_CarryLayout`` is raised for a tiled value where another layout was expected."""
    flat, out = [], []
    for i, (x, a) in enumerate(zip(vals, avals)):
        want = None if specs is None else specs[i]
        if not a.shape:
            flat.append(V.scalar(x, a))
            out.append(None)
            continue
        if (want is not None and want[0] == "tiled") or (specs is None and is_tiled(x)):
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
    init = list(init)
    x, a = init[e.index], avals[e.index]
    init[e.index] = V.to_strided(V.array(x, a)) if e.layout is None else in_layout(
        x, a, e.layout)
    return init


def _settle_layouts(emit, state, update, accs, what: str):
    """``emit(state, ops)`` creates an ``scf`` op (appended to ``ops``), emits its regions
    and returns its results. When a region yields a value in another layout than the
    op was created for (``_CarryLayout``), the op is erased, the accumulators ``accs``
    are restored and it is emitted again with ``update(state, e)``. Each retry settles
    one value's layout; a value that keeps changing is refused, naming ``what``."""
    limit = 8 + 4 * _count(state)
    for _ in range(limit):
        saved = [a.acc for a in accs]
        ops = []
        try:
            return emit(state, ops)
        except _CarryLayout as e:
            for op in ops:
                op.operation.erase()
            for a, acc in zip(accs, saved):
                a.acc = acc
            state = update(state, e)
    raise NotImplementedError(
        f"{what} on the mosaic_gpu backend: the register layouts of its values did not "
        f"settle after {limit} attempts (a value alternating between layouts)")


def _count(state) -> int:
    return len(state) if isinstance(state, (list, tuple)) else 1


def _accs(args) -> list:
    """The ``plgpu.ACC`` accumulators among an equation's operands (registers that a
    loop or branch may replace, so they travel as loop carries and branch results)."""
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


def _rolled(eqn) -> bool:
    """Whether ``eqn`` is a loop of ``rolled_fori_loop`` (its innermost named scope)."""
    return str(eqn.source_info.name_stack).rsplit("/", 1)[-1] == ROLLED_SCOPE


def _keep_rolled(loop) -> None:
    """Tells LLVM not to unroll ``loop`` (an ``scf.for``). The attribute must be named
    as ``llvm.br``'s own ``loop_annotation``: ``convert-scf-to-cf`` copies an
    ``scf.for``'s LLVM-dialect attributes, under their names, onto the loop's back
    edge, and the lowering to ``llvm.br`` keeps them; only that name becomes the branch's
    ``!llvm.loop`` metadata in LLVM IR (``llvm.loop.unroll.disable``, which LLVM's
    unrollers honour and NVPTX prints as ``.pragma "nounroll"`` for ptxas). Named
    ``llvm.loop_annotation``, it stays a discardable attribute that nothing reads."""
    loop.operation.attributes["loop_annotation"] = ir.Attribute.parse(
        "#llvm.loop_annotation<unroll = <disable = true>>")


def _emit_for(bounds, state, avals, accs, rolled, ops, body):
    """An ``scf.for`` over ``bounds()`` (``index`` values ``lo, hi``, emitted once the
    carry is flattened; step 1) carrying ``state`` (values of ``avals``) and the
    accumulators ``accs``; ``body(iv, carry)`` emits one step and returns the next carry.
    The loop goes on ``ops``; returns the final carry."""
    flat, specs = _flatten(state, avals)
    n = len(flat)
    lo, hi = bounds()
    loop = scf.ForOp(lo, hi, V.const(1, V.index()), flat + _acc_regs(accs))
    if rolled:
        _keep_rolled(loop)
    ops.append(loop)
    with ir.InsertionPoint(loop.body):
        inner = list(loop.inner_iter_args)
        _set_accs(accs, inner[n:])
        carry = body(loop.induction_variable, _unflatten(inner[:n], specs))
        new, _ = _flatten(carry, avals, specs)
        scf.YieldOp(new + _acc_regs(accs))
    results = list(loop.results)
    _set_accs(accs, results[n:])
    return _unflatten(results[:n], specs)


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
    consts, init = args[:nc], list(args[nc:nc + ncarry])
    avals = [v.aval for v in eqn.invars[nc:nc + ncarry]]
    accs = _accs(consts)
    xs_avals = [v.aval for v in eqn.invars[nc + ncarry:]]
    ys_avals = [v.aval for v in eqn.outvars[ncarry:]]
    rolled = _rolled(eqn)
    # Scanned operands and stacked results live in SMEM buffers (spill.scanned_avals):
    # iteration i reads row i of each xs and writes row i of each ys.
    bufs = lctx.spill_buffers[id(eqn)] if xs_avals or ys_avals else []
    xs_bufs, ys_bufs = bufs[:len(xs_avals)], bufs[len(xs_avals):]
    for buf, x, a in zip(xs_bufs, args[nc + ncarry:], xs_avals):
        store_view(buf, x, a, "smem")

    def rows(i):
        if p["reverse"]:
            i = arith.subi(V.const(length - 1, V.index()), i)
        return [load_view(mgpu.memref_slice(b, (i,)), a.dtype, tuple(a.shape[1:]))
                for b, a in zip(xs_bufs, xs_avals)], i

    def step(i, carry):
        """Iteration ``i`` (an index value): the body on ``carry`` and row ``i``."""
        xs, i = rows(i)
        outs = _inline(lctx, closed, [*consts, *carry, *xs])
        for b, y, a in zip(ys_bufs, outs[ncarry:], ys_avals):
            row = jax.ShapeDtypeStruct(tuple(a.shape[1:]), a.dtype)
            store_view(mgpu.memref_slice(b, (i,)), y, row, "smem")
        return list(outs[:ncarry])

    # ``unroll=k`` (fori_loop/scan): the body k times per scf.for step, as upstream; the
    # steps left over (length % k) after the loop; k >= length: no loop at all.
    unroll = max(1, min(int(p.get("unroll", 1)), length))
    groups = length // unroll

    def unrolled(base, carry):
        """Steps ``base * unroll`` to ``base * unroll + unroll - 1``."""
        if unroll > 1:
            base = arith.muli(base, V.const(unroll, V.index()))
        for j in range(unroll):
            i = base if j == 0 else arith.addi(base, V.const(j, V.index()))
            carry = step(i, carry)
        return carry

    def emit(init, ops):
        def bounds():
            return V.const(0, V.index()), V.const(groups, V.index())

        return _emit_for(bounds, init, avals, accs, rolled, ops, unrolled)

    carry = init
    if groups > 1 or (groups == 1 and unroll == 1):
        # A carry the body returns in another layout: enter the loop in that layout.
        carry = _settle_layouts(emit, init, lambda init, e: _relayout(init, avals, e),
                                accs, "a fori_loop/scan")
        start = groups * unroll
    else:
        start = 0
    for k in range(start, length):
        carry = step(V.const(k, V.index()), carry)
    return [*carry, *(load_view(b, a.dtype, tuple(a.shape)) for b, a in zip(ys_bufs, ys_avals))]


@rule(P.while_p)
def _while(lctx, eqn, *args):
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = args[:cn], args[cn:cn + bn], list(args[cn + bn:])
    avals = [v.aval for v in eqn.invars[cn + bn:]]
    accs = _accs(bconsts)
    if _is_fori(p):
        return _fori_while(lctx, p, bconsts, init, avals, accs, _rolled(eqn))

    def emit(init, ops):
        flat, specs = _flatten(init, avals)
        n = len(flat)
        flat = flat + _acc_regs(accs)
        types = [v.type for v in flat]
        op = scf.WhileOp(types, flat)
        ops.append(op)
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
        results = list(op.results)
        _set_accs(accs, results[n:])
        return _unflatten(results[:n], specs)

    return _settle_layouts(emit, init, lambda init, e: _relayout(init, avals, e), accs,
                           "a while_loop")


def _is_fori(p) -> bool:
    """Whether a ``while`` is ``lax.fori_loop``'s over bounds that are not Python ints
    (traced, or ``jnp.int32(n)``): int32 carries ``(i, upper, *x)``, condition
    ``i < upper``, body returning ``(i + 1, upper, ...)``."""
    cond, body, bn = p["cond_jaxpr"], p["body_jaxpr"].jaxpr, p["body_nconsts"]
    cj = cond.jaxpr
    if p["cond_nconsts"] or cond.consts or len(cj.invars) < 2 or len(cj.eqns) != 1:
        return False
    (e,) = cj.eqns
    i, upper = cj.invars[:2]
    if (e.primitive is not lax.lt_p or list(e.invars) != [i, upper]
            or list(e.outvars) != list(cj.outvars)
            or any(v.aval.shape != () or v.aval.dtype != np.int32 for v in (i, upper))):
        return False
    bi, bupper = body.invars[bn:bn + 2]
    if body.outvars[1] is not bupper:
        return False
    nxt = body.outvars[0]
    for e in body.eqns:
        if e.outvars and e.outvars[0] is nxt:
            if e.primitive is not lax.add_p:
                return False
            a, b = e.invars
            other = b if a is bi else a if b is bi else None
            return getattr(other, "val", None) is not None and int(np.asarray(other.val)) == 1
    return False


def _fori_while(lctx, p, bconsts, init, avals, accs, rolled=False):
    """A ``fori_loop``-shaped ``while`` as an ``scf.for`` from ``i`` to ``upper`` (as
    upstream lowers it): the step count is explicit, so LLVM keeps a loop with a
    constant trip count as one loop body as it does for upstream's, where an
    ``scf.while`` got fully unrolled (each step's ``wgmma`` commit, wait and barriers
    emitted again). The loop's final ``i`` is ``max(i, upper)``."""
    lo, hi = (V.scalar(x, a) for x, a in zip(init[:2], avals[:2]))
    rest = avals[2:]

    def body(iv, state):
        i = arith.index_cast(V.i32(), iv)
        return _inline(lctx, p["body_jaxpr"], [*bconsts, i, hi, *state])[2:]

    def emit(state, ops):
        def bounds():
            return arith.index_cast(V.index(), lo), arith.index_cast(V.index(), hi)

        final = _emit_for(bounds, state, rest, accs, rolled, ops, body)
        return [arith.maxsi(lo, hi), hi, *final]

    return _settle_layouts(emit, init[2:], lambda s, e: _relayout(s, rest, e), accs,
                           "a fori_loop")


@rule(P.cond_p)
def _cond(lctx, eqn, index, *args):
    branches = eqn.params["branches"]
    avals = [v.aval for v in eqn.outvars]
    idx = V.scalar(index, eqn.invars[0].aval)
    if isinstance(index, Lit):
        return _inline(lctx, branches[int(np.asarray(index.val))], args)
    return _emit_branches(lctx, idx, branches, args, avals)


def _emit_branches(lctx, idx, branches, args, avals):
    """``if idx == 0: branch 0 else: the rest`` (nested). The results keep the tiled
    layout a branch returns them in (e.g. WGMMA's); others are in the strided layout of
    their shape. Accumulators among the operands are yielded after the results (a
    branch may replace them)."""
    if len(branches) == 1:
        return _inline(lctx, branches[0], args)
    accs = _accs(args)
    start = _acc_regs(accs)

    def emit(layouts, ops):
        wants = [None if lay is None else ("tiled", lay) for lay in layouts]
        holder = {}

        def branch(i):
            _set_accs(accs, start)
            outs = _emit_one(lctx, idx, i, branches, args, avals)
            try:
                flat, holder[i] = _flatten(outs, avals, wants)
            except NotImplementedError as e:
                raise NotImplementedError(
                    "lax.cond on the mosaic_gpu backend: its branches return a result in "
                    f"register layouts that cannot meet: {e}") from e
            return flat + _acc_regs(accs)

        types = _result_types(avals, layouts) + [r.type for r in start]
        if_op = scf.IfOp(_is_zero(idx), types, has_else=True)
        ops.append(if_op)
        with ir.InsertionPoint(if_op.then_block):
            scf.YieldOp(branch(0))
        with ir.InsertionPoint(if_op.else_block):
            scf.YieldOp(branch(1))
        results = list(if_op.results)
        n = len(results) - len(start)
        _set_accs(accs, results[n:])
        return _unflatten(results[:n], holder[0])

    def update(layouts, e):
        layouts = list(layouts)
        if e.layout is None or layouts[e.index] is not None:
            raise NotImplementedError(
                f"lax.cond on the mosaic_gpu backend: result {e.index} "
                f"({tuple(avals[e.index].shape)}) is returned in the register layouts "
                f"{layouts[e.index]} and {e.layout} by different branches")
        layouts[e.index] = e.layout
        return layouts

    # A result a branch returns in a tiled layout: every branch yields it in that one.
    return _settle_layouts(emit, [None] * len(avals), update, accs, "a lax.cond")


def _is_zero(idx):
    if isinstance(idx.type, ir.IntegerType) and ir.IntegerType(idx.type).width == 1:
        return arith.cmpi(arith.CmpIPredicate.eq, idx, V.const(0, idx.type))
    return arith.cmpi(arith.CmpIPredicate.sle, idx, V.const(0, idx.type))


def _emit_one(lctx, idx, i, branches, args, avals):
    """Branch ``i`` (0, or 1 = all the others) of ``branches``."""
    if i == 0 or len(branches) == 2:
        return _inline(lctx, branches[min(i, len(branches) - 1)], args)
    is_bool = isinstance(idx.type, ir.IntegerType) and ir.IntegerType(idx.type).width == 1
    nidx = idx if is_bool else arith.subi(idx, V.const(1, idx.type))
    return _emit_branches(lctx, nidx, branches[1:], args, avals)


def _result_types(avals, layouts):
    """The ``scf.if`` result types of values of ``avals``: scalars, every element of a
    small array, else the registers of each array in ``layouts`` (None: the strided
    layout of its shape)."""
    types = []
    for a, layout in zip(avals, layouts):
        et = V.elem_type(a.dtype)
        shape = tuple(a.shape)
        if not shape:
            types.append(et)
        elif layout is not None:
            types.extend([layout.registers_element_type(et)]
                         * int(np.prod(layout.registers_shape(shape))))
        elif small.is_small(shape):
            types.extend([et] * int(np.prod(shape)))
        else:
            layout = V.strided_layout(shape)
            vt = ir.VectorType.get((layout.vec_size,), et)
            types.extend([vt] * int(np.prod(layout.registers_shape(shape))))
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
