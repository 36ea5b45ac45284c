"""Mosaic GPU code generation: pallas-mosaic-gpu's kernels against the same kernels
written with upstream's ``jax.experimental.pallas.mosaic_gpu``.

Both are compiled through the same compile-only pipeline (a compile-only CUDA device for
sm_90a or sm_100a, Mosaic GPU's passes, PTX and ptxas, with Mosaic GPU's dumps) in one process.
Per kernel: registers, spill bytes (ptxas), SMEM (the dynamic shared memory the module
declares), PTX instruction mix (wgmma, TMA ``cp``, ``bar``, ``mbarrier``, ``ld``/``st``)
and trace+lower+compile seconds of the first compile of each kernel in the process
(later calls of the same function are served from JAX's caches for both sides, so
``--repeat`` only re-checks that; SMEM is not reported yet: Mosaic GPU declares it as
dynamic shared memory, not in the PTX).

Kernels (f16, 256x512 @ 512x256, 128x128x64 blocks, 2 pipeline slots):

* ``matmul``: ``pallas_call`` over (M/bm, N/bn) with GMEM operands, ``emit_pipeline``
  over K of swizzled (8, 64)-tiled SMEM blocks, ``wgmma`` into a ``plgpu.ACC``,
  ``wgmma_wait(0)`` per step; the f16 tile stored through an SMEM output block.
* ``matmul_ws``: the same with ``plgpu.kernel`` over 2 warpgroups and
  ``emit_pipeline_warp_specialized`` (one memory warpgroup, one compute warpgroup).
* ``flash_attention``: ``examples/mosaic_gpu_flash_attention.py`` (q, k, v of
  (1, 2, 256, 64) f16, 64x64 blocks): ``plgpu.kernel`` of 3 warpgroups,
  ``emit_pipeline_warp_specialized`` streaming K/V (2 slots) to 2 compute warpgroups
  that carry the online softmax (WGMMA layout) and run ``wgmma`` for ``Q @ K^T`` and
  ``P @ V`` (P from registers, through ``pl.run_state(plgpu.ACC.init(...))``).

* ``matmul_tcgen05`` (``--target sm_100a``, Blackwell): ``matmul`` with
  ``tcgen05_mma`` into a ``plgpu.TMEM`` accumulator (completion on an
  ``orders_tensor_core`` barrier, awaited per step), read back with
  ``async_load_tmem``.

Run from the repository root::

    python benchmarks/mosaic_gpu_compile.py [--repeat 3] [--target sm_100a]

Progress goes to stderr, the Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import re
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

M, K, N, BM, BN, BK, SLOTS = 256, 512, 256, 128, 128, 64, 2
# flash attention: (batch, heads, seq, head_dim) f16 q/k/v, 64x64 blocks
ATTN, BQ, BKV = (1, 2, 256, 64), 64, 64


def kernels(pl, plgpu, backend_kw):
    """The two kernels written against ``pl``/``plgpu`` (ours or upstream's)."""
    tr = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def matmul(x, y):
        def kernel(x_gmem, y_gmem, o_smem):
            mi, ni = pl.program_id(0), pl.program_id(1)

            def with_acc(acc):
                def step(_, xs, ys):
                    plgpu.wgmma(acc, xs, ys)
                    plgpu.wgmma_wait(0)

                plgpu.emit_pipeline(
                    step, grid=(K // BK,), max_concurrent_steps=SLOTS,
                    in_specs=[plgpu.BlockSpec((BM, BK), lambda kk: (mi, kk), transforms=tr),
                              plgpu.BlockSpec((BK, BN), lambda kk: (kk, ni), transforms=tr)],
                )(x_gmem, y_gmem)
                o_smem[...] = acc[...].astype(o_smem.dtype)

            pl.run_scoped(with_acc, plgpu.ACC((BM, BN), jnp.float32))

        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((M, N), x.dtype), grid=(M // BM, N // BN),
            in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
            out_specs=pl.BlockSpec((BM, BN), lambda i, j: (i, j)), **backend_kw)(x, y)

    def matmul_ws(x, y):
        def kernel(x_gmem, y_gmem, o_gmem, o_smem):
            mi, ni = jax.lax.axis_index("m"), jax.lax.axis_index("n")

            def step(_, xs, ys, acc):
                plgpu.wgmma(acc, xs, ys)
                plgpu.wgmma_wait(0)
                return acc

            def compute(eval_pipeline):
                def with_acc(acc):
                    eval_pipeline(acc)
                    o_smem[...] = acc[...].astype(o_smem.dtype)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(mi * BM, BM),
                                                              pl.ds(ni * BN, BN)])
                    plgpu.wait_smem_to_gmem(0)

                pl.run_scoped(with_acc, plgpu.ACC((BM, BN), jnp.float32))

            plgpu.emit_pipeline_warp_specialized(
                step, grid=(K // BK,), memory_registers=40, wg_axis="wg", num_compute_wgs=1,
                max_concurrent_steps=SLOTS, compute_context=compute,
                in_specs=[plgpu.BlockSpec((BM, BK), lambda kk: (mi, kk), transforms=tr),
                          plgpu.BlockSpec((BK, BN), lambda kk: (kk, ni), transforms=tr)],
            )(x_gmem, y_gmem)

        return plgpu.kernel(kernel, out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),  # both
                            grid=(M // BM, N // BN), grid_names=("m", "n"), num_threads=2,
                            thread_name="wg",
                            scratch_shapes=[plgpu.SMEM((BM, BN), x.dtype)])(x, y)

    def matmul_tcgen05(x, y):  # Blackwell (sm_100a): tcgen05_mma into TMEM
        def kernel(x_gmem, y_gmem, o_smem):
            mi, ni = pl.program_id(0), pl.program_id(1)

            def with_tmem(acc, done):
                def step(idx, xs, ys):
                    plgpu.tcgen05_mma(acc, xs, ys, done, accumulate=idx[0] > 0)
                    plgpu.barrier_wait(done)

                plgpu.emit_pipeline(
                    step, grid=(K // BK,), max_concurrent_steps=SLOTS,
                    in_specs=[plgpu.BlockSpec((BM, BK), lambda kk: (mi, kk), transforms=tr),
                              plgpu.BlockSpec((BK, BN), lambda kk: (kk, ni), transforms=tr)],
                )(x_gmem, y_gmem)
                o_smem[...] = plgpu.async_load_tmem(acc).astype(o_smem.dtype)
                plgpu.wait_load_tmem()

            pl.run_scoped(with_tmem, plgpu.TMEM((BM, BN), jnp.float32),
                          plgpu.Barrier(orders_tensor_core=True))

        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((M, N), x.dtype), grid=(M // BM, N // BN),
            in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
            out_specs=pl.BlockSpec((BM, BN), lambda i, j: (i, j)), **backend_kw)(x, y)


    def flash_attention(q, k, v):
        batch, heads, q_len, d = q.shape
        kv_len = k.shape[2]
        scale = math.log2(math.e) / math.sqrt(d)

        def kernel(q_gmem, k_gmem, v_gmem, o_gmem, q_smems, q_bars):
            b, h, qi = jax.lax.axis_index("b"), jax.lax.axis_index("h"), \
                jax.lax.axis_index("q")
            wg = jax.lax.axis_index("wg")
            rows = pl.ds((qi * 2 + wg) * BQ, BQ)
            q_smem = q_smems.at[wg]

            def step(_, k_smem, v_smem, carry):
                acc, m_i, l_i = carry

                def scores(s_acc):
                    plgpu.wgmma(s_acc, q_smem, plgpu.transpose_ref(k_smem, (1, 0)))
                    plgpu.wgmma_wait(0)
                    return s_acc[...]

                s = pl.run_scoped(scores, plgpu.ACC((BQ, BKV), jnp.float32)) * scale
                m_new = jnp.maximum(m_i, s.max(axis=1))
                alpha = jnp.exp2(m_i - m_new)
                p = jnp.exp2(s - jax.lax.broadcast_in_dim(m_new, s.shape, [0]))
                l_i = l_i * alpha + p.sum(axis=1)
                acc = acc * jax.lax.broadcast_in_dim(alpha, acc.shape, [0])

                def pv(o_acc):
                    plgpu.wgmma(o_acc, p.astype(q.dtype), v_smem)
                    plgpu.wgmma_wait(0)

                return pl.run_state(pv)(plgpu.ACC.init(acc)), m_new, l_i

            def compute(eval_pipeline):
                plgpu.copy_gmem_to_smem(q_gmem.at[b, h, rows], q_smem, q_bars.at[wg])
                plgpu.barrier_wait(q_bars.at[wg])
                rl = plgpu.Layout.WGMMA.reduce(1)
                acc, m_i, l_i = eval_pipeline((
                    plgpu.layout_cast(jnp.zeros((BQ, d), jnp.float32), plgpu.Layout.WGMMA),
                    plgpu.layout_cast(jnp.full((BQ,), -jnp.inf, jnp.float32), rl),
                    plgpu.layout_cast(jnp.zeros((BQ,), jnp.float32), rl)))
                acc = acc / jax.lax.broadcast_in_dim(l_i, acc.shape, [0])
                q_smem[...] = acc.astype(q.dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(q_smem, o_gmem.at[b, h, rows])
                plgpu.wait_smem_to_gmem(0)

            plgpu.emit_pipeline_warp_specialized(
                step, grid=(kv_len // BKV,), memory_registers=40, wg_axis="wg",
                num_compute_wgs=2, max_concurrent_steps=SLOTS, compute_context=compute,
                in_specs=[plgpu.BlockSpec((BKV, d), lambda j: (j, 0), transforms=tr)] * 2,
            )(k_gmem.at[b, h], v_gmem.at[b, h])

        return plgpu.kernel(
            kernel, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
            grid=(batch, heads, q_len // (2 * BQ)), grid_names=("b", "h", "q"),
            num_threads=3, thread_name="wg",
            scratch_shapes=[plgpu.SMEM((2, BQ, d), q.dtype, transforms=tr),
                            plgpu.Barrier(num_barriers=2)],
            compiler_params=plgpu.CompilerParams(approx_math=True))(q, k, v)

    return {"matmul": matmul, "matmul_ws": matmul_ws, "matmul_tcgen05": matmul_tcgen05,
            "flash_attention": flash_attention}


# Mosaic GPU fixes the target per process: one run compiles one target's kernels.
TARGET_KERNELS = {"sm_90a": ("matmul", "matmul_ws", "flash_attention"),
                  "sm_100a": ("matmul_tcgen05",)}


def _device(target="sm_90a", n=1):
    """A compile-only CUDA device of ``target`` (``n`` > 1: a list of that many)."""
    from jax.experimental import topologies

    from pallas_mosaic_gpu import compiler

    topo = topologies.get_topology_desc(platform="cuda",
                                        target_config=compiler.target_config(target),
                                        topology=f"1x1x{n}")
    return topo.devices[0] if n == 1 else list(topo.devices)


def _sharded(args, devs):
    """Inputs sharded over a CPU mesh, re-sharded alike over compile-only ``devs``."""
    mesh = jax.sharding.Mesh(np.array(devs), ("x",))
    return mesh, [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.sharding.NamedSharding(
        mesh, a.sharding.spec if isinstance(a.sharding, jax.sharding.NamedSharding)
        else jax.sharding.PartitionSpec())) for a in args]


def compile_one(f, args, dev, root):
    """(seconds, ptxas report, ptx) of compiling ``f`` for ``dev`` (a list of devices:
    the inputs keep their ``PartitionSpec`` over a mesh ``("x",)`` of them, as a
    kernel in ``shard_map`` over the inputs' mesh needs)."""
    if isinstance(dev, list):
        mesh, sds = _sharded(args, dev)
        ctx, kw = jax.set_mesh(mesh), {}
    else:
        mesh = jax.sharding.Mesh(np.array([dev]), ("d",))
        shd = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        sds = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=shd) for a in args]
        ctx, kw = jax.default_device(dev), dict(in_shardings=shd, out_shardings=shd)
    with tempfile.TemporaryDirectory() as dump:
        env = {"MOSAIC_GPU_CUDA_ROOT": root, "MOSAIC_GPU_DUMP_PTX": "1",
               "MOSAIC_GPU_DUMP_PTXAS": "1", "MOSAIC_GPU_DUMP_TO": dump,
               "PATH": os.path.join(root, "bin") + os.pathsep + os.environ["PATH"]}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            t0 = time.perf_counter()
            with ctx:
                lowered = jax.jit(f, **kw).trace(*sds).lower(lowering_platforms=("cuda",))
                lowered.compile()
            secs = time.perf_counter() - t0
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        rep = "".join(open(p).read() for p in sorted(glob.glob(f"{dump}/*.ptxas")))
        ptx = "".join(open(p).read() for p in sorted(glob.glob(f"{dump}/*.ptx")))
    return secs, rep, ptx


def mix(ptx: str) -> dict:
    counts = {}
    for m in re.finditer(r"^\s+(?:@!?%p\w+\s+)?([a-z][a-z0-9_]*)[.\s;]", ptx, re.M):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--target", choices=sorted(TARGET_KERNELS), default="sm_90a")
    a = ap.parse_args()
    os.environ["PALLAS_MOSAIC_GPU_TARGET"] = a.target
    from jax.experimental import pallas as upl
    from jax.experimental.pallas import mosaic_gpu as uplgpu

    import pallas as pl
    import pallas_mosaic_gpu as plgpu
    from pallas_mosaic_gpu import compiler

    root = compiler.find_toolchain()
    dev = _device(a.target)
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.float16)
    y = jax.random.normal(ky, (K, N), jnp.float32).astype(jnp.float16)
    kq, kk, kv = jax.random.split(jax.random.key(1), 3)
    qkv = tuple(jax.random.normal(key, ATTN, jnp.float32).astype(jnp.float16)
                for key in (kq, kk, kv))
    args = {"matmul": (x, y), "matmul_ws": (x, y), "matmul_tcgen05": (x, y),
            "flash_attention": qkv}
    sides = {"upstream": kernels(upl, uplgpu, {}),
             "ours": kernels(pl, plgpu, {"backend": "mosaic_gpu"})}
    rows = []
    for name in TARGET_KERNELS[a.target]:
        res = {}
        for side, ks in sides.items():
            print(f"{name} / {side} ...", file=sys.stderr)
            times, rep, ptx = [], "", ""
            for _ in range(a.repeat):
                s, r, p = compile_one(ks[name], args[name], dev, root)
                times.append(s)
                rep, ptx = (r or rep), (p or ptx)
            regs = re.search(r"Used (\d+) registers", rep)
            sp = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep)
            res[side] = dict(regs=int(regs.group(1)) if regs else -1,
                             spills=int(sp.group(1)) + int(sp.group(2)) if sp else 0,
                             mix=mix(ptx), secs=statistics.median(times),
                             first=times[0])
        rows.append((name, res))
    keys = ("wgmma" if a.target == "sm_90a" else "tcgen05", "cp", "bar", "mbarrier", "ld",
            "st", "fma", "ex2", "shfl")
    print("| kernel | side | registers | spill bytes | " + " | ".join(keys)
          + " | trace+lower+compile s |")
    print("|---|---|---|---|" + "---|" * len(keys) + "---|")
    for name, res in rows:
        for side in ("upstream", "ours"):
            r = res[side]
            print(f"| {name} | {side} | {r['regs']} | {r['spills']} | "
                  + " | ".join(str(r["mix"].get(k, 0)) for k in keys)
                  + f" | {r['first']:.2f} |")
        u, o = res["upstream"], res["ours"]
        print(f"| {name} | ours/upstream | {o['regs'] / max(u['regs'], 1):.2f} | | "
              + " | ".join(f"{o['mix'].get(k, 0) / max(u['mix'].get(k, 0), 1):.2f}"
                           for k in keys)
              + f" | {o['first'] / u['first']:.2f} |")


if __name__ == "__main__":
    main()
