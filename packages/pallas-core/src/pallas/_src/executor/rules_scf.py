"""``scf`` control flow and ``func.call`` for an execution model whose control is
uniform (one program counter: a TPU core, a host function). A SIMT model, where threads
may diverge, registers its own ``scf`` rules in its table."""

from __future__ import annotations

from jaxlib.mlir import ir

from pallas._src.executor.engine import UPSTREAM, run
from pallas._src.executor.errors import ExecutorError

#: An ``scf.while`` running longer than this is taken to be an endless loop.
MAX_WHILE_STEPS = 10_000_000


@UPSTREAM.register("scf.for")
def _for(o, cc):
    body = cc.region(o.regions[0])

    def go(m, lb, ub, step, *init):
        carry = list(init)
        # An index loop counts in Python ints; an i32 one (a fori_loop with run-time
        # bounds) in the bounds' numpy integer type (a bound may be a 0-d array).
        t = getattr(lb, "dtype", None)
        t = t.type if t is not None else type(lb)
        env = m.env
        for i in range(int(lb), int(ub), int(step)):
            carry = run(body, m, env, [t(i) if t is not int else i, *carry])
        return carry

    return go


@UPSTREAM.register("scf.if")
def _if(o, cc):
    then = cc.region(o.regions[0])
    other = cc.region(o.regions[1]) if len(o.regions[1].blocks) else None

    def go(m, cond):
        if bool(cond):
            return run(then, m, m.env)
        return run(other, m, m.env) if other is not None else []

    return go


@UPSTREAM.register("scf.while")
def _while(o, cc):
    before, after = cc.region(o.regions[0]), cc.region(o.regions[1])

    def go(m, *init):
        vals = list(init)
        for _ in range(MAX_WHILE_STEPS):
            cond, *passed = run(before, m, m.env, vals)
            if not bool(cond):
                return passed
            vals = run(after, m, m.env, passed)
        raise ExecutorError(f"scf.while ran more than {MAX_WHILE_STEPS} iterations")

    return go


@UPSTREAM.register("func.call")
def _call(o, cc):
    name = ir.FlatSymbolRefAttr(o.attributes["callee"]).value
    if name not in cc.funcs:
        raise cc.unsupported(f"{cc.name}: func.call of @{name}, which the module does not "
                             f"define")
    body = cc.region(cc.funcs[name].regions[0])
    return lambda m, *args: run(body, m, m.env, args)
