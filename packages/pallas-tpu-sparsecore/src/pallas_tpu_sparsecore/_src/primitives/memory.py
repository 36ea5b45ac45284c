"""``load_expanded``, ``store_compressed``, ``addupdate`` and ``addupdate_compressed``:
masked vector loads and stores of a 1-D VMEM ref.

Primitives ``sc_load_expanded`` and ``sc_store`` (``add``, ``has_mask``). Semantics:
``load_expanded`` puts ``ref[k]`` at the position of the k-th True of ``mask`` (0
elsewhere); ``store_compressed`` writes the values of ``x`` where ``mask`` is True to
``ref[0]``, ``ref[1]``, ... in order; ``addupdate`` adds ``x`` to ``ref``;
``addupdate_compressed`` adds the selected values as ``store_compressed`` stores them.
Lowering: ``tpu.vector_load`` / ``tpu.vector_store`` with the mask (and ``add``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxlib.mosaic.python import tpu

from pallas.plugins import effect_primitive, read_cell, write_cell
from pallas_tpu import extend as tpx
from pallas_tpu_sparsecore._src import jax_compat as jc
from pallas_tpu_sparsecore._src.info import check_vector_shape
from pallas_tpu_sparsecore._src.lowering.table import rule
from pallas_tpu_sparsecore._src.primitives import refs as R


def _store_effects(*avals, tree, has_mask, add):
    return {jc.WriteEffect(0)} | ({jc.ReadEffect(0)} if add else set())


load_expanded_p = jc.Primitive("sc_load_expanded")
store_p = effect_primitive("sc_store", _store_effects)


def _view_1d(fn, ref):
    R.check_ref(fn, "ref", ref)
    base, flat, tree, view = R.flatten_ref(ref)
    if len(view.shape) != 1:
        raise ValueError(f"{fn}: the ref (view) must be 1-D; got shape {view.shape}")
    check_vector_shape(f"{fn}: the ref (view)", view.shape, view.dtype)
    return base, flat, tree, view


def load_expanded(ref, *, mask: jax.Array) -> jax.Array:
    """Loads ``ref[0], ref[1], ...`` into the positions where ``mask`` is True, in order
    (positions where it is False hold 0)."""
    fn = "plsc.load_expanded"
    base, flat, tree, view = _view_1d(fn, ref)
    mask = R.check_mask(fn, mask, view.shape)
    return load_expanded_p.bind(base, *flat, mask, tree=tree)


def _store(fn, ref, x, mask, add):
    base, flat, tree, view = _view_1d(fn, ref)
    x = R.as_array(fn, "x", x)
    if tuple(x.shape) != tuple(view.shape):
        raise ValueError(f"{fn}: x must have the ref's shape {view.shape}; got {x.shape}")
    if x.dtype != view.dtype:
        raise TypeError(f"{fn}: x has dtype {x.dtype.name} but the ref holds "
                        f"{jnp.dtype(view.dtype).name}")
    extra = [R.check_mask(fn, mask, view.shape)] if mask is not None else []
    store_p.bind(base, *flat, x, *extra, tree=tree, has_mask=mask is not None, add=add)


def store_compressed(ref, x: jax.Array, *, mask: jax.Array) -> None:
    """Writes the elements of ``x`` where ``mask`` is True to ``ref[0], ref[1], ...``."""
    _store("plsc.store_compressed", ref, x, mask, add=False)


def addupdate(ref, x: jax.Array) -> None:
    """Adds ``x`` to ``ref`` (an atomic read-modify-write on SparseCore)."""
    _store("plsc.addupdate", ref, x, None, add=True)


def addupdate_compressed(ref, x: jax.Array, *, mask: jax.Array) -> None:
    """Adds the elements of ``x`` where ``mask`` is True to ``ref[0], ref[1], ...``."""
    _store("plsc.addupdate_compressed", ref, x, mask, add=True)


# -- abstract evaluation -------------------------------------------------------------


def _load_abstract_eval(ref, *rest, tree):
    view = R.view_aval(ref, rest[:-1], tree)
    return jc.ShapedArray(view.shape, view.dtype), {jc.ReadEffect(0)}


load_expanded_p.def_effectful_abstract_eval(_load_abstract_eval)


# -- interpreter rules -----------------------------------------------------------------


def _positions(mask):
    """For each True of ``mask``, its rank among the Trues (its compressed position)."""
    return jnp.cumsum(mask.astype(jnp.int32)) - 1


def load_expanded_rule(ctx, eqn, invals):
    cell, *flat, mask = invals
    view = read_cell(cell, flat, eqn.params["tree"])
    pos = jnp.where(mask, _positions(mask), 0)
    return [jnp.where(mask, view[pos], jnp.zeros_like(view))]


def store_rule(ctx, eqn, invals):
    p = eqn.params
    nt = p["tree"].num_leaves
    cell, flat, x = invals[0], invals[1:1 + nt], invals[1 + nt]
    view = read_cell(cell, flat, p["tree"])
    if p["has_mask"]:
        mask = invals[2 + nt]
        pos = jnp.where(mask, _positions(mask), view.shape[0])  # False -> dropped
        at = view.at[pos]
        new = at.add(x, mode="drop") if p["add"] else at.set(x, mode="drop")
    else:
        new = view + x if p["add"] else x
    write_cell(cell, flat, p["tree"], new)
    return []


INTERPRET_RULES = {load_expanded_p: load_expanded_rule, store_p: store_rule}


# -- lowering rules ------------------------------------------------------------------------


def _zeros(n):
    return [tpx.to_index(0) for _ in range(n)]


@rule(load_expanded_p)
def _load_expanded_lowering(lctx, eqn, ref, *rest):
    w = tpx.apply_transforms(ref, rest[:-1], eqn.params["tree"])
    mem = tpx.window_memref(w)
    mask = tpx.materialize(rest[-1], eqn.invars[-1].aval)
    out = tpx.types.aval_type(tpx.aval_out(eqn))
    return tpu.vector_load(out, mem, _zeros(1), strides=[], mask=mask)


@rule(store_p)
def _store_lowering(lctx, eqn, ref, *rest):
    p = eqn.params
    nt = p["tree"].num_leaves
    w = tpx.apply_transforms(ref, rest[:nt], p["tree"])
    mem = tpx.window_memref(w)
    x = tpx.materialize(rest[nt], eqn.invars[1 + nt].aval)
    mask = tpx.materialize(rest[nt + 1], eqn.invars[2 + nt].aval) if p["has_mask"] else None
    tpu.vector_store(x, mem, _zeros(1), strides=[], mask=mask, add=bool(p["add"]))
    return []
