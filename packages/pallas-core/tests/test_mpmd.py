"""``pallas.mpmd.mpmd_map`` (several programs, each on its own mesh), and ``pl.kernel``
over an upstream-style mesh object (``shape``, ``core_type``, ``default_memory_space``)
whose backend is the one claiming its ``core_type``."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
from pallas.mpmd import mpmd_map

SDS = jax.ShapeDtypeStruct


def _mesh(**axes):
    return pallas.plugins.CoreMesh(**axes)


def test_one_pair_is_pl_kernel():
    x = jnp.arange(8, dtype=jnp.float32)

    def body(x_ref, o_ref):
        c = jax.lax.axis_index("c")
        o_ref[pl.ds(c * 4, 4)] = x_ref[pl.ds(c * 4, 4)] + 1

    out = mpmd_map([(_mesh(c=2), body)], out_types=SDS.like(x), interpret=True)(x)
    np.testing.assert_array_equal(out, np.arange(8) + 1)


def test_later_programs_see_what_earlier_ones_wrote():
    x = jnp.arange(4, dtype=jnp.int32)

    def producer(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 10

    def consumer(x_ref, o_ref):  # runs on a different mesh, after the producer
        c = jax.lax.axis_index("s")
        o_ref[pl.ds(c, 1)] = o_ref[pl.ds(c, 1)] + x_ref[pl.ds(c, 1)]

    out = mpmd_map([(_mesh(p=1), producer), (_mesh(s=4), consumer)],
                   out_types=SDS.like(x), interpret=True)(x)
    np.testing.assert_array_equal(out, np.arange(4) * 11)


def test_several_pairs_are_not_lowered_by_a_backend():
    run = mpmd_map([(_mesh(a=1), lambda o: None), (_mesh(b=1), lambda o: None)],
                   out_types=SDS((4,), jnp.float32))
    with pytest.raises(NotImplementedError, match="run only by the interpreter"):
        run()


def test_bad_pairs_are_clear_errors():
    with pytest.raises(ValueError, match="At least one mesh/function pair is required"):
        mpmd_map([])
    with pytest.raises(TypeError, match=r"meshes_and_fns\[0\] must be a \(mesh, function\)"):
        mpmd_map([(_mesh(a=1),)])
    with pytest.raises(TypeError, match="mesh must be a pl.Mesh .* or have a mapping `shape`"):
        mpmd_map([(object(), lambda: None)])


def _duck_mesh(core_type):
    return types.SimpleNamespace(shape={"x": 2}, core_type=core_type,
                                 default_memory_space=pl.ANY)


def test_kernel_over_an_upstream_style_mesh_object_runs_in_the_interpreter():
    @pl.kernel(out_type=SDS((2,), jnp.int32), mesh=_duck_mesh("anything"), interpret=True)
    def k(o_ref):
        i = jax.lax.axis_index("x")
        o_ref[pl.ds(i, 1)] = jnp.full((1,), i + 5, jnp.int32)

    np.testing.assert_array_equal(k(), [5, 6])


def test_kernel_over_a_mesh_object_picks_the_backend_claiming_its_core_type(clean_registry):
    b = pallas.plugins.Backend(name="claims_sc", version="1", platforms=("cpu",),
                               core_types=("my_core",))
    pallas.plugins.register_backend(b)
    k = pl.kernel(lambda o: None, SDS((2,), jnp.float32), mesh=_duck_mesh("my_core"))
    with pytest.raises(NotImplementedError, match="backend 'claims_sc' does not implement"):
        jax.jit(k).lower()
    with pytest.raises(pallas.plugins.BackendNotFoundError,
                       match=r"core_type 'other'.*my_core \(claims_sc\)"):
        pl.kernel(lambda o: None, SDS((2,), jnp.float32), mesh=_duck_mesh("other"))()
