"""Usage analysis: which values a fused kernel computes, and which are scalar prefetch.

A value used only to compute indices (dynamic-slice starts, a scalar broadcast into a
block) is a *scalar-prefetch* value: it is read from the kernel's scalar-prefetch
operands rather than passed as a block. Usages flow backwards from the outputs.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from pallas._src import jax_compat as jc
from pallas._src.fuser.registry import usage_rules


class Usage(enum.Enum):
    REGULAR = 0
    SCALAR_PREFETCH = 1


@dataclasses.dataclass
class UsageRuleContext:
    avals_in: tuple[Any, ...]
    avals_out: tuple[Any, ...]


def compute_usage(jaxpr, out_usages):
    """Runs the usage rules backwards; returns ``read(var) -> set[Usage]``."""
    env: dict[Any, set] = {}

    def read(v) -> set:
        if isinstance(v, jc.Literal):
            return set()
        return env.get(v, {Usage.REGULAR})

    def write(v, usage) -> None:
        if isinstance(v, jc.Literal):
            return
        env.setdefault(v, set()).update(usage)

    for v, u in zip(jaxpr.outvars, out_usages):
        write(v, u)
    for eqn in reversed(jaxpr.eqns):
        outs = [read(v) for v in eqn.outvars]
        rule = usage_rules.get(eqn.primitive)
        if rule is not None:
            ctx = UsageRuleContext(tuple(v.aval for v in eqn.invars),
                                   tuple(v.aval for v in eqn.outvars))
            ins = rule(ctx, outs if eqn.primitive.multiple_results else outs[0], **eqn.params)
        else:
            union = set().union(*outs)
            ins = [union] * len(eqn.invars)
        for v, u in zip(eqn.invars, ins):
            write(v, u)
    return read


def forward_usage(ctx, used_out, **params):
    """The default for value-to-value primitives: inputs are used as the output is."""
    del params
    if isinstance(used_out, list):
        used_out = set().union(*used_out)
    return [set(used_out)] * len(ctx.avals_in)
