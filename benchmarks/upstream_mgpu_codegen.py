"""Code generation for upstream's Mosaic GPU kernels (``*_mgpu.py``) unchanged, on our
packages and on upstream: registers, spill bytes (ptxas), SMEM bytes (the launch's dynamic
shared memory) and PTX instruction mix (``wgmma``, TMA ``cp``, ``bar``, ``mbarrier``,
``ld``/``st``), and trace+lower+compile seconds, compiled through the same
compile-only sm_90a pipeline as ``mosaic_gpu_compile.py`` (132-SM persistent grids); the
Blackwell kernels (``blackwell_*``, CTA pairs included) for sm_100a (148 SMs) in a table of
their own (``tcgen05`` instead of ``wgmma``, and ``cta_group::2``: the 2-CTA MMAs,
commits, TMEM allocation and partitioned TMA loads of CTA pairs); the multi-device
kernels (in ``shard_map`` over 2 devices, compiled over 2 compile-only H100s) in a third,
with ``multimem`` (multicast loads, stores, reductions) and ``red``/``atom`` (semaphores).

Each kernel and side runs in its own fresh process (ours loads upstream's modules
through the shim of ``upstream_ops.py``), ``--repeat`` times with the sides alternating
which goes first; seconds are the median. A last table gives the median CPU seconds per
phase and the Mosaic GPU module's operation count (see ``mosaic_gpu_compile.py``). Run from the repository root::

    python benchmarks/upstream_mgpu_codegen.py [-k ragged] [--repeat 3]

Progress goes to stderr, the Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CASES = [  # (kernel name in upstream_ops.KERNELS, shape)
    ("gpu/hopper_matmul_mgpu", (256, 256, 256)),
    ("gpu/hopper_mixed_type_matmul_mgpu", (256, 256, 256)),
    ("gpu/ragged_dot_mgpu", (256, 128, 128, 2)),
    ("gpu/transposed_ragged_dot_mgpu", (256, 128, 128, 2)),
    ("gpu/blackwell_matmul_mgpu", (256, 256, 256)),
    ("gpu/blackwell_matmul_mgpu collective", (512, 256, 512)),
    ("gpu/blackwell_ragged_dot_mgpu", (512, 128, 256, 3)),
    # Multi-device kernels (in shard_map over 2 devices; compiled over 2 compile-only H100s)
    ("gpu/all_gather_mgpu", (2048, 64)),
    ("gpu/reduce_scatter_mgpu", (2048, 64)),
    ("gpu/collective_matmul_mgpu", (128, 128, 256)),
]
KEYS = ("wgmma", "cp", "bar", "mbarrier", "ld", "st")
KEYS_SM100 = ("tcgen05", "cta_group::2", "cp", "bar", "mbarrier", "ld", "st")
# Multi-device kernels: multicast (multimem) and atomics (red/atom: semaphores) too.
KEYS_DEVICES = ("multimem", "red", "atom", "wgmma", "cp", "bar", "ld", "st")
DEVICE_KERNELS = ("all_gather_mgpu", "reduce_scatter_mgpu", "collective_matmul_mgpu")


def _target(name: str) -> str:
    return "sm_100a" if "blackwell" in name else "sm_90a"


def _keys(name: str) -> tuple:
    if any(k in name for k in DEVICE_KERNELS):
        return KEYS_DEVICES
    return KEYS_SM100 if _target(name) == "sm_100a" else KEYS


def worker(impl: str, name: str, shape: tuple) -> dict:
    import upstream_ops as U

    if impl == "ours":
        spec = importlib.util.spec_from_file_location("upstream_shim", U.SHIM)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    import mosaic_gpu_compile as C
    from pallas_mosaic_gpu import compiler

    target = _target(name)
    os.environ["PALLAS_MOSAIC_GPU_TARGET"] = target
    fn, args, _, _ = U.KERNELS[name][0](shape)
    U._sms(132 if target == "sm_90a" else 148)
    n = U._mesh_size(args)
    dev = C._device(target, n)
    C.warm_up(dev[0] if isinstance(dev, list) else dev)
    secs, rep, ptx, smem, phases = C.compile_one(lambda *a: fn(*a, interpret=False), args,
                                                 dev, compiler.find_toolchain())
    counts = C.mix(ptx)
    counts["cta_group::2"] = ptx.count("cta_group::2")
    return dict(C.ptxas_figures(rep), smem=smem,
                mix={k: counts.get(k, 0) for k in _keys(name)}, secs=secs,
                phases=phases)


def _env(name: str) -> dict:
    """The worker's environment: a mesh of simulated CPU devices for multi-device
    kernels (as ``upstream_ops.py`` runs them)."""
    import upstream_ops as U

    env = dict(os.environ)
    count = next((n for frag, n in U.DEVICE_COUNTS.items() if frag in name), None)
    if count:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            f" --xla_force_host_platform_device_count={count}").strip()
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", dest="keyword")
    ap.add_argument("--repeat", type=int, default=3,
                    help="fresh processes per kernel and side (the median is reported)")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        impl, name, shape = a.worker
        print(json.dumps(worker(impl, name, tuple(json.loads(shape)))))
        return 0
    import mosaic_gpu_compile as C

    cases = [(n, s) for n, s in CASES if not a.keyword or a.keyword in n]
    jobs = [(impl, name, json.dumps(shape)) for name, shape in cases
            for impl in ("upstream", "ours")]
    res = {job: C.summary(runs) for job, runs in
           C.run_workers(os.path.abspath(__file__), jobs, a.repeat,
                         env_of=lambda job: _env(job[1])).items()}
    header = None
    for name, shape in cases:
        keys = _keys(name)
        if keys != header:  # one table per target
            header = keys
            print("\n| kernel | shape | side | registers | spill bytes | SMEM bytes | "
                  + " | ".join(keys) + " | trace+lower+compile s (median) |")
            print("|---|---|---|---:|---:|---:|" + "---:|" * len(keys) + "---:|")
        for impl in ("upstream", "ours"):
            r = res[(impl, name, json.dumps(shape))]
            if "error" in r:
                print(f"| {name} | {shape} | {impl} | error: {r['error']} |")
                continue
            print(f"| {name} | {shape} | {impl} | {r['regs']} | {r['spills']} | "
                  f"{r['smem']} | " + " | ".join(str(r["mix"][k]) for k in keys)
                  + f" | {r['secs']:.2f} |", flush=True)
    C.print_phases([(f"{name} {shape}", res[("upstream", name, json.dumps(shape))],
                     res[("ours", name, json.dumps(shape))]) for name, shape in cases])
    return 0


if __name__ == "__main__":
    sys.exit(main())
