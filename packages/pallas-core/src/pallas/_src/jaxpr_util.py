"""Walking jaxprs: equation by equation with their values, the sub-jaxprs of equations,
and searches through them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pallas._src import jax_compat as jc


def walk_jaxpr(jaxpr, consts: Sequence[Any], args: Sequence[Any],
               eqn_fn: Callable[[Any, list], Sequence[Any]], *,
               literal: Callable[[Any], Any] = lambda lit: lit.val) -> list:
    """Evaluates (or lowers) ``jaxpr`` equation by equation: its constvars hold
    ``consts`` and its invars ``args``; each equation's results are
    ``eqn_fn(eqn, invals)`` (a sequence, one per outvar), with a literal operand's value
    ``literal(lit)``. Returns the values of the outvars."""
    env: dict[Any, Any] = {}

    def read(v):
        return literal(v) if isinstance(v, jc.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        env.update(zip(eqn.outvars, eqn_fn(eqn, [read(v) for v in eqn.invars])))
    return [read(v) for v in jaxpr.outvars]


def sub_jaxprs(value: Any) -> Iterator[Any]:
    """The Jaxprs inside one equation parameter (a (Closed)Jaxpr or a sequence of them)."""
    if isinstance(value, jc.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jc.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for x in value:
            yield from sub_jaxprs(x)


def eqn_sub_jaxprs(eqn) -> Iterator[Any]:
    """Every Jaxpr nested directly in ``eqn`` (branches, loop bodies, called jaxprs)."""
    for v in eqn.params.values():
        yield from sub_jaxprs(v)


def contains(jaxpr, predicate: Callable[[Any], bool]) -> bool:
    """Whether some equation of ``jaxpr``, at any depth, satisfies ``predicate``."""
    return any(
        predicate(eqn) or any(contains(sub, predicate) for sub in eqn_sub_jaxprs(eqn))
        for eqn in jaxpr.eqns
    )


def remote_operations(jaxpr) -> list[str]:
    """The primitives of ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``, at any depth) that
    address another device: those given a ``device_id`` (remote DMAs, remote semaphore
    signals)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    found = []
    for eqn in jaxpr.eqns:
        tree = eqn.params.get("device_id_tree")
        if tree is not None and getattr(tree, "num_leaves", 0):
            found.append(eqn.primitive.name)
        for sub in eqn_sub_jaxprs(eqn):
            found.extend(remote_operations(sub))
    return found


def split_list(xs, bounds) -> list[list]:
    """``xs`` cut at the increasing positions ``bounds``: ``len(bounds) + 1`` lists."""
    xs, out, lo = list(xs), [], 0
    for b in bounds:
        out.append(xs[lo:b])
        lo = b
    out.append(xs[lo:])
    return out
