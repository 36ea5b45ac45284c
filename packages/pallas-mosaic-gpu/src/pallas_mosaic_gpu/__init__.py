"""Pallas on Mosaic GPU (Hopper, Blackwell): ``import pallas_mosaic_gpu as plgpu``.

Mirrors upstream's ``jax.experimental.pallas.mosaic_gpu`` (JAX 0.10.2).
"""

from pallas_mosaic_gpu.__about__ import __version__
from pallas_mosaic_gpu._src.atomics import (
    atomic_add,
    atomic_and,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_xor,
)
from pallas_mosaic_gpu._src.compiler_params import (
    CompilerParams,
    DimensionSemantics,
    LoweringSemantics,
    TraceScope,
)
from pallas_mosaic_gpu._src.helpers import find_swizzle
from pallas_mosaic_gpu._src.memory import (
    GMEM,
    REGS,
    SMEM,
    TMEM,
    Barrier,
    ClusterBarrier,
    GPUMemoryRef,
    MemorySpace,
)
from pallas_mosaic_gpu._src.semaphores import SemaphoreType, semaphore_signal, semaphore_wait

__all__ = [
    "GMEM",
    "REGS",
    "SMEM",
    "TMEM",
    "Barrier",
    "ClusterBarrier",
    "CompilerParams",
    "DimensionSemantics",
    "GPUMemoryRef",
    "LoweringSemantics",
    "MemorySpace",
    "SemaphoreType",
    "TraceScope",
    "__version__",
    "atomic_add",
    "atomic_and",
    "atomic_max",
    "atomic_min",
    "atomic_or",
    "atomic_xor",
    "find_swizzle",
    "semaphore_signal",
    "semaphore_wait",
]
