"""Reading and writing an array through a ref's transforms, for the interpreters.

A ref view (``ref.at[...]``, ``ref.reshape(...)``, ``ref.bitcast(...)``) is a chain of
JAX state transforms: indexers, reshapes and bitcasts. JAX's own state discharge reads
through all three but writes only through indexers; a kernel that stores into, or DMAs
into, a reshaped or bitcast view needs the write too. A write goes down the chain,
taking each intermediate view, and comes back up, putting the new view into its parent
with the inverse of each step (an indexer's scatter, the reshape back, the bitcast back).
Chains of indexers alone go straight to JAX's rules (which also handle gathers and
repeated indices for ``addupdate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas._src import jax_compat as jc


def _transforms(flat: Sequence[Any], tree) -> list:
    if tree is None:
        return []
    return [t for t in jax.tree_util.tree_unflatten(tree, list(flat)) if t is not None]


def _indexers_only(transforms: Sequence[Any]) -> bool:
    return all(isinstance(t, jc.NDIndexer) for t in transforms)


def _step(x, t):
    """The view of ``x`` through the one transform ``t``."""
    return jc.state_discharge.transform_array(x, [t])


def _unstep(parent, new_view, t):
    """``parent`` with its view through ``t`` replaced by ``new_view``."""
    if isinstance(t, jc.NDIndexer):
        return jc.state_discharge.transform_swap_array(parent, [t], new_view)[1]
    if isinstance(t, jc.ReshapeTransform):
        return jnp.reshape(new_view, jnp.shape(parent))
    if isinstance(t, jc.BitcastTransform):
        return jc.state_bitcast(new_view, jnp.result_type(parent))
    raise NotImplementedError(f"Unsupported ref transform in a write: {t}")


def read(x, transforms: Sequence[Any]):
    """What a ref holding ``x`` shows through ``transforms``."""
    return jc.state_discharge.transform_array(x, list(transforms))


def swap(x, val, transforms: Sequence[Any]):
    """``(old, new_x)``: the view's old contents, and ``x`` with the view set to ``val``."""
    transforms = list(transforms)
    if _indexers_only(transforms):
        return jc.state_discharge.transform_swap_array(x, transforms, val)
    chain = [x]
    for t in transforms:
        chain.append(_step(chain[-1], t))
    old, new = chain[-1], val
    for parent, t in zip(reversed(chain[:-1]), reversed(transforms)):
        new = _unstep(parent, new, t)
    return old, new


def add(x, val, transforms: Sequence[Any]):
    """``x`` with ``val`` added to its view through ``transforms``."""
    transforms = list(transforms)
    if len(transforms) <= 1 and _indexers_only(transforms):
        flat, tree = jax.tree_util.tree_flatten(transforms)
        return jc.state_discharge._addupdate_discharge(x, val, flat, tree)
    *outer, last = transforms
    parent = read(x, outer)
    _, new = swap(x, add(parent, val, [last]), outer)
    return new


# -- flattened forms, as the state primitives carry them (``*indices, tree=...``) --------


def read_flat(x, flat: Sequence[Any], tree):
    return read(x, _transforms(flat, tree))


def swap_flat(x, val, flat: Sequence[Any], tree):
    return swap(x, val, _transforms(flat, tree))


def add_flat(x, val, flat: Sequence[Any], tree):
    return add(x, val, _transforms(flat, tree))


def has_layout_transform(flat: Sequence[Any], tree) -> bool:
    """Whether the chain reshapes or bitcasts (which per-element masks cannot follow)."""
    return not _indexers_only(_transforms(flat, tree))


# -- initialisation masks (the uninitialised-read check) ---------------------------------
# A mask has one bool per element of the cell. Indexers and reshapes move masks as they
# move values; a bitcast regroups elements, so through one the mask travels as bits: each
# cell element is all ones when written, and a viewed element is written when all of its
# bits are.


def _has_bitcast(transforms) -> bool:
    return any(isinstance(t, jc.BitcastTransform) for t in transforms)


def _bits_dtype(dtype):
    return jnp.dtype(f"uint{jnp.dtype(dtype).itemsize * 8}")


def _ones(bits_dtype):
    return jnp.array(np.iinfo(bits_dtype).max, bits_dtype)


def _as_bits(mask, dtype):
    ones = _ones(_bits_dtype(dtype))
    return jax.lax.bitcast_convert_type(jnp.where(mask, ones, jnp.zeros_like(ones)), dtype)


def _all_bits(view):
    bits = jax.lax.bitcast_convert_type(view, _bits_dtype(view.dtype))
    return bits == _ones(bits.dtype)


def read_mask(mask, dtype, flat: Sequence[Any], tree):
    """Which elements of the view are initialised (a cell of ``dtype`` with ``mask``)."""
    transforms = _transforms(flat, tree)
    if not _has_bitcast(transforms):
        return read(mask, transforms)
    return _all_bits(read(_as_bits(mask, dtype), transforms))


def written_mask(mask, dtype, flat: Sequence[Any], tree):
    """``mask`` after a write of the whole view."""
    transforms = _transforms(flat, tree)
    if not _has_bitcast(transforms):
        view = read(mask, transforms)
        return swap(mask, jnp.ones(jnp.shape(view), jnp.bool_), transforms)[1]
    bits = _as_bits(mask, dtype)
    view = read(bits, transforms)
    ones = _as_bits(jnp.ones(jnp.shape(view), jnp.bool_), view.dtype)
    return _all_bits(swap(bits, ones, transforms)[1])


# -- interpreter cells (``.value``, and ``.init`` where the uninitialised-read check keeps
# a mask), as the interpreters' rules read and write them -------------------------------


def read_cell(cell, flat: Sequence[Any], tree):
    """What the view of ``cell`` shows, as a JAX array (a backend's interpret mode may
    keep numpy arrays in its cells)."""
    return jnp.asarray(read_flat(cell.value, flat, tree))


def write_cell(cell, flat: Sequence[Any], tree, new):
    """Writes ``new`` into the view of ``cell``, marking its elements written where the
    cell keeps an ``init`` mask; returns the view's old contents."""
    old, cell.value = swap_flat(cell.value, new, flat, tree)
    if getattr(cell, "init", None) is not None:
        cell.init = written_mask(cell.init, jnp.result_type(cell.value), flat, tree)
    return old
