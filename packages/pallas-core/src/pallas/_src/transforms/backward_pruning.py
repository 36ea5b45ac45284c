"""Pruning backward kernels: drop the accesses to buffers nobody needs.

A backward kernel of :mod:`pallas._src.transforms.backward` is the whole JVP kernel
transposed, so it also computes the primal outputs and the cotangents of every other
input. Those land in local buffers; this module removes them and everything only they
used, inside ``pl.when`` bodies and loops (``scan``) too.
"""

from __future__ import annotations

from pallas._src import jax_compat as jc


class NotKernelizable(Exception):
    """The backward pass of this call cannot be emitted as kernels (the reason says why)."""


def drop_dead_locals(jaxpr, consts, avals, n_fixed: int, n_pout: int, n_tout: int,
                      what: str):
    """Removes the backward kernel's accesses to local buffers nobody needs: the
    primal-output buffers (the primal results are not wanted) and the sinks of the
    other inputs' cotangents, with everything only they used, also inside ``pl.when``
    bodies. Returns (jaxpr, consts, which locals are kept). Raises
    :class:`NotKernelizable` when a kept computation reads a primal output."""
    # the locals are [primal outputs, tangent-output copies, sinks]
    dead = {*range(n_fixed, n_fixed + n_pout), *range(n_fixed + n_pout + n_tout, len(jaxpr.invars))}
    new_jaxpr, new_consts, kept = prune_refs(jaxpr, consts, avals, dead, set(range(n_fixed)),
                                             what)
    return new_jaxpr, new_consts, kept[n_fixed:]


def prune_refs(jaxpr, consts, avals, dead: set[int], keep: set[int], what: str):
    """Removes the refs ``dead`` (by position) and everything only they used, then every
    other ref the body no longer uses, except those in ``keep``. Returns (jaxpr, consts,
    which refs are kept). Raises :class:`NotKernelizable` when a kept computation needs a
    dead ref."""
    dead_vars = {jaxpr.invars[i] for i in dead}
    live = [i not in dead for i in range(len(avals))]

    def pruned(*refs):
        it = iter(refs)
        _eval_without(jaxpr, consts, [next(it) if lv else None for lv in live], dead_vars)
        return []

    j1, _, c1 = jc.trace_kernel_to_jaxpr(pruned, [a for a, lv in zip(avals, live) if lv],
                                         what)
    j2, used = jc.dce_jaxpr(jc.convert_constvars_jaxpr(j1), [], instantiate=False)
    used_c, used_in = used[: len(c1)], used[len(c1):]
    used_it = iter(used_in)
    final = [bool(next(used_it)) or k in keep if lv else False for k, lv in enumerate(live)]

    def body(*refs):
        it = iter(refs)
        full = [next(it) if f else None for f in final]
        live_refs = [r for r, lv in zip(full, live) if lv]
        jc.core.eval_jaxpr(j2, (), *(c for c, u in zip(c1, used_c) if u),
                           *(r for r, u in zip(live_refs, used_in) if u))
        return []

    new_jaxpr, _, new_consts = jc.trace_kernel_to_jaxpr(
        body, [a for a, f in zip(avals, final) if f], what)
    return new_jaxpr, new_consts, final


def _eval_without(jaxpr, consts, args, dead: set) -> list:
    """Evaluates ``jaxpr`` (binding its equations in the current trace) without the
    refs in ``dead``: equations that access them, and pure equations of values read
    from them, are skipped; ``pl.when``/``cond`` bodies are pruned the same way. Returns
    the outputs (``None`` where dead)."""
    env: dict = {}
    dead = set(dead)
    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        if x is None:
            dead.add(v)
        else:
            env[v] = x

    def read(v):
        return v.val if isinstance(v, jc.Literal) else env[v]

    for eqn in jaxpr.eqns:
        ins = [v for v in eqn.invars if isinstance(v, jc.Var)]
        if any(v in dead for v in ins):
            if eqn.primitive is jc.cond_p and eqn.invars[0] not in dead:
                outs = _cond_without(eqn, read, dead)
            elif not eqn.effects or eqn.invars[0] in dead:
                dead.update(eqn.outvars)  # an access to a dead buffer, or pure use of one
                continue
            elif eqn.primitive is jc.scan_p:
                outs = _scan_without(eqn, read, dead)
            else:
                raise NotKernelizable("the backward pass reads a primal output of the kernel")
        else:
            params = eqn.primitive.get_bind_params(eqn.params)
            outs = eqn.primitive.bind(*map(read, eqn.invars), **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    return [None if (isinstance(v, jc.Var) and v in dead) else read(v)
            for v in jaxpr.outvars]


def _pruned_body(closed, args_dead, what):
    """``closed`` without its invars marked in ``args_dead`` (see :func:`_eval_without`);
    every output must stay computable."""
    avals = [v.aval for v, d in zip(closed.jaxpr.invars, args_dead) if not d]

    def fn(*xs):
        it = iter(xs)
        outs = _eval_without(closed.jaxpr, closed.consts,
                             [None if d else next(it) for d in args_dead], set())
        if any(o is None for o in outs):
            raise NotKernelizable("the backward pass reads a primal output of the kernel")
        return outs

    j, _, c = jc.trace_kernel_to_jaxpr(fn, avals, what)
    return jc.ClosedJaxpr(j, c)


def _scan_without(eqn, read, dead):
    """A loop (``scan``) whose body accesses dead buffers passed as loop constants (the
    transpose of a loop that reads refs accumulates into every input's cotangent)."""
    p = eqn.params
    nc = p["num_consts"]
    is_dead = [isinstance(v, jc.Var) and v in dead for v in eqn.invars]
    if any(is_dead[nc:]):
        raise NotKernelizable("the backward pass reads a primal output of the kernel")
    body = _pruned_body(p["jaxpr"], is_dead, "loop body")
    live = [v for v, d in zip(eqn.invars, is_dead) if not d]
    params = dict(p)
    params.update(jaxpr=body, num_consts=nc - sum(is_dead[:nc]))
    if "linear" in p:
        params["linear"] = tuple(x for x, d in zip(p["linear"], is_dead) if not d)
    return jc.scan_p.bind(*map(read, live), **params)


def _cond_without(eqn, read, dead):
    ops = eqn.invars[1:]
    live = [v for v in ops if v not in dead]
    avals = [v.aval for v in live]
    branches = []
    for br in eqn.params["branches"]:
        def fn(*xs, br=br):
            it = iter(xs)
            args = [None if v in dead else next(it) for v in ops]
            outs = _eval_without(br.jaxpr, br.consts, args, set())
            if any(o is None for o in outs):
                raise NotKernelizable("the backward pass reads a primal output of the kernel")
            return outs

        j, _, c = jc.trace_kernel_to_jaxpr(fn, avals, "cond branch")
        branches.append(jc.ClosedJaxpr(j, c))
    params = {k: v for k, v in eqn.params.items() if k != "branches"}
    return jc.cond_p.bind(read(eqn.invars[0]), *map(read, live), branches=tuple(branches),
                          **params)
