"""Pallas: a JAX kernel language over Refs, grids and BlockSpecs (``import pallas as pl``).

The public surface mirrors upstream ``jax.experimental.pallas`` (JAX 0.10.2), name by
name; backends are separate packages discovered through entry points. See
:mod:`pallas.plugins` for the backend contract.
"""

from pallas.__about__ import __version__
from pallas._src.block_spec import (
    BlockDim,
    Blocked,
    BlockSpec,
    BoundedSlice,
    Buffered,
    Element,
    Indirect,
    NoBlockSpec,
    RevisitMode,
    Squeezed,
    no_block_spec,
    squeezed,
)
from pallas._src.compiler_params import CompilerParams
from pallas._src.config import (
    enable_bounds_checks,
    enable_debug_checks,
    enable_poison_buffers,
    grad_fallback,
    sharding_gather,
)
from pallas._src.cost import CostEstimate, estimate_cost
from pallas._src.emulation.call import EmulationError
from pallas._src.emulation.device import EmulatedDevice, emulate_device, emulated_device
from pallas._src.emulation.device_object import install as _install_device_object
from pallas._src.grid_spec import GridSpec, PrefetchScalarGridSpec
from pallas._src.interpreter.grid_runner import InterpreterError
from pallas._src.jax_compat import Slice, ds
from pallas._src.memory import ANY, HOST, MemoryRef, MemorySpace, semaphore
from pallas._src.mesh import core_map, kernel
from pallas._src.pallas_call import InterpretParams, pallas_call, pallas_call_p
from pallas._src.partitioning import ShardingGatherWarning
from pallas._src.primitives.control import loop, when
from pallas._src.primitives.debug import debug_check, debug_print, delay
from pallas._src.primitives.globals import get_global
from pallas._src.primitives.grid import num_programs, program_id
from pallas._src.primitives.hints import multiple_of
from pallas._src.primitives.load_store import load, store, swap
from pallas._src.primitives.scoped import run_scoped, with_scoped
from pallas._src.primitives.semaphores import (
    DeviceIdType,
    semaphore_read,
    semaphore_signal,
    semaphore_wait,
)
from pallas._src.transforms.ad import GradFallbackWarning
from pallas._src.utils import (
    align_to,
    broadcast_to,
    cdiv,
    empty,
    empty_like,
    empty_ref_like,
    lower_as_mlir,
    next_power_of_2,
    pallas_export_experimental,
    reciprocal,
    run_state,
    select_ref,
    strides_from_shape,
)

dslice = ds

# Errors and warnings print the path users import them from.
for _cls in (InterpreterError, GradFallbackWarning, ShardingGatherWarning):
    _cls.__module__ = "pallas"
del _cls

# A CPU device answers `num_cores`/`core_count` for the emulated device, as kernels
# that size themselves from `jax.devices()[0]` expect (emulation.device_object).
_install_device_object()

# Registers the transformation rules of pallas_call_p (vmap, jvp, grad, effects): each
# module of pallas._src.transforms registers its own when imported. (The kernel-side
# primitives' rules are registered beside their definitions, in pallas._src.primitives.)
from pallas._src.transforms import ad as _ad  # noqa: E402, F401
from pallas._src.transforms import batching as _batching  # noqa: E402, F401
from pallas._src.transforms import effects as _effects  # noqa: E402, F401

__all__ = [
    "ANY", "HOST", "BlockDim", "BlockSpec", "Blocked", "BoundedSlice", "Buffered",
    "CompilerParams", "CostEstimate", "DeviceIdType", "Element", "GridSpec", "Indirect",
    "InterpretParams", "InterpreterError", "MemoryRef", "MemorySpace", "NoBlockSpec",
    "PrefetchScalarGridSpec", "RevisitMode", "Slice", "Squeezed", "align_to",
    "broadcast_to", "cdiv", "core_map", "debug_check", "debug_print", "delay", "ds", "dslice", "empty",
    "empty_like", "empty_ref_like", "enable_bounds_checks", "enable_debug_checks",
    "enable_poison_buffers", "estimate_cost", "EmulatedDevice", "EmulationError",
    "emulate_device", "emulated_device", "grad_fallback", "GradFallbackWarning",
    "sharding_gather", "ShardingGatherWarning",
    "get_global", "kernel", "load", "loop", "lower_as_mlir",
    "multiple_of", "next_power_of_2", "no_block_spec", "num_programs", "pallas_call",
    "pallas_call_p", "pallas_export_experimental", "program_id", "reciprocal", "run_scoped",
    "run_state", "select_ref", "semaphore", "semaphore_read", "semaphore_signal",
    "semaphore_wait", "squeezed", "store", "strides_from_shape", "swap", "when",
    "with_scoped", "__version__",
]
