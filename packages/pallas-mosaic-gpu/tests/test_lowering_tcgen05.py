"""Lowering Blackwell's tensor cores (sm_100a): TMEM buffers, ``tcgen05_mma`` into
them, ``tcgen05_commit_arrive``, TMEM loads and stores, column views; the compile level
finds tcgen05 instructions in the PTX; the emulate level runs the warp-specialised
matmul (its TMA warp and MMA warp wait for each other); bad input is refused at trace
time naming the argument, the target and what is valid."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.executor import launch
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


def warp_specialized(k_steps=4, interpret=False):
    """o = a @ b by warps: warp 0 of warpgroup 0 copies K-slices in with TMA, warp 1
    issues the MMAs (each frees its slot on a "consumed" barrier; the last one commits);
    warpgroup 1 loads TMEM into registers and stores the result."""
    m, n, bk = 128, 128, 64

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct((m, n), F16), num_threads=2,
        thread_name="wg", interpret=interpret,
        scratch_types=dict(
            a_smem=plgpu.SMEM((2, m, bk), F16, transforms=SWIZZLED),
            b_smem=plgpu.SMEM((2, bk, n), F16, transforms=SWIZZLED),
            acc=plgpu.TMEM((m, n), F32), out=plgpu.SMEM((m, n), F16),
            loaded=plgpu.Barrier(num_arrivals=2, num_barriers=2),
            consumed=plgpu.Barrier(num_barriers=2, orders_tensor_core=True),
            done=plgpu.Barrier(orders_tensor_core=True)))
    def kernel(a_gmem, b_gmem, o_gmem, a_smem, b_smem, acc, out, loaded, consumed, done):
        @pl.when(jax.lax.axis_index("wg") == 0)
        def _():
            @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
            def _():
                warp = jax.lax.axis_index("warp")

                @pl.when(warp == 0)
                def _():
                    def load(ki, c):
                        slot = jax.lax.rem(ki, 2)

                        @pl.when(ki >= 2)
                        def _():
                            plgpu.barrier_wait(consumed.at[slot])

                        ks = pl.ds(ki * bk, bk)
                        plgpu.copy_gmem_to_smem(a_gmem.at[:, ks], a_smem.at[slot],
                                                loaded.at[slot])
                        plgpu.copy_gmem_to_smem(b_gmem.at[ks, :], b_smem.at[slot],
                                                loaded.at[slot])
                        return c

                    jax.lax.fori_loop(0, k_steps, load, 0)

                @pl.when(warp == 1)
                def _():
                    def mma(ki, c):
                        slot = jax.lax.rem(ki, 2)
                        plgpu.barrier_wait(loaded.at[slot])
                        plgpu.tcgen05_mma(acc, a_smem.at[slot], b_smem.at[slot],
                                          consumed.at[slot], accumulate=ki > 0)
                        return c

                    jax.lax.fori_loop(0, k_steps, mma, 0)
                    plgpu.tcgen05_commit_arrive(done)

        @pl.when(jax.lax.axis_index("wg") == 1)
        def _():
            plgpu.barrier_wait(done)
            out[...] = plgpu.async_load_tmem(acc).astype(F16)
            plgpu.wait_load_tmem()
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out, o_gmem)
            plgpu.wait_smem_to_gmem(0)

    return kernel


def test_warps_of_a_warpgroup_issue_tma_copies_and_mmas_on_their_own():
    a = jax.random.normal(jax.random.key(0), (128, 256), F32).astype(F16)
    b = jax.random.normal(jax.random.key(1), (256, 128), F32).astype(F16)
    text = jax.jit(warp_specialized()).trace(a, b).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("custom_call @mosaic_gpu_v2") == 1
    got = warp_specialized(interpret=plgpu.InterpretParams())(a, b)
    want = jnp.dot(a, b, preferred_element_type=F32)
    assert jnp.allclose(got.astype(F32), want, rtol=2e-2, atol=2e-1)


@pytest.fixture
def _blackwell(monkeypatch):
    monkeypatch.setenv("PALLAS_MOSAIC_GPU_TARGET", "sm_100a")


@pytest.mark.usefixtures("_blackwell")
def test_a_tma_warp_and_an_mma_warp_compute_a_matmul_on_blackwell(emulate, monkeypatch):
    # Only warpgroup 0 (whose warps wait for each other) gets a strand per warp, on the
    # second run; warpgroup 1 stays one strand of 128 threads.
    runs = []
    execute = launch._execute
    monkeypatch.setattr(launch, "_execute",
                        lambda *a: runs.append(set(a[-1])) or execute(*a))
    a = jax.random.normal(jax.random.key(0), (128, 256), F32).astype(F16)
    b = jax.random.normal(jax.random.key(1), (256, 128), F32).astype(F16)
    (got,) = emulate(warp_specialized(), a, b)
    assert runs == [set(), {0}]
    want = jnp.dot(a, b, preferred_element_type=F32)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want),
                               rtol=1e-2, atol=5e-2)


def test_arrays_inside_a_warp_are_refused_naming_the_mesh():
    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((128, 128), F32),
                       scratch_types=[plgpu.SMEM((128, 128), F32)])
    def kernel(o_gmem, buf):
        @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
        def _():
            buf[...] = jnp.zeros((128, 128), F32)

    with pytest.raises(NotImplementedError, match=r"writing an array of shape \(128, 128\) "
                                                  r"inside pl.core_map over a plgpu.WarpMesh"):
        jax.jit(kernel).trace().lower(lowering_platforms=("cuda",))


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
    pair = reports["cta_pair"]  # test_lowering_clusters' kernel: one cluster of 2 blocks
    assert pair["cluster"] and pair["pair_commits"] == 1
    assert pair["pair_mmas"] == 64 // 16  # K = 64 in 2-CTA MMAs of K = 16 (f16)
    assert pair["pair_copies"] == 2  # the partitioned TMA loads (cta_group::2)
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
    spec = importlib.util.spec_from_file_location(
        "test_lowering_clusters", Path(__file__).with_name("test_lowering_clusters.py"))
    clusters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(clusters)
    out = {}
    ab = (jnp.ones((128, 256), F16), jnp.ones((256, 128), F16))
    for name, f, args in [("tcgen05_kernel", tcgen05_kernel(), _operands()),
                          ("warp_specialized", warp_specialized(), ab),
                          ("example", ex.matmul, ex.inputs(256, 256, 256)),
                          ("cta_pair", clusters.cta_pair_matmul(), clusters._operands())]:
        (k,) = compiler.compile(f, *args, target="sm_100a")
        out[name] = dict(target=k.target, tcgen05=k.uses_tcgen05, wgmma=k.uses_wgmma,
                         spills=k.spill_stores, registers=k.registers,
                         mix=k.instruction_mix(),
                         cluster=".reqnctapercluster 2, 1, 1" in k.ptx,
                         pair_mmas=k.ptx.count("tcgen05.mma.cta_group::2"),
                         pair_commits=k.ptx.count("tcgen05.commit.cta_group::2"),
                         pair_copies=len(re.findall(r"cp\.async\.bulk\.tensor\.\S*"
                                                    r"cta_group::2", k.ptx)))
    return out


if __name__ == "__main__":
    print(json.dumps(_compile_reports()))


def test_branches_returning_tmem_loads_keep_the_tcgen05_layout():
    """A lax.cond whose branches return an ``async_load_tmem`` array (Blackwell's
    TCGEN05 register layout) scaled or shifted: the ``scf.if`` yields those fragments
    as they are (no strided vectors), and interpret mode matches plain JAX."""
    from pallas_mosaic_gpu._src.executor.launch import module_of

    def make(interpret):
        def kernel(a_gmem, b_gmem, o_smem):
            def body(a, b, bar, acc, done):
                plgpu.copy_gmem_to_smem(a_gmem, a, bar.at[0])
                plgpu.copy_gmem_to_smem(b_gmem, b, bar.at[0])
                plgpu.barrier_wait(bar.at[0])
                plgpu.tcgen05_mma(acc, a, b, done, accumulate=False)
                plgpu.barrier_wait(done)
                r = plgpu.async_load_tmem(acc)
                plgpu.wait_load_tmem()
                o_smem[...] = jax.lax.cond(pl.program_id(0) == 0, lambda: r * 2.0,
                                           lambda: r + 1.0)

            pl.run_scoped(body, plgpu.SMEM((128, 64), F16, transforms=SWIZZLED),
                          plgpu.SMEM((64, 128), F16, transforms=SWIZZLED),
                          plgpu.Barrier(num_arrivals=2), plgpu.TMEM((128, 128), F32),
                          plgpu.Barrier(orders_tensor_core=True))

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), F32),
                              in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
                              grid=(1,), backend="mosaic_gpu", interpret=interpret)

    a, b = _operands()
    ifs = [re.search(r":(\d+) = scf\.if .* -> \((.*)\) \{$", line) for line in
           str(module_of(_kernel_of(make(False), a, b))).splitlines() if "= scf.if " in line]
    # 128x128 f32 in the TCGEN05 layout: 64 vector<2xf32> per thread.
    assert ifs and all(m.group(1) == "64" and set(m.group(2).split(", ")) == {
        "vector<2xf32>"} for m in ifs), ifs
    want = 2 * jnp.dot(a, b, preferred_element_type=F32)
    assert jnp.allclose(make(True)(a, b), want, rtol=1e-2, atol=1e-2)
