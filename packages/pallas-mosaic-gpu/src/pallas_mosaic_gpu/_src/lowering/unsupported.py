"""Core primitives pallas-mosaic-gpu does not lower yet, each with what to do instead
(quoted in the lowering error). Every primitive of ``pallas.plugins.PRIMITIVES`` has a
rule or an entry here (tested)."""

from __future__ import annotations

from pallas import plugins
from pallas_mosaic_gpu._src.lowering.engine import RULES

RULES.unsupported(plugins.debug_print_p,
                  reason="not lowered yet; run the kernel with interpret=True to print")
RULES.unsupported(plugins.delay_p, reason="pl.delay is a TPU feature")
RULES.unsupported(plugins.atomic_cas_p,
                  reason="compare-and-swap is not lowered yet; use backend='triton'")
