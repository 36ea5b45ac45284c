"""Helpers shared by primitives that take refs: flatten a (transformed) ref for binding."""

from __future__ import annotations

import jax
import numpy as np

from pallas_tpu._src import jax_compat as jc


def ref_and_transforms(ref):
    """(base ref, tuple of transforms) of a ref or a ``ref.at[...]`` view."""
    if isinstance(ref, jc.TransformedRef):
        return ref.ref, tuple(ref.transforms)
    return ref, ()


def flatten_ref(ref):
    """(base ref, flat transform leaves, transform treedef)."""
    from pallas_tpu._src.primitives.dma_indexed import wrap_ref_indices

    base, transforms = ref_and_transforms(ref)
    flat, tree = jax.tree_util.tree_flatten(wrap_ref_indices(transforms))
    return base, list(flat), tree


def view_aval(ref):
    """The ShapedArray that reading ``ref`` (with its transforms) would produce."""
    base, transforms = ref_and_transforms(ref)
    aval = jax.typeof(base)
    return jc.transform_type(list(transforms), aval.inner_aval)


def view_aval_from(base_aval, flat, tree):
    transforms = jax.tree_util.tree_unflatten(tree, flat)
    return jc.transform_type(list(transforms), base_aval.inner_aval)


def nbytes(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


class FlatRefs:
    """Packs several (transformed) refs into one operand list and unpacks them again."""

    def __init__(self, *refs):
        self.operands: list = []
        self.layout: list = []  # (base position, number of transform leaves, tree)
        for r in refs:
            if r is None:
                self.layout.append(None)
                continue
            base, flat, tree = flatten_ref(r)
            self.layout.append((len(self.operands), len(flat), tree))
            self.operands += [base, *flat]

    @property
    def spec(self) -> tuple:
        return tuple(self.layout)


def unflatten(spec, operands):
    """For each entry of ``spec``: (base, flat transforms, tree) or None."""
    out = []
    for entry in spec:
        if entry is None:
            out.append(None)
            continue
        pos, n, tree = entry
        out.append((operands[pos], list(operands[pos + 1 : pos + 1 + n]), tree))
    return out


def spec_end(spec) -> int:
    """The number of operands used by ``spec``."""
    end = 0
    for entry in spec:
        if entry is not None:
            end = max(end, entry[0] + 1 + entry[1])
    return end
