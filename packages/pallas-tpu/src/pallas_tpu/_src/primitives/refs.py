"""Helpers shared by primitives that take refs: flatten a (transformed) ref for binding."""

from __future__ import annotations

import jax
import numpy as np

from pallas import plugins
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.primitives.dma_indexed import wrap_ref_indices

ref_and_transforms = plugins.ref_and_transforms
unflatten = plugins.unpack_ref_operands
spec_end = plugins.ref_operands_end


def flatten_ref(ref):
    """(base ref, flat transform leaves, transform treedef)."""
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
    # (extended dtypes, typed PRNG keys, know their own size; np.dtype does not know them)
    return int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize


class FlatRefs(plugins.RefOperands):
    """Packs several (transformed) refs into one operand list (index arrays of indexed
    DMAs become pytree leaves)."""

    def __init__(self, *refs):
        super().__init__(*refs, wrap=wrap_ref_indices)
