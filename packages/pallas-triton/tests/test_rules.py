"""pallas-triton's lowering table: one table keyed by primitive objects, a rule or a
declared reason for every pallas-core primitive, and errors naming primitive, kernel and
source line."""

import re

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_triton as pltriton
from pallas import plugins
from pallas_triton._src.lowering import RULES


def test_every_core_primitive_has_a_triton_rule_or_a_reason():
    assert RULES.missing(plugins.PRIMITIVES) == []
    for p in plugins.PRIMITIVES:
        assert p in RULES or RULES.unsupported_reason(p), p.name


def test_rules_are_found_by_the_primitive_object():
    from jax import lax

    from pallas_triton._src import primitives

    for p in (lax.add_p, lax.dot_general_p, lax.while_p, plugins.load_p, plugins.swap_p,
              plugins.program_id_p, plugins.atomic_rmw_p, primitives.debug_barrier_p,
              primitives.elementwise_inline_asm_p):
        assert p in RULES, p.name
    assert {owner for p in RULES for owner in RULES.owners(p)} == {"pallas_triton"}


def test_an_unsupported_primitive_error_names_the_kernel_and_the_source_line():
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sort(x_ref[...])  # the line the error names

    line = kernel.__code__.co_firstlineno + 1
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16,), jnp.float32),
                       name="sorter")
    with pytest.raises(pltriton.TritonLoweringError) as info:
        pltriton.inspect(f, jnp.zeros((16,)))
    msg = str(info.value)
    assert "'sort'" in msg and "sort outside the kernel" in msg
    assert "in kernel sorter" in msg
    assert re.search(rf"test_rules\.py:{line}\b", msg), msg


def test_an_error_inside_control_flow_names_the_inner_line_once():
    def kernel(x_ref, o_ref):
        def body(i, acc):
            return acc + jnp.sort(x_ref[...])  # the line the error names

        o_ref[...] = jax.lax.fori_loop(0, 2, body, jnp.zeros((16,), jnp.float32))

    line = kernel.__code__.co_firstlineno + 2
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16,), jnp.float32))
    with pytest.raises(pltriton.TritonLoweringError) as info:
        pltriton.inspect(f, jnp.zeros((16,)))
    msg = str(info.value)
    assert re.search(rf"test_rules\.py:{line}\b", msg), msg
    assert msg.count("(lowering ") == 1


def test_sharding_annotations_jax_inserts_under_a_mesh_lower_as_no_ops():
    """Under ``jax.set_mesh`` (as when compiling for a mesh of devices), ``jnp.where`` in
    a kernel inserts ``reshard``; it annotates, so it lowers to nothing (upstream's
    RMS norm kernel has one)."""
    import numpy as np

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))

    def kernel(x_ref, o_ref):
        x = x_ref[...]
        o_ref[...] = jnp.where(x > 0, x, 0.0)

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((256,), jnp.float32),
                       backend="triton")
    x = jax.ShapeDtypeStruct((256,), jnp.float32,
                             sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    with jax.set_mesh(mesh):
        assert "reshard" in str(jax.make_jaxpr(f)(x))
        text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "triton" in text
