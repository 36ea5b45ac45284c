"""``cf`` ops: ``cf.assert``, the device assertion of ``pl.debug_check``. A lane whose
condition is false traps the kernel: the run stops with an :class:`EmulationError`
carrying the assertion's message."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from pallas_mosaic_gpu._src.executor.engine import op
from pallas_mosaic_gpu._src.executor.types import EmulationError


@op("cf.assert")
def _assert(o, cc):
    msg = ir.StringAttr(o.attributes["msg"]).value

    def run(m, cond):
        ok = np.broadcast_to(np.asarray(cond, bool).reshape(-1), (m.threads,))
        failed = ~ok if m.mask is None else (m.mask & ~ok)
        if failed.any():
            raise EmulationError(f"device assertion failed in lane "
                                 f"{int(np.nonzero(failed)[0][0])}: {msg}")

    return run
