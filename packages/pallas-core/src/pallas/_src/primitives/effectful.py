"""Declaring a primitive bound only for its effects (a print, a barrier, a DMA start).

Such a primitive returns no values: ``bind`` gives an empty list, and its abstract
evaluation is its effects alone. Core's debug primitives and the backends' own
statement-like primitives are declared with :func:`effect_primitive`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pallas._src import jax_compat as jc


def effect_primitive(name: str,
                     effects: Iterable[Any] | Callable[..., Iterable[Any]]) -> jc.Primitive:
    """A primitive named ``name`` with no results whose effects are ``effects``.

    :param effects: the effects every equation has (a set of JAX effects), or a function
        of the operands' avals and the equation's params returning them (e.g. the
        ``ReadEffect``/``WriteEffect`` of the refs it names).
    """
    prim = jc.Primitive(name)
    prim.multiple_results = True
    if callable(effects):
        of_eqn = effects
    else:
        fixed = frozenset(effects)

        def of_eqn(*avals: Any, **params: Any) -> Iterable[Any]:
            return fixed

    prim.def_effectful_abstract_eval(lambda *avals, **params: ([], set(of_eqn(*avals, **params))))
    return prim
