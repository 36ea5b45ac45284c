"""What upstream's Warpgroup-semantics kernels (``hopper_matmul_mgpu``, ``ragged_dot_mgpu``)
need from the lowering: slices of register arrays (an accumulator's epilogue tiles),
scalars read straight from GMEM (group sizes), and, under Warpgroup semantics only,
SMEM layouts inferred for ``wgmma`` operands declared without transforms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.lowering import MosaicGpuLoweringError

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F16, F32 = jnp.float16, jnp.float32
WG = plgpu.LoweringSemantics.Warpgroup


def _lower(f, *args) -> str:
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _scaled_matmul_tile(semantics=WG, interpret=False):
    """o = (a @ b)[:, 32:64] * scale[1]: wgmma on SMEM buffers declared without
    transforms, a GMEM scalar, and an epilogue tile sliced out of the accumulator."""

    def kernel(scale_gmem, a_gmem, b_gmem, o_gmem):
        def body(a, b, bar, acc, o):
            plgpu.copy_gmem_to_smem(a_gmem, a, bar.at[0])
            plgpu.copy_gmem_to_smem(b_gmem, b, bar.at[0])
            plgpu.barrier_wait(bar.at[0])
            plgpu.wgmma(acc, a, b)
            plgpu.wgmma_wait(0)
            tile = (acc[...] * scale_gmem[1])[:, 32:64]
            o[...] = tile.astype(F16)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o, o_gmem)
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(body, plgpu.SMEM((64, 64), F16), plgpu.SMEM((64, 64), F16),
                      plgpu.Barrier(num_arrivals=2), plgpu.ACC((64, 64)),
                      plgpu.SMEM((64, 32), F16))

    return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, 32), F16),
                        compiler_params=plgpu.CompilerParams(lowering_semantics=semantics),
                        interpret=plgpu.InterpretParams() if interpret else False)


def _operands():
    a = jax.random.normal(jax.random.key(0), (64, 64), F32).astype(F16)
    b = jax.random.normal(jax.random.key(1), (64, 64), F32).astype(F16)
    return jnp.asarray([1.0, 0.5], F32), a, b


def test_wgmma_buffers_without_transforms_get_them_inferred_under_warpgroup_semantics():
    scale, a, b = _operands()
    assert "custom_call @mosaic_gpu_v2" in _lower(_scaled_matmul_tile(), scale, a, b)
    got = _scaled_matmul_tile(interpret=True)(scale, a, b)
    want = (jnp.dot(a, b, preferred_element_type=F32)[:, 32:64] * 0.5).astype(F16)
    assert jnp.allclose(got.astype(F32), want.astype(F32), rtol=2e-2, atol=5e-2)


def test_under_lane_semantics_wgmma_buffers_must_declare_their_layout():
    with pytest.raises(ValueError, match=r"wgmma: b .*must be tiled and swizzled"):
        _lower(_scaled_matmul_tile(plgpu.LoweringSemantics.Lane), *_operands())


def _rows(window, shape=(16, 128)):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...][window] * 2.0

    out = jax.ShapeDtypeStruct(jnp.zeros(shape)[window].shape, F32)
    return pl.pallas_call(kernel, out_shape=out,
                          compiler_params=plgpu.CompilerParams(lowering_semantics=WG))


def test_whole_register_runs_of_a_strided_array_slice_in_registers():
    x = jnp.arange(16 * 128, dtype=F32).reshape(16, 128)
    assert "custom_call @mosaic_gpu_v2" in _lower(_rows(slice(8, 16)), x)


def test_slices_that_would_gather_across_threads_are_refused_naming_the_window():
    x = jnp.zeros((16, 128), F32)
    with pytest.raises(MosaicGpuLoweringError,
                       match=r"'slice'.*slicing \[3:11, 0:128\] out of a \(16, 128\) array"):
        _lower(_rows(slice(3, 11)), x)


def _sum_of_first_blocks(interpret=False):
    """The sum of the first ``n[0]`` (64, 128) blocks of x: an emit_pipeline whose grid
    is read from GMEM in the kernel (a traced step count), over a view that overhangs
    the array (only in-bounds blocks are fetched), as transposed_ragged_dot_mgpu's."""

    def kernel(n_gmem, x_gmem, o_gmem, acc):
        acc[...] = jnp.zeros_like(acc)

        def step(_, x_smem):
            acc[...] += x_smem[...]

        start = n_gmem[1] * 64
        plgpu.emit_pipeline(step, grid=(n_gmem[0],),
                            in_specs=[plgpu.BlockSpec((64, 128), lambda i: (i, 0))],
                            max_concurrent_steps=2)(x_gmem.at[pl.ds(start, 256)])
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(acc, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, 128), F32),
                        scratch_types=[plgpu.SMEM((64, 128), F32)],
                        compiler_params=plgpu.CompilerParams(lowering_semantics=WG),
                        interpret=plgpu.InterpretParams() if interpret else False)


def test_emit_pipeline_over_a_traced_number_of_steps_lowers_and_interprets():
    x = jnp.arange(256 * 128, dtype=F32).reshape(256, 128) / 1024
    n = jnp.asarray([2, 1], jnp.int32)  # 2 blocks, from row 64 on
    assert "custom_call @mosaic_gpu_v2" in _lower(_sum_of_first_blocks(), n, x)
    got = _sum_of_first_blocks(interpret=True)(n, x)
    assert jnp.allclose(got, x[64:128] + x[128:192])


def test_an_iota_cast_to_the_wgmma_layout_lines_up_with_a_wgmma_layout_load():
    tr = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def kernel(x_gmem, o_gmem):
        def body(buf, bar):
            plgpu.copy_gmem_to_smem(x_gmem, buf, bar.at[0])
            plgpu.barrier_wait(bar.at[0])
            rows = plgpu.layout_cast(jax.lax.broadcasted_iota(jnp.int32, (64, 64), 0),
                                     plgpu.Layout.WGMMA)
            buf[...] = buf[...] * (rows >= 8).astype(F16)  # both in the WGMMA layout
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(buf, o_gmem)
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(body, plgpu.SMEM((64, 64), F16, transforms=tr), plgpu.Barrier())

    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, 64), F16),
                     compiler_params=plgpu.CompilerParams(lowering_semantics=WG))
    assert "custom_call @mosaic_gpu_v2" in _lower(f, jnp.ones((64, 64), F16))


def test_tma_boxes_overhanging_gmem_read_zeros_and_drop_writes_in_interpret_mode():
    """As the hardware's TMA (ragged_dot_mgpu with m=200 fetches a last block past the
    end): a load fills the outside with zeros, a store drops it."""

    def kernel(start_gmem, x_gmem, o_gmem):
        def body(buf, bar):
            start = start_gmem[0]  # 32: traced, so the view may overhang
            plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(start, 64)], buf, bar.at[0])
            plgpu.barrier_wait(bar.at[0])
            buf[...] = buf[...] * 2
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(buf, o_gmem.at[pl.ds(0, 64)])
            plgpu.wait_smem_to_gmem(0)
            plgpu.copy_smem_to_gmem(buf, o_gmem.at[pl.ds(start, 64)])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(body, plgpu.SMEM((64, 128), F32), plgpu.Barrier())

    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, 128), F32),
                     interpret=plgpu.InterpretParams())
    x = jnp.arange(64 * 128, dtype=F32).reshape(64, 128)
    got = f(jnp.asarray([32], jnp.int32), x)
    assert jnp.array_equal(got, jnp.concatenate([2 * x[32:], 2 * x[32:]]))


def test_delay_release_refills_a_slot_one_step_late():
    def kernel(x_gmem, o_gmem, acc):
        acc[...] = jnp.zeros_like(acc)

        def step(_, x_smem):
            acc[...] += x_smem[...]

        plgpu.emit_pipeline(step, grid=(4,), max_concurrent_steps=3,
                            in_specs=[plgpu.BlockSpec((64, 128), lambda i: (i, 0),
                                                      delay_release=1)])(x_gmem)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(acc, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, 128), F32),
                     scratch_types=[plgpu.SMEM((64, 128), F32)],
                     interpret=plgpu.InterpretParams(detect_races=True))
    x = jax.random.normal(jax.random.key(2), (256, 128), F32)
    assert jnp.allclose(f(x), x.reshape(4, 64, 128).sum(0), atol=1e-5)
