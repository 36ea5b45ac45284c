"""Compiler hints that do not change values: ``multiple_of``."""

from __future__ import annotations

from collections.abc import Sequence

from pallas._src import jax_compat as jc
from pallas._src.interpreter.rules import register_interpret_rule

multiple_of_p = jc.Primitive("multiple_of")


def multiple_of(x, values: Sequence[int] | int):
    """Tells the compiler that ``x`` is a multiple of ``values``; returns ``x``."""
    values = (values,) if isinstance(values, int) else tuple(values)
    return multiple_of_p.bind(x, values=values)


multiple_of_p.def_abstract_eval(lambda aval, *, values: aval)
jc.mlir.register_lowering(multiple_of_p, lambda ctx, x, *, values: [x])
multiple_of_p.def_impl(lambda x, *, values: x)


@register_interpret_rule(multiple_of_p)
def _multiple_of_rule(ctx, eqn, invals):
    return [invals[0]]


def _multiple_of_jvp(primals, tangents, *, values):
    return multiple_of_p.bind(primals[0], values=values), tangents[0]


jc.primitive_jvps[multiple_of_p] = _multiple_of_jvp
