"""CTA pairs in GPU interpret mode: a cluster of 2 blocks sharing 2-CTA ``tcgen05``
operations, as on Blackwell.

- ``copy_gmem_to_smem(leader_tracked=PARTITIONED(axis), collective_axes=x)``: each
  block loads its part of ``src`` into its own SMEM; only the leader's (block 0's)
  barrier tracks it, with one arrival once both parts have landed.
- ``tcgen05_mma(..., collective_axis=x)``, issued by the leader (the follower's issue
  does nothing): block ``j``'s accumulator gets ``a_j @ [b_0 | b_1]``; its barrier and
  ``tcgen05_commit_arrive(collective_axis=x)`` arrive in both blocks.
- ``async_copy_smem_to_tmem(collective_axis=x)``, issued by the leader, moves each
  block's SMEM into its own TMEM.

Accesses of the peer block's memory are checked by the race detector."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu import interpret as gpu_interpret

F16, F32 = jnp.float16, jnp.float32
PARTITIONED = plgpu.CopyPartition.PARTITIONED
IP = plgpu.InterpretParams(detect_races=True)


def pair_matmul(*, follower_copies=True, leader_waits=True, follower_clobbers=False,
                mma_axis="x", cluster=(2,)):
    """o (128, 64) = a (128, 32) @ b (32, 64) on a CTA pair: each block loads 64
    rows of a and 32 columns of b, the leader issues one 2-CTA MMA into both blocks'
    TMEM and commits to both; each block stores its rows, then the pair meets on a
    cluster barrier."""

    def kernel(a_gmem, b_gmem, o_gmem, a, b, acc, o_smem, tma, done, bye):
        x = lax.axis_index("x")

        @pl.when(jnp.logical_or(x == 0, follower_copies))
        def _():
            plgpu.copy_gmem_to_smem(a_gmem, a, tma.at[0], leader_tracked=PARTITIONED(0),
                                    collective_axes="x")
            plgpu.copy_gmem_to_smem(b_gmem, b, tma.at[0], leader_tracked=PARTITIONED(1),
                                    collective_axes="x")

        if follower_clobbers:  # before the leader's MMA is known to have read b
            @pl.when(x == 1)
            def _():
                b[...] = jnp.zeros_like(b)

        @pl.when(x == 0)
        def _():
            if leader_waits:
                plgpu.barrier_wait(tma.at[0])
            plgpu.tcgen05_mma(acc, a, b, accumulate=False, collective_axis=mma_axis)
            plgpu.tcgen05_commit_arrive(done.at[0], collective_axis="x")

        plgpu.barrier_wait(done.at[0])
        o_smem[...] = plgpu.async_load_tmem(acc).astype(F16)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(x * 64, 64)])
        plgpu.wait_smem_to_gmem(0)
        plgpu.barrier_arrive(bye.at[0])
        plgpu.barrier_wait(bye.at[0])

    return plgpu.kernel(
        kernel, out_type=jax.ShapeDtypeStruct((128, 64), F16), cluster=cluster,
        cluster_names=("x",), interpret=IP,
        scratch_types=dict(
            a=plgpu.SMEM((64, 32), F16), b=plgpu.SMEM((32, 32), F16),
            acc=plgpu.TMEM((64, 64), F32, collective=True),
            o_smem=plgpu.SMEM((64, 64), F16),
            tma=plgpu.Barrier(num_arrivals=2),  # the leader's: one arrival per copy
            done=plgpu.Barrier(orders_tensor_core=True),
            bye=plgpu.ClusterBarrier(collective_axes=("x",))))


def _operands():
    a = jax.random.normal(jax.random.key(0), (128, 32), F32).astype(F16)
    b = jax.random.normal(jax.random.key(1), (32, 64), F32).astype(F16)
    return a, b


def test_a_cta_pair_matmul_computes_both_halves_without_races():
    a, b = _operands()
    out = pair_matmul()(a, b)
    want = jnp.dot(a, b, preferred_element_type=F32).astype(F16)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32),
                               rtol=1e-2, atol=1e-2)
    assert not gpu_interpret.get_races().races_found, gpu_interpret.get_races()


def test_the_leaders_barrier_waits_for_the_followers_part_of_the_copy():
    with pytest.raises(Exception, match=r"deadlocked[\s\S]*phase 1 of barrier"):
        jax.block_until_ready(pair_matmul(follower_copies=False)(*_operands()))


def test_an_mma_before_the_pairs_copies_landed_races_with_the_tma():
    jax.block_until_ready(pair_matmul(leader_waits=False)(*_operands()))
    report = str(gpu_interpret.get_races())
    assert "by TMA unit" in report and "by thread (x=0)" in report, report


def test_the_follower_overwriting_its_half_of_b_races_with_the_leaders_mma():
    jax.block_until_ready(pair_matmul(follower_clobbers=True)(*_operands()))
    report = str(gpu_interpret.get_races())
    assert re.search(r"write of [^\n]* by thread \(x=1\)[^\n]*\n  read of [^\n]* by thread "
                     r"\(x=0\)[^\n]*\(tcgen05_mma\)", report), report


def test_pair_operations_need_the_first_cluster_axis_of_two_blocks():
    with pytest.raises(Exception, match=r"'g' is not a cluster axis"):
        jax.block_until_ready(pair_matmul(mma_axis="g")(*_operands()))


def test_a_collective_tmem_copy_moves_each_blocks_smem_into_its_own_tmem():
    x_in = jnp.arange(2 * 128 * 32, dtype=F32).reshape(256, 32)

    def kernel(x_gmem, o_gmem, smem, tmem, done, ready):
        x = lax.axis_index("x")
        smem[...] = x_gmem[pl.ds(x * 128, 128)]
        plgpu.barrier_arrive(ready.at[0])  # both blocks' SMEM is written
        plgpu.barrier_wait(ready.at[0])

        @pl.when(x == 0)
        def _():
            plgpu.async_copy_smem_to_tmem(smem, tmem, collective_axis="x")
            plgpu.tcgen05_commit_arrive(done.at[0], collective_axis="x")

        plgpu.barrier_wait(done.at[0])
        o_gmem[pl.ds(x * 128, 128)] = plgpu.async_load_tmem(tmem)

    out = plgpu.kernel(
        kernel, out_type=jax.ShapeDtypeStruct((256, 32), F32), cluster=(2,),
        cluster_names=("x",), interpret=IP,
        scratch_types=dict(smem=plgpu.SMEM((128, 32), F32),
                           tmem=plgpu.TMEM((128, 32), F32, collective=True),
                           done=plgpu.Barrier(orders_tensor_core=True),
                           ready=plgpu.ClusterBarrier(collective_axes=("x",))))(x_in)
    np.testing.assert_array_equal(out, x_in)
    assert not gpu_interpret.get_races().races_found, gpu_interpret.get_races()


# -- another block's SMEM: plgpu.cluster_ref and plgpu.async_store_smem -------------------


def _pair_kernel(kernel, out_shape, **scratch):
    return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(out_shape, F32),
                        cluster=(2,), cluster_names=("x",), interpret=IP,
                        scratch_types=scratch)


@pytest.mark.parametrize("wait", [True, False], ids=["synchronised", "racy"])
def test_cluster_ref_writes_the_peer_blocks_smem_and_arrives_on_its_barrier(wait):
    """Block 0 writes block 1's SMEM and arrives on block 1's barrier, both through
    ``plgpu.cluster_ref``; block 1 reads its SMEM after waiting (without the wait the
    race detector reports block 0's write and block 1's read)."""

    def kernel(o_gmem, smem, bar):
        x = lax.axis_index("x")

        @pl.when(x == 0)
        def _():
            plgpu.cluster_ref(smem, {"x": 1})[...] = jnp.full((8, 128), 7.0, F32)
            plgpu.barrier_arrive(plgpu.cluster_ref(bar.at[0], {"x": 1}))

        @pl.when(x == 1)
        def _():
            if wait:
                plgpu.barrier_wait(bar.at[0])
            o_gmem[...] = smem[...]

    out = _pair_kernel(kernel, (8, 128), smem=plgpu.SMEM((8, 128), F32),
                       bar=plgpu.Barrier())()
    report = gpu_interpret.get_races()
    if wait:
        np.testing.assert_array_equal(out, np.full((8, 128), 7.0))
        assert not report.races_found, report
    else:
        assert "by thread (x=0)" in str(report) and "by thread (x=1)" in str(report)


def test_async_store_smem_combines_into_a_peer_block_and_arrives_there():
    """Both blocks atomically add their rows into block 0's SMEM (after block 0 has set
    it to 1 and the pair has met on a cluster barrier); block 0's barrier gets one
    arrival per store."""
    x_in = jnp.arange(2 * 8 * 128, dtype=F32).reshape(2, 8, 128)

    def kernel(x_gmem, o_gmem, smem, bar, met):
        x = lax.axis_index("x")

        @pl.when(x == 0)
        def _():
            smem[...] = jnp.ones((8, 128), F32)

        plgpu.barrier_arrive(met.at[0])
        plgpu.barrier_wait(met.at[0])
        plgpu.async_store_smem(x_gmem[x], smem, bar.at[0], cluster_idx=0, cluster_dim="x",
                               atomic="add")

        @pl.when(x == 0)
        def _():
            plgpu.barrier_wait(bar.at[0])
            o_gmem[...] = smem[...]

    out = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((8, 128), F32), cluster=(2,),
                       cluster_names=("x",), interpret=IP,
                       scratch_types=dict(smem=plgpu.SMEM((8, 128), F32),
                                          bar=plgpu.Barrier(num_arrivals=2),
                                          met=plgpu.ClusterBarrier(collective_axes=("x",)))
                       )(x_in)
    np.testing.assert_array_equal(out, 1 + x_in[0] + x_in[1])
    assert not gpu_interpret.get_races().races_found, gpu_interpret.get_races()


def test_a_plain_access_through_multicast_ref_is_refused_naming_it():
    def kernel(o_gmem):
        plgpu.multicast_ref(o_gmem, "x")[...] = jnp.zeros((8, 128), F32)

    with pytest.raises(Exception, match=r"through plgpu.multicast_ref: only "
                                        r"plgpu.copy_smem_to_gmem"):
        jax.block_until_ready(plgpu.kernel(
            kernel, out_type=jax.ShapeDtypeStruct((8, 128), F32), interpret=IP)())


def test_a_replicated_copy_loads_all_of_src_into_every_block_tracked_by_the_leader():
    x_in = jnp.arange(8 * 128, dtype=F32).reshape(8, 128)

    def kernel(x_gmem, o_gmem, smem, tma, met):
        x = lax.axis_index("x")
        plgpu.copy_gmem_to_smem(x_gmem, smem, tma.at[0],
                                leader_tracked=plgpu.CopyPartition.REPLICATED,
                                collective_axes="x")

        @pl.when(x == 0)
        def _():
            plgpu.barrier_wait(tma.at[0])  # both blocks' copies have landed

        plgpu.barrier_arrive(met.at[0])
        plgpu.barrier_wait(met.at[0])
        o_gmem[x] = smem[...]

    out = plgpu.kernel(
        kernel, out_type=jax.ShapeDtypeStruct((2, 8, 128), F32), cluster=(2,),
        cluster_names=("x",), interpret=IP,
        scratch_types=dict(smem=plgpu.SMEM((8, 128), F32), tma=plgpu.Barrier(),
                           met=plgpu.ClusterBarrier(collective_axes=("x",))))(x_in)
    np.testing.assert_array_equal(out, np.stack([x_in, x_in]))
    assert not gpu_interpret.get_races().races_found, gpu_interpret.get_races()


def test_waiting_on_a_leader_tracked_cluster_barrier_outside_the_leader_is_an_error():
    def kernel(o_gmem, bar):
        plgpu.barrier_arrive(bar.at[0])
        plgpu.barrier_wait(bar.at[0])

    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((8,), F32), cluster=(2,),
                     cluster_names=("x",), interpret=IP,
                     scratch_types=dict(bar=plgpu.ClusterBarrier(collective_axes=("x",),
                                                                 leader_tracked=True)))
    with pytest.raises(Exception, match=r"leader_tracked=True\): arrivals reach only the "
                                        r"leader block's copy.*\(x=1\)"):
        jax.block_until_ready(f())
