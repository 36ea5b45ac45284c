"""``scf`` control flow, ``func.call`` and ``tpu.region`` (a scope for ``memref.alloca``)."""

from __future__ import annotations

from jaxlib.mlir import ir

from pallas_tpu._src.executor.engine import op, run
from pallas_tpu._src.executor.types import ExecutorError

MAX_WHILE_STEPS = 10_000_000


@op("scf.for")
def _for(o, cc):
    body = cc.region(o.regions[0])

    def go(env, lb, ub, step, *init):
        carry = list(init)
        lb_, ub_, st = int(lb), int(ub), int(step)
        # An index loop counts in Python ints; an i32 one (a fori_loop with run-time
        # bounds) in the bounds' numpy integer type (a bound may be a 0-d array).
        t = getattr(lb, "dtype", None)
        t = t.type if t is not None else type(lb)
        for i in range(lb_, ub_, st):
            carry = run(body, env, [t(i) if t is not int else i, *carry])
        return carry

    return go


@op("scf.if")
def _if(o, cc):
    then = cc.region(o.regions[0])
    other = cc.region(o.regions[1]) if len(o.regions[1].blocks) else None

    def go(env, cond):
        if bool(cond):
            return run(then, env)
        return run(other, env) if other is not None else []

    return go


@op("scf.while")
def _while(o, cc):
    before, after = cc.region(o.regions[0]), cc.region(o.regions[1])

    def go(env, *init):
        vals = list(init)
        for _ in range(MAX_WHILE_STEPS):
            cond, *passed = run(before, env, vals)
            if not bool(cond):
                return passed
            vals = run(after, env, passed)
        raise ExecutorError(f"scf.while ran more than {MAX_WHILE_STEPS} iterations")

    return go


@op("tpu.region")
def _region(o, cc):
    body = cc.region(o.regions[0])
    return lambda env: run(body, env)


@op("func.call")
def _call(o, cc):
    name = ir.FlatSymbolRefAttr(o.attributes["callee"]).value
    body = cc.region(cc.funcs[name].regions[0])
    return lambda env, *args: run(body, env, args)
