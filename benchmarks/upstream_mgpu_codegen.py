"""Code generation for upstream's Mosaic GPU kernels (``*_mgpu.py``) unchanged, on our
packages and on upstream: registers, spill bytes (ptxas) and PTX instruction mix
(``wgmma``, TMA ``cp``, ``bar``, ``mbarrier``, ``ld``/``st``), compiled through the same
compile-only sm_90a pipeline as ``mosaic_gpu_compile.py`` (132-SM persistent grids).

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
]
KEYS = ("wgmma", "cp", "bar", "mbarrier", "ld", "st")


def worker(impl: str, name: str, shape: tuple) -> dict:
    import upstream_ops as U

    if impl == "ours":
        spec = importlib.util.spec_from_file_location("upstream_shim", U.SHIM)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    import mosaic_gpu_compile as C
    from pallas_mosaic_gpu import compiler

    fn, args, _, _ = U.KERNELS[name][0](shape)
    U._sms(132)
    secs, rep, ptx = C.compile_one(lambda *a: fn(*a, interpret=False), args, C._device(),
                                   compiler.find_toolchain())
    regs = re.search(r"Used (\d+) registers", rep)
    sp = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep)
    counts = C.mix(ptx)
    return dict(regs=int(regs.group(1)) if regs else None,
                spills=int(sp.group(1)) + int(sp.group(2)) if sp else None,
                mix={k: counts.get(k, 0) for k in KEYS}, secs=round(secs, 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", dest="keyword")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        impl, name, shape = a.worker
        print(json.dumps(worker(impl, name, tuple(json.loads(shape)))))
        return 0
    print("| kernel | shape | side | registers | spill bytes | " + " | ".join(KEYS)
          + " | trace+lower+compile s |")
    print("|---|---|---|---:|---:|" + "---:|" * len(KEYS) + "---:|")
    for name, shape in CASES:
        if a.keyword and a.keyword not in name:
            continue
        for impl in ("upstream", "ours"):
            print(f"{name} {shape} / {impl} ...", file=sys.stderr)
            p = subprocess.run([sys.executable, __file__, "--worker", impl, name,
                                json.dumps(shape)], capture_output=True, text=True)
            line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("{")),
                        None)
            if line is None:
                err = (p.stderr.strip().splitlines() or ["no output"])[-1][:120]
                print(f"| {name} | {shape} | {impl} | error: {err} |" + " |" * (len(KEYS) + 2))
                continue
            r = json.loads(line)
            print(f"| {name} | {shape} | {impl} | {r['regs']} | {r['spills']} | "
                  + " | ".join(str(r["mix"][k]) for k in KEYS) + f" | {r['secs']} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
