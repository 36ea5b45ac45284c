"""Lowering rules of refs: ``ref[...]`` loads and stores (with ``pl.ds`` windows, strides
and masks) and ``jax.empty_ref``; the windows themselves are in ``windows``."""

from __future__ import annotations

from jaxlib.mlir.dialects import arith

from pallas_tpu._src import core_compat as cc
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.lowering import types as T
from pallas_tpu._src.lowering.common import (
    alloc_scratch,
    aval_in,
    aval_out,
    const,
    kind,
    materialize,
)
from pallas_tpu._src.lowering.engine import rule
from pallas_tpu._src.lowering.values import RefVal
from pallas_tpu._src.lowering.windows import apply_transforms, load_window, store_window


@rule(jc.empty_ref_p)
def _empty_ref(lctx, eqn):
    """``jax.empty_ref(ty, memory_space=...)`` in a kernel: a scratch buffer allocated
    where it is made, as a ``run_scoped`` one (VMEM by default, or a semaphore)."""
    ty = eqn.params["ty"]
    space = T.scratch_space(eqn.params.get("memory_space"))
    mt = T.memref_type(ty.shape, ty.dtype, space)
    m = alloc_scratch(mt, space)
    return RefVal(m, ty.dtype, space, (False,) * len(ty.shape))


@rule(jc.get_p)
def _get(lctx, eqn, ref, *idx):
    w = apply_transforms(ref, idx, eqn.params["tree"])
    return load_window(w, aval_out(eqn).dtype)


@rule(jc.swap_p)
def _swap(lctx, eqn, ref, val, *idx):
    w = apply_transforms(ref, idx, eqn.params["tree"])
    dtype = aval_in(eqn, 1).dtype
    v = materialize(val, aval_in(eqn, 1))
    old = None
    if eqn.outvars and lctx.is_used(eqn.outvars[0]):
        old = load_window(w, dtype)
    store_window(w, v, dtype)
    return old if old is not None else v


@rule(jc.addupdate_p)
def _addupdate(lctx, eqn, ref, val, *idx):
    w = apply_transforms(ref, idx, eqn.params["tree"])
    dtype = aval_in(eqn, 1).dtype
    v = materialize(val, aval_in(eqn, 1))
    old = load_window(w, dtype)
    new = arith.addf(old, v) if kind(dtype) == "f" else arith.addi(old, v)
    store_window(w, new, dtype)
    return []


@rule(cc.load_p)
def _masked_load(lctx, eqn, ref, *rest):
    tree = eqn.params["tree"]
    n = tree.num_leaves
    idx, extra = rest[:n], list(rest[n:])
    w = apply_transforms(ref, idx, tree)
    out = aval_out(eqn)
    v = load_window(w, out.dtype)
    if eqn.params["has_mask"]:
        mask = materialize(extra.pop(0), aval_in(eqn, 1 + n))
        other = (materialize(extra.pop(0), aval_in(eqn, 2 + n)) if eqn.params["has_other"]
                 else const(out.shape, out.dtype, 0))
        v = arith.select(mask, v, other)
    return v


@rule(cc.swap_p)
def _masked_swap(lctx, eqn, ref, val, *rest):
    tree = eqn.params["tree"]
    n = tree.num_leaves
    idx, extra = rest[:n], list(rest[n:])
    w = apply_transforms(ref, idx, tree)
    dtype = aval_in(eqn, 1).dtype
    v = materialize(val, aval_in(eqn, 1))
    old = None
    if eqn.outvars and lctx.is_used(eqn.outvars[0]):
        old = load_window(w, dtype)
    mask = materialize(extra[0], aval_in(eqn, 2 + n)) if eqn.params["has_mask"] else None
    store_window(w, v, dtype, mask=mask)
    if old is None:
        return v
    # A partial exchange: masked-off lanes hand ``val`` back (upstream's semantics).
    return old if mask is None else arith.select(mask, old, v)
