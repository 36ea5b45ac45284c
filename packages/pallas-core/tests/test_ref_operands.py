"""``pallas.plugins.RefOperands``: backends bind refs (and ``ref.at`` views) as a base
ref followed by its transforms' leaves, and read them back by a static layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas import plugins


def _refs():
    """Two kernel refs, traced, handed to ``body``."""
    out = {}

    def kernel(a_ref, b_ref, o_ref):
        out["packed"] = plugins.RefOperands(a_ref.at[pl.ds(2, 4)], None, b_ref)
        out["a"], out["b"] = a_ref, b_ref
        o_ref[...] = a_ref[...]

    jax.make_jaxpr(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
                                  interpret=True))(jnp.zeros(8), jnp.zeros(8))
    return out


def test_a_view_packs_as_its_base_ref_then_its_transform_leaves():
    got = _refs()
    packed = got["packed"]
    first, missing, second = plugins.unpack_ref_operands(packed.spec, packed.operands)
    assert first[0] is got["a"] and missing is None and second == (got["b"], [], second[2])
    (indexer,) = jax.tree_util.tree_unflatten(first[2], first[1])
    assert indexer.indices[0].size == 4


def test_the_layout_says_how_many_operands_the_refs_use():
    packed = _refs()["packed"]
    assert plugins.ref_operands_end(packed.spec) == len(packed.operands)
    assert plugins.ref_operands_end((None,)) == 0


def test_wrap_rewrites_the_transforms_before_flattening():
    seen = []

    def kernel(a_ref, o_ref):
        plugins.RefOperands(a_ref, wrap=lambda t: seen.append(t) or t)
        o_ref[...] = a_ref[...]

    jax.make_jaxpr(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
                                  interpret=True))(jnp.zeros(8))
    assert seen == [()]
