"""Upstream's single-device Mosaic GPU kernels (``*_mgpu.py``) unchanged, on our packages,
at the **emulate** level: the Mosaic GPU module our lowering generates is executed on
CPU (``pallas_mosaic_gpu._src.executor``, the conformance level ``emulate``) and compared
with the kernel's reference. Each kernel runs in its own process, through the shim of
``upstream_ops.py`` (``jax.experimental.pallas`` is this project's), on a small
persistent grid (``--sms``, the SM count the kernels read); the table gives the max
absolute error against the reference, the reference's largest magnitude, and the
seconds the execution took (or the first line of the error: ``EmulationUnsupported``
names what the executor does not run). Run from the repository root::

    python benchmarks/upstream_mgpu_emulate.py [-k blackwell] [--sms 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "conformance", "src"))

CASES = [  # (kernel name in upstream_ops.KERNELS, shape)
    ("gpu/hopper_matmul_mgpu", (256, 256, 256)),
    ("gpu/hopper_mixed_type_matmul_mgpu", (256, 256, 256)),
    ("gpu/ragged_dot_mgpu", (256, 128, 128, 2)),
    ("gpu/transposed_ragged_dot_mgpu", (256, 128, 128, 2)),
    ("gpu/attention_mgpu", (1, 128, 2, 64)),
    ("gpu/blackwell_matmul_mgpu", (256, 256, 256)),
    ("gpu/blackwell_matmul_mgpu collective", (512, 256, 512)),
    ("gpu/blackwell_ragged_dot_mgpu", (512, 128, 256, 3)),
]


def _evaluate(jaxpr, consts, args, emulate):
    """Evaluates ``jaxpr`` forward, each ``pallas_call`` through ``emulate``; calls
    (``jit``, ``custom_vjp_call``/``custom_jvp_call``: their primal jaxpr) holding one
    are entered."""
    import jax.extend as jex

    import pallas as pl
    from pallas_conformance.levels import pallas_call_eqns_in_params

    env = dict(zip(jaxpr.constvars, consts)) | dict(zip(jaxpr.invars, args))
    read = lambda v: v.val if isinstance(v, jex.core.Literal) else env[v]  # noqa: E731
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
        if eqn.primitive is pl.pallas_call_p:
            outs = emulate(eqn, ins)
        elif sub is not None and pallas_call_eqns_in_params(eqn):
            closed = sub if hasattr(sub, "consts") else None
            outs = _evaluate(closed.jaxpr if closed else sub, closed.consts if closed else [],
                             ins, emulate)
        else:
            outs = eqn.primitive.bind(*ins, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def worker(name: str, shape: tuple, sms: int) -> dict:
    import importlib.util

    import upstream_ops as U

    spec = importlib.util.spec_from_file_location("upstream_shim", U.SHIM)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    import jax
    import numpy as np

    import pallas.plugins
    from pallas_conformance.levels import _request

    fn, args, ref, platform = U.KERNELS[name][0](shape)
    os.environ["PALLAS_MOSAIC_GPU_TARGET"] = platform.partition(":")[2] or "sm_90a"
    U._sms(sms)
    backend = pallas.plugins.get_backend("mosaic_gpu")
    closed = jax.make_jaxpr(lambda *a: fn(*a, interpret=False))(*args)
    start = time.perf_counter()
    try:
        outs = _evaluate(
            closed.jaxpr, closed.consts, list(args),
            lambda eqn, inv: list(backend.emulate(_request(eqn), *inv)))
    except Exception as e:  # noqa: BLE001 - reported in the table
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    secs = time.perf_counter() - start
    got = np.asarray(outs[0], np.float32)
    want = np.asarray(ref(*args), np.float32)
    return {"err": float(np.abs(got - want).max()), "max": float(np.abs(want).max()),
            "nan": int(np.isnan(got).sum()), "secs": secs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", dest="keyword")
    ap.add_argument("--sms", type=int, default=2)
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], tuple(json.loads(a.worker[1])), a.sms)))
        return 0
    print("| kernel | shape | max abs error | max abs reference | emulate s |")
    print("|---|---|---:|---:|---:|")
    for name, shape in CASES:
        if a.keyword and a.keyword not in name:
            continue
        print(f"{name} {shape} ...", file=sys.stderr)
        p = subprocess.run([sys.executable, __file__, "--sms", str(a.sms), "--worker", name,
                            json.dumps(shape)], capture_output=True, text=True)
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            r = {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:160]}
        if "error" in r:
            print(f"| {name} | {shape} | {r['error']} | | |")
        else:
            nan = f" ({r['nan']} NaN)" if r["nan"] else ""
            print(f"| {name} | {shape} | {r['err']:.4g}{nan} | {r['max']:.4g} | "
                  f"{r['secs']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
