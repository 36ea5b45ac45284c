"""SMEM layouts inferred under ``LoweringSemantics.Warpgroup``: the one place where the
two semantics mean different programs.

Under Lane semantics a buffer ``plgpu.wgmma`` reads must be declared tiled and swizzled
(``TilingTransform((8, S)), SwizzleTransform(B)``); one that is not is an error. Under
Warpgroup semantics upstream infers SMEM layouts from their uses, so kernels leave the
transforms out (``ragged_dot_mgpu``'s pipeline buffers have none). Here, an SMEM buffer
(``pl.run_scoped`` or kernel scratch) declared without transforms that reaches a
``wgmma`` operand, through sub-jaxprs, loops, branches and ``ref.at[...]`` views, gets
the widest swizzle its minor dimension allows and the matching tiling. Its values do
not change: TMA copies tile and swizzle it, register loads and stores read it through
the transforms, as for a declared layout.
"""

from __future__ import annotations

import dataclasses

import jax.extend.core as jex
import numpy as np

from pallas import plugins
from pallas_mosaic_gpu._src.primitives.mma import wgmma_p
from pallas_mosaic_gpu._src.transforms import SwizzleTransform, TilingTransform

SWIZZLES = (128, 64, 32)


def _sub_args(eqn, sub) -> list | None:
    """The outer operands bound to ``sub``'s invars (None where an invar is no operand
    of ``eqn``, e.g. a ``run_scoped`` buffer)."""
    outer, inner = list(eqn.invars), list(sub.invars)
    name = eqn.primitive.name
    if name == "while":
        nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        carry = outer[nc + nb:]
        if sub is getattr(eqn.params["cond_jaxpr"], "jaxpr", None):
            return outer[:nc] + carry
        return outer[nc:nc + nb] + carry
    if name == "cond":
        outer = outer[1:]
    return (outer + [None] * len(inner))[:len(inner)]


def wgmma_buffers(jaxpr) -> tuple[set, set]:
    """(top-level invars of ``jaxpr``, ``(id(run_scoped eqn), k)`` allocations) that
    reach a ``wgmma`` SMEM operand (a or b)."""
    allocs: set = set()

    def walk(j) -> set:
        """The invars of ``j`` that reach a wgmma operand."""
        hits: set = set()
        for eqn in j.eqns:
            if eqn.primitive is wgmma_p:
                spec = eqn.params["refs"]
                for entry in spec[1:3]:
                    if entry is not None:
                        hits.add(eqn.invars[entry[0]])
            for sub in jex.jaxprs_in_params(eqn.params):
                sub = getattr(sub, "jaxpr", sub)
                inner = walk(sub)
                for k, (v, o) in enumerate(zip(sub.invars, _sub_args(eqn, sub))):
                    if v not in inner:
                        continue
                    if o is not None:
                        hits.add(o)
                    elif eqn.primitive is plugins.run_scoped_p:
                        allocs.add((id(eqn), k - len(eqn.invars)))
        return hits

    top = walk(jaxpr) & set(jaxpr.invars)
    return top, allocs


def wgmma_transforms(t):
    """``t`` (an SMEM buffer type declared without transforms) with the tiling and
    swizzle a ``wgmma`` operand needs; ``t`` itself when its minor dimension allows no
    swizzle (``wgmma`` then says what is missing)."""
    space = getattr(t, "memory_space", None)
    if tuple(getattr(t, "transforms", ()) or ()) or \
            str(getattr(space, "name", space)).lower() != "smem":
        return t
    shape = tuple(getattr(t, "shape", ()))
    if len(shape) < 2 or not hasattr(t, "dtype"):
        return t
    itemsize = np.dtype(t.dtype).itemsize
    row = shape[-1] * itemsize
    swizzle = next((s for s in SWIZZLES if row % s == 0), None)
    if swizzle is None or shape[-2] % 8:
        return t
    return dataclasses.replace(t, transforms=(TilingTransform((8, swizzle // itemsize)),
                                              SwizzleTransform(swizzle)))
