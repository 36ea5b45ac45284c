"""The AMD rows of ``triton_codegen.py``: the same kernels, compiled for an AMD GPU.

``python benchmarks/triton_codegen.py --target gfx942`` (gfx90a, gfx950, gfx1100 too)
compiles pallas-triton's kernels and the hand-written Triton ones for the AMD target
with ``triton.compile(GPUTarget("hip", arch, wavefront))``: same ``num_warps``,
``num_stages`` and pointer alignment. For each it reports what the code object's AMDHSA
metadata says (VGPRs with AGPRs, SGPRs, LDS bytes, scratch and spills, occupancy) and
the instruction mix of the AMDGCN: ``v_mfma``/``v_wmma`` (matrix unit),
``buffer_load``/``global_load`` (global memory), ``ds_read``/``ds_write`` (LDS).
Target: no figure worse than the hand-written kernel's (fewer VGPRs/LDS/spills, an
occupancy and an MFMA count at least as high), or the cause written down in
``benchmarks/README.md``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from collections.abc import Callable

import pallas_triton as pltriton


@dataclasses.dataclass
class AMDResult:
    kernel: str
    variant: str
    arch: str
    usage: dict | None = None
    mix: dict | None = None
    seconds: float = 0.0
    error: str | None = None


def measure(kernel: str, variant: str, arch: str, build: Callable[[], tuple]) -> AMDResult:
    """``build() -> (asm, dynamic LDS bytes, kernel name)``, Triton's ``asm`` dict."""
    res = AMDResult(kernel, variant, arch)
    t0 = time.perf_counter()
    try:
        asm, lds, name = build()
        res.usage = pltriton.code_object_usage(asm["amdgcn"], asm["hsaco"], name, lds)
        res.mix = pltriton.instruction_mix(asm["amdgcn"])
    except Exception as e:  # noqa: BLE001 - reported in the table
        res.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc(file=sys.stderr)
    res.seconds = time.perf_counter() - t0
    return res


def verdict(p: AMDResult, h: AMDResult) -> str:
    """✓, or what is worse than the hand-written kernel."""
    if p.error or h.error:
        return "–"
    pu, hu = p.usage, h.usage
    worse = [k for k in ("vgprs", "sgprs", "lds", "scratch", "vgpr_spills") if pu[k] > hu[k]]
    if pu["occupancy"] < hu["occupancy"]:
        worse.append("occupancy")
    unit = "v_mfma" if hu["wavefront_size"] == 64 else "v_wmma"
    if p.mix[unit] < h.mix[unit]:
        worse.append(unit)
    return "✓" if not worse else "✗ " + ", ".join(worse)


def report(results: list[tuple[str, AMDResult, list[AMDResult]]]) -> str:
    """The Markdown table of the AMD rows."""
    lines = [
        "| kernel | variant | target | VGPRs (AGPRs) | SGPRs | LDS bytes | scratch / spills "
        "| occupancy | v_mfma / v_wmma | buffer_load / global_load | ds_read / ds_write "
        "| no figure worse |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for _name, hand, pallas in results:
        for r in [*pallas, hand]:
            if r.error:
                lines.append(f"| {r.kernel} | {r.variant} | {r.arch} | error: {r.error} "
                             "| | | | | | | | |")
                continue
            u, m = r.usage, r.mix
            lines.append(
                f"| {r.kernel} | {r.variant} | {r.arch} | {u['vgprs']} ({u['agprs']}) | "
                f"{u['sgprs']} | {u['lds']} | {u['scratch']} / {u['vgpr_spills']} | "
                f"{u['occupancy']} | {m['v_mfma'] or m['v_wmma']} | "
                f"{m['buffer_load']} / {m['global_load']} | {m['ds_read']} / {m['ds_write']} "
                f"| {'' if r is hand else verdict(r, hand)} |")
    return "\n".join(lines)
