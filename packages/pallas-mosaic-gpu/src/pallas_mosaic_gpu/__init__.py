"""Pallas on Mosaic GPU (Hopper, Blackwell): ``import pallas_mosaic_gpu as plgpu``.

Mirrors upstream's ``jax.experimental.pallas.mosaic_gpu`` (JAX 0.10.2). GPU interpret
mode (``interpret=plgpu.InterpretParams(...)``) runs kernels on CPU with their threads,
barriers, TMA copies and race detection; see :mod:`pallas_mosaic_gpu.interpret`.
"""

# Layout types of the Mosaic GPU compiler library, passed through as upstream does.
from jax.experimental.mosaic.gpu.fragmented_array import Replicated, Tiling

from pallas_mosaic_gpu.__about__ import __version__
from pallas_mosaic_gpu._src.atomics import (
    atomic_add,
    atomic_and,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_xor,
)
from pallas_mosaic_gpu._src.cluster import (
    PeerMemRef,
    RefUnion,
    SemaphoreSignal,
    TryClusterCancelResult,
    as_torch_kernel,
    async_store_smem,
    cluster_ref,
    format_tcgen05_sparse_metadata,
    multicast_ref,
    query_cluster_cancel,
    remote_ref,
    semaphore_signal_parallel,
    try_cluster_cancel,
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
from pallas_mosaic_gpu._src.layouts import (
    Layout,
    RefType,
    ShapeDtypeStruct,
    TMEMLayout,
    broadcasted_iota,
    inline_mgpu,
    layout_cast,
    load,
    print_layout,
)
from pallas_mosaic_gpu._src.loops import (
    NDLoopInfo,
    dynamic_scheduling_loop,
    nd_loop,
    planar_snake,
    warp_map,
)
from pallas_mosaic_gpu._src.memory import (
    GMEM,
    REGS,
    SMEM,
    TMEM,
    Barrier,
    ClusterBarrier,
    GPUMemoryRef,
    MemorySpace,
    transpose_ref,
)
from pallas_mosaic_gpu._src.mesh import Mesh, WarpMesh
from pallas_mosaic_gpu._src.pipeline import PipelinePipeline, emit_pipeline
from pallas_mosaic_gpu._src.pipeline_ws import emit_pipeline_warp_specialized
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
from pallas_mosaic_gpu._src.primitives.hints import (
    async_prefetch,
    commit_tmem,
    griddepcontrol_launch_dependents,
    griddepcontrol_wait,
    set_max_registers,
    wait_load_tmem,
)
from pallas_mosaic_gpu._src.primitives.mma import (
    ACC,
    WGMMAAccumulatorRef,
    tcgen05_mma,
    wgmma,
    wgmma_accumulator_load,
    wgmma_wait,
)
from pallas_mosaic_gpu._src.primitives.multimem import (
    multimem_load_reduce,
    multimem_store,
    semaphore_signal_multicast,
)
from pallas_mosaic_gpu._src.primitives.tmem import (
    async_copy_scales_to_tmem,
    async_copy_smem_to_tmem,
    async_copy_sparse_metadata_to_tmem,
    async_load_tmem,
    async_store_tmem,
    tcgen05_commit_arrive,
)
from pallas_mosaic_gpu._src.semaphores import SemaphoreType, semaphore_signal, semaphore_wait
from pallas_mosaic_gpu._src.transforms import (
    BlockSpec,
    SwizzleTransform,
    TilingTransform,
    Transform,
    transform_ref,
)

__all__ = [
    "ACC", "GMEM", "REGS", "SMEM", "TMEM", "Barrier", "BlockSpec", "ClusterBarrier",
    "CompilerParams", "CopyPartition", "DimensionSemantics", "GPUMemoryRef",
    "InterpretParams", "Layout", "LoweringSemantics", "MemorySpace", "Mesh", "NDLoopInfo",
    "OOBFillMode", "PeerMemRef", "PipelinePipeline", "RefType", "RefUnion", "Replicated",
    "SemaphoreSignal", "SemaphoreType", "ShapeDtypeStruct", "SwizzleTransform",
    "TMEMLayout", "Tiling", "TilingTransform", "TraceScope", "Transform", "TryClusterCancelResult",
    "WGMMAAccumulatorRef", "WarpMesh", "__version__", "as_torch_kernel",
    "async_copy_scales_to_tmem", "async_copy_smem_to_tmem",
    "async_copy_sparse_metadata_to_tmem", "async_load_tmem", "async_prefetch",
    "async_store_smem", "async_store_tmem", "atomic_add", "atomic_and", "atomic_max",
    "atomic_min", "atomic_or", "atomic_xor", "barrier_arrive", "barrier_test",
    "barrier_wait", "broadcasted_iota", "cluster_ref", "commit_smem",
    "commit_smem_to_gmem_group", "commit_tmem", "copy_gmem_to_smem", "copy_smem_to_gmem",
    "dynamic_scheduling_loop", "emit_pipeline", "emit_pipeline_warp_specialized",
    "find_swizzle", "format_tcgen05_sparse_metadata", "griddepcontrol_launch_dependents",
    "griddepcontrol_wait", "inline_mgpu", "kernel", "layout_cast", "load",
    "multicast_ref", "multimem_load_reduce", "multimem_store", "nd_loop", "planar_snake",
    "print_layout", "query_cluster_cancel", "remote_ref", "semaphore_signal",
    "semaphore_signal_multicast", "semaphore_signal_parallel", "semaphore_wait",
    "set_max_registers", "tcgen05_commit_arrive", "tcgen05_mma", "transform_ref",
    "transpose_ref", "try_cluster_cancel", "wait_load_tmem", "wait_smem_to_gmem",
    "warp_map", "wgmma", "wgmma_accumulator_load", "wgmma_wait",
]
