"""A kernel's VMEM footprint, computed at trace time, and the check against the chip's
scoped VMEM limit.

The compiler's own message for a kernel that does not fit comes late (at compile time)
and names internal allocations ("Scoped allocation with size 32.00M and limit 16.00M");
this names the operands. The footprint is what XLA's pipeline and Mosaic allocate for the
kernel's buffers: every pipelined VMEM block times its buffer count (2, double-buffered;
1 when its block index never changes or the grid has one step; ``n`` for
``pipeline_mode=pl.Buffered(n)``), whole VMEM operands once, and VMEM scratch, each padded
to the TPU's memory tiling (the last two dims to multiples of (8, 128)).
Semaphores live in semaphore memory and SMEM operands in SMEM: 0 VMEM bytes. Measured
against the compiler's figure (``pallas_tpu.compile(...).vmem_bytes``, libtpu 0.0.42,
v5e and v6e) the estimate is exact for 1-D and 2-D buffers and for higher ranks whose
last two dims are multiples of (8, 128); other higher-rank buffers XLA may tile more
tightly, so they are upper bounds (``exact=False``) and left out of the check. Mosaic's
internal scratch is not included. The check therefore refuses only kernels the
compiler refuses too.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax.numpy as jnp
from jax.errors import JaxRuntimeError

from pallas_tpu._src.compiler.chips import ENV_CHIP, canonical_chip
from pallas_tpu._src.lowering.types import memory_dtype
from pallas_tpu._src.memory import MemorySpace, canonical_space
from pallas_tpu._src.tpu_info import get_tpu_info, is_tpu_device

MiB = 1 << 20

#: The scoped VMEM limit XLA gives a kernel without ``vmem_limit_bytes``, per chip, as
#: libtpu 0.0.42 reports it ("Scoped allocation with size ... and limit 16.00M").
DEFAULT_SCOPED_LIMIT = {"v4": 16 * MiB, "v5e": 16 * MiB, "v5p": 16 * MiB,
                        "v6e": 32 * MiB, "7": 32 * MiB, "7x": 32 * MiB}


@dataclasses.dataclass(frozen=True)
class VmemItem:
    """One VMEM allocation of a kernel: what it is, its padded bytes per buffer, how
    many buffers."""

    what: str
    shape: tuple
    dtype: str
    bytes_per_buffer: int
    buffers: int
    #: False for a buffer of rank >= 3 whose last two dims are not multiples of (8, 128):
    #: XLA may tile it more tightly than (8, 128), so its bytes are an upper bound.
    exact: bool = True
    #: For a pipelined block, the window as XLA's compiler describes it when the kernel
    #: does not fit ("input window allocation for operator input 0 ...").
    window: str = ""

    @property
    def bytes(self) -> int:
        return self.bytes_per_buffer * self.buffers

    def describe(self) -> str:
        n = f" x {self.buffers} buffers" if self.buffers != 1 else ""
        about = "" if self.exact else "at most "
        return (f"{self.what} {self.dtype}{list(self.shape)}: {about}"
                f"{_fmt(self.bytes_per_buffer)}{n} = {_fmt(self.bytes)}")


def _fmt(n: int) -> str:
    if n >= MiB:
        return f"{n / MiB:.2f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def padded_bytes(shape, dtype) -> int:
    """Bytes of a ``shape``/``dtype`` buffer in VMEM, its last two dims padded to the
    memory tiling XLA gives kernel operands (measured with libtpu 0.0.42 on v5e and v6e):
    multiples of (8, 128) for 2-D and up, of 1024 elements for 1-D, for every dtype."""
    dt = memory_dtype(dtype)
    shape = tuple(int(d) for d in shape)
    if not shape:
        return 4
    if len(shape) == 1:
        return -(-shape[0] // 1024) * 1024 * dt.itemsize
    *lead, r, c = shape
    rows = -(-r // 8) * 8
    cols = -(-c // 128) * 128
    return math.prod(lead) * rows * cols * dt.itemsize


def _exact(shape) -> bool:
    shape = tuple(shape)
    return len(shape) <= 2 or (shape[-2] % 8 == 0 and shape[-1] % 128 == 0)


def _index_is_constant(bm, grid) -> bool:
    """Whether the block's index never changes: its index map ignores the grid indices
    of the axes with more than one step (and any scalar-prefetch operand)."""
    jaxpr = bm.index_map_jaxpr.jaxpr
    live = {v for i, v in enumerate(jaxpr.invars) if i >= len(grid) or grid[i] != 1}
    for eqn in jaxpr.eqns:
        if any(v in live for v in eqn.invars if not hasattr(v, "val")):
            live.update(eqn.outvars)
    return not any(v in live for v in jaxpr.outvars if not hasattr(v, "val"))


def footprint(gm) -> list[VmemItem]:
    """The VMEM allocations of a kernel with grid mapping ``gm`` (see the module)."""
    steps = math.prod(int(g) if isinstance(g, int) else 2 for g in gm.grid)
    items = []
    for k, bm in enumerate(gm.block_mappings):
        space = canonical_space(bm.memory_space)
        if space not in (None, MemorySpace.VMEM):
            continue
        dtype = bm.array_aval.dtype
        window = ""
        if bm.whole and space is MemorySpace.VMEM:
            shape, buffers = tuple(bm.array_aval.shape), 1
        else:
            shape = tuple(bm.block_shape)
            count = getattr(bm.pipeline_mode, "buffer_count", None)
            buffers = count or (1 if steps == 1 or _index_is_constant(bm, gm.grid) else 2)
            window = _window(gm, k, shape, bm.array_aval, buffers)
        items.append(VmemItem(str(bm.origin), shape, jnp.dtype(dtype).name,
                              padded_bytes(shape, dtype), buffers, _exact(shape), window))
    for origin, t in zip(gm.scratch_origins, gm.scratch_types):
        space = canonical_space(t.memory_space)
        if space not in (None, MemorySpace.VMEM) or not hasattr(t, "shape"):
            continue
        items.append(VmemItem(f"scratch {origin}", tuple(t.shape), jnp.dtype(t.dtype).name,
                              padded_bytes(t.shape, t.dtype), 1, _exact(t.shape)))
    return items


def _window(gm, k: int, shape, array_aval, buffers: int) -> str:
    """XLA's description of block ``k``'s pipelined window (the words upstream's tests
    and users search a VMEM OOM for); operands count as the custom call's, scalar
    prefetch first."""
    from jax.core import ShapedArray

    if k < gm.num_inputs:
        kind, index = "input", gm.num_scalar_prefetch + k
    else:
        kind, index = "output", k - gm.num_inputs
    win = ShapedArray(shape, array_aval.dtype).str_short(short_dtypes=True)
    full = ShapedArray(array_aval.shape, array_aval.dtype).str_short(short_dtypes=True)
    levels = ("This allocation is single buffered." if buffers == 1
              else f"This allocation has {buffers} buffering levels.")
    return (f"{kind} window allocation for operator {kind} {index}: The window shape is "
            f"{win}, while the full shape is {full}. {levels}")


def target_chip(params) -> str | None:
    """The chip a kernel is checked for at trace time: ``CompilerParams(chip=)``,
    ``$PALLAS_TPU_CHIP``, or the attached TPU; None when none is known (no check)."""
    chip = getattr(params, "chip", None) or os.environ.get(ENV_CHIP)
    if chip is None and is_tpu_device():
        chip = get_tpu_info().chip_version
    if chip is None:
        return None
    try:
        return canonical_chip(chip)
    except ValueError:
        return None


class VmemOomError(ValueError, JaxRuntimeError):
    """A kernel's VMEM buffers exceed its chip's scoped VMEM limit. A ``ValueError`` (bad
    block shapes, caught at trace time) and a ``jax.errors.JaxRuntimeError``, the type
    the compiler's own VMEM OOM has on a TPU (as upstream's tests catch it)."""

    def __init__(self, message: str):
        super().__init__(message)
        self._error_message = message  # what JaxRuntimeError's str() reads

    def __str__(self) -> str:
        return self._error_message


def check_vmem(gm, params, name: str = "kernel") -> None:
    """Raises a :class:`VmemOomError` (a ValueError) naming the kernel's VMEM buffers when their footprint exceeds
    the scoped VMEM limit of its chip (``vmem_limit_bytes``, else the chip's default)."""
    chip = target_chip(params)
    limit = params.vmem_limit_bytes or DEFAULT_SCOPED_LIMIT.get(chip)
    if limit is None:
        return
    items = footprint(gm)
    # Only the exact items count: their sum is a lower bound of what the compiler
    # allocates, so a kernel refused here is one the compiler refuses too.
    total = sum(i.bytes for i in items if i.exact)
    if total <= limit:
        return
    biggest = sorted(items, key=lambda i: -i.bytes)
    listing = "; ".join(i.describe() for i in biggest)
    windows = "".join(f" {i.window}" for i in items if i.window)
    how = ("vmem_limit_bytes" if params.vmem_limit_bytes
           else f"the default scoped VMEM limit of TPU {chip}")
    raise VmemOomError(
        f"Ran out of memory in memory space vmem: {name}: its VMEM buffers need "
        f"{_fmt(total)} ({total} bytes), more than {how} "
        f"({_fmt(limit)}): {listing}.{windows} Valid: smaller blocks (a block's VMEM bytes are its "
        f"tile-padded size times its buffer count, 2 when pipelined), "
        f"pipeline_mode=pl.Buffered(1) for a block whose index rarely changes, or "
        f"pltpu.CompilerParams(vmem_limit_bytes=...) up to the chip's VMEM capacity")
