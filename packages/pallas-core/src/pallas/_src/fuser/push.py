"""``push_block_spec``: from the block specs of a function's inputs to its outputs.

The function is traced and walked forwards; each primitive's push rule maps the block
specs of its operands to those of its results (``rules_*.py``). Values computed only
from constants have no block spec; an output left without one takes the first input
spec (it is computed from whole values, so any block of it is right).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.fuser import transforms as tf
from pallas._src.fuser.registry import known, push_block_spec_rules
from pallas._src.fuser.tracing import make_jaxpr


@dataclasses.dataclass
class PushRuleContext:
    """What a push rule knows about its equation."""

    avals_in: tuple[Any, ...]
    avals_out: tuple[Any, ...]


def _unsupported(eqn, in_specs) -> NotImplementedError:
    where = ""
    try:
        where = f" (at {jc.source_info_util.summarize(eqn.source_info)})"
    except Exception:  # noqa: BLE001
        pass
    specs = ", ".join(tf.describe(s) for s in in_specs)
    return NotImplementedError(
        f"pallas.fuser cannot push a block spec through `{eqn.primitive.name}`{where}: "
        f"its operand block specs ({specs}) have no push rule. Primitives with push rules: "
        f"{known(push_block_spec_rules)}. Register one with "
        f"pallas.fuser.register_push_block_spec_rule({eqn.primitive.name}_p).")


def push_jaxpr(jaxpr, *in_specs) -> tuple:
    """The output block specs of ``jaxpr`` given one spec (or no_block_spec) per input."""
    if len(in_specs) != len(jaxpr.invars):
        raise ValueError(f"Expected {len(jaxpr.invars)} block specs, got {len(in_specs)}")
    env: dict[Any, Any] = {v: bs.no_block_spec for v in jaxpr.constvars}
    env.update(zip(jaxpr.invars, in_specs))

    def read(v):
        return bs.no_block_spec if isinstance(v, jc.Literal) else env[v]

    for eqn in jaxpr.eqns:
        ins = tuple(read(v) for v in eqn.invars)
        if all(s is bs.no_block_spec for s in ins):
            outs = [bs.no_block_spec] * len(eqn.outvars)
        else:
            rule = push_block_spec_rules.get(eqn.primitive)
            if rule is None:
                raise _unsupported(eqn, ins)
            ctx = PushRuleContext(tuple(v.aval for v in eqn.invars),
                                  tuple(v.aval for v in eqn.outvars))
            outs = rule(ctx, *ins, **eqn.params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for v, s in zip(eqn.outvars, outs):
            env[v] = s
    outs = tuple(read(v) for v in jaxpr.outvars)
    given = [s for s in in_specs if s is not bs.no_block_spec]
    if not given:
        raise ValueError("push_block_spec needs at least one input block spec")
    return tuple(given[0] if s is bs.no_block_spec else s for s in outs)


def push_block_spec(f: Callable, *in_spec_args, **in_spec_kwargs) -> Callable:
    """Pushes BlockSpecs of ``f``'s inputs forward to its outputs.

    ``push_block_spec(f, *arg_specs, **kwarg_specs)(*args, **kwargs)`` traces ``f`` on
    ``args`` (arrays or ``jax.ShapeDtypeStruct``s) and returns the output block specs.
    """

    def wrapped(*args, **kwargs):
        flat_specs, spec_tree = jax.tree.flatten((in_spec_args, in_spec_kwargs))
        jaxpr, _, in_tree, out_tree = make_jaxpr(f, *args, **kwargs)
        if in_tree != spec_tree:
            raise ValueError(f"Expected {in_tree} PyTree, got {spec_tree}")
        return jax.tree.unflatten(out_tree, push_jaxpr(jaxpr, *flat_specs))

    return wrapped
