"""On an emulated TPU, a SparseCore kernel is a clear error: nothing executes the Mosaic
SparseCore code the backend generates (no ``emulate`` level), and the error says to run
it with ``interpret=True``; the device queries answer for the emulated chip."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
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
    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    with pl.emulate_device("tpu:v5p"), pytest.raises(pl.EmulationError,
                                                     match="mosaic_sparsecore.*interpret=True"):
        copy(x)
