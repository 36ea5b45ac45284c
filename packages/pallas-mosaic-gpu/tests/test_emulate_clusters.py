"""The emulate level runs clusters of blocks together: a multicast TMA load lands in
every block of the cluster and signals each one's barrier, ``plgpu.ClusterBarrier``
arrivals reach other blocks' mbarriers through ``mapa``, and the cluster barrier
synchronises the blocks; a CTA pair's 2-CTA ``tcgen05`` MMA splits A and B between its
blocks and gives each block its rows of D."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas.plugins
import pallas_mosaic_gpu as plgpu

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F32 = jnp.float32


@pytest.fixture(autouse=True)
def _blackwell(monkeypatch):
    monkeypatch.setenv("PALLAS_MOSAIC_GPU_TARGET", "sm_100a")


def multicast_kernel():
    """Two clusters of two blocks: each cluster loads its 64 rows of x once, split
    between its blocks and multicast to both (``collective_axes``); block ``c`` of
    cluster ``g`` writes ``2 x + c`` to ``o[g, c]``; the blocks then meet on a cluster
    barrier (arrivals on each other's mbarrier)."""

    def kernel(x_gmem, o_gmem, x_smem, o_smem, tma, bye):
        c, g = lax.axis_index("x"), lax.axis_index("g")
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(g * 64, 64)], x_smem, tma.at[0],
                                collective_axes="x")
        plgpu.barrier_wait(tma.at[0])
        o_smem[...] = x_smem[...] * 2.0 + c.astype(F32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[g, c])
        plgpu.wait_smem_to_gmem(0)
        plgpu.barrier_arrive(bye.at[0])
        plgpu.barrier_wait(bye.at[0])

    return plgpu.kernel(
        kernel, out_type=jax.ShapeDtypeStruct((2, 2, 64, 128), F32), grid=(2,),
        grid_names=("g",), cluster=(2,), cluster_names=("x",), num_threads=1,
        thread_name="wg",
        scratch_types=dict(x_smem=plgpu.SMEM((64, 128), F32),
                           o_smem=plgpu.SMEM((64, 128), F32), tma=plgpu.Barrier(),
                           bye=plgpu.ClusterBarrier(collective_axes=("x",))))


def test_a_multicast_load_reaches_every_block_of_the_cluster(emulate):
    x = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
    (got,) = emulate(multicast_kernel(), x)
    want = np.stack([np.stack([x[g * 64:(g + 1) * 64] * 2 + c for c in range(2)])
                     for g in range(2)])
    np.testing.assert_array_equal(np.asarray(got), want)


def _pair_kernels():
    path = Path(__file__).with_name("test_lowering_clusters.py")
    spec = importlib.util.spec_from_file_location("lowering_clusters_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_cta_pair_matmul_splits_a_and_b_between_the_blocks_and_d_by_rows(emulate):
    # Each block loads its 128 rows of a and 64 columns of b; the leader's one 2-CTA MMA
    # (M = 256) gives each block's TMEM its 128 rows of a @ b, all 128 columns.
    mod = _pair_kernels()
    a, b = mod._operands()
    (got,) = emulate(mod.cta_pair_matmul(), a, b)
    want = np.asarray(jnp.dot(a, b, preferred_element_type=F32))
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-2, atol=5e-2)


def test_a_pair_mma_with_the_blocks_halves_swapped_gives_wrong_numbers(emulate, monkeypatch):
    # A planted fault: the pair MMA takes block 1 for block 0 (its rows of a, its columns
    # of b, its TMEM) and back; the case must fail.
    from pallas_mosaic_gpu._src.executor import ops_tcgen05

    right = ops_tcgen05.pair_blocks
    monkeypatch.setattr(ops_tcgen05, "pair_blocks", lambda m, what: right(m, what)[::-1])
    mod = _pair_kernels()
    a, b = mod._operands()
    (got,) = emulate(mod.cta_pair_matmul(), a, b)
    want = np.asarray(jnp.dot(a, b, preferred_element_type=F32))
    assert not np.allclose(np.asarray(got, np.float32), want, rtol=1e-2, atol=5e-2)
