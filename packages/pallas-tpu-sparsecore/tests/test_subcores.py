"""The interpreter's model of vector subcores meeting at ``plsc.subcore_barrier``: what
one subcore writes to ``VMEM_SHARED`` (or the output in HBM) before a barrier, every
subcore reads after it; without the barrier a subcore reads the value from before the
phase (reported as uninitialised with the checks on); every subcore must reach every
barrier; different values written to one element in one phase are a reported race."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu
import pallas_tpu_sparsecore as plsc
from pallas_tpu_sparsecore._src.subcores import SubcoreBarrierError

I32 = jnp.int32
N = 4  # vector subcores per SparseCore in these tests


def sds(shape, dtype=I32):
    return jax.ShapeDtypeStruct(shape, dtype)


def mesh(cores=1, subcores=N):
    return plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=cores, num_subcores=subcores)


def neighbour_exchange(barrier: bool, interpret=True):
    """Subcore s writes row s of a VMEM_SHARED buffer, then reads row s+1 (mod N)."""

    @functools.partial(pl.kernel, out_type=sds((N, 8)), mesh=mesh(), interpret=interpret,
                       scratch_types=[pltpu.VMEM_SHARED((N, 8), I32), pltpu.VMEM((8,), I32)])
    def k(x_hbm, o_hbm, shared, v):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[s], v)
        shared[s] = v[...] * 10 + s
        if barrier:
            plsc.subcore_barrier()
        v[...] = shared[(s + 1) % N]
        pltpu.sync_copy(v, o_hbm.at[s])

    return k


X = jnp.arange(N * 8, dtype=I32).reshape(N, 8)
WANT = np.roll(np.asarray(X) * 10 + np.arange(N)[:, None], -1, axis=0)


def test_a_write_before_the_barrier_is_read_by_every_subcore_after_it():
    np.testing.assert_array_equal(neighbour_exchange(barrier=True)(X), WANT)


def test_without_the_barrier_a_subcore_reads_the_value_from_before_the_phase():
    # Even subcore 3, which runs after subcore 0, does not see row 0: the documented
    # result of a missing barrier is the buffer as it was when the phase began
    # (here never written: the interpreter's poison value for int32).
    out = np.asarray(neighbour_exchange(barrier=False)(X))
    assert (out == np.iinfo(np.int32).min).all()


def test_a_missing_barrier_is_reported_with_the_uninitialised_read_check():
    checked = pl.InterpretParams(uninitialized_checks=True)
    np.testing.assert_array_equal(neighbour_exchange(True, checked)(X), WANT)
    with pytest.raises(pl.InterpreterError, match="read of uninitialised memory in scratch"):
        neighbour_exchange(False, checked)(X)


def test_pallas_call_over_a_cores_by_subcores_grid_meets_at_barriers_too():
    def kernel(x_hbm, o_hbm, shared):
        s = pl.program_id(1)
        shared[s] = x_hbm[s] + 1
        plsc.subcore_barrier()
        o_hbm[s] = shared[N - 1 - s]

    any_space = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.pallas_call(kernel, out_shape=sds((N, 8)), grid=(1, N), in_specs=[any_space],
                         out_specs=any_space, interpret=True,
                         scratch_shapes=[pltpu.VMEM_SHARED((N, 8), I32)])(X)
    np.testing.assert_array_equal(out, (np.asarray(X) + 1)[::-1])


def test_barriers_in_a_loop_pass_values_around_a_ring():
    steps = 3

    @functools.partial(pl.kernel, out_type=sds((N, 8)), mesh=mesh(), interpret=True,
                       scratch_types=[pltpu.VMEM_SHARED((N, 8), I32)])
    def k(x_hbm, o_hbm, ring):
        s = jax.lax.axis_index("subcore")
        ring[s] = x_hbm[s]
        plsc.subcore_barrier()

        @pl.loop(0, steps)
        def _(t):
            mine = ring[s] + ring[(s + 1) % N]  # read this phase's values...
            plsc.subcore_barrier()
            ring[s] = mine  # ...then write after everybody has read
            plsc.subcore_barrier()

        o_hbm[s] = ring[s]

    want = np.asarray(X)
    for _ in range(steps):
        want = want + np.roll(want, -1, axis=0)
    np.testing.assert_array_equal(k(X), want)


def test_run_scoped_vmem_shared_is_one_buffer_per_sparsecore():
    @functools.partial(pl.kernel, out_type=sds((2, N)), mesh=mesh(cores=2), interpret=True)
    def k(o_hbm):
        c, s = jax.lax.axis_index("core"), jax.lax.axis_index("subcore")

        def body(shared):
            shared[pl.ds(s, 1)] = jnp.full((1,), 100 * c + s, I32)
            plsc.subcore_barrier()
            o_hbm[c, pl.ds(s, 1)] = shared[pl.ds((s + 1) % N, 1)]

        pl.run_scoped(body, pltpu.VMEM_SHARED((N,), I32))

    want = 100 * np.arange(2)[:, None] + np.roll(np.arange(N), -1)[None, :]
    np.testing.assert_array_equal(k(), want)


def test_a_subcore_that_skips_a_barrier_is_an_error():
    @functools.partial(pl.kernel, out_type=sds((8,)), mesh=mesh(), interpret=True)
    def k(o_hbm):
        @pl.when(jax.lax.axis_index("subcore") != 2)
        def _():
            plsc.subcore_barrier()

    with pytest.raises(SubcoreBarrierError,
                       match=r"vector subcores \[2\] finished while subcores \[0, 1, 3\] wait"):
        k()


def test_a_barrier_under_data_dependent_control_flow_is_not_modelled():
    @functools.partial(pl.kernel, out_type=sds((8,)), mesh=mesh(), interpret=True)
    def k(x_hbm, o_hbm):
        @pl.when(x_hbm[0, 0] > 0)
        def _():
            plsc.subcore_barrier()

    with pytest.raises(NotImplementedError, match="depends on array data"):
        k(X)


def _racy(interpret):
    @functools.partial(pl.kernel, out_type=sds((8,)), mesh=mesh(), interpret=interpret)
    def k(o_hbm):
        o_hbm[...] = jnp.full((8,), jax.lax.axis_index("subcore"), I32)  # every subcore
        plsc.subcore_barrier()

    return k


def test_different_values_written_to_one_element_in_one_phase_are_a_race():
    np.testing.assert_array_equal(_racy(True)(), np.full(8, N - 1))  # the last one wins
    with pytest.raises(pl.InterpreterError, match="two vector subcores wrote different "
                       "values to one element of outputs"):
        _racy(pl.InterpretParams(debug_checks=True))()


def test_core_map_under_run_state_meets_at_barriers_too():
    def run(refs):
        x_ref, o_ref = refs

        @pl.core_map(mesh(), interpret=True,
                     scratch_shapes=[pltpu.VMEM_SHARED((N, 8), I32)])
        def _(shared):
            s = jax.lax.axis_index("subcore")
            shared[s] = x_ref[s] * 10 + s
            plsc.subcore_barrier()
            o_ref[s] = shared[(s + 1) % N]

    _, out = pl.run_state(run)((X, jnp.zeros((N, 8), I32)))
    np.testing.assert_array_equal(out, WANT)


# DMAs with add=True are atomic accumulates on hardware: every subcore's adds land.

F32 = jnp.float32


def _add_rows(num_subcores, add, *, loop=False, checks=True):
    """Every subcore adds rows of ones (with ``add``, in a pl.loop when ``loop``) into
    row 0 of a zeroed VMEM_SHARED buffer; after a barrier subcore 0 copies it out."""

    @functools.partial(pl.kernel, out_type=sds((2, 8), F32), mesh=mesh(subcores=num_subcores),
                       interpret=checks,
                       scratch_types=[pltpu.VMEM_SHARED((2, 8), F32), pltpu.VMEM((1, 8), F32),
                                      pltpu.SemaphoreType.DMA])
    def k(o_hbm, acc, ones, sem):
        s = jax.lax.axis_index("subcore")

        @pl.when(s == 0)
        def _():
            acc[...] = jnp.zeros((2, 8), F32)

        plsc.subcore_barrier()
        ones[...] = jnp.ones((1, 8), F32)
        if loop:
            @pl.loop(0, 3)
            def _(i):
                add(ones, acc.at[pl.ds(0, 1)], sem)
        else:
            add(ones, acc.at[pl.ds(0, 1)], sem)
        plsc.subcore_barrier()

        @pl.when(s == 0)
        def _():
            pltpu.sync_copy(acc, o_hbm)

    return k()


def _sync_add(src, dst, sem):
    pltpu.sync_copy(src, dst, add=True)


def _async_add(src, dst, sem):
    pltpu.async_copy(src, dst, sem, add=True).wait()


@pytest.mark.parametrize("add", [_sync_add, _async_add], ids=["sync_copy", "async_copy"])
def test_add_dmas_of_every_subcore_into_one_shared_row_all_land(add):
    out = np.asarray(_add_rows(16, add, checks=pl.InterpretParams(debug_checks=True)))
    np.testing.assert_array_equal(out, [[16.0] * 8, [0.0] * 8])  # was 1: the last view won


def test_add_dmas_in_a_loop_all_land():
    np.testing.assert_array_equal(_add_rows(N, _async_add, loop=True)[0], np.full(8, 3.0 * N))


def test_indexed_scatter_adds_of_every_subcore_sum_into_shared_rows():
    # A segment sum: subcore s scatter-adds its 4 rows at segment ids that repeat within
    # and across subcores.
    seg = jnp.asarray([0, 1, 0, 2] * N, I32)
    data = jnp.arange(4 * N * 8, dtype=F32).reshape(4 * N, 8)

    @functools.partial(pl.kernel, out_type=sds((3, 8), F32), mesh=mesh(), interpret=True,
                       scratch_types=[pltpu.VMEM_SHARED((3, 8), F32), pltpu.VMEM((4,), I32),
                                      pltpu.VMEM((4, 8), F32), pltpu.SemaphoreType.DMA])
    def k(z_hbm, d_hbm, s_hbm, o_hbm, acc, sv, rows, sem):
        s = jax.lax.axis_index("subcore")

        @pl.when(s == 0)
        def _():
            pltpu.sync_copy(z_hbm, acc)

        plsc.subcore_barrier()
        pltpu.sync_copy(s_hbm.at[pl.ds(4 * s, 4)], sv)
        pltpu.sync_copy(d_hbm.at[pl.ds(4 * s, 4)], rows)
        pltpu.async_copy(rows, acc.at[sv], sem, add=True).wait()
        plsc.subcore_barrier()

        @pl.when(s == 0)
        def _():
            pltpu.sync_copy(acc, o_hbm)

    zeros = jnp.zeros((3, 8), F32)
    np.testing.assert_allclose(k(zeros, data, seg), zeros.at[seg].add(data), rtol=1e-6)


def _plain_and_add(interpret):
    """Subcore 0 stores 10 into row 0 of the output while every subcore adds ones to it
    (subcore 0 after its store)."""

    @functools.partial(pl.kernel, out_type=sds((1, 8), F32), mesh=mesh(), interpret=interpret,
                       scratch_types=[pltpu.VMEM_SHARED((1, 8), F32), pltpu.VMEM((1, 8), F32)])
    def k(o_hbm, unused, ones):
        s = jax.lax.axis_index("subcore")

        @pl.when(s == 0)
        def _():
            o_hbm[...] = jnp.full((1, 8), 10.0, F32)

        ones[...] = jnp.ones((1, 8), F32)
        pltpu.sync_copy(ones, o_hbm, add=True)
        plsc.subcore_barrier()

    return k


def test_a_plain_write_and_another_subcores_add_to_one_element_are_a_race():
    # Unchecked, the adds land on the plain write (subcore 0's own add comes after its
    # store in program order, so it is in its contents).
    np.testing.assert_array_equal(_plain_and_add(True)(), np.full((1, 8), 10.0 + N))
    with pytest.raises(pl.InterpreterError, match="subcore's DMA with add=True and another "
                       "subcore's plain write to one element of outputs"):
        _plain_and_add(pl.InterpretParams(debug_checks=True))()
