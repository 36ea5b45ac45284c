"""Symbolic equality of jaxprs, insensitive to variable names and to equation order.

Each value gets a number from what computes it (the primitive, its parameters and the
numbers of its operands), so two jaxprs that compute the same DAG get the same numbers
however they were linearised. Effects on a Ref are chained per Ref, so reordering writes
to different Refs keeps equality while writing different values to a Ref breaks it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from pallas._src import jax_compat as jc


class _Numbering:
    """Interns signatures as small ints, shared by the jaxprs being compared."""

    def __init__(self):
        self._ids: dict[Any, int] = {}

    def intern(self, sig) -> int:
        return self._ids.setdefault(sig, len(self._ids))

    # -- parameters and constants ------------------------------------------------------

    def value_key(self, val) -> Any:
        if isinstance(val, (jc.Jaxpr, jc.ClosedJaxpr)):
            return ("jaxpr", self.jaxpr_key(val))
        if isinstance(val, (list, tuple)):
            return (type(val).__name__, tuple(self.value_key(v) for v in val))
        if isinstance(val, dict):
            return ("dict", tuple(sorted((repr(k), self.value_key(v)) for k, v in val.items())))
        if isinstance(val, (set, frozenset)):
            return ("set", frozenset(self.value_key(v) for v in val))
        if hasattr(val, "shape") and hasattr(val, "dtype") and not isinstance(val, type):
            try:
                digest = hashlib.sha256(np.asarray(val).tobytes()).hexdigest()
            except Exception:  # noqa: BLE001 - e.g. a tracer or a key array: compare by type
                digest = f"opaque:{id(val)}"
            return ("array", tuple(val.shape), str(val.dtype), digest)
        try:
            hash(val)
        except TypeError:
            return (type(val).__qualname__, repr(val))
        return (type(val).__qualname__, val)

    # -- jaxprs ----------------------------------------------------------------------------

    def jaxpr_key(self, jaxpr_like) -> int:
        if isinstance(jaxpr_like, jc.ClosedJaxpr):
            jaxpr = jaxpr_like.jaxpr
            env = {v: self.intern(("const", self.value_key(c)))
                   for v, c in zip(jaxpr.constvars, jaxpr_like.consts)}
        else:
            jaxpr = jaxpr_like
            env = {v: self.intern(("constvar", i)) for i, v in enumerate(jaxpr.constvars)}
        for i, v in enumerate(jaxpr.invars):
            env[v] = self.intern(("invar", i, str(v.aval)))
        last_effect: dict[Any, int] = {}  # Ref var -> number of the last effect on it

        def atom(a) -> int:
            if isinstance(a, jc.Literal):
                return self.intern(("literal", self.value_key(a.val), str(a.aval)))
            if a in env:
                return env[a]
            return self.intern(("free", str(a)))

        eqn_ids = []
        for eqn in jaxpr.eqns:
            ins = tuple(atom(v) for v in eqn.invars)
            touched = sorted({atom(e.input) for e in eqn.effects
                              if isinstance(getattr(e, "input", None), jc.Var)})
            order = tuple(last_effect.get(r) for r in touched)
            params = self.value_key(eqn.params)
            effects = tuple(sorted(type(e).__name__ for e in eqn.effects))
            eid = self.intern(("eqn", eqn.primitive.name, ins, params, effects, order))
            for r in touched:
                last_effect[r] = eid
            eqn_ids.append(eid)
            for k, out in enumerate(eqn.outvars):
                env[out] = self.intern(("out", eid, k))
        outs = tuple(atom(v) for v in jaxpr.outvars)
        final = tuple(sorted(last_effect.items()))
        return self.intern(("jaxpr", outs, tuple(sorted(eqn_ids)), final))


def compare_jaxprs(jaxpr1, jaxpr2) -> bool:
    """Whether two (closed) jaxprs compute the same thing up to naming and ordering."""
    numbering = _Numbering()
    return numbering.jaxpr_key(jaxpr1) == numbering.jaxpr_key(jaxpr2)
