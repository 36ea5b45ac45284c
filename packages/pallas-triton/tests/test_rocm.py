"""AMD GPUs: the rocm lowering (XLA's Triton call), the compile level per AMD target,
what each target has, and the ROCm plugin's message on machines without one."""

from __future__ import annotations

import importlib.util
import logging
import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import pallas as pl
import pallas.plugins
import pallas_triton as pltriton
from pallas_triton._src import quiet_rocm, rocm_call


def _matmul(dtype=jnp.float16, precision=None, compiler_params=None, n=64):
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], precision=precision,
                             preferred_element_type=jnp.float32)

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((2 * n, 2 * n), jnp.float32), grid=(2, 2),
        in_specs=[pl.BlockSpec((n, n), lambda i, j: (i, 0)),
                  pl.BlockSpec((n, n), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((n, n), lambda i, j: (i, j)),
        compiler_params=compiler_params or pltriton.CompilerParams(), backend="triton")
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((2 * n, n)), dtype)
    b = jnp.asarray(rng.standard_normal((n, 2 * n)), dtype)
    return f, (a, b)


def test_the_triton_backend_lowers_for_rocm():
    b = pallas.plugins.select_backend("rocm")
    assert b.name == "triton" and "rocm" in b.platforms


def test_lowers_for_rocm_to_xlas_triton_call_and_the_config_reads_back():
    f, args = _matmul()
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("rocm",)).as_text()
    assert f"stablehlo.custom_call @{rocm_call.CUSTOM_CALL_TARGET}" in text
    assert "mhlo.backend_config = {" in text  # a dictionary: the typed-FFI form XLA reads
    (cfg,) = rocm_call.read_backend_config(text)
    (k,) = pltriton.compile(f, *args, compute_capability="gfx942")
    assert (cfg.name, cfg.num_warps, cfg.num_stages, cfg.grid, cfg.debug) == (
        k.name, 4, 2, k.lowered.launch_grid, False)  # 2 stages: Triton's AMD default
    # The bytecode in the config is the kernel's TTIR, as jaxlib's Triton dialect (the
    # one XLA parses it with) reads it.
    assert rocm_call.canonical_ttir(cfg.ir) == rocm_call.canonical_ttir(k.ttir)
    assert "tt.dot" in rocm_call.canonical_ttir(cfg.ir)


@pytest.mark.skipif(importlib.util.find_spec("jax_cuda13_plugin") is None,
                    reason="the cuda lowering needs jax-cuda13-plugin (pallas-triton[cuda])")
def test_cuda_and_rocm_get_the_same_kernel():
    f, args = _matmul()
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda", "rocm")).as_text()
    assert "@triton_kernel_call" in text and f"@{rocm_call.CUSTOM_CALL_TARGET}" in text
    (cfg,) = rocm_call.read_backend_config(text)
    (nv,) = pltriton.compile(f, *args, compute_capability=80)
    from pallas_triton._src.gpu_call import kernel_call_config

    proto = zlib.decompress(kernel_call_config(nv.lowered, nv, nv.name))
    assert nv.ttir.encode() in proto  # the TTIR the CUDA plugin's call carries
    assert rocm_call.canonical_ttir(cfg.ir) == rocm_call.canonical_ttir(nv.ttir)


def test_exports_for_rocm():
    f, args = _matmul(n=32)
    exp = export.export(
        jax.jit(f), platforms=["rocm"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call(rocm_call.CUSTOM_CALL_TARGET)],
    )(*args)
    assert exp.platforms == ("rocm",)
    assert exp.serialize()


@pytest.mark.parametrize("arch, unit, wave", [
    ("gfx90a", "v_mfma_f32_32x32x8f16", 64), ("gfx942", "v_mfma_f32_32x32x8_f16", 64),
    ("gfx950", "v_mfma_f32_32x32x16_f16", 64), ("gfx1100", "v_wmma_f32_16x16x16_f16", 32)])
def test_compiles_for_each_amd_target_to_hsaco_and_amdgcn(arch, unit, wave):
    f, args = _matmul()
    (k,) = pltriton.compile(f, *args, compute_capability=arch)
    assert (k.platform, k.arch, k.warp_size, k.compute_capability) == ("rocm", arch, wave, None)
    assert re.search(rf'\.amdgcn_target "\S*-amd-amdhsa-\S*{arch}\b', k.amdgcn)
    assert unit in k.amdgcn and k.uses_tensor_cores()
    assert pltriton.AMD_TARGETS[arch].matrix_dtypes["float16"] == unit
    usage = k.resource_usage()  # also checks the hsaco is an AMDGPU ELF with the kernel
    assert usage["wavefront_size"] == wave
    assert 0 < usage["vgprs"] <= 512 and 0 < usage["sgprs"] <= 112
    assert usage["lds"] == k.shared_mem_bytes > 0  # the operands are staged in LDS
    assert usage["vgpr_spills"] == usage["sgpr_spills"] == usage["scratch"] == 0
    assert usage["occupancy"] >= 1


def test_f32_dot_is_tf32_only_where_the_target_has_it():
    f, args = _matmul(jnp.float32, n=32)
    calls = pltriton.find_pallas_calls(f, *args)
    assert 'input_precision="tf32"' in calls[0].lower(target="gfx942").source
    assert 'input_precision="ieee"' in calls[0].lower(target="gfx90a").source
    # Triton rejects "tf32" for gfx90a: the source made for it compiles.
    (k,) = pltriton.compile(f, *args, compute_capability="gfx90a")
    assert "v_mfma_f32_32x32x2f32" in k.amdgcn
    out = pltriton.emulate_lowered(calls[0].lower(target="gfx90a"), *args)[0]
    np.testing.assert_allclose(out, np.asarray(args[0]) @ np.asarray(args[1]), rtol=1e-5,
                               atol=1e-4)


def test_the_amd_target_comes_from_params_then_the_environment(monkeypatch):
    f, args = _matmul(compiler_params=pltriton.CompilerParams(rocm_arch="gfx1100"), n=32)
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("rocm",)).as_text()
    assert rocm_call.read_backend_config(text)
    assert pltriton.rocm_arch(pltriton.CompilerParams(rocm_arch="gfx1100")) == "gfx1100"
    monkeypatch.setenv("PALLAS_TRITON_ROCM_ARCH", "gfx90a")
    assert pltriton.rocm_arch(pltriton.CompilerParams()) == "gfx90a"
    monkeypatch.delenv("PALLAS_TRITON_ROCM_ARCH")
    assert pltriton.rocm_arch() == pltriton.DEFAULT_ROCM_ARCH == "gfx942"


def test_an_unknown_amd_target_is_an_error_naming_it_and_the_known_ones():
    f, args = _matmul(compiler_params=pltriton.CompilerParams(rocm_arch="gfx803"), n=32)
    with pytest.raises(ValueError, match=r"unknown AMD target 'gfx803'.*gfx90a, gfx942"):
        jax.jit(f).trace(*args).lower(lowering_platforms=("rocm",))


def test_the_no_amd_gpu_record_is_dropped_and_other_plugin_errors_kept():
    filt = quiet_rocm.NoAMDGPUFilter()

    def record(module, error):
        try:
            raise error
        except ValueError:
            import sys

            return logging.LogRecord(
                "jax._src.xla_bridge", logging.ERROR, __file__, 1,
                "Jax plugin configuration error: Exception when calling %s.initialize()",
                (module,), sys.exc_info())

    no_gpu = ValueError("No AMD GPUs were found, skipping ROCm plugin initialization")
    assert not filt.filter(record("jax_plugins.xla_rocm7", no_gpu))
    assert filt.filter(record("jax_plugins.xla_rocm7", ValueError("bad library")))
    assert filt.filter(record("jax_plugins.xla_cuda13", no_gpu))
    assert quiet_rocm._FILTER in logging.getLogger("jax._src.xla_bridge").filters


def test_debug_barrier_reaches_xla_as_gpu_barrier():
    # Triton 3.9 writes tl.debug_barrier() as ttg.barrier, which XLA's TTIR input lacks.
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0
        pltriton.debug_barrier()

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32,), jnp.float32),
                       backend="triton")
    text = jax.jit(f).trace(jnp.ones(32)).lower(lowering_platforms=("rocm",)).as_text()
    (cfg,) = rocm_call.read_backend_config(text)
    assert "gpu.barrier" in rocm_call.canonical_ttir(cfg.ir)


def test_targeting_scopes_the_lowering_target():
    b = pallas.plugins.get_backend("triton")
    with b.targeting("rocm", "gfx1100"):
        assert pltriton.rocm_arch() == "gfx1100"
    assert pltriton.rocm_arch() == "gfx942"
    with pytest.raises(ValueError, match="unknown AMD target 'sm_90'"):
        with b.targeting("rocm", "sm_90"):
            pass
    with pytest.raises(ValueError, match="not for 'tpu'"):
        with b.targeting("tpu"):
            pass


def test_a_kernel_needing_more_lds_than_the_target_has_is_refused_naming_it():
    # 64x512 and 512x64 f32 operand tiles: more than gfx90a's 64 KiB of LDS.
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], precision=jax.lax.Precision.HIGHEST)

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((64, 64), jnp.float32),
                       compiler_params=pltriton.CompilerParams(rocm_arch="gfx90a"),
                       backend="triton")
    args = (jnp.ones((64, 512)), jnp.ones((512, 64)))
    (k,) = pltriton.compile(f, *args, compute_capability="gfx90a")
    assert k.shared_mem_bytes > 65536  # pltriton.compile reports it ...
    with pytest.raises(NotImplementedError, match=r"LDS; AMD target gfx90a \(CDNA2\) has "
                                                  r"65536"):
        jax.jit(f).trace(*args).lower(lowering_platforms=("rocm",))  # ... lowering refuses


def _accumulating_dot(compiler_params):
    # (16, 128) x (128, 128) f32 blocks accumulated over a sequential grid axis: 80 KiB
    # of LDS with the loop pipelined in 2 stages, 64 KiB or less without.
    def kernel(a_ref, b_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(a_ref[...], b_ref[...], precision=jax.lax.Precision.HIGHEST)

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32), grid=(1, 4),
        in_specs=[pl.BlockSpec((16, 128), lambda i, k: (i, k)),
                  pl.BlockSpec((128, 128), lambda i, k: (k, 0))],
        out_specs=pl.BlockSpec((16, 128), lambda i, k: (i, 0)),
        compiler_params=compiler_params, backend="triton")
    return f, (jnp.ones((16, 512)), jnp.ones((512, 128)))


def test_a_kernel_over_the_lds_only_when_pipelined_is_lowered_unpipelined():
    f, args = _accumulating_dot(pltriton.CompilerParams())
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("rocm",)).as_text()
    (cfg,) = rocm_call.read_backend_config(text)
    assert cfg.num_stages == 1  # the default, 2, needs more than gfx942's 64 KiB
    f, args = _accumulating_dot(pltriton.CompilerParams(num_stages=2))
    with pytest.raises(NotImplementedError, match=r"LDS; AMD target gfx942 \(CDNA3\)"):
        jax.jit(f).trace(*args).lower(lowering_platforms=("rocm",))  # asked for: refused


def test_cbrt_calls_amds_device_library_which_triton_libdevice_lacks_for_hip():
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.cbrt(x_ref[...])

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((64,), jnp.float32),
                       backend="triton")
    x = jnp.linspace(-8.0, 8.0, 64, dtype=jnp.float32)
    (k,) = pltriton.compile(f, x, compute_capability="gfx942")
    assert "__ocml_cbrt_f32" in k.lowered.source and k.hsaco
    (k,) = pltriton.compile(f, x)  # NVIDIA keeps libdevice's cbrt
    assert "libdevice.cbrt" in k.lowered.source
    with pl.emulate_device("rocm:gfx942"):  # the AMD source, under the interpreter
        np.testing.assert_allclose(f(x), np.cbrt(np.asarray(x)), rtol=1e-6)
