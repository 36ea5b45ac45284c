"""Walks a kernel jaxpr and emits Mosaic TPU MLIR through the per-primitive rules.

Values in the environment are ``ir.Value`` (vectors for arrays of rank >= 1, scalars for
rank 0), :class:`RefVal` for refs (a memref plus which of its dims the kernel does not
see), or :class:`Lit` for literals (materialised by the rule that uses them); they are
defined in ``values``. The engine owns the rule table the rule modules register into.
"""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mosaic.python import tpu

from pallas.plugins import RuleTable, walk_jaxpr
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.enums import LoweringException
from pallas_tpu._src.lowering.values import Lit, LoweringContext, RefVal

#: pallas-tpu's Mosaic lowering rules, one table keyed by primitive object. The rule
#: modules (``rules_*``) register into it; ``lowering.rules`` imports them all.
RULES = RuleTable("mosaic_tpu lowering", "rule(lctx: LoweringContext, eqn, *invals) -> outs")


def rule(*prims):
    """Registers the decorated function as the Mosaic lowering rule of ``prims``."""
    return RULES.register(*prims, owner="pallas_tpu")


def lower_jaxpr(lctx: LoweringContext, jaxpr, consts, args) -> list:
    """Emits ``jaxpr`` at the current insertion point; returns its outputs (with
    ``lctx.rules``, else :data:`RULES`, which holds every rule once
    ``pallas_tpu._src.lowering.rules`` is imported)."""
    table = RULES if lctx.rules is None else lctx.rules
    consts = [c if isinstance(c, (ir.Value, RefVal, Lit)) else Lit(np.asarray(c), v.aval)
              for v, c in zip(jaxpr.constvars, consts)]
    for eqn in jaxpr.eqns:
        lctx.used_vars.update(v for v in eqn.invars if isinstance(v, jc.Var))
    lctx.used_vars.update(v for v in jaxpr.outvars if isinstance(v, jc.Var))
    entry = lctx.scopes

    def lower_eqn(eqn, invals: list) -> list:
        _enter_scopes(lctx, entry, _scopes_of(eqn, entry))
        rule = table.require(eqn.primitive, lambda reason: LoweringException(
            f"backend '{lctx.backend}' cannot lower the primitive "
            f"'{eqn.primitive.name}' to Mosaic TPU yet (kernel {lctx.name}, at "
            f"{jc.source_info_summary(eqn)}"
            f"{'; ' + reason if reason else ''}). It runs under interpret=True."))
        try:
            outs = rule(lctx, eqn, *invals)
        except LoweringException:
            raise
        except (NotImplementedError, ValueError, TypeError) as e:
            raise LoweringException(
                f"Lowering '{eqn.primitive.name}' in kernel {lctx.name} to Mosaic TPU failed "
                f"at {jc.source_info_summary(eqn)}: {type(e).__name__}: {e}"
            ) from e
        lctx.uses.add(eqn.primitive.name)
        return outs if eqn.primitive.multiple_results else [outs]

    outs = walk_jaxpr(jaxpr, consts, args, lower_eqn, literal=lambda v: Lit(v.val, v.aval))
    _enter_scopes(lctx, entry, entry)
    return outs


def _scopes_of(eqn, entry: tuple) -> tuple:
    """The ``jax.named_scope`` names ``eqn`` was traced in, counted from the kernel's top
    (a nested jaxpr's equations may carry them relative to their parent's)."""
    names = tuple(s.name for s in eqn.source_info.name_stack.stack
                  if type(s).__name__ == "Scope")
    return names if names[:len(entry)] == entry else entry + names


def _enter_scopes(lctx: LoweringContext, entry: tuple, want: tuple) -> None:
    """Closes (``tpu.trace_stop``) the open scopes ``want`` leaves and opens
    (``tpu.trace_start``, level 10) its new ones, as upstream traces named scopes; never
    below ``entry``, the scopes open where this jaxpr's region starts."""
    cur = lctx.scopes
    keep = len(entry)
    while keep < min(len(cur), len(want)) and cur[keep] == want[keep]:
        keep += 1
    for _ in range(len(cur) - keep):
        tpu.trace_stop()
    for name in want[keep:]:
        tpu.trace_start(name, 10)
    lctx.scopes = want
