"""Indexed (gather/scatter) DMA views in TPU interpret mode: ``x_hbm.at[idx]`` with
``idx`` an int array, a ref (``x_hbm.at[idx_ref]``, ``x_hbm.at[idx_ref.at[:n]]``) or an
``Indices``-like object (``plsc.Indices(idx, ignored_value=v)``).

Such a view is not one box: it is a :class:`RowView`, one box per index entry along an
axis of the data moved (None for an ignored entry, which moves nothing). A DMA between
an indexed view and a plain one moves row by row, the plain side split along the same
axis (:func:`split`), so repeated scatter-add indices all land. The indices are read
when the DMA starts, by the issuing core (a read the race detector sees).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.interpret import boxes as B
from pallas_tpu._src.interpret.state import Buffer


@dataclasses.dataclass(frozen=True)
class RowView:
    """An indexed view: ``rows[k]`` is the box of entry k (None: ignored), stacked along
    ``axis`` of the view's ``shape``."""

    rows: tuple
    axis: int
    shape: tuple

    def nbytes(self, dtype) -> int:  # every entry counts, ignored or not (as the wait does)
        return math.prod(self.shape) * dtype.itemsize

    def describe(self) -> str:
        kept = [B.describe(r) for r in self.rows if r is not None]
        return f"[{len(self.rows)} indexed rows: {', '.join(kept[:4])}{', ...' if len(kept) > 4 else ''}]"


def _is_indices(x) -> bool:
    return hasattr(x, "values") and hasattr(x, "ignored_value") and not isinstance(
        x, jc.Slice)


def _values(core, x, site: str, record: bool) -> np.ndarray:
    """The index values ``x`` stands for: an array, a buffer (a ref), or a view of one."""
    if isinstance(x, Buffer):
        return core.read(x, B.full_box(x.shape), site, "read of DMA indices", record)
    ref, transforms = getattr(x, "ref", None), getattr(x, "transforms", None)
    if isinstance(ref, Buffer) and transforms is not None:  # a ref view (RefIndex)
        box = B.box_of(ref.shape, tuple(transforms))
        return core.read(ref, box, site, "read of DMA indices", record)
    return np.asarray(x)


def rows_view(core, buf: Buffer, flat, tree, site: str, what: str,
              record: bool = True) -> RowView | None:
    """The :class:`RowView` of an indexed view of ``buf``; None if no index is an array."""
    transforms = B.unflatten_transforms(flat, tree)
    if not transforms or not all(isinstance(t, jc.NDIndexer) for t in transforms):
        return None
    last = transforms[-1]
    found = None
    for d, idx in enumerate(last.indices):
        if isinstance(idx, jc.Slice):
            continue
        ignored = None
        if _is_indices(idx):
            ignored, idx = idx.ignored_value, idx.values
        values = _values(core, idx, site, record)
        if values.ndim == 0:
            continue
        if found is not None or values.ndim != 1:
            raise NotImplementedError(
                f"TPU interpret mode: an indexed DMA {what} takes one 1-D index vector "
                f"(x_hbm.at[idx]); got {buf.origin} indexed with shape {values.shape}"
                + (" and another index array" if found is not None else ""))
        found = (d, values.astype(np.int64), ignored)
    if found is None:
        return None
    d, values, ignored = found
    prefix = B.box_of(buf.shape, transforms[:-1])
    view_dims = [b for b, dim in enumerate(prefix) if not dim.squeezed]
    size = prefix[view_dims[d]].count
    rows = []
    for v in values.tolist():
        if ignored is not None and v == ignored:
            rows.append(None)
            continue
        if not 0 <= v < size:
            raise IndexError(
                f"TPU interpret mode: indexed DMA: an index of the {what} {buf.origin} "
                f"lies outside [0, {size}) (index {v}, at {site}); indexed DMAs do not "
                f"clamp")
        indices = tuple(v if k == d else i for k, i in enumerate(last.indices))
        row = B.apply_indexer(prefix, _with_indices(last, indices))
        rows.append(row)
    b = view_dims[d]
    template = B.apply_indexer(prefix, _with_indices(last, tuple(
        0 if k == d else i for k, i in enumerate(last.indices))))
    axis = sum(1 for j, dim in enumerate(template) if j < b and not dim.squeezed)
    row_shape = list(B.box_shape(template))
    shape = tuple(row_shape[:axis] + [len(values)] + row_shape[axis:])
    return RowView(tuple(rows), axis, shape)


def _with_indices(indexer, indices):
    return dataclasses.replace(indexer, indices=indices, validate=False)


def split(box, axis: int, like: RowView) -> RowView:
    """``box`` as rows along ``axis`` of its view (entries ``like`` ignores as None)."""
    dims = [b for b, dim in enumerate(box) if not dim.squeezed]
    shape = B.box_shape(box)
    if axis >= len(dims) or shape[axis] != len(like.rows):
        raise ValueError(
            f"TPU interpret mode: an indexed DMA moves {like.shape} but the other side "
            f"of the copy has shape {shape}")
    b = dims[axis]
    dim = box[b]
    rows = []
    for k, r in enumerate(like.rows):
        if r is None:
            rows.append(None)
            continue
        row = list(box)
        row[b] = B.Dim(dim.start + k * dim.step, 1, dim.step, squeezed=True)
        rows.append(tuple(row))
    return RowView(tuple(rows), axis, shape)
