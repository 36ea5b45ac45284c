"""``plgpu.InterpretParams``: the options of GPU interpret mode, and the switches that
force it.

Passing ``interpret=plgpu.InterpretParams(...)`` to ``pl.pallas_call``, ``pl.core_map``
or ``plgpu.kernel`` runs the kernel on CPU with a GPU's semantics: GMEM/SMEM buffers,
concurrent threads (warpgroups) of every block, barriers, TMA copies, and, with
``detect_races=True``, a happens-before race detector (vector clocks).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from pallas.plugins import (
    SharedInterpretParams,
    forced_interpret_mode,
    set_forced_interpret,
)

# GPU interpret mode's ``pallas_call`` lowering: ``interpret.launch`` (which reads these
# params, so sits above them) registers it when imported; ``_src.interpret`` imports it.
_LAUNCHER: list = []


def register_launcher(lower) -> None:
    """Sets the function that lowers a ``pallas_call`` in GPU interpret mode:
    ``lower(params, ctx, *in_nodes, jaxpr, grid_mapping, name, out_avals)``."""
    _LAUNCHER[:] = [lower]


@dataclasses.dataclass(frozen=True, kw_only=True)
class InterpretParams(SharedInterpretParams):
    """Options of GPU interpret mode (upstream's ``InterpretGPUParams``): the shared ones
    (:class:`pallas.plugins.SharedInterpretParams`; ``logging_mode`` a
    :class:`LoggingMode`) and GPU's own.

    ``detect_races``: check every access against a happens-before order (vector clocks)
    and record races in ``pallas_mosaic_gpu.interpret.get_races()``.
    ``out_of_bounds_reads``: ``"raise"`` or ``"uninitialized"`` (read the fill value).
    ``skip_floating_point_ops``: do not compute floating-point results; they become
    ``inf`` (fast runs that check synchronisation only).
    ``uninitialized_memory``: ``"nan"`` (ints: their maximum) or ``"zero"`` for fresh
    buffers. ``num_cores_or_threads``: accepted for upstream compatibility (threads come
    from the kernel's mesh). ``num_tma_threads_per_device``: how many TMA units copies
    are spread over (each gets its own vector clock entry).
    """

    num_tma_threads_per_device: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.vector_clock_size is not None:
            raise ValueError("`vector_clock_size` must be `None` for GPU interpret mode, but "
                             f"got {self.vector_clock_size}.")
        if self.num_tma_threads_per_device < 1:
            raise ValueError("Number of TMA threads per device must be at least 1, but got "
                             f"{self.num_tma_threads_per_device}.")

    # -- pallas-core's interpret-mode protocol (pallas.plugins.InterpretMode) -----------
    def lower_pallas_call(self, ctx, *in_nodes, jaxpr, grid_mapping, compiler_params=None,
                          name: str = "kernel", **_: Any):
        (lower,) = _LAUNCHER  # interpret.launch registers it when imported
        return lower(self, ctx, *in_nodes, jaxpr=jaxpr,
                                 grid_mapping=grid_mapping, name=name,
                                 out_avals=list(ctx.avals_out))


InterpretGPUParams = InterpretParams


@contextlib.contextmanager
def force_gpu_interpret_mode(params: InterpretParams = InterpretParams()):
    """Within the block, every ``pallas_call``/``core_map``/``plgpu.kernel`` traced runs
    with ``interpret=params`` (``None``: as written)."""
    with forced_interpret_mode(params):
        yield


def set_gpu_interpret_mode(params: InterpretParams | None = InterpretParams()) -> None:
    """From now on kernels run with ``interpret=params``; ``None`` turns it off."""
    set_forced_interpret(params)
