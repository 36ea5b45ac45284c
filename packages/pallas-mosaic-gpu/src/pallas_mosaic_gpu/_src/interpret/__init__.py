"""GPU interpret mode: Mosaic GPU kernels on CPU with a GPU's concurrency semantics."""

# The rule modules register their GPU-interpret-mode rules when imported, and ``launch``
# registers the pallas_call lowering (params.py) and core_map discharge (mesh.py).
from pallas_mosaic_gpu._src.interpret import (  # noqa: F401
    launch,
    rules_core,
    rules_misc,
    rules_mma,
    rules_multimem,
    rules_sync,
    rules_warps,
    tma,
)
