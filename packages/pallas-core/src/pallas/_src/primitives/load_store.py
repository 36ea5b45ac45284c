"""Masked ``load``/``store``/``swap`` on refs: what ``ref[...]`` does, plus a mask.

Backends re-export these (``pltpu.load``, ``pltriton.load`` add their own hints). A
masked load returns ``other`` (or an unspecified value, zero here) where the mask is
false; a masked store leaves those elements untouched.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.interpreter import views
from pallas._src.interpreter.rules import register_interpret_rule
from pallas._src.primitives.pretty import RefAccess, register_ref_access_printer, transforms_of

load_p = jc.Primitive("masked_load")
swap_p = jc.Primitive("masked_swap")


def _ref_and_transforms(ref, idx=()):
    if isinstance(ref, jc.TransformedRef):
        base, transforms = ref.ref, tuple(ref.transforms)
    else:
        base, transforms = ref, ()
    if idx is not None and idx != ():
        sub = jc.TransformedRef(base, transforms).at[idx]
        transforms = tuple(sub.transforms)
    return base, transforms


def _result_aval(ref, transforms):
    aval = jax.typeof(ref)
    return jc.state_types.transform_type(list(transforms), aval.inner_aval)


def _broadcast_operand(x, dtype, shape, what: str, access: str, ref):
    """``x`` (a mask or fill value) broadcast to the accessed block's ``shape``; a shape
    that does not broadcast is a trace-time error starting as upstream's."""
    x = jnp.asarray(x, dtype)
    try:
        return jnp.broadcast_to(x, shape)
    except ValueError:
        raise ValueError(
            f"Cannot broadcast the {what} of shape {tuple(x.shape)} to the shape "
            f"{tuple(shape)} of the {access} of {jax.typeof(ref).str_short()}: it must "
            "broadcast to the block read or written (NumPy's rule: the same dims, or "
            "size-1 dims, aligned from the right)") from None


def load(ref, idx=(), *, mask: Any = None, other: Any = None, cache_modifier: str | None = None,
         eviction_policy: str | None = None, volatile: bool = False):
    """Reads ``ref`` (optionally ``ref.at[idx]``); masked-out elements read as ``other``.

    ``cache_modifier``, ``eviction_policy`` and ``volatile`` are hints for backends that
    have them (Triton); they never change values.
    """
    base, transforms = _ref_and_transforms(ref, idx)
    out_aval = _result_aval(base, transforms)
    flat, tree = jax.tree_util.tree_flatten(transforms)
    has_mask, has_other = mask is not None, other is not None
    extra = []
    if has_mask:
        extra.append(_broadcast_operand(mask, jnp.bool_, out_aval.shape, "mask", "load", base))
    if has_other:
        extra.append(_broadcast_operand(other, out_aval.dtype, out_aval.shape, "other value",
                                        "load", base))
    return load_p.bind(base, *flat, *extra, tree=tree, has_mask=has_mask, has_other=has_other,
                       cache_modifier=cache_modifier, eviction_policy=eviction_policy,
                       is_volatile=bool(volatile))


def swap(ref, idx=(), val=None, *, mask: Any = None, eviction_policy: str | None = None):
    """Writes ``val`` to ``ref`` where ``mask`` is true; returns the previous contents."""
    base, transforms = _ref_and_transforms(ref, idx)
    out_aval = _result_aval(base, transforms)
    val = jnp.asarray(val)
    if val.dtype != out_aval.dtype and jax.typeof(val).weak_type:
        val = val.astype(out_aval.dtype)
    if tuple(val.shape) != tuple(out_aval.shape) or val.dtype != out_aval.dtype:
        raise ValueError(
            f"store of a value with shape {tuple(val.shape)} {val.dtype} into a ref slice "
            f"of shape {tuple(out_aval.shape)} {out_aval.dtype}: shapes and dtypes must match."
        )
    flat, tree = jax.tree_util.tree_flatten(transforms)
    has_mask = mask is not None
    extra = ([_broadcast_operand(mask, jnp.bool_, out_aval.shape, "mask", "store", base)]
             if has_mask else [])
    return swap_p.bind(base, val, *flat, *extra, tree=tree, has_mask=has_mask,
                       eviction_policy=eviction_policy)


_WHOLE = object()  # store(ref, val): no index given


def store(ref, idx, val: Any = _WHOLE, *, mask: Any = None,
          eviction_policy: str | None = None) -> None:
    """Writes ``val`` into ``ref.at[idx]`` where ``mask`` is true.

    ``store(ref, idx, val)`` is upstream's generic signature (as ``load``/``swap``);
    ``store(ref, val)`` writes the whole ref, as ``pltpu.store``/``pltriton.store``.
    """
    if val is _WHOLE:
        idx, val = (), idx
    swap(ref, idx, val, mask=mask, eviction_policy=eviction_policy)


def _split(args, tree, n_extra):
    n = tree.num_leaves
    return args[:n], args[n : n + n_extra]


def _load_abstract_eval(ref_aval, *args, tree, has_mask, has_other, **hints):
    transforms = jax.tree_util.tree_unflatten(tree, args[: tree.num_leaves])
    out = jc.state_types.transform_type(transforms, ref_aval.inner_aval)
    return out, {jc.ReadEffect(0)}


def _swap_abstract_eval(ref_aval, val_aval, *args, tree, has_mask, **hints):
    transforms = jax.tree_util.tree_unflatten(tree, args[: tree.num_leaves])
    out = jc.state_types.transform_type(transforms, ref_aval.inner_aval)
    return out, {jc.WriteEffect(0)}


load_p.def_effectful_abstract_eval(_load_abstract_eval)
swap_p.def_effectful_abstract_eval(_swap_abstract_eval)


def _load_access(eqn) -> RefAccess:
    transforms, end = transforms_of(eqn, 1, eqn.params["tree"])
    extra = iter(eqn.invars[end:])
    labels = [k for k, on in (("mask", eqn.params["has_mask"]),
                              ("other", eqn.params["has_other"])) if on]
    return RefAccess(eqn.invars[0], transforms, keywords=[(k, next(extra)) for k in labels])


def _swap_access(eqn) -> RefAccess:
    transforms, end = transforms_of(eqn, 2, eqn.params["tree"])
    mask = [("mask", eqn.invars[end])] if eqn.params["has_mask"] else []
    return RefAccess(eqn.invars[0], transforms, [eqn.invars[1]], mask)


# `b <- a[:3,:]`, `a[:3,:] <- v`, `b, a[i] <- a[i], v`, as JAX prints ref[i] (get/swap).
register_ref_access_printer(load_p, "read", _load_access)
register_ref_access_printer(swap_p, "write", _swap_access)


def _window_indices(idx, tree):
    """Per-dimension index arrays of the window one plain ``NDIndexer`` selects (slices
    and scalar indices), broadcastable against each other like ``np.ix_``; ``None`` for
    any other kind of transform (which keeps JAX's indexing semantics)."""
    transforms = jax.tree_util.tree_unflatten(tree, idx)
    if len(transforms) != 1 or not isinstance(transforms[0], jc.state_indexing.NDIndexer):
        return None
    indices = transforms[0].indices
    n_slices = sum(isinstance(i, jc.state_indexing.Slice) for i in indices)
    out, k = [], 0
    for i in indices:
        if isinstance(i, jc.state_indexing.Slice):
            shape = [1] * n_slices
            shape[k] = i.size
            pos = i.start + i.stride * jnp.arange(i.size, dtype=jnp.int32)
            out.append(pos.reshape(shape))
            k += 1
        elif jnp.ndim(i) == 0:
            out.append(jnp.asarray(i, jnp.int32))
        else:
            return None  # gathers with index arrays keep JAX's semantics
    return tuple(out)


def _masked_get(value, idx, tree):
    """The window a masked access reads, without clamping it into the array: positions
    past either edge read as zero (they are masked off; a clamped window would shift
    the lanes that are not)."""
    window = _window_indices(idx, tree)
    if window is None:
        return views.read_flat(value, idx, tree)
    return value.at[window].get(mode="fill", fill_value=0)


def _masked_set(value, new, idx, tree):
    """``value`` with the window of a masked access set to ``new``; positions past the
    edges are dropped, never clamped onto elements inside the array."""
    window = _window_indices(idx, tree)
    if window is None:
        return views.swap_flat(value, new, idx, tree)[1]
    return value.at[window].set(new, mode="drop")


@register_interpret_rule(load_p)
def _load_rule(ctx, eqn, invals):
    cell, *rest = invals
    tree = eqn.params["tree"]
    idx, extra = _split(rest, tree, 2)
    it = iter(extra)
    mask = next(it) if eqn.params["has_mask"] else None
    other = next(it) if eqn.params["has_other"] else None
    get = views.read_flat if mask is None else _masked_get
    value = get(cell.value, idx, tree)
    if cell.init is not None and ctx.check_uninitialized:
        init = (views.read_mask(cell.init, jnp.result_type(cell.value), idx, tree)
                if mask is None else get(cell.init, idx, tree))
        read = init if mask is None else jnp.logical_or(init, jnp.logical_not(mask))
        ctx.report_read(jnp.all(read), cell, f"read of uninitialised memory in {cell.origin}")
    if mask is not None:
        fill = other if other is not None else jnp.zeros_like(value)
        value = jnp.where(mask, value, fill)
    return [value]


@register_interpret_rule(swap_p)
def _swap_rule(ctx, eqn, invals):
    cell, val, *rest = invals
    tree = eqn.params["tree"]
    idx, extra = _split(rest, tree, 1)
    if not eqn.params["has_mask"]:
        old, cell.value = views.swap_flat(cell.value, val, idx, tree)
        if cell.init is not None:
            cell.init = views.written_mask(cell.init, jnp.result_type(cell.value), idx, tree)
        return [old]
    (mask,) = extra
    old = _masked_get(cell.value, idx, tree)
    cell.value = _masked_set(cell.value, jnp.where(mask, val, old), idx, tree)
    if cell.init is not None:
        cur = _masked_get(cell.init, idx, tree)
        cell.init = _masked_set(cell.init, jnp.logical_or(cur, mask), idx, tree)
    # A partial exchange: masked-off lanes keep the ref's contents and hand ``val``
    # back unchanged, as upstream's discharge does.
    return [jnp.where(mask, old, val)]


# JVPs: a load or store of the tangent ref beside the primal one.


def _masked_load_jvp(primals, tangents, **params):
    has_other = params["has_other"]
    ref, *rest = primals
    tref = tangents[0]
    out = load_p.bind(ref, *rest, **params)
    t_aval = jax.typeof(out).to_tangent_aval()
    if type(tref) is jc.Zero:
        return out, jc.Zero(t_aval)
    trest = list(rest)
    if has_other:
        trest[-1] = jc.instantiate_zeros(tangents[-1])
    tout = load_p.bind(tref, *trest, **params)
    return out, tout


def _masked_swap_jvp(primals, tangents, **params):
    ref, val, *rest = primals
    tref, tval = tangents[0], tangents[1]
    out = swap_p.bind(ref, val, *rest, **params)
    t_aval = jax.typeof(out).to_tangent_aval()
    if type(tref) is jc.Zero and type(tval) is jc.Zero:
        return out, jc.Zero(t_aval)
    if type(tref) is jc.Zero:
        raise ValueError(
            "A differentiated value is stored into a kernel ref that has no tangent "
            f"({jax.typeof(ref).str_short()})."
        )
    tout = swap_p.bind(tref, jc.instantiate_zeros(tval), *rest, **params)
    return out, tout


jc.primitive_jvps[load_p] = _masked_load_jvp
jc.primitive_jvps[swap_p] = _masked_swap_jvp


# Transposes (``fancy_transposes``).
#
# Transposes of the masked ref accesses (``pl.load``/``pl.store`` with ``mask``).
#
# Reverse mode as kernels (:mod:`pallas._src.transforms.backward`) transposes a kernel
# body with JAX's ``backward_pass3``, which looks up ``fancy_transposes`` for primitives
# that touch refs. JAX has them for ``get``/``swap``/``addupdate``; these are the ones for
# pallas-core's ``masked_load``/``masked_swap``. The cotangent buffers they update are
# refs of the backward kernel, so every rule is itself a (masked) load and store that any
# backend lowers.
#
# - ``y = load(x_ref, idx, mask, other)``: ``y`` is ``x_ref[idx]`` where ``mask`` and
#   ``other`` elsewhere; its transpose adds ``ct_y`` into ``ct_x_ref[idx]`` where ``mask``
#   (a masked read-modify-write, so masked-off positions past an array edge are never
#   touched), and gives ``other`` the cotangent ``where(mask, 0, ct_y)``.
# - ``old = swap(x_ref, idx, val, mask)``: ``val`` gets ``ct_x_ref[idx]`` where ``mask``,
#   and those positions of ``ct_x_ref`` become zero (the old contents were overwritten).
#   A masked swap whose result (the old contents) is itself differentiated is refused
#   (the cotangent would have to be added at masked-off positions, which may lie past
#   the array's edge); the caller falls back to XLA.


def _accum_ref(x):
    """The kernel ref a cotangent accumulator writes to, or None for a primal ref."""
    if isinstance(x, jc.ad.GradAccum):
        return x.inst().ref
    return None


def _split_operands(rest, tree, n_extra):
    n = tree.num_leaves
    return list(rest[:n]), list(rest[n : n + n_extra])


def _masked_add(ref, idx, tree, g, mask):
    """``ref[idx] += g`` where ``mask`` (all positions when ``mask`` is None)."""
    extra = [] if mask is None else [mask]
    cur = load_p.bind(ref, *idx, *extra, tree=tree, has_mask=mask is not None,
                                 has_other=False, cache_modifier=None,
                                 eviction_policy=None, is_volatile=False)
    swap_p.bind(ref, cur + g, *idx, *extra, tree=tree,
                           has_mask=mask is not None, eviction_policy=None)


def _masked_load_transpose(g, ref_, *rest, tree, has_mask, has_other, **hints):
    if type(g) is jc.Zero:
        return
    idx, extra = _split_operands(rest, tree, int(has_mask) + int(has_other))
    mask = extra[0] if has_mask else None
    other = extra[-1] if has_other else None
    ref = _accum_ref(ref_)
    if ref is not None:
        _masked_add(ref, idx, tree, g, mask)
    if isinstance(other, jc.ad.GradAccum):
        other.accum(g if mask is None else jnp.where(mask, jnp.zeros_like(g), g))


def _masked_swap_transpose(g, ref_, val, *rest, tree, has_mask, **hints):
    idx, extra = _split_operands(rest, tree, int(has_mask))
    mask = extra[0] if has_mask else None
    ref = _accum_ref(ref_)
    if ref is None:
        if isinstance(val, jc.ad.GradAccum):
            raise NotImplementedError(
                "a differentiated value is stored into a ref that has no cotangent")
        return
    if mask is not None and type(g) is not jc.Zero:
        raise NotImplementedError(
            "the old contents returned by a masked pl.swap are differentiated")
    g = None if type(g) is jc.Zero else g
    m = [] if mask is None else [mask]
    ct_val = load_p.bind(ref, *idx, *m, tree=tree, has_mask=mask is not None,
                                    has_other=False, cache_modifier=None,
                                    eviction_policy=None, is_volatile=False)
    if mask is not None:
        ct_val = jnp.where(mask, ct_val, jnp.zeros_like(ct_val))
    new = jnp.zeros_like(ct_val) if g is None else g
    swap_p.bind(ref, new, *idx, *m, tree=tree, has_mask=mask is not None,
                           eviction_policy=None)
    if isinstance(val, jc.ad.GradAccum):
        val.accum(ct_val)


jc.ad.fancy_transposes[load_p] = _masked_load_transpose
jc.ad.fancy_transposes[swap_p] = _masked_swap_transpose
