"""TPU interpret mode: the simulation behind ``interpret=pltpu.InterpretParams(...)``.

Public home of what upstream keeps private in ``jax._src.pallas.mosaic.interpret``:

- ``races``: the :class:`~pallas.plugins.RaceReport` of the most recent interpreted
  kernel call (``races.races_found``, ``races.races``: each race names both accesses'
  kernel source locations); :func:`race_report` returns it, :func:`reset_races` clears it.
- :func:`thread_map`: runs a function on several threads at once, from one host
  callback (usable to test code that must run concurrently); ``on_exception`` hears of
  a thread's error at once, to release threads waiting for it.
- :func:`is_range_out_of_bounds_for_shape`, and the parameters
  (:class:`InterpretParams`, :class:`LoggingMode`).
"""

from __future__ import annotations

from pallas.plugins import RaceReport
from pallas_tpu._src.interpret import grid as _grid
from pallas_tpu._src.interpret import state as _state
from pallas_tpu._src.interpret.boxes import is_range_out_of_bounds_for_shape
from pallas_tpu._src.interpret.params import (
    InterpretParams,
    LoggingMode,
    force_tpu_interpret_mode,
    reset_tpu_interpret_mode_state,
    set_tpu_interpret_mode,
)
from pallas_tpu._src.interpret.thread_map import thread_map

# (``races`` is a module attribute too, rebound at every kernel call: see __getattr__.)
__all__ = [
    "InterpretParams", "LoggingMode", "RaceReport", "force_tpu_interpret_mode",
    "is_range_out_of_bounds_for_shape", "race_report", "reset_races",
    "reset_tpu_interpret_mode_state", "set_tpu_interpret_mode", "store", "thread_map",
]


def store(core, buf, box, value, site: str) -> None:
    """The simulation's block copies (an input block into its VMEM buffer, an output
    block back to HBM) write through this function, so that a test may wrap it (e.g. to
    count the copies; upstream's tests do); ``core.write`` does the work."""
    core.write(buf, box, value, site)


def _store_through_module_attribute(core, buf, box, value, site: str) -> None:
    store(core, buf, box, value, site)  # this module's ``store`` now, wrapped or not


_grid.store_through(_store_through_module_attribute)


def race_report() -> RaceReport:
    """The race report of the most recent kernel call in TPU interpret mode."""
    return _state.latest_report()


def reset_races() -> None:
    """Clears the current race report."""
    _state.latest_report().reset()


def __getattr__(name: str):
    if name == "races":  # rebound at every kernel call, as upstream's module global
        return _state.latest_report()
    raise AttributeError(f"module 'pallas_tpu.interpret' has no attribute {name!r}")
