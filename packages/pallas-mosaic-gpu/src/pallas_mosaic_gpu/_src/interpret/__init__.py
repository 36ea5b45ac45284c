"""GPU interpret mode: Mosaic GPU kernels on CPU with a GPU's concurrency semantics."""

# The rule modules register their GPU-interpret-mode rules when imported.
from pallas_mosaic_gpu._src.interpret import (  # noqa: F401
    rules_core,
    rules_misc,
    rules_mma,
    rules_multimem,
    rules_warps,
    sync,
    tma,
)
