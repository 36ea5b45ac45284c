"""Emulated devices (``pl.emulate_device``) against the interpreter: the quickstart kernels.

For each emulated device and each kernel of ``examples/quickstart.py``: the first call
(lowering, the real compiler where installed, the executor's plan) and the median of the
following calls (one host callback running the generated code under the backend's
executor), against the same kernel on the core interpreter (``interpret=True``), both
under ``jax.jit``. Results are checked against the interpreter before they are timed.

    python benchmarks/emulated_devices.py                         # tpu:v5e cuda:sm_80 cuda:sm_90a
    python benchmarks/emulated_devices.py --devices tpu:v6e --repeats 5
    python benchmarks/emulated_devices.py --skip matmul,softmax   # (Mosaic GPU's executor:
                                                                  #  ~85 s a call for those)
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

import pallas as pl
import pallas.plugins

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import quickstart  # noqa: E402


def timed(f, *args):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", default="tpu:v5e,cuda:sm_80,cuda:sm_90a")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", default="", help="kernels to leave out, e.g. matmul,softmax")
    ap.add_argument("--skip-on", default="cuda:sm_90a,cuda:sm_100a",
                    help="devices on which --skip applies")
    a = ap.parse_args()
    skip = [s for s in a.skip.split(",") if s]
    skip_on = set(a.skip_on.split(","))
    print("| device | kernel | backend | compiled | interpreter per call (ms) | emulated "
          "first call (s) | emulated per call (ms) | emulated / interpreter |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    for dev in a.devices.split(","):
        for name, fn, _, args, tol in quickstart.examples():
            short = name.split()[0]
            if dev in skip_on and any(s in name for s in skip):
                continue
            interp = jax.jit(functools.partial(fn, interpret=True))
            want = interp(*args)
            timed(interp, *args)
            t_int = statistics.median(timed(interp, *args) for _ in range(a.repeats))
            emu = jax.jit(fn)
            with pl.emulate_device(dev):
                first = timed(emu, *args)
                got = emu(*args)
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=max(tol, 1e-4))
                t_emu = statistics.median(timed(emu, *args) for _ in range(a.repeats))
            k = [k for k in pl.plugins.emulated_kernels() if k.device.spec == dev][-1]
            compiled = "yes" if k.compiled is not None else "skipped"
            print(f"| {dev} | {short} | {k.backend} | {compiled} | {t_int * 1e3:.1f} | "
                  f"{first:.2f} | {t_emu * 1e3:.1f} | {t_emu / t_int:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
