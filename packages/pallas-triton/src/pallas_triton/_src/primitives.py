"""The Triton backend's own primitives: atomics, ``debug_barrier``, inline assembly.

Each primitive is defined here with its abstract evaluation and its interpreter rule
(so kernels using it still run with ``interpret=True``); its Triton lowering is in
:mod:`.lowering`, under the same primitive name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from pallas import plugins

# pallas-core does not export its kernel debug effect publicly yet (see README).
from pallas._src.primitives.debug import kernel_debug_effect
from pallas_triton._src import jax_compat as jc

# -- atomics -----------------------------------------------------------------------------

atomic_rmw_p = jax.extend.core.Primitive("triton_atomic_rmw")
atomic_cas_p = jax.extend.core.Primitive("triton_atomic_cas")

ATOMIC_OPS = ("add", "and", "max", "min", "or", "xchg", "xor")


def _base_and_transforms(ref, idx):
    if isinstance(ref, jc.TransformedRef):
        base, transforms = ref.ref, tuple(ref.transforms)
    else:
        base, transforms = ref, ()
    if idx is not None and idx != ():
        transforms = tuple(jc.TransformedRef(base, transforms).at[idx].transforms)
    return base, transforms


def _atomic(op: str, x_ref_or_view, idx, val, mask):
    base, transforms = _base_and_transforms(x_ref_or_view, idx)
    aval = jc.transform_type(list(transforms), jax.typeof(base).inner_aval)
    val = jnp.broadcast_to(jnp.asarray(val, aval.dtype), aval.shape)
    flat, tree = jax.tree_util.tree_flatten(transforms)
    extra = []
    if mask is not None:
        extra.append(jnp.broadcast_to(jnp.asarray(mask, jnp.bool_), aval.shape))
    return atomic_rmw_p.bind(base, val, *flat, *extra, op=op, tree=tree,
                             has_mask=mask is not None)


def _make_atomic(op: str):
    def atomic(x_ref_or_view, idx, val, *, mask: Any | None = None):
        return _atomic(op, x_ref_or_view, idx, val, mask)

    atomic.__name__ = f"atomic_{op}"
    atomic.__qualname__ = atomic.__name__
    atomic.__doc__ = (
        f"Atomically applies ``{op}`` of ``val`` to ``x_ref_or_view.at[idx]`` where "
        f"``mask`` holds; returns the previous values.")
    return atomic


atomic_add = _make_atomic("add")
atomic_and = _make_atomic("and")
atomic_max = _make_atomic("max")
atomic_min = _make_atomic("min")
atomic_or = _make_atomic("or")
atomic_xchg = _make_atomic("xchg")
atomic_xor = _make_atomic("xor")


def atomic_cas(ref, cmp, val):
    """Where ``ref`` equals ``cmp``, writes ``val``; returns the previous values."""
    base, transforms = _base_and_transforms(ref, ())
    aval = jc.transform_type(list(transforms), jax.typeof(base).inner_aval)
    cmp = jnp.broadcast_to(jnp.asarray(cmp, aval.dtype), aval.shape)
    val = jnp.broadcast_to(jnp.asarray(val, aval.dtype), aval.shape)
    flat, tree = jax.tree_util.tree_flatten(transforms)
    return atomic_cas_p.bind(base, cmp, val, *flat, tree=tree)


def _rmw_abstract_eval(ref_aval, val_aval, *args, op, tree, has_mask):
    transforms = jax.tree_util.tree_unflatten(tree, args[: tree.num_leaves])
    out = jc.transform_type(list(transforms), ref_aval.inner_aval)
    return out, {jc.WriteEffect(0)}


def _cas_abstract_eval(ref_aval, cmp_aval, val_aval, *args, tree):
    transforms = jax.tree_util.tree_unflatten(tree, args[: tree.num_leaves])
    out = jc.transform_type(list(transforms), ref_aval.inner_aval)
    return out, {jc.WriteEffect(0)}


atomic_rmw_p.def_effectful_abstract_eval(_rmw_abstract_eval)
atomic_cas_p.def_effectful_abstract_eval(_cas_abstract_eval)

_COMBINE = {
    "add": lambda a, b: a + b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "max": jnp.maximum,
    "min": jnp.minimum,
    "xchg": lambda a, b: b,
}


def _rmw_rule(ctx, eqn, invals):
    cell, val, *rest = invals
    tree = eqn.params["tree"]
    idx, extra = rest[: tree.num_leaves], rest[tree.num_leaves:]
    old = jc.get_discharge(cell.value, idx, tree)
    new = _COMBINE[eqn.params["op"]](old, val)
    if eqn.params["has_mask"]:
        new = jnp.where(extra[0], new, old)
    _, cell.value = jc.swap_discharge(cell.value, new, idx, tree)
    return [old]


def _cas_rule(ctx, eqn, invals):
    cell, cmp, val, *idx = invals
    tree = eqn.params["tree"]
    old = jc.get_discharge(cell.value, idx, tree)
    new = jnp.where(old == cmp, val, old)
    _, cell.value = jc.swap_discharge(cell.value, new, idx, tree)
    return [old]


# -- debug_barrier ------------------------------------------------------------------------

debug_barrier_p = jax.extend.core.Primitive("debug_barrier")
debug_barrier_p.multiple_results = True


def debug_barrier() -> None:
    """Synchronises the threads of a program (``tl.debug_barrier``)."""
    debug_barrier_p.bind()


debug_barrier_p.def_effectful_abstract_eval(lambda: ([], {kernel_debug_effect}))


def _debug_barrier_rule(ctx, eqn, invals):
    return []


# -- inline assembly --------------------------------------------------------------------

elementwise_inline_asm_p = jax.extend.core.Primitive("triton_elementwise_inline_asm")
elementwise_inline_asm_p.multiple_results = True


def elementwise_inline_asm(asm: str, *, args: Sequence[jax.Array], constraints: str,
                           pack: int,
                           result_shape_dtypes: Sequence[jax.ShapeDtypeStruct]
                           ) -> Sequence[jax.Array]:
    """Inline PTX applied elementwise (``tl.inline_asm_elementwise``)."""
    return elementwise_inline_asm_p.bind(
        *args, asm=asm, constraints=constraints, pack=pack,
        result_shape_dtypes=tuple(jax.ShapeDtypeStruct(r.shape, r.dtype)
                                  for r in result_shape_dtypes))


elementwise_inline_asm_p.def_abstract_eval(
    lambda *avals, asm, constraints, pack, result_shape_dtypes: [
        jax.core.ShapedArray(r.shape, r.dtype) for r in result_shape_dtypes])


def _inline_asm_rule(ctx, eqn, invals):
    raise NotImplementedError(
        "pltriton.elementwise_inline_asm runs only on a GPU: the interpreter cannot "
        "execute PTX. Write the operation with jax.numpy for interpret=True.")


INTERPRET_RULES = {
    atomic_rmw_p: _rmw_rule,
    atomic_cas_p: _cas_rule,
    debug_barrier_p: _debug_barrier_rule,
    elementwise_inline_asm_p: _inline_asm_rule,
}
for _prim, _rule in INTERPRET_RULES.items():
    plugins.register_interpret_rule(_prim)(_rule)
