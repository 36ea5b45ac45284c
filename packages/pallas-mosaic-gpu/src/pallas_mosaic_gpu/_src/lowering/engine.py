"""Walks a kernel jaxpr and emits Mosaic GPU code through the per-primitive rules.

Values in the environment are ``FragmentedArray`` (arrays of rank >= 1, held in the
registers of one warpgroup), scalar ``ir.Value`` (rank 0, uniform across the
warpgroup), :class:`RefVal` (a memref in SMEM or GMEM) or :class:`Lit` (a literal,
materialised by the rule that uses it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.extend.core as jax_core
import numpy as np
from jaxlib.mlir import ir

from pallas import plugins
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.primitives.barriers import barrier_arrive_p, barrier_wait_p
from pallas_mosaic_gpu._src.primitives.copies import copy_gmem_to_smem_p
from pallas_mosaic_gpu._src.primitives.hints import commit_tmem_p, wait_load_tmem_p

BACKEND = "mosaic_gpu"

# The Mosaic GPU lowering table, keyed by primitive object (see pallas.plugins.RuleTable).
RULES = plugins.RuleTable(
    "mosaic_gpu lowering", "rule(lctx, eqn, *invals) -> value or list of values")


class MosaicGpuLoweringError(NotImplementedError):
    """A kernel uses something the ``mosaic_gpu`` backend cannot lower (it names the
    primitive, the kernel and the source line); the kernel still runs with
    ``interpret=True``."""


class KernelError(ValueError):
    """Bad input found while lowering, which Mosaic GPU cannot take (a block TMA cannot
    copy, an operand layout wgmma cannot read, an instruction the target lacks): the
    message names the argument and what would be valid. Raised at trace time, as is."""


def rule(*prims):
    """Registers the decorated function as the Mosaic GPU lowering rule of ``prims``."""

    return RULES.register(*prims, owner="pallas_mosaic_gpu")


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


def lower_jaxpr(lctx: LoweringContext, jaxpr, consts, args) -> list:
    """Emits ``jaxpr`` at the current insertion point; returns its outputs."""
    env: dict[Any, Any] = {}

    def read(v):
        if isinstance(v, jax_core.Literal):
            return Lit(v.val, v.aval)
        return env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c if isinstance(c, (ir.Value, RefVal, Lit)) else Lit(np.asarray(c), v.aval)
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    for eqn in jaxpr.eqns:
        lctx.used_vars.update(v for v in eqn.invars if not isinstance(v, jax_core.Literal))
        if eqn.primitive.name == "mgpu_layout_cast" and \
                not isinstance(eqn.invars[0], jax_core.Literal):
            lctx.layout_hints[eqn.invars[0]] = eqn.params["new_layout"]
    lctx.used_vars.update(v for v in jaxpr.outvars if not isinstance(v, jax_core.Literal))
    lctx.synced = False  # a region (a loop body) may run after any access
    for eqn in jaxpr.eqns:
        r = RULES.get(eqn.primitive)
        if r is None:
            why = RULES.unsupported_reason(eqn.primitive)
            raise MosaicGpuLoweringError(
                f"pallas-mosaic-gpu (backend '{BACKEND}') cannot lower the primitive "
                f"'{eqn.primitive.name}' to Mosaic GPU yet ({kernel_desc(lctx)}, at "
                f"{jc.source_info_summary(eqn)})" + (f": {why}" if why else "")
                + ". It runs with interpret=True.")
        invals = [read(v) for v in eqn.invars]
        try:
            if getattr(r, "__module__", "").endswith(".rules_arith"):
                invals = _stretched(lctx, eqn, invals)
            outs = r(lctx, eqn, *invals)
        except (MosaicGpuLoweringError, KernelError):
            raise
        except (NotImplementedError, ValueError, TypeError, IndexError) as e:
            raise MosaicGpuLoweringError(
                f"pallas-mosaic-gpu (backend '{BACKEND}') failed to lower the primitive "
                f"'{eqn.primitive.name}' in {kernel_desc(lctx)} (at "
                f"{jc.source_info_summary(eqn)}): {type(e).__name__}: {e}") from e
        lctx.uses.add(eqn.primitive.name)
        if not keeps_sync(eqn):
            lctx.synced = False
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]


# Primitives whose rules access no memory through the generic proxy once the scope is
# synchronised: a TMA load (one thread issues it), a barrier wait or arrival; and the
# TMEM waits, which end synchronising the scope themselves (their rules set ``synced``).
SYNC_KEEPING = frozenset({copy_gmem_to_smem_p, barrier_wait_p, barrier_arrive_p,
                          commit_tmem_p, wait_load_tmem_p})


def keeps_sync(eqn) -> bool:
    """Whether lowering ``eqn`` keeps ``LoweringContext.synced``: the primitives of
    ``SYNC_KEEPING``, and scalar arithmetic (no effects, no sub-jaxprs, every operand and
    result a scalar: index math, which touches no memory)."""
    if eqn.primitive in SYNC_KEEPING:
        return True
    if eqn.effects or any(isinstance(x, (jax_core.Jaxpr, jax_core.ClosedJaxpr))
                          for v in eqn.params.values()
                          for x in (v if isinstance(v, (tuple, list)) else (v,))):
        return False
    return all(type(v.aval) is jc.ShapedArray and v.aval.shape == ()
               for v in (*eqn.invars, *eqn.outvars))


def _stretched(lctx, eqn, invals):
    """Operands of an elementwise eqn with size-1 dims where the output has more (lax
    allows that implicitly), broadcast when they are arrays read from a ref."""
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import fragmented_array as fa

    from pallas_mosaic_gpu._src.lowering.spill import stretch

    shape = tuple(eqn.outvars[0].aval.shape)
    out = list(invals)
    for i, (x, v) in enumerate(zip(invals, eqn.invars)):
        a = v.aval
        if (isinstance(x, mgpu.FragmentedArray) and a.shape and tuple(a.shape) != shape
                and not isinstance(x.layout, fa.WGSplatFragLayout)):
            out[i] = stretch(lctx, eqn, i, x, a, shape)
    return out
