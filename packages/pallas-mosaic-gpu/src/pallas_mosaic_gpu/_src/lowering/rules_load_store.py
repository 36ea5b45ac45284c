"""Lowering rules of ``pl.load``, ``pl.store`` and ``pl.swap`` (the primitives
``masked_load`` and ``masked_swap``).

Without a mask they are ``ref[...]`` reads and writes (the ``get``/``swap`` rules of
rules_refs.py; ``other=`` alone changes nothing). With one, every element is accessed on
its own, guarded by its mask bit (elements.py): masked-off elements are neither read
(they are ``other``, or zero) nor written, and a masked swap returns the old contents
where the mask holds and the value given where it does not, as the interpreter does.
Upstream's Mosaic GPU lowering (JAX 0.10.2) has neither primitive.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.mosaic import gpu as mgpu

import pallas.plugins as pp
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.lowering import elements
from pallas_mosaic_gpu._src.lowering.engine import RULES, RefVal, rule
from pallas_mosaic_gpu._src.lowering.views import view


def _window(ref, flat, tree, what: str):
    """The memref view a masked access reads or writes: SMEM or GMEM refs without layout
    transforms."""
    if not isinstance(ref, RefVal):
        raise NotImplementedError(
            f"{what} on a {type(ref).__name__} (masks apply to SMEM and GMEM refs; read "
            "the whole value and use jnp.where)")
    if ref.transformed:
        raise NotImplementedError(
            f"{what} on an SMEM ref with layout transforms (tiling={ref.tiling}, "
            f"swizzle={ref.swizzle}); masks apply to untransformed refs")
    return view(ref, flat, tree)


def _bool(shape):
    return jax.ShapeDtypeStruct(tuple(shape), jnp.bool_)


@rule(pp.load_p)
def _load(lctx, eqn, ref, *rest):
    p = eqn.params
    n_extra = int(p["has_mask"]) + int(p["has_other"])
    flat, extra = list(rest[:len(rest) - n_extra]), list(rest[len(rest) - n_extra:])
    if not p["has_mask"]:
        return RULES[jc.get_p](lctx, eqn, ref, *flat)
    aval = eqn.outvars[0].aval
    m = _window(ref, flat, p["tree"], "pl.load with mask=")
    other = extra[1] if p["has_other"] else None
    return elements.load(m, aval, extra[0], _bool(aval.shape), other)


@rule(pp.swap_p)
def _swap(lctx, eqn, ref, value, *rest):
    p = eqn.params
    if not p["has_mask"]:
        return RULES[jc.swap_p](lctx, eqn, ref, value, *rest)
    flat, mask = list(rest[:-1]), rest[-1]
    aval = eqn.invars[1].aval
    m = _window(ref, flat, p["tree"], "pl.store/pl.swap with mask=")
    old = None
    if lctx.is_used(eqn.outvars[0]):
        # Each thread reads and then writes the same elements: no barrier in between.
        old = elements.load(m, aval, mask, _bool(aval.shape), other=value)
    elements.store(m, value, aval, mask, _bool(aval.shape))
    if ref.space == "smem":
        mgpu.warpgroup_barrier()  # later reads of the ref may be by other threads
    return old
