"""SparseCore kernels lower for TPU on this CPU machine: a Mosaic module whose kernel
has a SparseCore core type, verified with the TPU dialect loaded, inside a
``tpu_custom_call`` of device type SparseCore; ``jax.export`` serialises it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_tpu as pltpu
import pallas_tpu_sparsecore as plsc
from pallas_tpu.inspect import backend_configs, op_names

F32, I32 = jnp.float32, jnp.int32


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def _gather_kernel(lanes, interpret=False, **kw):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", **kw)

    @functools.partial(pl.kernel, out_type=sds((lanes,), F32), mesh=mesh, interpret=interpret,
                       scratch_types=[pltpu.VMEM((64,), F32), pltpu.VMEM((lanes,), I32),
                                      pltpu.VMEM((lanes,), F32)])
    def k(t_hbm, i_hbm, o_hbm, t, i, o):
        pltpu.sync_copy(t_hbm, t)
        pltpu.sync_copy(i_hbm, i)
        o[...] = plsc.load_gather(t, [i[...]])
        plsc.addupdate_scatter(t, [i[...]], o[...])
        pltpu.sync_copy(o, o_hbm)

    return k


def test_vector_subcore_kernel_is_a_sparsecore_custom_call(lanes, lower_tpu):
    args = (jnp.zeros((64,), F32), jnp.zeros((lanes,), I32))
    lowered, (module,) = lower_tpu(_gather_kernel(lanes), *args)
    (cfg,) = backend_configs(lowered)
    assert cfg["device_type"] == "DEVICE_TYPE_SPARSECORE"
    assert cfg["sparse_core_config"] == {"tiling": "TILING_COMPACT"}  # upstream's default
    text = str(module)
    assert "tpu.core_type = #tpu.core_type<sc_vector_subcore>" in text
    assert "#tpu.dimension_semantics<core_parallel>, #tpu.dimension_semantics<subcore_parallel>" \
        in text
    assert "iteration_bounds = array<i64: 2, 16>" in text  # TPU7x: 2 cores x 16 subcores
    ops = op_names(module)
    assert {"tpu.vector_load_idx", "tpu.vector_store_idx", "tpu.enqueue_dma"} <= set(ops)


def test_export_serialises(lanes):
    args = (jnp.zeros((64,), F32), jnp.zeros((lanes,), I32))
    exported = jax.export.export(jax.jit(_gather_kernel(lanes)), platforms=["tpu"])(*args)
    assert len(exported.serialize()) > 0


def test_scalar_subcore_kernel(lower_tpu):
    mesh = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=1)

    @functools.partial(pl.kernel, out_type=sds((8,), I32), mesh=mesh,
                       scratch_types=[pltpu.SMEM((8,), I32)])
    def k(x_hbm, o_hbm, s):
        pltpu.sync_copy(x_hbm, s)

        @pl.loop(0, 8)
        def _(i):
            s[i] = s[i] * 2 + jax.lax.axis_index("core")

        pltpu.sync_copy(s, o_hbm)

    _, (module,) = lower_tpu(k, jnp.arange(8, dtype=I32))
    text = str(module)
    assert "#tpu.core_type<sc_scalar_subcore>" in text
    assert {"memref.load", "memref.store", "scf.for"} <= set(op_names(module))


def test_vector_primitives_lower_to_their_tpu_ops(lanes, lower_tpu):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)

    @functools.partial(pl.kernel, out_type=sds((lanes,), I32), mesh=mesh,
                       scratch_types=[pltpu.VMEM((lanes,), I32), pltpu.VMEM((lanes,), F32)])
    def k(x_hbm, o_hbm, v, f):
        pltpu.sync_copy(x_hbm, v)
        x = v[...]
        mask = x > 3
        a = plsc.cumsum(x, mask=mask) + plsc.cummax(x)
        c, last = plsc.scan_count(x)
        keys, vals = plsc.sort_key_val(x, a)
        a = a + c + keys + vals + plsc.all_reduce_population_count(mask)
        a = a + plsc.all_reduce_ffs(last)
        lo, hi = plsc.unpack(plsc.pack(a, a, format=plsc.PackFormat.INTERLEAVED),
                             format=plsc.PackFormat.INTERLEAVED)
        f[...] = plsc.bitcast(lo + hi, F32)
        plsc.store_compressed(v, plsc.bitcast(f[...], I32), mask=mask)
        plsc.addupdate(v, plsc.load_expanded(v, mask=mask))
        plsc.subcore_barrier()

        @plsc.parallel_loop(0, 4, unroll=2)
        def _(i):
            plsc.addupdate_compressed(v, x + i, mask=mask)

        pltpu.sync_copy(v, o_hbm)

    _, (module,) = lower_tpu(k, jnp.arange(lanes, dtype=I32))
    ops = set(op_names(module))
    assert {"tpu.scan", "tpu.scan_count", "tpu.sort", "tpu.all_reduce", "tpu.pack_subelements",
            "tpu.unpack_subelements", "vector.bitcast", "tpu.vector_load", "tpu.vector_store",
            "tpu.barrier", "scf.for"} <= ops
    assert "sc.parallel_access" in str(module) and "sc.loop_unroll_factor = 2" in str(module)


def test_indexed_dma_lowers_to_indirect_dma(lanes, lower_tpu):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)

    @functools.partial(pl.kernel, out_type=sds((64, 8), F32), mesh=mesh,
                       scratch_types=[pltpu.VMEM((lanes,), I32), pltpu.VMEM((lanes, 8), F32),
                                      pltpu.SemaphoreType.DMA])
    def k(t_hbm, i_hbm, o_hbm, iv, rows, sem):
        pltpu.sync_copy(i_hbm, iv)
        pltpu.async_copy(t_hbm.at[iv[...]], rows, sem).wait()
        pltpu.async_copy(rows, o_hbm.at[iv[...]], sem, add=True).wait()

    _, (module,) = lower_tpu(k, jnp.zeros((64, 8), F32), jnp.zeros((lanes,), I32))
    ops = op_names(module)
    assert ops.count("tpu.enqueue_indirect_dma") == 2 and ops.count("tpu.wait_indirect_dma") == 2
    assert "add = true" in str(module)


def test_sparse_core_tiling_when_tc_tiling_is_turned_off(lanes, lower_tpu):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s")
    got = []
    for tc in (None, True, False):
        k = functools.partial(pl.kernel, out_type=sds((lanes,), F32), mesh=mesh,
                              compiler_params=pltpu.CompilerParams(use_tc_tiling_on_sc=tc))(
            lambda o: None)
        lowered, _ = lower_tpu(k)
        got.append(backend_configs(lowered)[0]["sparse_core_config"]["tiling"])
    assert got == ["TILING_COMPACT", "TILING_COMPACT", "TILING_SPARSE_CORE"]


def test_lowering_for_cpu_without_interpret_is_an_error(lanes):
    args = (jnp.zeros((64,), F32), jnp.zeros((lanes,), I32))
    with pytest.raises(ValueError, match="Only interpret mode is supported on CPU.*"
                                         "interpret=True"):
        jax.jit(_gather_kernel(lanes)).lower(*args).compile()


def test_chip_from_compiler_params_sets_the_lane_check(lower_tpu):
    # v5p vector subcores hold 8 float32 lanes: a 16-lane load does not lower for it.
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)

    def make(chip, n):
        @functools.partial(pl.kernel, out_type=sds((n,), F32), mesh=mesh,
                           compiler_params=plsc.CompilerParams(chip=chip),
                           scratch_types=[pltpu.VMEM((n,), F32)])
        def k(x_hbm, o_hbm, v):
            pltpu.sync_copy(x_hbm, v)
            v[...] = v[...] + 1
            pltpu.sync_copy(v, o_hbm)

        return k

    lower_tpu(make("v5p", 8), jnp.zeros((8,), F32))
    with pytest.raises(Exception, match=r"shape \(16,\).*8 lanes of a TPU v5p.*\(8,\)"):
        lower_tpu(make("v5p", 16), jnp.zeros((16,), F32))
