"""``plgpu.core``: the Mosaic GPU types of the programming model as one module (upstream
keeps them in ``jax._src.pallas.mosaic_gpu.core``): memory spaces, layouts, meshes,
SMEM transforms and the lowering semantics."""

from pallas_mosaic_gpu import (
    BlockSpec,
    GPUMemoryRef,
    Layout,
    LoweringSemantics,
    MemorySpace,
    Mesh,
    SwizzleTransform,
    TilingTransform,
    TMEMLayout,
    Transform,
    WarpMesh,
)
from pallas_mosaic_gpu._src.layouts import ParameterizedLayout, ReducedLayout, SomeLayout

__all__ = [
    "BlockSpec", "GPUMemoryRef", "Layout", "LoweringSemantics", "MemorySpace", "Mesh",
    "ParameterizedLayout", "ReducedLayout", "SomeLayout", "SwizzleTransform", "TMEMLayout",
    "TilingTransform", "Transform", "WarpMesh",
]
