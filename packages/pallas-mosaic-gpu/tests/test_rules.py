"""pallas-mosaic-gpu's lowering table: keyed by primitive objects like every backend's,
with a rule or a declared reason for every pallas-core primitive, and the reason quoted
in the error a kernel using it gets."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import pallas as pl
import pallas_mosaic_gpu as plgpu  # noqa: F401 - registers the backend's rules
from pallas import plugins
from pallas_mosaic_gpu._src.lowering import RULES, MosaicGpuLoweringError


def test_every_core_primitive_has_a_mosaic_gpu_rule_or_a_reason():
    assert RULES.missing(plugins.PRIMITIVES) == []
    for p in plugins.PRIMITIVES:
        assert p in RULES or RULES.unsupported_reason(p), p.name


def test_rules_are_found_by_the_primitive_object_and_owned_by_the_package():
    for p in (lax.add_p, lax.dot_general_p, lax.while_p, plugins.program_id_p):
        assert p in RULES, p.name
    assert {owner for p in RULES for owner in RULES.owners(p)} == {"pallas_mosaic_gpu"}


def test_a_declared_gap_is_quoted_in_the_lowering_error():
    def kernel(x_ref, o_ref):
        pl.debug_print("x[0] = {}", x_ref[0])
        o_ref[...] = x_ref[...]

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128,), jnp.float32),
                       backend="mosaic_gpu")
    with pytest.raises(MosaicGpuLoweringError,
                       match=r"'debug_print'.*interpret=True to print"):
        jax.jit(f).trace(jnp.zeros((128,), jnp.float32)).lower(
            lowering_platforms=("cuda",))
