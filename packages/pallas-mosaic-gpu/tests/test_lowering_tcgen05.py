"""Lowering Blackwell's tensor cores (sm_100a): TMEM buffers, ``tcgen05_mma`` into
them, ``tcgen05_commit_arrive``, TMEM loads and stores, column views; the compile level
finds tcgen05 instructions in the PTX; bad input is refused at trace time naming the
argument, the target and what is valid."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.lowering import build

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F16, F32 = jnp.float16, jnp.float32
SWIZZLED = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # for f16


def _kernel_of(f, *args, target="sm_100a"):
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    p = eqn.params
    from pallas_mosaic_gpu._src.backend import params

    return build(p["jaxpr"], p["grid_mapping"], params(p["compiler_params"]), "k",
                 target=target)


def tcgen05_kernel(tmem=(128, 256), acc_dtype=F32, n=128, a_transforms=SWIZZLED,
                   barrier=plgpu.Barrier(orders_tensor_core=True), interpret=False):
    """o = a @ b + a @ b: two MMAs into the second half of a TMEM buffer (a column view),
    the first overwriting (accumulate=False), completion by a commit; then TMEM ->
    registers -> TMEM -> registers -> SMEM."""

    def kernel(a_gmem, b_gmem, o_smem):
        def body(a, b, tma_bar, acc, done):
            plgpu.copy_gmem_to_smem(a_gmem, a, tma_bar.at[0])
            plgpu.copy_gmem_to_smem(b_gmem, b, tma_bar.at[0])
            plgpu.barrier_wait(tma_bar.at[0])
            half = acc.at[:, pl.ds(tmem[1] - n, n)]
            plgpu.tcgen05_mma(half, a, b, accumulate=False)
            plgpu.tcgen05_mma(half, a, b, done)
            plgpu.barrier_wait(done)
            plgpu.async_store_tmem(half, plgpu.async_load_tmem(half))
            plgpu.commit_tmem()
            plgpu.tcgen05_commit_arrive(done)
            plgpu.barrier_wait(done)
            o_smem[...] = plgpu.async_load_tmem(half)
            plgpu.wait_load_tmem()

        pl.run_scoped(body, plgpu.SMEM((128, 64), F16, transforms=a_transforms),
                      plgpu.SMEM((64, n), F16, transforms=SWIZZLED),
                      plgpu.Barrier(num_arrivals=2), plgpu.TMEM(tmem, acc_dtype), barrier)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, n), acc_dtype),
                          in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
                          backend="mosaic_gpu", interpret=interpret)


def _operands(n=128):
    a = jax.random.normal(jax.random.key(0), (128, 64), F32).astype(F16)
    b = jax.random.normal(jax.random.key(1), (64, n), F32).astype(F16)
    return a, b


def test_tcgen05_mma_tmem_and_commits_lower_for_sm100a_and_interpret():
    a, b = _operands()
    k = _kernel_of(tcgen05_kernel(), a, b)
    assert {"mgpu_tcgen05_mma", "mgpu_tcgen05_commit_arrive", "mgpu_commit_tmem",
            "mgpu_wait_load_tmem", "get", "swap"} <= k.primitives
    text = jax.jit(tcgen05_kernel()).trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("custom_call @mosaic_gpu_v2") == 1
    got = tcgen05_kernel(interpret=plgpu.InterpretParams())(a, b)
    want = 2 * jnp.dot(a, b, preferred_element_type=F32)
    assert jnp.allclose(got, want, rtol=1e-3, atol=1e-2)


# -- trace-time errors ---------------------------------------------------------------


def test_tcgen05_and_tmem_on_hopper_are_refused_naming_the_target():
    a, b = _operands()
    with pytest.raises(ValueError, match=r"plgpu.TMEM \(tensor memory, for tcgen05_mma\) is "
                                         r"Blackwell-only \(sm_100a\).*compiled for sm_90a.*"
                                         r"plgpu.wgmma"):
        _kernel_of(tcgen05_kernel(), a, b, target="sm_90a")


@pytest.mark.parametrize("tmem,dtype,match", [
    ((96, 128), F32, r"TMEM\(\(96, 128\), float32\): a TMEM buffer is 2D with 128 rows"),
    ((128, 1024), F32, r"TMEM\(\(128, 1024\), float32\) needs 1024 TMEM columns; TMEM "
                       r"has 512 .* at most 512 columns"),
    ((128, 100), F32, r"TMEM\(\(128, 100\), float32\): the columns \(100\) must be a "
                      r"multiple of 8"),
], ids=["rows", "columns", "multiple"])
def test_tmem_buffers_tmem_cannot_hold_are_refused_naming_the_buffer(tmem, dtype, match):
    def kernel(x_gmem, o_gmem):
        pl.run_scoped(lambda t: None, plgpu.TMEM(tmem, dtype))

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                       in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)],
                       out_specs=pl.BlockSpec(memory_space=plgpu.GMEM), backend="mosaic_gpu")
    with pytest.raises(ValueError, match=r"run_scoped buffer 0: plgpu." + match):
        _kernel_of(f, jnp.ones((8, 128), F32))


def test_tcgen05_operands_the_tensor_cores_cannot_read_are_refused():
    a, b = _operands()
    with pytest.raises(ValueError, match=r"tcgen05_mma: a \(SMEM \(128, 64\) float16\) must "
                                         r"be tiled and swizzled.*TilingTransform"):
        _kernel_of(tcgen05_kernel(a_transforms=()), a, b)
    with pytest.raises(ValueError, match=r"a float16 matmul accumulates into float32 or "
                                         r"float16 TMEM, but acc is int32"):
        _kernel_of(tcgen05_kernel(acc_dtype=jnp.int32), a, b)


def test_tcgen05_barriers_must_order_the_tensor_core_as_upstream():
    a, b = _operands()
    with pytest.raises(ValueError, match=r"tcgen05_mma: MMA barrier must have "
                                         r"orders_tensor_core set to True"):
        jax.make_jaxpr(tcgen05_kernel(barrier=plgpu.Barrier()))(a, b)


def test_a_tmem_view_across_rows_is_refused():
    def kernel(x_gmem, o_gmem):
        def body(acc):
            acc.at[pl.ds(0, 64), :][...] = jnp.zeros((64, 128), F32)

        pl.run_scoped(body, plgpu.TMEM((128, 128), F32))

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                       in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)],
                       out_specs=pl.BlockSpec(memory_space=plgpu.GMEM), backend="mosaic_gpu")
    with pytest.raises(ValueError, match=r"async_store_tmem: a TMEM ref \(128, 128\) can "
                                         r"only be sliced along its columns"):
        _kernel_of(f, jnp.ones((8, 128), F32))


# -- the compile level: in a process of its own (Mosaic GPU fixes the target per process)


def test_tcgen05_kernels_compile_for_sm100a_with_tcgen05_instructions():
    from pallas_mosaic_gpu import compiler

    try:
        compiler.find_toolchain()
    except compiler.ToolchainMissingError as e:
        pytest.skip(str(e))
    env = dict(os.environ, PALLAS_MOSAIC_GPU_TARGET="sm_100a", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, r in reports.items():
        assert r["target"] == "sm_100a" and r["tcgen05"] and not r["wgmma"], name
        assert r["spills"] == 0 and 0 < r["registers"] <= 255, name
    mix = reports["tcgen05_kernel"]["mix"]
    assert mix["tcgen05"] >= 8  # alloc, mma, commit, ld, st, wait, dealloc, ...
    assert mix.get("cp", 0) > 0  # the TMA copies


def _compile_reports() -> dict:
    """Compiles this file's kernel and the Blackwell example for sm_100a (run in a
    subprocess by the test above)."""
    import importlib.util
    from pathlib import Path

    from pallas_mosaic_gpu import compiler

    path = Path(__file__).resolve().parents[3] / "examples" / "mosaic_gpu_matmul_blackwell.py"
    spec = importlib.util.spec_from_file_location("mosaic_gpu_matmul_blackwell", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    out = {}
    for name, f, args in [("tcgen05_kernel", tcgen05_kernel(), _operands()),
                          ("example", ex.matmul, ex.inputs(256, 256, 256))]:
        (k,) = compiler.compile(f, *args, target="sm_100a")
        out[name] = dict(target=k.target, tcgen05=k.uses_tcgen05, wgmma=k.uses_wgmma,
                         spills=k.spill_stores, registers=k.registers,
                         mix=k.instruction_mix())
    return out


if __name__ == "__main__":
    print(json.dumps(_compile_reports()))
