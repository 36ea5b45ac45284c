"""Atomic read-modify-write and compare-and-swap on refs, as generic primitives.

Upstream has these only in ``jax.experimental.pallas.triton``; here they are part of the
core so that a kernel (and a conformance case) can use them on any backend that lowers
them. Each returns the values the ref held before the operation. The interpreter, which
runs grid programs one after another, gives the exact result that concurrent programs
contending on the same elements produce on hardware (for ``add`` up to the order of
floating-point additions).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.interpreter import views
from pallas._src.interpreter.rules import register_interpret_rule
from pallas._src.primitives.pretty import RefAccess, register_ref_access_printer, transforms_of

atomic_rmw_p = jc.Primitive("atomic_rmw")
atomic_cas_p = jc.Primitive("atomic_cas")

ATOMIC_OPS = ("add", "and", "max", "min", "or", "xchg", "xor")

# Element types no GPU atomic instruction supports (as upstream).
_UNSUPPORTED_DTYPES = frozenset(jnp.dtype(d) for d in ("bool", "int8", "int16", "uint8",
                                                       "uint16", "bfloat16"))
_BITWISE = ("and", "or", "xor")


def _ref_and_transforms(ref, idx):
    if isinstance(ref, jc.TransformedRef):
        base, transforms = ref.ref, tuple(ref.transforms)
    else:
        base, transforms = ref, ()
    if idx is not None and idx != ():
        transforms = tuple(jc.TransformedRef(base, transforms).at[idx].transforms)
    return base, transforms


def _operand(x, aval, what: str, name: str):
    """``x`` broadcast to the view's shape; only weakly typed values are converted."""
    x = jnp.asarray(x)
    if x.dtype != aval.dtype:
        if not jax.typeof(x).weak_type:
            raise TypeError(f"{name}: {what} has dtype {x.dtype} but the ref holds "
                            f"{aval.dtype}; convert it first.")
        x = x.astype(aval.dtype)
    return jnp.broadcast_to(x, aval.shape)


def _check_dtype(op: str, dtype) -> None:
    dtype = jnp.dtype(dtype)
    if dtype in _UNSUPPORTED_DTYPES or (dtype == jnp.float16 and op != "add"):
        raise ValueError(f"atomic_{op} does not support {dtype} refs (as upstream): use "
                         "32- or 64-bit elements.")
    if op in _BITWISE and not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"atomic_{op} needs an integer ref, not {dtype}.")


def atomic_rmw(op: str, x_ref_or_view, idx, val, *, mask: Any | None = None) -> jax.Array:
    """Atomically combines ``val`` into ``x_ref_or_view.at[idx]`` with ``op`` where ``mask``.

    Returns the previous values (masked-out elements: the current, unchanged values).
    """
    if op not in ATOMIC_OPS:
        raise ValueError(f"unknown atomic operation {op!r}; one of {ATOMIC_OPS}")
    base, transforms = _ref_and_transforms(x_ref_or_view, idx)
    aval = jc.state_types.transform_type(list(transforms), jax.typeof(base).inner_aval)
    _check_dtype(op, aval.dtype)
    val = _operand(val, aval, "val", f"atomic_{op}")
    flat, tree = jax.tree_util.tree_flatten(transforms)
    extra = []
    if mask is not None:
        extra.append(jnp.broadcast_to(jnp.asarray(mask, jnp.bool_), aval.shape))
    return atomic_rmw_p.bind(base, val, *flat, *extra, op=op, tree=tree,
                             has_mask=mask is not None)


def atomic_cas(ref, cmp, val) -> jax.Array:
    """Where ``ref`` (a ref or ``ref.at[...]`` view) equals ``cmp``, writes ``val``.

    Returns the previous values; a lock is taken when the result equals ``cmp``.
    """
    base, transforms = _ref_and_transforms(ref, ())
    aval = jc.state_types.transform_type(list(transforms), jax.typeof(base).inner_aval)
    _check_dtype("cas", aval.dtype)
    cmp = _operand(cmp, aval, "cmp", "atomic_cas")
    val = _operand(val, aval, "val", "atomic_cas")
    flat, tree = jax.tree_util.tree_flatten(transforms)
    return atomic_cas_p.bind(base, cmp, val, *flat, tree=tree)


def _rmw_abstract_eval(ref_aval, val_aval, *args, op, tree, has_mask):
    transforms = jax.tree_util.tree_unflatten(tree, args[: tree.num_leaves])
    out = jc.state_types.transform_type(list(transforms), ref_aval.inner_aval)
    return out, {jc.WriteEffect(0)}


def _cas_abstract_eval(ref_aval, cmp_aval, val_aval, *args, tree):
    transforms = jax.tree_util.tree_unflatten(tree, args[: tree.num_leaves])
    out = jc.state_types.transform_type(list(transforms), ref_aval.inner_aval)
    return out, {jc.WriteEffect(0)}


atomic_rmw_p.def_effectful_abstract_eval(_rmw_abstract_eval)
atomic_cas_p.def_effectful_abstract_eval(_cas_abstract_eval)


def _rmw_access(eqn) -> RefAccess:
    transforms, end = transforms_of(eqn, 2, eqn.params["tree"])
    mask = [("mask", eqn.invars[end])] if eqn.params["has_mask"] else []
    return RefAccess(eqn.invars[0], transforms, [eqn.invars[1]], mask)


def _cas_access(eqn) -> RefAccess:
    transforms, _ = transforms_of(eqn, 3, eqn.params["tree"])
    return RefAccess(eqn.invars[0], transforms, eqn.invars[1:3])


# `b = atomic_rmw[op=add] a[:4] v mask=m`, `b = atomic_cas a[i] cmp v`
register_ref_access_printer(atomic_rmw_p, "op", _rmw_access, hidden=("tree", "has_mask"))
register_ref_access_printer(atomic_cas_p, "op", _cas_access)

_COMBINE = {
    "add": lambda a, b: a + b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "max": jnp.maximum,
    "min": jnp.minimum,
    "xchg": lambda a, b: b,
}


def _read_modify_write(ctx, cell, idx, tree, combine, mask):
    """Reads the view, writes ``combine(old)`` where ``mask``; returns the old values."""
    old = views.read_flat(cell.value, idx, tree)
    if cell.init is not None and ctx.check_uninitialized:
        init = views.read_flat(cell.init, idx, tree)
        read = init if mask is None else jnp.logical_or(init, jnp.logical_not(mask))
        ctx.report_read(jnp.all(read), cell,
                        f"atomic on uninitialised memory in {cell.origin}")
    new = combine(old)
    if mask is not None:
        new = jnp.where(mask, new, old)
    _, cell.value = views.swap_flat(cell.value, new, idx, tree)
    if cell.init is not None:
        cur = views.read_flat(cell.init, idx, tree)
        now = jnp.ones_like(cur) if mask is None else jnp.logical_or(cur, mask)
        _, cell.init = views.swap_flat(cell.init, now, idx, tree)
    return old


@register_interpret_rule(atomic_rmw_p)
def _rmw_rule(ctx, eqn, invals):
    cell, val, *rest = invals
    tree = eqn.params["tree"]
    idx, extra = rest[: tree.num_leaves], rest[tree.num_leaves:]
    mask = extra[0] if eqn.params["has_mask"] else None
    combine = _COMBINE[eqn.params["op"]]
    return [_read_modify_write(ctx, cell, idx, tree, lambda old: combine(old, val), mask)]


@register_interpret_rule(atomic_cas_p)
def _cas_rule(ctx, eqn, invals):
    cell, cmp, val, *idx = invals
    tree = eqn.params["tree"]
    return [_read_modify_write(ctx, cell, idx, tree,
                               lambda old: jnp.where(old == cmp, val, old), None)]
