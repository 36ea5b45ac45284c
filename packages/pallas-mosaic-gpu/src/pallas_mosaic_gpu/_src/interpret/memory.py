"""Buffers of GPU interpret mode, and the regions that ref accesses touch.

A :class:`Buffer` holds the current contents of one allocation (a GMEM operand, an SMEM
scratch buffer, a barrier array). A kernel reads and writes it through a ref with
transforms (``ref.at[...]``, bitcasts, reshapes); :func:`access_region` turns the
transforms into the box of elements touched, which the race detector compares and the
out-of-bounds check validates.
"""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_mosaic_gpu._src import jax_compat as jc

_keys = itertools.count()


def fill_value(dtype, mode: str):
    """The contents of fresh memory: NaN (ints: their max, bools: True) or zero."""
    dtype = jnp.dtype(dtype)
    if mode == "zero":
        return jnp.zeros((), dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.array(jnp.nan, dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.array(jnp.iinfo(dtype).max, dtype)
    if dtype == jnp.bool_:
        return jnp.array(True)
    return jnp.zeros((), dtype)


class Buffer:
    """One allocation: ``value`` (a jax array), where it lives, and a readable name.

    ``sync`` holds per-element synchronisation state for barrier and semaphore buffers;
    ``sym`` names the allocation alike on every device (symmetric memory: a kernel
    operand, scratch buffer, ...), so that other devices can address it.
    """

    __slots__ = ("key", "name", "space", "value", "sync", "group", "sym", "memref")

    def __init__(self, name: str, space: Any, value, sync=None, group=None, sym=None):
        self.key = next(_keys)
        self.name = name
        self.space = space
        self.value = value
        self.sync = sync
        self.group = group  # the allocation's sharing group (collective scratch), if any
        self.sym = sym
        self.memref = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(jnp.shape(self.value))

    def __repr__(self) -> str:
        return f"Buffer({self.name}: {jax.typeof(self.value).str_short()} in {self.space})"


Region = tuple[tuple[int, int, int], ...]


def whole(shape) -> Region:
    return tuple((0, int(n), 1) for n in shape)


def _scalar(x) -> int | None:
    a = np.asarray(x)
    return int(a) if a.ndim == 0 else None


def _composed(shape, flat, tree):
    """``ref.at[...]`` indexers composed onto the buffer: (per base dim: a fixed index
    or (offset, stride, size)), or None for views that are not strided boxes (gathers,
    reshapes, bitcasts, traced offsets). An intermediate view may overhang the buffer
    (``x.at[pl.ds(start, k)]`` of which only an in-bounds block is used): only the
    composed box is what the access touches."""
    transforms = jax.tree_util.tree_unflatten(tree, flat) if tree is not None else ()
    # Each view dim maps to a base dim: (base dim, offset, stride, size).
    view = [(d, 0, 1, int(n)) for d, n in enumerate(shape)]
    fixed: dict[int, int] = {}
    for t in transforms:
        if not isinstance(t, jc.NDIndexer):
            return None
        new_view = []
        for (d, off, stride, _), idx in zip(view, t.indices):
            if isinstance(idx, jc.Slice):
                start, n, step = _scalar(idx.start), int(idx.size), int(idx.stride)
                if start is None:
                    return None
                new_view.append((d, off + start * stride, stride * step, n))
            else:
                i = _scalar(idx)
                if i is None:  # an index array (gather)
                    return None
                fixed[d] = off + i * stride
        view = new_view + view[len(t.indices):]
    by_base = {d: (off, stride, n) for d, off, stride, n in view}
    if any(stride <= 0 for _, stride, _ in by_base.values()):
        return None
    return [fixed[d] if d in fixed else by_base[d] for d in range(len(shape))]


def access_region(shape, flat, tree) -> tuple[Region, bool]:
    """The box of a buffer of ``shape`` that a ref with these transforms touches, and
    whether it lies within the buffer. Views that are not strided boxes (gathers,
    reshapes, bitcasts) touch the whole buffer, conservatively."""
    dims_of = _composed(shape, flat, tree)
    if dims_of is None:
        return whole(shape), True
    dims, ok = [], True
    for n, d in zip(shape, dims_of):
        if isinstance(d, int):
            ok &= 0 <= d < n
            dims.append((d, d + 1, 1))
        else:
            off, stride, size = d
            end = off + (size - 1) * stride + 1 if size else off
            ok &= size == 0 or (off >= 0 and end <= n)
            dims.append((off, end, stride))
    return tuple(dims), bool(ok)


def box_index(shape, flat, tree) -> tuple | None:
    """The basic numpy index of the in-bounds box a ref view touches (fixed dims as
    ints), or None where ``jc.get_view``/``jc.set_view`` must apply the transforms."""
    dims_of = _composed(shape, flat, tree)
    region, ok = access_region(shape, flat, tree)
    if dims_of is None or not ok:
        return None
    return tuple(d if isinstance(d, int) else slice(s, e, p)
                 for d, (s, e, p) in zip(dims_of, region))


def _host_view(buf, flat, tree):
    """For a buffer held in numpy (several devices, see :mod:`.devices`): the numpy view
    of its value that the ref view's leading ``ref.reshape(...)`` transforms give, and
    the numpy index of the box the remaining transforms touch; None if not a box."""
    if not isinstance(buf.value, np.ndarray):
        return None
    transforms = list(jax.tree_util.tree_unflatten(tree, flat)) if tree is not None else []
    shape = buf.shape
    while transforms and isinstance(transforms[0], jc.ReshapeTransform):
        shape = tuple(transforms.pop(0).shape)
    rflat, rtree = jax.tree_util.tree_flatten(transforms)
    idx = box_index(shape, rflat, rtree)
    return None if idx is None else (buf.value.reshape(shape), idx)


def get_view(buf, flat, tree):
    """The part of ``buf``'s value a ref view reads."""
    host = _host_view(buf, flat, tree)
    if host is not None:
        view, idx = host
        return view[idx].copy()
    idx = box_index(buf.shape, flat, tree)
    return jc.get_view(buf.value, flat, tree) if idx is None else buf.value[idx]


def set_view(buf, new, flat, tree):
    """``buf``'s value with the part a ref view sees replaced by ``new``."""
    host = _host_view(buf, flat, tree)
    if host is not None:  # in place: nobody holds the old value
        view, idx = host
        view[idx] = np.broadcast_to(np.asarray(new, view.dtype), view[idx].shape)
        return buf.value
    idx = box_index(buf.shape, flat, tree)
    if idx is None:
        return jc.set_view(buf.value, jnp.asarray(new, buf.value.dtype), flat, tree)
    value = jnp.asarray(buf.value)
    part = value[idx]
    return value.at[idx].set(jnp.broadcast_to(jnp.asarray(new, buf.value.dtype),
                                                  part.shape))


def _clip(shape, flat, tree):
    """For a TMA box that may overhang its GMEM array: (index of the in-bounds part in
    the array, index of that part in the box, the box's shape), or None when the view
    is no contiguous box (then it must lie in bounds)."""
    dims_of = _composed(shape, flat, tree)
    if dims_of is None:
        return None
    base, part, box = [], [], []
    for n, d in zip(shape, dims_of):
        if isinstance(d, int):
            if not 0 <= d < n:
                return (), (), None  # the whole box lies outside
            base.append(d)
            continue
        off, stride, size = d
        if stride != 1:
            return None
        lo, hi = max(0, -off), max(0, min(size, n - off))
        hi = max(lo, hi)
        base.append(slice(off + lo, off + hi))
        part.append(slice(lo, hi))
        box.append(size)
    return tuple(base), tuple(part), tuple(box)


def clipped_region(shape, flat, tree) -> Region | None:
    """The part of a (possibly overhanging) TMA box inside its GMEM array, as a region
    (None: nothing is inside)."""
    c = _clip(shape, flat, tree)
    if c is None:
        return access_region(shape, flat, tree)[0]
    base, _, box = c
    if box is None or any(isinstance(b, slice) and b.stop <= b.start for b in base):
        return None
    return tuple((b, b + 1, 1) if isinstance(b, int) else (b.start, b.stop, 1) for b in base)


def clipped_get(buf, flat, tree):
    """What a TMA load reads through a box that may overhang its GMEM array: the
    elements outside are zeros, as the hardware fills them."""
    c = _clip(buf.shape, flat, tree)
    if c is None:
        return get_view(buf, flat, tree)
    base, part, box = c
    if box is None:
        return jnp.zeros(access_view_shape(buf.shape, flat, tree), buf.value.dtype)
    if isinstance(buf.value, np.ndarray):
        out = np.zeros(box, buf.value.dtype)
        out[part] = buf.value[base]
        return out
    out = jnp.zeros(box, buf.value.dtype)
    return out.at[part].set(jnp.asarray(buf.value)[base])


def clipped_set(buf, new, flat, tree):
    """``buf``'s value after a TMA store through a box that may overhang it: the
    elements outside are dropped, as the hardware drops them."""
    c = _clip(buf.shape, flat, tree)
    if c is None:
        return set_view(buf, new, flat, tree)
    base, part, box = c
    if isinstance(buf.value, np.ndarray):  # in place (see set_view)
        if box is not None:
            buf.value[base] = np.broadcast_to(np.asarray(new, buf.value.dtype), box)[part]
        return buf.value
    value = jnp.asarray(buf.value)
    if box is None:
        return value
    new = jnp.broadcast_to(jnp.asarray(new, value.dtype), box)
    return value.at[base].set(new[part])


def access_view_shape(shape, flat, tree) -> tuple[int, ...]:
    """The shape a ref view has (its non-indexed dims)."""
    dims_of = _composed(shape, flat, tree) or []
    return tuple(d[2] for d in dims_of if not isinstance(d, int))


def describe_region(region: Region) -> str:
    return "[" + ", ".join(f"{s}:{e}" + (f":{p}" if p != 1 else "") for s, e, p in region) + "]"
