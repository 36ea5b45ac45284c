"""Indexed DMAs take their indices as an array, a ref, a ref view or ``plsc.Indices``
with an ``ignored_value`` (entries equal to it move nothing), as upstream's do: in the
interpreter against numpy, and lowered to ``tpu.enqueue_indirect_dma`` (with its
``offset_filter`` for ignored entries)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu
import pallas_tpu_sparsecore as plsc
from pallas_tpu.inspect import op_names

I32 = jnp.int32


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def _index_of(kind, iv, n):
    """The index expression of each kind, over the VMEM index buffer ``iv``."""
    return {"array": lambda: iv[...], "ref": lambda: iv,
            "ref_view": lambda: iv.at[pl.ds(0, n)]}[kind]()


# Each interpreter: the core's (interpret=True) and TPU interpret mode's, which simulates
# DMAs, semaphores and races (it raised TypeError 'Buffer' on a ref of indices).
INTERPRETERS = [pytest.param(True, id="core"),
                pytest.param(pltpu.InterpretParams(), id="tpu"),
                pytest.param(pltpu.InterpretParams(detect_races=True,
                                                   dma_execution_mode="eager"),
                             id="tpu-races-eager")]


@pytest.fixture
def table():
    return jnp.arange(64 * 4, dtype=I32).reshape(64, 4)


FILL = jnp.full((64, 4), -1, I32)


@pytest.fixture
def perm(lanes):
    return jax.random.permutation(jax.random.key(0), jnp.arange(64, dtype=I32))[:lanes]


def _gather(vector_kernel, lanes, kind, interpret=True, ignored=None):
    n = lanes if kind != "ref_view" else lanes // 2

    # SparseCore tiling: rows of 4 elements (under TensorCore tiling, upstream's
    # default, an indexed DMA moves multiples of 128 and lowering refuses these).
    @vector_kernel(sds((lanes, 4), I32), interpret=interpret,
                   compiler_params=pltpu.CompilerParams(use_tc_tiling_on_sc=False),
                   scratch=[pltpu.VMEM((lanes,), I32), pltpu.VMEM((lanes, 4), I32)])
    def k(t_hbm, i_hbm, fill_hbm, o_hbm, iv, rows):
        pltpu.sync_copy(i_hbm, iv)
        pltpu.sync_copy(fill_hbm, rows)  # (a (lanes, 4) value is more than one register)
        idx = _index_of(kind, iv, n)
        if ignored is not None:
            idx = plsc.Indices(idx, ignored_value=ignored)
        pltpu.sync_copy(t_hbm.at[idx], rows.at[pl.ds(0, n)])
        pltpu.sync_copy(rows, o_hbm)

    return k, n


@pytest.mark.parametrize("interpret", INTERPRETERS)
@pytest.mark.parametrize("kind", ["array", "ref", "ref_view"])
def test_gather_with_each_kind_of_index(vector_kernel, lanes, table, perm, kind, interpret):
    k, n = _gather(vector_kernel, lanes, kind, interpret)
    got = np.asarray(k(table, perm, FILL[:lanes]))
    np.testing.assert_array_equal(got[:n], np.asarray(table)[np.asarray(perm)[:n]])
    assert (got[n:] == -1).all()


@pytest.mark.parametrize("interpret", INTERPRETERS[:2])
def test_gather_skips_the_ignored_value(vector_kernel, lanes, table, perm, interpret):
    idx = perm.at[2].set(-5).at[lanes - 1].set(-5)  # ignored entries need not be in range
    k, _ = _gather(vector_kernel, lanes, "ref", interpret, ignored=-5)
    want = np.asarray(table)[np.maximum(np.asarray(idx), 0)]
    want[[2, lanes - 1]] = -1  # untouched
    np.testing.assert_array_equal(k(table, idx, FILL[:lanes]), want)


@pytest.mark.parametrize("interpret", INTERPRETERS[:2])
@pytest.mark.parametrize("add", [False, True])
def test_scatter_skips_the_ignored_value(vector_kernel, lanes, add, interpret):
    idx = jnp.asarray(np.arange(lanes) % 5, I32).at[3].set(-1)
    rows = jnp.arange(lanes * 4, dtype=I32).reshape(lanes, 4) + 1
    if not add:  # distinct destination rows for a plain scatter
        idx = jnp.asarray(np.arange(lanes), I32).at[3].set(-1)

    @vector_kernel(sds((lanes, 4), I32), interpret=interpret,
                   scratch=[pltpu.VMEM((lanes,), I32), pltpu.VMEM((lanes, 4), I32)])
    def k(i_hbm, r_hbm, z_hbm, o_hbm, iv, rv):
        pltpu.sync_copy(i_hbm, iv)
        pltpu.sync_copy(z_hbm, o_hbm)  # the output starts at zero
        pltpu.sync_copy(r_hbm, rv)  # the rows to move
        pltpu.sync_copy(rv, o_hbm.at[plsc.Indices(iv, ignored_value=-1)], add=add)

    want = np.zeros((lanes, 4), np.int32)
    keep = np.asarray(idx) >= 0
    if add:
        np.add.at(want, np.asarray(idx)[keep], np.asarray(rows)[keep])
    else:
        want[np.asarray(idx)[keep]] = np.asarray(rows)[keep]
    np.testing.assert_array_equal(k(idx, rows, jnp.zeros_like(rows)), want)


@pytest.mark.parametrize("interpret", INTERPRETERS[:2])
def test_out_of_range_index_from_a_ref_fails(vector_kernel, lanes, table, perm, interpret):
    k, _ = _gather(vector_kernel, lanes, "ref", interpret)
    with pytest.raises(Exception, match=r"indexed DMA: an index of the source .* outside "
                                        r"\[0, 64\).*do not clamp"):
        jax.block_until_ready(k(table, perm.at[1].set(64), FILL[:lanes]))


@pytest.mark.parametrize("interpret", INTERPRETERS)
def test_async_gather_and_scatter_add_with_indices_in_a_ref(vector_kernel, lanes, interpret):
    # The embedding gather (table_hbm.at[idx_ref] -> VMEM, on a DMA semaphore) and the
    # scatter-add of the same shape back into HBM, repeated indices included.
    table = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
    idx = jnp.asarray(np.arange(lanes) * 7 % 5, I32)  # repeats

    @vector_kernel((sds((lanes, 8), jnp.float32), sds((16, 8), jnp.float32)),
                   interpret=interpret,
                   scratch=[pltpu.VMEM((lanes,), I32), pltpu.VMEM((lanes, 8), jnp.float32),
                            pltpu.SemaphoreType.DMA])
    def k(t_hbm, i_hbm, g_hbm, acc_hbm, idx_ref, rows, sem):
        pltpu.sync_copy(i_hbm, idx_ref)
        pltpu.async_copy(t_hbm.at[idx_ref], rows, sem).wait()
        pltpu.sync_copy(rows, g_hbm)
        pltpu.sync_copy(t_hbm, acc_hbm)
        pltpu.async_copy(rows, acc_hbm.at[idx_ref], sem, add=True).wait()

    gathered, acc = k(table, idx)
    want = np.asarray(table).copy()
    np.add.at(want, np.asarray(idx), np.asarray(table)[np.asarray(idx)])
    np.testing.assert_array_equal(gathered, np.asarray(table)[np.asarray(idx)])
    np.testing.assert_array_equal(acc, want)


@pytest.mark.parametrize("kind", ["array", "ref", "ref_view"])
def test_each_kind_of_index_lowers_to_an_indirect_dma(vector_kernel, lanes, lower_tpu,
                                                      table, perm, kind):
    k, _ = _gather(vector_kernel, lanes, kind, interpret=False)
    _, (module,) = lower_tpu(k, table, perm, FILL[:lanes])
    assert op_names(module).count("tpu.enqueue_indirect_dma") == 1


def test_ignored_value_lowers_to_the_offset_filter(vector_kernel, lanes, lower_tpu, table,
                                                   perm):
    k, _ = _gather(vector_kernel, lanes, "ref", interpret=False, ignored=-5)
    _, (module,) = lower_tpu(k, table, perm, FILL[:lanes])
    text = str(module)
    (line,) = [ln for ln in text.splitlines() if "tpu.enqueue_indirect_dma" in ln]
    assert "offset_filter(%c-5_i32)" in line and "arith.constant -5 : i32" in text
