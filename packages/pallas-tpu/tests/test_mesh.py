"""``create_tensorcore_mesh`` with ``pl.kernel``, and ``run_on_first_core``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu


def _scale_rows(mesh, x):
    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32),
                              pltpu.SMEM((1,), jnp.int32)])
    def kernel(x_hbm, o_hbm, buf, flag):
        core = jax.lax.axis_index("core")
        pltpu.sync_copy(x_hbm.at[pl.ds(core * 8, 8)], buf)
        flag[0] = 0

        @pltpu.run_on_first_core("core")
        def _():
            flag[0] = 1

        buf[...] = buf[...] * 2.0 + flag[0].astype(jnp.float32)
        pltpu.sync_copy(buf, o_hbm.at[pl.ds(core * 8, 8)])

    return kernel(x)


def test_tensorcore_mesh_in_the_interpreter():
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=2)
    assert mesh.shape == {"core": 2} and mesh.backend == "mosaic_tpu"
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    out = _scale_rows(mesh, x)
    want = x * 2.0 + jnp.repeat(jnp.array([1.0, 0.0]), 8)[:, None]
    np.testing.assert_allclose(out, want)


def test_tensorcore_mesh_lowers_core_parallel(lower_tpu):
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=2)
    x = jnp.zeros((16, 128), jnp.float32)
    _, (m,) = lower_tpu(lambda a: _scale_rows(mesh, a), x)
    text = str(m)
    assert "#tpu.dimension_semantics<core_parallel>" in text
    assert "iteration_bounds = array<i64: 2>" in text
    assert "memref<1xi32, #tpu.memory_space<smem>>" in text


def test_mesh_defaults_to_one_core_off_tpu():
    assert pltpu.create_tensorcore_mesh("c").num_cores == 1
    with pytest.raises(ValueError):
        pltpu.create_tensorcore_mesh("c", num_cores=0)


def test_tensorcore_mesh_devices_are_its_cores():
    """As upstream, ``mesh.devices`` holds one entry per TensorCore (upstream's
    tpu_pallas_memory_space_test reads ``len(mesh.devices)``; it was None)."""
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=2)
    assert len(mesh.devices) == 2 and [c.id for c in mesh.devices] == [0, 1]
    assert len(pltpu.create_tensorcore_mesh("core").devices) == 1  # CPU: one core
    with pytest.raises(ValueError, match="both devices and num_cores"):
        pltpu.create_tensorcore_mesh("core", devices=jax.devices()[:1], num_cores=1)


def test_a_ref_made_in_smem_is_read_and_written_directly_by_core_maps():
    # upstream's tpu_pallas_memory_space_test.test_smem_copy: pl.empty_ref_like of a
    # memory-space type makes a ref in that space; core_map bodies index it directly
    # (an HBM ref would need a DMA, and is refused).
    mesh = pltpu.create_tensorcore_mesh("core")

    @jax.jit
    def f():
        y_ref = pl.empty_ref_like(pltpu.SMEM((8,), jnp.int32))
        assert jax.typeof(y_ref).memory_space == pltpu.SMEM

        @pl.core_map(mesh)
        def _():
            for i in range(8):
                y_ref[i] = i

        @pl.core_map(mesh)
        def _():
            for i in range(8):
                y_ref[i] = y_ref[i] + 1

        return y_ref[...]

    np.testing.assert_array_equal(f(), np.arange(8) + 1)

    @jax.jit
    def g(x):
        x_ref = jax.new_ref(x)  # no memory space: HBM

        @pl.core_map(mesh)
        def _():
            x_ref[0] = 1

        return x_ref[...]

    with pytest.raises(ValueError, match="HBM or ANY cannot be referenced directly"):
        g(jnp.zeros((8,), jnp.int32))


def test_a_core_map_closing_over_a_traced_value_runs_emulated():
    # upstream's tpu_pallas_pipeline_test test_can_partition_grid (dynamic grid): the
    # body uses a value computed inside jit (a loop bound). TPU interpret mode, which
    # runs core_map on the emulated device, converted it with numpy while tracing
    # (TracerArrayConversionError) and then handed it to the body as a buffer.
    @jax.jit
    def f(n):
        o_ref = jax.empty_ref(jax.ShapeDtypeStruct((2, 8, 128), jnp.int32))

        @pl.core_map(pltpu.create_tensorcore_mesh("core", num_cores=2))
        def _():
            def body(acc):
                acc[...] = jnp.zeros_like(acc)

                @pl.loop(0, n)
                def _(i):
                    acc[...] += i + 1

                pltpu.sync_copy(acc, o_ref.at[jax.lax.axis_index("core")])

            pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.int32))

        return jax.freeze(o_ref)

    with pl.emulate_device("tpu:v5e"):
        out = f(jnp.int32(4))
    np.testing.assert_array_equal(out, np.full((2, 8, 128), 1 + 2 + 3 + 4))
