"""On an emulated TPU, a SparseCore kernel is lowered and compiled for the chip (what they
refuse is raised as on the device), then is a clear error: nothing executes the Mosaic
SparseCore code the backend generates (no ``emulate`` level), and the error says to run
it with ``interpret=True``; the device queries answer for the emulated chip."""

from __future__ import annotations

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
