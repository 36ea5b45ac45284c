"""``emit_pipeline``: a grid loop over HBM refs inside a kernel (interpreter and lowering)."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu


def _matmul_plus_one(x, y, interpret):
    def outer(x_hbm, y_hbm, o_hbm):
        def body(x_ref, y_ref, o_ref):
            o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32) + 1

        pltpu.emit_pipeline(
            body, grid=(2, 3),
            in_specs=[pl.BlockSpec((128, 256), lambda i, j: (i, 0)),
                      pl.BlockSpec((256, 128), lambda i, j: (0, j))],
            out_specs=[pl.BlockSpec((128, 128), lambda i, j: (i, j))],
        )(x_hbm, y_hbm, o_hbm)

    return pl.pallas_call(
        outer, out_shape=jax.ShapeDtypeStruct((256, 384), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
        out_specs=pl.BlockSpec(memory_space=pl.ANY), interpret=interpret,
    )(x, y)


def test_emit_pipeline_interpreter(rng):
    x = jnp.asarray(rng.standard_normal((256, 256)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((256, 384)), jnp.float32)
    np.testing.assert_allclose(_matmul_plus_one(x, y, True), x @ y + 1, rtol=1e-4, atol=1e-3)


def test_emit_pipeline_lowering(lower_tpu, ops):
    x = jnp.zeros((256, 256), jnp.float32)
    y = jnp.zeros((256, 384), jnp.float32)
    _, (m,) = lower_tpu(lambda a, b: _matmul_plus_one(a, b, False), x, y)
    names = collections.Counter(ops(m))
    assert names["scf.for"] == 1 and names["tpu.matmul"] == 1
    assert names["tpu.enqueue_dma"] == 5  # 2 inputs in the prologue and per step, 1 output
    assert names["tpu.wait_dma2"] == 3 and names["tpu.region"] == 1


def test_emit_pipeline_squeezed_dims_and_revisited_outputs(rng):
    x = jnp.asarray(rng.standard_normal((3, 16, 128)), jnp.float32)

    def outer(x_hbm, o_hbm):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0  # the (8, 128) block of batch b, rows r

        # Grid (rows, batch): the output block depends only on rows and batch.
        pltpu.emit_pipeline(
            body, grid=(2, 3),
            in_specs=[pl.BlockSpec((None, 8, 128), lambda r, b: (b, r, 0))],
            out_specs=[pl.BlockSpec((None, 8, 128), lambda r, b: (b, r, 0))],
        )(x_hbm, o_hbm)

    out = pl.pallas_call(
        outer, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY),
        interpret=True)(x)
    np.testing.assert_allclose(out, x * 2.0)


def test_emit_pipeline_rejects_edge_blocks():
    def outer(x_hbm, o_hbm):
        pltpu.emit_pipeline(lambda a, b: None, grid=(3,),
                            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                            out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])(x_hbm, o_hbm)

    with pytest.raises(NotImplementedError, match="does not divide"):
        pl.pallas_call(outer, out_shape=jax.ShapeDtypeStruct((20, 128), jnp.float32),
                       in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       out_specs=pl.BlockSpec(memory_space=pl.ANY),
                       interpret=True)(jnp.zeros((20, 128)))
