"""``load_gather``, ``store_scatter`` and ``addupdate_scatter``: vector gathers and
scatters of a VMEM ref, one index vector per ref dimension.

Primitives ``sc_gather`` and ``sc_scatter``. Interpreter: every (unmasked) index is
bounds-checked (an out-of-range index fails the kernel, never clamps); a scatter-add
with repeated indices adds every contribution. Lowering: ``tpu.vector_load_idx`` and
``tpu.vector_store_idx`` (``add`` for ``addupdate_scatter``).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jaxlib.mosaic.python import tpu

from pallas.plugins import effect_primitive, read_cell, write_cell
from pallas_tpu import extend as tpx
from pallas_tpu_sparsecore._src import jax_compat as jc
from pallas_tpu_sparsecore._src.checks import in_range, require
from pallas_tpu_sparsecore._src.info import check_vector_shape
from pallas_tpu_sparsecore._src.lowering.table import rule
from pallas_tpu_sparsecore._src.primitives import refs as R


def _scatter_effects(*avals, tree, num_indices, has_mask, add):
    return {jc.WriteEffect(0)} | ({jc.ReadEffect(0)} if add else set())


gather_p = jc.Primitive("sc_gather")
scatter_p = effect_primitive("sc_scatter", _scatter_effects)

_DTYPES = (jnp.dtype(jnp.int32), jnp.dtype(jnp.float32))


def _check_indices(fn: str, view, indices) -> list:
    if isinstance(indices, jax.Array) or not isinstance(indices, Sequence) or isinstance(
            indices, str):
        raise TypeError(
            f"{fn}: indices must be a sequence of 1-D int32 arrays, one per dimension of "
            f"the ref ({len(view.shape)}); got {type(indices).__name__} (wrap a single "
            f"index vector in a list: [idx])")
    if len(indices) != len(view.shape):
        raise ValueError(
            f"{fn}: the ref has shape {view.shape}, so indices needs {len(view.shape)} "
            f"index vector(s), one per dimension; got {len(indices)}")
    out, size = [], None
    for i, idx in enumerate(indices):
        idx = R.as_array(fn, f"indices[{i}]", idx)
        if idx.dtype != jnp.int32:
            raise TypeError(
                f"{fn}: indices[{i}] has dtype {idx.dtype.name}; SparseCore gathers and "
                f"scatters take int32 index vectors (cast with .astype(jnp.int32))")
        if idx.ndim != 1:
            raise ValueError(f"{fn}: indices[{i}] must be a 1-D vector; got shape {idx.shape}")
        if size is not None and idx.shape[0] != size:
            raise ValueError(
                f"{fn}: every index vector must have the same length; indices[0] has "
                f"{size} and indices[{i}] has {idx.shape[0]}")
        size = idx.shape[0]
        out.append(idx)
    return out


def _check_ref_dtype(fn: str, view) -> None:
    if jnp.dtype(view.dtype) not in _DTYPES:
        raise TypeError(f"{fn}: the ref has dtype {jnp.dtype(view.dtype).name}; SparseCore "
                        f"gathers and scatters support int32 and float32")


def load_gather(ref, indices: Sequence[jax.Array], *, mask: jax.Array | None = None
                ) -> jax.Array:
    """Gathers ``ref[indices[0][i], indices[1][i], ...]`` for every ``i`` into a vector.

    Args:
      ref: a VMEM ref (or ``ref.at[...]`` view) of int32 or float32.
      indices: one 1-D int32 vector per dimension of ``ref``, all of the same length.
      mask: optional bool vector; where False nothing is read (the result is 0 there).
    """
    fn = "plsc.load_gather"
    R.check_ref(fn, "ref", ref)
    base, flat, tree, view = R.flatten_ref(ref)
    _check_ref_dtype(fn, view)
    idx = _check_indices(fn, view, indices)
    n = idx[0].shape[0]
    check_vector_shape(f"{fn}: the gathered vector", (n,), view.dtype)
    extra = [R.check_mask(fn, mask, (n,))] if mask is not None else []
    return gather_p.bind(base, *flat, *idx, *extra, tree=tree, num_indices=len(idx),
                         has_mask=mask is not None)


def _scatter(fn, ref, indices, x, mask, add):
    R.check_ref(fn, "ref", ref)
    base, flat, tree, view = R.flatten_ref(ref)
    _check_ref_dtype(fn, view)
    idx = _check_indices(fn, view, indices)
    n = idx[0].shape[0]
    x = R.as_array(fn, "x", x)
    if tuple(x.shape) != (n,):
        raise ValueError(f"{fn}: x must have shape ({n},) (one value per index); got "
                         f"{x.shape}")
    if x.dtype != view.dtype:
        raise TypeError(f"{fn}: x has dtype {x.dtype.name} but the ref holds "
                        f"{jnp.dtype(view.dtype).name}")
    check_vector_shape(f"{fn}: the scattered vector x", (n,), x.dtype)
    extra = [R.check_mask(fn, mask, (n,))] if mask is not None else []
    scatter_p.bind(base, *flat, *idx, x, *extra, tree=tree, num_indices=len(idx),
                   has_mask=mask is not None, add=add)


def store_scatter(ref, indices: Sequence[jax.Array], x: jax.Array, *,
                  mask: jax.Array | None = None) -> None:
    """Stores ``x[i]`` into ``ref[indices[0][i], ...]`` for every (unmasked) ``i``."""
    _scatter("plsc.store_scatter", ref, indices, x, mask, add=False)


def addupdate_scatter(ref, indices: Sequence[jax.Array], x: jax.Array, *,
                      mask: jax.Array | None = None) -> None:
    """Adds ``x[i]`` to ``ref[indices[0][i], ...]`` for every (unmasked) ``i``; repeated
    indices add up."""
    _scatter("plsc.addupdate_scatter", ref, indices, x, mask, add=True)


# -- abstract evaluation -------------------------------------------------------------


def _split(args, tree, num_indices, has_mask, has_x=False):
    ref, rest = args[0], list(args[1:])
    nt = tree.num_leaves
    flat, rest = rest[:nt], rest[nt:]
    idx, rest = rest[:num_indices], rest[num_indices:]
    x = rest.pop(0) if has_x else None
    mask = rest.pop(0) if has_mask else None
    return ref, flat, idx, x, mask


def _gather_abstract_eval(*avals, tree, num_indices, has_mask):
    ref, flat, idx, _, _ = _split(avals, tree, num_indices, has_mask)
    view = R.view_aval(ref, flat, tree)
    return jc.ShapedArray((idx[0].shape[0],), view.dtype), {jc.ReadEffect(0)}


gather_p.def_effectful_abstract_eval(_gather_abstract_eval)


# -- interpreter rules -----------------------------------------------------------------


def _check_bounds(ctx, what, cell, view_shape, idx, mask):
    for d, (i, size) in enumerate(zip(idx, view_shape)):
        require(ctx, in_range(i, size, mask),
                f"{what}: indices[{d}] has an entry outside [0, {size}) for {cell.origin} "
                f"(a view of shape {tuple(view_shape)}); SparseCore gathers and scatters "
                f"do not clamp")


def gather_rule(ctx, eqn, invals):
    p = eqn.params
    cell, flat, idx, _, mask = _split(invals, p["tree"], p["num_indices"], p["has_mask"])
    view = read_cell(cell, flat, p["tree"])
    _check_bounds(ctx, "plsc.load_gather", cell, view.shape, idx, mask)
    out = view.at[tuple(idx)].get(mode="fill", fill_value=0)
    if mask is not None:
        out = jnp.where(mask, out, jnp.zeros_like(out))
    return [out]


def scatter_rule(ctx, eqn, invals):
    p = eqn.params
    cell, flat, idx, x, mask = _split(invals, p["tree"], p["num_indices"], p["has_mask"],
                                      has_x=True)
    view = read_cell(cell, flat, p["tree"])
    fn = "plsc.addupdate_scatter" if p["add"] else "plsc.store_scatter"
    _check_bounds(ctx, fn, cell, view.shape, idx, mask)
    if mask is not None:  # masked-off entries go out of range and are dropped
        idx = [jnp.where(mask, i, size) for i, size in zip(idx, view.shape)]
    at = view.at[tuple(idx)]
    new = at.add(x, mode="drop") if p["add"] else at.set(x, mode="drop")
    write_cell(cell, flat, p["tree"], new)
    return []


INTERPRET_RULES = {gather_p: gather_rule, scatter_p: scatter_rule}


# -- lowering rules ------------------------------------------------------------------------


def _vmem_view(fn, ref, flat, tree):
    w = tpx.apply_transforms(ref, flat, tree)
    space = tpx.types.space_of(ref.space)
    if str(space.value) not in ("vmem",):
        raise ValueError(f"{fn} reads and writes VMEM refs only; this ref is in {space.value}"
                         f" (copy it to VMEM first, e.g. with pltpu.sync_copy)")
    return tpx.window_memref(w)


@rule(gather_p)
def _gather_lowering(lctx, eqn, *invals):
    p = eqn.params
    ref, flat, idx, _, mask = _split(invals, p["tree"], p["num_indices"], p["has_mask"])
    out = tpx.aval_out(eqn)
    base = _vmem_view("plsc.load_gather", ref, flat, p["tree"])
    ins = [v.aval for v in eqn.invars]
    nt = p["tree"].num_leaves
    idx = [tpx.materialize(i, ins[1 + nt + k]) for k, i in enumerate(idx)]
    if mask is not None:
        mask = tpx.materialize(mask, ins[-1])
    return tpu.vector_load_idx(tpx.types.aval_type(out), base, idx, mask=mask)


@rule(scatter_p)
def _scatter_lowering(lctx, eqn, *invals):
    p = eqn.params
    ref, flat, idx, x, mask = _split(invals, p["tree"], p["num_indices"], p["has_mask"],
                                     has_x=True)
    fn = "plsc.addupdate_scatter" if p["add"] else "plsc.store_scatter"
    base = _vmem_view(fn, ref, flat, p["tree"])
    ins = [v.aval for v in eqn.invars]
    nt, k = p["tree"].num_leaves, p["num_indices"]
    idx = [tpx.materialize(i, ins[1 + nt + j]) for j, i in enumerate(idx)]
    x = tpx.materialize(x, ins[1 + nt + k])
    if mask is not None:
        mask = tpx.materialize(mask, ins[-1])
    tpu.vector_store_idx(x, base, idx, mask=mask, add=bool(p["add"]))
    return []
