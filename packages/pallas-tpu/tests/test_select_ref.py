"""``pl.select_ref`` as DMA operands (sources, views, nested selections, semaphores),
under the interpreter and on an emulated v5e (our lowering, compiled by libtpu where it
is installed, run by the executor): upstream's test_select_ref* kernels."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu

N = 4
HBM = pl.BlockSpec(memory_space=pltpu.HBM)


def _run(f, interpret):
    if interpret:
        return f()
    with pl.emulate_device("tpu:v5e"):
        return f()


@pytest.mark.parametrize("interpret", [True, False])
def test_select_ref_over_sources_and_semaphores_in_a_loop(interpret):
    # Regression: pl.select_ref raised NotImplementedError.
    @partial(pl.pallas_call, in_specs=[HBM] * N, out_specs=HBM, interpret=interpret,
             out_shape=jax.ShapeDtypeStruct((8 * N, 128), jnp.int32))
    def kernel(*refs):
        *xs, y = refs

        def body(sem):
            @pl.loop(0, N)
            def _(i):
                pltpu.async_copy(pl.select_ref(i, *xs), y.at[pl.ds(8 * i, 8)],
                                 pl.select_ref(i, sem.at[0], sem.at[1])).wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA(2))

    x = jnp.arange(8 * N * 128, dtype=jnp.int32).reshape(8 * N, 128)
    y = _run(lambda: kernel(*jnp.split(x, N)), interpret)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


@pytest.mark.parametrize("interpret", [True, False])
def test_select_ref_by_an_smem_index_over_views(interpret):
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)

    @partial(pl.pallas_call, in_specs=[smem, HBM, HBM], out_specs=HBM, interpret=interpret,
             out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    def kernel(idx_ref, x0, x1, y):
        def body(sem):
            pltpu.async_copy(pl.select_ref(idx_ref[...], x0.at[0:8], x1), y, sem).wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA)

    x0 = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    x1 = -jnp.ones((8, 128), jnp.float32)
    for i, want in [(0, x0[:8]), (1, x1), (3, x1)]:
        y = _run(lambda i=i: kernel(jnp.array(i, jnp.int32), x0, x1), interpret)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(want))


@pytest.mark.parametrize("interpret", [True, False])
def test_nested_select_ref_reshaped(interpret):
    @partial(pl.pallas_call, in_specs=[HBM] * N, out_specs=HBM, interpret=interpret,
             out_shape=jax.ShapeDtypeStruct((8 * N, 256), jnp.int32))
    def kernel(*refs):
        *xs, y = refs

        def body(sem):
            @pl.loop(0, N)
            def _(i):
                halves = (pl.select_ref(1, r.at[:, :128], r.at[:, 128:]) for r in xs)
                pltpu.async_copy(pl.select_ref(i, *halves).reshape(8, 128),
                                 y.at[pl.ds(8 * i, 8), :128], sem.at[0]).wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA(2))

    x = jnp.arange(8 * N * 256, dtype=jnp.int32).reshape(8 * N, 256)
    y = _run(lambda: kernel(*jnp.split(x, N)), interpret)
    np.testing.assert_array_equal(np.asarray(y)[:, :128], np.asarray(x)[:, 128:])
