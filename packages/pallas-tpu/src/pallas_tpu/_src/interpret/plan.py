"""How TPU interpret mode runs a jaxpr: its rule table, and each jaxpr's *program*.

A program is generated Python source for one jaxpr (cached per jaxpr): runs of plain
equations become one :class:`Segment` call (scalar integer arithmetic in Python, the
rest one jitted call), every other equation one call of its rule, with values held in
local variables instead of an environment dict, so interpreting a kernel body costs
little more than the rules it calls.
"""

from __future__ import annotations

import jax

from pallas.plugins import RuleTable, interpret_rules, load_p, program_id_p, run_scoped_p
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.interpret import scalars
from pallas_tpu._src.interpret.scalars import Fallback
from pallas_tpu._src.interpret.state import Buffer

CF = jc.control_flow_primitives()
#: TPU interpret mode's rules, keyed by primitive object.
RULES = RuleTable("mosaic_tpu interpret mode", "rule(core, eqn, invals) -> list of outputs")


def rule(*prims):
    """Registers the decorated function as the TPU-interpret-mode rule of ``prims``."""
    return RULES.register(*prims, owner="pallas_tpu")


# -- compiled segments: runs of plain equations run as one jitted call --------------------


class Segment:
    """Consecutive equations over plain values (no refs, rules or effects), compiled
    once as one function: a kernel body's arithmetic then costs one dispatch."""

    def __init__(self, eqns, invars, outvars):
        self.eqns, self.invars, self.outvars = eqns, invars, outvars
        self.fn = jax.jit(self._run)
        # Scalar integer/boolean arithmetic runs in Python, without a dispatch.
        self.scalar = scalars.plan(eqns, invars, outvars)

    def _run(self, *args):
        env = dict(zip(self.invars, args))

        def read(v):
            return v.val if isinstance(v, jc.Literal) else env[v]

        for eqn in self.eqns:
            params = eqn.primitive.get_bind_params(eqn.params)
            subfuns = params.pop("subfuns", ())
            outs = eqn.primitive.bind(*subfuns, *[read(v) for v in eqn.invars], **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            for v, x in zip(eqn.outvars, outs):
                env[v] = x
        return [env[v] for v in self.outvars]


_plans: dict = {}  # keyed by the object itself (by identity), never by its id()
_LOADS = (jc.get_p, load_p)


def _is_plain(eqn) -> bool:
    prim = eqn.primitive
    if eqn.effects or (prim not in _CONTROL and (prim in interpret_rules or prim in RULES)):
        return False  # control flow over plain values (jnp's jitted helpers) is plain
    if any(isinstance(getattr(v, "aval", None), jc.AbstractRef) for v in eqn.invars):
        return False
    return not any(jaxpr_needs_engine(j) for j in _sub_jaxprs(eqn))


def _hoist_loads(eqns) -> list:
    """``eqns`` with each ref load that sits between two plain runs moved before the
    plain equations just before it that it does not depend on. Plain equations touch
    no memory, so nothing observes the move; the two runs become one compiled call
    (``dot(q, k[s])`` then ``dot(e, v[s])``: two loads, then one call instead of two)."""
    out: list = []
    for i, eqn in enumerate(eqns):
        j = i
        while j < len(eqns) and eqns[j].primitive in _LOADS:
            j += 1
        if j == i or j == len(eqns) or not _is_plain(eqns[j]):
            out.append(eqn)
            continue
        needs = {v for v in eqn.invars if not isinstance(v, jc.Literal)}
        k = len(out)
        while k > 0 and _is_plain(out[k - 1]) and not needs.intersection(
                out[k - 1].outvars):
            k -= 1
        out.insert(k, eqn)
    return out


def plan_of(jaxpr) -> list:
    """``jaxpr``'s equations (loads hoisted, see :func:`_hoist_loads`) with each run of
    plain ones replaced by a :class:`Segment` (cached per jaxpr)."""
    hit = _plans.get(jaxpr)
    if hit is not None:
        return hit
    eqns = _hoist_loads(jaxpr.eqns)
    used_after: list = [set() for _ in range(len(eqns) + 1)]
    live = {v for v in jaxpr.outvars if not isinstance(v, jc.Literal)}
    used_after[len(eqns)] = set(live)
    for i in range(len(eqns) - 1, -1, -1):
        live |= {v for v in eqns[i].invars if not isinstance(v, jc.Literal)}
        used_after[i] = set(live)
    plan: list = []
    i = 0
    while i < len(eqns):
        if not _is_plain(eqns[i]):
            plan.append(eqns[i])
            i += 1
            continue
        j = i
        while j < len(eqns) and _is_plain(eqns[j]):
            j += 1
        run = eqns[i:j]
        defined = {v for e in run for v in e.outvars}
        invars, seen = [], set()
        for e in run:
            for v in e.invars:
                if not isinstance(v, jc.Literal) and v not in defined and v not in seen:
                    seen.add(v)
                    invars.append(v)
        outvars = [v for e in run for v in e.outvars
                   if v in used_after[j] and type(v).__name__ != "DropVar"]
        plan.append(Segment(run, invars, outvars))
        i = j
    _plans[jaxpr] = plan
    return plan


# -- which equations need the engine (else they are bound to JAX as they are) ----------

_CONTROL = set(CF.values()) | {run_scoped_p}
_engine_cache: dict = {}  # keyed by the object itself (by identity), never by its id()


def _sub_jaxprs(eqn):
    for v in eqn.params.values():
        vals = v if isinstance(v, (tuple, list)) else (v,)
        for x in vals:
            if isinstance(x, jc.ClosedJaxpr):
                yield x.jaxpr
            elif hasattr(x, "eqns") and hasattr(x, "invars"):
                yield x


def jaxpr_needs_engine(jaxpr) -> bool:
    hit = _engine_cache.get(jaxpr)
    if hit is not None:
        return hit
    need = False
    for eqn in jaxpr.eqns:
        p = eqn.primitive
        if p in RULES and p not in _CONTROL or p is run_scoped_p:
            need = True
        elif p not in _CONTROL and p in interpret_rules:
            need = True  # a Pallas/TPU primitive with an interpreter rule
        elif any(jaxpr_needs_engine(j) for j in _sub_jaxprs(eqn)):
            need = True
        if need:
            break
    _engine_cache[jaxpr] = need
    return need


def _needs_engine(eqn, invals) -> bool:
    if eqn.primitive is run_scoped_p:
        return True
    if any(isinstance(x, Buffer) for x in invals):
        return True
    return any(jaxpr_needs_engine(j) for j in _sub_jaxprs(eqn))


# -- programs: a jaxpr as generated Python source -------------------------------------

_programs: dict = {}  # keyed by the object itself (by identity), never by its id()
#: The base rule of ``cond`` (set by the evaluator): while it is the rule in force, a
#: program runs the chosen branch's program itself, without the rule's three calls.
COND_RULE: list = []
#: Likewise the base rule of ``program_id``: a program reads the core's grid index.
GRID_RULE: list = []


def _control_needs_engine(eqn) -> bool:
    return eqn.primitive is run_scoped_p or any(
        jaxpr_needs_engine(j) for j in _sub_jaxprs(eqn))


def program_of(jaxpr):
    """``run(core, consts, args) -> outputs``: ``jaxpr`` evaluated step by step as
    :meth:`Core.eval <pallas_tpu._src.interpret.evaluator.Core.eval>` defines it (cached
    per jaxpr). Rules are looked up at each call, so overrides apply."""
    hit = _programs.get(jaxpr)
    if hit is not None:
        return hit
    names: dict = {}
    ns: dict = {"Fallback": Fallback, "RG": RULES.get}
    lines = ["def run(core, consts, args):", "    jax_call = core.jax_call"]

    def name(v) -> str:
        if isinstance(v, jc.Literal):
            k = f"L{len(ns)}"
            ns[k] = v.val
            return k
        return names[v]

    def bind(vars_, prefix) -> None:
        for k, v in enumerate(vars_):
            names[v] = f"{prefix}{k}"
            lines.append(f"    {prefix}{k} = {'consts' if prefix == 'c' else 'args'}[{k}]")

    bind(jaxpr.constvars, "c")
    bind(jaxpr.invars, "a")
    count = 0

    def outs(vars_) -> None:
        nonlocal count
        for k, v in enumerate(vars_):
            if type(v).__name__ == "DropVar":
                continue
            count += 1
            names[v] = f"v{count}"
            lines.append(f"    v{count} = _o[{k}]")

    for i, step in enumerate(plan_of(jaxpr)):
        if isinstance(step, Segment):
            ns[f"F{i}"], ns[f"S{i}"] = step.fn, step.scalar
            args = ", ".join(name(v) for v in step.invars)
            call = f"jax_call(F{i}{', ' if args else ''}{args})"
            if step.scalar is not None:
                lines += ["    try:", f"        _o = S{i}({args})", "    except Fallback:",
                          f"        _o = {call}"]
            else:
                lines.append(f"    _o = {call}")
            outs(step.outvars)
            continue
        ns[f"E{i}"], ns[f"P{i}"] = step, step.primitive
        invals = "[" + ", ".join(name(v) for v in step.invars) + "]"
        prim = step.primitive
        direct = prim in RULES and (prim not in _CONTROL or _control_needs_engine(step))
        if direct and prim is CF["cond"] and COND_RULE:
            branches = step.params["branches"]
            ns[f"B{i}"] = [program_of(b.jaxpr) for b in branches]
            ns[f"K{i}"] = [b.consts for b in branches]
            ns["COND"] = COND_RULE[0]
            ops = ", ".join(name(v) for v in step.invars[1:])
            last = len(branches) - 1
            lines += [f"    _r = RG(P{i})",
                      "    if _r is COND:",
                      f"        _k = int({name(step.invars[0])})",
                      f"        _k = 0 if _k < 0 else (_k if _k < {last} else {last})",
                      f"        _o = B{i}[_k](core, K{i}[_k], [{ops}])",
                      "    else:",
                      f"        _o = _r(core, E{i}, {invals})"]
        elif direct and prim is program_id_p and GRID_RULE:
            ns["GRID"] = GRID_RULE[0]
            axis = int(step.params["axis"])
            lines += [f"    _r = RG(P{i})",
                      f"    if _r is GRID and {axis} < len(core.ctx.grid):",
                      f"        _o = [core.ctx.grid_indices[{axis}]]",
                      "    else:",
                      f"        _o = _r(core, E{i}, {invals})"]
        elif direct:
            lines.append(f"    _o = RG(P{i})(core, E{i}, {invals})")
        else:
            lines.append(f"    _o = core.eval_eqn(E{i}, {invals})")
        outs(step.outvars)
    lines.append("    return [" + ", ".join(name(v) for v in jaxpr.outvars) + "]")
    exec(compile("\n".join(lines) + "\n", "<pallas_tpu interpret program>", "exec"), ns)  # noqa: S102
    run = ns["run"]
    _programs[jaxpr] = run
    return run
