"""The SparseCore lowering rule table: SparseCore rules first, then pallas-tpu's.

``rule(*prims)`` registers a SparseCore lowering rule (search a primitive's name to find
it). :data:`RULES` is a ``pallas.plugins.RuleTable`` whose parent is pallas-tpu's table
(through its public ``pallas_tpu.extend``): a primitive is looked up here first, then
there, so arithmetic, control flow, DMAs and semaphores lower as for a TensorCore unless
SparseCore needs something else.
"""

from __future__ import annotations

from pallas.plugins import RuleTable
from pallas_tpu import extend as tpx

RULES = RuleTable("mosaic_sparsecore lowering", "rule(lctx, eqn, *invals) -> outs",
                  parent=tpx.RULES)


def rule(*prims):
    """Registers the decorated function as the SparseCore lowering rule of ``prims``."""
    return RULES.register(*prims, owner="pallas_tpu_sparsecore")
