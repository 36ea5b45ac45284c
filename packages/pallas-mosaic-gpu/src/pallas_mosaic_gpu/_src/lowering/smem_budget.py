"""The shared memory a kernel needs against what one CUDA block may use on its target.

A kernel whose blocks, scratch and staging buffers do not fit fails at trace time with
the bytes each part needs and the target's limit, instead of deep in Mosaic GPU.
"""

from __future__ import annotations

from pallas.plugins import LevelUnsupportedError
from pallas_mosaic_gpu._src.lowering.context import BACKEND, KernelError

# Dynamic shared memory per block (opt-in maximum): 227 KiB on Hopper (sm_90a) and on
# datacenter Blackwell (sm_100a), which is also what Mosaic GPU assumes when it compiles
# ahead of time without a device.
SMEM_PER_BLOCK: dict[str, int] = {"sm_90a": 227 * 1024, "sm_100a": 227 * 1024}
DEFAULT_TARGET = "sm_90a"


class SmemExceededError(KernelError, LevelUnsupportedError):
    """A kernel needs more shared memory per block than its target has: bad input for
    this target (a ``ValueError``, as upstream raises). The conformance suite reports such
    a kernel ``unsupported`` on this backend rather than failed."""


def limit(target: str | None) -> int:
    """Bytes of SMEM one block may use on ``target`` (None: sm_90a's)."""
    return SMEM_PER_BLOCK.get(target or DEFAULT_TARGET, SMEM_PER_BLOCK[DEFAULT_TARGET])


def _part(key, block_names: dict) -> str:
    if key == "red":
        return "cross-warp reduction scratch"
    if key == "barriers":
        return "TMA barriers"
    if key == "scoped_stack":  # the run_scoped buffers sharing bytes by lifetime
        return "run_scoped buffers"
    if key == "staging":
        return ("staging buffers for values read across the warpgroup (dot operands, "
                "reductions, transposes, broadcasts; shared between operations, the "
                "largest counts)")
    kind = key[0]
    if kind == "buf":
        return f"block of {block_names.get(key[1], f'operand {key[1]}')}"
    if kind == "scratch":
        return f"scratch_shapes[{key[1]}]"
    if kind == "scoped":
        return "run_scoped buffers"
    if kind == "spill":
        return "scanned rows and stacked results of lax.scan"
    return str(key)


def check(name: str, target: str | None, total: int, sizes: dict, block_names: dict) -> None:
    """Raises :class:`SmemExceededError` when ``total`` bytes (the SMEM tree of kernel
    ``name``, entry key -> bytes in ``sizes``) exceed ``target``'s limit."""
    available = limit(target)
    if total <= available:
        return
    parts: dict[str, int] = {}
    for key, size in sizes.items():
        what = _part(key, block_names)
        parts[what] = parts.get(what, 0) + size
    lines = "; ".join(f"{what}: {size} bytes"
                      for what, size in sorted(parts.items(), key=lambda kv: -kv[1]))
    raise SmemExceededError(
        f"pallas-mosaic-gpu (backend '{BACKEND}'): kernel {name} needs {total} bytes of "
        f"shared memory per block ({total / 1024:.1f} KiB), more than the "
        f"{available} bytes ({available // 1024} KiB) one block has on "
        f"{target or DEFAULT_TARGET}. It holds: {lines}. Use smaller block shapes, or run the "
        f"kernel with interpret=True.")
