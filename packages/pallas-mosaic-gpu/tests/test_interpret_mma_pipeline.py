"""Matmuls and pipelines: ``wgmma`` into an accumulator, ``emit_pipeline`` and the
warp-specialised pipeline, in GPU interpret mode and in the reference interpreter."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu import interpret as gpu_interpret

IP = plgpu.InterpretParams


def _operands(m, k, n):
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.uniform(ka, (m, k), jnp.float16)
    b = jax.random.uniform(kb, (k, n), jnp.float16)
    return a, b, jnp.dot(a, b, preferred_element_type=jnp.float32)


def _single_thread(body, out_type, scratch, interpret):
    """``body`` as a one-thread kernel: a pallas_call (``interpret=True``: the reference
    interpreter) or a plgpu.kernel (GPU interpret mode)."""
    if interpret is True:
        return pl.pallas_call(
            body, out_shape=out_type, interpret=True,
            in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
            out_specs=pl.BlockSpec(memory_space=plgpu.GMEM), scratch_shapes=scratch)
    return plgpu.kernel(body, out_type=out_type, scratch_types=scratch, interpret=interpret)


@pytest.mark.parametrize("interpret", [True, IP(detect_races=True)], ids=["reference", "gpu"])
def test_wgmma_accumulates_a_matmul_of_smem_tiles(interpret):
    a, b, expected = _operands(64, 64, 32)

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar.at[0])
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])

        def scope(acc):
            plgpu.wgmma(acc, a_smem, b_smem)
            plgpu.wgmma(acc, a_smem, b_smem)
            o_gmem[...] = plgpu.wgmma_accumulator_load(acc)

        pl.run_scoped(scope, plgpu.ACC((64, 32)))

    k = _single_thread(body, jax.ShapeDtypeStruct((64, 32), jnp.float32),
                       dict(a_smem=plgpu.SMEM(a.shape, a.dtype),
                            b_smem=plgpu.SMEM(b.shape, b.dtype),
                            bar=plgpu.Barrier(num_barriers=2, orders_tensor_core=True)),
                       interpret)
    np.testing.assert_allclose(k(a, b), 2 * expected, rtol=1e-5)


def test_wgmma_checks_shapes():
    a, b, _ = _operands(64, 64, 32)

    def body(a_gmem, b_gmem, o_gmem):
        pl.run_scoped(lambda acc: plgpu.wgmma(acc, a_gmem, b_gmem), plgpu.ACC((64, 64)))

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 32), jnp.float32),
                     interpret=IP())
    with pytest.raises(ValueError, match="shapes do not chain"):
        k(a, b)


@pytest.mark.parametrize("steps", [1, 3])
def test_emit_pipeline_streams_blocks_through_smem(steps):
    x = jnp.arange(4 * 64 * 32, dtype=jnp.float32).reshape(4 * 64, 32)

    def body(x_gmem, o_gmem):
        def step(idx, x_smem, o_smem):
            o_smem[...] = x_smem[...] * 2 + idx[0]

        spec = pl.BlockSpec((64, 32), lambda i: (i, 0))
        plgpu.emit_pipeline(step, grid=(4,), in_specs=[spec], out_specs=[spec],
                            max_concurrent_steps=steps)(x_gmem, o_gmem)

    k = plgpu.kernel(body, out_type=x, interpret=IP(detect_races=True))
    expected = x * 2 + jnp.repeat(jnp.arange(4, dtype=jnp.float32), 64)[:, None]
    np.testing.assert_array_equal(k(x), expected)
    assert not gpu_interpret.get_races().races_found


def test_emit_pipeline_keeps_an_index_invariant_output_across_steps():
    x = jnp.arange(4 * 64 * 32, dtype=jnp.float32).reshape(4 * 64, 32)

    def body(x_gmem, o_gmem):
        def step(idx, x_smem, o_smem):
            @pl.when(idx[0] == 0)
            def _():
                o_smem[...] = jnp.zeros_like(o_smem)

            o_smem[...] += x_smem[...]

        plgpu.emit_pipeline(step, grid=(4,), max_concurrent_steps=2,
                            in_specs=[pl.BlockSpec((64, 32), lambda i: (i, 0))],
                            out_specs=[pl.BlockSpec((64, 32), lambda i: (0, 0))],
                            )(x_gmem, o_gmem)

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 32), jnp.float32),
                     interpret=IP(detect_races=True, num_tma_threads_per_device=2))
    np.testing.assert_array_equal(k(x), x.reshape(4, 64, 32).sum(0))
    assert not gpu_interpret.get_races().races_found


def test_warp_specialized_pipeline_matmul():
    a, b, expected = _operands(128, 128, 64)

    def kernel(a_gmem, b_gmem, o_gmem):
        def mma(idx, a_smem, b_smem, acc):
            wg = jax.lax.axis_index("wg")
            plgpu.wgmma(acc, a_smem.at[pl.ds(wg * 64, 64)], b_smem)
            plgpu.wgmma_wait(0)
            return acc

        def compute(eval_pipeline):
            def scope(acc):
                eval_pipeline(acc)
                wg = jax.lax.axis_index("wg")
                o_gmem[pl.ds(wg * 64, 64)] = acc[...]

            pl.run_scoped(scope, plgpu.ACC((64, 64)))

        plgpu.emit_pipeline_warp_specialized(
            mma, grid=(2,), memory_registers=40, wg_axis="wg", num_compute_wgs=2,
            max_concurrent_steps=2, compute_context=compute,
            in_specs=[plgpu.BlockSpec((128, 64), lambda k: (0, k)),
                      plgpu.BlockSpec((64, 64), lambda k: (k, 0))],
        )(a_gmem, b_gmem)

    k = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128, 64), jnp.float32),
                     num_threads=3, thread_name="wg", interpret=IP(detect_races=True))
    np.testing.assert_allclose(k(a, b), expected, rtol=1e-5)
    assert not gpu_interpret.get_races().races_found


def test_force_gpu_interpret_mode_runs_kernels_written_without_interpret():
    def body(o_ref):
        o_ref[jax.lax.axis_index("t")] = jax.lax.axis_index("t")

    k = functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((3,), jnp.int32),
                          num_threads=3, thread_name="t")(body)
    with gpu_interpret.force_gpu_interpret_mode(IP()):
        np.testing.assert_array_equal(jax.jit(k)(), np.arange(3))


def test_nd_loop_splits_a_grid_round_robin():
    def body(o_ref):
        @plgpu.nd_loop((2, 3), collective_axes="b")
        def _(info):
            i, j = info.index
            o_ref[i, j] = jax.lax.axis_index("b") * 10 + info.local_index

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 3), jnp.int32), grid=(4,),
                     grid_names=("b",), interpret=IP(detect_races=True))
    np.testing.assert_array_equal(k(), [[0, 10, 20], [30, 1, 11]])
    assert not gpu_interpret.get_races().races_found


def _tiled_nd_loop_kernel(interpret):
    """nd_loop over a (n, 2, 3) grid whose n is read from memory at run time, in tiles of
    (2, 1, 3), split between 4 blocks; each point records its flat step."""
    def body(n_ref, o_ref):
        @plgpu.nd_loop((n_ref[0], 2, 3), tiling=(2, 1, 3), collective_axes="b")
        def _(info):
            i, j, k = info.index
            o_ref[i, j, k] = jax.lax.axis_index("b") + 4 * info.local_index

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 2, 3), jnp.int32),
                        grid=(4,), grid_names=("b",), interpret=interpret)


# Tiles in row-major order (the j = 0 tile, then j = 1), points within a tile row-major.
_TILED_ORDER = [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 10, 11]]]


def test_nd_loop_tiles_a_grid_whose_size_is_known_only_at_run_time():
    k = _tiled_nd_loop_kernel(IP(detect_races=True))
    np.testing.assert_array_equal(k(jnp.asarray([2], jnp.int32)), _TILED_ORDER)


def test_nd_loop_tiles_a_run_time_grid_in_the_lowering_too(emulate):
    pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering needs jax-cuda13-plugin")
    n = jnp.asarray([2], jnp.int32)
    (got,) = emulate(_tiled_nd_loop_kernel(None), n)
    np.testing.assert_array_equal(np.asarray(got), _TILED_ORDER)


def test_planar_snake_walks_tiles_back_and_forth():
    order = np.zeros((4, 4), int)
    for lin in range(16):
        i, j = plgpu.planar_snake(jnp.int32(lin), (4, 4), 0, 2)
        order[int(i), int(j)] = lin
    np.testing.assert_array_equal(order, [[0, 2, 4, 6], [1, 3, 5, 7],
                                          [14, 12, 10, 8], [15, 13, 11, 9]])


@pytest.mark.parametrize("interpret", [True, IP(detect_races=True)], ids=["reference", "gpu"])
def test_tcgen05_mma_into_tmem_arrives_on_its_barrier(interpret):
    a, b, expected = _operands(128, 64, 64)

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, acc, bar):
        a_smem[...] = a_gmem[...]
        b_smem[...] = b_gmem[...]
        plgpu.tcgen05_mma(acc, a_smem, b_smem, bar.at[0], accumulate=False)
        plgpu.barrier_wait(bar.at[0])
        plgpu.tcgen05_mma(acc, a_smem, b_smem, bar.at[1])
        plgpu.barrier_wait(bar.at[1])
        o_gmem[...] = plgpu.async_load_tmem(acc)
        plgpu.wait_load_tmem()

    k = _single_thread(body, jax.ShapeDtypeStruct((128, 64), jnp.float32),
                       dict(a_smem=plgpu.SMEM(a.shape, a.dtype),
                            b_smem=plgpu.SMEM(b.shape, b.dtype),
                            acc=plgpu.TMEM((128, 64), jnp.float32),
                            bar=plgpu.Barrier(num_barriers=2, orders_tensor_core=True)),
                       interpret)
    np.testing.assert_allclose(k(a, b), 2 * expected, rtol=1e-5)


@pytest.mark.parametrize("commit", [True, False], ids=["covered", "uncovered"])
def test_an_unobserved_mma_arrival_is_fine_once_a_later_commit_is_observed(commit):
    """As in upstream's Blackwell matmul: the MMA issuer waits for the first MMA's
    arrival only; the second's is covered by the commit another thread observes (the
    tensor core completes in order). Without that commit, the unobserved phase is
    reported as upstream's interpreter reports any barrier phase left unobserved."""
    a, b, expected = _operands(128, 64, 64)

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, acc, consumed, done):
        t = jax.lax.axis_index("t")

        @pl.when(t == 0)
        def _():
            a_smem[...] = a_gmem[...]
            b_smem[...] = b_gmem[...]
            plgpu.tcgen05_mma(acc, a_smem, b_smem, consumed, accumulate=False)
            plgpu.barrier_wait(consumed)
            plgpu.tcgen05_mma(acc, a_smem, b_smem, consumed)  # its arrival is not awaited
            if commit:
                plgpu.tcgen05_commit_arrive(done)

        @pl.when(t == 1)
        def _():
            if commit:
                plgpu.barrier_wait(done)
                o_gmem[...] = plgpu.async_load_tmem(acc)

    k = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((128, 64), jnp.float32), num_threads=2,
        thread_name="t", interpret=IP(detect_races=True),
        scratch_types=dict(a_smem=plgpu.SMEM(a.shape, a.dtype),
                           b_smem=plgpu.SMEM(b.shape, b.dtype),
                           acc=plgpu.TMEM((128, 64), jnp.float32),
                           consumed=plgpu.Barrier(orders_tensor_core=True),
                           done=plgpu.Barrier(orders_tensor_core=True)))
    if commit:
        np.testing.assert_allclose(k(a, b), 2 * expected, rtol=1e-5)
        assert not gpu_interpret.get_races().races_found
    else:
        with pytest.raises(Exception, match=r"Thread 0 did not observe all phases \(2\)"):
            jax.block_until_ready(k(a, b))


def test_warp_specialized_pipeline_with_outputs():
    x = jnp.arange(4 * 64 * 32, dtype=jnp.float32).reshape(4 * 64, 32)

    def kernel(x_gmem, o_gmem, s_gmem):
        def step(idx, x_smem, o_smem, s_smem):
            o_smem[...] = x_smem[...] + 1

            @pl.when(idx[0] == 0)
            def _():
                s_smem[...] = jnp.zeros_like(s_smem)

            s_smem[...] += x_smem[...]

        spec = plgpu.BlockSpec((64, 32), lambda i: (i, 0))
        plgpu.emit_pipeline_warp_specialized(
            step, grid=(4,), memory_registers=40, wg_axis="wg", num_compute_wgs=1,
            in_specs=[spec], out_specs=[spec, plgpu.BlockSpec((64, 32), lambda i: (0, 0))],
        )(x_gmem, o_gmem, s_gmem)

    k = plgpu.kernel(kernel, out_type=(x, jax.ShapeDtypeStruct((64, 32), jnp.float32)),
                     num_threads=2, thread_name="wg", interpret=IP(detect_races=True))
    o, total = k(x)
    np.testing.assert_array_equal(o, x + 1)
    np.testing.assert_array_equal(total, x.reshape(4, 64, 32).sum(0))
    assert not gpu_interpret.get_races().races_found


def test_run_state_accumulator_starts_from_its_init_and_wgmma_reads_a_transposed_view():
    """Upstream's attention kernel: ``pl.run_state(f)(plgpu.ACC.init(acc))`` continues an
    accumulator in registers, and ``plgpu.transpose_ref`` lets wgmma read K-major tiles."""
    a, _, _ = _operands(64, 64, 32)
    bt = jax.random.uniform(jax.random.key(3), (32, 64), jnp.float16)
    start = jnp.full((64, 32), 0.5, jnp.float32)

    def body(a_gmem, bt_gmem, o_gmem, a_smem, bt_smem, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar.at[0])
        plgpu.copy_gmem_to_smem(bt_gmem, bt_smem, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])

        def step(acc):
            plgpu.wgmma(acc, a_smem, plgpu.transpose_ref(bt_smem, (1, 0)))

        o_gmem[...] = pl.run_state(step)(plgpu.ACC.init(jnp.full((64, 32), 0.5, jnp.float32)))

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 32), jnp.float32),
                     scratch_types=dict(a_smem=plgpu.SMEM(a.shape, a.dtype),
                                        bt_smem=plgpu.SMEM(bt.shape, bt.dtype),
                                        bar=plgpu.Barrier(num_barriers=2)),
                     interpret=IP(detect_races=True))
    want = start + jnp.dot(a, bt.T, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(k(a, bt), want, rtol=1e-5)
