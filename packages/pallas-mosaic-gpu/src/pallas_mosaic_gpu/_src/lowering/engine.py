"""Walks a kernel jaxpr and emits Mosaic GPU code through the per-primitive rules.

Values in the environment are ``FragmentedArray`` (arrays of rank >= 1, held in the
registers of one warpgroup), scalar ``ir.Value`` (rank 0, uniform across the
warpgroup), :class:`RefVal` (a memref in SMEM or GMEM) or :class:`Lit` (a literal,
materialised by the rule that uses it). The engine owns the rule table
(:data:`RULES`); the rule modules register into it and import it, never it them.
"""

from __future__ import annotations

import jax.extend.core as jax_core
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jaxlib.mlir import ir

from pallas import plugins
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.lowering.context import (
    BACKEND,
    KernelError,
    Lit,
    LoweringContext,
    MosaicGpuLoweringError,
    RefVal,
    kernel_desc,
    unsupported,
)
from pallas_mosaic_gpu._src.lowering.spill import stretch
from pallas_mosaic_gpu._src.primitives.barriers import barrier_arrive_p, barrier_wait_p
from pallas_mosaic_gpu._src.primitives.copies import copy_gmem_to_smem_p
from pallas_mosaic_gpu._src.primitives.hints import commit_tmem_p, wait_load_tmem_p

__all__ = ["BACKEND", "RULES", "KernelError", "Lit", "LoweringContext",
           "MosaicGpuLoweringError", "RefVal", "is_elementwise", "keeps_sync", "kernel_desc",
           "lower_jaxpr", "rule", "unsupported"]

# The Mosaic GPU lowering table, keyed by primitive object (see pallas.plugins.RuleTable).
RULES = plugins.RuleTable(
    "mosaic_gpu lowering", "rule(lctx, eqn, *invals) -> value or list of values")


def rule(*prims):
    """Registers the decorated function as the Mosaic GPU lowering rule of ``prims``."""

    return RULES.register(*prims, owner="pallas_mosaic_gpu")


def lower_jaxpr(lctx: LoweringContext, jaxpr, consts, args) -> list:
    """Emits ``jaxpr`` at the current insertion point; returns its outputs."""
    consts = [c if isinstance(c, (ir.Value, RefVal, Lit)) else Lit(np.asarray(c), v.aval)
              for v, c in zip(jaxpr.constvars, consts)]
    for eqn in jaxpr.eqns:
        lctx.used_vars.update(v for v in eqn.invars if not isinstance(v, jax_core.Literal))
        if eqn.primitive.name == "mgpu_layout_cast" and \
                not isinstance(eqn.invars[0], jax_core.Literal):
            lctx.layout_hints[eqn.invars[0]] = eqn.params["new_layout"]
    lctx.used_vars.update(v for v in jaxpr.outvars if not isinstance(v, jax_core.Literal))
    lctx.synced = False  # a region (a loop body) may run after any access
    return plugins.walk_jaxpr(jaxpr, consts, args,
                              lambda eqn, invals: _lower_eqn(lctx, eqn, invals),
                              literal=lambda v: Lit(v.val, v.aval))


def _lower_eqn(lctx: LoweringContext, eqn, invals: list) -> list:
    """Emits one equation by its rule; returns its results."""
    r = RULES.require(eqn.primitive, lambda why: MosaicGpuLoweringError(
        f"pallas-mosaic-gpu (backend '{BACKEND}') cannot lower the primitive "
        f"'{eqn.primitive.name}' to Mosaic GPU yet ({kernel_desc(lctx)}, at "
        f"{jc.source_info_summary(eqn)})" + (f": {why}" if why else "")
        + ". It runs with interpret=True."))
    try:
        if is_elementwise(eqn.primitive):
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
    return outs if eqn.primitive.multiple_results else [outs]


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


def is_elementwise(prim) -> bool:
    """Whether ``prim`` lowers by an elementwise rule (``rules_arith``), whose operands
    with size-1 dims stretch to the output's shape (:func:`_stretched`)."""
    r = RULES.get(prim)
    return r is not None and getattr(r, "__module__", "").endswith(".rules_arith")


def _stretched(lctx, eqn, invals):
    """Operands of an elementwise eqn with size-1 dims where the output has more (lax
    allows that implicitly), broadcast when they are arrays read from a ref."""
    shape = tuple(eqn.outvars[0].aval.shape)
    out = list(invals)
    for i, (x, v) in enumerate(zip(invals, eqn.invars)):
        a = v.aval
        if (isinstance(x, mgpu.FragmentedArray) and a.shape and tuple(a.shape) != shape
                and not isinstance(x.layout, fa.WGSplatFragLayout)):
            out[i] = stretch(lctx, eqn, i, x, a, shape)
    return out
