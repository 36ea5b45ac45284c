"""Timing one config: warm-up runs, then timed runs each waited for, summarised by the median."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax


def block(out: Any) -> Any:
    """Waits until every array in ``out`` is computed (JAX dispatches asynchronously)."""
    for leaf in jax.tree_util.tree_leaves(out):
        wait = getattr(leaf, "block_until_ready", None)
        if wait is not None:
            wait()
    return out


@dataclasses.dataclass
class Timer:
    """Times zero-argument calls, each run waited for (``block_until_ready``).

    A search warms every config up first, then times them in rounds, one run of each
    config per round, so that a change in the machine's load falls on every config alike
    rather than on whichever was being timed. ``clock`` is injectable (seconds as a
    float, like :func:`time.perf_counter`); a subclass may override :meth:`time_once` to
    report scripted seconds per config, so tests do not depend on the machine's speed.
    """

    clock: Callable[[], float] = time.perf_counter

    def warm(self, call: Callable[[], Any], config: dict | None = None) -> None:
        """One untimed run (compilation happens in the first)."""
        block(call())

    def time_once(self, call: Callable[[], Any], config: dict | None = None) -> float:
        """The seconds of one run of ``call`` (which runs ``config``)."""
        t0 = self.clock()
        block(call())
        return self.clock() - t0

    def measure(self, call: Callable[[], Any], *, warmup: int, repeats: int,
                config: dict | None = None) -> list[float]:
        """``warmup`` untimed runs, then the seconds of ``repeats`` timed ones."""
        for _ in range(warmup):
            self.warm(call, config)
        return [self.time_once(call, config) for _ in range(repeats)]


def median(times: list[float]) -> float:
    """The median of ``times`` (robust to one slow outlier run)."""
    return float(statistics.median(times))
