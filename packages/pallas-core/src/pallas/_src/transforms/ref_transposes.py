"""Transposes of the masked ref accesses (``pl.load``/``pl.store`` with ``mask``).

Reverse mode as kernels (:mod:`pallas._src.transforms.backward`) transposes a kernel
body with JAX's ``backward_pass3``, which looks up ``fancy_transposes`` for primitives
that touch refs. JAX has them for ``get``/``swap``/``addupdate``; these are the ones for
pallas-core's ``masked_load``/``masked_swap``. The cotangent buffers they update are
refs of the backward kernel, so every rule is itself a (masked) load and store that any
backend lowers.

- ``y = load(x_ref, idx, mask, other)``: ``y`` is ``x_ref[idx]`` where ``mask`` and
  ``other`` elsewhere; its transpose adds ``ct_y`` into ``ct_x_ref[idx]`` where ``mask``
  (a masked read-modify-write, so masked-off positions past an array edge are never
  touched), and gives ``other`` the cotangent ``where(mask, 0, ct_y)``.
- ``old = swap(x_ref, idx, val, mask)``: ``val`` gets ``ct_x_ref[idx]`` where ``mask``,
  and those positions of ``ct_x_ref`` become zero (the old contents were overwritten).
  A masked swap whose result (the old contents) is itself differentiated is refused
  (the cotangent would have to be added at masked-off positions, which may lie past
  the array's edge); the caller falls back to XLA.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.primitives import load_store


def _accum_ref(x):
    """The kernel ref a cotangent accumulator writes to, or None for a primal ref."""
    if isinstance(x, jc.ad.GradAccum):
        return x.inst().ref
    return None


def _split(rest, tree, n_extra):
    n = tree.num_leaves
    return list(rest[:n]), list(rest[n : n + n_extra])


def _masked_add(ref, idx, tree, g, mask):
    """``ref[idx] += g`` where ``mask`` (all positions when ``mask`` is None)."""
    extra = [] if mask is None else [mask]
    cur = load_store.load_p.bind(ref, *idx, *extra, tree=tree, has_mask=mask is not None,
                                 has_other=False, cache_modifier=None,
                                 eviction_policy=None, is_volatile=False)
    load_store.swap_p.bind(ref, cur + g, *idx, *extra, tree=tree,
                           has_mask=mask is not None, eviction_policy=None)


def _masked_load_transpose(g, ref_, *rest, tree, has_mask, has_other, **hints):
    if type(g) is jc.Zero:
        return
    idx, extra = _split(rest, tree, int(has_mask) + int(has_other))
    mask = extra[0] if has_mask else None
    other = extra[-1] if has_other else None
    ref = _accum_ref(ref_)
    if ref is not None:
        _masked_add(ref, idx, tree, g, mask)
    if isinstance(other, jc.ad.GradAccum):
        other.accum(g if mask is None else jnp.where(mask, jnp.zeros_like(g), g))


def _masked_swap_transpose(g, ref_, val, *rest, tree, has_mask, **hints):
    idx, extra = _split(rest, tree, int(has_mask))
    mask = extra[0] if has_mask else None
    ref = _accum_ref(ref_)
    if ref is None:
        if isinstance(val, jc.ad.GradAccum):
            raise NotImplementedError(
                "a differentiated value is stored into a ref that has no cotangent")
        return
    if mask is not None and type(g) is not jc.Zero:
        raise NotImplementedError(
            "the old contents returned by a masked pl.swap are differentiated")
    g = None if type(g) is jc.Zero else g
    m = [] if mask is None else [mask]
    ct_val = load_store.load_p.bind(ref, *idx, *m, tree=tree, has_mask=mask is not None,
                                    has_other=False, cache_modifier=None,
                                    eviction_policy=None, is_volatile=False)
    if mask is not None:
        ct_val = jnp.where(mask, ct_val, jnp.zeros_like(ct_val))
    new = jnp.zeros_like(ct_val) if g is None else g
    load_store.swap_p.bind(ref, new, *idx, *m, tree=tree, has_mask=mask is not None,
                           eviction_policy=None)
    if isinstance(val, jc.ad.GradAccum):
        val.accum(ct_val)


jc.ad.fancy_transposes[load_store.load_p] = _masked_load_transpose
jc.ad.fancy_transposes[load_store.swap_p] = _masked_swap_transpose
