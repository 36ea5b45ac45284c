"""Lowering of ``pallas_call`` kernels to Mosaic GPU (``jax.experimental.mosaic.gpu``).

Layered as the other backends' lowerings are (each layer imports only those before it):

- the values: :mod:`context` (``Lit``, ``RefVal``, ``LoweringContext``, the errors) and
  :mod:`values` (MLIR types, constants, warpgroup arrays);
- the emission helpers: :mod:`small`, :mod:`register_layouts`, :mod:`smem`,
  :mod:`tmem`, :mod:`threads`, :mod:`elements`, :mod:`views`, :mod:`spill`,
  :mod:`scoped` (buffer planning), :mod:`mma`, :mod:`collectives`, and the planners
  :mod:`infer`, :mod:`scoped_stack`, :mod:`smem_tree`, :mod:`smem_budget`,
  :mod:`tmem_alloc`, :mod:`copies`, :mod:`aliases`;
- :mod:`engine`: the rule table ``RULES`` (keyed by primitive object) and the jaxpr
  walker;
- the rules, one module per family, which import helpers and the engine but never each
  other: ``rules_*``, :mod:`warps`, :mod:`unsupported`;
- :mod:`kernel` builds the kernel (grid, TMA block copies, the body); :mod:`call` emits
  Mosaic GPU's ``mosaic_gpu_v2`` custom call.
"""

from pallas_mosaic_gpu._src.lowering import (  # noqa: F401 - each module registers rules
    rules_arith,
    rules_collectives,
    rules_control,
    rules_debug,
    rules_dot,
    rules_layout,
    rules_load_store,
    rules_refs,
    rules_shape,
    rules_tcgen05,
    rules_threads,
    rules_tma,
    rules_wgmma,
    unsupported,
    warps,
)
from pallas_mosaic_gpu._src.lowering.call import lower_pallas_call
from pallas_mosaic_gpu._src.lowering.engine import RULES, MosaicGpuLoweringError
from pallas_mosaic_gpu._src.lowering.kernel import Kernel, build

__all__ = ["RULES", "Kernel", "MosaicGpuLoweringError", "build", "lower_pallas_call"]
