"""The lowering's data model, below every other module of it: the values a kernel holds
(:class:`Lit`, :class:`RefVal`), the per-kernel :class:`LoweringContext`, and the errors
that name the primitive, the kernel and the argument.

Layers of the lowering (each imports only those before it): this module and
:mod:`values` (MLIR types, constants, warpgroup arrays); the emission helpers
(:mod:`small`, :mod:`register_layouts`, :mod:`smem`, :mod:`tmem`, :mod:`threads`,
:mod:`elements`, :mod:`views`, :mod:`spill`, :mod:`scoped`, :mod:`mma`,
:mod:`collectives`, ...); :mod:`engine` (the rule table and the jaxpr walker); the rule
modules (``rules_*``, :mod:`warps`, :mod:`unsupported`), which import helpers and the
engine but never each other; and :mod:`kernel`, the driver.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jaxlib.mlir import ir

BACKEND = "mosaic_gpu"


class MosaicGpuLoweringError(NotImplementedError):
    """A kernel uses something the ``mosaic_gpu`` backend cannot lower (it names the
    primitive, the kernel and the source line); the kernel still runs with
    ``interpret=True``."""


class KernelError(ValueError):
    """Bad input found while lowering, which Mosaic GPU cannot take (a block TMA cannot
    copy, an operand layout wgmma cannot read, an instruction the target lacks): the
    message names the argument and what would be valid. Raised at trace time, as is."""


@dataclasses.dataclass(frozen=True)
class Lit:
    """A literal (static) value and its aval."""

    val: Any
    aval: Any


@dataclasses.dataclass(frozen=True)
class RefVal:
    """A ref in the kernel: a memref in SMEM or GMEM, and the dtype it holds."""

    memref: ir.Value
    dtype: np.dtype
    space: str  # "smem" or "gmem"
    # SMEM layout transforms (see smem.py): the kernel sees ``logical`` (None: the
    # memref's shape), stored tiled by ``tiling`` over its minor dims and swizzled.
    tiling: tuple[int, ...] | None = None
    swizzle: int | None = None
    logical: tuple[int, ...] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        if self.logical is not None:
            return self.logical
        return tuple(ir.MemRefType(self.memref.type).shape)

    @property
    def transformed(self) -> bool:
        return self.tiling is not None or self.swizzle is not None


@dataclasses.dataclass
class LoweringContext:
    """Per-kernel state: the launch context, grid sizes and the current program ids."""

    launch_ctx: Any  # mgpu.LaunchContext
    grid: tuple[int, ...]
    program_ids: list  # one i32 ir.Value per grid axis
    name: str
    approx_math: bool = False
    reduction_scratch: Any = None  # an SMEM memref for cross-warp reductions
    # id(eqn) -> SMEM memref (or None: read in place) per operand read across threads
    spill_buffers: dict = dataclasses.field(default_factory=dict)
    # id(value) -> (value, memref view) for values read from refs
    loaded_from: dict = dataclasses.field(default_factory=dict)
    uses: set = dataclasses.field(default_factory=set)
    # (id(run_scoped eqn), j) -> (scoped.Planned, its SMEM memref or mgpu.BarrierRef)
    scoped: dict = dataclasses.field(default_factory=dict)
    # id(run_scoped eqn) -> scoped_stack.Sync: scopes reusing bytes sync at their entry
    scope_syncs: dict = dataclasses.field(default_factory=dict)
    target: str | None = None  # "sm_90a"/"sm_100a" when known (compile level, env var)
    axis_names: tuple = ()  # the grid's axis names (a mesh kernel's axes)
    used_vars: set = dataclasses.field(default_factory=set)
    # "lane" or "warpgroup" (CompilerParams.lowering_semantics, see kernel.semantics_of)
    semantics: str = "lane"
    # var -> the plgpu layout a ``layout_cast`` of it asks for (see rules_layout.py)
    layout_hints: dict = dataclasses.field(default_factory=dict)
    # "warpgroup", or "warp" inside ``pl.core_map(plgpu.WarpMesh(...))`` (see warps.py)
    scope: str = "warpgroup"
    inner_axes: dict = dataclasses.field(default_factory=dict)  # WarpMesh axis -> i32
    cluster_names: tuple = ()  # a mesh's cluster axes; axis j is CUDA dimension j
    # (axis names, sizes) of the enclosing shard_map's device mesh (None: one device)
    jax_mesh: tuple | None = None
    sems: dict = dataclasses.field(default_factory=dict)  # semaphore key -> RefVal
    # Whether the threads of the current scope have synchronised since their last
    # possible memory access in straight-line code (see :func:`keeps_sync`): a TMA load
    # or a barrier arrival then needs no synchronisation of its own.
    synced: bool = False

    def is_used(self, var) -> bool:
        return var in self.used_vars


def kernel_desc(lctx_or_name) -> str:
    """``kernel <name>``, and its lowering semantics when not the default (Lane)."""
    name = getattr(lctx_or_name, "name", lctx_or_name)
    if getattr(lctx_or_name, "semantics", "lane") == "warpgroup":
        return f"kernel {name} (LoweringSemantics.Warpgroup)"
    return f"kernel {name}"


def unsupported(lctx_or_name, what: str) -> MosaicGpuLoweringError:
    return MosaicGpuLoweringError(
        f"pallas-mosaic-gpu (backend '{BACKEND}') cannot lower {what} in "
        f"{kernel_desc(lctx_or_name)} yet. It runs with interpret=True.")
