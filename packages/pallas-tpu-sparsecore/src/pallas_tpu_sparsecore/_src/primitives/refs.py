"""Helpers shared by the ref-taking SparseCore primitives: argument checks, flattening a
``ref.at[...]`` view into primitive operands, and reading/writing the view of a cell."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pallas_tpu_sparsecore._src import jax_compat as jc


def is_ref(x) -> bool:
    if isinstance(x, jc.TransformedRef):
        return True
    try:
        return isinstance(jax.typeof(x), jc.AbstractRef)
    except TypeError:
        return False


def check_ref(fn: str, name: str, ref) -> None:
    if not is_ref(ref):
        raise TypeError(
            f"{fn}: {name} must be a ref (a kernel argument, scratch buffer or "
            f"ref.at[...] view); got {type(ref).__name__}")


def flatten_ref(ref) -> tuple[Any, list, Any, Any]:
    """(base ref, flat transform leaves, their treedef, the view's aval)."""
    base, transforms = jc.ref_and_transforms(ref)
    flat, tree = jax.tree_util.tree_flatten(transforms)
    view = jc.transformed_aval(jax.typeof(base), transforms)
    return base, flat, tree, view


def view_aval(ref_aval, flat_avals, tree):
    """The aval of a ref seen through transforms given as flat avals (abstract eval)."""
    transforms = jax.tree_util.tree_unflatten(tree, flat_avals)
    return jc.transformed_aval(ref_aval, transforms)


def as_array(fn: str, name: str, x):
    """``x`` as a JAX array, or a TypeError naming the argument."""
    try:
        return jnp.asarray(x)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be an array; got {type(x).__name__}") from None


def check_mask(fn: str, mask, shape) -> Any:
    mask = as_array(fn, "mask", mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"{fn}: mask must be a bool array of shape {tuple(shape)}; got "
                        f"{mask.dtype.name}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{fn}: mask must have shape {tuple(shape)}; got {mask.shape}")
    return mask
