"""The table of interpreter rules: how the reference interpreter runs each primitive.

A rule is ``rule(ctx, eqn, invals) -> list of outvals``. Ref operands arrive as
:class:`~pallas._src.interpreter.evaluator.Cell` objects holding the current value of
the buffer. Core primitives register their rule next to their definition; backends
register theirs through the plugin hook ``pallas_interpret_rules``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

interpret_rules: dict[Any, Callable[..., Any]] = {}


def register_interpret_rule(prim):
    """Decorator: registers ``rule`` as the interpreter rule of ``prim``."""

    def register(rule):
        interpret_rules[prim] = rule
        return rule

    return register
