"""The Mosaic TPU backend of Pallas (``import pallas_tpu as pltpu``).

The public surface mirrors upstream ``jax.experimental.pallas.tpu`` (JAX 0.10.2) name by
name. Names not implemented yet raise ``NotImplementedError`` naming themselves and the
backend; the README lists them.
"""

from pallas import PrefetchScalarGridSpec
from pallas import load as load
from pallas import store as store
from pallas_tpu import compiler, core, errors
from pallas_tpu import plugin as _plugin  # noqa: F401 - registers the interpreter rules
from pallas_tpu.__about__ import __version__
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
from pallas_tpu._src.enums import BufferType, CoreType, LoweringException, Tiling
from pallas_tpu._src.interpret.params import (
    InterpretParams,
    force_tpu_interpret_mode,
    reset_tpu_interpret_mode_state,
    set_tpu_interpret_mode,
)
from pallas_tpu._src.memory import (
    CMEM,
    HBM,
    SEMAPHORE,
    SMEM,
    VMEM,
    VMEM_SHARED,
    MemorySpace,
    SemaphoreType,
    dma_semaphore,
)
from pallas_tpu._src.mesh import TensorCoreMesh, create_tensorcore_mesh, run_on_first_core
from pallas_tpu._src.pipeline import (
    BufferedRef,
    BufferedRefBase,
    emit_pipeline,
    emit_pipeline_with_allocations,
)
from pallas_tpu._src.primitives.dma import (
    AsyncCopyDescriptor,
    async_copy,
    async_remote_copy,
    make_async_copy,
    make_async_remote_copy,
    sync_copy,
)
from pallas_tpu._src.primitives.misc import (
    core_barrier,
    get_barrier_semaphore,
    prng_random_bits,
    prng_seed,
    stateful_bernoulli,
    stateful_bits,
    stateful_normal,
    stateful_uniform,
    touch,
    trace_value,
    with_memory_space_constraint,
)
from pallas_tpu._src.primitives.mxu import matmul_acc_lhs, matmul_pop, matmul_push_rhs
from pallas_tpu._src.primitives.vector import (
    bitcast,
    einshape,
    pack_elementwise,
    roll,
    stochastic_round,
    unpack_elementwise,
)
from pallas_tpu._src.prng_keys import to_pallas_key
from pallas_tpu._src.sampling import sample_block
from pallas_tpu._src.tpu_info import (
    ChipVersion,
    TpuInfo,
    get_tpu_info,
    get_tpu_info_for_chip,
    is_tpu_device,
)
from pallas_tpu.compiler import compile  # noqa: A004 - pallas_tpu.compile, as planned

# The 66 names of upstream jax.experimental.pallas.tpu (JAX 0.10.2).
UPSTREAM_NAMES = (
    "ARBITRARY", "BufferType", "BufferedRef", "BufferedRefBase", "CMEM", "CORE_PARALLEL",
    "ChipVersion", "CompilerParams", "CoreType", "GridDimensionSemantics", "HBM",
    "InterpretParams", "LoweringException", "MemorySpace", "PARALLEL",
    "PrefetchScalarGridSpec", "SEMAPHORE", "SMEM", "SUBCORE_PARALLEL", "SemaphoreType",
    "SideEffectType", "Tiling", "TpuInfo", "VMEM", "VMEM_SHARED", "async_copy",
    "async_remote_copy", "bitcast", "core", "core_barrier", "create_tensorcore_mesh",
    "dma_semaphore", "einshape", "emit_pipeline", "emit_pipeline_with_allocations",
    "force_tpu_interpret_mode", "get_barrier_semaphore", "get_tpu_info",
    "get_tpu_info_for_chip", "is_tpu_device", "load", "make_async_copy",
    "make_async_remote_copy", "matmul_acc_lhs", "matmul_pop", "matmul_push_rhs",
    "pack_elementwise", "prng_random_bits", "prng_seed", "reset_tpu_interpret_mode_state",
    "roll", "run_on_first_core", "sample_block", "set_tpu_interpret_mode",
    "stateful_bernoulli", "stateful_bits", "stateful_normal", "stateful_uniform",
    "stochastic_round", "store", "sync_copy", "to_pallas_key", "touch", "trace_value",
    "unpack_elementwise", "with_memory_space_constraint",
)

__all__ = [*UPSTREAM_NAMES, "AsyncCopyDescriptor", "KernelType", "TensorCoreMesh",
           "__version__", "compile", "compiler", "errors"]
