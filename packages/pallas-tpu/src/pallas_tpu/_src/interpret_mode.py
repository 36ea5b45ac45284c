"""TPU interpret mode: ``InterpretParams`` and the switches that force it.

This release runs kernels through the core interpreter with the TPU interpreter rules
(DMAs copy at ``start()``, semaphores count). The options that describe the full TPU
simulation (race detection, DMA timing, several cores) are accepted and recorded; those
that would change results are rejected when they cannot be honoured.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True, kw_only=True)
class InterpretParams:
    """Options of TPU interpret mode (``interpret=pltpu.InterpretParams(...)``)."""

    detect_races: bool = False
    out_of_bounds_reads: Literal["raise", "uninitialized"] = "raise"
    skip_floating_point_ops: bool = False
    uninitialized_memory: Literal["nan", "zero"] = "nan"
    num_cores_or_threads: int = 1
    vector_clock_size: int | None = None
    logging_mode: object | None = None
    dma_execution_mode: Literal["eager", "on_wait"] = "on_wait"
    random_seed: int | None = 0
    grid_point_recorder: object | None = None
    allow_hbm_allocation_in_run_scoped: bool = False

    def __post_init__(self):
        if self.detect_races:
            raise NotImplementedError(
                "InterpretParams(detect_races=True) is not implemented yet in pallas-tpu "
                "(backend 'mosaic_tpu'): race detection arrives with the full TPU "
                "interpret mode"
            )
        if self.num_cores_or_threads != 1:
            raise NotImplementedError(
                "InterpretParams(num_cores_or_threads > 1) is not implemented yet in "
                "pallas-tpu (backend 'mosaic_tpu')"
            )
        if self.skip_floating_point_ops:
            raise NotImplementedError(
                "InterpretParams(skip_floating_point_ops=True) is not implemented yet in "
                "pallas-tpu (backend 'mosaic_tpu')"
            )


_forced: list[InterpretParams] = []


def forced_params() -> InterpretParams | None:
    """The params of ``force_tpu_interpret_mode``/``set_tpu_interpret_mode``, if active."""
    return _forced[-1] if _forced else None


@contextlib.contextmanager
def force_tpu_interpret_mode(params: InterpretParams = InterpretParams()):
    """Within the ``with`` block, TPU kernels run in interpret mode, even on a TPU."""
    _forced.append(params)
    try:
        yield
    finally:
        _forced.pop()


def set_tpu_interpret_mode(params: InterpretParams = InterpretParams()) -> None:
    """From now on TPU kernels run in interpret mode (undo with ``reset_...``)."""
    _forced.clear()
    _forced.append(params)


def reset_tpu_interpret_mode_state() -> None:
    """Turns forced interpret mode off and forgets interpreter state."""
    _forced.clear()
