"""Making a backward kernel's linear part replay the primal state correctly.

JAX's partial evaluation of a JVP kernel replays every access to a primal ref in the
linear part, reads included (:mod:`pallas._src.transforms.backward_carried` seeds the
primal state before it). Two things stand in the way, fixed here: primal stores inside
``pl.when`` bodies that also touch tangents, and JAX's uninitialised placeholders.
"""

from __future__ import annotations

import numpy as np

from pallas._src import jax_compat as jc
from pallas._src.primitives import load_store
from pallas._src.transforms.backward_common import retrace_linear_part
from pallas._src.transforms.backward_pruning import NotKernelizable

_STORES = (jc.swap_p, jc.addupdate_p, load_store.swap_p)
_READS = (jc.get_p, load_store.load_p)


def hoist_primal_stores(jaxpr, primal: set[int]):
    """The linear part of a JVP kernel with the primal stores of its ``pl.when`` bodies
    moved into conditionals of their own, placed before the original ones.

    JAX's partial evaluation replays every access to a primal ref in the linear part
    (``primal``: the positions of those refs), reads included, so the linear part sees
    the primal state of the step as it goes. A ``pl.when`` that initialises both the
    state and its tangent (``m = -inf``, ``dm = 0``) is linear as a whole, and
    ``backward_pass3`` would only run its primal stores when transposing it, after the
    reads that follow it. Split off, they are primal and run in order."""
    pvars = {jaxpr.invars[k] for k in primal}
    if not any(_primal_store_positions(e, pvars) for e in jaxpr.eqns):
        return jaxpr

    def step(eqn, read):
        inner = _primal_store_positions(eqn, pvars)
        if not inner:
            return None
        if eqn.outvars:
            raise NotKernelizable("a pl.when body that stores primal state returns values")
        rest = {k: v for k, v in eqn.params.items() if k != "branches"}
        ops = list(map(read, eqn.invars[1:]))
        brs = eqn.params["branches"]
        parts = [_branch_eqns(br, inner, True) for br in brs]
        # the primal conditional takes no tangent ref (it stays non-linear)
        pos = sorted({k for br, es in zip(brs, parts)
                      for k, v in enumerate(br.jaxpr.invars)
                      if any(v in e.invars for e in es)})
        branches = tuple(_branch_fn(br, es, pos) for br, es in zip(brs, parts))
        jc.cond_p.bind(read(eqn.invars[0]), *(ops[k] for k in pos),
                       branches=branches, **rest)
        all_pos = list(range(len(ops)))
        branches = tuple(_branch_fn(br, _branch_eqns(br, inner, False), all_pos)
                         for br in brs)
        jc.cond_p.bind(read(eqn.invars[0]), *ops, branches=branches, **rest)
        return []

    return retrace_linear_part(jaxpr, step)


def _primal_store_positions(eqn, pvars) -> set[int]:
    """For a ``cond`` whose branches store into primal refs: those operands' positions
    among the branch inputs (else the empty set)."""
    if eqn.primitive is not jc.cond_p:
        return set()
    inner = {k for k, v in enumerate(eqn.invars[1:]) if isinstance(v, jc.Var) and v in pvars}
    for br in eqn.params["branches"]:
        refs = {br.jaxpr.invars[k] for k in inner}
        if any(e.primitive in _STORES and e.invars[0] in refs for e in br.jaxpr.eqns):
            return inner
    return set()


def _branch_eqns(br, inner: set[int], keep_primal: bool):
    """The equations of a ``cond`` branch that store into the primal refs ``inner`` (and
    what they need), or all the others."""
    j = br.jaxpr
    refs = {j.invars[k] for k in inner}
    stores = [e for e in j.eqns if e.primitive in _STORES and e.invars[0] in refs]
    if keep_primal:
        needed = {v for e in stores for v in e.invars if isinstance(v, jc.Var)}
        chosen = set(map(id, stores))
        for e in reversed(j.eqns):
            if id(e) not in chosen and any(isinstance(v, jc.Var) and v in needed
                                           for v in e.outvars):
                if e.effects and not (e.primitive in _READS and e.invars[0] in refs):
                    raise NotKernelizable("a primal store in a pl.when body depends on "
                                          "an effect")
                chosen.add(id(e))
                needed |= {v for v in e.invars if isinstance(v, jc.Var)}
        eqns = [e for e in j.eqns if id(e) in chosen]
    else:
        dropped = set(map(id, stores))
        used = {v for e in j.eqns if id(e) not in dropped for v in e.invars}
        if any(isinstance(v, jc.Var) and v in used for e in stores for v in e.outvars):
            raise NotKernelizable("the old contents of primal state are read in a pl.when")
        eqns = [e for e in j.eqns if id(e) not in dropped]
    return eqns


def _branch_fn(br, eqns, positions):
    """A branch running ``eqns`` of ``br`` over its inputs at ``positions``."""
    j = br.jaxpr
    ins = [j.invars[k] for k in positions]

    def fn(*args):
        env = dict(zip(ins, args))
        env.update(zip(j.constvars, br.consts))
        for e in eqns:
            outs = e.primitive.bind(*(v.val if isinstance(v, jc.Literal) else env[v]
                                      for v in e.invars),
                                    **e.primitive.get_bind_params(e.params))
            env.update(zip(e.outvars, outs if e.primitive.multiple_results else [outs]))
        return []

    new, _, consts = jc.trace_kernel_to_jaxpr(fn, [v.aval for v in ins], "cond branch")
    return jc.ClosedJaxpr(new, consts)


def zeros_for_empty(jaxpr):
    """``jaxpr`` with JAX's uninitialised placeholders (``empty2``, the residuals a
    ``pl.when`` branch does not compute) replaced by zeros, which every backend lowers."""
    subst = {}
    eqns = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "empty2":
            (out,) = eqn.outvars
            subst[out] = jc.Literal(np.zeros(out.aval.shape, out.aval.dtype), out.aval)
            continue
        params = {k: _map_jaxprs(v) for k, v in eqn.params.items()}
        eqns.append(eqn.replace(invars=[subst.get(v, v) if isinstance(v, jc.Var) else v
                                        for v in eqn.invars], params=params))
    if not subst and all(a is b for a, b in zip(eqns, jaxpr.eqns)):
        return jaxpr
    return jaxpr.replace(eqns=eqns, outvars=[subst.get(v, v) if isinstance(v, jc.Var) else v
                                             for v in jaxpr.outvars])


def _map_jaxprs(v):
    if isinstance(v, jc.ClosedJaxpr):
        return jc.ClosedJaxpr(zeros_for_empty(v.jaxpr), v.consts)
    if isinstance(v, jc.Jaxpr):
        return zeros_for_empty(v)
    if isinstance(v, tuple) and any(isinstance(x, (jc.ClosedJaxpr, jc.Jaxpr)) for x in v):
        return tuple(_map_jaxprs(x) for x in v)
    return v
