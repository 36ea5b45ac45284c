"""The Mosaic GPU examples in ``examples/``: GPU interpret mode matches plain JAX, they
lower to ``mosaic_gpu_v2``, and the pipelined matmul and the flash attention compile to
wgmma for sm_90a (the Blackwell one to tcgen05 for sm_100a: ``test_lowering_tcgen05.py``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _load(name):
    path = EXAMPLES / f"{name}.py"
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    spec = importlib.util.spec_from_file_location(f"pallas_mosaic_gpu_example_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _compiler():
    """``pallas_mosaic_gpu.compiler``, or a skip naming the missing toolchain package."""
    from pallas_mosaic_gpu import compiler

    try:
        compiler.find_toolchain()
    except compiler.ToolchainMissingError as e:
        pytest.skip(str(e))
    return compiler


@pytest.mark.parametrize("name,fn", [("mosaic_gpu_matmul", "matmul"),
                                     ("mosaic_gpu_matmul_ws", "matmul_ws"),
                                     ("mosaic_gpu_matmul_blackwell", "matmul")])
def test_matmul_interprets_like_jnp_dot_and_lowers(name, fn):
    ex = _load(name)
    f = getattr(ex, fn)
    x, y = ex.inputs(128, 128, 128)
    got = f(x, y, interpret=True)
    np.testing.assert_allclose(got.astype(jnp.float32), ex.reference(x, y).astype(jnp.float32),
                               rtol=2e-2, atol=1e-1)
    import jax

    text = jax.jit(f).trace(x, y).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("custom_call @mosaic_gpu_v2") == 1


def test_pipelined_matmul_compiles_to_wgmma_for_sm90a():
    compiler = _compiler()
    ex = _load("mosaic_gpu_matmul")
    x, y = ex.inputs(128, 128, 128)
    (k,) = compiler.compile(ex.matmul, x, y)
    assert k.uses_wgmma and "wgmma.mma_async" in k.ptx
    assert k.spill_stores == 0 and k.registers <= 255
    assert k.instruction_mix().get("cp", 0) > 0  # TMA copies


def test_the_warp_specialized_matmuls_k_loop_stays_a_loop_in_the_ptx():
    # k = 256 in 64-wide steps: LLVM fully unrolled this 4-step loop (every step's
    # wgmma block, commit, wait and barrier waits in the PTX 4 times: 32
    # wgmma.mma_async, not 8) until the pipeline's scf.for carried LLVM's unroll-disable
    # loop metadata, which also reaches ptxas as .pragma "nounroll" (memory warpgroup's
    # loop and compute warpgroup's loop).
    compiler = _compiler()
    ex = _load("mosaic_gpu_matmul_ws")
    x, y = _load("mosaic_gpu_matmul").inputs(128, 256, 128)
    (k,) = compiler.compile(ex.matmul_ws, x, y)
    assert k.ptx.count("wgmma.mma_async") == 8  # one step: 128x128x64 as 2 x 4 m64n128k16
    assert k.ptx.count('.pragma "nounroll"') == 2
    assert k.spill_stores == 0


def test_flash_attention_interprets_like_plain_softmax_attention_and_lowers():
    ex = _load("mosaic_gpu_flash_attention")
    q, k, v = ex.inputs(batch=1, heads=1, q_len=128, kv_len=192)  # 3 K/V steps, 2 slots
    got = ex.flash_attention(q, k, v, interpret=True)
    np.testing.assert_allclose(got.astype(jnp.float32),
                               ex.reference(q, k, v).astype(jnp.float32), rtol=2e-2, atol=2e-2)
    import jax

    text = jax.jit(ex.flash_attention).trace(q, k, v).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("custom_call @mosaic_gpu_v2") == 1


def test_flash_attention_generated_code_matches_plain_jax_at_emulate():
    import jax

    import pallas as pl
    import pallas.plugins

    ex = _load("mosaic_gpu_flash_attention")
    q, k, v = ex.inputs(batch=1, heads=1, q_len=128, kv_len=192)
    f = ex.flash_attention.__wrapped__
    (eqn,) = [e for e in jax.make_jaxpr(f)(q, k, v).jaxpr.eqns
              if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    # The module Mosaic GPU compiles, executed: three warpgroups, TMA, mbarriers, wgmma.
    (got,) = pallas.plugins.get_backend("mosaic_gpu").emulate(req, q, k, v)
    np.testing.assert_allclose(np.asarray(got, np.float32),
                               np.asarray(ex.reference(q, k, v), np.float32),
                               rtol=2e-2, atol=2e-2)


def test_flash_attention_compiles_to_wgmma_for_sm90a_without_spills():
    compiler = _compiler()
    ex = _load("mosaic_gpu_flash_attention")
    q, k, v = ex.inputs(batch=1, heads=1, q_len=128, kv_len=128)
    (kern,) = compiler.compile(ex.flash_attention, q, k, v)
    mix = kern.instruction_mix()
    assert kern.uses_wgmma and mix["wgmma"] > 0
    assert kern.spill_stores == 0 and kern.registers <= 255
    assert mix.get("cp", 0) > 0 and mix.get("mbarrier", 0) > 0  # TMA, barriers
    assert mix.get("ex2", 0) > 0 and mix.get("shfl", 0) > 0  # approx exp2, row reductions
    # No SMEM beyond Q (per compute warpgroup), 2 K/V slots and fixed scratch: the
    # softmax statistics never leave registers.
    assert kern.smem_bytes < 2 * 64 * 64 * 2 + 2 * 2 * 64 * 64 * 2 + 8 * 1024
