"""``plgpu.lowering``: the errors of the Mosaic GPU lowering (upstream's
``jax._src.pallas.mosaic_gpu.lowering.LoweringError``).

``LoweringError`` is raised for what the lowering does not support (a
``NotImplementedError``); ``KernelError`` for a kernel the lowering rejects as invalid
(a ``ValueError``), each naming the kernel and the primitive.
"""

from pallas_mosaic_gpu._src.lowering.engine import KernelError
from pallas_mosaic_gpu._src.lowering.engine import MosaicGpuLoweringError as LoweringError

__all__ = ["KernelError", "LoweringError"]
