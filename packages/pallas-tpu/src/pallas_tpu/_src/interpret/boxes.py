"""Index arithmetic of TPU interpret mode: ref transforms as boxes, bounds, padding.

A *box* is what a (transformed) ref sees of its buffer: per buffer dimension a
``(start, count, step)`` range, or a single index (the dimension is squeezed out of the
view). Ref transforms (``ref.at[...]``, ``pl.ds``) compose into one box; reads and
writes then index the buffer's numpy storage directly, and the box is the region the
race detector records.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import jax
import numpy as np

from pallas_tpu._src import jax_compat as jc


class Dim(NamedTuple):
    """One dimension of a box (a tuple: built at every access, so it must be cheap)."""

    start: int
    count: int
    step: int = 1
    squeezed: bool = False

    @property
    def last(self) -> int:
        return self.start + (self.count - 1) * self.step


Box = tuple[Dim, ...]
_full_boxes: dict = {}


def full_box(shape) -> Box:
    try:
        return _full_boxes[shape]
    except (KeyError, TypeError):
        box = tuple(Dim(0, int(n)) for n in shape)
        if isinstance(shape, tuple):
            _full_boxes[shape] = box
        return box


_shapes: dict = {}


def box_shape(box: Box) -> tuple[int, ...]:
    """The shape of the view ``box`` (cached, as :func:`region`)."""
    hit = _shapes.get(box)
    if hit is None:
        if len(_shapes) > 4096:
            _shapes.clear()
        hit = _shapes[box] = tuple(d.count for d in box if not d.squeezed)
    return hit


_regions: dict = {}


def region(box: Box):
    """The box as a race-detector region ``((start, stop, step), ...)`` (cached: boxes
    recur, e.g. a double buffer's two slots)."""
    hit = _regions.get(box)
    if hit is None:
        if len(_regions) > 4096:
            _regions.clear()
        hit = _regions[box] = tuple(
            (d.start, d.start + (d.count - 1) * d.step + 1 if d.count > 0 else d.start,
             d.step) for d in box)
    return hit


def describe(box: Box) -> str:
    parts = []
    for d in box:
        if d.squeezed:
            parts.append(str(d.start))
        else:
            parts.append(f"{d.start}:{d.start + d.count * d.step}"
                         + (f":{d.step}" if d.step != 1 else ""))
    return "[" + ", ".join(parts) + "]"


class NotABox(Exception):
    """The transforms are not a rectangular view (e.g. a gather, a bitcast)."""


def _as_int(x) -> int:
    if type(x) is int:
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return int(x)
    a = np.asarray(x)
    if a.ndim != 0 or a.dtype == object:  # an index array, or a ref (indexed DMAs)
        raise NotABox()
    return int(a)


def apply_indexer(box: Box, indexer) -> Box:
    """Composes one ``NDIndexer`` (over the current view) into ``box``."""
    view_dims = [i for i, d in enumerate(box) if not d.squeezed]
    if len(indexer.indices) > len(view_dims):
        raise NotABox()
    out = list(box)
    for k, idx in enumerate(indexer.indices):
        b = view_dims[k]
        d = box[b]
        if isinstance(idx, jc.Slice):
            start, size, stride = _as_int(idx.start), int(idx.size), int(idx.stride or 1)
            out[b] = Dim(d.start + start * d.step, size, d.step * stride)
        else:
            i = _as_int(idx)
            out[b] = Dim(d.start + i * d.step, 1, d.step, squeezed=True)
    return tuple(out)


def box_of(shape, transforms) -> Box:
    """The box a ref of buffer ``shape`` sees through ``transforms`` (raises NotABox)."""
    box = full_box(shape)
    for t in transforms:
        if not isinstance(t, jc.NDIndexer):
            raise NotABox()
        box = apply_indexer(box, t)
    return box


class _Leaf:
    """A placeholder for the ``k``-th flat leaf while learning a transform tree's shape."""

    def __init__(self, k):
        self.k = k


_programs: dict = {}


def _spec(x):
    if isinstance(x, _Leaf):
        return (True, x.k)
    if isinstance(x, (int, np.integer)):
        return (False, int(x))
    raise NotABox()


def _program(tree):
    """Per ``NDIndexer`` of the transforms of ``tree``: per index ``(slice?, start, size,
    stride)`` with start/size as ``(is_leaf, leaf position or constant)``; None when a
    transform is not an indexer (cached per tree)."""
    hit = _programs.get(tree, _programs)  # by the treedef itself (equal trees share
    if hit is not _programs:              # a program), never by its id()
        return hit
    prog = []
    try:
        leaves = [_Leaf(k) for k in range(tree.num_leaves)]
        for t in jax.tree_util.tree_unflatten(tree, leaves):
            if not isinstance(t, jc.NDIndexer):
                raise NotABox()
            ops = []
            for idx in t.indices:
                if isinstance(idx, jc.Slice):
                    ops.append((True, _spec(idx.start), _spec(idx.size),
                                int(idx.stride or 1)))
                else:
                    ops.append((False, _spec(idx), None, 1))
            prog.append(ops)
    except (NotABox, TypeError, ValueError):
        prog = None
    _programs[tree] = prog
    return prog


_box_fns: dict = {}


def _box_function(shape, prog):
    """Generated Python computing the box of a view of a ``shape`` buffer through the
    transforms ``prog`` (see :func:`_program`) from the flat leaves: which dimensions
    are squeezed, and the strides, are static; only starts and sizes are read."""
    dims = [["0", str(int(n)), 1, False] for n in shape]  # start, count, step, squeezed
    first = True
    for ops in prog:
        # Before the first indexer no dimension is squeezed.
        view_dims = range(len(dims)) if first else [
            i for i, d in enumerate(dims) if not d[3]]
        first = False
        if len(ops) > len(view_dims):
            return None
        for b, (is_slice, start, size, stride) in zip(view_dims, ops):
            d = dims[b]
            i = f"_i(f[{start[1]}])" if start[0] else str(start[1])
            begin = i if d[0] == "0" and d[2] == 1 else f"{d[0]} + {i} * {d[2]}"
            if is_slice:
                n = f"_i(f[{size[1]}])" if size[0] else str(size[1])
                dims[b] = [f"({begin})", n, d[2] * stride, False]
            else:
                dims[b] = [f"({begin})", "1", d[2], True]
    # tuple.__new__ directly: a NamedTuple's own __new__ is a Python call per Dim.
    body = ", ".join(f"_new(Dim, ({d[0]}, {d[1]}, {d[2]}, {d[3]}))" for d in dims)
    # The box is a function of the leaves read: memoised by their values (an
    # unhashable leaf, an array, is computed each time).
    read = sorted({int(k) for k in re.findall(r"f\[(\d+)\]", body)})
    key = "(" + "".join(f"f[{k}], " for k in read) + ")"
    ns = {"Dim": Dim, "_i": _as_int, "_new": tuple.__new__, "_memo": {}}
    code = (f"def build(f):\n    return ({body}{',' if len(dims) == 1 else ''})\n"
            f"def box(f):\n"
            f"    try:\n"
            f"        k = {key}\n"
            f"        hit = _memo.get(k)\n"
            f"    except TypeError:\n"
            f"        return build(f)\n"
            f"    if hit is None:\n"
            f"        if len(_memo) > 1024:\n"
            f"            _memo.clear()\n"
            f"        hit = _memo[k] = build(f)\n"
            f"    return hit\n")
    exec(compile(code, "<pallas_tpu box>", "exec"), ns)  # noqa: S102
    return ns["box"]


def fast_box(shape, flat, tree) -> Box | None:
    """``box_of(shape, unflatten_transforms(flat, tree))`` without building the
    transforms; None when they are not plain indexers (raises NotABox for a gather).
    Each (tree, shape) gets a generated function (cached)."""
    if tree is None:
        return full_box(shape)
    key = (tree, shape)
    hit = _box_fns.get(key)
    if hit is None:
        prog = _program(tree)
        fn = None if prog is None else _box_function(shape, prog)
        if prog is not None and fn is None:
            fn = _not_a_box
        hit = _box_fns[key] = (tree, fn)
    fn = hit[1]
    return None if fn is None else fn(flat)


def _not_a_box(flat):
    raise NotABox()


def unflatten_transforms(flat, tree):
    return tuple(jax.tree_util.tree_unflatten(tree, list(flat))) if tree is not None else ()


def out_of_bounds(box: Box, bounds) -> bool:
    for (start, count, step, _), n in zip(box, bounds):
        if count > 0 and (start < 0 or start + (count - 1) * step >= n):
            return True
    return False


_indices: dict = {}


def numpy_index(box: Box):
    """A basic-indexing tuple for an in-bounds box (squeezed dims as ints; cached, as
    :func:`region`)."""
    hit = _indices.get(box)
    if hit is None:
        if len(_indices) > 4096:
            _indices.clear()
        hit = _indices[box] = tuple(
            d.start if d.squeezed else slice(d.start, d.start + d.count * d.step, d.step)
            for d in box)
    return hit


_inside: dict = {}


def index_in(box: Box, bounds):
    """:func:`numpy_index` of ``box`` when it lies within ``bounds``, else None (one
    cached lookup for the bounds check and the index together)."""
    key = (box, bounds)
    hit = _inside.get(key, _inside)
    if hit is _inside:
        if len(_inside) > 4096:
            _inside.clear()
        hit = _inside[key] = None if out_of_bounds(box, bounds) else numpy_index(box)
    return hit


def clipped_read(storage: np.ndarray, box: Box, bounds, fill) -> np.ndarray:
    """Reads ``box``; elements outside ``bounds`` read as ``fill``."""
    idx, valid = [], None
    shape = []
    for d, n in zip(box, bounds):
        pos = d.start + np.arange(d.count) * d.step
        ok = (pos >= 0) & (pos < n)
        idx.append(np.clip(pos, 0, max(n - 1, 0)))
        if not d.squeezed:
            shape.append(d.count)
        valid = ok if valid is None else valid[..., None] & ok
    grid = np.ix_(*idx) if idx else ()
    data = storage[grid] if idx else storage[()]
    out = np.where(valid, data, np.asarray(fill, storage.dtype)) if idx else data
    return np.asarray(out, storage.dtype).reshape(shape)


def is_range_out_of_bounds_for_shape(rnge, shape) -> bool:
    """Whether ``rnge`` (ints and slices, one per dimension) reaches outside ``shape``."""
    for n, r in zip(shape, rnge, strict=True):
        if isinstance(r, (int, np.integer)):
            if r >= n:
                return True
        elif isinstance(r, slice):
            start = 0 if r.start is None else r.start
            step = 1 if r.step is None else r.step
            count = max(0, (r.stop - start + step - 1) // step)
            if count > 0 and start + (count - 1) * step >= n:
                return True
        else:
            raise ValueError(f"Unsupported range type: {type(r)}.")
    return False


# -- uninitialised values and padding -------------------------------------------------


def uninitialized_value(dtype, mode: str):
    """What new memory holds: NaN (floats), the largest value (integers), True (bools);
    or zero with ``mode="zero"``."""
    dtype = np.dtype(dtype)
    if mode == "zero":
        return np.zeros((), dtype)[()]
    if np.issubdtype(dtype, np.floating) or dtype.name in ("bfloat16",) or (
            "float" in dtype.name):
        return np.asarray(np.nan, dtype)[()]
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).max
    if dtype == np.bool_:
        return True
    return np.zeros((), dtype)[()]


def uninitialized_array(shape, dtype, mode: str) -> np.ndarray:
    return np.full(tuple(shape), uninitialized_value(dtype, mode), np.dtype(dtype))


def _generation(device_kind: str | None) -> int:
    if not device_kind:
        return 6
    digits = "".join(ch for ch in device_kind.split("v")[-1] if ch.isdigit())
    return int(digits) if digits else 6


def padded_shape(shape, dtype) -> tuple[int, ...]:
    """``shape`` rounded up to the tiling of the simulated chip (the abstract mesh's device
    kind, e.g. ``jax.sharding.use_abstract_mesh`` with a 'TPU v6e' device)."""
    shape = tuple(int(n) for n in shape)
    if not shape:
        return shape
    itemsize = np.dtype(dtype).itemsize
    packing = max(1, 4 // itemsize)
    gen = _generation(jc.device_kind_of_abstract_mesh())
    base = (1 + int(gen < 4)) * packing
    if len(shape) == 1:
        tile = (base * 128,)
    else:
        sub = base
        while sub < min(shape[-2], 8 * packing):
            sub *= 2
        tile = (1,) * (len(shape) - 2) + (sub, 128)
    return tuple(-(-n // t) * t for n, t in zip(shape, tile))
