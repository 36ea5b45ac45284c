"""Lowering plgpu's own primitives: run_scoped buffers (SMEM with tiling and swizzle,
barriers, ACC), TMA copies, barriers, fences, wgmma, plgpu.kernel over a mesh of
warpgroups; and the trace-time errors for what Mosaic GPU cannot do."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.lowering import build

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F16, F32 = jnp.float16, jnp.float32
SWIZZLED = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # for f16


def _lower(f, *args) -> str:
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _kernel_of(f, *args, target=None):
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    p = eqn.params
    from pallas_mosaic_gpu._src.backend import params

    return build(p["jaxpr"], p["grid_mapping"], params(p["compiler_params"]), "k",
                 target=target)


def _gmem_call(kernel, out_shape, **kw):
    return pl.pallas_call(kernel, out_shape=out_shape,
                          in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)],
                          out_specs=pl.BlockSpec(memory_space=plgpu.GMEM),
                          backend="mosaic_gpu", **kw)


def _tma_roundtrip(shape=(128, 128), window=None, dtype=F32):
    """x -> SMEM (TMA, barrier) -> doubled -> GMEM (TMA)."""
    window = window or shape

    def kernel(x_gmem, o_gmem):
        def body(buf, bar):
            src = x_gmem.at[tuple(pl.ds(0, w) for w in window)]
            plgpu.copy_gmem_to_smem(src, buf, bar.at[0])
            plgpu.barrier_wait(bar.at[0])
            buf[...] = buf[...] * 2
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(buf, o_gmem.at[tuple(pl.ds(0, w) for w in window)])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(body, plgpu.SMEM(window, dtype), plgpu.Barrier(num_barriers=1))

    return _gmem_call(kernel, jax.ShapeDtypeStruct(shape, dtype))


def test_tma_copies_barriers_and_fences_lower_with_run_scoped_buffers():
    x = jnp.ones((128, 128), F32)
    f = _tma_roundtrip()
    assert "custom_call @mosaic_gpu_v2" in _lower(f, x)
    k = _kernel_of(f, x)
    assert {"run_scoped", "mgpu_copy_gmem_to_smem", "mgpu_barrier_wait", "mgpu_commit_smem",
            "mgpu_copy_smem_to_gmem", "mgpu_wait_smem_to_gmem"} <= k.primitives
    assert k.smem_bytes >= 128 * 128 * 4 + 8  # the buffer and its barrier


def _wgmma_kernel(a_transforms=SWIZZLED, b_transforms=SWIZZLED, loop=2, interpret=False):
    """acc += a @ b ``loop`` times inside a fori_loop (the accumulator is carried)."""

    def kernel(a_gmem, b_gmem, o_smem):
        def body(a, b, bar, acc):
            plgpu.copy_gmem_to_smem(a_gmem, a, bar.at[0])
            plgpu.copy_gmem_to_smem(b_gmem, b, bar.at[0])
            plgpu.barrier_wait(bar.at[0])

            def step(i, c):
                plgpu.wgmma(acc, a, b)
                plgpu.wgmma_wait(0)
                return c

            jax.lax.fori_loop(0, loop, step, 0)
            o_smem[...] = acc[...].astype(o_smem.dtype)

        pl.run_scoped(body, plgpu.SMEM((64, 64), F16, transforms=a_transforms),
                      plgpu.SMEM((64, 64), F16, transforms=b_transforms),
                      plgpu.Barrier(num_arrivals=2), plgpu.ACC((64, 64)))

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((64, 64), F16),
                          in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
                          backend="mosaic_gpu", interpret=interpret)


def test_wgmma_with_an_accumulator_carried_through_a_loop_lowers_and_interprets():
    a = jax.random.normal(jax.random.key(0), (64, 64), F32).astype(F16)
    b = jax.random.normal(jax.random.key(1), (64, 64), F32).astype(F16)
    k = _kernel_of(_wgmma_kernel(), a, b)
    assert {"mgpu_wgmma", "mgpu_wgmma_wait", "scan"} <= k.primitives
    got = _wgmma_kernel(interpret=plgpu.InterpretParams())(a, b)
    want = (2 * jnp.dot(a, b, preferred_element_type=F32)).astype(F16)
    assert jnp.allclose(got.astype(F32), want.astype(F32), rtol=2e-2, atol=1e-1)


def test_a_transposed_operand_lowers():
    def kernel(a_gmem, b_gmem, o_smem):
        def body(a, b, bar, acc):
            plgpu.copy_gmem_to_smem(a_gmem, a, bar.at[0])
            plgpu.copy_gmem_to_smem(b_gmem, b, bar.at[0])
            plgpu.barrier_wait(bar.at[0])
            plgpu.wgmma(acc, a, plgpu.transpose_ref(b, (1, 0)))
            plgpu.wgmma_wait(0)
            o_smem[...] = acc[...]

        pl.run_scoped(body, plgpu.SMEM((64, 64), F16, transforms=SWIZZLED),
                      plgpu.SMEM((64, 64), F16, transforms=SWIZZLED),
                      plgpu.Barrier(num_arrivals=2), plgpu.ACC((64, 64)))

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((64, 64), F32),
                       in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
                       backend="mosaic_gpu")
    a = jnp.ones((64, 64), F16)
    assert "mosaic_gpu_v2" in _lower(f, a, a)


def test_a_mesh_kernel_of_two_warpgroups_lowers_with_the_thread_axis():
    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256, 128), F32), grid=(2,), grid_names=("x",),
                  num_threads=2, thread_name="wg",
                  scratch_types=[plgpu.SMEM((128, 128), F32), plgpu.Barrier()])
    def k(x_gmem, o_gmem, buf, bar):
        i = jax.lax.axis_index("x")

        @pl.when(jax.lax.axis_index("wg") == 0)
        def _():
            plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(i * 128, 128)], buf, bar.at[0])
            plgpu.barrier_wait(bar.at[0])
            buf[...] = buf[...] + 1
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(buf, o_gmem.at[pl.ds(i * 128, 128)])
            plgpu.wait_smem_to_gmem(0)

    x = jnp.ones((256, 128), F32)
    assert "mosaic_gpu_v2" in _lower(k, x)
    (eqn,) = [e for e in jax.make_jaxpr(k)(x).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    from pallas_mosaic_gpu._src.backend import params

    kern = build(eqn.params["jaxpr"], eqn.params["grid_mapping"],
                 params(eqn.params["compiler_params"]), "k")
    assert kern.cuda_grid == (2, 1, 1)


# -- trace-time errors ---------------------------------------------------------------


def test_wgmma_operands_without_the_swizzled_tiling_are_refused_naming_the_operand():
    a = jnp.ones((64, 64), F16)
    with pytest.raises(ValueError, match=r"wgmma: b .*TilingTransform\(\(8, S\)\)"):
        jax.make_jaxpr(_wgmma_kernel(b_transforms=()))(a, a)
    with pytest.raises(ValueError, match=r"wgmma: a is tiled by \(16, 64\).*\(8, 64\)"):
        jax.make_jaxpr(_wgmma_kernel(
            a_transforms=(plgpu.TilingTransform((16, 64)), plgpu.SwizzleTransform(128))))(a, a)


def test_a_swizzle_that_does_not_match_the_rows_is_refused():
    with pytest.raises(ValueError, match="Swizzle 128 requires the trailing dimension"):
        plgpu.SMEM((64, 64), F16, transforms=(plgpu.TilingTransform((8, 32)),
                                              plgpu.SwizzleTransform(128)))


def test_wgmma_for_blackwell_and_tmem_for_hopper_are_refused_naming_the_target(monkeypatch):
    a = jnp.ones((64, 64), F16)
    f = _wgmma_kernel(loop=1)
    with pytest.raises(ValueError, match=r"wgmma is a Hopper-only instruction \(sm_90a\).*"
                                         r"compiled for sm_100a.*tcgen05_mma"):
        _kernel_of(f, a, a, target="sm_100a")
    monkeypatch.setenv("PALLAS_MOSAIC_GPU_TARGET", "sm_100a")
    with pytest.raises(ValueError, match="Hopper-only"):  # at trace time, by the env var
        jax.make_jaxpr(_wgmma_kernel(loop=3))(a, a)
    monkeypatch.setenv("PALLAS_MOSAIC_GPU_TARGET", "sm_90a")

    def tmem_kernel(x_gmem, o_gmem):
        pl.run_scoped(lambda t: None, plgpu.TMEM((128, 128), F32))

    with pytest.raises(ValueError, match=r"Blackwell-only \(sm_100a\).*sm_90a.*wgmma"):
        jax.make_jaxpr(_gmem_call(tmem_kernel, jax.ShapeDtypeStruct((8, 128), F32)))(
            jnp.ones((8, 128), F32))


def test_blocks_tma_cannot_copy_are_refused_naming_the_argument():
    # rows of 10 float32 (40 bytes) are not 16-byte aligned
    with pytest.raises(ValueError, match=r"copy_gmem_to_smem: src is a GMEM array of shape "
                                         r"\(128, 10\) float32.*multiples of 16"):
        jax.make_jaxpr(_tma_roundtrip((128, 10)))(jnp.ones((128, 10), F32))
    # a window whose minor dim is 2 x float32 = 8 bytes
    with pytest.raises(ValueError, match=r"src window \(128, 2\).*minor dim of 8 bytes"):
        jax.make_jaxpr(_tma_roundtrip((128, 128), (128, 2)))(jnp.ones((128, 128), F32))
    # more than 256 elements along a dim of an untiled buffer
    with pytest.raises(ValueError, match=r"src window \(512, 16\) has a dim over 256"):
        jax.make_jaxpr(_tma_roundtrip((512, 16), (512, 16)))(jnp.ones((512, 16), F32))


def test_a_barrier_index_out_of_range_is_refused():
    def kernel(x_gmem, o_gmem):
        def body(buf, bar):
            plgpu.copy_gmem_to_smem(x_gmem, buf, bar.at[1])
            plgpu.barrier_wait(bar.at[1])

        pl.run_scoped(body, plgpu.SMEM((8, 128), F32), plgpu.Barrier(num_barriers=1))

    with pytest.raises(ValueError, match=r"barrier index 1 is out of range for "
                                         r"plgpu.Barrier\(num_barriers=1\); valid: 0..0"):
        jax.make_jaxpr(_gmem_call(kernel, jax.ShapeDtypeStruct((8, 128), F32)))(
            jnp.ones((8, 128), F32))
