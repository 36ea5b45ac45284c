"""Mosaic TPU lowering rules, one per primitive: ``rule(lctx, eqn, *invals) -> outs``.

Search for a primitive's name to find its rule. Rules raise ``NotImplementedError`` or
``ValueError`` with a clear message for what Mosaic cannot express; the engine turns
those into a :class:`~pallas_tpu.LoweringException` naming the primitive and the source
line.
"""

from pallas_tpu._src import core_compat as cc
from pallas_tpu._src.lowering import (  # noqa: F401 - each module registers its rules
    rules_arith,
    rules_control,
    rules_random,
    rules_reduce,
    rules_refs,
    rules_tpu,
)
from pallas_tpu._src.lowering.engine import RULES

# What has no Mosaic TPU lowering (every primitive of pallas.plugins.PRIMITIVES has a
# rule or an entry here; tested). These run under interpret=True.
RULES.unsupported(cc.atomic_rmw_p, cc.atomic_cas_p,
                  reason="the atomics have no Mosaic TPU lowering yet")
RULES.unsupported(cc.core_map_p,
                  reason="a core_map nested inside a kernel has no Mosaic TPU lowering")
RULES.unsupported(cc.get_global_p,
                  reason="pl.get_global has no Mosaic TPU lowering yet (pallas-mosaic-gpu "
                         "lowers it); allocate semaphores as scratch_shapes")

__all__ = ["RULES"]
