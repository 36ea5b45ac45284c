"""Cost estimates that ``pallas_call`` hands to the backend for the compiler's scheduler."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax


@dataclasses.dataclass(frozen=True)
class CostEstimate:
    """Flops, transcendentals and bytes a kernel costs, as XLA's cost model expects."""

    flops: int
    transcendentals: int
    bytes_accessed: int
    remote_bytes_transferred: int = 0

    def to_json(self) -> bytes:
        return (
            f'{{"flops": {self.flops}, "transcendentals": {self.transcendentals}, '
            f'"bytes_accessed": {self.bytes_accessed}, '
            f'"remote_bytes_transferred": {self.remote_bytes_transferred}}}'
        ).encode("ascii")


def estimate_cost(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> CostEstimate:
    """Estimates the cost of ``fun(*args, **kwargs)`` from XLA's analysis of its jaxpr.

    ``args`` may be arrays or ``jax.ShapeDtypeStruct``s.
    """
    # Keyword arguments are bound, not traced (as upstream): they may be flags, or values
    # of an enclosing trace that only the estimate's shapes depend on.
    lowered = jax.jit(functools.partial(fun, **kwargs)).trace(*args).lower()
    analysis = lowered.cost_analysis() or {}
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    flops = int(analysis.get("flops", 0))
    transcendentals = int(analysis.get("transcendentals", 0))
    bytes_accessed = int(analysis.get("bytes accessed", 0))
    return CostEstimate(flops, transcendentals, bytes_accessed)
