"""Block-scaled ``tcgen05_mma`` in the interpreters: ``acc = (a * a_scale) @ (b *
b_scale)``, each scale applying to a block of 32 (or 16) consecutive elements of K, as
upstream's reference computes it; the scales reach TMEM through
``async_copy_scales_to_tmem`` from SMEM in the tensor core's layout
``(MN / 128, KB / 4, 32, 16)``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu import interpret as gpu_interpret

F32, E8M0 = jnp.float32, jnp.float8_e8m0fnu


def _to_smem_layout(scales):
    """(MN, KB) block scales in the SMEM layout the tensor core reads."""
    mn, kb = scales.shape
    return (scales.reshape(mn // 128, 4, 32, kb // 4, 4).transpose(0, 3, 2, 1, 4)
            .reshape(mn // 128, kb // 4, 32, 16))


def _operands(m, n, k, dtype, block=32):
    ka, kb, ksa, ksb = jax.random.split(jax.random.key(0), 4)
    a = jax.random.uniform(ka, (m, k), F32, -2, 2).astype(dtype)
    b = jax.random.uniform(kb, (n, k), F32, -2, 2).astype(dtype)
    sa = jax.lax.bitcast_convert_type(
        jax.random.randint(ksa, (m, k // block), 122, 132, jnp.uint8), E8M0)
    sb = jax.lax.bitcast_convert_type(
        jax.random.randint(ksb, (n, k // block), 122, 132, jnp.uint8), E8M0)
    want = jnp.dot(a.astype(F32) * jnp.repeat(sa.astype(F32), block, axis=1),
                   (b.astype(F32) * jnp.repeat(sb.astype(F32), block, axis=1)).T)
    return a, b, sa, sb, want


def _scaled_matmul(m, n, k, dtype, interpret, block=32):
    def kernel(a_gmem, b_gmem, sa_gmem, sb_gmem, o_gmem, a, b, sa_smem, sb_smem, acc,
               sa, sb, bar):
        a[...] = a_gmem[...]
        b[...] = b_gmem[...]
        sa_smem[...] = sa_gmem[...]
        sb_smem[...] = sb_gmem[...]
        plgpu.commit_smem()
        plgpu.async_copy_scales_to_tmem(sa_smem, sa)
        plgpu.async_copy_scales_to_tmem(sb_smem, sb)
        plgpu.tcgen05_mma(acc, a, plgpu.transpose_ref(b, (1, 0)), a_scale=sa, b_scale=sb,
                          accumulate=False)
        plgpu.tcgen05_commit_arrive(bar.at[0])
        plgpu.barrier_wait(bar.at[0])
        o_gmem[...] = plgpu.async_load_tmem(acc)

    layout = plgpu.TMEMLayout.SCALES_LAYOUT
    scratch = [plgpu.SMEM((m, k), dtype), plgpu.SMEM((n, k), dtype),
               plgpu.SMEM((m // 128, k // block // 4, 32, 16), E8M0),
               plgpu.SMEM((n // 128, k // block // 4, 32, 16), E8M0),
               plgpu.TMEM((m, n), F32),
               plgpu.TMEM((m, k // block), E8M0, layout=layout),
               plgpu.TMEM((n, k // block), E8M0, layout=layout),
               plgpu.Barrier(orders_tensor_core=True)]
    out = jax.ShapeDtypeStruct((m, n), F32)
    if interpret is True:  # the reference interpreter
        return pl.pallas_call(kernel, out_shape=out, interpret=True,
                              in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 4,
                              out_specs=pl.BlockSpec(memory_space=plgpu.GMEM),
                              scratch_shapes=scratch)
    return plgpu.kernel(kernel, out_type=out, scratch_types=scratch, interpret=interpret)


@pytest.mark.parametrize("interpret,dtype", [
    pytest.param(True, jnp.float8_e4m3fn, id="reference-e4m3"),
    pytest.param(plgpu.InterpretParams(detect_races=True), jnp.float8_e5m2, id="gpu-e5m2"),
])
def test_a_block_scaled_mma_matches_upstreams_reference(interpret, dtype):
    m = n = 128
    a, b, sa, sb, want = _operands(m, n, 128, dtype)
    out = _scaled_matmul(m, n, 128, dtype, interpret)(a, b, _to_smem_layout(sa),
                                                      _to_smem_layout(sb))
    np.testing.assert_allclose(out, want, rtol=1e-5)
    if interpret is not True:
        assert not gpu_interpret.get_races().races_found, gpu_interpret.get_races()


def test_scales_must_come_in_pairs_of_the_right_shape():
    with pytest.raises(ValueError, match="must be both present or both unspecified"):
        _bad_scales(a_scale_only=True)
    with pytest.raises(ValueError, match=r"a_scale is .*\(128, K / block\)"):
        _bad_scales(a_scale_rows=64)
    with pytest.raises(ValueError, match=r"async_copy_scales_to_tmem: .*\(MN / 128, KB / 4, "
                                         r"32, 16\)"):
        _bad_scales(flat_smem=True)


def _bad_scales(a_scale_only=False, a_scale_rows=128, flat_smem=False):
    layout = plgpu.TMEMLayout.SCALES_LAYOUT

    def kernel(o_gmem, a, b, acc, sa, sb, sa_smem, bar):
        if flat_smem:
            plgpu.async_copy_scales_to_tmem(sa_smem, sa)
        plgpu.tcgen05_mma(acc, a, plgpu.transpose_ref(b, (1, 0)), a_scale=sa,
                          b_scale=None if a_scale_only else sb, accumulate=False)

    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128, 128), F32), interpret=True,
                     scratch_types=[plgpu.SMEM((128, 128), jnp.float8_e4m3fn),
                                    plgpu.SMEM((128, 128), jnp.float8_e4m3fn),
                                    plgpu.TMEM((128, 128), F32),
                                    plgpu.TMEM((a_scale_rows, 4), E8M0, layout=layout),
                                    plgpu.TMEM((128, 4), E8M0, layout=layout),
                                    plgpu.SMEM((128, 4), E8M0),
                                    plgpu.Barrier(orders_tensor_core=True)])
    jax.make_jaxpr(f)()


def test_the_lowering_refuses_a_block_scaled_mma(monkeypatch):
    pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering needs jax-cuda13-plugin")
    monkeypatch.setenv("PALLAS_MOSAIC_GPU_TARGET", "sm_100a")
    f8 = jnp.float8_e4m3fn

    def kernel(o_gmem, a, b, acc, sa, sb, bar):
        plgpu.tcgen05_mma(acc, a, plgpu.transpose_ref(b, (1, 0)), bar.at[0], a_scale=sa,
                          b_scale=sb, accumulate=False)
        plgpu.barrier_wait(bar.at[0])

    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128, 128), F32),
                     scratch_types=[plgpu.SMEM((128, 128), f8), plgpu.SMEM((128, 128), f8),
                                    plgpu.TMEM((128, 128), F32),
                                    plgpu.TMEM((128, 4), E8M0, packed=True),
                                    plgpu.TMEM((128, 4), E8M0, packed=True),
                                    plgpu.Barrier(orders_tensor_core=True)])
    # Its scale buffers are refused first (float8_e8m0fnu TMEM); never lowered unscaled.
    with pytest.raises(Exception, match=r"a_scale/b_scale|float8_e8m0fnu"):
        jax.jit(f).trace().lower(lowering_platforms=("cuda",))
