"""On an emulated TPU, a SparseCore kernel is lowered and compiled for the chip (what they
refuse is raised as on the device), then is a clear error: nothing executes the Mosaic
SparseCore code the backend generates (no ``emulate`` level), and the error says to run
it with ``interpret=True``; the device queries answer for the emulated chip. A kernel
addressing other devices runs with the interpreter's cross-device semantics."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_tpu as pltpu
import pallas_tpu_sparsecore as plsc


def test_sparse_core_info_follows_the_emulated_chip():
    with pl.emulate_device("tpu:v5p"):
        assert plsc.get_sparse_core_info().num_cores == 4
    with pl.emulate_device("tpu:v5e"), pytest.raises(RuntimeError, match="SparseCores"):
        plsc.get_sparse_core_info()


def test_a_sparse_core_kernel_names_the_missing_executor():
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1)
    x = jnp.arange(8, dtype=jnp.float32)

    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh)
    def copy(x_hbm, o_hbm):
        # (A direct o_hbm[...] = x_hbm[...] is refused by the lowering: HBM is reached
        # by DMA on a SparseCore.)
        pl.run_scoped(lambda buf: (pltpu.sync_copy(x_hbm, buf), pltpu.sync_copy(buf, o_hbm)),
                      pltpu.VMEM(x.shape, x.dtype))

    with pl.emulate_device("tpu:v5p"), pytest.raises(
            pl.EmulationError, match=r"mosaic_sparsecore.*\(it was lowered and compiled for "
                                     r"tpu:v5p\).*interpret=True"):
        copy(x)


def test_what_the_lowering_refuses_is_raised_before_the_missing_executor():
    # As on the device: the kernel is lowered (and compiled) first, so a kernel the
    # SparseCore lowering refuses gets that error, not the emulation's.
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1)
    x = jnp.arange(16, dtype=jnp.float32)  # 16 lanes: more than a v5p vector subcore's 8

    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh)
    def double(x_hbm, o_hbm):
        def body(x_ref):
            pltpu.sync_copy(x_hbm, x_ref)
            x_ref[...] = x_ref[...] * 2
            pltpu.sync_copy(x_ref, o_hbm)

        pl.run_scoped(body, pltpu.VMEM(x.shape, x.dtype))

    with pl.emulate_device("tpu:v5p"), pytest.raises(Exception, match="8 lanes of a TPU v5p"):
        double(x)


_RING = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    import pallas as pl
    import pallas_tpu as pltpu
    import pallas_tpu_sparsecore as plsc

    @pl.kernel(out_type=jax.ShapeDtypeStruct((8, 128), jnp.int32),
               mesh=plsc.ScalarSubcoreMesh(axis_name="core", num_cores=1),
               scratch_types=(pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.DMA,
                              pltpu.SemaphoreType.DMA))
    def kernel(x_ref, y_ref, ready, send, recv):
        right = lax.rem(lax.axis_index("x") + 1, lax.axis_size("x"))
        pl.semaphore_signal(ready, device_id=right)
        pl.semaphore_wait(ready)
        pltpu.async_remote_copy(x_ref, y_ref, send, recv, device_id=right).wait()

    mesh = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jnp.arange(4 * 8 * 128, dtype=jnp.int32).reshape(4 * 8, 128)
    with pl.emulate_device("tpu:v5p"):
        y = jax.jit(jax.shard_map(kernel, mesh=mesh, in_specs=jax.P("x"),
                                  out_specs=jax.P("x"), check_vma=False))(x)
    np.testing.assert_array_equal(y, jnp.concatenate([x[-8:], x[:-8]]))
    print("ok ring")
''')


def test_a_sparse_core_kernel_addressing_other_devices_runs_with_their_semantics():
    """No executor runs one device's SparseCore code, but a kernel that addresses other
    devices needs none: as a TensorCore kernel's, it runs with the interpreter's
    cross-device semantics over the shard_map's CPU devices (it was compiled alone first,
    outside its shard_map, and failed on ``lax.axis_index``). A ring shift on 4 devices."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", _RING], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "ok ring" in proc.stdout, proc.stdout + proc.stderr
