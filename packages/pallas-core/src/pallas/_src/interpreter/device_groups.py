"""Where the devices of one multi-device kernel call meet, in a backend's interpret mode.

Under ``shard_map`` every device runs its own call of the kernel, each in a thread of
its own; a simulation of the devices together (DMAs and semaphores between devices)
needs one object that all of them share. :class:`DeviceGroups` hands it out: each
device's n-th call of a kernel joins the n-th group of that kernel, made by the first
device to arrive, and the group is forgotten when its last device leaves.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any


class DeviceGroups:
    """The running groups of a backend's interpret mode (one instance per backend).

    A group is any object with a ``num_devices`` attribute and a ``fail(exc, where)``
    method (which aborts its devices); :meth:`join` sets its ``registry_key``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict = {}
        self._calls: collections.Counter = collections.Counter()
        self._left: collections.Counter = collections.Counter()

    def join(self, kernel_key: Any, device: int, make: Callable[[], Any]) -> Any:
        """The group of ``device``'s next call of the kernel ``kernel_key``; the first
        device to arrive makes it with ``make()`` (under the lock)."""
        with self._lock:
            self._calls[(kernel_key, device)] += 1
            key = (kernel_key, self._calls[(kernel_key, device)])
            group = self._running.get(key)
            if group is None:
                group = self._running[key] = make()
                group.registry_key = key
            return group

    def leave(self, group: Any) -> None:
        """One device of ``group`` is done; the last one forgets the group."""
        with self._lock:
            key = getattr(group, "registry_key", None)
            self._left[key] += 1
            if self._left[key] >= group.num_devices:
                self._running.pop(key, None)
                del self._left[key]

    def reset(self, reason: BaseException) -> None:
        """Forgets every group (after an error left one behind), failing each first with
        ``group.fail(reason, "a reset")``, and starts the call counts again."""
        with self._lock:
            for group in self._running.values():
                group.fail(reason, "a reset")
            self._running.clear()
            self._calls.clear()
            self._left.clear()
