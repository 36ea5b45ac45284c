"""Backend interpret modes, and forcing one onto every kernel.

``interpret=True`` (or ``pl.InterpretParams``) runs the reference interpreter. A backend
may offer an interpret mode of its own (TPU's simulated cores and DMAs, Mosaic GPU's
threads and barriers): its params object, passed as ``interpret=...``, implements
:class:`InterpretMode`, and ``pallas_call`` hands the kernel to it; a backend's mesh
hands ``core_map`` to it through ``Mesh.discharge_core_map(interpret)``.

``forced_interpret_mode(params)`` makes every ``pallas_call``/``core_map``/``kernel``
called in its extent run with ``interpret=params`` (``plgpu.force_gpu_interpret_mode``
builds on it). The forced params live in a JAX configuration state that is part of the
jit key and of the trace context: a function traced under a forced mode (or before it)
is traced again outside it (or under it), inner ``jax.jit``s included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pallas._src import jax_compat as jc


class InterpretMode:
    """The base class of a backend's interpret-mode params (``interpret=...``).

    ``lower_pallas_call`` receives what ``Backend.lower`` receives (the mesh of
    ``pl.kernel`` is ``grid_mapping.mesh``, None for a plain ``pallas_call``) and returns
    the MLIR values of the call's results (``ctx.avals_out`` gives their types).
    ``supports_dynamic_grid``: whether the mode takes grids with run-time sizes (their
    values arrive first among ``in_nodes``); without it pallas-core refuses such calls.
    A params object that does not subclass this runs in the reference interpreter.
    """

    supports_dynamic_grid: ClassVar[bool] = False

    def lower_pallas_call(self, ctx: Any, *in_nodes: Any, jaxpr: Any, grid_mapping: Any,
                          compiler_params: Any, name: str) -> Sequence[Any]:
        """Lowers one ``pallas_call`` to this interpret mode."""
        raise NotImplementedError(
            f"{type(self).__qualname__} does not implement lower_pallas_call")



class LoggingMode(enum.Flag):
    """What a backend's interpret mode logs (``logging_mode=``): barrier, semaphore and
    shared-memory operations (``pltpu.LoggingMode`` and ``plgpu.LoggingMode``)."""

    BARRIER = enum.auto()
    SEMAPHORE = enum.auto()
    SHARED_MEMORY = enum.auto()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SharedInterpretParams(InterpretMode):
    """The options the Mosaic backends' interpret modes share (upstream's fields and
    defaults); ``pltpu.InterpretParams`` and ``plgpu.InterpretParams`` subclass it with
    their own. ``CHOICES`` names the fields that take one of a few strings (a subclass
    extends it); ``__post_init__`` checks them and the core count.

    Attributes:
      detect_races: report accesses that no synchronisation orders (vector clocks).
      out_of_bounds_reads: ``"raise"`` an error on an out-of-bounds read, or return
        ``"uninitialized"`` values for the parts out of bounds.
      skip_floating_point_ops: do not compute floating-point results; they become
        ``inf`` (to check a kernel's data movement or synchronisation quickly).
      uninitialized_memory: fill new buffers with ``"nan"`` (the largest value for
        integers) or ``"zero"``.
      num_cores_or_threads: cores (TPU) or threads per device.
      vector_clock_size: entries of the race detector's vector clocks (the backend
        says which values it takes).
      logging_mode: a :class:`LoggingMode` to log those operations (``None``: none).
    """

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "out_of_bounds_reads": ("raise", "uninitialized"),
        "uninitialized_memory": ("nan", "zero"),
    }

    detect_races: bool = False
    out_of_bounds_reads: Literal["raise", "uninitialized"] = "raise"
    skip_floating_point_ops: bool = False
    uninitialized_memory: Literal["nan", "zero"] = "nan"
    num_cores_or_threads: int = 1
    vector_clock_size: int | None = None
    logging_mode: LoggingMode | None = None

    def __post_init__(self):
        for name, choices in self.CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(
                    f"{type(self).__name__}({name}={value!r}): must be one of "
                    f"{', '.join(repr(c) for c in choices)}")
        if int(self.num_cores_or_threads) < 1:
            raise ValueError("Number of cores or threads must be at least 1, but got "
                             f"{self.num_cores_or_threads}.")

_forced = jc.config.string_or_object_state(
    name="pallas_forced_interpret_mode", default=None,
    help="Interpret params that every Pallas kernel called meanwhile runs with.",
    include_in_jit_key=True, include_in_trace_context=True)


def forced_interpret() -> Any:
    """The params of the innermost active :func:`forced_interpret_mode` (else None)."""
    return _forced.value


@contextlib.contextmanager
def forced_interpret_mode(params: Any):
    """Within the block, kernels run with ``interpret=params`` (None: as written)."""
    with _forced(params):
        yield


def set_forced_interpret(params: Any) -> None:
    """From now on kernels run with ``interpret=params``; None turns it off."""
    _forced.set_global(params)


def resolve_interpret(interpret: Any) -> Any:
    """``interpret`` as written, or the forced params when it is off."""
    if interpret:
        return interpret
    forced = forced_interpret()
    return forced if forced is not None else interpret
