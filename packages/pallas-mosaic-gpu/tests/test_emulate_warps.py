"""The emulate level runs the warps of a warpgroup on their own where they wait for each
other (``pl.core_map(plgpu.WarpMesh(...))`` producer/consumer code: one warp issues TMA
copies or MMAs, another waits on the mbarrier the first arrives on): such a kernel runs
again with a strand per warp for that warpgroup instead of failing as lockstep lanes
would, and a wait no warp can satisfy is still reported as a deadlock naming the
warps."""

from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.emulate import EmulationError, EmulationUnsupported, launch, sched

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F16, F32 = jnp.float16, jnp.float32
SWIZZLED = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # for f16
ROWS, STEPS = 32, 6


def relay():
    """x -> o through two SMEM slots, by warps: warp 0 loads row block ``i`` into slot
    ``i % 2`` with TMA once warp 1 has released it; warp 1 waits for the load, stores the
    slot to ``o`` with TMA and releases the slot when the store has read it."""

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct((STEPS * ROWS, 128), F32),
        scratch_types=dict(slots=plgpu.SMEM((2, ROWS, 128), F32),
                           loaded=plgpu.Barrier(num_barriers=2),
                           free=plgpu.Barrier(num_barriers=2)))
    def kernel(x_gmem, o_gmem, slots, loaded, free):
        @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
        def _():
            warp = jax.lax.axis_index("warp")

            @pl.when(warp == 0)
            def _():
                def load(i, c):
                    @pl.when(i >= 2)
                    def _():
                        plgpu.barrier_wait(free.at[i % 2])

                    plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(i * ROWS, ROWS)],
                                            slots.at[i % 2], loaded.at[i % 2])
                    return c

                jax.lax.fori_loop(0, STEPS, load, 0)

            @pl.when(warp == 1)
            def _():
                def store(i, c):
                    plgpu.barrier_wait(loaded.at[i % 2])
                    plgpu.copy_smem_to_gmem(slots.at[i % 2], o_gmem.at[pl.ds(i * ROWS, ROWS)])
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    plgpu.barrier_arrive(free.at[i % 2])
                    return c

                jax.lax.fori_loop(0, STEPS, store, 0)

    return kernel


def test_a_producer_warp_and_a_consumer_warp_relay_tiles_through_smem(emulate):
    x = np.random.default_rng(0).standard_normal((STEPS * ROWS, 128)).astype(np.float32)
    (got,) = emulate(relay(), x)
    np.testing.assert_array_equal(np.asarray(got), x)


def test_a_warp_waiting_for_an_arrival_no_warp_makes_is_a_deadlock_naming_the_warps(emulate):
    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((128,), F32),
                       scratch_types=dict(bar=plgpu.Barrier(), other=plgpu.Barrier()))
    def kernel(o_gmem, bar, other):
        @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
        def _():
            warp = jax.lax.axis_index("warp")

            @pl.when(warp == 0)
            def _():
                plgpu.barrier_wait(bar)

            @pl.when(warp == 1)
            def _():
                plgpu.barrier_arrive(other)

    with pytest.raises(EmulationError, match=r"deadlock: .*warp 0 \(of warpgroup 0\) waits: "
                                             r"phase parity 0 of the mbarrier"):
        emulate(kernel)


@pytest.fixture
def _blackwell(monkeypatch):
    monkeypatch.setenv("PALLAS_MOSAIC_GPU_TARGET", "sm_100a")


def warp_specialized_matmul(k_steps=4):
    """o = a @ b by warps: warp 0 of warpgroup 0 copies K-slices in with TMA, warp 1
    issues the MMAs (each frees its slot on a "consumed" barrier; the last one commits);
    warpgroup 1 loads TMEM into registers and stores the result."""
    m, n, bk = 128, 128, 64

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct((m, n), F16), num_threads=2,
        thread_name="wg",
        scratch_types=dict(
            a_smem=plgpu.SMEM((2, m, bk), F16, transforms=SWIZZLED),
            b_smem=plgpu.SMEM((2, bk, n), F16, transforms=SWIZZLED),
            acc=plgpu.TMEM((m, n), F32), out=plgpu.SMEM((m, n), F16),
            loaded=plgpu.Barrier(num_arrivals=2, num_barriers=2),
            consumed=plgpu.Barrier(num_barriers=2, orders_tensor_core=True),
            done=plgpu.Barrier(orders_tensor_core=True)))
    def kernel(a_gmem, b_gmem, o_gmem, a_smem, b_smem, acc, out, loaded, consumed, done):
        @pl.when(jax.lax.axis_index("wg") == 0)
        def _():
            @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
            def _():
                warp = jax.lax.axis_index("warp")

                @pl.when(warp == 0)
                def _():
                    def load(ki, c):
                        slot = jax.lax.rem(ki, 2)

                        @pl.when(ki >= 2)
                        def _():
                            plgpu.barrier_wait(consumed.at[slot])

                        ks = pl.ds(ki * bk, bk)
                        plgpu.copy_gmem_to_smem(a_gmem.at[:, ks], a_smem.at[slot],
                                                loaded.at[slot])
                        plgpu.copy_gmem_to_smem(b_gmem.at[ks, :], b_smem.at[slot],
                                                loaded.at[slot])
                        return c

                    jax.lax.fori_loop(0, k_steps, load, 0)

                @pl.when(warp == 1)
                def _():
                    def mma(ki, c):
                        slot = jax.lax.rem(ki, 2)
                        plgpu.barrier_wait(loaded.at[slot])
                        plgpu.tcgen05_mma(acc, a_smem.at[slot], b_smem.at[slot],
                                          consumed.at[slot], accumulate=ki > 0)
                        return c

                    jax.lax.fori_loop(0, k_steps, mma, 0)
                    plgpu.tcgen05_commit_arrive(done)

        @pl.when(jax.lax.axis_index("wg") == 1)
        def _():
            plgpu.barrier_wait(done)
            out[...] = plgpu.async_load_tmem(acc).astype(F16)
            plgpu.wait_load_tmem()
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out, o_gmem)
            plgpu.wait_smem_to_gmem(0)

    return kernel


@pytest.mark.usefixtures("_blackwell")
def test_a_tma_warp_and_an_mma_warp_compute_a_matmul_on_blackwell(emulate, monkeypatch):
    # Only warpgroup 0 (whose warps wait for each other) gets a strand per warp, on the
    # second run; warpgroup 1 stays one strand of 128 threads.
    runs = []
    execute = launch._execute
    monkeypatch.setattr(launch, "_execute",
                        lambda *a: runs.append(set(a[-1])) or execute(*a))
    a = jax.random.normal(jax.random.key(0), (128, 256), F32).astype(F16)
    b = jax.random.normal(jax.random.key(1), (256, 128), F32).astype(F16)
    (got,) = emulate(warp_specialized_matmul(), a, b)
    assert runs == [set(), {0}]
    want = jnp.dot(a, b, preferred_element_type=F32)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want),
                               rtol=1e-2, atol=5e-2)


@pytest.mark.parametrize("is_warp", [False, True], ids=["warpgroup", "warp"])
def test_a_wait_for_parked_lanes_splits_a_warpgroup_but_not_a_warp(is_warp):
    # Lanes 32-127 parked (mask off) while lanes 0-31 wait for something only they could
    # do: a warpgroup strand asks for warp strands (DivergentWait naming warpgroup 1); a
    # warp strand cannot be split further (unsupported, never a wrong result).
    m = types.SimpleNamespace(mask=np.arange(128) < 32, warpgroup=1, is_warp=is_warp)
    block = sched.Block([m], ["warp 4 (of warpgroup 1)" if is_warp else "warpgroup 1"])
    with pytest.raises(EmulationUnsupported, match="parked at a reconvergence point") as e:
        block.wait_until(m, lambda: False, lambda: "an mbarrier phase")
    assert isinstance(e.value, sched.DivergentWait) != is_warp
    if not is_warp:
        assert e.value.warpgroups == {1}
