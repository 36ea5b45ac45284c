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
    """Times a zero-argument call: ``warmup`` untimed runs, then ``repeats`` timed ones.

    ``clock`` is injectable (seconds as a float, like :func:`time.perf_counter`), so tests
    can drive the measurements without depending on the machine's speed.
    """

    clock: Callable[[], float] = time.perf_counter

    def measure(self, call: Callable[[], Any], *, warmup: int, repeats: int,
                config: dict | None = None) -> list[float]:
        """The seconds of each timed run, in order (``config``: the config ``call`` runs,
        for timers that report per config)."""
        for _ in range(warmup):
            block(call())
        times = []
        for _ in range(repeats):
            t0 = self.clock()
            block(call())
            times.append(self.clock() - t0)
        return times


def median(times: list[float]) -> float:
    """The median of ``times`` (robust to one slow outlier run)."""
    return float(statistics.median(times))
