"""GPU interpret mode: threads of a block run concurrently, share SMEM scratch,
synchronise with barriers, and unsynchronised conflicting accesses are reported."""

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


@pytest.fixture(autouse=True)
def _fresh_state():
    gpu_interpret.reset_gpu_interpret_mode_state()
    yield
    gpu_interpret.reset_gpu_interpret_mode_state()


def races() -> bool:
    return gpu_interpret.get_races().races_found


def test_each_thread_sees_its_index_and_disjoint_writes_do_not_race():
    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((2, 3, 4), jnp.int32),
                       grid=(2,), grid_names=("g",), num_threads=4, thread_name="t",
                       cluster=(3,), cluster_names=("c",),
                       interpret=IP(detect_races=True))
    def k(o_ref):
        g, c, t = (jax.lax.axis_index(n) for n in "gct")
        o_ref[g, c, t] = g * 100 + c * 10 + t

    out = jax.jit(k)()
    expected = np.arange(2)[:, None, None] * 100 + np.arange(3)[None, :, None] * 10 + (
        np.arange(4)[None, None, :])
    np.testing.assert_array_equal(out, expected)
    assert not races()


def test_two_threads_writing_one_element_race():
    @pl.run_state
    def k(o_ref):
        @pl.core_map(plgpu.Mesh(num_threads=2, thread_name="x"),
                     interpret=IP(detect_races=True))
        def _():
            o_ref[...] = jax.lax.axis_index("x")

    k(jnp.zeros((), jnp.int32))
    report = gpu_interpret.get_races()
    assert report.races_found
    assert "thread (x=0)" in str(report) and "thread (x=1)" in str(report)


def test_a_barrier_orders_a_producer_before_its_consumer():
    x = jnp.arange(128, dtype=jnp.float32)

    @functools.partial(plgpu.kernel, out_type=x, num_threads=2, thread_name="t",
                       scratch_types=dict(smem=plgpu.SMEM(x.shape, x.dtype),
                                          bar=plgpu.Barrier()),
                       interpret=IP(detect_races=True))
    def k(x_ref, o_ref, smem, bar):
        t = jax.lax.axis_index("t")

        @pl.when(t == 1)  # the consumer runs first in the simulation and must wait
        def _():
            plgpu.barrier_wait(bar)
            o_ref[...] = smem[...] * 2

        @pl.when(t == 0)
        def _():
            smem[...] = x_ref[...] + 1
            plgpu.barrier_arrive(bar)

    np.testing.assert_array_equal(k(x), (x + 1) * 2)
    assert not races()


def test_warps_of_a_warp_mesh_wait_on_barriers_other_warps_arrive_on():
    """``pl.core_map(plgpu.WarpMesh(...))`` inside a kernel: each warp runs as its own
    task, so warp 0 may wait for what warp 1 produces (a TMA warp and an MMA warp)."""
    x = jnp.arange(128, dtype=jnp.float32)

    @functools.partial(plgpu.kernel, out_type=x,
                       scratch_types=dict(smem=plgpu.SMEM(x.shape, x.dtype),
                                          bar=plgpu.Barrier()),
                       interpret=IP())
    def k(x_ref, o_ref, smem, bar):
        @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
        def _():
            warp = jax.lax.axis_index("warp")

            @pl.when(warp == 0)  # runs first in the simulation and must wait
            def _():
                plgpu.barrier_wait(bar)
                o_ref[...] = smem[...] * 2

            @pl.when(warp == 1)
            def _():
                smem[...] = x_ref[...] + 1
                plgpu.barrier_arrive(bar)

    np.testing.assert_array_equal(k(x), (x + 1) * 2)


def test_without_the_barrier_the_same_kernel_races():
    x = jnp.arange(8, dtype=jnp.float32)

    @functools.partial(plgpu.kernel, out_type=x, num_threads=2, thread_name="t",
                       scratch_types=[plgpu.SMEM(x.shape, x.dtype)],
                       interpret=IP(detect_races=True))
    def k(x_ref, o_ref, smem):
        t = jax.lax.axis_index("t")

        @pl.when(t == 0)
        def _():
            smem[...] = x_ref[...]

        @pl.when(t == 1)
        def _():
            o_ref[...] = smem[...]

    k(x)
    assert races()


def test_a_phase_needs_num_arrivals_arrivals():
    n = 5

    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((), jnp.int32),
                       num_threads=n, thread_name="t",
                       scratch_types=dict(smem=plgpu.SMEM((n - 1,), jnp.int32),
                                          bar=plgpu.Barrier(num_arrivals=n - 1)),
                       interpret=IP(detect_races=True))
    def k(o_ref, smem, bar):
        t = jax.lax.axis_index("t")

        @pl.when(t == 0)
        def _():
            plgpu.barrier_wait(bar)
            o_ref[...] = jnp.sum(smem[...])

        @pl.when(t > 0)
        def _():
            smem[t - 1] = t
            plgpu.barrier_arrive(bar)

    assert int(k()) == sum(range(n))
    assert not races()


def _one_thread_kernel(body, n_threads=1, **scratch):
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((), jnp.int32),
                        num_threads=n_threads, thread_name="t", scratch_types=scratch,
                        interpret=IP())


def test_completing_a_phase_nobody_observed_twice_is_an_error():
    def body(o_ref, bar):
        plgpu.barrier_arrive(bar)
        plgpu.barrier_arrive(bar)
        o_ref[...] = 1

    with pytest.raises(Exception, match="completed again before previous completion was "
                                        "observed"):
        _one_thread_kernel(body, bar=plgpu.Barrier())()


def test_waiting_for_an_old_phase_is_an_error():
    def body(o_ref, bar):
        t = jax.lax.axis_index("t")

        @pl.when(t == 0)
        def _():
            plgpu.barrier_arrive(bar.at[0])

        @pl.when(t == 1)
        def _():
            plgpu.barrier_wait(bar.at[0])
            plgpu.barrier_arrive(bar.at[0])
            plgpu.barrier_arrive(bar.at[1])

        @pl.when(t == 2)
        def _():
            plgpu.barrier_wait(bar.at[1])
            plgpu.barrier_wait(bar.at[0])
            o_ref[...] = 1

    with pytest.raises(Exception, match="Thread 2 is awaiting phase 1, but barrier is "
                                        "already at phase 2"):
        _one_thread_kernel(body, 3, bar=plgpu.Barrier(num_barriers=2))()


def test_a_waiting_thread_must_observe_every_phase_by_the_end():
    def body(o_ref, bar):
        t = jax.lax.axis_index("t")

        @pl.when(t == 0)
        def _():
            plgpu.barrier_arrive(bar)

        @pl.when(t == 1)
        def _():
            plgpu.barrier_wait(bar)
            plgpu.barrier_arrive(bar)

    with pytest.raises(Exception, match=r"Thread 1 did not observe all phases \(2\)"):
        _one_thread_kernel(body, 2, bar=plgpu.Barrier())()


def test_a_wait_nobody_satisfies_is_a_deadlock_naming_the_barrier():
    def body(o_ref, bar):
        plgpu.barrier_wait(bar)

    with pytest.raises(Exception, match="(?s)deadlocked.*waits for phase 1 of barrier"):
        _one_thread_kernel(body, bar=plgpu.Barrier())()


def test_unindexed_barrier_arrays_are_rejected_at_trace_time():
    def body(o_ref, bar):
        plgpu.barrier_arrive(bar)

    with pytest.raises(ValueError, match="without indexing, but `num_barriers = 2`"):
        _one_thread_kernel(body, bar=plgpu.Barrier(num_barriers=2))()


@pytest.mark.parametrize(("axes", "message"), [
    (("c",), "Collective allocations along cluster axes are not supported"),
    ((), "Scoped allocation must have the thread axis in its collective axes"),
    (("nope",), r"Collective axis `nope` not found among axes `\['c', 't'\]`"),
])
def test_collective_allocations_follow_upstreams_rules(axes, message):
    mesh = plgpu.Mesh(cluster=(2,), cluster_names=("c",), num_threads=2, thread_name="t")

    @jax.jit
    def f(x):
        def inner(o_ref):
            @pl.core_map(mesh, interpret=IP())
            def _():
                def body(_):
                    o_ref[...] = 42

                pl.run_scoped(body, plgpu.SMEM((2,), jnp.int32), collective_axes=axes)

        return pl.run_state(inner)(x)

    with pytest.raises(Exception, match=message):
        f(jnp.zeros((), jnp.int32))


def test_interpret_true_runs_a_gpu_kernel_in_gpu_interpret_mode():
    # The consumer thread runs first and waits: only GPU interpret mode can run this.
    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((), jnp.int32),
                       num_threads=2, thread_name="t", interpret=True,
                       scratch_types=dict(smem=plgpu.SMEM((), jnp.int32), bar=plgpu.Barrier()))
    def k(o_ref, smem, bar):
        @pl.when(jax.lax.axis_index("t") == 0)
        def _():
            plgpu.barrier_wait(bar)
            o_ref[...] = smem[...]

        @pl.when(jax.lax.axis_index("t") == 1)
        def _():
            smem[...] = 7
            plgpu.barrier_arrive(bar)

    assert int(k()) == 7


def test_skip_floating_point_ops_makes_float_results_inf():
    def body(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] @ y_ref[...]

    x = jnp.ones((16, 16), jnp.float32)
    f = pl.pallas_call(body, out_shape=x, interpret=IP(skip_floating_point_ops=True))
    np.testing.assert_array_equal(jax.jit(f)(x, x), jnp.full_like(x, jnp.inf))
