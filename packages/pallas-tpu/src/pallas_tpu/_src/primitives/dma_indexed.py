"""Indexed (gather/scatter) DMAs in the interpreter: ``pltpu.async_copy(x_hbm.at[idx],
dst, sem)`` and ``pltpu.async_copy(src, o_hbm.at[idx], sem, add=...)``.

The index may be an int array, a ref (``x_hbm.at[idx_ref]``, ``x_hbm.at[idx_ref.at[:n]]``)
or an ``Indices``-like object with ``values`` and ``ignored_value`` (pallas-tpu-sparsecore's
``plsc.Indices``): entries equal to ``ignored_value`` copy nothing. :func:`resolve` turns a
view's transforms into ones over plain arrays; :func:`check_bounds` fails the kernel on an
out-of-range (not ignored) index, never clamping it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_tpu._src import jax_compat as jc


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class RefIndex:
    """A ref view used as an index (``x_hbm.at[idx_ref.at[:n]]``), as a pytree: JAX's
    ``TransformedRef`` is not one, so a primitive could not take it as operands."""

    ref: object
    transforms: tuple

    @property
    def shape(self):
        return jc.transform_type(list(self.transforms), jax.typeof(self.ref).inner_aval).shape

    def tree_flatten(self):
        return (self.ref, self.transforms), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(*children)


def _wrap_index(i):
    """A ref-view index as a :class:`RefIndex`, also inside an ``Indices``-like wrapper
    (``plsc.Indices(idx_ref.at[...], ignored_value=v)``, say a block of
    ``emit_pipeline``); other indices unchanged."""
    if isinstance(i, jc.TransformedRef):
        return RefIndex(i.ref, tuple(i.transforms))
    if _is_indices(i) and isinstance(i.values, jc.TransformedRef):
        return dataclasses.replace(i, values=_wrap_index(i.values))
    return i


def _is_indices(i) -> bool:
    return dataclasses.is_dataclass(i) and hasattr(i, "values") and hasattr(i, "ignored_value")


def wrap_ref_indices(transforms) -> list:
    """``transforms`` with every ref-view index of an ``NDIndexer`` as a :class:`RefIndex`."""
    out = []
    for t in transforms:
        if isinstance(t, jc.NDIndexer):
            indices = tuple(_wrap_index(i) for i in t.indices)
            if any(a is not b for a, b in zip(indices, t.indices)):
                t = dataclasses.replace(t, indices=indices, validate=False)
        out.append(t)
    return out


@dataclasses.dataclass
class Resolved:
    """A ref view over plain arrays: its flat transforms and tree, every array index with
    the size of the dimension it indexes, and the entries to skip (or None)."""

    flat: list
    tree: object
    indices: list  # [(dim size, index array, skip mask or None)]
    skip: object = None  # bool mask over the view's indexed dims (last indexer only)
    skip_pos: int = 0  # where the indexed dims sit in the view's shape


def _ref_value(x):
    """The array a ref used as an index holds (a Cell, or a view of one), else None."""
    if isinstance(x, (jc.TransformedRef, RefIndex)):
        base = _ref_value(x.ref)
        if base is None:
            return None
        flat, tree = jax.tree_util.tree_flatten(list(x.transforms))
        return jc.get_view(base, [_plain(f) for f in flat], tree)
    if hasattr(x, "value") and hasattr(x, "origin"):  # an interpreter Cell
        return x.value
    return None


def _plain(x):
    v = _ref_value(x)
    return x if v is None else v


def _is_indices(x) -> bool:
    return hasattr(x, "values") and hasattr(x, "ignored_value") and not isinstance(
        x, jc.Slice)


def resolve(cell, flat, tree) -> Resolved:
    """The transforms of a view of ``cell`` with every ref index read and every
    ``Indices`` unwrapped."""
    transforms = jax.tree_util.tree_unflatten(tree, flat)
    shape = tuple(jnp.shape(cell.value))
    out, found, skip, skip_pos = [], [], None, 0
    for k, t in enumerate(transforms):
        if not isinstance(t, jc.NDIndexer):
            out.append(t)
            shape = None
            continue
        new, ints = [], []
        for d, idx in enumerate(t.indices):
            if isinstance(idx, jc.Slice):
                new.append(idx)
                continue
            mask = None
            if _is_indices(idx):
                values = jnp.asarray(_plain(idx.values))
                if idx.ignored_value is not None:
                    mask = values == idx.ignored_value
                    if k != len(transforms) - 1 or values.ndim != 1 or skip is not None:
                        raise NotImplementedError(
                            "an indexed DMA with Indices(ignored_value=...) takes one 1-D "
                            "index vector in the last view of the ref "
                            "(x_hbm.at[plsc.Indices(idx, ignored_value=v)])")
                    skip = mask
                    # An ignored entry stands in for the first kept one (same row, same
                    # data), so it moves nothing; see dma_start_rule.
                    values = jnp.where(mask, values[jnp.argmin(mask)], values)
                idx = values
            else:
                idx = _plain(idx)
            new.append(idx)
            if jnp.ndim(idx) > 0:
                ints.append(d)
                if shape is not None:
                    found.append((shape[d], idx, mask))
        if skip is not None and ints:
            sliced_before = sum(isinstance(i, jc.Slice) for i in t.indices[:ints[0]])
            skip_pos = sliced_before
        t = dataclasses.replace(t, indices=tuple(new), validate=False)
        out.append(t)
        shape = None if shape is None else tuple(t.get_indexer_shape())
    flat, tree = jax.tree_util.tree_flatten(out)
    return Resolved(flat, tree, found, skip, skip_pos)


def check_bounds(ctx, cell, r: Resolved, what: str) -> None:
    """Fails the kernel if an index (not ignored) lies outside its dimension."""
    for size, idx, mask in r.indices:
        ok = (idx >= 0) & (idx < size)
        if mask is not None:
            ok = ok | mask
        ok = jnp.all(ok)
        msg = (f"indexed DMA: an index of the {what} {cell.origin} lies outside "
               f"[0, {size}); indexed DMAs do not clamp")
        if getattr(ctx, "error_cell", None) is not None:
            ctx.report(ok, msg)
        else:
            jax.debug.callback(functools.partial(_raise_if_not, msg=msg), ok)


def _raise_if_not(ok, *, msg):
    if not bool(ok):
        raise IndexError(msg)


def skip_mask(r: Resolved, shape) -> object:
    """The view's skip mask broadcast to ``shape`` (the data moved), or None."""
    if r.skip is None:
        return None
    m = r.skip
    lead, trail = r.skip_pos, len(shape) - r.skip_pos - m.ndim
    return jnp.broadcast_to(m.reshape((1,) * lead + m.shape + (1,) * trail), shape)


def first_kept(r: Resolved, data):
    """``data`` with every skipped entry replaced by the first kept entry's data."""
    j0 = jnp.argmin(r.skip)
    row = jax.lax.dynamic_index_in_dim(data, j0, axis=r.skip_pos, keepdims=True)
    return jnp.where(skip_mask(r, data.shape), row, data)
