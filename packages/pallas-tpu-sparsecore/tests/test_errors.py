"""Bad input is a clear error at trace time naming the argument and what is valid; an
out-of-range gather/scatter/DMA index is a clear error at run time, never a clamp."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_tpu as pltpu
import pallas_tpu_sparsecore as plsc

F32, I32 = jnp.float32, jnp.int32


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def _gather(vector_kernel, n_table, idx_shape, idx_dtype=I32, mask=None):
    @vector_kernel(sds(idx_shape, F32), scratch=[pltpu.VMEM((n_table,), F32),
                                                 pltpu.VMEM(idx_shape, idx_dtype),
                                                 pltpu.VMEM(idx_shape, F32)])
    def k(t_hbm, i_hbm, o_hbm, t, i, o):
        pltpu.sync_copy(t_hbm, t)
        pltpu.sync_copy(i_hbm, i)
        o[...] = plsc.load_gather(t, [i[...]], mask=mask)
        pltpu.sync_copy(o, o_hbm)

    return k(jnp.arange(n_table, dtype=F32), jnp.zeros(idx_shape, idx_dtype))


def test_vector_shapes_the_lanes_cannot_hold(vector_kernel, lanes):
    with pytest.raises(ValueError, match=rf"plsc.load_gather: the gathered vector has shape "
                                         rf"\({2 * lanes},\).*{lanes} lanes.*valid shapes for "
                                         rf"float32: \({lanes},\)"):
        _gather(vector_kernel, 64, (2 * lanes,))


@pytest.mark.parametrize("dtype", [F32, jnp.int16, jnp.uint32])
def test_gather_indices_of_the_wrong_type(vector_kernel, lanes, dtype):
    with pytest.raises(TypeError, match=rf"plsc.load_gather: indices\[0\] has dtype "
                                        rf"{jnp.dtype(dtype).name}.*int32"):
        _gather(vector_kernel, 64, (lanes,), idx_dtype=dtype)


def test_gather_indices_not_a_sequence(vector_kernel, lanes):
    @vector_kernel(sds((lanes,), F32), scratch=[pltpu.VMEM((64,), F32)])
    def k(o_hbm, t):
        plsc.load_gather(t, jnp.zeros((lanes,), I32))

    with pytest.raises(TypeError, match=r"indices must be a sequence of 1-D int32 arrays.*"
                                        r"\[idx\]"):
        k()


def test_gather_indices_one_per_dimension(vector_kernel, lanes):
    @vector_kernel(sds((lanes,), F32), scratch=[pltpu.VMEM((8, 64), F32)])
    def k(o_hbm, t):
        plsc.load_gather(t, [jnp.zeros((lanes,), I32)])

    with pytest.raises(ValueError, match=r"shape \(8, 64\), so indices needs 2 index"):
        k()


def test_scatter_value_of_the_wrong_dtype(vector_kernel, lanes):
    @vector_kernel(sds((lanes,), F32), scratch=[pltpu.VMEM((64,), F32)])
    def k(o_hbm, t):
        plsc.store_scatter(t, [jnp.zeros((lanes,), I32)], jnp.zeros((lanes,), I32))

    with pytest.raises(TypeError, match="plsc.store_scatter: x has dtype int32 but the ref "
                                        "holds float32"):
        k()


def test_mask_of_the_wrong_dtype(vector_kernel, lanes):
    with pytest.raises(TypeError, match=r"plsc.load_gather: mask must be a bool array"):
        _gather(vector_kernel, 64, (lanes,), mask=jnp.ones((lanes,), I32))


def test_mesh_larger_than_the_chip():
    with pytest.raises(ValueError, match=r"VectorSubcoreMesh num_subcores=17, but the target "
                                         r"TPU 7x has only 16 vector subcores per "
                                         r"SparseCore; valid: 1..16"):
        plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_subcores=17)
    with pytest.raises(ValueError, match=r"ScalarSubcoreMesh num_cores=3.*only 2 SparseCores"):
        plsc.ScalarSubcoreMesh(axis_name="c", num_cores=3)
    with pytest.raises(ValueError, match="must differ"):
        plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="c")
    with pytest.raises(TypeError, match="num_cores must be an int"):
        plsc.ScalarSubcoreMesh(axis_name="c", num_cores=1.5)


def test_mesh_larger_than_the_compiler_params_chip(lanes):
    import pallas as pl

    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=2)
    k = pl.kernel(lambda o: None, out_type=sds((8,), F32), mesh=mesh,
                  compiler_params=plsc.CompilerParams(chip="v5p"))
    jax.jit(k).trace().lower(lowering_platforms=("tpu",))  # v5p has 4 SparseCores
    with plsc.target_chip("v5p"):
        big = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=4)
    k = pl.kernel(lambda o: None, out_type=sds((8,), F32), mesh=big,
                  compiler_params=plsc.CompilerParams(chip="v6e"))
    with pytest.raises(ValueError, match=r"axis 'c' has num_cores=4, but TPU v6e has only 2"):
        jax.jit(k).trace().lower(lowering_platforms=("tpu",))


def test_out_of_range_gather_index_fails_the_kernel(vector_kernel, lanes):
    @vector_kernel(sds((lanes,), F32), scratch=[pltpu.VMEM((64,), F32),
                                                pltpu.VMEM((lanes,), I32),
                                                pltpu.VMEM((lanes,), F32)])
    def k(t_hbm, i_hbm, o_hbm, t, i, o):
        pltpu.sync_copy(t_hbm, t)
        pltpu.sync_copy(i_hbm, i)
        o[...] = plsc.load_gather(t, [i[...]])
        pltpu.sync_copy(o, o_hbm)

    idx = jnp.asarray(np.arange(lanes) * 4, I32)  # all in range
    k(jnp.arange(64, dtype=F32), idx)
    with pytest.raises(Exception, match=r"plsc.load_gather: indices\[0\] has an entry outside "
                                        r"\[0, 64\).*do not clamp"):
        jax.block_until_ready(k(jnp.arange(64, dtype=F32), idx.at[3].set(64)))
    with pytest.raises(Exception, match=r"outside \[0, 64\)"):
        jax.block_until_ready(k(jnp.arange(64, dtype=F32), idx.at[0].set(-1)))


def test_out_of_range_scatter_index_is_reported_by_interpreter_checks(vector_kernel, lanes):
    import pallas as pl

    @vector_kernel(sds((8,), F32), scratch=[pltpu.VMEM((lanes,), I32),
                                            pltpu.VMEM((8,), F32)])
    def k(i_hbm, o_hbm, i, acc):
        pltpu.sync_copy(i_hbm, i)
        acc[...] = jnp.zeros((8,), F32)
        plsc.addupdate_scatter(acc, [i[...]], jnp.ones((lanes,), F32))
        pltpu.sync_copy(acc, o_hbm)

    with pl.enable_bounds_checks(True):
        with pytest.raises(Exception, match=r"plsc.addupdate_scatter: indices\[0\].*\[0, 8\)"):
            jax.block_until_ready(k(jnp.full((lanes,), 8, I32)))


def test_masked_off_indices_are_not_checked(vector_kernel, lanes):
    mask_n = lanes // 2

    @vector_kernel(sds((lanes,), F32), scratch=[pltpu.VMEM((64,), F32),
                                                pltpu.VMEM((lanes,), I32),
                                                pltpu.VMEM((lanes,), F32)])
    def k(t_hbm, i_hbm, o_hbm, t, i, o):
        pltpu.sync_copy(t_hbm, t)
        pltpu.sync_copy(i_hbm, i)
        o[...] = plsc.load_gather(t, [i[...]], mask=jax.lax.iota(I32, lanes) < mask_n)
        pltpu.sync_copy(o, o_hbm)

    idx = jnp.where(jnp.arange(lanes) < mask_n, 5, 1000).astype(I32)
    out = k(jnp.arange(64, dtype=F32), idx)
    np.testing.assert_array_equal(out, np.where(np.arange(lanes) < mask_n, 5.0, 0.0))


def test_out_of_range_indexed_dma_fails(vector_kernel, lanes):
    @vector_kernel(sds((lanes, 8), F32), scratch=[pltpu.VMEM((lanes,), I32),
                                                  pltpu.VMEM((lanes, 8), F32),
                                                  pltpu.SemaphoreType.DMA])
    def k(t_hbm, i_hbm, o_hbm, iv, rows, sem):
        pltpu.sync_copy(i_hbm, iv)
        pltpu.async_copy(t_hbm.at[iv[...]], rows, sem).wait()
        pltpu.sync_copy(rows, o_hbm)

    with pytest.raises(Exception, match=r"indexed DMA: an index of the source .* outside "
                                        r"\[0, 32\)"):
        jax.block_until_ready(k(jnp.zeros((32, 8), F32), jnp.full((lanes,), 40, I32)))


def test_sort_key_val_needs_one_register(lanes):
    with pytest.raises(ValueError, match=rf"keys must have shape \({lanes},\)"):
        jax.make_jaxpr(lambda k: plsc.sort_key_val(k, k))(jnp.zeros((2 * lanes,), I32))



def _indexed_dma(shape, dtype, lanes, interpret):
    import functools

    import pallas as pl

    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)

    @functools.partial(pl.kernel, out_type=sds((lanes, 8), F32), mesh=mesh,
                       interpret=interpret,
                       scratch_types=[pltpu.VMEM(shape, dtype), pltpu.VMEM((lanes, 8), F32),
                                      pltpu.SemaphoreType.DMA])
    def k(t_hbm, i_hbm, o_hbm, iv, rows, sem):
        pltpu.sync_copy(i_hbm, iv)
        pltpu.async_copy(t_hbm.at[iv[...]], rows, sem).wait()
        pltpu.sync_copy(rows, o_hbm)

    return k


@pytest.mark.parametrize("dtype", [jnp.int16, jnp.uint32, jnp.int8])
def test_indexed_dma_indices_of_the_wrong_type(dtype, lanes):
    # (float indices are JAX's own TypeError at x_hbm.at[idx]; a 2-D index vector is
    # pltpu's DMA shape-mismatch ValueError)
    shape = (lanes,)
    args = (jnp.zeros((32, 8), F32), jnp.zeros(shape, dtype))
    want = (rf"pltpu.async_copy on SparseCore: the source is indexed .* by a "
            rf"{jnp.dtype(dtype).name}\[.*valid: one 1-D int32 vector or ref")
    with pytest.raises(TypeError, match=want):  # lowering for TPU: the backend's check
        jax.jit(_indexed_dma(shape, dtype, lanes, False)).trace(*args).lower(
            lowering_platforms=("tpu",))
    with pytest.raises(TypeError, match=want):  # the interpreter: the same check
        _indexed_dma(shape, dtype, lanes, True)(*args)
    # int32 indices pass both
    np.testing.assert_array_equal(
        _indexed_dma(shape, I32, lanes, True)(jnp.ones((32, 8), F32), jnp.zeros(shape, I32)),
        np.ones((lanes, 8)))
