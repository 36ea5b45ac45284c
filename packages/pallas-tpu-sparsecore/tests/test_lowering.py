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
SC_TILING = pltpu.CompilerParams(use_tc_tiling_on_sc=False)


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
                       compiler_params=SC_TILING,
                       scratch_types=[pltpu.VMEM((lanes,), I32), pltpu.VMEM((lanes, 8), F32),
                                      pltpu.VMEM_SHARED((64, 8), F32), pltpu.SemaphoreType.DMA])
    def k(t_hbm, i_hbm, o_hbm, iv, rows, acc, sem):
        pltpu.sync_copy(i_hbm, iv)
        pltpu.async_copy(t_hbm.at[iv[...]], rows, sem).wait()
        pltpu.async_copy(rows, acc.at[iv[...]], sem, add=True).wait()
        pltpu.sync_copy(acc, o_hbm)

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


def _indexed(rows_shape, dtype, *, scatter_add=False, params=SC_TILING, chip="v5p"):
    """A one-subcore kernel gathering rows of a table by index (or scatter-adding them
    into the output in HBM)."""
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)
    n = rows_shape[0]

    @functools.partial(pl.kernel, out_type=sds((64, *rows_shape[1:]), dtype), mesh=mesh,
                       compiler_params=params,
                       scratch_types=[pltpu.VMEM((n,), I32), pltpu.VMEM(rows_shape, dtype),
                                      pltpu.SemaphoreType.DMA])
    def k(t_hbm, i_hbm, o_hbm, iv, rows, sem):
        pltpu.sync_copy(i_hbm, iv)
        pltpu.async_copy(t_hbm.at[iv], rows, sem).wait()
        if scatter_add:
            pltpu.async_copy(rows, o_hbm.at[iv], sem, add=True).wait()
        else:
            pltpu.sync_copy(rows, o_hbm.at[pl.ds(0, n)])

    def run(lower_tpu):
        with plsc.target_chip(chip):
            return lower_tpu(k, jnp.zeros((64, *rows_shape[1:]), dtype), jnp.zeros((n,), I32))

    return run


def test_indexed_dmas_libtpu_rejects_are_refused_when_lowering(lower_tpu):
    # Measured with pallas_tpu.compile (v5p, v6e, 7x): these are Mosaic errors deep in
    # libtpu; here they are MosaicUnsupported (conformance: unsupported) naming the DMA.
    from pallas.plugins import LevelUnsupportedError

    with pytest.raises(LevelUnsupportedError,
                       match=r"scatter into a f32\[64, 8\] ref, add=True\) on TPU v5p: the "
                             r"SparseCore compiler cannot scatter-add into HBM.*VMEM_SHARED"):
        _indexed((8, 8), F32, scatter_add=True)(lower_tpu)
    # TensorCore tiling (upstream's default): 32-bit rows of a multiple of 128 elements.
    tc = pltpu.CompilerParams()
    with pytest.raises(LevelUnsupportedError,
                       match=r"gather from a f32\[64, 8\] ref\) on TPU v5p: under TensorCore "
                             r"tiling.*row: 8 elements of 32 bits.*use_tc_tiling_on_sc=False"):
        _indexed((8, 8), F32, params=tc)(lower_tpu)
    with pytest.raises(LevelUnsupportedError, match=r"128 elements of 16 bits"):
        _indexed((8, 128), jnp.bfloat16, params=tc)(lower_tpu)
    _indexed((8, 128), F32, params=tc)(lower_tpu)
    _indexed((8, 16), jnp.bfloat16)(lower_tpu)


def test_a_dma_with_add_that_is_not_indexed_is_refused_when_lowering(lower_tpu):
    # Upstream's SparseCore lowering refuses it too (NotImplementedError); the interpreter
    # runs it (an atomic accumulate).
    from pallas.plugins import LevelUnsupportedError

    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)

    @functools.partial(pl.kernel, out_type=sds((8, 8), F32), mesh=mesh,
                       compiler_params=SC_TILING,
                       scratch_types=[pltpu.VMEM_SHARED((8, 8), F32), pltpu.VMEM((8, 8), F32)])
    def k(x_hbm, o_hbm, acc, v):
        pltpu.sync_copy(x_hbm, v)
        pltpu.sync_copy(v, acc, add=True)
        pltpu.sync_copy(acc, o_hbm)

    with plsc.target_chip("v5p"), pytest.raises(
            LevelUnsupportedError, match=r"a DMA with add=True into a f32\[8, 8\] ref that "
                                         r"is not indexed, on TPU v5p.*dst.at\[idx\]"):
        lower_tpu(k, jnp.zeros((8, 8), F32))


def test_scalar_subcores_run_on_one_sparsecore_or_all(lower_tpu):
    def make(cores):
        mesh = plsc.ScalarSubcoreMesh(axis_name="c", num_cores=cores)

        @functools.partial(pl.kernel, out_type=sds((cores, 16), I32), mesh=mesh,
                           scratch_types=[pltpu.SMEM((16,), I32)])
        def k(x_hbm, o_hbm, s):
            c = jax.lax.axis_index("c")
            pltpu.sync_copy(x_hbm.at[c], s)
            pltpu.sync_copy(s, o_hbm.at[c])

        return k

    from pallas.plugins import LevelUnsupportedError

    with plsc.target_chip("v5p"):
        for cores in (1, 4):
            lower_tpu(make(cores), jnp.zeros((cores, 16), I32))
        with pytest.raises(LevelUnsupportedError,
                           match=r"over 2 SparseCores of TPU v5p.*valid mesh sizes: 1 or 4"):
            lower_tpu(make(2), jnp.zeros((2, 16), I32))


def test_a_row_of_a_2d_ref_is_one_lanes_wide_vector(lanes, lower_tpu):
    # ref[r] = v on a (rows, lanes) ref: a (1, lanes) vector is not a vreg type of a
    # vector subcore (libtpu: 'Result type is not a valid vmask or vreg type'); the row
    # is a squeezed memref accessed with a (lanes,) vector.
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)

    @functools.partial(pl.kernel, out_type=sds((4, lanes), F32), mesh=mesh,
                       scratch_types=[pltpu.VMEM((4, lanes), F32)])
    def k(x_hbm, o_hbm, rows):
        pltpu.sync_copy(x_hbm, rows)

        @pl.loop(0, 4)
        def _(r):
            rows[r] = rows[r] * 2.0

        pltpu.sync_copy(rows, o_hbm)

    _, (module,) = lower_tpu(k, jnp.zeros((4, lanes), F32))
    text = str(module)
    assert "tpu.memref_squeeze" in text and f"vector<1x{lanes}xf32>" not in text
