"""GPU interpret mode, public: its options, the switches that force it, the race report.

Upstream keeps these private (``jax._src.pallas.mosaic_gpu.interpret``); here they are
public::

    import pallas_mosaic_gpu as plgpu
    from pallas_mosaic_gpu import interpret as gpu_interpret

    y = plgpu.kernel(body, out_type=..., num_threads=2, thread_name="t",
                     interpret=plgpu.InterpretParams(detect_races=True))(x)
    assert not gpu_interpret.get_races().races_found
"""

from __future__ import annotations

import types

from pallas.plugins import LoggingMode, Race, RaceReport
from pallas_mosaic_gpu._src.interpret import launch as _launch
from pallas_mosaic_gpu._src.interpret.params import (
    InterpretGPUParams,
    InterpretParams,
    force_gpu_interpret_mode,
    set_gpu_interpret_mode,
)
from pallas_mosaic_gpu._src.interpret.sync import BarrierError
from pallas_mosaic_gpu._src.interpret.threads import DeadlockError


def get_races() -> RaceReport:
    """The races found by the last kernel run in GPU interpret mode with
    ``detect_races=True`` (``.races_found``, ``.races``; ``str()`` describes them)."""
    return _launch.REPORT


def reset_gpu_interpret_mode_state() -> None:
    """Forgets the race report and the state of a kernel that stopped with an error."""
    _launch.reset_state()


# Upstream's module layout: ``interpret_pallas_call.gpu_callbacks.reset_...``.
gpu_callbacks = types.SimpleNamespace(
    reset_gpu_interpret_mode_state=reset_gpu_interpret_mode_state, get_races=get_races)

__all__ = [
    "BarrierError", "DeadlockError", "InterpretGPUParams", "InterpretParams", "LoggingMode",
    "Race", "RaceReport", "force_gpu_interpret_mode", "get_races", "gpu_callbacks",
    "reset_gpu_interpret_mode_state", "set_gpu_interpret_mode",
]
