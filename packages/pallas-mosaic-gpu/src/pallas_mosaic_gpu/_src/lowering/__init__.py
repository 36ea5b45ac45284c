"""Lowering of ``pallas_call`` kernels to Mosaic GPU (``jax.experimental.mosaic.gpu``).

:mod:`kernel` builds the kernel (grid, TMA block copies, the body); :mod:`engine` walks
the kernel jaxpr through the rules in ``rules_*`` (one per primitive, keyed by the
primitive object); :mod:`call` emits Mosaic GPU's ``mosaic_gpu_v2`` custom call.
"""

from pallas_mosaic_gpu._src.lowering import (  # noqa: F401 - each module registers rules
    collectives,
    rules_arith,
    rules_control,
    rules_dot,
    rules_layout,
    rules_load_store,
    rules_refs,
    rules_shape,
    rules_tcgen05,
    rules_tma,
    rules_wgmma,
    scoped,
    threads,
    unsupported,
    warps,
)
from pallas_mosaic_gpu._src.lowering.call import lower_pallas_call
from pallas_mosaic_gpu._src.lowering.engine import RULES, MosaicGpuLoweringError
from pallas_mosaic_gpu._src.lowering.kernel import Kernel, build

__all__ = ["RULES", "Kernel", "MosaicGpuLoweringError", "build", "lower_pallas_call"]
