"""Code generation for upstream's Mosaic GPU kernels (``*_mgpu.py``) unchanged, on our
packages and on upstream: registers, spill bytes (ptxas) and PTX instruction mix
(``wgmma``, TMA ``cp``, ``bar``, ``mbarrier``, ``ld``/``st``), compiled through the same
compile-only sm_90a pipeline as ``mosaic_gpu_compile.py`` (132-SM persistent grids); the
Blackwell kernels (``blackwell_*``, CTA pairs included) for sm_100a (148 SMs) in a table of
their own (``tcgen05`` instead of ``wgmma``, and ``cta_group::2``: the 2-CTA MMAs,
commits, TMEM allocation and partitioned TMA loads of CTA pairs); the multi-device
kernels (in ``shard_map`` over 2 devices, compiled over 2 compile-only H100s) in a third,
with ``multimem`` (multicast loads, stores, reductions) and ``red``/``atom`` (semaphores).

Each kernel and side runs in its own process (ours loads upstream's modules through
the shim of ``upstream_ops.py``). Run from the repository root::

    python benchmarks/upstream_mgpu_codegen.py [-k ragged]

Progress goes to stderr, the Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
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
    secs, rep, ptx = C.compile_one(lambda *a: fn(*a, interpret=False), args,
                                   C._device(target, n), compiler.find_toolchain())
    regs = re.search(r"Used (\d+) registers", rep)
    sp = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep)
    counts = C.mix(ptx)
    counts["cta_group::2"] = ptx.count("cta_group::2")
    return dict(regs=int(regs.group(1)) if regs else None,
                spills=int(sp.group(1)) + int(sp.group(2)) if sp else None,
                mix={k: counts.get(k, 0) for k in _keys(name)}, secs=round(secs, 1))


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
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        impl, name, shape = a.worker
        print(json.dumps(worker(impl, name, tuple(json.loads(shape)))))
        return 0
    header = None
    for name, shape in CASES:
        if a.keyword and a.keyword not in name:
            continue
        keys = _keys(name)
        if keys != header:  # one table per target
            header = keys
            print("\n| kernel | shape | side | registers | spill bytes | " + " | ".join(keys)
                  + " | trace+lower+compile s |")
            print("|---|---|---|---:|---:|" + "---:|" * len(keys) + "---:|")
        for impl in ("upstream", "ours"):
            print(f"{name} {shape} / {impl} ...", file=sys.stderr)
            p = subprocess.run([sys.executable, __file__, "--worker", impl, name,
                                json.dumps(shape)], capture_output=True, text=True,
                               env=_env(name))
            line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("{")),
                        None)
            if line is None:
                err = (p.stderr.strip().splitlines() or ["no output"])[-1][:120]
                print(f"| {name} | {shape} | {impl} | error: {err} |" + " |" * (len(keys) + 2))
                continue
            r = json.loads(line)
            print(f"| {name} | {shape} | {impl} | {r['regs']} | {r['spills']} | "
                  + " | ".join(str(r["mix"][k]) for k in keys) + f" | {r['secs']} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
