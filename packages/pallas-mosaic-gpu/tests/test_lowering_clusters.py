"""Lowering clusters and CTA pairs (sm_100a): a ``plgpu.kernel`` with ``cluster=``
launches clusters of blocks (``lax.axis_index`` of a cluster axis is the block's index
in its cluster), ``copy_gmem_to_smem(leader_tracked=CopyPartition.PARTITIONED(axis))``
splits a copy across the pair, ``tcgen05_mma``/``tcgen05_commit_arrive`` with
``collective_axis`` are 2-CTA tensor-core ops on collective TMEM, and
``plgpu.ClusterBarrier`` arrivals reach every block of the cluster. Bad cluster use is
refused at trace time naming the argument (GPU interpret mode runs CTA pairs:
``test_interpret_clusters``). (The compile level of the pair kernel runs in
``test_lowering_tcgen05``'s compile subprocess.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import pallas as pl
import pallas_mosaic_gpu as plgpu

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F16, F32 = jnp.float16, jnp.float32
SWIZZLED = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # for f16
PARTITIONED = plgpu.CopyPartition.PARTITIONED


def cta_pair_matmul(cluster=(2,), a_axes="x", mma_axis="x", collective_tmem=True,
                    b_rows=64, interpret=False):
    """o (256, 128) = a (256, 64) @ b (64, 128) on a pair of blocks: each loads its 128
    rows of a and its 64 columns of b (partitioned copies tracked by the leader's
    barrier), the leader issues one 2-CTA MMA into both blocks' TMEM and commits to both
    blocks' barrier; each block stores its 128 rows, then the pair meets on a cluster
    barrier before the TMEM is freed."""

    def kernel(a_gmem, b_gmem, o_gmem, a, b, acc, o_smem, tma, done, bye):
        x = lax.axis_index("x")

        @pl.when(lax.axis_index("wg") == 0)
        def _():
            plgpu.copy_gmem_to_smem(a_gmem, a, tma.at[0], leader_tracked=PARTITIONED(0),
                                    collective_axes=a_axes)
            plgpu.copy_gmem_to_smem(b_gmem, b, tma.at[0], leader_tracked=PARTITIONED(1),
                                    collective_axes="x")

            @pl.when(x == 0)
            def _():
                plgpu.barrier_wait(tma.at[0])
                plgpu.tcgen05_mma(acc, a, b, accumulate=False, collective_axis=mma_axis)
                plgpu.tcgen05_commit_arrive(done.at[0], collective_axis="x")

            plgpu.barrier_wait(done.at[0])
            o_smem[...] = plgpu.async_load_tmem(acc).astype(F16)
            plgpu.wait_load_tmem()
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(x * 128, 128)])
            plgpu.wait_smem_to_gmem(0)
            plgpu.barrier_arrive(bye.at[0])
            plgpu.barrier_wait(bye.at[0])

    return plgpu.kernel(
        kernel, out_type=jax.ShapeDtypeStruct((256, 128), F16), grid=(1,),
        grid_names=("g",), cluster=cluster, cluster_names=("x",)[:len(cluster)],
        num_threads=1, thread_name="wg", interpret=interpret,
        compiler_params=plgpu.CompilerParams(),
        scratch_types=dict(
            a=plgpu.SMEM((128, 64), F16, transforms=SWIZZLED),
            b=plgpu.SMEM((b_rows, 64), F16, transforms=SWIZZLED),
            acc=plgpu.TMEM((128, 128), F32, collective=collective_tmem),
            o_smem=plgpu.SMEM((128, 128), F16),
            tma=plgpu.Barrier(num_arrivals=2),  # the leader arrives once per copy
            done=plgpu.Barrier(orders_tensor_core=True),
            bye=plgpu.ClusterBarrier(collective_axes=("x",)),
        ))


def _operands():
    a = jax.random.normal(jax.random.key(0), (256, 64), F32).astype(F16)
    b = jax.random.normal(jax.random.key(1), (64, 128), F32).astype(F16)
    return a, b


def _lower(f, *args):
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.fixture(autouse=True)
def _blackwell(monkeypatch):
    monkeypatch.setenv("PALLAS_MOSAIC_GPU_TARGET", "sm_100a")


def test_a_cta_pair_matmul_lowers_to_one_clustered_mosaic_gpu_call():
    text = _lower(cta_pair_matmul(), *_operands())
    assert text.count("custom_call @mosaic_gpu_v2") == 1


def test_a_cluster_bigger_than_cuda_launches_is_refused_naming_cluster():
    with pytest.raises(ValueError, match=r"plgpu.Mesh\(cluster=\(32,\)\).*1 to 16 blocks"):
        _lower(cta_pair_matmul(cluster=(32,)), *_operands())


def test_collective_axes_that_are_not_cluster_axes_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"copy_gmem_to_smem\(collective_axes='wg'\): 'wg' "
                                         r"is not a cluster axis.*\('x',\)"):
        _lower(cta_pair_matmul(a_axes="wg"), *_operands())
    with pytest.raises(ValueError, match=r"tcgen05_mma\(collective_axis='g'\): 'g' is not "
                                         r"a cluster axis"):
        _lower(cta_pair_matmul(mma_axis="g"), *_operands())


def test_cta_pair_operations_need_a_cluster_of_two_and_collective_tmem():
    with pytest.raises(ValueError, match=r"PARTITIONED\(0\)\): partitioned copies split a "
                                         r"copy across a CTA pair.*cluster is \(4, 1, 1\)"):
        _lower(cta_pair_matmul(cluster=(4,), collective_tmem=False), *_operands())
    with pytest.raises(ValueError, match=r"acc is a plgpu.TMEM with collective=False"):
        _lower(cta_pair_matmul(collective_tmem=False), *_operands())
    with pytest.raises(ValueError, match=r"plgpu.TMEM\(\(128, 128\), collective=True\).*"
                                         r"a cluster of 2 blocks.*cluster is \(1, 1, 1\)"):
        _lower(cta_pair_matmul(cluster=(1,)), *_operands())


def test_bad_partitioned_copies_are_refused_at_trace_time_naming_the_argument():
    with pytest.raises(ValueError, match=r"PARTITIONED\(1\)\): src is float16\[64,128\] and "
                                         r"dst is float16\[48,64\]"):
        jax.make_jaxpr(cta_pair_matmul(b_rows=48))(*_operands())

    def copy(**kw):
        def kernel(x_gmem, o_gmem, buf, bar):
            plgpu.copy_gmem_to_smem(x_gmem, buf, bar.at[0], **kw)

        return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((8,), F32), grid=(1,),
                            grid_names=("g",), cluster=(2,), cluster_names=("x",),
                            scratch_types=dict(buf=plgpu.SMEM((64, 64), F16),
                                               bar=plgpu.Barrier()))

    x = jnp.ones((128, 64), F16)
    with pytest.raises(ValueError, match=r"leader_tracked=.*needs collective_axes= naming "
                                         r"exactly one cluster axis"):
        jax.make_jaxpr(copy(leader_tracked=PARTITIONED(0)))(x)
    with pytest.raises(TypeError, match=r"leader_tracked=0\): expected "
                                        r"plgpu.CopyPartition.PARTITIONED"):
        jax.make_jaxpr(copy(leader_tracked=0, collective_axes="x"))(x)
