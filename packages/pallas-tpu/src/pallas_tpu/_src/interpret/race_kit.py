"""What the conformance suite's race cases need from pallas-tpu (``backend.race_kit()``).

The planted-race cases of ``pallas_conformance.races`` are written once against this
small surface (DMAs, semaphores, memory spaces, the interpret mode and its race report),
so that any backend with DMAs and a race-detecting interpret mode can run them.
"""

from __future__ import annotations

from pallas_tpu._src.compiler_params import CompilerParams
from pallas_tpu._src.interpret.params import InterpretParams
from pallas_tpu._src.interpret.state import latest_report
from pallas_tpu._src.memory import MemorySpace, SemaphoreType
from pallas_tpu._src.primitives import dma


class TpuRaceKit:
    """pallas-tpu's DMAs and TPU interpret mode, for backend-neutral race cases."""

    name = "mosaic_tpu"
    any_space = MemorySpace.ANY

    @staticmethod
    def interpret(*, detect_races: bool = True, num_cores: int = 1) -> InterpretParams:
        """The ``interpret=`` value: the simulation, with ``num_cores`` cores a device."""
        return InterpretParams(detect_races=detect_races, num_cores_or_threads=num_cores)

    @staticmethod
    def parallel(ndim: int = 1) -> CompilerParams:
        """Compiler params making the first ``ndim`` grid axes parallel (across cores)."""
        return CompilerParams(dimension_semantics=("parallel",) * ndim)

    @staticmethod
    def vmem(shape, dtype):
        return MemorySpace.VMEM(shape, dtype)

    @staticmethod
    def dma_semaphore(shape=()):
        return SemaphoreType.DMA(shape) if shape else SemaphoreType.DMA

    @staticmethod
    def async_copy(src, dst, sem):
        """A local DMA descriptor (``.start()``, ``.wait()``)."""
        return dma.make_async_copy(src, dst, sem)

    @staticmethod
    def remote_copy(src, dst, send_sem, recv_sem, device_id):
        """A DMA to ``dst`` on device ``device_id`` (logical id); ``.start()``,
        ``.wait_send()``, ``.wait_recv()``."""
        from pallas import DeviceIdType

        return dma.make_async_remote_copy(src, dst, send_sem, recv_sem, device_id=device_id,
                                          device_id_type=DeviceIdType.LOGICAL)

    @staticmethod
    def races_found() -> bool:
        """Whether the latest interpreted call reported a race."""
        return latest_report().races_found

    @staticmethod
    def races() -> list:
        return list(latest_report().races)
