"""Refs as primitive operands: a (possibly ``ref.at[...]``-transformed) ref is bound as
its base ref followed by the flat leaves of its transforms, with a static layout."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from pallas_mosaic_gpu._src import jax_compat as jc


def ref_and_transforms(ref: Any) -> tuple[Any, tuple]:
    """(base ref, tuple of transforms) of a ref or a ``ref.at[...]`` view."""
    if isinstance(ref, jc.TransformedRef):
        return ref.ref, tuple(ref.transforms)
    return ref, ()


def view_aval(ref: Any):
    """The ShapedArray that reading ``ref`` (with its transforms) would produce."""
    base, transforms = ref_and_transforms(ref)
    aval = jax.typeof(base)
    if not isinstance(aval, jc.AbstractRef):
        raise TypeError(f"expected a ref, got a value of type {aval.str_short()}")
    return jc.transform_type(list(transforms), aval.inner_aval)


def memory_space(ref: Any):
    base, _ = ref_and_transforms(ref)
    return getattr(jax.typeof(base), "memory_space", None)


def nbytes(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


class FlatRefs:
    """Packs several (transformed) refs, or None, into one operand list."""

    def __init__(self, *refs: Any):
        self.operands: list = []
        layout: list = []
        for r in refs:
            if r is None:
                layout.append(None)
                continue
            base, transforms = ref_and_transforms(r)
            flat, tree = jax.tree_util.tree_flatten(transforms)
            layout.append((len(self.operands), len(flat), tree))
            self.operands += [base, *flat]
        self.spec = tuple(layout)


def unflatten(spec, operands) -> list:
    """For each entry of ``spec``: (base, flat transforms, treedef), or None."""
    out = []
    for entry in spec:
        if entry is None:
            out.append(None)
            continue
        pos, n, tree = entry
        out.append((operands[pos], list(operands[pos + 1: pos + 1 + n]), tree))
    return out


def spec_end(spec) -> int:
    """The number of operands ``spec`` uses."""
    return max((e[0] + 1 + e[1] for e in spec if e is not None), default=0)


def ref_positions(spec) -> list[int]:
    """Operand positions of the base refs in ``spec``."""
    return [e[0] for e in spec if e is not None]
