"""A warp-specialised Hopper flash attention forward: a memory warpgroup streams K/V blocks
into a ring of swizzled SMEM slots with TMA (``plgpu.emit_pipeline_warp_specialized``),
while two compute warpgroups, each with its own block of queries, run ``wgmma`` for
``Q @ K^T`` (K read transposed from SMEM) and ``P @ V`` (P straight from registers) and
keep the online-softmax statistics in the WGMMA register layout.

    python examples/mosaic_gpu_flash_attention.py

Runs the kernel in GPU interpret mode on CPU and compares it with plain JAX, lowers it to
Mosaic GPU's ``mosaic_gpu_v2`` custom call and, where ptxas and the CUDA plugin are
installed, compiles it for a compile-only sm_90a device and prints what ptxas reports.
"""

from __future__ import annotations

import functools
import math
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import pallas as pl  # noqa: E402
import pallas_mosaic_gpu as plgpu  # noqa: E402

try:
    from mosaic_gpu_matmul import report, swizzled
except ImportError:  # loaded by path (tests)
    import importlib.util
    from pathlib import Path

    _spec = importlib.util.spec_from_file_location(
        "mosaic_gpu_matmul", Path(__file__).with_name("mosaic_gpu_matmul.py"))
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    report, swizzled = _mod.report, _mod.swizzled

COMPUTE_WGS = 2  # warpgroups that each own a block of queries; one more issues the copies
LOG2E = math.log2(math.e)


@functools.partial(jax.jit, static_argnames=("block_q", "block_kv", "max_concurrent_steps",
                                             "interpret"))
def flash_attention(q, k, v, *, block_q=64, block_kv=64, max_concurrent_steps=2,
                    interpret=False):
    """``softmax(q @ k^T / sqrt(d)) @ v`` per batch and head; q, k, v are
    ``(batch, heads, seq, head_dim)`` float16/bfloat16, ``head_dim`` a multiple of 64."""
    batch, heads, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    if q_len % (COMPUTE_WGS * block_q) or kv_len % block_kv:
        raise ValueError(f"q_len={q_len} must be a multiple of {COMPUTE_WGS * block_q} and "
                         f"kv_len={kv_len} of block_kv={block_kv}")
    dtype = q.dtype
    transforms = swizzled(dtype)
    # Scores are kept pre-multiplied by log2(e), so exp becomes exp2.
    scale = LOG2E / math.sqrt(head_dim)

    def kernel(q_gmem, k_gmem, v_gmem, o_gmem, q_smems, q_barriers):
        b, h, qi = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("q")
        wg = lax.axis_index("wg")  # 0, 1: compute; 2: memory
        rows = pl.ds((qi * COMPUTE_WGS + wg) * block_q, block_q)
        q_smem = q_smems.at[wg]  # this compute warpgroup's query block (later its output)

        def step(_, k_smem, v_smem, carry):
            acc, m_i, l_i = carry

            def scores(s_acc):
                plgpu.wgmma(s_acc, q_smem, plgpu.transpose_ref(k_smem, (1, 0)))
                plgpu.wgmma_wait(0)
                return s_acc[...]

            s = pl.run_scoped(scores, plgpu.ACC((block_q, block_kv), jnp.float32)) * scale
            m_new = jnp.maximum(m_i, s.max(axis=1))
            alpha = jnp.exp2(m_i - m_new)
            p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
            l_i = l_i * alpha + p.sum(axis=1)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])

            def weighted_values(o_acc):
                plgpu.wgmma(o_acc, p.astype(dtype), v_smem)
                plgpu.wgmma_wait(0)  # V's slot is released after this step

            acc = pl.run_state(weighted_values)(plgpu.ACC.init(acc))
            return acc, m_new, l_i

        def compute(eval_pipeline):  # runs on the compute warpgroups only
            plgpu.copy_gmem_to_smem(q_gmem.at[b, h, rows], q_smem, q_barriers.at[wg])
            plgpu.barrier_wait(q_barriers.at[wg])
            acc = plgpu.layout_cast(jnp.zeros((block_q, head_dim), jnp.float32),
                                    plgpu.Layout.WGMMA)
            m_i = plgpu.layout_cast(jnp.full((block_q,), -jnp.inf, jnp.float32),
                                    plgpu.Layout.WGMMA.reduce(1))
            l_i = plgpu.layout_cast(jnp.zeros((block_q,), jnp.float32),
                                    plgpu.Layout.WGMMA.reduce(1))
            acc, m_i, l_i = eval_pipeline((acc, m_i, l_i))
            out = acc / lax.broadcast_in_dim(l_i, acc.shape, [0])
            q_smem[...] = out.astype(dtype)  # the query block is no longer needed
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(q_smem, o_gmem.at[b, h, rows])
            plgpu.wait_smem_to_gmem(0)

        pipeline = plgpu.emit_pipeline_warp_specialized(
            step, grid=(kv_len // block_kv,), memory_registers=40, wg_axis="wg",
            num_compute_wgs=COMPUTE_WGS, max_concurrent_steps=max_concurrent_steps,
            compute_context=compute,
            in_specs=[plgpu.BlockSpec((block_kv, head_dim), lambda j: (j, 0),
                                      transforms=transforms)] * 2)
        pipeline(k_gmem.at[b, h], v_gmem.at[b, h])

    return plgpu.kernel(
        kernel, out_type=jax.ShapeDtypeStruct(q.shape, dtype),
        grid=(batch, heads, q_len // (COMPUTE_WGS * block_q)), grid_names=("b", "h", "q"),
        num_threads=COMPUTE_WGS + 1, thread_name="wg",
        scratch_types=[plgpu.SMEM((COMPUTE_WGS, block_q, head_dim), dtype, transforms=transforms),
                       plgpu.Barrier(num_barriers=COMPUTE_WGS)],
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=plgpu.InterpretParams() if interpret else None,
    )(q, k, v)


def inputs(batch=1, heads=2, q_len=256, kv_len=256, head_dim=64, dtype=jnp.float16):
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    return tuple(jax.random.normal(key, (batch, heads, n, head_dim), jnp.float32).astype(dtype)
                 for key, n in ((kq, q_len), (kk, kv_len), (kv, kv_len)))


def reference(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
    p = jax.nn.softmax(s / math.sqrt(q.shape[-1]), axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v.astype(jnp.float32)).astype(q.dtype)


def main():
    q, k, v = inputs()
    got = flash_attention(q, k, v, interpret=True)
    want = reference(q, k, v)
    np.testing.assert_allclose(got.astype(jnp.float32), want.astype(jnp.float32),
                               rtol=2e-2, atol=2e-2)
    err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
    print(f"mosaic_gpu_flash_attention: interpret matches plain JAX (max abs err {err:.3g})")
    print(report("mosaic_gpu_flash_attention", flash_attention, q, k, v))


if __name__ == "__main__":
    main()
