"""``scf`` control flow, SIMT style: a loop whose bounds (or, for ``scf.while``, whose
condition) differ between threads runs until the last thread is done, each iteration
with the threads still in it; an ``if`` whose condition differs between threads runs
both branches, each with the threads that take it (the others' stores are masked off),
and merges the results per thread."""

from __future__ import annotations

import numpy as np

from pallas_mosaic_gpu._src.executor.engine import op, run
from pallas_mosaic_gpu._src.executor.types import EmulationUnsupported


def _uniform(x):
    x = np.asarray(x).reshape(-1)
    return x[0].item() if (x == x[0]).all() else None


@op("scf.for")
def _for(o, cc):
    body = cc.region(o.regions[0])

    def run_for(m, lb, ub, step, *init):
        carried = list(init)
        dt = np.asarray(lb).dtype
        lo, hi, st = (_uniform(x) for x in (lb, ub, step))
        if None not in (lo, hi, st):
            for i in range(lo, hi, st):
                carried = run(body, m, m.env, [np.asarray([i], dt), *carried])
            return tuple(carried)
        return _divergent_for(m, body, lb, ub, step, carried)

    return run_for


@op("scf.if")
def _if(o, cc):
    then = cc.region(o.regions[0])
    other = cc.region(o.regions[1]) if len(o.regions[1].blocks) else None

    def run_if(m, cond):
        c = np.broadcast_to(np.asarray(cond, bool).reshape(-1), (m.threads,))
        active = np.ones(m.threads, bool) if m.mask is None else m.mask
        taken, not_taken = active & c, active & ~c
        if not not_taken.any():
            return tuple(run(then, m, m.env))
        if not taken.any():
            return tuple(run(other, m, m.env)) if other is not None else ()
        saved = m.mask
        try:
            m.mask = taken
            a = run(then, m, m.env)
            m.mask = not_taken
            b = run(other, m, m.env) if other is not None else []
        finally:
            m.mask = saved
        outs = []
        for x, y in zip(a, b):
            x, y = np.asarray(x), np.asarray(y)
            sel = c.reshape((-1,) + (1,) * (max(x.ndim, y.ndim) - 1))
            outs.append(np.where(sel, x, y))
        return tuple(outs)

    return run_if


def _divergent_for(m, body, lb, ub, step, carried):
    """A loop whose bounds differ between threads: iteration ``k`` runs with the threads
    whose ``lb + k * step < ub``; the others keep their carried values."""
    n = m.threads
    lo, hi, st = (np.broadcast_to(np.asarray(x).reshape(-1), (n,)).astype(np.int64)
                  for x in (lb, ub, step))
    if (st <= 0).any():
        raise EmulationUnsupported("scf.for with a non-positive step")
    active = np.ones(n, bool) if m.mask is None else m.mask
    saved = m.mask
    try:
        k = 0
        while True:
            iv = lo + k * st
            live = active & (iv < hi)
            if not live.any():
                return tuple(carried)
            m.mask = live
            new = run(body, m, m.env, [iv.astype(np.asarray(lb).dtype), *carried])
            carried = [_merge(live, a, b) for a, b in zip(new, carried)]
            k += 1
    finally:
        m.mask = saved


def _merge(sel, a, b):
    a, b = np.asarray(a), np.asarray(b)
    sel = sel.reshape((-1,) + (1,) * (max(a.ndim, b.ndim) - 1))
    return np.where(sel, a, b)


@op("scf.while")
def _while(o, cc):
    before = cc.region(o.regions[0])  # ends in scf.condition(cond) values
    after = cc.region(o.regions[1])

    def run_while(m, *init):
        n = m.threads
        saved = m.mask
        live = np.ones(n, bool) if saved is None else saved
        carried, results = list(init), None
        try:
            while True:
                cond, *vals = run(before, m, m.env, carried)
                c = np.broadcast_to(np.asarray(cond, bool).reshape(-1), (n,))
                leaving = live & ~c
                if leaving.any():
                    results = vals if results is None else \
                        [_merge(leaving, v, r) for v, r in zip(vals, results)]
                live = live & c
                if not live.any():
                    return tuple(results)
                m.mask = None if live.all() and saved is None else live
                new = run(after, m, m.env, vals)
                carried = [_merge(live, a, b) for a, b in zip(new, vals)]
        finally:
            m.mask = saved

    return run_while
