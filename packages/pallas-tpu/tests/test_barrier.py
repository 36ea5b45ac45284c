"""``get_barrier_semaphore`` and ``core_barrier``: a semaphore created inside the kernel,
usable with pallas-core's semaphore primitives, and a barrier between TensorCores."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu

F32 = jnp.float32


def _barrier_count_kernel(x_ref, o_ref):
    sem = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(sem, 3)
    pl.semaphore_wait(sem, 2)
    o_ref[...] = x_ref[...] + pl.semaphore_read(sem).astype(F32)


def _barrier_call(x, **kw):
    return pl.pallas_call(_barrier_count_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, F32),
                          compiler_params=pltpu.CompilerParams(collective_id=0), **kw)(x)


def test_barrier_semaphore_counts_signals_and_waits_in_the_interpreter():
    x = jnp.arange(8 * 128, dtype=F32).reshape(8, 128)
    np.testing.assert_array_equal(_barrier_call(x, interpret=True), x + 1.0)


def test_barrier_semaphore_starts_at_zero_in_every_kernel_evaluation():
    x = jnp.zeros((8, 128), F32)
    f = jax.jit(lambda x: _barrier_call(_barrier_call(x, interpret=True), interpret=True))
    np.testing.assert_array_equal(f(x), x + 2.0)


def test_barrier_semaphore_lowers_to_sem_barrier(lower_tpu, ops):
    def kernel(x_ref, o_ref):
        sem = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(sem, 1, device_id=1, device_id_type=pl.DeviceIdType.LOGICAL)
        pl.semaphore_wait(sem, 1)
        o_ref[...] = x_ref[...]

    x = jnp.zeros((8, 128), F32)
    f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, F32),
                                 compiler_params=pltpu.CompilerParams(collective_id=7))(x)
    lowered, (m,) = lower_tpu(f, x)
    names = collections.Counter(ops(m))
    assert names["tpu.sem_barrier"] == 1
    assert names["tpu.sem_signal"] == 1 and names["tpu.sem_wait"] == 1
    assert "device_id" in str(m)


def test_barrier_semaphore_outside_a_kernel_is_an_error():
    with pytest.raises(Exception, match="tpu_get_barrier_semaphore"):
        pltpu.get_barrier_semaphore()


def _core_barrier_kernel(mesh):
    @pl.kernel(out_type=jax.ShapeDtypeStruct((8 * mesh.num_cores, 128), F32), mesh=mesh,
               scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.REGULAR])
    def kernel(x_hbm, o_hbm, buf, sem):
        core = jax.lax.axis_index("core")
        pltpu.sync_copy(x_hbm.at[pl.ds(core * 8, 8)], buf)
        pltpu.core_barrier(sem, core_axis_name="core")
        buf[...] = buf[...] + 1.0
        pltpu.sync_copy(buf, o_hbm.at[pl.ds(core * 8, 8)])

    return kernel


def test_core_barrier_on_one_core_is_a_no_op_in_the_interpreter():
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=1)
    x = jnp.arange(8 * 128, dtype=F32).reshape(8, 128)
    np.testing.assert_array_equal(_core_barrier_kernel(mesh)(x), x + 1.0)


def test_core_barrier_across_cores_is_refused_by_the_sequential_interpreter():
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=2)
    x = jnp.zeros((16, 128), F32)
    with pytest.raises(NotImplementedError, match=r"core_barrier over 2 cores.*one after another"):
        _core_barrier_kernel(mesh)(x)


def test_core_barrier_lowers_to_signals_on_the_other_cores_and_one_wait(lower_tpu, ops):
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=2)
    x = jnp.zeros((16, 128), F32)
    _, (m,) = lower_tpu(lambda a: _core_barrier_kernel(mesh)(a), x)
    names = collections.Counter(ops(m))
    assert names["tpu.sem_signal"] == 2  # each under scf.if (core != i)
    assert names["scf.if"] >= 2
    assert names["tpu.sem_wait"] == 1
    assert "core_id" in str(m)
