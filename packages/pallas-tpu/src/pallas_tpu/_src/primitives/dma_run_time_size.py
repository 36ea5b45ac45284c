"""Interpreter rules for DMAs of ref views whose size is known only at run time
(``ref.at[pl.ds(start, n)]`` with a traced ``n``, as upstream allows for DMAs).

The interpreter's arrays have static shapes, so such a copy is carried out on whole
dims: each dim sliced with a run-time size is taken whole on both sides, the source
rows are gathered to their destination positions, and only the destination elements
inside ``[start, start + n)`` change. The semaphores count the bytes actually copied.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas_tpu._src import jax_compat as jc


def has_run_time_size(flat, tree) -> bool:
    """Whether the ref transforms slice some dim with a run-time size."""
    return any(isinstance(t, jc.NDIndexer) and t.is_dynamic_size
               for t in jax.tree_util.tree_unflatten(tree, flat))


def _whole_dims(flat, tree, what: str):
    """(transforms with each run-time-size slice taken whole, [(view dim, start, size,
    extent)] of those slices)."""
    transforms = jax.tree_util.tree_unflatten(tree, flat)
    if len(transforms) != 1 or not isinstance(transforms[0], jc.NDIndexer):
        raise NotImplementedError(
            f"a DMA {what} of run-time size through {len(transforms)} ref transforms: the "
            f"interpreter copies a view of run-time size made by one indexer (ref.at[...])")
    t = transforms[0]
    indices, dynamic, view_dim = [], [], 0
    for idx, extent in zip(t.indices, t.shape):
        if isinstance(idx, jc.Slice) and idx.is_dynamic_size:
            if idx.stride != 1:
                raise NotImplementedError(f"a strided DMA {what} of run-time size")
            dynamic.append((view_dim, idx.start, idx.size, extent))
            idx = jc.Slice(0, extent)
        if isinstance(idx, jc.Slice):
            view_dim += 1
        indices.append(idx)
    whole = jc.NDIndexer(tuple(indices), t.shape, t.int_indexer_shape)
    flat2, tree2 = jax.tree_util.tree_flatten([whole])
    return flat2, tree2, dynamic


def copy(src_value, s_flat, s_tree, dst_value, d_flat, d_tree):
    """``(new destination value, bytes copied)`` of a DMA with run-time sizes."""
    s_flat, s_tree, s_dyn = _whole_dims(s_flat, s_tree, "source")
    d_flat, d_tree, d_dyn = _whole_dims(d_flat, d_tree, "destination")
    if [d for d, *_ in s_dyn] != [d for d, *_ in d_dyn]:
        raise NotImplementedError(
            "a DMA whose source and destination have their run-time sizes in different "
            "dims")
    data = jc.get_view(src_value, s_flat, s_tree)
    old = jc.get_view(dst_value, d_flat, d_tree)
    mask = jnp.ones(old.shape, jnp.bool_)
    count = jnp.int32(1)
    for (dim, s_start, n, s_ext), (_, d_start, _n, d_ext) in zip(s_dyn, d_dyn):
        pos = jnp.arange(d_ext, dtype=jnp.int32)
        rows = jnp.clip(pos - d_start + s_start, 0, s_ext - 1)
        data = jnp.take(data, rows, axis=dim)
        inside = (pos >= d_start) & (pos < d_start + n)
        shape = [1] * old.ndim
        shape[dim] = d_ext
        mask = mask & inside.reshape(shape)
        count = count * jnp.asarray(n, jnp.int32)
    new = jnp.where(mask, data.astype(old.dtype), old)
    static = [e for k, e in enumerate(old.shape) if k not in {d for d, *_ in d_dyn}]
    nbytes = count * jnp.int32(int(np.prod(static, dtype=np.int64)) * old.dtype.itemsize)
    return jc.set_view(dst_value, new, d_flat, d_tree), nbytes


def view_nbytes(value, flat, tree):
    """The bytes of a view of run-time size (what a DMA wait on it waits for)."""
    flat, tree, dyn = _whole_dims(flat, tree, "view")
    view = jc.get_view(value, flat, tree)
    count = jnp.int32(1)
    for _, _, n, _ in dyn:
        count = count * jnp.asarray(n, jnp.int32)
    static = [e for k, e in enumerate(view.shape) if k not in {d for d, *_ in dyn}]
    return count * jnp.int32(int(np.prod(static, dtype=np.int64)) * view.dtype.itemsize)
