"""Mosaic GPU code generation: pallas-mosaic-gpu's kernels against the same kernels
written with upstream's ``jax.experimental.pallas.mosaic_gpu``.

Both are compiled through the same compile-only pipeline (a compile-only CUDA device for
sm_90a or sm_100a, Mosaic GPU's passes, PTX and ptxas, with Mosaic GPU's dumps), each
kernel and side in a fresh process (after a plain XLA warm-up compile), ``--repeat``
times with the sides alternating which goes first. Per kernel: registers, spill bytes
(ptxas), SMEM bytes (the dynamic shared memory of the launch, read from the Mosaic GPU
module of the custom call, the same way for both sides), PTX instruction mix (wgmma,
TMA ``cp``, ``bar``, ``mbarrier``, ``ld``/``st``, ``fma``, ``ex2``, ``shfl``) and the
median trace+lower+compile seconds; a second table gives the median CPU seconds of each
phase (``trace``, ``lower``, ``compile``: XLA with Mosaic GPU's passes and PTX, and
``tools``: the child processes it runs, ptxas, and nvdisasm for the dumps) and the
operation count of the Mosaic GPU module.

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
import json
import math
import os
import re
import resource
import statistics
import subprocess
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


def _children_cpu() -> float:
    """CPU seconds of this process's finished child processes (ptxas, nvdisasm)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def compile_one(f, args, dev, root):
    """(seconds, ptxas report, ptx, SMEM bytes, phases) of compiling ``f`` for ``dev`` (a
    list of devices: the inputs keep their ``PartitionSpec`` over a mesh ``("x",)`` of
    them, as a kernel in ``shard_map`` over the inputs' mesh needs). ``phases``: CPU
    seconds of ``trace``, ``lower`` and ``compile`` (this process: XLA, Mosaic GPU's
    passes, PTX), ``tools`` (child processes during the compile: ptxas for Mosaic GPU's
    kernel and XLA's own, nvdisasm for the dumps), and ``ops``, the
    operation count of the Mosaic GPU module(s) the custom call carries."""
    if isinstance(dev, list):
        mesh, sds = _sharded(args, dev)
        ctx, kw = jax.set_mesh(mesh), {}
    else:
        mesh = jax.sharding.Mesh(np.array([dev]), ("d",))
        shd = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        sds = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=shd) for a in args]
        ctx, kw = jax.default_device(dev), dict(in_shardings=shd, out_shardings=shd)
    phases = {}
    with tempfile.TemporaryDirectory() as dump:
        env = {"MOSAIC_GPU_CUDA_ROOT": root, "MOSAIC_GPU_DUMP_PTX": "1",
               "MOSAIC_GPU_DUMP_PTXAS": "1", "MOSAIC_GPU_DUMP_TO": dump,
               "PATH": os.path.join(root, "bin") + os.pathsep + os.environ["PATH"]}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            t0 = time.perf_counter()
            with ctx:
                cpu = time.process_time()
                traced = jax.jit(f, **kw).trace(*sds)
                phases["trace"], cpu = time.process_time() - cpu, time.process_time()
                lowered = traced.lower(lowering_platforms=("cuda",))
                phases["lower"], cpu = time.process_time() - cpu, time.process_time()
                children = _children_cpu()
                lowered.compile()
                phases["compile"] = time.process_time() - cpu
                phases["tools"] = _children_cpu() - children
            secs = time.perf_counter() - t0
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        rep = "".join(open(p).read() for p in sorted(glob.glob(f"{dump}/*.ptxas")))
        ptx = "".join(open(p).read() for p in sorted(glob.glob(f"{dump}/*.ptx")))
    smem, phases["ops"] = module_figures(lowered)
    return secs, rep, ptx, smem, phases


def module_figures(lowered) -> tuple:
    """``(SMEM bytes, ops)`` of the Mosaic GPU modules that the ``mosaic_gpu_v2`` custom
    calls carry (read the same way for both sides). SMEM bytes: the dynamic shared memory
    the kernel is launched with, the ``dynamicSharedMemorySize`` operand of the module's
    ``gpu.launch`` (the largest over the calls of a jitted function; None if there is no
    such call). ops: the operations in those modules, summed (what Mosaic GPU's passes,
    and after them ptxas, work through)."""
    from jax.experimental.mosaic import gpu as mgpu
    from jax.interpreters import mlir as jmlir
    from jaxlib.mlir import ir

    found = []

    def walk(op, visit, into_kernel=False):
        for region in op.regions:
            for block in region:
                for inner in block:
                    visit(inner.operation)
                    if into_kernel or not inner.operation.name.endswith("gpu.launch"):
                        walk(inner.operation, visit, into_kernel)

    def custom_call(op):
        if op.name == "stablehlo.custom_call" and \
                ir.StringAttr(op.attributes["call_target_name"]).value == "mosaic_gpu_v2":
            cfg = ir.DictAttr(op.attributes["mhlo.backend_config"])
            found.append(ir.StringAttr(cfg["module"]).value_bytes)

    walk(lowered.compiler_ir("stablehlo").operation, custom_call)
    sizes, ops = [], [0]
    with jmlir.make_ir_context() as ctx:
        mgpu.dialect.register_dialect(ctx)  # its types (barriers) are Mosaic GPU's
        ctx.allow_unregistered_dialects = True  # its ops are in their serialized dialect

        def launch(op):
            if op.name.split(".", 1)[-1] != "gpu.launch":
                return
            segments = ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"])
            if segments[len(segments) - 1]:  # the last operand: dynamic SMEM bytes
                const = op.operands[len(op.operands) - 1].owner
                sizes.append(ir.IntegerAttr(const.attributes["value"]).value)

        def count(_):
            ops[0] += 1

        for data in found:
            module = ir.Module.parse(data)
            walk(module.operation, launch)
            walk(module.operation, count, into_kernel=True)
    return (max(sizes) if sizes else None), (ops[0] if found else None)


def mix(ptx: str) -> dict:
    counts = {}
    for m in re.finditer(r"^\s+(?:@!?%p\w+\s+)?([a-z][a-z0-9_]*)[.\s;]", ptx, re.M):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def _args(name):
    kx, ky = jax.random.split(jax.random.key(0))
    if name == "flash_attention":
        return tuple(jax.random.normal(k, ATTN, jnp.float32).astype(jnp.float16)
                     for k in jax.random.split(jax.random.key(1), 3))
    return (jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.float16),
            jax.random.normal(ky, (K, N), jnp.float32).astype(jnp.float16))


def warm_up(dev) -> None:
    """Compiles a plain XLA function for ``dev`` first, so the timed compile does not
    include the one-time start of the compiler (the same for both sides)."""
    mesh = jax.sharding.Mesh(np.array([dev]), ("d",))
    shd = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    sds = jax.ShapeDtypeStruct((128,), jnp.float32, sharding=shd)
    with jax.default_device(dev):
        jax.jit(jnp.sin, in_shardings=shd, out_shardings=shd).trace(sds).lower(
            lowering_platforms=("cuda",)).compile()


def worker(side: str, name: str, target: str) -> dict:
    """One kernel of one side, compiled once in this (fresh) process."""
    os.environ["PALLAS_MOSAIC_GPU_TARGET"] = target
    if side == "upstream":
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import mosaic_gpu as plgpu
        kw = {}
    else:
        import pallas as pl
        import pallas_mosaic_gpu as plgpu
        kw = {"backend": "mosaic_gpu"}
    from pallas_mosaic_gpu import compiler

    dev = _device(target)
    warm_up(dev)
    secs, rep, ptx, smem, phases = compile_one(kernels(pl, plgpu, kw)[name], _args(name),
                                               dev, compiler.find_toolchain())
    return dict(ptxas_figures(rep), smem=smem, mix=mix(ptx), secs=secs, phases=phases)


def ptxas_figures(rep: str) -> dict:
    """Registers and spill bytes (stores + loads) from ptxas's report."""
    regs = re.search(r"Used (\d+) registers", rep)
    sp = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep)
    return dict(regs=int(regs.group(1)) if regs else None,
                spills=int(sp.group(1)) + int(sp.group(2)) if sp else None)


def run_workers(script: str, jobs: list, repeat: int, env_of=lambda job: None) -> dict:
    """``{job: [result per run]}``: each job (a tuple of worker arguments, its first one
    the side) run ``repeat`` times, each in a fresh process (environment ``env_of(job)``,
    None: this one's); the sides of a kernel alternate which goes first from one repeat
    to the next."""
    out = {job: [] for job in jobs}
    for r in range(repeat):
        for job in (jobs if r % 2 == 0 else jobs[::-1]):
            print(f"{' / '.join(map(str, job))} (run {r + 1}/{repeat}) ...", file=sys.stderr)
            p = subprocess.run([sys.executable, script, "--worker", *map(str, job)],
                               capture_output=True, text=True, env=env_of(job))
            line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("{")),
                        None)
            if line is None:
                err = (p.stderr.strip().splitlines() or ["no output"])[-1][:160]
                out[job].append({"error": err})
            else:
                out[job].append(json.loads(line))
    return out


def summary(runs: list) -> dict:
    """The figures of a job's runs (code generation is deterministic: the last run's),
    with the median seconds, or its error."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    phases = {k: statistics.median(r["phases"][k] for r in ok) for k in ok[-1]["phases"]
              if ok[-1]["phases"][k] is not None}
    return dict(ok[-1], secs=statistics.median(r["secs"] for r in ok), n=len(ok),
                phases=phases)


PHASES = ("trace", "lower", "compile", "tools")


def print_phases(rows: list) -> None:
    """The CPU seconds per phase (medians; ``rows``: ``(kernel label, upstream's
    summary, ours)``), both sides and ours/upstream, and the Mosaic GPU module's ops.
    CPU time, unlike wall time, barely moves with the other processes on the machine."""
    print("\n| kernel | side | trace | lower | trace+lower | compile | ptxas+nvdisasm | total CPU s "
          "| Mosaic GPU ops |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, u, o in rows:
        if "error" in u or "error" in o:
            continue
        figs = []
        for r in (u, o):
            ph = r["phases"]
            f = [ph[k] for k in PHASES]
            figs.append(f[:2] + [f[0] + f[1]] + f[2:] + [sum(f), ph.get("ops")])
        for side, f in zip(("upstream", "ours"), figs):
            print(f"| {label} | {side} | " + " | ".join(f"{x:.2f}" for x in f[:-1])
                  + f" | {f[-1]:.0f} |")
        print(f"| {label} | ours/upstream | "
              + " | ".join(_ratio(b, a) for a, b in zip(*figs)) + " |")


def _ratio(o, u) -> str:
    return f"{o / u:.2f}" if isinstance(o, (int, float)) and u else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3,
                    help="fresh processes per kernel and side (the median is reported)")
    ap.add_argument("--target", choices=sorted(TARGET_KERNELS), default="sm_90a")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(*a.worker)))
        return
    jobs = [(side, name, a.target) for name in TARGET_KERNELS[a.target]
            for side in ("upstream", "ours")]
    res = {job: summary(runs) for job, runs in
           run_workers(os.path.abspath(__file__), jobs, a.repeat).items()}
    keys = ("wgmma" if a.target == "sm_90a" else "tcgen05", "cp", "bar", "mbarrier", "ld",
            "st", "fma", "ex2", "shfl")
    print("| kernel | side | registers | spill bytes | SMEM bytes | " + " | ".join(keys)
          + " | trace+lower+compile s (median) |")
    print("|---|---|---:|---:|---:|" + "---:|" * len(keys) + "---:|")
    for name in TARGET_KERNELS[a.target]:
        u, o = res[("upstream", name, a.target)], res[("ours", name, a.target)]
        for side, r in (("upstream", u), ("ours", o)):
            if "error" in r:
                print(f"| {name} | {side} | error: {r['error']} |")
                continue
            print(f"| {name} | {side} | {r['regs']} | {r['spills']} | {r['smem']} | "
                  + " | ".join(str(r["mix"].get(k, 0)) for k in keys)
                  + f" | {r['secs']:.2f} |")
        if "error" in u or "error" in o:
            continue
        print(f"| {name} | ours/upstream | {_ratio(o['regs'], u['regs'])} | | "
              f"{_ratio(o['smem'], u['smem'])} | "
              + " | ".join(_ratio(o["mix"].get(k, 0), u["mix"].get(k, 0)) for k in keys)
              + f" | {o['secs'] / u['secs']:.2f} |")
    print_phases([(name, res[("upstream", name, a.target)], res[("ours", name, a.target)])
                  for name in TARGET_KERNELS[a.target]])


if __name__ == "__main__":
    main()
