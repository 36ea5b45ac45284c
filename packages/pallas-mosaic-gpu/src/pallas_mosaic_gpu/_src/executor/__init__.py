"""An executor of the Mosaic GPU modules pallas-mosaic-gpu generates: the module handed
to the ``mosaic_gpu_v2`` custom call runs on CPU with numpy, op by op with MLIR
semantics, the 128 threads of a warpgroup in lockstep (each value carries a leading
thread axis), CUDA blocks one after another, GMEM/SMEM/kernel parameters in one flat
byte-addressed memory, TMA copies and mbarriers as block-level operations.

It backs the conformance level ``emulate`` of the ``mosaic_gpu`` backend: the generated
code is executed, so a wrong lowering gives wrong numbers there. An op it does not know
raises :class:`EmulationUnsupported` naming the op (reported unsupported, never wrong
numbers); a run-time fault of the generated code (out-of-bounds access, a barrier wait
that cannot complete) raises :class:`EmulationError`.
"""

from pallas_mosaic_gpu._src.executor.engine import OPS
from pallas_mosaic_gpu._src.executor.launch import (
    compile_module,
    emulate_kernel,
    execute,
    module_of,
    plan_kernel,
    run_kernel,
)
from pallas_mosaic_gpu._src.executor.types import EmulationError, EmulationUnsupported

__all__ = ["OPS", "EmulationError", "EmulationUnsupported", "compile_module", "emulate_kernel",
           "execute",
           "module_of", "plan_kernel", "run_kernel"]
