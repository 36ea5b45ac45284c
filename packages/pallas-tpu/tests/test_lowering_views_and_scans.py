"""Lowering to Mosaic TPU, continued: strided and remote copies, cumulative ops, bitcasts,
scans over arrays, tangents, tile and compiler params in the emitted modules (the
``lower_tpu`` fixture decodes and verifies each module, as in test_lowering.py)."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas_tpu as pltpu
from pallas_tpu.inspect import backend_configs

F32 = jnp.float32
ANY = pltpu.MemorySpace.ANY


def _one_block(kernel, *shapes, out=None, **kw):
    """A grid-less pallas_call over whole arrays (for value-level op tests)."""
    out = out or jax.ShapeDtypeStruct(shapes[0].shape, shapes[0].dtype)
    return lambda *args: pl.pallas_call(kernel, out_shape=out, **kw)(*args)

def test_strided_loads_and_narrow_matmul_results(lower_tpu, ops):
    def kernel(x_ref, y_ref, o_ref, s_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...])  # bf16 result: f32 acc, then truncf
        s_ref[...] = x_ref[pl.ds(0, 8, stride=2), :].astype(F32)

    x = jnp.zeros((16, 128), jnp.bfloat16)
    y = jnp.zeros((128, 128), jnp.bfloat16)
    outs = (jax.ShapeDtypeStruct((16, 128), jnp.bfloat16), jax.ShapeDtypeStruct((8, 128), F32))
    _, (m,) = lower_tpu(_one_block(kernel, x, out=outs), x, y)
    names = collections.Counter(ops(m))
    assert names["tpu.strided_load"] == 1 and names["tpu.matmul"] == 1
    assert "-> vector<16x128xf32>" in str(m) and names["arith.truncf"] >= 1


def test_smem_holds_narrow_and_float8_scalars(lower_tpu):
    # Regression: bf16/fp8/int4 SMEM operands were refused at trace time ("SMEM holds
    # 32-bit values"); Mosaic (libtpu) loads, stores and converts them, as upstream runs.
    def kernel(x_ref, o_ref):
        o_ref[0] = x_ref[0].astype(jnp.float32)

    for dt, elem in ((jnp.bfloat16, "bf16"), (jnp.float8_e4m3fn, "f8E4M3FN"), (jnp.int4, "i4")):
        f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), F32),
                           in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                           out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
                           compiler_params=pltpu.CompilerParams())
        _, (m,) = lower_tpu(f, jnp.zeros((1,), dt))
        assert f"memref<1x{elem}, #tpu.memory_space<smem>>" in str(m)


def test_remote_copy_lowers_with_device_id(lower_tpu, ops):
    def kernel(x_hbm, o_hbm, send, recv):
        c = pltpu.make_async_remote_copy(x_hbm, o_hbm, send, recv, device_id=1,
                                         device_id_type=pl.DeviceIdType.LOGICAL)
        c.start()
        c.wait()

    x = jnp.zeros((8, 128), F32)
    f = _one_block(kernel, x, in_specs=[pl.BlockSpec(memory_space=ANY)],
                   out_specs=pl.BlockSpec(memory_space=ANY),
                   scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
    lowered, (m,) = lower_tpu(f, x)
    text = str(m)
    assert "tpu.enqueue_dma" in text and "source_semaphore" in text and "device_id" in text
    assert collections.Counter(ops(m))["tpu.wait_dma2"] == 2  # send and receive
    assert backend_configs(lowered)[0]["custom_call_config"].get("has_communication") is True


def test_cumulative_ops_lower_to_log_step_rotations(lower_tpu, ops):
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.cumsum(x_ref[...], axis=1) + lax.cummax(x_ref[...], axis=0)

    x = jnp.zeros((8, 128), F32)
    _, (m,) = lower_tpu(_one_block(kernel, x), x)
    names = collections.Counter(ops(m))
    assert names["tpu.dynamic_rotate"] == 7 + 3  # log2(128) lane steps, log2(8) sublane steps


def test_cumsum_runs_in_tpu_interpret_mode_like_jnp():
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.cumsum(x_ref[...], axis=1)

    x = jnp.arange(8 * 128, dtype=F32).reshape(8, 128) % 7
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, F32),
                         compiler_params=pltpu.CompilerParams())(x)
    np.testing.assert_allclose(out, jnp.cumsum(x, axis=1))


def test_reverse_cumsum_fails_with_a_clear_lowering_error(lower_tpu):
    def kernel(x_ref, o_ref):
        o_ref[...] = lax.cumsum(x_ref[...], axis=1, reverse=True)

    x = jnp.zeros((8, 128), F32)
    with pytest.raises(pltpu.LoweringException, match=r"cumsum\(reverse=True\)"):
        lower_tpu(_one_block(kernel, x), x)


def test_bitcasts_half_casts_and_integer_powers_lower(lower_tpu, ops):
    def kernel(x_ref, n_ref, o_ref, h_ref):
        x = x_ref[...]
        bits = lax.bitcast_convert_type(x, jnp.int32) & 0x7FFFFFFF  # |x| through the bits
        o_ref[...] = lax.bitcast_convert_type(bits, F32) + jnp.power(x, n_ref[...])
        h_ref[...] = x.astype(jnp.bfloat16).astype(jnp.float16)  # f16 is f32 in kernels

    x, n = jnp.zeros((8, 128), F32), jnp.zeros((8, 128), jnp.int32)
    f = lambda x, n: pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct(x.shape, F32),
                           jax.ShapeDtypeStruct(x.shape, jnp.float16)))(x, n)
    _, (m,) = lower_tpu(f, x, n)
    names = collections.Counter(ops(m))
    # x ** n with integer n: |x| ** n with the sign of odd powers (Mosaic has no fpowi)
    assert names["arith.bitcast"] == 2 and names["math.fpowi"] == 0
    assert names["math.powf"] == 1
    assert names["arith.extf"] >= 1 and names["arith.truncf"] >= 1


def test_bitcast_convert_between_widths_fails_with_a_clear_lowering_error(lower_tpu):
    def kernel(x_ref, o_ref):
        o_ref[...] = lax.bitcast_convert_type(x_ref[...], jnp.int16)[..., 0].astype(F32)

    x = jnp.zeros((8, 128), F32)
    with pytest.raises(pltpu.LoweringException, match="different widths"):
        lower_tpu(_one_block(kernel, x), x)


def test_scan_over_arrays_is_unrolled_and_stacks_its_outputs(lower_tpu, ops):
    def kernel(x_ref, o_ref):
        def step(acc, row):
            acc = acc + row
            return acc, acc

        o_ref[...] = lax.scan(step, jnp.zeros((128,), F32), x_ref[...])[1]

    x = jnp.zeros((8, 128), F32)
    _, (m,) = lower_tpu(_one_block(kernel, x), x)
    names = collections.Counter(ops(m))
    assert names["vector.extract_strided_slice"] == 8 and names["tpu.concatenate"] == 1
    assert names["scf.for"] == 0


def test_long_scans_over_arrays_fail_with_a_clear_lowering_error(lower_tpu):
    def kernel(x_ref, o_ref):
        o_ref[...] = lax.scan(lambda c, r: (c + r, c), jnp.zeros((128,), F32), x_ref[...])[1]

    x = jnp.zeros((128, 128), F32)
    with pytest.raises(pltpu.LoweringException, match="length 128.*unrolled"):
        lower_tpu(_one_block(kernel, x), x)


def test_jvp_of_a_kernel_lowers_its_tangent_sums(lower_tpu, ops):
    # The JVP of x * x sums two tangent products with add_any, lowered as arith.addf.
    def kernel(x_ref, o_ref):
        x = x_ref[...]
        o_ref[...] = x * x

    x = jnp.ones((8, 128), F32)
    f = lambda x, t: jax.jvp(_one_block(kernel, x), (x,), (t,))
    _, modules = lower_tpu(f, x, x)
    tangent_ops = [ops(m) for m in modules if "arith.addf" in ops(m)]
    assert tangent_ops and tangent_ops[0].count("arith.mulf") >= 2


def test_tile_lowers_as_concatenation_and_matches_jnp(lower_tpu, ops):
    # jnp.tile (upstream's "repeat-style" op) repeats a block along the sublane and lane axes.
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.tile(x_ref[...], (2, 3))

    x = jnp.arange(8 * 128, dtype=F32).reshape(8, 128)
    f = _one_block(kernel, x, out=jax.ShapeDtypeStruct((16, 384), F32))
    _, (m,) = lower_tpu(f, x)
    assert collections.Counter(ops(m))["tpu.concatenate"] == 2
    np.testing.assert_array_equal(np.asarray(f(x)), np.tile(np.asarray(x), (2, 3)))


@pytest.mark.parametrize("key", ["mosaic_tpu", "mosaic"])
def test_the_dict_form_of_compiler_params_reaches_the_mosaic_module(key):
    """``compiler_params={"mosaic_tpu": {...}}`` (or older upstream's ``"mosaic"``) gives
    this backend its options, as ``pltpu.CompilerParams`` would."""
    from pallas_tpu import inspect as tpu_inspect

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    x = jnp.ones((16, 128), jnp.float32)
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    f = pl.pallas_call(kernel, out_shape=x, grid=(2,), in_specs=[spec], out_specs=spec,
                       compiler_params={key: {"dimension_semantics": ["parallel"]},
                                        "triton": {"num_warps": 8}})
    (module,) = tpu_inspect.mosaic_modules(
        jax.jit(f).trace(x).lower(lowering_platforms=("tpu",)))
    sems = [str(op.attributes["dimension_semantics"]) for op in module.body.operations
            if "dimension_semantics" in op.attributes]
    assert sems == ["[#tpu.dimension_semantics<parallel>]"]
