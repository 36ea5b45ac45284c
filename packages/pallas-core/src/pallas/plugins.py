"""The backend plugin API: the contract, discovery and selection.

Backend authors need only this module: subclass :class:`Backend` (its methods take a
:class:`KernelRequest` or :class:`LoweringRequest`), return instances from a
``@hookimpl``-marked ``pallas_backends`` function, and register the module in the
``pallas.backends`` entry-point group. The hooks are documented in
``pallas/_src/registry/hookspecs.py``; rules are kept in :class:`RuleTable` objects keyed
by primitive (the interpreter's is :data:`interpret_rules`).
"""

from pallas._src.block_spec import Blocked, BoundedSlice, Element, Squeezed
from pallas._src.dynamic_grid import dynamic_grid_dim
from pallas._src.emulation.call import EmulatedKernel, EmulationError, emulated_kernels
from pallas._src.emulation.call import backend_for as emulated_backend
from pallas._src.emulation.device import EmulatedDevice, emulated_device
from pallas._src.grid_spec import BlockMapping, GridMapping
from pallas._src.interpreter.analysis import scratch_live_in
from pallas._src.interpreter.device_groups import DeviceGroups
from pallas._src.interpreter.evaluator import Cell, KernelContext, eval_jaxpr
from pallas._src.interpreter.grid_runner import Checks, interpret_pallas_call
from pallas._src.interpreter.host_call import host_call, host_call_p
from pallas._src.interpreter.kernel_state import KernelState, declare_kernel_state
from pallas._src.interpreter.modes import (
    InterpretMode,
    LoggingMode,
    SharedInterpretParams,
    forced_interpret,
    forced_interpret_mode,
    set_forced_interpret,
)
from pallas._src.interpreter.predication import active_or_true as branch_taken
from pallas._src.interpreter.predication import unpredicated
from pallas._src.interpreter.races import (
    Access,
    AccessLog,
    Race,
    RaceDetector,
    RaceReport,
    VectorClocks,
    happens_before,
    region,
    regions_overlap,
)
from pallas._src.interpreter.rules import (
    interpret_rules,
    interpret_schedules,
    register_interpret_rule,
    register_interpret_schedule,
)
from pallas._src.interpreter.views import add_flat as add_view
from pallas._src.interpreter.views import read_cell, write_cell
from pallas._src.interpreter.views import read_flat as read_view
from pallas._src.interpreter.views import swap_flat as swap_view
from pallas._src.jax_compat import axis_index_p
from pallas._src.jaxpr_util import walk_jaxpr
from pallas._src.jaxpr_walk import pallas_call_eqns, primitive_names
from pallas._src.memory import (
    MemoryRef,
    MemorySpace,
    SemaphoreSpace,
    array_dtype,
    is_semaphore_space,
)
from pallas._src.mesh import CoreMesh, Mesh, core_map_p
from pallas._src.pallas_call import lower_with_interpreter, pallas_call_p
from pallas._src.primitives.atomics import atomic_cas_p, atomic_rmw_p
from pallas._src.primitives.debug import (
    debug_check_p,
    debug_print_p,
    delay_p,
    kernel_debug_effect,
)
from pallas._src.primitives.effectful import effect_primitive
from pallas._src.primitives.globals import get_global_p
from pallas._src.primitives.grid import num_programs_p, program_id_p
from pallas._src.primitives.hints import multiple_of_p
from pallas._src.primitives.load_store import load_p, swap_p
from pallas._src.primitives.pretty import RefAccess, register_ref_access_printer, transforms_of
from pallas._src.primitives.scoped import fresh_cell, run_scoped_p
from pallas._src.primitives.semaphores import (
    semaphore_read_p,
    semaphore_signal_p,
    semaphore_wait_p,
)
from pallas._src.ref_operands import (
    RefOperands,
    ref_and_transforms,
    ref_operands_end,
    unpack_ref_operands,
)
from pallas._src.registry.backend import (
    LEVELS,
    Backend,
    LevelUnreachableError,
    LevelUnsupportedError,
)
from pallas._src.registry.boundary import private_core_imports
from pallas._src.registry.hookspecs import hookimpl, hookspec
from pallas._src.registry.params import resolve_compiler_params
from pallas._src.registry.registry import (
    ENTRY_POINT_GROUP,
    BackendLoadError,
    BackendNotFoundError,
    PluginLoadWarning,
    env_var,
    get_backend,
    list_backends,
    load_failures,
    register_backend,
    reset,
    select_backend,
)
from pallas._src.registry.requests import KernelArtifact, KernelRequest, LoweringRequest
from pallas._src.registry.rule_table import RuleConflictError, RuleTable
from pallas._src.transforms.effects import register_kernel_local_effect
from pallas._src.utils import SelectedRef  # pl.select_ref's result, for DMA operands

# The primitives of pallas-core that a backend lowers (besides JAX's own, e.g. the state
# primitives get/swap/addupdate and lax's), and the interpreter pieces it may reuse.
PRIMITIVES = (
    program_id_p, num_programs_p, load_p, swap_p, run_scoped_p, semaphore_signal_p,
    semaphore_wait_p, semaphore_read_p, multiple_of_p, debug_print_p, debug_check_p,
    delay_p, core_map_p, axis_index_p, atomic_rmw_p, atomic_cas_p, get_global_p,
)

__all__ = [
    "PRIMITIVES", "array_dtype", "atomic_cas_p", "atomic_rmw_p", "BlockMapping", "Blocked", "BoundedSlice",
    "Checks", "Element",
    "GridMapping", "dynamic_grid_dim", "MemoryRef", "MemorySpace", "SemaphoreSpace", "Squeezed",
    "axis_index_p", "core_map_p", "debug_check_p", "debug_print_p", "delay_p",
    "eval_jaxpr", "fresh_cell", "kernel_debug_effect", "interpret_pallas_call", "interpret_rules",
    "get_global_p", "is_semaphore_space", "load_p", "lower_with_interpreter", "multiple_of_p",
    "num_programs_p", "pallas_call_eqns", "pallas_call_p", "primitive_names", "program_id_p", "run_scoped_p",
    "semaphore_read_p", "semaphore_signal_p", "semaphore_wait_p", "swap_p",
    "Backend", "BackendLoadError", "BackendNotFoundError", "Cell", "CoreMesh", "ENTRY_POINT_GROUP",
    "KernelContext", "LEVELS", "LevelUnreachableError", "LevelUnsupportedError", "Mesh", "PluginLoadWarning", "env_var", "get_backend", "hookimpl",
    "hookspec", "list_backends", "load_failures", "register_backend",
    "register_kernel_local_effect",
    "register_interpret_rule", "reset", "scratch_live_in", "select_backend", "SelectedRef",
    # Backends whose cores cooperate (e.g. SparseCore barriers) schedule kernels themselves.
    "interpret_schedules", "register_interpret_schedule",
    # Per-core state a backend's rules keep (threaded through control flow and grid steps).
    "KernelState", "declare_kernel_state",
    # Race detection for interpret modes that simulate concurrency (vector clocks).
    "Access", "AccessLog", "Race", "RaceDetector", "RaceReport", "VectorClocks",
    "happens_before", "region", "regions_overlap",
    # The typed contract and the rule tables.
    "KernelArtifact", "KernelRequest", "LoweringRequest", "RuleConflictError", "RuleTable",
    "resolve_compiler_params",
    # The one-way import rule, for each package's tests.
    "private_core_imports",
    # Backend interpret modes (params objects that run kernels in their own simulator).
    "InterpretMode", "forced_interpret", "forced_interpret_mode", "set_forced_interpret",
    # The options the Mosaic backends' interpret modes share (each subclasses them).
    "LoggingMode", "SharedInterpretParams",
    # Where the devices of a multi-device kernel call meet in an interpret mode.
    "DeviceGroups",
    # An array read, written and added to through a ref's (flattened) transforms:
    # indexers, reshapes and bitcasts (``swap_view`` returns ``(old, new_array)``).
    "read_view", "swap_view", "add_view",
    # The same through an interpreter cell's view, keeping its initialised-elements mask.
    "read_cell", "write_cell",
    # Predicated branches (a device-dependent ``cond`` around remote operations runs on
    # every device, its writes masked): whether this device takes the branch, and a
    # scope whose writes are a remote sender's (masked by the sender, not the branch).
    "branch_taken", "unpredicated",
    # A jaxpr evaluated (or lowered) equation by equation, for interpreters and lowerings.
    "walk_jaxpr",
    # A backend's own primitive bound only for its effects (no results: a barrier, a DMA).
    "effect_primitive",
    # Refs (and their ref.at views) packed as primitive operands.
    "RefOperands", "ref_and_transforms", "ref_operands_end", "unpack_ref_operands",
    # Kernel jaxprs print a backend primitive's ref access as `a[i]`, as core's own.
    "RefAccess", "register_ref_access_printer", "transforms_of",
    # A host callback handed numpy operands (interpret modes simulating several devices).
    "host_call", "host_call_p",
    # Emulated devices: the device queries answer for emulated_device(); the kernels
    # prepared for it (compiled, planned) are listed by emulated_kernels().
    "EmulatedDevice", "EmulatedKernel", "EmulationError", "emulated_device",
    "emulated_kernels", "emulated_backend",
]
