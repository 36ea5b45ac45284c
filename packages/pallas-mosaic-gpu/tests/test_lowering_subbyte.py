"""int4/uint4 are integers of 4 bits to the lowering: their MLIR type is ``i4`` and their
conversions are integer ones (sign- or zero-extending), not float ones; numpy calls
them kind ``V`` with a whole byte of itemsize, which must not leak into the lowering."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jaxlib.mlir import ir

import pallas as pl
import pallas.plugins
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.backend import params
from pallas_mosaic_gpu._src.executor.launch import module_of
from pallas_mosaic_gpu._src.lowering import build
from pallas_mosaic_gpu._src.lowering import values as V

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")


@pytest.mark.parametrize("dtype,kind", [(jnp.int4, "i"), (jnp.uint4, "u")])
def test_int4_and_uint4_are_4_bit_integers(dtype, kind):
    assert V.kind(dtype) == kind
    assert V.bits(dtype) == 4
    with ir.Context():
        assert V.elem_type(dtype) == ir.IntegerType.get_signless(4)


def _upcast_module(small, large):
    shape = (64, 256)

    def body(x_gmem, o_gmem):
        o_gmem[...] = plgpu.load(x_gmem, (), layout=plgpu.Layout.WGMMA,
                                 optimized=False).astype(large)

    f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(shape, large))
    x = jax.ShapeDtypeStruct(shape, small)
    (eqn,) = [e for e in jax.make_jaxpr(f)(x).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    return str(module_of(build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k")))


@pytest.mark.parametrize("small", [jnp.int4, jnp.uint4])
@pytest.mark.parametrize("large", [jnp.float16, jnp.bfloat16, jnp.float32, jnp.int8,
                                   jnp.int16, jnp.int32])
def test_a_4_bit_array_upcasts_in_a_module_that_verifies(small, large):
    # (build verifies the module; an i4 converted as a float failed verification)
    assert "xi4>" in _upcast_module(small, large)


@pytest.mark.parametrize("small,op", [(jnp.int4, "arith.sitofp"), (jnp.uint4, "arith.uitofp")])
def test_a_4_bit_array_converts_to_f32_as_a_signed_or_unsigned_integer(small, op):
    lines = [ln for ln in _upcast_module(small, jnp.float32).splitlines() if "xi4>" in ln]
    assert any(op in ln for ln in lines)
    assert not any("arith.extf" in ln for ln in lines)
