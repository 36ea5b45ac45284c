"""``plgpu.async_prefetch`` lowers to one TMA prefetch of the GMEM window into L2
(``cp.async.bulk.prefetch.tensor``), issued by one thread; it changes no value, so a
kernel that prefetches what it then copies computes what it would without it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.backend import params
from pallas_mosaic_gpu._src.executor.launch import module_of
from pallas_mosaic_gpu._src.lowering import build

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")


def _prefetch_then_copy(indexer):
    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((256,), jnp.float32),
                       scratch_types=[plgpu.SMEM((256,), jnp.float32), plgpu.Barrier()])
    def kernel(x_gmem, o_ref, smem, barrier):
        plgpu.async_prefetch(x_gmem.at[indexer])
        plgpu.copy_gmem_to_smem(x_gmem.at[indexer], smem.at[indexer], barrier)
        plgpu.barrier_wait(barrier)
        o_ref[...] = smem[...] + 1.0

    return kernel


X = jnp.arange(256, dtype=jnp.float32)


@pytest.mark.parametrize("indexer", [..., slice(128), slice(64, 192)])
def test_a_prefetched_window_is_then_copied_unchanged(emulate, indexer):
    (got,) = emulate(_prefetch_then_copy(indexer), X)
    np.testing.assert_array_equal(np.asarray(got)[indexer], np.asarray(X)[indexer] + 1.0)


def _module_text(f) -> str:
    (eqn,) = [e for e in jax.make_jaxpr(f)(X).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    return str(module_of(build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k")))


def test_a_prefetch_is_one_tma_prefetch_into_l2():
    text = _module_text(_prefetch_then_copy(slice(128)))
    assert text.count("cp.async.bulk.prefetch.tensor.1d.L2.global.tile") == 1


def test_prefetching_an_smem_ref_is_refused():
    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((256,), jnp.float32),
                       scratch_types=[plgpu.SMEM((256,), jnp.float32)])
    def kernel(x_gmem, o_ref, smem):
        plgpu.async_prefetch(smem)

    with pytest.raises(Exception, match="async_prefetch: the ref must be a GMEM ref"):
        _module_text(kernel)
