"""Mosaic TPU lowering rules, one per primitive: ``rule(lctx, eqn, *invals) -> outs``.

Search for a primitive's name to find its rule. Rules raise ``NotImplementedError`` or
``ValueError`` with a clear message for what Mosaic cannot express; the engine turns
those into a :class:`~pallas_tpu.LoweringException` naming the primitive and the source
line.
"""

from pallas_tpu._src.lowering import (  # noqa: F401 - each module registers its rules
    rules_arith,
    rules_control,
    rules_refs,
    rules_tpu,
)
from pallas_tpu._src.lowering.common import RULES

__all__ = ["RULES"]
