"""GPU semaphores: ``SemaphoreType`` scratch and ``semaphore_signal``/``semaphore_wait``
with Mosaic GPU's ``memory_scope`` option (the counting semantics are pallas-core's)."""

from __future__ import annotations

import enum
from typing import Any, Literal

import pallas as pl
from pallas.plugins import MemoryRef, SemaphoreSpace

_SCOPES = ("sys", "gpu")


class SemaphoreType(enum.Enum):
    """Scratch semaphores: ``REGULAR`` counting semaphores, ``BARRIER`` ones for
    cross-device barriers. ``plgpu.SemaphoreType.REGULAR((n,))`` makes ``n`` of them."""

    REGULAR = "regular"
    BARRIER = "barrier"

    def __call__(self, shape: tuple[int, ...] = ()) -> MemoryRef:
        space = SemaphoreSpace.BARRIER if self is SemaphoreType.BARRIER else SemaphoreSpace.REGULAR
        return space(tuple(shape))

    def get_ref_aval(self) -> Any:
        return self(()).get_ref_aval()


def _check_scope(fn: str, memory_scope: str) -> None:
    if memory_scope not in _SCOPES:
        raise ValueError(f"plgpu.{fn}(memory_scope={memory_scope!r}): must be one of {_SCOPES}")


def semaphore_signal(semaphore: Any, inc: Any = 1, *, device_id: Any = None,
                     memory_scope: Literal["sys", "gpu"] = "sys") -> None:
    """Adds ``inc`` to ``semaphore``, on device ``device_id`` when given.

    ``memory_scope`` is the scope of the underlying atomic (``"sys"``, the default, or
    ``"gpu"``); on one device both order the same accesses, so it does not change what
    the interpreter computes.
    """
    _check_scope("semaphore_signal", memory_scope)
    pl.semaphore_signal(semaphore, inc, device_id=device_id)


def semaphore_wait(semaphore: Any, value: Any = 1, *, decrement: bool = True,
                   memory_scope: Literal["sys", "gpu"] = "sys") -> None:
    """Blocks until ``semaphore`` reaches ``value``; then subtracts it if ``decrement``."""
    _check_scope("semaphore_wait", memory_scope)
    pl.semaphore_wait(semaphore, value, decrement=decrement)
