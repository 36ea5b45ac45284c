"""TPU interpret mode (``interpret=pltpu.InterpretParams(...)``): the simulated TPU.

Races between cores and DMAs are reported with both kernel locations, parallel grid
axes are split across cores, DMAs run when the options say, and the options that
change results (uninitialised memory, out-of-bounds reads, skipped float ops) do.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu
from pallas_tpu import interpret as pti

ANY = pltpu.MemorySpace.ANY
X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)


def _copy_kernel(wait_before_read: bool):
    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        if wait_before_read:
            copy.wait()
            o_ref[...] = buf[...]
        else:
            o_ref[...] = buf[...]  # reads the DMA's destination while it is in flight
            copy.wait()

    return kernel


def _dma_call(kernel, **params):
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
        in_specs=[pl.BlockSpec(memory_space=ANY)],
        scratch_shapes=[pltpu.VMEM(X.shape, X.dtype), pltpu.SemaphoreType.DMA],
        interpret=pltpu.InterpretParams(**params))


def test_a_read_of_a_dma_destination_before_its_wait_is_a_race(capsys):
    out = _dma_call(_copy_kernel(False), detect_races=True)(X)
    jax.block_until_ready(out)
    report = pti.race_report()
    assert report.races_found
    race = report.races[0]
    text = str(race)
    assert "DMA" in text and "test_interpret_mode.py" in text  # both sides located
    assert "RACE DETECTED" in capsys.readouterr().out
    pti.reset_races()
    assert not pti.race_report().races_found


def test_waiting_before_the_read_is_race_free_and_correct():
    out = _dma_call(_copy_kernel(True), detect_races=True)(X)
    np.testing.assert_array_equal(out, X)
    assert not pti.races.races_found


def test_on_wait_dmas_move_data_only_at_the_wait():
    # Without the wait before the read, the buffer still holds uninitialised memory.
    out = _dma_call(_copy_kernel(False), uninitialized_memory="zero")(X)
    np.testing.assert_array_equal(out, 0.0)
    out = _dma_call(_copy_kernel(False), dma_execution_mode="eager")(X)
    np.testing.assert_array_equal(out, X)


def _two_core_call(kernel, detect_races, num_cores=2):
    return pl.pallas_call(
        kernel, grid=(2,), out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
        scratch_shapes=[pltpu.VMEM(X.shape, X.dtype)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=pltpu.InterpretParams(num_cores_or_threads=num_cores,
                                        detect_races=detect_races))


def test_two_cores_writing_one_output_block_race():
    def kernel(x_ref, o_ref, scratch):
        scratch[...] = x_ref[...]
        o_ref[...] = scratch[...] * 2.0

    out = _two_core_call(kernel, True)(X)
    np.testing.assert_array_equal(out, 2.0 * X)
    assert pti.races.races_found  # both cores copy the whole output back to HBM
    _two_core_call(kernel, True, num_cores=1)(X)
    assert not pti.races.races_found


def test_parallel_axes_are_split_across_cores():
    seen = []
    lock = threading.Lock()

    def record(token, point, core):
        with lock:
            seen.append((tuple(int(i) for i in point), int(core)))
        return token

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    x = jnp.zeros((32, 128), jnp.float32)
    out = pl.pallas_call(
        kernel, grid=(4,), out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=pltpu.InterpretParams(num_cores_or_threads=2, detect_races=True,
                                        grid_point_recorder=record))(x)
    np.testing.assert_array_equal(out, 1.0)
    assert not pti.races.races_found
    assert sorted(p for p, _ in seen) == [(0,), (1,), (2,), (3,)]
    assert sorted(c for _, c in seen) == [0, 0, 1, 1]


def test_core_barrier_orders_the_cores_of_a_core_map():
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=2)

    def run(barrier: bool):
        @jax.jit
        def f(x):
            def inner(refs):
                x_ref, o_ref = refs

                @pl.core_map(mesh, interpret=pltpu.InterpretParams(detect_races=True))
                def _():
                    c = jax.lax.axis_index("core")

                    def body(vmem, sem, barrier_sem):
                        @pl.when(c == 0)
                        def _():
                            pltpu.sync_copy(x_ref, o_ref)

                        if barrier:
                            pltpu.core_barrier(barrier_sem, core_axis_name="core")

                        @pl.when(c == 1)
                        def _():
                            pltpu.sync_copy(o_ref, vmem)
                            vmem[...] = vmem[...] + 1.0
                            pltpu.sync_copy(vmem, o_ref)

                    pl.run_scoped(body, pltpu.VMEM(X.shape, X.dtype),
                                  pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.REGULAR)

            _, out = pl.run_state(inner)((x, jnp.zeros_like(x)))
            return out

        return f(X)

    np.testing.assert_array_equal(run(barrier=True), X + 1.0)
    assert not pti.races.races_found
    run(barrier=False)
    assert pti.races.races_found


def test_force_tpu_interpret_mode_retraces_jitted_calls():
    traces = [0]

    @jax.jit
    def f(x):
        traces[0] += 1
        return _two_core_call(lambda x_ref, o_ref, s: o_ref.__setitem__(
            ..., x_ref[...] + 1.0), False, num_cores=1)(x)

    f(X)
    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(detect_races=True)):
        np.testing.assert_array_equal(f(X), X + 1.0)
    assert traces[0] == 2


def test_skip_floating_point_ops_and_uninitialized_memory():
    def kernel(x_ref, i_ref, o_ref, j_ref, scratch):
        o_ref[...] = jnp.exp(x_ref[...])
        j_ref[...] = i_ref[...] + scratch[...]

    def call(**params):
        return pl.pallas_call(
            kernel, out_shape=(jax.ShapeDtypeStruct(X.shape, X.dtype),
                               jax.ShapeDtypeStruct((8, 128), jnp.int32)),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.int32)],
            interpret=pltpu.InterpretParams(**params))(X, jnp.ones((8, 128), jnp.int32))

    o, j = call(skip_floating_point_ops=True, uninitialized_memory="zero")
    assert np.all(np.isinf(o))
    np.testing.assert_array_equal(j, 1)
    _, j = call()  # uninitialised integers read as the largest value
    np.testing.assert_array_equal(j, np.iinfo(np.int32).min)  # max + 1 wraps around


def test_out_of_bounds_reads_raise_or_read_uninitialised():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(pl.program_id(0) + 4, 8), :]  # rows 4..11 of 8

    def call(mode):
        return pl.pallas_call(
            kernel, grid=(1,), out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            interpret=pltpu.InterpretParams(out_of_bounds_reads=mode))(X)

    with pytest.raises(Exception, match="Out-of-bounds read"):
        jax.block_until_ready(call("raise"))
    out = np.asarray(call("uninitialized"))
    np.testing.assert_array_equal(out[:4], X[4:])
    assert np.all(np.isnan(out[4:]))


def test_params_are_checked():
    with pytest.raises(ValueError, match="at least 1"):
        pltpu.InterpretParams(num_cores_or_threads=0)
    with pytest.raises(ValueError, match="out_of_bounds_reads"):
        pltpu.InterpretParams(out_of_bounds_reads="wrap")
    with pytest.raises(ValueError, match="greater than the total number"):
        pltpu.InterpretParams(num_cores_or_threads=4, vector_clock_size=4)\
            .get_vector_clock_size(1)


def test_thread_map_runs_all_threads_at_once():
    barrier = threading.Barrier(4)

    def meet():
        barrier.wait(timeout=30)  # only returns once all four threads are here

    def f(i, token):
        jax.experimental.io_callback(meet, (), ordered=True)
        return token

    assert int(pti.thread_map(f, 4, jnp.int32(7))) == 7


def test_logging_mode_prints_semaphore_and_memory_events(capsys):
    from pallas_tpu.interpret import LoggingMode

    mode = LoggingMode.SEMAPHORE | LoggingMode.SHARED_MEMORY
    jax.block_until_ready(_dma_call(_copy_kernel(True), logging_mode=mode)(X))
    out = capsys.readouterr().out
    assert "waited for" in out and "copied" in out and "allocated" in out
    jax.block_until_ready(_dma_call(_copy_kernel(True))(X))
    assert "TPU interpret mode" not in capsys.readouterr().out


def test_masked_swap_returns_val_in_masked_off_lanes():
    """The simulated TPU's masked swap is the core's partial exchange: the ref takes
    ``val`` where the mask holds, and the result is ``where(mask, old, val)``."""
    def kernel(x_ref, y_ref, o_ref, old_ref):
        o_ref[...] = y_ref[...]
        mask = jax.lax.broadcasted_iota(jnp.int32, X.shape, 1) % 3 == 0
        old_ref[...] = pl.swap(o_ref, (slice(None), slice(None)), x_ref[...], mask=mask)

    out, old = pl.pallas_call(kernel, out_shape=(jax.ShapeDtypeStruct(X.shape, X.dtype),) * 2,
                              interpret=pltpu.InterpretParams())(X, -X)
    mask = np.arange(128)[None] % 3 == 0
    np.testing.assert_array_equal(out, np.where(mask, X, -X))
    np.testing.assert_array_equal(old, np.where(mask, -X, X))


def test_a_dma_of_a_slice_with_a_traced_size_copies_that_many_rows():
    """``pl.ds(start, size)`` with ``size`` computed in the kernel: the DMA's views have
    a traced size, resolved when the copy runs (and checked by its wait)."""

    def kernel(n_ref, x_hbm, o_hbm, sem):
        n = n_ref[0] * 8
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, n)], o_hbm.at[pl.ds(0, n)], sem)
        copy.start()
        copy.wait()

    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    params = pltpu.InterpretParams(detect_races=True, uninitialized_memory="zero")
    for rows in (1, 3):
        out = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA], interpret=params,
        )(jnp.array([rows], jnp.int32), x)
        np.testing.assert_array_equal(out[:rows * 8], x[:rows * 8])
        np.testing.assert_array_equal(out[rows * 8:], 0)
        assert not pti.race_report().races_found
