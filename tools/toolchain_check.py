"""Mosaic GPU's compile level on a fresh machine: the CUDA tools come from pip alone.

    python tools/toolchain_check.py                  # own venv (~2 min); needs root
    python tools/toolchain_check.py --venv DIR       # reuse a venv that has
                                                     # pallas-mosaic-gpu[compile] (CI's
                                                     # wheel check does this)

Every CUDA toolkit on the machine (``/usr/local/cuda*``, ``/opt/cuda``) is hidden from the
checked process only, by bind-mounting an empty folder over it in a private mount
namespace (``unshare -m``, which needs root; the real folders are never touched), so the
process sees what a fresh machine with ``pip install 'pallas-mosaic-gpu[compile]'`` sees:

1. **pip toolchain only**: the wgmma matmul of ``examples/mosaic_gpu_matmul.py`` and an
   elementwise kernel using ``exp`` compile for sm_90a with ptxas, libdevice and nvdisasm
   from ``site-packages/nvidia/cu13``, and report registers, PTX and SASS; XLA prints no
   ``nvdisasm invocation failed``.
2. **no toolchain** (the nvidia packages uninstalled again): ``compiler.compile`` raises
   ``ToolchainMissingError`` naming the pip packages to install, and the backend stops
   claiming the compile level, where XLA would abort the process.

Exits non-zero on the first failure, naming the step.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLKITS = ("/usr/local/cuda*", "/opt/cuda*")
NVIDIA = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-nvdisasm")

# Run in the checked venv with the toolkits hidden; argv[1] is "pip" or "none".
CHECK = r"""
import os, sys
os.environ["JAX_PLATFORMS"] = "cpu"
import importlib.util, jax, jax.numpy as jnp
import pallas as pl, pallas.plugins
from pallas_mosaic_gpu import compiler

def exp_kernel(x_ref, o_ref):
    o_ref[...] = jnp.exp(x_ref[...]) - 1.0

spec = pl.BlockSpec((64, 128), lambda i: (i, 0))
f = pl.pallas_call(exp_kernel, out_shape=jax.ShapeDtypeStruct((256, 128), jnp.float32),
                   grid=(4,), in_specs=[spec], out_specs=spec, backend="mosaic_gpu")
x = jnp.zeros((256, 128), jnp.float32)
levels = pallas.plugins.get_backend("mosaic_gpu").levels
if sys.argv[1] == "none":
    try:
        compiler.compile(f, x)
    except compiler.ToolchainMissingError as e:
        print(f"ToolchainMissingError: {e}")
        assert "pip install 'pallas-mosaic-gpu[compile]'" in str(e), e
        assert "nvidia-cuda-nvcc and nvidia-nvvm are not installed" in str(e), e
        assert "compile" not in levels, levels
        print(f"mosaic_gpu levels without a toolchain: {levels}")
        sys.exit(0)
    sys.exit("compiled without any toolchain: was one left visible?")
root = compiler.find_toolchain()
print(f"toolchain: {root}")
assert root.startswith(sys.prefix) and root.endswith(os.path.join("nvidia", "cu13")), root
assert "compile" in levels, levels
spec = importlib.util.spec_from_file_location("mm", sys.argv[2])
mm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mm)
for name, fn, args in [("exp", f, (x,)), ("wgmma matmul", mm.matmul, mm.inputs())]:
    (k,) = compiler.compile(fn, *args, target="sm_90a")
    assert ".target sm_90a" in k.ptx and k.registers > 0 and k.sass, name
    sass = [ln for ln in k.sass.splitlines() if "/*" in ln and "*/" in ln]
    print(f"{name}: {k.target}, {k.registers} registers, {k.spill_stores + k.spill_loads} "
          f"spill bytes, {k.smem_bytes} B SMEM, {len(k.ptx.splitlines())} PTX lines, "
          f"{len(sass)} SASS instructions, wgmma={k.uses_wgmma}, {k.seconds:.1f} s")
    assert k.uses_wgmma == (name == "wgmma matmul"), name
"""


def toolkits() -> list[str]:
    """The real folders of every CUDA toolkit on the machine (symlinks resolved)."""
    found = {os.path.realpath(p) for pat in TOOLKITS for p in glob.glob(pat)}
    return sorted(p for p in found if os.path.isdir(p))


def can_hide() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


def hidden(cmd: list[str], empty: str) -> list[str]:
    """``cmd`` in a private mount namespace where every toolkit folder is empty."""
    mounts = "".join(f"mount --bind {shlex.quote(empty)} {shlex.quote(t)} && "
                     for t in toolkits())
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            mounts + " ".join(shlex.quote(c) for c in cmd)]


def step(name: str, cmd: list[str], *, forbid: str | None = None, cwd: str | None = None):
    t = time.perf_counter()
    print(f"\n== {name}\n$ {' '.join(cmd[-4:])}", flush=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "HATCH_", "CUDA_ROOT"))}
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    print(proc.stdout + proc.stderr, end="")
    print(f"({time.perf_counter() - t:.0f}s)", flush=True)
    if proc.returncode != 0:
        sys.exit(f"toolchain check failed at: {name} (exit {proc.returncode})")
    if forbid and forbid in proc.stdout + proc.stderr:
        sys.exit(f"toolchain check failed at: {name} (printed {forbid!r})")


def check(py: str) -> None:
    """Runs both checks against the venv of ``py``; uninstalls its nvidia packages."""
    if not can_hide():
        print("\n== toolchain check skipped: hiding the CUDA toolkits needs root and "
              "`unshare -m` (run tools/toolchain_check.py as root)")
        return
    listed = subprocess.run([py, "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True).stdout
    print("\n" + "\n".join(ln for ln in listed.splitlines()
                           if ln.lower().startswith(("nvidia-", "jax"))))
    print(f"hiding: {', '.join(toolkits()) or '(no toolkit on this machine)'}")
    with tempfile.TemporaryDirectory() as empty:
        script = os.path.join(empty, "check.py")
        with open(script, "w") as f:
            f.write(CHECK)
        os.makedirs(os.path.join(empty, "empty"))
        hide = os.path.join(empty, "empty")
        example = os.path.join(ROOT, "examples", "mosaic_gpu_matmul.py")
        step("compile from the pip toolchain alone",
             hidden([py, script, "pip", example], hide), forbid="nvdisasm invocation failed")
        step("uninstall the nvidia packages",
             [py, "-m", "pip", "uninstall", "-q", "-y", *NVIDIA])
        step("no toolchain: the error names the pip packages",
             hidden([py, script, "none"], hide))


def build_venv(work: str) -> str:
    dist = os.path.join(work, "dist")
    for pkg in ("pallas-core", "pallas-mosaic-gpu"):
        step(f"build {pkg}", ["hatch", "build", "-t", "wheel", dist],
             cwd=os.path.join(ROOT, "packages", pkg))
    step("fresh venv", [sys.executable, "-m", "venv", os.path.join(work, "venv")])
    py = os.path.join(work, "venv", "bin", "python")
    core = glob.glob(os.path.join(dist, "pallas_core-*.whl"))[0]
    mgpu = glob.glob(os.path.join(dist, "pallas_mosaic_gpu-*.whl"))[0]
    step("pip install pallas-core pallas-mosaic-gpu[compile]",
         [py, "-m", "pip", "install", "-q", core, f"{mgpu}[compile]"])
    return py


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", help="check this venv (its nvidia packages get uninstalled)")
    ap.add_argument("--keep", help="build the venv in this folder and keep it")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    if args.venv:
        check(os.path.join(args.venv, "bin", "python"))
    else:
        work = args.keep or tempfile.mkdtemp(prefix="pallas-toolchain-")
        try:
            check(build_venv(work))
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    print(f"\ntoolchain check passed ({time.perf_counter() - start:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
