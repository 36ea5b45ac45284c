"""The compile level: kernels go through Mosaic GPU's passes, PTX and ptxas for a
compile-only sm_90a device, and report what ptxas made of them."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
from pallas_mosaic_gpu import compiler

F32 = jnp.float32


def _toolchain_or_skip():
    pytest.importorskip("jax_plugins.xla_cuda13", reason="needs jax-cuda13-plugin")
    try:
        compiler.find_toolchain()
    except compiler.ToolchainMissingError as e:
        pytest.skip(str(e))


def _kernel():
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...]) - y_ref[...]

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 128), F32), grid=(4,),
                          in_specs=[spec, spec], out_specs=spec, backend="mosaic_gpu")


def test_a_kernel_compiles_to_sm90a_and_reports_its_resources():
    _toolchain_or_skip()
    x = jnp.zeros((32, 128), F32)
    (k,) = compiler.compile(_kernel(), x, x)
    assert k.target == "sm_90a"
    assert ".target sm_90a" in k.ptx
    assert 0 < k.registers <= 255 and k.spill_stores == 0 and k.spill_loads == 0
    assert k.smem_bytes >= 3 * 8 * 128 * 4  # two input blocks and one output block
    mix = k.instruction_mix()
    assert mix.get("cp", 0) > 0  # the TMA copies (cp.async.bulk.tensor)
    assert not k.uses_wgmma and not k.uses_tcgen05
    # nvdisasm (pip package nvidia-cuda-nvdisasm) lists the cubin's SASS, when installed.
    if os.path.isfile(os.path.join(compiler.find_toolchain(), "bin", "nvdisasm")):
        assert ".target\tsm_90a" in k.sass and "EXIT" in k.sass
    else:
        assert k.sass == ""
    # Compiling the same kernel again is served from the cache, with the same report.
    (again,) = compiler.compile(_kernel(), x, x)
    assert again.ptxas_report == k.ptxas_report


def test_unknown_targets_are_refused():
    with pytest.raises(ValueError, match="sm_80.*sm_90a"):
        compiler.target_config("sm_80")


def test_memory_registers_become_setmaxnreg_in_the_ptx():
    """emit_pipeline_warp_specialized(memory_registers=40): the memory warpgroup gives
    registers back (setmaxnreg.dec 40) and the compute warpgroup takes what is left, at
    most 256 (setmaxnreg.inc 256), as upstream."""
    import pallas_mosaic_gpu as plgpu

    _toolchain_or_skip()
    spec = plgpu.BlockSpec((64, 64), lambda i: (0, i))

    def kernel(x_gmem, o_gmem):
        def body(_, x_smem, o_smem):
            o_smem[...] = x_smem[...] + 1.0

        plgpu.emit_pipeline_warp_specialized(
            body, grid=(2,), memory_registers=40, wg_axis="wg", num_compute_wgs=1,
            in_specs=[spec], out_specs=[spec])(x_gmem, o_gmem)

    x = jnp.zeros((64, 128), F32)
    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(x.shape, F32), num_threads=2,
                     thread_name="wg")
    (k,) = compiler.compile(f, x)
    ptx = " ".join(k.ptx.split())
    assert "setmaxnreg.dec.sync.aligned.u32 40;" in ptx
    assert "setmaxnreg.inc.sync.aligned.u32 256;" in ptx


def test_float8_casts_compile_as_paired_conversions():
    """float8 casts of a plainly loaded block (not a tiled layout) go through Mosaic GPU's
    paired cvt instructions; an arith.truncf to float8 cannot be translated to LLVM IR."""
    _toolchain_or_skip()

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].astype(jnp.float8_e5m2).astype(F32)

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), F32),
                       backend="mosaic_gpu")
    (k,) = compiler.compile(f, jnp.zeros((16, 128), F32))
    assert "cvt.rn.satfinite.e5m2x2.f32" in k.ptx and "cvt.rn.f16x2.e5m2x2" in k.ptx
