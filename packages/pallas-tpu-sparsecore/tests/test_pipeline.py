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
