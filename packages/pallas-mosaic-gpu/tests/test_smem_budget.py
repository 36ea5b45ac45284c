"""A kernel whose blocks, scratch and staging buffers need more shared memory than one
CUDA block has (227 KiB on sm_90a and sm_100a) fails at trace time, saying how many bytes
it needs, what holds them and the limit: bad input, not a crash deep in Mosaic GPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas.plugins
from pallas_mosaic_gpu._src.lowering.smem_budget import SmemExceededError, limit

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")


def _copy(rows: int, scratch=()):
    def kernel(x_ref, o_ref, *scratch_refs):
        o_ref[...] = x_ref[...] + 1.0

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32),
                          backend="mosaic_gpu", scratch_shapes=scratch)


def test_the_limit_is_227_kib_on_hopper_and_blackwell():
    assert limit("sm_90a") == limit("sm_100a") == limit(None) == 227 * 1024


def test_blocks_too_big_for_smem_fail_at_trace_time_with_the_bytes_needed():
    # in and out blocks of 256 x 128 f32: 2 x 128 KiB.
    x = jax.ShapeDtypeStruct((256, 128), jnp.float32)
    with pytest.raises(SmemExceededError) as e:
        jax.jit(_copy(256)).trace(x)
    msg = str(e.value)
    assert "mosaic_gpu" in msg
    assert "needs 262152 bytes of shared memory" in msg  # two blocks and a barrier
    assert "232448 bytes (227 KiB)" in msg and "sm_90a" in msg
    assert "block of args[0] ((256, 128) float32): 131072 bytes" in msg
    assert "smaller block shapes" in msg


def test_the_error_is_a_value_error_and_unsupported_for_the_conformance_suite():
    assert issubclass(SmemExceededError, ValueError)
    assert issubclass(SmemExceededError, pallas.plugins.LevelUnsupportedError)


def test_scratch_counts_towards_the_budget():
    import pallas_mosaic_gpu as plgpu

    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    jax.jit(_copy(64)).trace(x)  # 64 KiB of blocks fit
    with pytest.raises(SmemExceededError, match=r"scratch_shapes\[0\]: 196608 bytes"):
        jax.jit(_copy(64, [plgpu.SMEM((384, 128), jnp.float32)])).trace(x)


def test_staging_buffers_of_different_operations_share_smem():
    # Two row reductions of computed (not loaded) arrays: each stages its 32 KiB operand
    # in SMEM within its own rule, so one region serves both.
    import numpy as np

    from pallas_mosaic_gpu._src.backend import params
    from pallas_mosaic_gpu._src.executor import run_kernel
    from pallas_mosaic_gpu._src.lowering import build

    x = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)

    def kernel(x_ref, a_ref, b_ref):
        a_ref[...] = jnp.max(x_ref[...] * 2.0, axis=1)
        b_ref[...] = jnp.sum(x_ref[...] + 1.0, axis=1)

    out = (jax.ShapeDtypeStruct((64,), jnp.float32),) * 2
    f = pl.pallas_call(kernel, out_shape=out, backend="mosaic_gpu")
    (eqn,) = [e for e in jax.make_jaxpr(f)(x).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    k = build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k")
    a, b = run_kernel(k, [x])
    np.testing.assert_allclose(a, (x * 2).max(1), rtol=1e-6)
    np.testing.assert_allclose(b, (x + 1).sum(1), rtol=1e-5, atol=1e-4)
    block = x.nbytes  # 32 KiB: the input block, and one staging region of that size
    assert 2 * block <= k.smem_bytes < 3 * block
