"""Cost estimates that ``pallas_call`` hands to the backend for the compiler's scheduler."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax

from pallas._src import cost_rules


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


def _nbytes(x: Any) -> int:
    return math.prod(x.shape) * jax.numpy.dtype(x.dtype).itemsize


def estimate_cost(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> CostEstimate:
    """Estimates the cost of ``fun(*args, **kwargs)`` from its jaxpr, as upstream does.

    ``args`` may be (pytrees of) arrays or ``jax.ShapeDtypeStruct``s. Flops and
    transcendentals are summed over the jaxpr's equations by per-primitive rules
    (elementwise arithmetic, transcendental functions, ``integer_pow``, ``dot_general``,
    and the bodies of ``jit``, ``custom_vjp`` and ``run_state``); bytes are those of the
    inputs and outputs plus what the rules count. Data movement and reductions cost
    nothing, so the figures equal upstream's ``pl.estimate_cost``.
    """
    # Keyword arguments are bound, not traced (as upstream): they may be flags, or values
    # of an enclosing trace that only the estimate's shapes depend on.
    flat_args = jax.tree_util.tree_leaves(args)
    avals = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    closed = jax.make_jaxpr(functools.partial(fun, **kwargs))(*avals)
    flops, transcendentals, bytes_accessed = cost_rules.jaxpr_cost(closed.jaxpr)
    bytes_accessed += sum(_nbytes(a) for a in flat_args)
    bytes_accessed += sum(_nbytes(v.aval) for v in closed.jaxpr.outvars)
    return CostEstimate(flops, transcendentals, bytes_accessed)
