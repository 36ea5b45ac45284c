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
from pallas_mosaic_gpu._src.interpret.params import InterpretParams
from pallas_mosaic_gpu._src.kernel import kernel
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
from pallas_mosaic_gpu._src.mesh import Mesh, WarpMesh
from pallas_mosaic_gpu._src.primitives.barriers import barrier_arrive, barrier_test, barrier_wait
from pallas_mosaic_gpu._src.primitives.copies import (
    CopyPartition,
    OOBFillMode,
    commit_smem,
    commit_smem_to_gmem_group,
    copy_gmem_to_smem,
    copy_smem_to_gmem,
    wait_smem_to_gmem,
)
from pallas_mosaic_gpu._src.semaphores import SemaphoreType, semaphore_signal, semaphore_wait
from pallas_mosaic_gpu._src.transforms import (
    BlockSpec,
    SwizzleTransform,
    TilingTransform,
    Transform,
    transform_ref,
    transpose_ref,
)

__all__ = [
    "BlockSpec",
    "CopyPartition",
    "InterpretParams",
    "Mesh",
    "OOBFillMode",
    "SwizzleTransform",
    "TilingTransform",
    "Transform",
    "WarpMesh",
    "barrier_arrive",
    "barrier_test",
    "barrier_wait",
    "commit_smem",
    "commit_smem_to_gmem_group",
    "copy_gmem_to_smem",
    "copy_smem_to_gmem",
    "kernel",
    "transform_ref",
    "transpose_ref",
    "wait_smem_to_gmem",
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
