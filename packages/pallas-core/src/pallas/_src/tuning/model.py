"""The static model: a config's estimated cost from its figures, where nothing is timed.

It is a model, and says so: a roofline (flops against peak, bytes against bandwidth)
plus a cost per grid step, adjusted per target family:

* TPU: blocks are padded to (8, 128) tiles, transcendentals run on a slower unit, and a
  step's on-chip footprint (compile figure ``vmem_bytes`` where the backend gives it,
  else blocks times buffers plus scratch) must fit the VMEM limit.
* GPU: occupancy from registers per thread and shared memory per block, the tail of the
  last wave of blocks, and spilled registers as extra memory traffic; shared memory must
  fit a block's limit (the compiler's figure: where blocks live is the backend's
  choice), registers 255 per thread.

Only the order of the estimates is used; the seconds are not a prediction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pallas._src.tuning.devices import DeviceSpec, Target
from pallas._src.tuning.kernels import KernelFigures

MAX_REGISTERS_PER_THREAD = 255


def _onchip(k: KernelFigures, compiled: dict, spec: DeviceSpec) -> int:
    if spec.onchip_name == "VMEM" and compiled.get("vmem_bytes"):
        return int(compiled["vmem_bytes"])
    if spec.onchip_name == "SMEM" and "smem_bytes" in compiled:
        return int(compiled["smem_bytes"])
    return k.footprint_bytes


def memory_problem(kernels: Sequence[KernelFigures], compiled: Sequence[dict],
                   target: Target) -> str | None:
    """Why the config does not fit ``target``'s memory, or ``None`` when it fits."""
    spec = target.spec
    for k, c in zip(kernels, compiled):
        used = _onchip(k, c, spec)
        # On a GPU, where blocks live is the backend's choice (Triton keeps them in
        # registers): only the compiler's shared-memory figure is checked.
        guess_only = spec.onchip_name == "SMEM" and "smem_bytes" not in c
        if spec.onchip_bytes and used > spec.onchip_bytes and not guess_only:
            src = "compiler" if (c.get("vmem_bytes") or "smem_bytes" in c) else "blocks x buffers + scratch"
            return (f"pallas_call {k.name} needs {used} bytes of {spec.onchip_name} "
                    f"({src}); {target.platform}:{target.kind} allows {spec.onchip_bytes}")
        regs = c.get("registers", 0)
        if regs > MAX_REGISTERS_PER_THREAD:
            return (f"pallas_call {k.name} needs {regs} registers per thread; the limit "
                    f"is {MAX_REGISTERS_PER_THREAD}")
    return None


def _gpu_efficiency(k: KernelFigures, c: dict, spec: DeviceSpec) -> tuple[float, float]:
    """(occupancy factor in (0, 1], tail factor in (0, 1]) of one GPU kernel."""
    threads = int(c.get("num_warps", 4)) * 32
    regs = int(c.get("registers", 0))
    smem = _onchip(k, c, spec)
    limits = [spec.threads_per_core // threads, 32]
    if regs:
        limits.append(spec.regs_per_core // (regs * threads))
    if smem:
        limits.append(spec.smem_per_core // smem)
    blocks_per_sm = max(min(limits), 1)
    occupancy = blocks_per_sm * threads / spec.threads_per_core
    # Half the SM's threads resident hide memory latency well enough; below, time grows.
    occ_factor = min(1.0, occupancy / 0.5)
    slots = spec.cores * blocks_per_sm
    waves = math.ceil(k.grid_steps / slots)
    tail = k.grid_steps / (waves * slots)
    return occ_factor, tail


def estimate(kernels: Sequence[KernelFigures], compiled: Sequence[dict],
             target: Target) -> float:
    """The model's cost of one config (seconds in name only: compare, do not read)."""
    spec = target.spec
    total = 0.0
    for k, c in zip(kernels, compiled):
        flops, nbytes = float(k.flops), float(k.hbm_bytes)
        trans = float(k.transcendentals)
        if target.platform == "tpu":
            nbytes = float(k.tile_padded_bytes) * k.grid_steps
            compute = flops / spec.peak_flops + trans / (spec.peak_flops / 64)
            total += max(compute, nbytes / spec.bandwidth) + k.grid_steps * spec.step_overhead_s
        elif target.platform in ("cuda", "rocm") and spec.threads_per_core:
            occ, tail = _gpu_efficiency(k, c, spec)
            threads = int(c.get("num_warps", 4)) * 32
            spills = c.get("spill_stores", 0) + c.get("spill_loads", 0)
            nbytes += 4.0 * spills * threads * k.grid_steps
            compute = flops / spec.peak_flops + trans / (spec.peak_flops / 16)
            total += max(compute, nbytes / spec.bandwidth) / (occ * tail)
        else:
            total += (max(flops / spec.peak_flops, nbytes / spec.bandwidth)
                      + k.grid_steps * spec.step_overhead_s)
    return total


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Rank agreement of two score lists in [-1, 1] (1: same order); ``None`` under 2."""
    n = len(a)
    if n < 2:
        return None
    s = 0
    pairs = 0
    for i in range(n):
        for j in range(i + 1, n):
            x, y = a[i] - a[j], b[i] - b[j]
            pairs += 1
            s += (x > 0) - (x < 0) if y > 0 else ((x < 0) - (x > 0) if y < 0 else 0)
    return s / pairs
