"""Walking a traced program: its ``pallas_call`` equations and the primitives it uses."""

from __future__ import annotations

from typing import Any

import jax.extend.core as jex

from pallas._src.pallas_call import pallas_call_p


def pallas_call_eqns(jaxpr: Any) -> list:
    """Every ``pallas_call`` equation in ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``) and the
    jaxprs nested in its equations' params (``jit``, ``cond``, ``shard_map``...), in
    program order; a ``pallas_call``'s own kernel jaxpr is not searched."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is pallas_call_p:
            found.append(eqn)
            continue
        for sub in jex.jaxprs_in_params(eqn.params):
            found.extend(pallas_call_eqns(sub))
    return found


def primitive_names(jaxpr: Any) -> set[str]:
    """The name of every primitive in ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``, a kernel's
    or a program's) and in the jaxprs nested in its equations' params."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jex.jaxprs_in_params(eqn.params):
            names |= primitive_names(sub)
    return names
