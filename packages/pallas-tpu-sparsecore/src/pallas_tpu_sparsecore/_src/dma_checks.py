"""Trace-time check of indexed DMAs' indices (``pltpu.async_copy(x_hbm.at[idx], ...)``).

SparseCore's indirect DMA takes its offsets as one 1-D int32 vector (or a ref holding
one, or ``plsc.Indices`` of either). Any other index type would be silently converted or
rejected deep in the compiler, so a kernel using one fails here, naming the DMA side,
the index's type and what is valid. Run by the backend's ``validate`` and before the
interpreter runs a SparseCore kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_tpu import extend as tpx
from pallas_tpu_sparsecore._src import jax_compat as jc
from pallas_tpu_sparsecore._src.indices import Indices


def _index_type(idx):
    """(shape, dtype) of an index entry given as an aval, a ref index or Indices."""
    if isinstance(idx, Indices):
        idx = idx.values
    if isinstance(idx, tpx.RefIndex):  # here over avals: the ref is an AbstractRef
        ref_aval = idx.ref if hasattr(idx.ref, "inner_aval") else jax.typeof(idx.ref)
        view = jc.transformed_aval(ref_aval, list(idx.transforms))
        return tuple(view.shape), view.dtype
    aval = getattr(idx, "inner_aval", idx)
    return tuple(getattr(aval, "shape", ())), getattr(aval, "dtype", None)


def _check_side(what: str, entry) -> None:
    _ref, flat, tree = entry
    transforms = jax.tree_util.tree_unflatten(tree, flat)
    if not transforms or not isinstance(transforms[-1], jc.NDIndexer):
        return
    for d, idx in enumerate(transforms[-1].indices):
        if isinstance(idx, jc.Slice):
            continue
        shape, dtype = _index_type(idx)
        if not shape:  # a scalar index: a plain (strided) DMA
            continue
        if d != 0 or len(shape) != 1 or dtype != jnp.int32:
            raise TypeError(
                f"pltpu.async_copy on SparseCore: the {what} is indexed (an indexed DMA) at "
                f"dimension {d} by a {jnp.dtype(dtype).name}{list(shape)} index; valid: "
                f"one 1-D int32 vector or ref on the first dimension (x_hbm.at[idx], "
                f"x_hbm.at[idx_ref], x_hbm.at[plsc.Indices(idx, ignored_value=v)])")


def check_indexed_dmas(jaxpr) -> None:
    """Raises a TypeError for an indexed DMA whose index is not a 1-D int32 vector."""
    for eqn in jaxpr.eqns:
        if eqn.primitive is tpx.dma_start_p:
            spec = eqn.params["refs"]
            end = tpx.spec_end(spec)
            avals = [v.aval for v in eqn.invars[:end]]
            entries = list(tpx.unflatten_refs(spec, avals))
            for what, entry in zip(("source", "destination"), entries[:2]):
                if entry is not None:
                    _check_side(what, entry)
        for v in eqn.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    check_indexed_dmas(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    check_indexed_dmas(sub)
