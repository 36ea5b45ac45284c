"""Lowering rule of ``pl.debug_check``: a device assertion (``cf.assert``) of the
condition, whose failure traps the kernel with the check's message. The primitive is
bound only while debug checks are enabled (``pl.enable_debug_checks``), so a kernel
traced without them has no assertion."""

from __future__ import annotations

from jaxlib.mlir.dialects import cf

from pallas import plugins
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import rule


@rule(plugins.debug_check_p)
def _debug_check(lctx, eqn, cond):
    cf.assert_(V.scalar(cond, eqn.invars[0].aval), eqn.params["message"])
    return []
