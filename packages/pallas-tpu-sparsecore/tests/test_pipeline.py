"""``pltpu.emit_pipeline`` inside a SparseCore kernel (upstream's way to tile HBM operands
over a vector subcore): blocks of one register each, in the interpreter and lowered."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import pallas as pl
import pallas_tpu as pltpu
import pallas_tpu_sparsecore as plsc
from pallas_tpu.inspect import op_names


def _kernel(lanes, interpret):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=2)
    spec = pl.BlockSpec((lanes,), lambda i: (i,))

    @pl.kernel(out_type=jax.ShapeDtypeStruct((8 * lanes,), jnp.int32), mesh=mesh,
               interpret=interpret)
    def k(x_hbm, o_hbm):
        s = jax.lax.axis_index("subcore")
        half = pl.ds(s * 4 * lanes, 4 * lanes)

        @functools.partial(pltpu.emit_pipeline, grid=(4,), in_specs=[spec],
                           out_specs=[spec])
        def pipe(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2 + s

        pipe(x_hbm.at[half], o_hbm.at[half])

    return k


def test_pipeline_over_subcores_in_the_interpreter(lanes):
    x = jnp.arange(8 * lanes, dtype=jnp.int32)
    want = np.asarray(x) * 2 + (np.arange(8 * lanes) >= 4 * lanes)
    np.testing.assert_array_equal(_kernel(lanes, True)(x), want)


def test_pipeline_lowers_with_dmas_and_vector_loads(lanes, lower_tpu):
    _, (m,) = lower_tpu(_kernel(lanes, False), jnp.zeros((8 * lanes,), jnp.int32))
    ops = set(op_names(m))
    assert {"tpu.enqueue_dma", "tpu.wait_dma2", "tpu.vector_load", "tpu.vector_store",
            "scf.for"} <= ops


def _gather_with_filter(lanes, interpret):
    """upstream's test_gather_1d_with_filter: the table's spec keeps it in HBM (passed
    through unbuffered) and the body gathers from it with plsc.Indices of a VMEM block."""
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((lanes,), jnp.int32), mesh=mesh,
               interpret=interpret,
               compiler_params=pltpu.CompilerParams(use_tc_tiling_on_sc=False))
    def k(x_hbm, idx_hbm, o_hbm):
        @functools.partial(pltpu.emit_pipeline, grid=(1,),
                           in_specs=(pl.BlockSpec(memory_space=pltpu.HBM),
                                     pl.BlockSpec(memory_space=pltpu.VMEM)),
                           out_specs=pl.BlockSpec())
        def pipe(x_ref, idx_ref, o_ref):
            o_ref[...] = jax.lax.broadcast(-100_000, o_ref.shape)
            pltpu.sync_copy(x_ref.at[plsc.Indices(idx_ref, ignored_value=4)], o_ref)

        pipe(x_hbm, idx_hbm, o_hbm)

    return k


def test_an_hbm_spec_passes_the_table_through_and_indices_may_be_a_block(lanes, lower_tpu):
    # Both were broken: Indices of a pipeline block (a ref view) raised "Triggering
    # __jax_array__() during abstractification", and the HBM spec was copied to VMEM,
    # which the SparseCore compiler refuses as a gather source.
    x = jnp.arange(lanes, dtype=jnp.int32)
    idx = jax.random.permutation(jax.random.key(42), x)
    want = np.where(np.asarray(idx) == 4, -100_000, np.asarray(x)[np.asarray(idx)])
    np.testing.assert_array_equal(_gather_with_filter(lanes, True)(x, idx), want)
    lowered, _ = lower_tpu(_gather_with_filter(lanes, False), x, idx)
    assert "tpu_custom_call" in lowered.as_text()
