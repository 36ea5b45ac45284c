"""The emulate level runs the code plgpu's own primitives generate: TMA copies into
swizzled SMEM, mbarriers, ``wgmma`` from swizzled descriptors into the accumulator's
register fragments, bulk async-groups, and warpgroups that wait for each other."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.executor import EmulationError, EmulationUnsupported
from pallas_mosaic_gpu._src.executor import ops_wgmma as W

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
F16 = jnp.float16


def _example(name):
    path = EXAMPLES / f"{name}.py"
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    spec = importlib.util.spec_from_file_location(f"emulated_example_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name,fn", [("mosaic_gpu_matmul", "matmul"),
                                     ("mosaic_gpu_matmul_ws", "matmul_ws")])
def test_the_wgmma_matmul_examples_match_jnp_dot_at_emulate(emulate, name, fn):
    ex = _example(name)
    x, y = ex.inputs(128, 128, 128)  # two pipeline steps, four wgmma k-steps each
    f = getattr(ex, fn)
    f = getattr(f, "__wrapped__", f)
    (got,) = emulate(lambda a, b: f(a, b), x, y)
    np.testing.assert_allclose(np.asarray(got, np.float32),
                               np.asarray(ex.reference(x, y), np.float32), rtol=2e-2, atol=1e-1)


def _tiled_swizzled(logical: np.ndarray, swizzle: int) -> np.ndarray:
    """The bytes Mosaic GPU keeps for ``logical`` (R x C) in SMEM tiled by
    (8, swizzle // itemsize) and swizzled: tiles row-major, bits 4.. ^= bits 7.."""
    es = logical.dtype.itemsize
    cols = swizzle // es
    r, c = logical.shape
    tiles = logical.reshape(r // 8, 8, c // cols, cols).transpose(0, 2, 1, 3)
    raw = np.ascontiguousarray(tiles).reshape(-1).view(np.uint8)
    offs = np.arange(raw.size)
    out = np.empty_like(raw)
    out[offs ^ (((offs >> 7) & (swizzle // 16 - 1)) << 4)] = raw
    return out


class _Smem:
    def __init__(self, data: np.ndarray):
        from pallas_mosaic_gpu._src.executor.memory import Memory

        self.memory = Memory()
        self.smem = self.memory.alloc(data.size, "smem", align=1 << 18)
        self.smem_size = data.size
        self.memory.region_at(self.smem).data[:] = data


def _desc(start, lbo, sbo, swizzle):
    mode = {128: 1, 64: 2, 32: 3}[swizzle]
    return (start >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (mode << 62)


@pytest.mark.parametrize("swizzle", [128, 64, 32])
def test_a_k_major_descriptor_reads_rows_8_apart_by_sbo(swizzle):
    cols = swizzle // 2
    a = np.arange(64 * cols, dtype=np.float16).reshape(64, cols)
    m = _Smem(_tiled_swizzled(a, swizzle))
    # one tile of 8 rows is 8 * swizzle bytes; the next 8 rows follow it
    got = W.smem_operand(m, _desc(0, 16, 8 * swizzle, swizzle), 64, 16, np.dtype(np.float16),
                         k_major=True)
    np.testing.assert_array_equal(got, a[:, :16])
    if cols > 16:  # the next k-step: the descriptor's start moves by 32 bytes
        k1 = W.smem_operand(m, _desc(32, 16, 8 * swizzle, swizzle), 64, 16,
                            np.dtype(np.float16), k_major=True)
        np.testing.assert_array_equal(k1, a[:, 16:32])


def test_an_mn_major_descriptor_reads_n_atoms_lbo_apart_and_k_groups_sbo_apart():
    b = np.arange(32 * 128, dtype=np.float16).reshape(32, 128) % 1000  # K x N, N fastest
    m = _Smem(_tiled_swizzled(b, 128))
    # tiles (8 K, 64 N): the next 64 N are one tile (1024 B) on, the next 8 K two tiles on
    got = W.smem_operand(m, _desc(0, 1024, 2048, 128), 128, 16, np.dtype(np.float16),
                         k_major=False)
    np.testing.assert_array_equal(got, b[:16].T)


def test_the_accumulator_fragment_covers_the_64_by_n_tile_once():
    row, col = W._fragment(128, packed=False)
    assert row.shape == (128, 64)
    seen = np.zeros((64, 128), int)
    np.add.at(seen, (row, col), 1)
    assert (seen == 1).all()
    # thread 0 holds D[0, 0:2] and D[8, 0:2] first; thread 4 starts at row 1
    assert (row[0, :4].tolist(), col[0, :4].tolist()) == ([0, 0, 8, 8], [0, 1, 0, 1])
    assert row[4, 0] == 1 and col[1, 0] == 2 and row[32, 0] == 16


def _two_warpgroups(body, x, scratch):
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        num_threads=2, thread_name="wg", scratch_types=scratch)(x)


def test_warpgroups_wait_for_each_other_on_a_barrier(emulate):
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)

    def body(x_ref, o_ref, smem, out, loaded, ready):
        wg = jax.lax.axis_index("wg")

        @pl.when(wg == 1)  # the consumer runs first and waits for the producer
        def _():
            plgpu.barrier_wait(ready.at[0])
            out[...] = smem[...] * 2.0
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out, o_ref)
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == 0)
        def _():
            plgpu.copy_gmem_to_smem(x_ref, smem, loaded.at[0])
            plgpu.barrier_wait(loaded.at[0])
            smem[...] = smem[...] + 1.0
            plgpu.barrier_arrive(ready.at[0])

    f = lambda x: _two_warpgroups(  # noqa: E731
        body, x, [plgpu.SMEM((8, 128), jnp.float32), plgpu.SMEM((8, 128), jnp.float32),
                  plgpu.Barrier(num_barriers=1), plgpu.Barrier(num_barriers=1)])
    (got,) = emulate(f, x)
    np.testing.assert_array_equal(np.asarray(got), (np.asarray(x) + 1) * 2)


def test_a_barrier_no_one_arrives_at_is_a_deadlock(emulate):
    x = jnp.zeros((8, 128), jnp.float32)

    def body(x_ref, o_ref, bar):
        @pl.when(jax.lax.axis_index("wg") == 1)
        def _():
            plgpu.barrier_wait(bar.at[0])

    f = lambda x: _two_warpgroups(body, x, [plgpu.Barrier(num_barriers=1)])  # noqa: E731
    with pytest.raises(EmulationError, match="deadlock.*warpgroup 1 waits"):
        emulate(f, x)


def test_smem_read_before_waiting_for_its_copy_sees_stale_data(emulate):
    """A TMA load lands when its barrier is waited for, not when it is issued."""
    x = jnp.ones((8, 128), jnp.float32)

    def f(x, wait_first):
        def kernel(x_gmem, o_ref):
            def body(s, bar):
                plgpu.copy_gmem_to_smem(x_gmem, s, bar.at[0])
                if wait_first:
                    plgpu.barrier_wait(bar.at[0])
                o_ref[...] = s[...]
                if not wait_first:
                    plgpu.barrier_wait(bar.at[0])

            pl.run_scoped(body, plgpu.SMEM((8, 128), jnp.float32),
                          plgpu.Barrier(num_barriers=1))

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)],
                              backend="mosaic_gpu")(x)

    (good,) = emulate(lambda x: f(x, True), x)
    np.testing.assert_array_equal(np.asarray(good), 1.0)
    (bad,) = emulate(lambda x: f(x, False), x)
    assert np.isnan(np.asarray(bad)).all()  # SMEM before the copy landed: garbage


def test_an_inline_ptx_the_executor_does_not_know_is_unsupported_naming_it(emulate, monkeypatch):
    from pallas_mosaic_gpu._src.executor import ops_llvm

    monkeypatch.setattr(ops_llvm, "ASM_PATTERNS",
                        [p for p in ops_llvm.ASM_PATTERNS if "wgmma" not in p[0].pattern])
    ex = _example("mosaic_gpu_matmul")
    x, y = ex.inputs(128, 64, 128)
    with pytest.raises(EmulationUnsupported, match="wgmma.mma_async"):
        emulate(lambda a, b: ex.matmul.__wrapped__(a, b), x, y)


def test_wgmma_with_a_in_registers_chains_two_matmuls(emulate):
    """``(x @ y).astype(f16) @ z``: the second wgmma reads A from the first one's
    accumulator registers (the register-fragment layout of A), as flash attention does."""
    t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def f(x, y, z):
        def kernel(x_gmem, y_gmem, z_gmem, o_ref):
            def body(xs, ys, zs, bar, acc1, acc2):
                for i, (g, s) in enumerate([(x_gmem, xs), (y_gmem, ys), (z_gmem, zs)]):
                    plgpu.copy_gmem_to_smem(g, s, bar.at[i])
                    plgpu.barrier_wait(bar.at[i])
                plgpu.wgmma(acc1, xs, ys)
                plgpu.wgmma_wait(0)
                plgpu.wgmma(acc2, acc1[...].astype(F16), zs)
                plgpu.wgmma_wait(0)
                o_ref[...] = acc2[...]

            smem = plgpu.SMEM((64, 64), F16, transforms=t)
            pl.run_scoped(body, smem, smem, smem, plgpu.Barrier(num_barriers=3),
                          plgpu.ACC((64, 64), jnp.float32), plgpu.ACC((64, 64), jnp.float32))

        gmem = pl.BlockSpec(memory_space=plgpu.GMEM)
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((64, 64), jnp.float32),
                              in_specs=[gmem] * 3, backend="mosaic_gpu")(x, y, z)

    rng = np.random.default_rng(0)
    x, y, z = (jnp.asarray(rng.standard_normal((64, 64)), F16) for _ in range(3))
    (got,) = emulate(f, x, y, z)
    p = (np.asarray(x, np.float32) @ np.asarray(y, np.float32)).astype(np.float16)
    np.testing.assert_allclose(np.asarray(got), p.astype(np.float32) @ np.asarray(z, np.float32),
                               rtol=1e-2, atol=5e-2)  # f16 rounding of x @ y


def test_a_in_registers_from_a_warp_specialized_pipeline_slot(emulate):
    """``x_smem[...]`` (a WGMMA-layout load from a 128-byte-swizzled slot) as wgmma's A in
    ``emit_pipeline_warp_specialized``. The register load swizzles offsets from the buffer's
    start, TMA and wgmma the address bits, so they agree only if every swizzled buffer starts
    at a multiple of 1024 bytes; the pipeline's slots used to start 512 bytes off, and every
    row came out as if A's two 32-column halves were swapped (upstream's
    hopper_mixed_type_matmul_mgpu and transposed_ragged_dot_mgpu at emulate)."""
    t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    k = 128

    def kernel(x_gmem, y_gmem, o_gmem, o_smem):
        def step(_, x_smem, y_smem, acc):
            plgpu.wgmma(acc, x_smem[...], y_smem)
            plgpu.wgmma_wait(0)
            return acc

        def compute(eval_pipeline):
            def with_acc(acc):
                eval_pipeline(acc)
                o_smem[...] = acc[...]
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(o_smem, o_gmem)
                plgpu.wait_smem_to_gmem(0)

            pl.run_scoped(with_acc, plgpu.ACC((64, 64), jnp.float32))

        plgpu.emit_pipeline_warp_specialized(
            step, grid=(k // 64,), memory_registers=40, wg_axis="wg", num_compute_wgs=1,
            max_concurrent_steps=2, compute_context=compute,
            in_specs=[plgpu.BlockSpec((64, 64), lambda kk: (0, kk), transforms=t),
                      plgpu.BlockSpec((64, 64), lambda kk: (kk, 0), transforms=t)],
        )(x_gmem, y_gmem)

    def f(x, y):
        return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, 64), jnp.float32),
                            num_threads=2, thread_name="wg",
                            scratch_types=[plgpu.SMEM((64, 64), jnp.float32)])(x, y)

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, k)), F16)
    y = jnp.asarray(rng.standard_normal((k, 64)), F16)
    (got,) = emulate(f, x, y)
    np.testing.assert_allclose(np.asarray(got), np.asarray(x, np.float32) @ np.asarray(
        y, np.float32), rtol=1e-3, atol=1e-3)


def _wgmma_from_transformed_blockspecs():
    """(64, 128) @ (128, 192) f16 with wgmma straight from the pallas_call's blocks: both
    plgpu.BlockSpecs carry the tiling and swizzle wgmma needs (they were dropped, and the
    lowering refused b as 'not tiled and swizzled')."""
    t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def kernel(a_ref, b_ref, o_ref):
        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_ref, b_ref)
            plgpu.wgmma_wait(0)
            return acc_ref[...]

        o_ref[...] = pl.run_scoped(scope, plgpu.ACC((64, 192), jnp.float32))

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((64, 192), jnp.float32),
        in_specs=[plgpu.BlockSpec((64, 128), lambda: (0, 0), transforms=t),
                  plgpu.BlockSpec((128, 192), lambda: (0, 0), transforms=t)],
        out_specs=pl.BlockSpec((64, 192), lambda: (0, 0)), backend="mosaic_gpu")


def test_wgmma_from_blockspecs_with_transforms_lowers_compiles_and_emulates(emulate):
    from pallas_mosaic_gpu import compiler

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, 128)), F16)
    y = jnp.asarray(rng.standard_normal((128, 192)), F16)
    f = _wgmma_from_transformed_blockspecs()
    text = jax.jit(f).trace(x, y).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text
    (got,) = emulate(f, x, y)
    np.testing.assert_allclose(np.asarray(got), np.asarray(x, np.float32) @ np.asarray(
        y, np.float32), rtol=1e-3, atol=1e-3)
    try:
        compiler.find_toolchain()
    except compiler.ToolchainMissingError as e:
        pytest.skip(f"compile level: {e}")
    (k,) = compiler.compile(f, x, y)
    assert k.uses_wgmma and k.spill_stores == 0
