"""A kernel's TMEM is one allocation: warp 0 allocates the columns of all its
``plgpu.TMEM`` buffers at once and frees them at the end with the address it read once
(as upstream's warpgroup lowering), each buffer at its own columns; a barrier arrival
right after ``wait_load_tmem`` does not synchronise the warpgroup again."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.backend import params
from pallas_mosaic_gpu._src.executor import run_kernel
from pallas_mosaic_gpu._src.executor.launch import module_of
from pallas_mosaic_gpu._src.lowering import build
from pallas_mosaic_gpu._src.lowering.engine import KernelError

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F16, F32 = jnp.float16, jnp.float32
SWIZZLED = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # for f16
ADDRESS_LOAD = re.compile(r"memref\.load %\S+\[%\S+\] : memref<1xi32, "
                          r"#gpu\.address_space<workgroup>>")


def _built(f, *args):
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns
              if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    return build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k",
                 target="sm_100a")


def _two_accumulators(arrive_after_wait=False):
    """o1 = a @ b into a (128, 128) TMEM buffer of the kernel's scratch, o2 = 2 a @ b
    into a (128, 64) one of a ``run_scoped`` (its columns after the first's)."""

    def kernel(a_gmem, b_gmem, o1, o2, acc1, done):
        def body(a, b, tma_bar, acc2, released):
            plgpu.copy_gmem_to_smem(a_gmem, a, tma_bar.at[0])
            plgpu.copy_gmem_to_smem(b_gmem, b, tma_bar.at[0])
            plgpu.barrier_wait(tma_bar.at[0])
            plgpu.tcgen05_mma(acc1, a, b, accumulate=False)
            plgpu.tcgen05_mma(acc2, a, b.at[:, pl.ds(0, 64)], accumulate=False)
            plgpu.tcgen05_mma(acc2, a, b.at[:, pl.ds(0, 64)], done)
            plgpu.barrier_wait(done)
            o1[...] = plgpu.async_load_tmem(acc1)
            o2[...] = plgpu.async_load_tmem(acc2)
            plgpu.wait_load_tmem()
            if arrive_after_wait:
                plgpu.barrier_arrive(released)
                plgpu.barrier_wait(released)

        pl.run_scoped(body, plgpu.SMEM((128, 64), F16, transforms=SWIZZLED),
                      plgpu.SMEM((64, 128), F16, transforms=SWIZZLED),
                      plgpu.Barrier(num_arrivals=2), plgpu.TMEM((128, 64), F32),
                      plgpu.Barrier(orders_tensor_core=True))

    return pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct((128, 128), F32),
                           jax.ShapeDtypeStruct((128, 64), F32)),
        in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
        scratch_shapes=[plgpu.TMEM((128, 128), F32),
                        plgpu.Barrier(orders_tensor_core=True)],
        backend="mosaic_gpu")


def _operands():
    a = jax.random.normal(jax.random.key(0), (128, 64), F32).astype(F16)
    b = jax.random.normal(jax.random.key(1), (64, 128), F32).astype(F16)
    return a, b


def test_two_tmem_buffers_are_one_allocation_freed_with_the_address_read_once():
    a, b = _operands()
    k = _built(_two_accumulators(), a, b)
    text = str(module_of(k))
    allocs = re.findall(r"nvvm\.tcgen05\.alloc %\S+, %c(\d+)_i32", text)
    assert allocs == ["256"]  # 128 + 64 columns, rounded up to a power of two
    assert text.count("nvvm.tcgen05.dealloc") == 1
    assert len(ADDRESS_LOAD.findall(text)) == 1  # no second read to free it
    o1, o2 = run_kernel(k, [np.asarray(a), np.asarray(b)])  # the emulate level
    want = np.asarray(jnp.dot(a, b, preferred_element_type=F32))
    np.testing.assert_allclose(o1, want, rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(o2, 2 * want[:, :64], rtol=1e-3, atol=1e-2)


def test_an_arrival_right_after_wait_load_tmem_does_not_synchronise_again():
    # wait_load_tmem: tcgen05.wait::ld, then the warpgroup synchronises; the arrival of
    # a barrier ordering the tensor core then needs only its fence and the
    # synchronisation after it (as upstream), not one of its own before.
    a, b = _operands()
    k = _built(_two_accumulators(arrive_after_wait=True), a, b)
    text = str(module_of(k))
    between = text.split("nvvm.tcgen05.wait <load>")[1].split("mbarrier.arrive")[0]
    assert between.count("bar.sync") == 2
    assert "nvvm.tcgen05.fence <before>" in between
    o1, _ = run_kernel(k, [np.asarray(a), np.asarray(b)])
    np.testing.assert_allclose(o1, np.asarray(jnp.dot(a, b, preferred_element_type=F32)),
                               rtol=1e-3, atol=1e-2)


def test_tmem_buffers_over_the_columns_of_a_block_are_refused_naming_them():
    def kernel(o_ref, acc1, acc2):
        o_ref[...] = jnp.zeros((128, 128), F32)

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), F32),
                       scratch_shapes=[plgpu.TMEM((128, 512), F32),
                                       plgpu.TMEM((128, 32), F32)],
                       backend="mosaic_gpu")
    with pytest.raises(KernelError, match=r"544 TMEM columns in all \(\(128, 512\) "
                                          r"float32: 512, \(128, 32\) float32: 32\).*512"):
        _built(f)


def test_a_cta_pairs_tmem_is_freed_after_one_cluster_barrier(monkeypatch):
    # A pair's MMAs write both blocks' TMEM: both blocks meet on a cluster barrier
    # (release/acquire, every thread of both blocks) before freeing it; no block barrier
    # before it as well. The pair matmul still computes a @ b (emulate level).
    import importlib.util
    from pathlib import Path

    monkeypatch.setenv("PALLAS_MOSAIC_GPU_TARGET", "sm_100a")
    spec = importlib.util.spec_from_file_location(
        "tmem_pair_kernels", Path(__file__).with_name("test_lowering_clusters.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a, b = mod._operands()
    k = _built(mod.cta_pair_matmul(), a, b)
    text = str(module_of(k))
    end = text[:text.index("nvvm.tcgen05.dealloc")]
    arrive = end.rindex("nvvm.cluster.arrive")
    assert end[arrive:].startswith("nvvm.cluster.arrive {aligned}")  # not .relaxed
    # The body's last warpgroup barrier, then the cluster barrier: no block barrier.
    assert end.rfind("gpu.barrier") < end.rfind("bar.sync") < arrive
    (got,) = run_kernel(k, [np.asarray(a), np.asarray(b)])
    np.testing.assert_allclose(np.asarray(got, np.float32),
                               np.asarray(jnp.dot(a, b, preferred_element_type=F32)),
                               rtol=1e-2, atol=5e-2)
