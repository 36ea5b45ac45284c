"""``CompilerParams(lowering_semantics=...)``: a kernel is the same warpgroup-level array
program under ``Lane`` and ``Warpgroup`` semantics, so both lower through the same
engine to the same module; layout casts change no value; what cannot be lowered says
which semantics the kernel asked for."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.lowering import MosaicGpuLoweringError, build
from pallas_mosaic_gpu._src.lowering.kernel import semantics_of

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F32 = jnp.float32
LANE, WG = plgpu.LoweringSemantics.Lane, plgpu.LoweringSemantics.Warpgroup


def _lower(f, *args) -> str:
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _kernel_of(f, *args):
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    from pallas_mosaic_gpu._src.backend import params

    p = eqn.params
    return build(p["jaxpr"], p["grid_mapping"], params(p["compiler_params"]), "k")


def _row_softmax(semantics, interpret=False):
    """Exp, a row reduction, scalar arithmetic from SMEM, iota and a where: the array
    ops a kernel author writes the same way under either semantics."""

    def kernel(x_ref, s_ref, o_ref):
        x = x_ref[...]
        e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
        scale = s_ref[0, 0] * 2.0  # a scalar (rank 0) value
        cols = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
        o_ref[...] = jnp.where(cols < 100, e / jnp.sum(e, axis=1, keepdims=True), 0.0) * scale

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((32, 128), F32), grid=(4,),
        in_specs=[spec, pl.BlockSpec((1, 128), lambda i: (0, 0))], out_specs=spec,
        compiler_params=plgpu.CompilerParams(lowering_semantics=semantics),
        interpret=interpret)


def test_warpgroup_semantics_lower_to_the_same_module_as_lane_semantics():
    x, s = jax.random.normal(jax.random.key(0), (32, 128), F32), jnp.full((1, 128), 0.5, F32)
    lane, wg = _lower(_row_softmax(LANE), x, s), _lower(_row_softmax(WG), x, s)
    assert "custom_call @mosaic_gpu_v2" in wg
    assert wg == lane
    assert _kernel_of(_row_softmax(WG), x, s).primitives >= {"iota", "reduce_max", "exp"}


def test_warpgroup_semantics_compute_what_lane_semantics_compute():
    x, s = jax.random.normal(jax.random.key(0), (32, 128), F32), jnp.full((1, 128), 0.5, F32)
    got = _row_softmax(WG, interpret=True)(x, s)
    want = jnp.where(jnp.arange(128) < 100, jax.nn.softmax(x, axis=1), 0.0)
    assert jnp.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("semantics", [LANE, WG], ids=["lane", "warpgroup"])
def test_layout_casts_loads_and_iotas_with_a_layout_change_no_value(semantics):
    def kernel(x_ref, o_ref):
        strided = plgpu.Layout.WG_STRIDED((64, 128), vec_size=2)
        x = plgpu.load(x_ref, (), layout=strided)
        rows = plgpu.broadcasted_iota(F32, (64, 128), 0, layout=strided)
        o_ref[...] = plgpu.layout_cast(x + rows, strided)

    def f(interpret):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((64, 128), F32),
            compiler_params=plgpu.CompilerParams(lowering_semantics=semantics),
            interpret=plgpu.InterpretParams() if interpret else False)

    x = jax.random.normal(jax.random.key(1), (64, 128), F32)
    assert "mgpu_layout_cast" in _kernel_of(f(False), x).primitives
    assert "custom_call @mosaic_gpu_v2" in _lower(f(False), x)
    assert jnp.array_equal(f(True)(x), x + jnp.arange(64, dtype=F32)[:, None])


def test_what_cannot_be_lowered_names_the_primitive_the_backend_and_the_semantics():
    def kernel(x_ref, o_ref):
        pl.debug_print("x[0] = {}", x_ref[0])
        o_ref[...] = x_ref[...]

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128,), F32),
                       compiler_params=plgpu.CompilerParams(lowering_semantics=WG))
    with pytest.raises(MosaicGpuLoweringError,
                       match=r"backend 'mosaic_gpu'.*'debug_print'") as e:
        _lower(f, jnp.zeros((128,), F32))
    assert "LoweringSemantics.Warpgroup" in str(e.value)


def test_the_semantics_is_read_from_the_compiler_params():
    assert semantics_of(None) == "lane"
    assert semantics_of(plgpu.CompilerParams()) == "lane"
    assert semantics_of(plgpu.CompilerParams(lowering_semantics=WG)) == "warpgroup"
