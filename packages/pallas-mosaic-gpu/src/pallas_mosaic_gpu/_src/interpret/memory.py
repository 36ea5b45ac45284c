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

    ``sync`` holds per-element synchronisation state for barrier and semaphore buffers.
    """

    __slots__ = ("key", "name", "space", "value", "sync", "group")

    def __init__(self, name: str, space: Any, value, sync=None, group=None):
        self.key = next(_keys)
        self.name = name
        self.space = space
        self.value = value
        self.sync = sync
        self.group = group  # the allocation's sharing group (collective scratch), if any

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


def access_region(shape, flat, tree) -> tuple[Region, bool]:
    """The box of a buffer of ``shape`` that a ref with these transforms touches, and
    whether it lies within the buffer. Views that are not strided boxes (gathers,
    reshapes, bitcasts) touch the whole buffer, conservatively."""
    transforms = jax.tree_util.tree_unflatten(tree, flat) if tree is not None else ()
    # Each view dim maps to a base dim: (base dim, offset, stride, size).
    view = [(d, 0, 1, int(n)) for d, n in enumerate(shape)]
    fixed: dict[int, int] = {}
    in_bounds = True
    for t in transforms:
        if not isinstance(t, jc.NDIndexer):
            return whole(shape), True
        new_view = []
        for (d, off, stride, size), idx in zip(view, t.indices):
            if isinstance(idx, jc.Slice):
                start, n, step = _scalar(idx.start), int(idx.size), int(idx.stride)
                if start is None:
                    return whole(shape), True
                if start < 0 or (n and start + (n - 1) * step >= size):
                    in_bounds = False
                new_view.append((d, off + start * stride, stride * step, n))
            else:
                i = _scalar(idx)
                if i is None:  # an index array (gather)
                    return whole(shape), True
                if not 0 <= i < size:
                    in_bounds = False
                fixed[d] = off + i * stride
        view = new_view + view[len(t.indices):]
    dims = []
    by_base = {d: (off, stride, n) for d, off, stride, n in view}
    for d, n in enumerate(shape):
        if d in fixed:
            dims.append((fixed[d], fixed[d] + 1, 1))
        elif d in by_base:
            off, stride, size = by_base[d]
            if size == 0:
                dims.append((off, off, 1))
            elif stride > 0:
                dims.append((off, off + (size - 1) * stride + 1, stride))
            else:
                dims.append((0, int(n), 1))
        else:
            dims.append((0, int(n), 1))
    return tuple(dims), in_bounds


def describe_region(region: Region) -> str:
    return "[" + ", ".join(f"{s}:{e}" + (f":{p}" if p != 1 else "") for s, e, p in region) + "]"
