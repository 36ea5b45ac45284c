"""The compile level: Mosaic GPU's pass pipeline, PTX and ptxas, on a CPU-only machine.

A compile-only CUDA device (``jax.experimental.topologies`` with a GPU description and
``JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1``) lets ``jit(...).lower(...).compile()`` run the
whole GPU pipeline without a GPU. Mosaic GPU's dumps (``MOSAIC_GPU_DUMP_*``) give the
PTX and ptxas' report, from which registers, spills and the instruction mix are read.
Mosaic GPU fixes the target architecture for the life of a process: one process
compiles for one target (``PALLAS_MOSAIC_GPU_TARGET``).

ptxas and libdevice come from pip packages (extra ``compile`` of this package) or a CUDA
toolkit: see ``toolchain``, which finds them, and says what to install when they are
missing, before XLA is asked to compile (XLA aborts the process without libdevice).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import re
import tempfile
import time

import jax
import numpy as np

from pallas_mosaic_gpu._src.lowering import build
from pallas_mosaic_gpu._src.toolchain import (  # noqa: F401 - re-exported
    ToolchainMissingError,
    check_plugin,
    find_toolchain,
)

TARGETS = ("sm_90a", "sm_100a")
DEFAULT_TARGET = "sm_90a"
ENV_TARGET = "PALLAS_MOSAIC_GPU_TARGET"

# What a compile-only device needs to know about the GPU, per target.
_DEVICES = {
    "sm_90a": dict(name="NVIDIA H100 80GB HBM3", major=9, cores=132, mem=84942979072,
                   l2=52428800, clock=1.98),
    "sm_100a": dict(name="NVIDIA B200", major=10, cores=148, mem=191554125824,
                    l2=132120576, clock=1.965),
}


def target_config(target: str) -> str:
    """The XLA GPU device description (text proto) of a compile-only ``target``."""
    if target not in _DEVICES:
        raise ValueError(f"compile target {target!r} is not one of {TARGETS}")
    d = _DEVICES[target]
    return "\n".join([
        "gpu_device_info {",
        "  threads_per_block_limit: 1024", "  threads_per_warp: 32",
        "  shared_memory_per_block: 49152", "  shared_memory_per_core: 233472",
        "  threads_per_core_limit: 2048", f"  core_count: {d['cores']}",
        "  fpus_per_core: 128", "  block_dim_limit_x: 2147483647",
        "  block_dim_limit_y: 65535", "  block_dim_limit_z: 65535",
        "  memory_bandwidth: 3352320000000", f"  l2_cache_size: {d['l2']}",
        f"  clock_rate_ghz: {d['clock']}", f"  device_memory_size: {d['mem']}",
        "  shared_memory_per_block_optin: 232448",
        "  cuda_compute_capability {", f"    major: {d['major']}",
        "    feature_extension: ACCELERATED_FEATURES", "  }",
        "  registers_per_core_limit: 65536", "  registers_per_block_limit: 65536",
        "  thread_dim_limit_x: 1024", "  thread_dim_limit_y: 1024", "  thread_dim_limit_z: 64",
        '  device_vendor: "NVIDIA Corporation"',
        f'  platform_version: "Compute Capability {d["major"]}.0a"',
        f'  name: "{d["name"]}"', "  device_address_bits: 64",
        '  driver_version: "13.0.0"', '  runtime_version: "12.8.0"',
        '  compile_time_toolkit_version: "12.8.0"', '  dnn_version: "9.10.0"',
        "}", 'platform_name: "CUDA"', "dnn_version_info {", "  major: 9", "}",
        f'device_description_str: "{d["name"]}"', "",
    ])


@functools.cache
def device(target: str):
    """A compile-only CUDA device for ``target`` (``sm_90a`` or ``sm_100a``)."""
    check_plugin()
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(platform="cuda", target_config=target_config(target),
                                        topology="1x1x1")
    return topo.devices[0]


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """What ptxas made of one kernel for one target."""

    name: str
    target: str
    registers: int
    spill_stores: int
    spill_loads: int
    smem_bytes: int  # the kernel's dynamic shared memory (its blocks and scratch)
    ptx: str
    ptxas_report: str
    seconds: float  # lowering + Mosaic GPU passes + ptxas
    sass: str = ""  # nvdisasm's listing of the cubin ("" without nvdisasm)

    @property
    def uses_wgmma(self) -> bool:
        return "wgmma." in self.ptx

    @property
    def uses_tcgen05(self) -> bool:
        return "tcgen05." in self.ptx

    def instruction_mix(self) -> dict[str, int]:
        """Counts of PTX instructions by opcode (``wgmma``, ``fma``, ``ld``, ...)."""
        counts: dict[str, int] = {}
        for m in re.finditer(r"^\s+(?:@!?%p\w+\s+)?([a-z][a-z0-9_]*)[.\s;]", self.ptx, re.M):
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        return counts


def _read(pattern: str) -> str:
    files = sorted(glob.glob(pattern))
    return open(files[-1]).read() if files else ""


def compile_kernel(jaxpr, grid_mapping, compiler_params, *, name: str = "kernel",
                   target: str | None = None) -> CompiledKernel:
    """Lowers the kernel and compiles it to SASS for ``target`` on a compile-only device."""
    target = target or os.environ.get(ENV_TARGET) or DEFAULT_TARGET
    root = find_toolchain()
    if _TARGET.setdefault("target", target) != target:
        from pallas.plugins import LevelUnsupportedError

        raise LevelUnsupportedError(
            f"this process already compiled Mosaic GPU kernels for {_TARGET['target']}; "
            f"Mosaic GPU fixes the target per process, so compile for {target} in another "
            f"process (e.g. with {ENV_TARGET}={target})")
    dev = device(target)
    mesh = jax.sharding.Mesh(np.array([dev]), ("d",))
    shd = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    t0 = time.perf_counter()
    with jax.default_device(dev):  # Mosaic GPU reads the target architecture from it
        kernel = build(jaxpr, grid_mapping, compiler_params, name, target=target)
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=shd) for a in kernel.arg_shapes]
    env = {"MOSAIC_GPU_CUDA_ROOT": root, "MOSAIC_GPU_DUMP_PTX": "1",
           "MOSAIC_GPU_DUMP_PTXAS": "1"}
    path = os.pathsep.join([os.path.join(root, "bin"), os.environ.get("PATH", "")])
    lowered = jax.jit(kernel.fn, in_shardings=shd, out_shardings=shd).trace(
        *args).lower(lowering_platforms=("cuda",))
    # Mosaic GPU caches compiled modules by their hash, and then dumps nothing again:
    # kernels whose modules are equal (say, add on int32 and on uint32) share a report.
    text = lowered.as_text()
    h = re.search(r'kernel_hash = "((?:[^"\\]|\\.)*)"', text)
    key = (h.group(1) if h else text, target)
    if key in _CACHE:
        return dataclasses.replace(_CACHE[key], seconds=time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as dump:
        saved = {k: os.environ.get(k) for k in [*env, "MOSAIC_GPU_DUMP_TO", "PATH"]}
        os.environ.update(env, MOSAIC_GPU_DUMP_TO=dump, PATH=path)
        try:
            # XLA gets the same root, or it would look for libdevice where JAX guessed.
            lowered.compile(compiler_options={"xla_gpu_cuda_data_dir": root})
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        seconds = time.perf_counter() - t0
        sym = kernel.name
        report = _read(os.path.join(dump, f"{sym}*.ptxas"))
        ptx = _read(os.path.join(dump, f"{sym}*.ptx"))
        sass = _read(os.path.join(dump, f"{sym}*.sass*"))
    regs = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    if regs is None:
        raise RuntimeError(f"ptxas produced no report for kernel {name} (target {target})")
    out = _CACHE[key] = CompiledKernel(
        name=sym, target=target, registers=int(regs.group(1)),
        spill_stores=int(spills.group(1)) if spills else 0,
        spill_loads=int(spills.group(2)) if spills else 0,
        smem_bytes=kernel.smem_bytes, ptx=ptx, ptxas_report=report,
        seconds=seconds, sass=sass)
    return out


_CACHE: dict = {}
_TARGET: dict = {}

