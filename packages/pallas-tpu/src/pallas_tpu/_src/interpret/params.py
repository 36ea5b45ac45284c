"""``InterpretParams`` (upstream 0.10.2's fields and defaults) and forced interpret mode.

Passing ``interpret=pltpu.InterpretParams(...)`` to ``pallas_call``/``core_map`` runs the
kernel in TPU interpret mode: the TPU simulation of :mod:`pallas_tpu.interpret`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pallas.plugins import LoggingMode, SharedInterpretParams
from pallas_tpu._src import jax_compat
from pallas_tpu._src.interpret import state
from pallas_tpu._src.interpret.entry import lower_pallas_call


@dataclasses.dataclass(frozen=True, kw_only=True)
class InterpretParams(SharedInterpretParams):
    """Options of TPU interpret mode (``interpret=pltpu.InterpretParams(...)``): the
    shared ones (:class:`pallas.plugins.SharedInterpretParams`) and TPU's own.

    Attributes:
      detect_races: report data races (pairs of conflicting accesses, by cores, DMAs and
        devices, that no semaphore or barrier orders) in ``pallas_tpu.interpret.races``.
      out_of_bounds_reads: ``"raise"`` an error on an out-of-bounds read, or return
        ``"uninitialized"`` values for the parts out of bounds.
      skip_floating_point_ops: do not compute floating-point results; they become
        ``inf`` (to check a kernel's data movement quickly).
      uninitialized_memory: fill new buffers with ``"nan"`` (the largest value for
        integers) or ``"zero"``.
      num_cores_or_threads: TensorCores per device; ``parallel`` grid axes are split
        across them.
      vector_clock_size: entries of the vector clocks (more than devices x cores); the
        entries beyond the cores are shared by the DMAs in flight, taken in turn, so two
        DMAs alias (and look ordered) only that many DMAs apart. By default twice the
        number of cores, and at least the cores plus 32 (upstream: twice).
      logging_mode: a :class:`LoggingMode` to log semaphore and memory operations.
      dma_execution_mode: ``"on_wait"`` (a DMA moves its data when a core waits on its
        semaphore), ``"eager"`` (when it starts) or ``"random"`` (an extension: at a
        random later point of the issuing core, seeded by ``random_seed``, and at the
        latest at its wait, so a forgotten wait shows).
      random_seed: seeds the order of ``parallel`` grid axes, the DMA threads of race
        detection and the ``"random"`` DMA schedule.
      grid_point_recorder: called with ``(token, grid_point, core_id)`` for each grid
        point as it runs; returns the token.
      allow_hbm_allocation_in_run_scoped: allow ``run_scoped`` HBM buffers (shared by the
        cores of a device); a real TPU does not.
      buffer_bounds: ``"logical"`` (accesses beyond a buffer's shape are out of bounds)
        or ``"padded"`` (VMEM buffers are padded to the simulated chip's tiling; the
        padding reads as uninitialised, writes to it are dropped).
    """

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        **SharedInterpretParams.CHOICES,
        "dma_execution_mode": ("eager", "on_wait", "random"),
        "buffer_bounds": ("logical", "padded"),
    }

    dma_execution_mode: Literal["eager", "on_wait", "random"] = "on_wait"
    random_seed: int | None = None
    grid_point_recorder: Callable[[Any, tuple, Any], Any] | None = None
    allow_hbm_allocation_in_run_scoped: bool = False
    buffer_bounds: Literal["logical", "padded"] = "logical"

    def __post_init__(self):
        super().__post_init__()
        if self.vector_clock_size is not None and int(self.vector_clock_size) < 1:
            raise ValueError(
                f"Vector clock size must be at least 1, but got {self.vector_clock_size}."
            )
        if self.logging_mode is not None and not isinstance(self.logging_mode, LoggingMode):
            raise TypeError(
                f"InterpretParams(logging_mode=...) takes a pltpu.LoggingMode (or None); "
                f"got {self.logging_mode!r}"
            )

    # Dynamic grid sizes reach the simulation with the operands (pallas-core checks).
    supports_dynamic_grid = True

    def lower_pallas_call(self, ctx, *in_nodes, jaxpr, grid_mapping, compiler_params,
                          name=None, **_):
        """Lowers a ``pallas_call`` to TPU interpret mode (called by pallas-core)."""
        # Forced params win over the call's own, as upstream.
        return lower_pallas_call(forced_params() or self, ctx, *in_nodes, jaxpr=jaxpr,
                                 grid_mapping=grid_mapping,
                                 compiler_params=compiler_params, name=name)

    @property
    def num_cores_per_device(self) -> int:
        return int(self.num_cores_or_threads)

    def get_vector_clock_size(self, num_devices: int) -> int:
        """Entries of the vector clocks for ``num_devices`` devices of this many cores."""
        total = int(num_devices) * self.num_cores_per_device
        if self.vector_clock_size is None:
            return max(2 * total, total + 32)
        if total >= self.vector_clock_size:
            raise ValueError(
                f"Vector clock size ({self.vector_clock_size}) must be greater than the "
                f"total number of cores/threads ({total})."
            )
        return int(self.vector_clock_size)


def _state():
    return jax_compat.interpret_mode_config()


def forced_params() -> InterpretParams | None:
    """The params of ``force_tpu_interpret_mode``/``set_tpu_interpret_mode``, if active.

    Kept in JAX's config state of the same purpose, which is part of the jit cache key:
    a jitted function traced before forcing the mode is traced again under it."""
    value = _state().value
    return value if isinstance(value, InterpretParams) else None


@contextlib.contextmanager
def force_tpu_interpret_mode(params: InterpretParams = InterpretParams()):
    """Within the ``with`` block, TPU kernels run in interpret mode, even on a TPU."""
    prev = _state().swap_local(params)
    try:
        yield
    finally:
        _state().set_local(prev)


def set_tpu_interpret_mode(params: InterpretParams = InterpretParams()) -> None:
    """From now on TPU kernels run in interpret mode (undo with ``reset_...``)."""
    _state().set_global(params)


def reset_tpu_interpret_mode_state() -> None:
    """Turns forced interpret mode off and forgets the simulation state (e.g. after an
    error), as upstream's function of the same name."""
    _state().set_global(None)
    state.reset_all()
