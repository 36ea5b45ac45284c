"""``pltpu.core``: the TPU types of the programming model, as one module."""

from pallas_tpu._src.compiler_params import (
    ARBITRARY,
    CORE_PARALLEL,
    PARALLEL,
    SUBCORE_PARALLEL,
    CompilerParams,
    GridDimensionSemantics,
    KernelType,
    SideEffectType,
)
from pallas_tpu._src.enums import CoreType
from pallas_tpu._src.memory import MemorySpace, SemaphoreType, dma_semaphore, semaphore_dtype

__all__ = [
    "ARBITRARY", "CORE_PARALLEL", "CompilerParams", "CoreType", "GridDimensionSemantics",
    "KernelType", "MemorySpace", "PARALLEL", "SUBCORE_PARALLEL", "SemaphoreType",
    "SideEffectType", "dma_semaphore", "semaphore_dtype",
]
